// The playground: a chat with a model served by an OpenAI-compatible server, relayed by the
// console (POST /api/playground/chat); replies stream in as the server sends them, tool calls
// shown as they are built.
"use strict";

const chat = { messages: [], busy: false };

function bubble(role, text) {
  const body = el("pre", { class: "content" }, text);
  const node = el("div", { class: "turn " + role, "data-role": role }, el("div", { class: "head" }, role), body);
  document.getElementById("transcript").append(node);
  return { node, body };
}

// server-sent events: the complete `data:` lines in `buffer`, and what is left of it
function events(buffer) {
  const lines = buffer.split("\n");
  const rest = lines.pop();
  return { data: lines.filter(l => l.startsWith("data:")).map(l => l.slice(5).trim()), rest };
}

async function send() {
  const box = document.getElementById("messages");
  const input = document.getElementById("prompt");
  const text = input.value.trim();
  if (!text || chat.busy) return;
  chat.busy = true;
  box.replaceChildren();
  chat.messages.push({ role: "user", content: text });
  bubble("user", text);
  input.value = "";
  const reply = bubble("assistant", "");
  const calls = [];
  let content = "";
  try {
    const headers = { "Content-Type": "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const resp = await fetch("/api/playground/chat", { method: "POST", headers, body: JSON.stringify({
      model: document.getElementById("model").value, messages: chat.messages,
      max_tokens: Number(document.getElementById("max-tokens").value),
      temperature: Number(document.getElementById("temperature").value),
    }) });
    if (!resp.ok) {
      const body = await resp.json().catch(() => ({}));
      throw new ApiError(resp.status, body.error || `HTTP ${resp.status}`);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "", done = false;
    while (!done) {
      const chunk = await reader.read();
      if (chunk.done) break;
      buffer += decoder.decode(chunk.value, { stream: true });
      const got = events(buffer);
      buffer = got.rest;
      for (const d of got.data) {
        if (d === "[DONE]") { done = true; break; }
        const ev = JSON.parse(d);
        if (ev.error) throw new Error(ev.error.message || JSON.stringify(ev.error));
        const delta = (ev.choices && ev.choices[0] && ev.choices[0].delta) || {};
        if (delta.content) content += delta.content;
        for (const tc of delta.tool_calls || []) {  // a call's name, then its arguments in pieces
          const c = calls[tc.index] || (calls[tc.index] = { name: "", arguments: "" });
          if (tc.function && tc.function.name) c.name += tc.function.name;
          if (tc.function && tc.function.arguments) c.arguments += tc.function.arguments;
        }
        reply.body.textContent = content;
        reply.node.querySelectorAll(".call").forEach(n => n.remove());
        for (const c of calls) reply.node.append(el("div", { class: "call" }, `tool call: ${c.name}(${c.arguments})`));
      }
    }
    reply.node.setAttribute("data-done", "true");
    chat.messages.push({ role: "assistant", content });
  } catch (err) {
    reply.node.setAttribute("data-done", "error");
    chat.messages.pop();  // the turn did not happen: it is not sent again with the next message
    showError(box, err);
  } finally {
    chat.busy = false;
  }
}

async function load() {
  const box = document.getElementById("messages");
  document.getElementById("send").addEventListener("click", send);
  document.getElementById("prompt").addEventListener("keydown", e => { if (e.key === "Enter" && e.ctrlKey) send(); });
  document.getElementById("clear").addEventListener("click", () => {
    chat.messages = [];
    document.getElementById("transcript").replaceChildren();
  });
  try {
    const body = await api("/api/playground");
    document.getElementById("server").textContent = "server: " + body.server;
    document.getElementById("model").replaceChildren(...body.models.map(m => el("option", { value: m }, m)));
  } catch (err) {
    showError(box, err);
  }
}

load();
