// One episode, every turn whole: prompts, replies with their tool calls and rewards, tool outputs.
"use strict";

const params = new URLSearchParams(location.search);
const RUN = params.get("run") || "";

function callBlock(call) {
  return el("div", { class: "call" }, el("b", {}, "tool call: " + (call.name || "(unreadable)")),
    call.error ? el("div", { class: "error" }, call.error) : null,
    el("pre", {}, JSON.stringify(call.arguments, null, 2)));
}

// a team episode's roles, in their order: each role's turns are drawn in its colour
const ACTORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

function turnBlock(turn, k) {
  const head = turn.actor ? [turn.actor, turn.role] : [turn.role];
  if (turn.reward !== undefined && turn.reward !== null) head.push("reward " + fmt(turn.reward));
  if (turn.finish_reason && turn.finish_reason !== "stop") head.push("finished by " + turn.finish_reason);
  const attrs = { class: "turn " + turn.role, "data-turn": k };
  if (turn.actor) {
    attrs["data-actor"] = turn.actor;
    attrs.style = "border-color:" + ACTORS[(turn.actor_index || 0) % ACTORS.length];
  }
  return el("div", attrs,
    el("div", { class: "head" }, `#${k} ` + head.join(" \u00b7 ") + ` \u00b7 ${turn.content.length} characters`),
    el("pre", { class: "content" }, turn.content),
    (turn.tool_calls || []).map(callBlock));
}

// the sandbox audit log's rows of this episode: each command, how it ended, what it used
function auditTable(rows) {
  const head = ["time", "where", "command", "exit", "limit hit", "wall s", "cpu s", "peak RSS", "stdout / stderr bytes"];
  const body = rows.map(r => {
    const session = r.argv && r.argv[0] === "session";
    const command = session ? r.argv[1] : (r.argv || []).join(" ");
    const ended = r.refused ? "refused: " + r.refused : r.signal ? "signal " + r.signal : fmt(r.exit_code);
    return el("tr", {}, [r.time, r.episode ? "check" : session ? "session" : "exec", command, ended, r.limit_hit || "",
      fmt(r.wall_s), fmt(r.cpu_s), fmt(r.peak_rss), `${fmt(r.stdout_bytes)} / ${fmt(r.stderr_bytes)}` +
      (r.truncated ? " (cut)" : "")].map((v, i) => el("td", i === 2 ? { class: "command" } : {}, el(i === 2 ? "code" : "span", {}, String(v ?? "")))));
  });
  return el("table", { class: "audit" }, el("thead", {}, el("tr", {}, head.map(h => el("th", {}, h)))), el("tbody", {}, body));
}

async function loadAudit(sandbox) {
  const box = document.getElementById("audit");
  if (!sandbox) { box.textContent = "this episode names no sandbox (recorded before episodes kept one)"; return; }
  try {
    const a = await api(runApi(RUN, "audit") + "?" + new URLSearchParams({ sandbox }));
    box.className = "";
    box.replaceChildren(a.rows.length ? auditTable(a.rows) : el("p", { class: "muted" }, `no commands of sandbox ${sandbox} in the audit log`));
    showWarnings(box, a.warnings);
  } catch (err) {
    box.replaceChildren(el("p", { class: "muted" }, err.message || String(err)));
  }
}

(async function start() {
  document.getElementById("back").href = "/run?name=" + encodeURIComponent(RUN);
  try {
    const q = new URLSearchParams({ source: params.get("source") || "", id: params.get("id") || "" });
    const e = await api(runApi(RUN, "episode") + "?" + q);
    document.getElementById("title").textContent = `${RUN} \u00b7 ${params.get("source")} \u00b7 ${e.id}`;
    document.getElementById("meta").textContent = `task ${fmt(e.task_id)} \u00b7 ${e.passed === null || e.passed === undefined ? "-" : e.passed ? "passed" : "failed"} (${fmt(e.status)})` +
      ` \u00b7 step ${fmt(e.step)} \u00b7 reward ${fmt(e.reward)} \u00b7 ${e.turns.length} messages`;
    document.getElementById("turns").replaceChildren(...e.turns.map(turnBlock));
    document.getElementById("info").textContent = JSON.stringify(e.info, null, 1);
    loadAudit(e.info && e.info.sandbox);
  } catch (err) {
    showError(document.getElementById("messages"), err);
  }
})();
