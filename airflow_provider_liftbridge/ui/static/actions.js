// The view's actions (docs/ui.md, "Actions"): replay dead letters to their source stream, move a
// pipeline's cursor. Each is confirmed in a dialog; the buttons are shown only to users the
// server says may act (GET …/actions); the server checks again on every action. Loaded before
// app.js; its functions run later, when app.js's helpers (el, get, connection, show…) exist.
"use strict";

const liftbridgeActions = (function () {
  const permitted = new Map();  // connection -> Promise<boolean>
  const selected = new Map();   // dead-letter stream -> Set of "partition:offset" (kept across refreshes)

  function allowed() {
    const conn = connection();
    if (!permitted.has(conn)) permitted.set(conn, get("/actions").then(d => d.allowed === true, () => false));
    return permitted.get(conn);
  }
  async function post(path, body) {
    const r = await fetch(`api/connections/${encodeURIComponent(connection())}${path}`, {
      method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    const answer = await r.json().catch(() => ({detail: r.statusText}));
    if (r.ok) return answer;
    const d = answer.detail;
    const error = new Error(`${r.status}: ${typeof d === "string" ? d : d && d.message ? d.message : JSON.stringify(d)}`);
    error.field = d && d.field;
    throw error;
  }

  // -- the dialog ----------------------------------------------------------------------------------
  // One <dialog> outside #out, so a refresh of the tab does not close it. `body` are its nodes;
  // `confirm(dialogParts)` does the action and returns the words of its outcome (or throws).
  function openDialog(title, body, confirmText, confirm) {
    let dialog = document.getElementById("action-dialog");
    if (!dialog) { dialog = el("dialog", {id: "action-dialog", "aria-labelledby": "action-title"}); document.body.append(dialog); }
    const error = el("p", {class: "error", id: "action-error", role: "alert", hidden: ""});
    const result = el("p", {id: "action-result", role: "status", hidden: ""});
    const ok = el("button", {type: "button", class: "primary", id: "action-confirm"}, confirmText);
    const cancel = el("button", {type: "button", id: "action-cancel"}, "Cancel");
    dialog.replaceChildren(el("h2", {id: "action-title"}, title), ...body, error, result, el("div", {class: "bar dialog-buttons"}, ok, cancel));
    cancel.addEventListener("click", () => dialog.close());
    dialog.oninput = () => {  // typing again: the last refusal no longer applies
      error.hidden = true;
      dialog.querySelectorAll("[aria-invalid]").forEach(f => f.removeAttribute("aria-invalid"));
    };
    ok.addEventListener("click", async () => {
      ok.disabled = true;  // one click, one request (the server is idempotent anyway)
      error.hidden = true;
      dialog.querySelectorAll("[aria-invalid]").forEach(f => f.removeAttribute("aria-invalid"));
      try {
        result.textContent = await confirm();
        result.hidden = false;
        ok.hidden = true;
        cancel.textContent = "Close";
        show(true);
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
        const field = e.field && dialog.querySelector(`[data-field="${e.field}"]`);
        if (field) { field.setAttribute("aria-invalid", "true"); field.focus(); }
        ok.disabled = false;
      }
    });
    dialog.showModal();
    return dialog;
  }

  // -- dead letters ----------------------------------------------------------------------------------
  // The letter's source message in the browser: its partition from its offset, opened.
  function sourceLink(l) {
    const text = `${l.source_stream}/${l.source_partition}@${l.source_offset}`;
    if (!l.source_stream || l.source_partition == null || l.source_offset == null) return text;
    const q = new URLSearchParams({conn: connection(), tab: "browse", stream: l.source_stream, partition: String(l.source_partition),
      order: "oldest", offset: String(l.source_offset), n: "20", msg: `${l.source_partition}:${l.source_offset}`});
    return el("a", {href: `?${q}`, "data-source-link": `${l.source_partition}:${l.source_offset}`, title: "open the source message"}, text);
  }
  function chosen(stream) {
    if (!selected.has(stream)) selected.set(stream, new Set());
    return selected.get(stream);
  }
  function checkbox(stream, l) {
    const id = `${l.partition}:${l.offset}`;
    const box = el("input", {type: "checkbox", "data-letter": id, "aria-label": `select letter ${id}`});
    box.checked = chosen(stream).has(id);
    box.addEventListener("change", () => {
      if (box.checked) chosen(stream).add(id); else chosen(stream).delete(id);
      const button = document.querySelector(`[data-replay-selected="${CSS.escape(stream)}"]`);
      if (button) { button.disabled = !chosen(stream).size; button.textContent = `Replay selected (${chosen(stream).size})`; }
    });
    return el("td", {}, box);
  }
  function replayButtons(s) {
    const some = el("button", {type: "button", "data-replay-selected": s.stream}, `Replay selected (${chosen(s.stream).size})`);
    some.disabled = !chosen(s.stream).size;
    some.addEventListener("click", () => replayDialog(s.stream, [...chosen(s.stream)]));
    const all = el("button", {type: "button", "data-replay-all": s.stream}, "Replay all…");
    all.disabled = !s.count;
    all.addEventListener("click", () => replayDialog(s.stream, null));
    return el("div", {class: "bar actions", "data-actions-of": s.stream}, some, all);
  }
  // "were already replayed (0:3, 0:4, …)": the letters an earlier replay put back, or is putting back.
  function skippedWords(a) {
    const listed = a.skipped || [];
    const more = a.already_replayed > listed.length ? `, and ${a.already_replayed - listed.length} more` : "";
    const running = a.in_progress && a.in_progress.length ? ` (${a.in_progress.join(", ")} by a replay still at work)` : "";
    return `were already replayed (${listed.join(", ")}${more})${running}`;
  }
  async function replayDialog(stream, letters) {
    let plan;
    try { plan = await post(`/dead-letters/${encodeURIComponent(stream)}/replay-plan`, letters ? {letters} : {}); }
    catch (e) { openDialog(`Replay from ${stream}`, [el("p", {class: "error", role: "alert"}, e.message)], "Replay", async () => { throw e; }); return; }
    const where = Object.entries(plan.targets).map(([s, n]) => el("li", {}, `${n} to ${s}`));
    const selection = plan.through ? {through: plan.through} : {letters: plan.letters};
    openDialog(`Replay ${plan.count} letter(s) from ${stream}`, [
      el("p", {}, letters ? `The ${plan.count} selected letter(s) go back to the partition each came from:`
        : `Every letter up to offset ${Object.entries(plan.through || {}).map(([p, o]) => `${o} of partition ${p}`).join(", ")} goes back to the partition it came from:`),
      el("ul", {id: "replay-targets"}, ...where),
      ...(plan.already_replayed ? [el("p", {id: "replay-skipped"}, `${plan.already_replayed} of them ${skippedWords(plan)}: they are skipped.`)] : []),
      el("p", {class: "muted"}, "Each letter is put back at most once, whatever the selection and whoever sends it; the letters stay in the dead-letter stream. "
        + "Recorded in Airflow's audit log."),
    ], `Replay ${plan.count}`, async () => {
      const done = await post(`/dead-letters/${encodeURIComponent(stream)}/replay`, selection);
      if (letters) chosen(stream).clear();
      return `Put back ${done.replayed} letter(s)` + (done.already_replayed ? `; skipped ${done.already_replayed} that ${skippedWords(done)}.` : ".");
    });
  }

  // -- cursors -----------------------------------------------------------------------------------------
  function moveDialog(p) {
    const name = `${p.dag_id}.${p.task_id}`;
    const offset = el("input", {id: "move-offset", inputmode: "numeric", "data-field": "offset", "aria-label": "offset", class: "wide"});
    const time = el("input", {id: "move-time", type: "datetime-local", step: "1", "data-field": "time", "aria-label": "time (your local time)"});
    const parts = el("input", {id: "move-partitions", "data-field": "partition", "aria-label": "partitions", placeholder: "all", size: "8"});
    const rows = p.partitions.map(r => el("li", {}, `partition ${r.partition}: next read ${r.position + 1}, high watermark ${r.high_watermark}`));
    openDialog(`Move the cursor of ${name}`, [
      el("p", {}, `The next run of ${name} reads ${p.stream} from the offset or time you give (the same in each partition chosen).`),
      el("ul", {}, ...rows),
      el("div", {class: "bar"}, el("label", {}, "Offset ", offset), el("label", {}, "or time ", time),
        el("label", {}, "Partitions ", parts)),
      el("p", {class: "muted"}, "Offset: a whole number (the next message read; the high watermark + 1 reads only new ones). "
        + "Time: the first message at or after it. Partitions: numbers separated by commas, or empty for all. Refused while the task runs. "
        + "Recorded in Airflow's audit log."),
    ], "Move cursor", async () => {
      const body = {map_index: p.map_index};
      if (offset.value.trim()) body.offset = offset.value.trim();
      if (time.value) body.time = new Date(time.value).toISOString();
      if (parts.value.trim()) {
        const list = parts.value.split(",").map(x => x.trim());
        if (!list.every(x => /^\d+$/.test(x))) {
          const e = new Error("Partitions: type numbers separated by commas (e.g. 0, 2), or leave it empty for all.");
          e.field = "partition";
          throw e;
        }
        body.partitions = list.map(Number);
      }
      const done = await post(`/pipelines/${encodeURIComponent(p.dag_id)}/${encodeURIComponent(p.task_id)}/cursor`, body);
      return "Moved: " + done.moved.map(m => `partition ${m.partition} now reads from ${m.to}`).join(", ") + ". The next run reads from there.";
    });
  }
  function moveButton(p) {
    const b = el("button", {type: "button", class: "small", "data-move-cursor": `${p.dag_id}.${p.task_id}`}, "Move cursor…");
    b.addEventListener("click", () => moveDialog(p));
    return b;
  }

  return {allowed, sourceLink, checkbox, replayButtons, moveButton, forget: () => permitted.clear()};
})();
