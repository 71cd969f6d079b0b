// The Liftbridge view's Lag and Groups tabs (docs/ui.md, "Lag as a verdict" and "Consumer groups").
// Loaded before app.js, which adds these tabs to its own (window.liftbridgeTabs); the functions run
// later, when app.js's helpers (el, table, num, get, matches, chart, duration, lagAge, ago…) exist.
"use strict";

(function () {
  // A verdict as a badge: the status, the rule's reason in its tooltip.
  function verdictBadge(v) {
    return el("span", {class: `badge status status-${v.status.toLowerCase()}`, "data-status": v.status,
      title: `${v.reason} (rule: ${v.rule})`}, v.status);
  }
  function thresholdText(t) {
    if (!t) return "—";
    const parts = [];
    if (t.max_lag != null) parts.push(`${t.max_lag} message${t.max_lag === 1 ? "" : "s"}`);
    if (t.max_lag_age_s != null) parts.push(`${duration(t.max_lag_age_s)} old`);
    return parts.length ? parts.join(", ") : "—";
  }
  function thresholdNote(d, rules) {
    const link = airflowLink("variables", d.thresholds_variable);
    const nodes = !rules ? [] : [el("p", {class: "muted", id: "lag-rules"},
      `Status from the last ${d.window} commits of each partition (a pipeline's runs, a group's positions sampled by this page at most every ${d.sample_every_s} s), after Burrow's rules; `
      + "thresholds from the Airflow Variable ", link,
      " (JSON: {\"dag_id.task_id\" or \"group:<id>\": {\"max_lag\": messages, \"max_lag_age_s\": seconds}}). See docs/ui.md, Lag as a verdict.")];
    if (d.thresholds_error) nodes.push(el("p", {class: "error", id: "thresholds-error"}, d.thresholds_error));
    return nodes;
  }

  async function lag() {
    const d = await get("/lag");
    const shown = d.readers.filter(r => matches(r.name, r.stream) || r.name === state.focus);
    const rows = shown.map(r => el("tr", {"data-reader": r.name, "data-kind": r.kind, "data-status": r.verdict.status,
      class: r.name === state.focus ? "focused" : null},
      el("td", {}, verdictBadge(r.verdict)),
      el("td", {}, r.kind === "group" ? "group" : "pipeline"),
      el("td", {}, r.kind === "pipeline" ? airflowLink(r.links.task, r.name) : r.name),
      el("td", {}, r.stream),
      num(r.lag, {"data-lag": r.lag, class: r.verdict.status === "OK" ? "num" : "num lag-bad"}),
      num(r.lag ? lagAge(r.lag_age_s) : "—"),
      el("td", {"data-threshold": r.threshold ? JSON.stringify(r.threshold) : ""}, thresholdText(r.threshold)),
      el("td", {class: "reason"}, r.verdict.partition != null && r.verdict.status !== "OK"
        ? `partition ${r.verdict.stream ? `${r.verdict.stream}/` : ""}${r.verdict.partition}: ${r.verdict.reason}` : r.verdict.reason)));
    const nodes = [...thresholdNote(d, true),
      table(["Status", "Kind", "Name", "Stream", "Lag", "Oldest unread", "Threshold", "Why"], rows, {id: "lag-table"})];
    if (!d.readers.length) nodes.push(el("p", {}, "No pipeline or consumer group yet: reading tasks and group members record themselves when they run."));
    else if (!shown.length) nodes.push(el("p", {class: "muted"}, "Nothing matches the filter."));
    const charted = shown.filter(r => r.history.length > 1);  // one point is no line
    if (charted.length) {
      nodes.push(el("h2", {}, "Lag between runs (sampled while this page is open)"));
      nodes.push(el("div", {class: "charts"}, ...charted.map(r => chart(`${r.name}: lag (messages)`,
        r.history.map(p => p.time), [{label: "lag", values: r.history.map(p => p.lag)}],
        {"data-chart": "lag-history", "data-reader": r.name, "data-points": r.history.length}))));
    }
    return nodes;
  }

  function memberRows(g) {
    return g.members.map(m => el("tr", {"data-member": m.consumer_id, "data-state": m.state},
      el("td", {}, m.consumer_id),
      el("td", {}, el("span", {class: `badge member-${m.state}`}, m.state)),
      num(m.epoch),
      el("td", {}, Object.entries(m.assignments).map(([s, parts]) => `${s}: ${parts.join(", ")}`).join("; ") || "none"),
      el("td", {}, ago(m.recorded_at))));
  }

  async function groups() {
    const d = await get("/groups");
    const nodes = thresholdNote(d, false);
    for (const g of d.groups.filter(x => matches(x.group_id, ...x.streams, ...x.pipelines))) {
      const where = g.known ? `coordinator ${g.coordinator}, epoch ${g.epoch}` : "no members (the cluster does not know the group now)";
      nodes.push(el("h2", {"data-group": g.group_id, "data-epoch": g.epoch ?? "", "data-status": g.verdict.status},
        verdictBadge(g.verdict), ` group ${g.group_id} — ${g.streams.join(", ")}, ${where}, lag `,
        el("span", {"data-lag": g.lag}, g.lag), g.lag ? [" (oldest unread ", lagAge(g.lag_age_s), " old)"] : "",
        g.threshold ? `, threshold ${thresholdText(g.threshold)}` : ""));
      if (g.pipelines.length) nodes.push(el("p", {class: "muted"}, `Read by ${g.pipelines.join(", ")}`));
      if (g.missing_streams.length) nodes.push(el("p", {class: "error"}, `stream(s) ${g.missing_streams.join(", ")} do not exist (any more)`));
      nodes.push(g.members.length
        ? table(["Member", "State", "Epoch", "Assignments", "Recorded"], memberRows(g), {"data-members-of": g.group_id})
        : el("p", {class: "muted"}, "No member has recorded itself (members of this client record their epoch and assignments in the group roster)."));
      nodes.push(table(["Stream", "Partition", "Owner", "Position", "High watermark", "Lag", "Oldest unread", "Status"],
        g.partitions.map(r => el("tr", {"data-stream": r.stream, "data-partition": r.partition, "data-status": r.verdict.status},
          el("td", {}, r.stream), num(r.partition), el("td", {}, r.owner || "—"), num(r.position), num(r.high_watermark),
          num(r.lag, {"data-lag": r.lag}), num(r.lag ? lagAge(r.lag_age_s) : "—"), el("td", {}, verdictBadge(r.verdict)))),
        {"data-partitions-of": g.group_id}));
    }
    if (!d.groups.length) nodes.push(el("p", {}, "No consumer group known: groups show up when a member of this client joins one, or a consume task reads with ConsumerGroup."));
    return nodes;
  }

  window.liftbridgeTabs = Object.assign(window.liftbridgeTabs || {}, {lag, groups});
  window.liftbridgeVerdictBadge = verdictBadge;  // the Pipelines tab's Status column (app.js)
})();
