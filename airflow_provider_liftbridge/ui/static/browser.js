// The message browser (docs/ui.md, "The message browser"): the Browse tab's form, its search
// (streamed NDJSON, read with fetch + ReadableStream, with a progress line and a Stop button),
// paging both ways, and the message view (pretty / raw / hex, copy, download).
// It uses app.js's helpers (el, table, rendered, show, keepUrl, connection) when called; app.js
// loads after this file and calls liftbridgeBrowser.restore() once.
"use strict";

const liftbridgeBrowser = (() => {
  const byId = (id) => document.getElementById(id);
  const MAX_PAGE = 500;
  const HEX_SHOWN = 64 * 1024;  // bytes of a value the hex view shows; the download has all
  // The form's fields, by the name the address gives them.
  const FIELDS = {stream: "b-stream", partition: "b-partition", order: "b-order", n: "b-last", offset: "b-offset",
    key: "b-key", value: "b-value", path: "b-path", header: "b-header"};
  const b = {
    controller: null,   // the running search's AbortController
    page: null,         // {at, scan}: where the shown page starts (kept in the address)
    message: "",        // "partition:offset" of the open message view
  };
  // The time field (the picker's local time) as UTC ISO 8601, for the server and the address.
  const timeIso = () => { const t = byId("b-time").value; return t && !Number.isNaN(Date.parse(t)) ? new Date(t).toISOString() : ""; };

  // -- checking the form (the server checks again and names the field the same way) -----------
  const STEP = /^(?:\.[A-Za-z_][\w-]*|\[\s*-?\d+\s*\]|\[\s*"(?:[^"\\]|\\.)*"\s*\])/;
  const PATH_HELP = 'type a path like $.order.id, $.items[0].sku or $["odd key"], optionally followed by == or != and a value';
  function pathProblem(text) {
    if (!text.startsWith("$")) return `a JSON path starts with $: ${PATH_HELP}`;
    let rest = text.slice(1);
    while (rest && !/^[\s=!]/.test(rest)) {
      const m = STEP.exec(rest);
      if (!m) return `cannot read the path at "${rest}": ${PATH_HELP}`;
      rest = rest.slice(m[0].length);
    }
    rest = rest.trim();
    if (!rest) return null;
    const op = /^(==|!=)\s*(.*)$/s.exec(rest);
    if (!op || !op[2].trim()) return `after the path comes == or != and a value: ${PATH_HELP}`;
    const word = op[2].trim();
    if (/^["[{]/.test(word)) { try { JSON.parse(word); } catch (e) { return `the value ${word} is not valid JSON: ${PATH_HELP}`; } }
    return null;
  }
  // Each field's problem, or null. Returns [field id, words] of the first problem.
  function formProblem() {
    const v = (id) => byId(id).value.trim();
    if (!v("b-stream")) return ["b-stream", "name a stream (see the Cluster tab)"];
    if (v("b-partition") && v("b-partition") !== "all" && !/^\d+$/.test(v("b-partition")))
      return ["b-partition", `partition must be all, or a partition number (0, 1, …); got "${v("b-partition")}"`];
    const n = v("b-last");
    if (n && !(/^\d+$/.test(n) && +n >= 1 && +n <= MAX_PAGE))
      return ["b-last", `show must be a whole number from 1 to ${MAX_PAGE} per page (page on with Older / Newer); got "${n}"`];
    if (v("b-offset") && !/^\d+$/.test(v("b-offset")))
      return ["b-offset", `offset must be a whole number, 0 or more (e.g. 1200); got "${v("b-offset")}"`];
    const time = byId("b-time");
    if (time.validity.badInput || (time.value && Number.isNaN(Date.parse(time.value))))
      return ["b-time", "time must be a date and a time of day, e.g. 2026-12-06 09:30 (your local time), picked or typed in full"];
    if (v("b-offset") && time.value) return ["b-time", "start from an offset or from a time, not both: clear one of them"];
    const key = v("b-key");
    if (/^hex:/i.test(key) && !/^([0-9a-f]{2})*$/i.test(key.slice(4).replace(/ /g, "")))
      return ["b-key", `after hex: come pairs of hex digits (e.g. hex:00ff1a), or type the key as text; got "${key}"`];
    if (v("b-path")) { const p = pathProblem(v("b-path")); if (p) return ["b-path", p]; }
    if (v("b-header") && v("b-header").startsWith("=")) return ["b-header", "header must be a name, or name=value (e.g. trace-id=abc)"];
    return null;
  }
  const SERVER_FIELDS = {stream: "b-stream", partition: "b-partition", order: "b-order", "page size": "b-last",
    offset: "b-offset", time: "b-time", at: "b-go", key: "b-key", path: "b-path", header: "b-header"};
  function markProblem(fieldId, words) {
    document.querySelectorAll("#browse-form [aria-invalid]").forEach(f => f.removeAttribute("aria-invalid"));
    const error = byId("b-error");
    error.hidden = !words;
    error.textContent = words || "";
    if (fieldId && byId(fieldId)) {
      byId(fieldId).setAttribute("aria-invalid", "true");
      error.dataset.field = fieldId;
      byId(fieldId).focus();
    } else delete error.dataset.field;
  }

  // -- the search ---------------------------------------------------------------------------
  function query(page) {
    const q = new URLSearchParams();
    const v = (id) => byId(id).value.trim();
    const part = v("b-partition");
    if (part && part !== "all") q.set("partition", part);
    q.set("order", byId("b-order").value);
    q.set("limit", v("b-last") || "20");
    for (const name of ["key", "path", "header"]) if (v(FIELDS[name])) q.set(name, v(FIELDS[name]));
    if (byId("b-value").value) q.set("value", byId("b-value").value);
    if (page) { q.set("at", page.at); q.set("scan", page.scan); }
    else if (v("b-offset")) q.set("offset", v("b-offset"));
    else if (timeIso()) q.set("time", timeIso());
    return q;
  }
  const mib = (bytes) => bytes < 1048576 ? `${(bytes / 1024).toFixed(1)} KiB` : `${(bytes / 1048576).toFixed(bytes < 10485760 ? 1 : 0)} MiB`;
  function progressText(p) {
    const at = p.partition == null ? "" : `, at partition ${p.partition} offset ${p.offset}${p.time ? ` (${p.time})` : ""}`;
    return `${p.scanned.toLocaleString("en")} message(s) scanned, ${mib(p.bytes)}, ${p.seconds} s${at}; ${p.matched} found`;
  }
  const REASONS = {
    page: "The page is full.",
    end: "Every partition was read to its end.",
    bytes: "Stopped at the bound of BYTES examined: the search is wider than one request may read. These are what it found; Older / Newer search on from where it stopped.",
    time: "Stopped at the bound of SECONDS s: the search is wider than one request may take. These are what it found; Older / Newer search on from where it stopped.",
  };

  // Runs the search of the form (page: null, or {at, scan} to page) into `box`.
  async function run(box, page) {
    stop(true);
    const controller = b.controller = new AbortController();
    const stream = byId("b-stream").value.trim();
    const newestFirst = byId("b-order").value === "newest";
    const reversed = page ? (page.scan === "forward") === newestFirst : false;  // read against the shown order
    const status = el("p", {id: "b-status", class: "muted", "aria-live": "polite"}, "Searching… (asking the cluster)");
    const summary = el("p", {id: "b-summary"});
    const body = el("tbody", {});
    const results = el("table", {id: "messages"}, el("thead", {}, el("tr", {}, ...["Partition", "Offset", "Time", "Key", "Headers", "Value", ""].map(h => el("th", {}, h)))), body);
    const pager = el("div", {class: "bar pager"},
      el("button", {id: "b-newer", type: "button", disabled: ""}, newestFirst ? "← Newer" : "← Older"),
      el("button", {id: "b-older", type: "button", disabled: ""}, newestFirst ? "Older →" : "Newer →"));
    box.replaceChildren(summary, status, results, pager, el("section", {id: "b-view", hidden: ""}));
    byId("b-stop").hidden = false;
    const shown = {};  // per partition, the last offset shown (to go on after a Stop)
    let start = null, last = null, found = 0;
    b.page = page;
    const add = (m) => {
      found += 1;
      shown[m.partition] = m.offset;
      const row = el("tr", {class: "message", "data-partition": m.partition, "data-offset": m.offset},
        num(m.partition), num(m.offset), el("td", {class: "time"}, m.timestamp), el("td", {}, rendered(m.key)),
        el("td", {}, ...Object.entries(m.headers).map(([k, v]) => el("div", {class: "header"}, `${k}: `, rendered(v)))),
        el("td", {}, rendered(m.value)),
        el("td", {}, el("button", {type: "button", class: "b-open", title: "Open this message"}, "View")));
      row.querySelector(".b-open").addEventListener("click", () => openMessage(m.partition, m.offset));
      if (reversed) body.prepend(row); else body.append(row);
    };
    const setPager = (onward, back) => {
      // Onward continues the reading; back reads the other way. Shown: "after" and "before" this page.
      const [before, after] = reversed ? [onward, back] : [back, onward];
      for (const [id, pos] of [["b-newer", before], ["b-older", after]]) {
        const button = pager.querySelector(`#${id}`);
        button.disabled = !pos || pos.done;
        button.onclick = pos && !pos.done ? () => { b.message = ""; run(box, {at: pos.at, scan: pos.scan}).then(keepUrl); } : null;
      }
    };
    try {
      const conn = connection();
      const r = await fetch(`api/connections/${encodeURIComponent(conn)}/streams/${encodeURIComponent(stream)}/search?${query(page)}`,
        {credentials: "same-origin", signal: controller.signal});
      if (!r.ok) {
        const detail = (await r.json().catch(() => ({detail: r.statusText}))).detail;
        if (detail && typeof detail === "object") { markProblem(SERVER_FIELDS[detail.field], detail.message); status.textContent = ""; }
        else { status.className = "error"; status.id = "b-status"; status.textContent = `${r.status}: ${detail}`; }
        return;
      }
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let pending = "";
      for (;;) {
        const {done, value} = await reader.read();
        if (done) break;
        pending += decoder.decode(value, {stream: true});
        const lines = pending.split("\n");
        pending = lines.pop();
        for (const line of lines.filter(Boolean)) {
          const e = JSON.parse(line);
          if (e.type === "start") {
            start = e;
            b.page = {at: e.at, scan: e.scan};
            const skipped = Object.entries(e.skipped).map(([p, why]) => `partition ${p} ${why}`).join("; ");
            summary.textContent = `${e.stream}, ${e.partitions.length === 1 ? `partition ${e.partitions[0]}` : `partitions ${e.partitions.join(", ")} merged by time`}, `
              + `${newestFirst ? "newest" : "oldest"} first; a request reads at most ${mib(e.bounds.bytes)} or ${e.bounds.seconds} s`
              + (skipped ? ` (${skipped})` : "");
            keepUrl();
          } else if (e.type === "message") add(e.message);
          else if (e.type === "progress") { last = e; status.textContent = `Searching… ${progressText(e)}`; }
          else if (e.type === "end") {
            status.dataset.reason = e.reason;
            const why = REASONS[e.reason].replace("BYTES", mib(start.bounds.bytes)).replace("SECONDS", start.bounds.seconds);
            status.className = e.reason === "bytes" || e.reason === "time" ? "warn" : "muted";
            status.textContent = `${found} found. ${why} (${progressText(e)})`;
            setPager(e.continue, e.back);
          } else if (e.type === "error") {
            status.className = "error";
            status.textContent = `${e.status}: ${e.detail} (${found} found before it)`;
          }
        }
      }
    } catch (err) {
      if (err.name !== "AbortError") { status.className = "error"; status.textContent = err.message; return; }
      status.dataset.reason = "stopped";
      status.className = "warn";
      status.textContent = `Stopped by you: ${found} found${last ? `; ${progressText(last)}` : ""}.`;
      if (start) {
        // On from what was shown: what was scanned after it did not match, so no message is lost or repeated.
        const step = start.scan === "forward" ? 1 : -1;
        const at = start.at.split(",").map(pair => { const [p, o] = pair.split(":").map(Number); return `${p}:${p in shown ? shown[p] + step : o}`; });
        const back = start.at.split(",").map(pair => { const [p, o] = pair.split(":").map(Number); return `${p}:${o - step}`; });
        setPager({at: at.join(","), scan: start.scan, done: false}, {at: back.join(","), scan: start.scan === "forward" ? "backward" : "forward", done: false});
      }
    } finally {
      if (b.controller === controller) { b.controller = null; byId("b-stop").hidden = true; }
      if (!found && !status.classList.contains("error")) body.append(el("tr", {class: "none"}, el("td", {colspan: 7, class: "muted"}, "No message found.")));
      if (b.message && !controller.signal.aborted) { const [p, o] = b.message.split(":"); openMessage(+p, +o); }
    }
  }
  function stop(quiet) {
    if (b.controller) { b.controller.abort(); if (quiet) b.controller = null; }
  }

  // -- one message --------------------------------------------------------------------------
  function bytesOf(b64) { const s = atob(b64 || ""); const out = new Uint8Array(s.length); for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i); return out; }
  function hexDump(bytes) {
    const lines = [];
    for (let i = 0; i < Math.min(bytes.length, HEX_SHOWN); i += 16) {
      const row = bytes.subarray(i, i + 16);
      const hex = Array.from(row, x => x.toString(16).padStart(2, "0")).join(" ");
      const text = Array.from(row, x => (x >= 32 && x < 127 ? String.fromCharCode(x) : ".")).join("");
      lines.push(`${i.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${text}`);
    }
    return lines.join("\n");
  }
  async function openMessage(partition, offset) {
    const view = byId("b-view");
    if (!view) return;
    b.message = `${partition}:${offset}`;
    keepUrl();
    view.hidden = false;
    view.replaceChildren(el("p", {class: "muted"}, "Loading the message…"));
    const stream = byId("b-stream").value.trim();
    const base = `api/connections/${encodeURIComponent(connection())}/streams/${encodeURIComponent(stream)}/partitions/${partition}/messages/${offset}`;
    const r = await fetch(base, {credentials: "same-origin"});
    const d = await r.json().catch(() => ({detail: r.statusText}));
    if (!r.ok) { view.replaceChildren(el("p", {class: "error"}, `${r.status}: ${typeof d.detail === "string" ? d.detail : d.detail.message}`)); return; }
    const value = bytesOf(d.value_b64);
    const raw = new TextDecoder("utf-8", {fatal: false}).decode(value);
    let pretty = raw;
    try { pretty = JSON.stringify(JSON.parse(raw), null, 2); } catch (e) { /* not JSON: as text */ }
    const cut = d.value_cut ? ` (the first ${value.length.toLocaleString("en")} of ${d.value_size.toLocaleString("en")} bytes: download for all)` : "";
    const modes = {pretty, raw, hex: hexDump(value) + (value.length > HEX_SHOWN ? `\n… (the first ${HEX_SHOWN.toLocaleString("en")} bytes)` : "")};
    const pre = el("pre", {id: "b-view-value", "data-mode": "pretty"}, modes.pretty);
    const buttons = Object.keys(modes).map(mode => el("button", {type: "button", "data-mode": mode, "aria-pressed": String(mode === "pretty")},
      mode === "pretty" ? "Pretty" : mode === "raw" ? "Raw" : "Hex"));
    for (const button of buttons) button.addEventListener("click", () => {
      pre.textContent = modes[button.dataset.mode];
      pre.dataset.mode = button.dataset.mode;
      buttons.forEach(x => x.setAttribute("aria-pressed", String(x === button)));
    });
    const copy = el("button", {type: "button", id: "b-copy"}, "Copy");
    copy.addEventListener("click", async () => { copy.textContent = (await copyText(pre.textContent)) ? "Copied" : "Copy failed: select the text"; });
    const close = el("button", {type: "button", id: "b-close", title: "Close the message"}, "Close");
    close.addEventListener("click", () => { view.hidden = true; b.message = ""; keepUrl(); });
    const m = d.message;
    const key = d.key_b64 == null ? "(none)" : m.key.format === "hex" ? `hex:${m.key.value}` : m.key.value;
    const facts = [["Stream", m.stream], ["Partition", m.partition], ["Offset", m.offset], ["Time", m.timestamp],
      ["Subject", d.subject], ...(d.reply_subject ? [["Reply subject", d.reply_subject]] : []), ["Key", key],
      ["Value", `${d.value_size.toLocaleString("en")} bytes${m.value && m.value.format === "json" ? ", JSON" : ""}${cut}`]];
    view.replaceChildren(
      el("h2", {}, `Message ${m.stream} / ${m.partition} @ ${m.offset}`),
      table(["", ""], facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {"data-fact": k.toLowerCase()}, v))), {class: "facts"}),
      el("h3", {}, "Headers"),
      Object.keys(m.headers).length
        ? table(["Name", "Value"], Object.entries(m.headers).map(([k, v]) => el("tr", {"data-header": k}, el("td", {}, k), el("td", {}, rendered(v)))), {id: "b-view-headers"})
        : el("p", {class: "muted", id: "b-view-headers"}, "No headers."),
      el("div", {class: "bar"}, ...buttons, copy,
        el("a", {id: "b-download", href: `${base}/value`, download: `${m.stream}-${m.partition}-${m.offset}.bin`, class: "button"}, "Download"), close),
      pre);
    view.scrollIntoView({block: "nearest"});
  }
  async function copyText(text) {
    try { await navigator.clipboard.writeText(text); return true; } catch (e) { /* a frame without the permission */ }
    const area = el("textarea", {style: "position:fixed;opacity:0"});
    area.value = text;
    document.body.append(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }

  // -- the tab, the address -------------------------------------------------------------------
  function toLocalInput(iso) {  // an ISO time as the picker's local "YYYY-MM-DDTHH:MM:SS"
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const pad = (x) => String(x).padStart(2, "0");
    const ms = d.getMilliseconds() ? `.${String(d.getMilliseconds()).padStart(3, "0")}` : "";
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}${ms}`;
  }
  return {
    // The Browse tab's content: the results box, filled as the search streams in.
    async view() {
      if (!byId("b-stream").value.trim()) { stop(true); return [el("p", {}, "Name a stream (see the Cluster tab), what to find if anything, and press Search.")]; }
      const problem = formProblem();
      if (problem) { markProblem(...problem); return [el("p", {class: "muted"}, "Fix the field marked above.")]; }
      markProblem(null, "");
      const box = el("div", {id: "b-results"});
      run(box, b.page);
      return [box];
    },
    stop,
    // [name, value] pairs of the address.
    address() {
      const out = [];
      for (const [name, id] of Object.entries(FIELDS)) {
        const v = byId(id).value.trim();
        if (v && !(name === "order" && v === "newest") && !(name === "partition" && v === "all")) out.push([name, v]);
      }
      if (b.page) { out.push(["at", b.page.at], ["scan", b.page.scan]); return out.filter(([n]) => n !== "offset").concat(b.message ? [["msg", b.message]] : []); }
      if (timeIso()) out.push(["time", timeIso()]);
      if (b.message) out.push(["msg", b.message]);
      return out;
    },
    restore(params) {
      for (const [name, id] of Object.entries(FIELDS)) if (params.get(name)) byId(id).value = params.get(name);
      if (!params.get("n") && params.get("last")) byId("b-last").value = params.get("last");  // links from before the search
      if (params.get("time")) byId("b-time").value = toLocalInput(params.get("time"));
      if (params.get("at") && params.get("scan")) b.page = {at: params.get("at"), scan: params.get("scan")};
      b.message = params.get("msg") || "";
      byId("browse-form").addEventListener("submit", (event) => { event.preventDefault(); b.page = null; b.message = ""; show(); });
      byId("b-stop").addEventListener("click", () => stop(false));
      byId("browse-form").addEventListener("input", (event) => {
        if (event.target.getAttribute("aria-invalid")) { event.target.removeAttribute("aria-invalid"); byId("b-error").hidden = true; }
      });
    },
  };
})();
window.liftbridgeBrowser = liftbridgeBrowser;
