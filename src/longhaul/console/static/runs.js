// The runs list: every run's summary, sortable and filterable, refreshed every few seconds.
"use strict";

const COLUMNS = [
  ["name", "run"], ["status", "status"], ["algorithm", "algorithm"], ["model", "model"], ["last_step", "last step"],
  ["reward", "reward"], ["pass_rate", "pass rate"], ["started", "started"], ["updated", "updated"],
];
const state = { runs: [], sort: "updated", desc: true };

function cell(run, key) {
  if (key === "name") return el("td", {}, el("a", { href: "/run?name=" + encodeURIComponent(run.name) }, run.name));
  if (key === "status") return el("td", { class: "status-" + run.status }, run.status);
  if (key === "started" || key === "updated") return el("td", {}, when(run[key]));
  if (key === "pass_rate") return el("td", {}, pct(run[key]));
  return el("td", {}, fmt(run[key]));
}

function render() {
  const head = document.querySelector("#runs thead");
  head.replaceChildren(el("tr", {}, COLUMNS.map(([key, label]) => el("th", {
    class: "sortable", "data-key": key,
    onclick: () => { state.desc = state.sort === key ? !state.desc : false; state.sort = key; render(); },
  }, label + (state.sort === key ? (state.desc ? " \u25bc" : " \u25b2") : "")))));
  const text = document.getElementById("filter").value.toLowerCase();
  const status = document.getElementById("status").value;
  const rows = state.runs.filter(r => (!status || r.status === status) &&
    [r.name, r.algorithm, r.model].some(v => String(v ?? "").toLowerCase().includes(text)));
  rows.sort((a, b) => {
    const x = a[state.sort], y = b[state.sort];
    const c = x === y ? 0 : x === null || x === undefined ? 1 : y === null || y === undefined ? -1 : x < y ? -1 : 1;
    return state.desc ? -c : c;
  });
  document.querySelector("#runs tbody").replaceChildren(...rows.map(r => el("tr", { "data-run": r.name },
    COLUMNS.map(([key]) => cell(r, key)))));
}

async function refresh() {
  const box = document.getElementById("messages");
  try {
    const body = await api("/api/runs");
    state.runs = body.runs;
    document.getElementById("root").textContent = `${body.runs.length} runs in ${body.root}`;
    box.replaceChildren();
    render();
  } catch (err) {
    showError(box, err);
  }
  setTimeout(refresh, 5000);
}

document.getElementById("filter").addEventListener("input", render);
document.getElementById("status").addEventListener("change", render);
refresh();
