// The Liftbridge view's Streams tab (docs/ui.md, "Streams"): one page of the cluster's streams,
// sorted and paged by the server (…/streams?sort=&order=&offset=&limit=&filter=), so a cluster
// of thousands of streams costs one page. Loaded before app.js, which adds the tab to its own
// (window.liftbridgeTabs) and keeps its sort and page in the address (window.liftbridgeStreams).
"use strict";

(function () {
  // The sortable columns: [key of the API's sort, heading, numeric?].
  const COLUMNS = [
    ["name", "Stream", false], ["subject", "Subject", false], ["partitions", "Partitions", true],
    ["replication", "Replicas", true], ["committed", "Committed", true], [null, "Retained", true],
    ["newest_offset", "Newest offset", true], ["rate", "Rate", true], ["latest_message", "Last message", false],
    ["created", "Created", false], ["paused", "Flags", false],
  ];
  const SIZES = [25, 50, 100, 200];
  const view = {sort: "name", order: "asc", offset: 0, limit: 50, open: new Set()};

  function restore(params) {
    if (COLUMNS.some(([key]) => key && key === params.get("sort"))) view.sort = params.get("sort");
    if (params.get("order") === "desc") view.order = "desc";
    const n = Number(params.get("n"));
    if (SIZES.includes(n)) view.limit = n;
    const page = Number(params.get("page"));
    if (Number.isInteger(page) && page > 1) view.offset = (page - 1) * view.limit;
  }
  function address() {
    const q = [];
    if (view.sort !== "name") q.push(["sort", view.sort]);
    if (view.order !== "asc") q.push(["order", view.order]);
    if (view.limit !== 50) q.push(["n", String(view.limit)]);
    if (view.offset) q.push(["page", String(Math.floor(view.offset / view.limit) + 1)]);
    return q;
  }
  let lastFilter = null;

  function heading([key, text, numeric]) {
    const attrs = {class: numeric ? "num" : null, scope: "col"};
    if (!key) return el("th", Object.assign(attrs, {title: "offsets from the oldest retained to the high watermark, this page only (an upper bound under compaction)"}), text);
    const active = view.sort === key;
    attrs["aria-sort"] = active ? (view.order === "asc" ? "ascending" : "descending") : "none";
    const button = el("button", {type: "button", class: "sort", "data-sort": key}, text, active ? (view.order === "asc" ? " ▲" : " ▼") : "");
    button.addEventListener("click", () => {
      if (view.sort === key) view.order = view.order === "asc" ? "desc" : "asc";
      else { view.sort = key; view.order = numeric || key === "latest_message" || key === "created" ? "desc" : "asc"; }
      view.offset = 0;
      show(true);
    });
    return el("th", attrs, button);
  }
  function flags(s) {
    return [s.internal ? badge("internal", "internal") : "", s.paused ? badge("paused", `${s.paused} paused`) : "",
      s.readonly ? badge("readonly", `${s.readonly} read-only`) : ""];
  }
  function partitionRows(s) {
    return s.partition_list.map(p => el("tr", {class: "partition", "data-partition-of": s.name, "data-partition": p.id},
      el("td", {}, `partition ${p.id}`), el("td", {}, `leader ${p.leader}, ISR ${p.isr.join(", ")}`), num(""), num(p.replicas.length),
      num(p.committed), num(p.retained ?? "?", {title: p.oldest_unknown || `oldest retained offset ${p.oldest_offset ?? "—"}`,
        "data-oldest": p.oldest_offset ?? ""}),
      num(p.newest_offset), num(""), el("td", {}, ago(p.latest_message)), el("td", {}, p.first_message ? `first kept ${p.first_message}` : ""),
      el("td", {}, p.paused ? badge("paused", "paused") : "", p.readonly ? badge("readonly", "read-only") : "")));
  }
  // Messages per second since the view's earlier look at the cluster (docs/ui.md, "Streams").
  function rateCell(s) {
    if (s.rate == null) return num("…", {"data-rate": "", title: "measuring: shown from the next refresh (the view compares two looks at the cluster)"});
    const text = s.rate === 0 ? "0/s" : s.rate < 10 ? `${s.rate.toFixed(2)}/s` : `${Math.round(s.rate).toLocaleString()}/s`;
    return num(text, {"data-rate": String(s.rate), "data-rate-messages": String(s.rate_messages),
      title: `${s.rate_messages} message(s) in the last ${Math.round(s.rate_span_s)} s`});
  }
  function streamRow(s) {
    const open = view.open.has(s.name);
    const toggle = el("button", {type: "button", class: "toggle", "aria-expanded": String(open),
      title: open ? "hide the partitions" : "show the partitions"}, `${open ? "▾" : "▸"} ${s.partitions}`);
    toggle.addEventListener("click", () => { if (open) view.open.delete(s.name); else view.open.add(s.name); show(true); });
    const row = el("tr", {"data-stream": s.name, "data-committed": s.committed},
      el("td", {}, s.name), el("td", {}, s.subject), el("td", {class: "num"}, toggle), num(s.replication),
      num(s.committed), num(s.retained ?? "?", {"data-retained": s.retained ?? ""}), num(s.newest_offset),
      rateCell(s), el("td", {}, ago(s.latest_message)), el("td", {}, ago(s.created)), el("td", {}, flags(s)));
    return open ? [row, ...partitionRows(s)] : [row];
  }
  function pager(d) {
    const pages = Math.max(1, Math.ceil(d.matched / d.limit));
    const at = Math.floor(d.offset / d.limit) + 1;
    const go = (offset) => () => { view.offset = offset; show(true); };
    const prev = el("button", {type: "button", id: "streams-prev"}, "Previous");
    const next = el("button", {type: "button", id: "streams-next"}, "Next");
    prev.disabled = d.offset === 0;
    next.disabled = d.offset + d.limit >= d.matched;
    prev.addEventListener("click", go(Math.max(0, d.offset - d.limit)));
    next.addEventListener("click", go(d.offset + d.limit));
    const size = el("select", {"aria-label": "streams per page", id: "streams-size"},
      ...SIZES.map(n => el("option", {value: n}, `${n} per page`)));
    size.value = String(view.limit);
    size.addEventListener("change", () => { view.limit = Number(size.value); view.offset = 0; show(true); });
    return el("div", {class: "bar pager", id: "streams-pager", "data-page": at, "data-pages": pages},
      prev, el("span", {}, `page ${at} of ${pages}`), next, size);
  }

  async function streams() {
    const filter = $("filter").value.trim();
    if (lastFilter !== null && filter !== lastFilter) view.offset = 0;  // a new filter starts at page 1
    lastFilter = filter;
    const q = new URLSearchParams({sort: view.sort, order: view.order, offset: view.offset, limit: view.limit});
    if (filter) q.set("filter", filter);
    const d = await get(`/streams?${q}`);
    if (d.offset >= d.matched && d.matched && d.offset) { view.offset = 0; return streams(); }  // past the end
    const first = d.matched ? d.offset + 1 : 0;
    return [
      el("h2", {id: "streams-count", "data-total": d.total, "data-matched": d.matched},
        `Streams ${first}–${d.offset + d.streams.length} of ${d.matched}${d.matched !== d.total ? ` (of ${d.total}, filtered)` : ""}`),
      pager(d),
      el("table", {id: "stream-list"}, el("thead", {}, el("tr", {}, ...COLUMNS.map(heading))),
        el("tbody", {}, ...d.streams.flatMap(streamRow))),
      el("p", {class: "muted", id: "streams-note"},
        "Committed: messages ever committed (offsets 0 to the high watermark). Retained: offsets from the oldest message still kept "
        + "(read for this page's partitions) to the high watermark. Liftbridge does not return "
        + `${d.not_returned.join(", ")}: no call gives them (docs/ui.md, Streams).`),
    ];
  }

  window.liftbridgeTabs = Object.assign(window.liftbridgeTabs || {}, {streams});
  window.liftbridgeStreams = {restore, address, view};
})();
