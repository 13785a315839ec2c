// Shared by the console's pages: calls to the server's own JSON endpoints (with the API key
// when the server needs one), the key dialog, and DOM helpers that only ever create text
// nodes (model output is never parsed as HTML).

const KEY_STORAGE = "infera.apiKey"; // sessionStorage only: gone when the tab closes

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// The error object of an OpenAI-style error body, or a generic one.
async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  let code = "";
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || "";
    }
  } catch {
    // not JSON
  }
  return new ApiError(response.status, message, code);
}

// fetch() against the server with the key; asks for a key on 401 and retries once.
export async function api(path, { method = "GET", body, signal, retry = true } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401 && retry) {
    const error = await errorOf(response);
    await askForKey(key ? "The key was not accepted: " + error.message : "");
    return api(path, { method, body, signal, retry: false });
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

let pendingKey = null;

// Shows the key dialog (once, however many callers wait) and resolves when a key is set.
export function askForKey(problem = "") {
  if (pendingKey) return pendingKey;
  const dialog = document.getElementById("key-dialog");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const error = document.getElementById("key-error");
  const button = document.getElementById("key-button");
  if (button) button.hidden = false;
  error.hidden = !problem;
  error.textContent = problem;
  input.value = "";
  pendingKey = new Promise((resolve) => {
    const done = (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      sessionStorage.setItem(KEY_STORAGE, value);
      form.removeEventListener("submit", done);
      dialog.close();
      pendingKey = null;
      resolve(value);
    };
    form.addEventListener("submit", done);
  });
  if (!dialog.open) dialog.showModal();
  input.focus();
  return pendingKey;
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_STORAGE);
}

// el("div", {class: "x", onclick: f}, "text", child): text arguments become text nodes.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";
export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function showBanner(text) {
  const banner = document.getElementById("banner");
  if (!banner) return;
  banner.hidden = !text;
  banner.textContent = text || "";
}

export function formatBytes(n) {
  if (!Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) {
    n /= 1024;
    ++i;
  }
  return `${i === 0 ? n : n.toFixed(n < 10 ? 2 : 1)} ${units[i]}`;
}

export function formatNumber(n, digits = 0) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  return n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function formatSeconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "–";
  if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 2 : 1)} ms`;
  if (s < 120) return `${s.toFixed(2)} s`;
  const m = Math.floor(s / 60);
  if (m < 120) return `${m} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}
