// A run: its summary, a live chart of every metric (appended from the incremental metrics API),
// its evaluation table, its episodes (filtered, paged) and its config.
"use strict";

const RUN = new URLSearchParams(location.search).get("name") || "";
const POLL_MS = Number(new URLSearchParams(location.search).get("poll")) || 3000;
const EPISODE_PAGE = 20;
const metrics = { after: 0, series: new Map(), stopped: false };  // key -> {xs, ys, plot, box}
const episodes = { offset: 0, total: 0 };
const messages = document.getElementById("messages");

function stop(err) {  // the run is gone or the token is wrong: say so once and stop polling
  metrics.stopped = true;
  showError(messages, err);
}

// ---- summary -------------------------------------------------------------------------
async function loadSummary() {
  const s = await api(runApi(RUN, "summary"));
  document.getElementById("title").textContent = s.name;
  document.getElementById("summary").replaceChildren(
    el("span", { class: "status-" + s.status }, s.status), ` \u00b7 ${s.algorithm ?? "-"} \u00b7 ${s.model ?? "-"}`,
    ` \u00b7 step ${fmt(s.last_step)} \u00b7 reward ${fmt(s.reward)} \u00b7 pass rate ${pct(s.pass_rate)}`,
    ` \u00b7 started ${when(s.started)} \u00b7 updated ${when(s.updated)}`);
  document.getElementById("stages").replaceChildren(...(s.stages.length ? [el("p", {}, "stages: ",
    s.stages.map(st => [el("a", { href: "/run?name=" + encodeURIComponent(st) }, st), " "]))] : []));
  const select = document.getElementById("source");
  if (!select.options.length) {
    select.replaceChildren(...s.episode_sources.map(src => el("option", { value: src }, src)));
    if (s.episode_sources.length) loadEpisodes();
  }
}

// ---- curves ----------------------------------------------------------------------------
function chartFor(key) {
  const box = el("div", { class: "chart", "data-metric": key });
  const entry = { xs: [], ys: [], plot: null, box };
  const charts = document.getElementById("charts");
  const after = [...metrics.series.keys()].filter(k => k > key).sort()[0];
  charts.insertBefore(box, after ? metrics.series.get(after).box : null);  // charts stay in key order
  metrics.series.set(key, entry);
  filterCharts();
  return entry;
}

function draw(key, entry) {
  if (typeof uPlot === "undefined") return;
  if (entry.plot) { entry.plot.setData([entry.xs, entry.ys]); return; }
  entry.plot = new uPlot({
    title: key, width: 420, height: 220, scales: { x: { time: false } }, legend: { show: false },
    series: [{ label: "step" }, { label: key, stroke: "#1f77b4", width: 1.5, spanGaps: true }],
  }, [entry.xs, entry.ys], entry.box);
}

// one page of the metrics API in columns: x (steps) and one array per metric, null where a line
// lacks the metric (uPlot leaves a gap there); a metric first seen on a later page starts there
function addColumns(r) {
  for (const [key, col] of Object.entries(r.columns)) {
    const entry = metrics.series.get(key) || chartFor(key);
    entry.xs = entry.xs.concat(r.x);
    entry.ys = entry.ys.concat(col);
    draw(key, entry);
  }
  document.getElementById("metric-count").textContent =
    `${metrics.series.size} metrics, ${metrics.after} lines` + (typeof uPlot === "undefined" ? " (charts need uPlot: run `make console`)" : "");
}

function filterCharts() {
  const text = document.getElementById("metric-filter").value.toLowerCase();
  for (const [key, entry] of metrics.series) entry.box.style.display = key.toLowerCase().includes(text) ? "" : "none";
}

async function pollMetrics() {
  if (metrics.stopped) return;
  try {
    await loadSummary();  // the status and the latest figures move too
    let more = true;
    while (more) {
      const r = await api(runApi(RUN, "metrics") + "?format=columns&limit=50000&after=" + metrics.after);
      if (r.reset) {  // the file was rewritten (a resumed run): start the curves over
        for (const entry of metrics.series.values()) entry.box.remove();
        metrics.series.clear();
      }
      metrics.after = r.next;
      addColumns(r);
      showWarnings(document.getElementById("metric-warnings"), r.warnings);
      more = r.more;
    }
  } catch (err) {
    if (err.status === 404 || err.status === 401) return stop(err);
    showError(messages, err);
  }
  setTimeout(pollMetrics, POLL_MS);
}

// ---- evaluation ------------------------------------------------------------------------
const EVAL_COLUMNS = [["stage", "stage"], ["set", "set"], ["passed", "passed"], ["n", "n"], ["pass_rate", "pass rate"],
  ["ci95_low", "95% low"], ["ci95_high", "95% high"], ["submit_rate", "submit"], ["turns_to_submit", "turns to submit"],
  ["invalid_calls", "invalid calls"], ["loop_rate", "loops"], ["repair_rate", "repair rate"]];
const RATES = new Set(["pass_rate", "ci95_low", "ci95_high", "submit_rate", "loop_rate", "repair_rate"]);

async function loadEval() {
  const r = await api(runApi(RUN, "eval"));
  const box = document.getElementById("eval");
  if (!r.rows.length) { box.replaceChildren(el("p", { class: "muted" }, "no evaluation files (pipeline.json, eval_*.json)")); return; }
  box.replaceChildren(
    el("table", { id: "eval-table" }, el("tr", {}, EVAL_COLUMNS.map(([, label]) => el("th", {}, label))),
      r.rows.map(row => el("tr", {}, EVAL_COLUMNS.map(([k]) => el("td", {}, RATES.has(k) ? pct(row[k]) : fmt(row[k])))))),
    el("ul", {}, r.tests.map(t => el("li", {}, `${t.name.replaceAll("_", " ")}: gained ${t.gained}, lost ${t.lost}, p = ${fmt(t.p_value, 3)}`))));
  showWarnings(box, r.warnings);
}

// ---- episodes --------------------------------------------------------------------------
async function loadEpisodes() {
  const source = document.getElementById("source").value;
  const q = new URLSearchParams({ source, offset: episodes.offset, limit: EPISODE_PAGE, turns: "false" });
  for (const id of ["result", "task", "step"]) {
    const v = document.getElementById(id).value.trim();
    if (v) q.set(id, v);
  }
  try {
    const r = await api(runApi(RUN, "episodes") + "?" + q);
    episodes.total = r.total;
    document.getElementById("page").textContent =
      ` ${r.total ? r.offset + 1 : 0}\u2013${r.offset + r.episodes.length} of ${r.total} `;
    const team = r.episodes.some(e => e.role);  // a team's episode file: one row a role, each opening the whole episode
    document.querySelector("#episodes thead").replaceChildren(el("tr", {},
      ["episode", "task", ...(team ? ["role"] : []), "passed", "status", "step", "reward", "turns"].map(h => el("th", {}, h))));
    document.querySelector("#episodes tbody").replaceChildren(...r.episodes.map(e => el("tr", {},
      el("td", {}, el("a", { href: `/episode?${new URLSearchParams({ run: RUN, source, id: e.id })}` }, e.id)),
      el("td", {}, fmt(e.task_id)), team ? el("td", {}, fmt(e.role)) : null,
      el("td", {}, e.passed === null || e.passed === undefined ? "-" : e.passed ? "pass" : "fail"), el("td", {}, fmt(e.status)),
      el("td", {}, fmt(e.step)), el("td", {}, fmt(e.reward)), el("td", {}, fmt(e.n_turns)))));
    showWarnings(document.getElementById("episode-warnings"), r.warnings);
  } catch (err) {
    showError(messages, err);
  }
}

function pageBy(delta) {
  const next = episodes.offset + delta * EPISODE_PAGE;
  if (next < 0 || next >= episodes.total) return;
  episodes.offset = next;
  loadEpisodes();
}

async function loadConfig() {
  const r = await api(runApi(RUN, "config"));
  document.getElementById("config").textContent = `# ${r.file}\n` + r.text;
}

document.getElementById("metric-filter").addEventListener("input", filterCharts);
document.getElementById("apply").addEventListener("click", () => { episodes.offset = 0; loadEpisodes(); });
document.getElementById("prev").addEventListener("click", () => pageBy(-1));
document.getElementById("next").addEventListener("click", () => pageBy(1));

(async function start() {
  try {
    await loadSummary();
  } catch (err) {
    return stop(err);
  }
  pollMetrics();
  loadEval().catch(err => showError(document.getElementById("eval"), err));
  loadConfig().catch(err => document.getElementById("config").textContent = err.message);
})();
