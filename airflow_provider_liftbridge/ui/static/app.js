// The Liftbridge view's page (docs/ui.md). Every data call is relative to the page
// (…/liftbridge/api/…), every link to Airflow relative to it too (../dags/…), so the view works
// under Airflow's base URL path. The data endpoints check the user; this script holds no data.
"use strict";

const $ = (id) => document.getElementById(id);
const out = $("out");
// -- the address: what is shown (tab, connection, stream, filter, position) is in the query ------
// Airflow 3.3 shows the page in a frame at <base>/plugin/liftbridge and, each time the frame
// loads, mirrors the frame's own address after that path: <base>/plugin/liftbridge/<frame path>?<query>
// (the frame path starts with the base path, hence the prefix twice behind one). Reloaded, Airflow
// loads the frame at that path with that query. It mirrors on load only, not when the page changes
// its address (history.replaceState), so the page writes the query to both addresses itself.
function airflowWindow() {
  try {
    if (window.parent !== window && window.parent.location.pathname.includes("/plugin/")) return window.parent;
  } catch (e) { /* another origin: no access */ }
  return null;
}
function startParams() {
  const own = new URLSearchParams(window.location.search);
  const top = airflowWindow();
  // A link <base>/plugin/liftbridge?tab=… (no frame path): Airflow loads the frame without the query.
  if (own.toString() || !top || !top.location.search) return own;
  const theirs = new URLSearchParams(top.location.search);
  history.replaceState(null, "", `?${theirs}`);  // before the frame's load, which Airflow mirrors
  return theirs;
}
function writeAddress(query) {
  const search = `?${query}`;
  if (window.location.search !== search) history.replaceState(null, "", search);
  const top = airflowWindow();
  if (!top) return;
  const path = top.location.pathname.endsWith(window.location.pathname)
    ? top.location.pathname : top.location.pathname.replace(/\/+$/, "") + window.location.pathname;
  // Airflow's router keeps its own entry in history.state: kept as it is.
  if (top.location.pathname !== path || top.location.search !== search) top.history.replaceState(top.history.state, "", path + search);
}
const params = startParams();
const state = {
  tab: "pipelines",
  timer: null,        // the automatic refresh (null while paused)
  paused: false,
  focus: params.get("pipeline") || "",  // a pipeline to show first (dag_id.task_id)
  charts: [],
};
window.liftbridgeView = state;  // for the system tests: the refresh state

// -- Airflow's look: its colour mode and font, read from the Airflow page around the frame ------
function airflowDocument() {
  try {
    if (window.parent !== window && window.parent.document) return window.parent.document;
  } catch (e) { /* another origin: no access */ }
  return null;
}
function applyTheme() {
  const doc = airflowDocument();
  let dark;
  if (doc) dark = doc.documentElement.classList.contains("dark");  // next-themes' class on <html>
  else dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
  const theme = dark ? "dark" : "light";
  if (document.documentElement.dataset.theme !== theme) {
    document.documentElement.dataset.theme = theme;
    drawCharts();  // axes and grid take the new colours
  }
  if (doc && doc.body) {
    const font = window.getComputedStyle(doc.body).fontFamily;
    if (font) document.documentElement.style.setProperty("--font", font);
  }
}
function watchTheme() {
  const doc = airflowDocument();
  if (doc) new MutationObserver(applyTheme).observe(doc.documentElement, {attributes: true, attributeFilter: ["class", "style"]});
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", applyTheme);
  applyTheme();
}

// -- building blocks --------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) node.setAttribute(k, v);
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}
function table(headers, rows, attrs) {
  return el("table", attrs || {}, el("thead", {}, el("tr", {}, ...headers.map(h => el("th", {}, h)))), el("tbody", {}, ...rows));
}
function num(value, attrs) { return el("td", Object.assign({class: "num"}, attrs || {}), value); }
function badge(kind, text) { return el("span", {class: `badge ${kind}`, "data-badge": kind}, text); }
function rendered(v) {
  if (v == null) return "";
  const text = v.format === "json" ? JSON.stringify(v.value, null, 2) : v.value;
  return el("pre", {"data-format": v.format}, text + (v.truncated ? ` … (${v.size} bytes, cut)` : ""));
}
// A link into Airflow: the API gives it relative to Airflow's base URL; the page is at <base>/liftbridge/.
function airflowLink(path, text) { return el("a", {href: `../${path}`, target: "_top", "data-airflow-link": ""}, text); }
// Airflow's frame is sandboxed without top navigation: a link of the frame cannot open an Airflow
// page in the window. The same link, clicked in the Airflow page around the frame, can.
document.addEventListener("click", (event) => {
  const link = event.target instanceof Element ? event.target.closest("a[data-airflow-link]") : null;
  const doc = airflowDocument();
  if (!link || !doc || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
  event.preventDefault();
  const outer = doc.createElement("a");
  outer.href = link.href;  // absolute: resolved against this page
  outer.hidden = true;
  doc.body.append(outer);
  outer.click();
  outer.remove();
});
// An interval as [start, end) in UTC, its fractions of a second without trailing zeros.
function intervalText(i) {
  const short = (iso) => iso.replace("+00:00", "Z").replace(/(\.\d*?)0+Z$/, "$1Z").replace(/\.Z$/, "Z");
  return `[${short(i.start)}, ${short(i.end)})`;
}
// A plan's offsets, "first..last (run)"; an interval without messages in a partition has none.
function planText(plan) {
  const run = plan.run_id ? ` (${plan.run_id})` : "";
  if (plan.start != null && plan.end <= plan.start) return `none${run}`;
  return `${plan.start ?? "?"}..${plan.end - 1}${run}`;
}
// A duration in seconds as "3 h 5 min", "42 s" (null: not known).
function duration(seconds) {
  if (seconds == null) return "unknown";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  const units = [["d", 86400], ["h", 3600], ["min", 60]];
  const parts = [];
  let rest = s;
  for (const [name, size] of units) {
    if (rest >= size && parts.length < 2) { parts.push(`${Math.floor(rest / size)} ${name}`); rest %= size; }
    else if (parts.length) break;
  }
  return parts.join(" ");
}
// An ISO time as "5 min ago", the ISO time in its tooltip.
function ago(iso) {
  if (!iso) return "—";
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  return el("span", {title: iso, "data-time": iso}, seconds < 5 ? "just now" : `${duration(seconds)} ago`);
}
function lagAge(seconds, attrs) {
  return el("span", Object.assign({"data-lag-age": seconds == null ? "" : String(seconds),
    title: "age of the oldest unread message"}, attrs || {}), duration(seconds));
}
function connection() { return $("conn").value; }
async function get(path) {
  const conn = connection();
  if (!conn) throw new Error("No liftbridge connection you may read: create one (Admin → Connections), or ask for access.");
  const r = await fetch(`api/connections/${encodeURIComponent(conn)}${path}`, {credentials: "same-origin"});
  const body = await r.json().catch(() => ({detail: r.statusText}));
  if (!r.ok) throw new Error(`${r.status}: ${typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)}`);
  return body;
}
function matches(...texts) {
  const f = $("filter").value.trim().toLowerCase();
  return !f || texts.some(t => t != null && String(t).toLowerCase().includes(f));
}

// -- charts (uPlot, served from the package) -----------------------------------------------------
const PALETTE = ["#017cee", "#f97316", "#16a34a", "#a855f7", "#e11d48", "#0891b2", "#ca8a04", "#64748b"];
// runs (optional): per point its DAG run {run_id, link}; the caption under the chart names and
// links the run of the point under the cursor (the newest run otherwise), and a click on the
// plot opens that run in Airflow.
function chart(title, xs, series, attrs, runs) {
  const box = el("div", Object.assign({class: "chart"}, attrs || {}), el("h3", {}, title));
  const caption = runs && runs.length ? el("p", {class: "muted run-caption", "data-run-caption": ""}) : null;
  state.charts.push({box, xs, series, runs, caption});
  if (caption) { box.append(caption); showRun(state.charts[state.charts.length - 1], null); }
  return box;
}
function showRun(c, idx) {
  const i = idx == null ? c.runs.length - 1 : idx;
  const run = c.runs[i];
  c.caption.dataset.runId = run.run_id;
  c.caption.replaceChildren(idx == null ? "newest run " : "run ", airflowLink(run.link, run.run_id));
}
function drawCharts() {
  const style = window.getComputedStyle(document.documentElement);
  const fg = style.getPropertyValue("--muted").trim(), grid = style.getPropertyValue("--grid").trim();
  for (const c of state.charts) {
    if (c.plot) { c.plot.destroy(); c.plot = null; }
    if (!c.box.isConnected) continue;
    const axis = {stroke: fg, grid: {stroke: grid}, ticks: {stroke: grid}};
    c.plot = new uPlot({
      width: 460, height: 200,
      scales: {x: {time: true}},
      series: [{}, ...c.series.map((s, i) => ({label: s.label, stroke: PALETTE[i % PALETTE.length], width: 2,
        points: {show: true, size: 6, fill: PALETTE[i % PALETTE.length]}}))],
      axes: [axis, axis],
      hooks: c.caption ? {setCursor: [u => showRun(c, u.cursor.idx)]} : {},
    }, [c.xs, ...c.series.map(s => s.values)], c.box);
    if (c.caption) {
      c.box.append(c.caption);  // below the plot
      c.plot.over.addEventListener("click", () => { const a = c.caption.querySelector("a"); if (a) a.click(); });
      c.plot.over.style.cursor = "pointer";
    }
  }
}

// -- the tabs ---------------------------------------------------------------------------------
const views = {
  async cluster() {
    const c = await get("/cluster");
    const brokers = table(["Broker", "Address", "Partitions", "Leaders"],
      c.brokers.map(b => el("tr", {}, num(b.id), el("td", {}, `${b.host}:${b.port}`), num(b.partitions), num(b.leaders))));
    // The streams themselves are on the Streams tab, sorted and paged (a cluster may have thousands).
    const partitions = c.streams.reduce((n, s) => n + s.partitions.length, 0);
    const toStreams = el("a", {href: "#", id: "to-streams"}, "the Streams tab");
    toStreams.addEventListener("click", (e) => { e.preventDefault(); state.tab = "streams"; show(); });
    return [el("h2", {}, "Brokers"), brokers,
      el("p", {id: "cluster-streams", "data-streams": c.streams.length}, `${c.streams.length} streams, ${partitions} partitions: see `, toStreams, ".")];
  },
  async pipelines() {
    const [d, may] = await Promise.all([get("/pipelines"), liftbridgeActions.allowed()]);  // actions.js
    const nodes = [];
    for (const p of d.pipelines) {
      const name = `${p.dag_id}.${p.task_id}`;
      if (!matches(name, p.stream, p.cursor_id, p.group_id) && name !== state.focus) continue;
      const byInterval = p.mode === "DataInterval";
      // Reading by interval the position is the progress in the latest interval, and messages after
      // the interval's end are the next intervals' (not a backlog): the lag is not flagged.
      const bad = (lag) => lag && !byInterval;
      const who = p.group_id ? `group ${p.group_id}` : byInterval ? `cursor prefix ${p.position_cursor}` : `cursor ${p.cursor_id}`;
      const how = byInterval && p.interval
        ? [", by interval ", el("span", {"data-interval": "", "data-interval-start": p.interval.start, "data-interval-end": p.interval.end},
            intervalText(p.interval)), ` (${p.interval.finished ? "read" : "reading"})`]
        : [];
      const verdict = (v) => v ? liftbridgeVerdictBadge(v) : "—";  // lag.js
      nodes.push(el("h2", {"data-pipeline": name, "data-stream": p.stream, "data-mode": p.mode, class: name === state.focus ? "focused" : null,
        "data-status": p.verdict ? p.verdict.status : ""}, verdict(p.verdict), " ",
        airflowLink(p.links.dag, p.dag_id), " / ", airflowLink(p.links.task, p.task_id),
        ` — ${p.stream}`, ...how, `, ${who}, lag `, el("span", {class: bad(p.lag) ? "lag-bad" : "", "data-lag": p.lag}, p.lag),
        p.lag ? [" (oldest unread ", lagAge(p.lag_age_s), " old)"] : ""));
    if (may && !byInterval) nodes[nodes.length - 1].append(" ", liftbridgeActions.moveButton(p));  // actions.js
      if (p.error) nodes.push(el("p", {class: "error"}, p.error));
      const headers = byInterval
        ? ["Partition", "Progress", "High watermark", "Lag after it", "Oldest unread", "Last commit", "Interval offsets", "Finished", "Status"]
        : ["Partition", "Position", "High watermark", "Lag", "Oldest unread", "Last commit", "Plan", "Finished", "Status"];
      nodes.push(table(headers,
        p.partitions.map(r => el("tr", {"data-partition": r.partition, "data-status": r.verdict ? r.verdict.status : ""},
          num(r.partition), num(r.position), num(r.high_watermark),
          num(r.lag, {class: bad(r.lag) ? "num lag-bad" : "num", "data-lag": r.lag}),
          num(r.lag ? lagAge(r.lag_age_s) : "—"), el("td", {"data-last-commit": r.last_commit_time || ""}, ago(r.last_commit_time)),
          el("td", {}, r.plan ? planText(r.plan) : "—"),
          el("td", {}, r.plan ? badge(r.plan.finished ? "done" : "running", r.plan.finished ? "finished" : "open") : "—"),
          el("td", {"data-verdict": ""}, verdict(r.verdict)))),
        {"data-pipeline-table": name, "data-stream": p.stream}));
    }
    if (state.focus && !d.pipelines.some(p => `${p.dag_id}.${p.task_id}` === state.focus)) {
      nodes.unshift(el("p", {class: "error", id: "focus-missing"}, `No pipeline ${state.focus} in the registry: a reading task `
        + "records itself when it plans a run, so it shows up after its next run (see docs/ui.md, How pipelines are found)."));
    }
    if (!d.pipelines.length) nodes.push(el("p", {}, "No reading task has recorded itself yet (they do when they plan a run)."));
    else if (!nodes.length) nodes.push(el("p", {class: "muted"}, "No pipeline matches the filter."));
    return nodes;
  },
  async charts() {
    const d = await get("/history");
    const nodes = [];
    for (const p of d.pipelines) {
      const name = `${p.dag_id}.${p.task_id}`;
      if (!matches(name, p.stream) && name !== state.focus) continue;
      const byInterval = p.by_interval;
      // By interval a point is the interval a run read (at its start), not the time the run ended.
      const xs = p.runs.map(r => byInterval && r.interval ? r.interval.start_time : r.time);
      const per = (field) => p.partitions.map(part => ({label: `partition ${part}`,
        values: p.runs.map(r => (r.partitions[String(part)] || {})[field] ?? null)}));
      nodes.push(el("h2", {"data-chart-pipeline": name, "data-stream": p.stream, "data-by-interval": String(byInterval), "data-runs": p.runs.length,
        class: name === state.focus ? "focused" : null},
        `${name} — ${p.stream}, last ${p.runs.length} run(s)${byInterval ? ", by interval start" : ""}`));
      nodes.push(el("div", {class: "charts"},
        chart(byInterval ? "Lag after the interval when the run ended (messages)" : "Lag when the run ended (messages)",
          xs, per("lag"), {"data-chart": "lag"}, p.runs),
        chart(byInterval ? "Messages read per interval" : "Messages read per run", xs, per("processed"), {"data-chart": "processed"}, p.runs)));
      if (byInterval) {
        const total = (r, field) => Object.values(r.partitions).reduce((n, x) => n + x[field], 0);
        nodes.push(table(["Interval", "Run", "Messages", "Lag after it"], p.runs.map(r => el("tr",
          {"data-run-interval": r.interval ? r.interval.start : ""},
          el("td", {}, r.interval ? intervalText(r.interval) : "—"), el("td", {}, airflowLink(r.link, r.run_id)),
          num(total(r, "processed")), num(total(r, "lag")))), {class: "runs", "data-runs-of": name, "data-stream": p.stream}));
      }
    }
    const streams = d.streams.filter(s => matches(s.stream));
    if (streams.length) {
      nodes.push(el("h2", {}, "Message rate per stream (between the runs that read it)"));
      nodes.push(el("div", {class: "charts"}, ...streams.map(s => chart(`${s.stream}: messages / s (${s.messages} in all)`,
        s.points.map(x => x.time), [{label: "messages / s", values: s.points.map(x => x.rate)}],
        {"data-chart": "rate", "data-stream": s.stream}))));
    }
    if (!nodes.length) nodes.push(el("p", {}, "No run history yet: the reading tasks add an entry when a try ends."));
    return nodes;
  },
  async "dead-letters"() {
    const [d, may] = await Promise.all([get("/dead-letters"), liftbridgeActions.allowed()]);  // actions.js
    if (!d.streams.length) return [el("p", {}, "No pipeline sends to a dead-letter stream.")];
    const nodes = [];
    for (const s of d.streams.filter(x => matches(x.stream))) {
      nodes.push(el("h2", {"data-dead-letter-stream": s.stream}, `${s.stream}: ${s.count} letter(s)`));
      if (s.error) nodes.push(el("p", {class: "error"}, s.error));
      if (may) nodes.push(liftbridgeActions.replayButtons(s));
      nodes.push(table([...(may ? [""] : []), "Time", "Source", "Error type", "Error", "Value"], s.letters.map(l => el("tr", {class: "letter"},
        may ? liftbridgeActions.checkbox(s.stream, l) : "",
        el("td", {}, l.timestamp), el("td", {}, liftbridgeActions.sourceLink(l)),
        el("td", {}, badge("error", l.error_type)), el("td", {}, el("pre", {}, l.error)), el("td", {}, rendered(l.value))))));
    }
    return nodes;
  },
  browse() { return liftbridgeBrowser.view(); },  // browser.js
};

Object.assign(views, window.liftbridgeTabs || {});  // tabs of their own files (lag.js: Lag, Groups)

// -- showing, refreshing ----------------------------------------------------------------------
let showing = 0;
async function show(quiet) {
  const mine = ++showing;
  document.querySelectorAll("nav button").forEach(b => b.classList.toggle("active", b.dataset.tab === state.tab));
  $("browse-form").hidden = state.tab !== "browse";
  if (state.tab !== "browse") liftbridgeBrowser.stop(true);
  if (!quiet) out.replaceChildren(el("p", {class: "muted"}, "Loading…"));
  let nodes;
  const charts = [];
  const before = state.charts;
  state.charts = charts;
  try { nodes = await views[state.tab](); }
  catch (e) { nodes = [el("p", {class: "error", id: "error"}, e.message)]; }
  if (mine !== showing) return;  // a newer refresh has started meanwhile
  for (const c of before) if (c.plot) c.plot.destroy();
  const scroll = window.scrollY;
  out.replaceChildren(...nodes);
  drawCharts();
  if (quiet) window.scrollTo(0, scroll);
  else if (state.focus) { const f = out.querySelector(".focused"); if (f) f.scrollIntoView({block: "start"}); }
  if (!state.firstShown) state.firstShown = Date.now();  // bench/ui_bench.py: the click to the first data shown
  $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  $("updated").dataset.count = String((Number($("updated").dataset.count) || 0) + 1);
  keepUrl();
}
function keepUrl() {  // the address says what is shown, so it can be shared or reloaded
  const q = new URLSearchParams();
  if (connection()) q.set("conn", connection());
  q.set("tab", state.tab);
  if (state.tab === "browse") {
    for (const [name, value] of liftbridgeBrowser.address()) q.set(name, value);
  }
  if (state.tab === "streams") for (const [name, value] of liftbridgeStreams.address()) q.set(name, value);  // streams.js
  if (state.focus) q.set("pipeline", state.focus);
  if ($("filter").value.trim()) q.set("filter", $("filter").value.trim());
  writeAddress(q);
}
function schedule() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
  $("pause").setAttribute("aria-pressed", String(state.paused));
  $("pause").textContent = state.paused ? "Resume" : "Pause";
  if (!state.paused) state.timer = setInterval(() => { if (!document.hidden && state.tab !== "browse") show(true); },
    Number($("interval").value) * 1000);
}

async function loadConnections() {
  const r = await fetch("api/connections", {credentials: "same-origin"});
  const ids = r.ok ? (await r.json()).connections : [];
  const wanted = params.get("conn");
  const select = $("conn");
  select.replaceChildren(...ids.map(id => el("option", {value: id}, id)));
  if (wanted && !ids.includes(wanted)) select.append(el("option", {value: wanted}, `${wanted} (not readable)`));
  select.value = wanted || (ids.includes("liftbridge_default") ? "liftbridge_default" : ids[0] || "");
}

document.querySelectorAll("nav button").forEach(b => b.addEventListener("click", () => { state.tab = b.dataset.tab; show(); }));
$("refresh").addEventListener("click", () => show());
$("conn").addEventListener("change", () => show());
let filtering = null;
$("filter").addEventListener("input", () => { clearTimeout(filtering); filtering = setTimeout(() => show(true), 200); });
$("interval").addEventListener("change", schedule);
$("pause").addEventListener("click", () => { state.paused = !state.paused; schedule(); });

if (params.get("tab") in views) state.tab = params.get("tab");
liftbridgeBrowser.restore(params);
if (state.tab === "streams") liftbridgeStreams.restore(params);
if (params.get("filter")) $("filter").value = params.get("filter");
watchTheme();
loadConnections().then(() => { show(); schedule(); });
