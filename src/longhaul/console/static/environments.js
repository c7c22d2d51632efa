// The environments page: each task family as `longhaul envcheck` last checked it (the manifest),
// whether its code changed since, and every flaky or failing task with the reason.
"use strict";

const COLUMNS = [
  ["family", "family"], ["kind", "kind"], ["version", "version"], ["status", "status"], ["currency", "code"],
  ["checked_at", "checked at"], ["valid", "valid / checked"], ["distinct_valid", "distinct valid"],
  ["flaky", "flaky"], ["failing", "failing"], ["max_task_s", "slowest task (s)"],
];

function cell(f, key) {
  if (key === "status") return el("td", { class: f.status === "ok" ? "status-finished" : "status-failed" }, f.status ?? "-");
  if (key === "currency") return el("td", { class: f.currency === "current" ? "" : "status-failed" }, f.currency);
  if (key === "valid") return el("td", {}, `${fmt(f.valid)} / ${fmt(f.checked)} (${pct(f.valid_fraction)})`);
  if (key === "flaky" || key === "failing") return el("td", {}, String((f[key] || []).length));
  return el("td", {}, fmt(f[key]));
}

function details(f) {
  const reasons = f.reasons || {};
  const problems = [...(f.failing || []).map(t => ["failing", t]), ...(f.flaky || []).map(t => ["flaky", t])];
  const subs = Object.entries(f.subfamilies || {});
  return el("section", { id: f.family, "data-family": f.family },
    el("h2", {}, f.family),
    el("div", { class: "muted" }, `content hash ${f.content_hash ?? "-"}, ${fmt(f.runs)} runs a task` +
      (f.currency === "stale" ? "; its code changed since this check: training refuses it until `longhaul envcheck " +
        f.family + "` runs again" : "")),
    subs.length ? el("table", { class: "subfamilies" },
      el("thead", {}, el("tr", {}, el("th", {}, "sub-family"), el("th", {}, "valid tasks"))),
      el("tbody", {}, subs.map(([name, n]) => el("tr", {}, el("td", {}, name), el("td", {}, String(n)))))) : null,
    problems.length ? el("table", { class: "problems" },
      el("thead", {}, el("tr", {}, el("th", {}, "task"), el("th", {}, "verdict"), el("th", {}, "why"))),
      el("tbody", {}, problems.map(([kind, t]) => el("tr", {}, el("td", {}, t), el("td", {}, kind),
        el("td", {}, reasons[t] ?? "-"))))) : el("p", { class: "muted" }, "no flaky or failing task"));
}

async function load() {
  const box = document.getElementById("messages");
  try {
    const body = await api("/api/environments");
    document.getElementById("manifest").textContent = "manifest: " + body.manifest;
    if (body.note) box.append(el("div", { class: "warning" }, body.note));
    showWarnings(box, body.warnings);
    document.querySelector("#families thead").replaceChildren(el("tr", {}, COLUMNS.map(([, label]) => el("th", {}, label))));
    document.querySelector("#families tbody").replaceChildren(...body.families.map(f =>
      el("tr", { "data-family": f.family }, COLUMNS.map(([key]) => key === "family"
        ? el("td", {}, el("a", { href: "#" + encodeURIComponent(f.family) }, f.family)) : cell(f, key)))));
    document.getElementById("details").replaceChildren(...body.families.map(details));
  } catch (err) {
    showError(box, err);
  }
}

load();
