// Shared by the console's pages: the token, API calls, element building, messages.
"use strict";

const TOKEN_KEY = "longhaul-console-token";

(function keepToken() {  // a ?token= in the URL goes to this tab's storage and out of the address bar
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  if (token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
  }
})();

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const resp = await fetch(path, { headers, cache: "no-store" });
  const body = await resp.json().catch(() => ({ error: `HTTP ${resp.status} with a body that is not JSON` }));
  if (!resp.ok) throw new ApiError(resp.status, body.error || `HTTP ${resp.status}`);
  return body;
}

function runApi(run, what) {
  return "/api/runs/" + run.split("/").map(encodeURIComponent).join("/") + "/" + what;
}

function el(tag, attrs, ...children) {  // text goes in as text, never as HTML
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function fmt(x, digits = 4) {
  if (x === null || x === undefined) return "-";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toPrecision(digits);
  return String(x);
}

function pct(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%"; }

function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "-"; }

function showError(box, err) {
  box.replaceChildren(el("div", { class: "error" }, err.message || String(err)));
}

const seenWarnings = new Set();
function showWarnings(box, warnings) {  // each warning once, however often the API repeats it
  for (const w of warnings || []) {
    if (seenWarnings.has(w)) continue;
    seenWarnings.add(w);
    box.append(el("div", { class: "warning" }, "warning: " + w));
  }
}
