// One episode, every turn whole: prompts, replies with their tool calls and rewards, tool outputs.
"use strict";

const params = new URLSearchParams(location.search);
const RUN = params.get("run") || "";

function callBlock(call) {
  return el("div", { class: "call" }, el("b", {}, "tool call: " + (call.name || "(unreadable)")),
    call.error ? el("div", { class: "error" }, call.error) : null,
    el("pre", {}, JSON.stringify(call.arguments, null, 2)));
}

function turnBlock(turn, k) {
  const head = [turn.role];
  if (turn.reward !== undefined && turn.reward !== null) head.push("reward " + fmt(turn.reward));
  if (turn.finish_reason && turn.finish_reason !== "stop") head.push("finished by " + turn.finish_reason);
  return el("div", { class: "turn " + turn.role, "data-turn": k },
    el("div", { class: "head" }, `#${k} ` + head.join(" \u00b7 ") + ` \u00b7 ${turn.content.length} characters`),
    el("pre", { class: "content" }, turn.content),
    (turn.tool_calls || []).map(callBlock));
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
  } catch (err) {
    showError(document.getElementById("messages"), err);
  }
})();
