// The chat page: pick a model, talk to it with streamed answers (fetch + SSE parsing, a
// stop button), conversations kept in this browser's localStorage and exportable as JSON.
import { api, askForKey, el, forgetKey, formatNumber, showBanner } from "./common.js";
import { renderMarkdown } from "./markdown.js";

const STORE = "infera.conversations";
const CURRENT = "infera.currentConversation";
const SETTINGS = "infera.chatSettings";
const $ = (id) => document.getElementById(id);

let conversations = load(STORE, []);
let current = localStorage.getItem(CURRENT) || "";
let controller = null; // AbortController of the answer being streamed

function load(name, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(name));
    return v ?? fallback;
  } catch {
    return fallback;
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(conversations));
    localStorage.setItem(CURRENT, current);
  } catch (e) {
    showBanner(`Could not save the conversation in this browser: ${e.message}`);
  }
}

function conversation() {
  return conversations.find((c) => c.id === current);
}

function newId() {
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

// ---- settings ----------------------------------------------------------------------------
const SETTING_FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed"];

function restoreSettings() {
  const s = load(SETTINGS, {});
  for (const f of SETTING_FIELDS) if (s[f] !== undefined) $(f).value = s[f];
  for (const f of SETTING_FIELDS) $(f).addEventListener("change", storeSettings);
}

function storeSettings() {
  const s = {};
  for (const f of SETTING_FIELDS) s[f] = $(f).value;
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}

function numberField(id) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

// ---- models ------------------------------------------------------------------------------
async function loadModels() {
  const select = $("model");
  try {
    const response = await api("/v1/models");
    const { data } = await response.json();
    const previous = select.value || conversation()?.model || localStorage.getItem("infera.model");
    select.replaceChildren(
      ...data.map((m) =>
        el("option", { value: m.id, disabled: m.state !== "ready" }, m.state === "ready" ? m.id : `${m.id} (${m.state})`),
      ),
    );
    const ready = data.filter((m) => m.state === "ready").map((m) => m.id);
    if (previous && ready.includes(previous)) select.value = previous;
    else if (ready.length) select.value = ready[0];
    if (!data.length) showBanner("This key may use no model.");
    else if (!ready.length) {
      showBanner("No model is ready yet; waiting…");
      setTimeout(loadModels, 2000);
    } else showBanner("");
  } catch (e) {
    showBanner(`Cannot list the models: ${e.message}`);
  }
}

// ---- conversations -----------------------------------------------------------------------
function titleOf(c) {
  const first = c.messages.find((m) => m.role === "user");
  return first ? first.content.slice(0, 60) || "(empty)" : "New chat";
}

function renderList() {
  const list = $("conversations");
  list.replaceChildren(
    ...conversations
      .slice()
      .sort((a, b) => b.updated - a.updated)
      .map((c) =>
        el(
          "li",
          { class: c.id === current ? "active" : "" },
          el("button", { type: "button", class: "open", "aria-current": c.id === current ? "true" : undefined, onclick: () => open(c.id) }, titleOf(c)),
          el("button", { type: "button", class: "delete icon-button", title: "Delete this conversation", "aria-label": `Delete ${titleOf(c)}`, onclick: () => remove(c.id) }, "×"),
        ),
      ),
  );
}

function open(id) {
  if (controller) return;
  current = id;
  const c = conversation();
  if (c?.model && [...$("model").options].some((o) => o.value === c.model && !o.disabled)) $("model").value = c.model;
  if (c) $("system").value = c.system ?? $("system").value;
  save();
  renderList();
  renderMessages();
  closeSidebar();
  $("input").focus();
}

function closeSidebar() {
  if (!document.body.classList.contains("sidebar-open")) return;
  document.body.classList.remove("sidebar-open");
  $("toggle-sidebar").setAttribute("aria-expanded", "false");
  $("toggle-sidebar").focus();
}

function remove(id) {
  if (controller && id === current) return;
  conversations = conversations.filter((c) => c.id !== id);
  if (current === id) current = "";
  save();
  renderList();
  renderMessages();
}

function startConversation() {
  const c = { id: newId(), created: Date.now(), updated: Date.now(), model: $("model").value, system: $("system").value, messages: [] };
  conversations.push(c);
  current = c.id;
  return c;
}

function exportAll() {
  const blob = new Blob([JSON.stringify({ exported: new Date().toISOString(), conversations }, null, 2)], { type: "application/json" });
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: `infera-conversations-${new Date().toISOString().slice(0, 19).replace(/:/g, "-")}.json` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// ---- rendering ---------------------------------------------------------------------------
function statsText(s) {
  if (!s) return "";
  const parts = [];
  if (s.tokens !== undefined) parts.push(`${s.tokens} tokens`);
  if (s.ttft_ms !== undefined) parts.push(`TTFT ${formatNumber(s.ttft_ms)} ms`);
  if (s.tokens_per_s !== undefined) parts.push(`${formatNumber(s.tokens_per_s, 1)} tokens/s`);
  if (s.finish) parts.push(s.finish);
  return parts.join(" · ");
}

function toolCallText(call) {
  let args = call.function?.arguments ?? "";
  try {
    args = JSON.parse(args);
  } catch {
    // shown as sent
  }
  return JSON.stringify({ name: call.function?.name, arguments: args }, null, 2);
}

function messageNode(m) {
  const node = el("article", { class: `message ${m.role}`, "data-role": m.role });
  node.append(el("div", { class: "role" }, m.role === "user" ? "You" : "Assistant"));
  fillMessage(node, m);
  return node;
}

function fillMessage(node, m) {
  node.querySelectorAll(".body, .reasoning, .tool-calls, .stats, .error").forEach((n) => n.remove());
  if (m.reasoning) {
    const details = el("details", { class: "reasoning" }, el("summary", {}, "Reasoning"));
    details.append(el("div", { class: "reasoning-text" }, m.reasoning));
    if (m.reasoning_open) details.open = true;
    details.addEventListener("toggle", () => (m.reasoning_open = details.open));
    node.append(details);
  }
  const body = el("div", { class: "body" });
  if (m.role === "user") body.append(el("p", { class: "plain" }, m.content));
  else body.append(renderMarkdown(m.content || ""));
  node.append(body);
  if (m.tool_calls?.length) {
    node.append(el("div", { class: "tool-calls" }, ...m.tool_calls.map((c) => el("div", { class: "tool-call" }, el("div", { class: "code-head" }, "tool call"), el("pre", {}, el("code", {}, toolCallText(c)))))));
  }
  if (m.error) node.append(el("p", { class: "error" }, m.error));
  if (m.stats) node.append(el("div", { class: "stats" }, statsText(m.stats)));
}

function renderMessages() {
  const c = conversation();
  const box = $("messages");
  if (!c || !c.messages.length) {
    box.replaceChildren(el("p", { class: "empty" }, "Send a message to start. Conversations stay in this browser."));
    return;
  }
  box.replaceChildren(...c.messages.map(messageNode));
  box.scrollTop = box.scrollHeight;
}

// ---- sending -----------------------------------------------------------------------------
function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("model").disabled = busy;
  $("new-chat").disabled = busy;
}

// Yields the data of each SSE event of `response`'s body.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) yield data;
    }
  }
}

async function send() {
  const text = $("input").value;
  if (!text.trim() || controller) return;
  const model = $("model").value;
  if (!model) {
    showBanner("No model to send to.");
    return;
  }
  const c = conversation() || startConversation();
  c.model = model;
  c.system = $("system").value;
  c.messages.push({ role: "user", content: text });
  const answer = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
  c.messages.push(answer);
  c.updated = Date.now();
  $("input").value = "";
  save();
  renderList();
  renderMessages();
  const node = $("messages").lastElementChild;
  node.classList.add("streaming");

  const messages = [];
  if (c.system.trim()) messages.push({ role: "system", content: c.system });
  for (const m of c.messages.slice(0, -1)) {
    const out = { role: m.role, content: m.content || "" };
    if (m.tool_calls?.length) out.tool_calls = m.tool_calls;
    messages.push(out);
  }
  const request = { model, messages, stream: true, stream_options: { include_usage: true } };
  for (const f of ["temperature", "top_p", "max_tokens", "seed"]) {
    const v = numberField(f);
    if (v !== undefined) request[f] = v;
  }

  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let first = 0;
  let chunks = 0;
  let usage = null;
  let timings = null;
  let frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      fillMessage(node, answer);
      const box = $("messages");
      box.scrollTop = box.scrollHeight;
    });
  };
  try {
    const response = await api("/v1/chat/completions", { method: "POST", body: request, signal: controller.signal });
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
      if (chunk.usage) usage = chunk.usage;
      if (chunk.timings) timings = chunk.timings;
      const choice = chunk.choices?.find((c) => (c.index ?? 0) === 0);
      if (!choice) continue;
      const delta = choice.delta || {};
      if (delta.content || delta.reasoning_content || delta.tool_calls) {
        if (!first) first = performance.now();
        ++chunks;
      }
      if (delta.content) answer.content += delta.content;
      if (delta.reasoning_content) answer.reasoning += delta.reasoning_content;
      for (const t of delta.tool_calls || []) {
        const call = (answer.tool_calls[t.index ?? 0] ||= { id: t.id, type: "function", function: { name: "", arguments: "" } });
        if (t.id) call.id = t.id;
        if (t.function?.name) call.function.name += t.function.name;
        if (t.function?.arguments) call.function.arguments += t.function.arguments;
      }
      if (choice.finish_reason) answer.finish = choice.finish_reason;
      redraw();
    }
  } catch (e) {
    if (e.name === "AbortError") answer.finish = "stopped";
    else answer.error = e.message;
  } finally {
    const end = performance.now();
    const tokens = usage?.completion_tokens ?? chunks;
    answer.stats = { tokens, finish: answer.finish };
    if (first) {
      answer.stats.ttft_ms = Math.round(first - started);
      // The engine's own decode rate where the server reports it (the browser's clock
      // cannot time a short answer that arrives within a millisecond), else the browser's.
      if (timings?.predicted_per_second > 0) answer.stats.tokens_per_s = timings.predicted_per_second;
      else if (tokens > 1 && end > first) answer.stats.tokens_per_s = ((tokens - 1) * 1000) / (end - first);
    }
    delete answer.finish;
    if (!answer.tool_calls.length) delete answer.tool_calls;
    if (!answer.reasoning) delete answer.reasoning;
    controller = null;
    setBusy(false);
    if (frame) cancelAnimationFrame(frame);
    frame = 0;
    c.updated = Date.now();
    save();
    fillMessage(node, answer);
    node.classList.remove("streaming");
    $("input").focus();
  }
}

function stop() {
  controller?.abort();
}

// ---- wiring ------------------------------------------------------------------------------
function init() {
  restoreSettings();
  if (!conversation()) current = "";
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    if (document.body.classList.contains("sidebar-open")) {
      e.preventDefault();
      closeSidebar();
    } else if (controller) {
      e.preventDefault();
      stop();
    }
  });
  $("close-sidebar").addEventListener("click", closeSidebar);
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => {
    current = "";
    save();
    renderList();
    renderMessages();
    $("input").focus();
  });
  $("export").addEventListener("click", exportAll);
  $("model").addEventListener("change", () => localStorage.setItem("infera.model", $("model").value));
  $("key-button").addEventListener("click", async () => {
    forgetKey();
    await askForKey();
    loadModels();
  });
  $("toggle-sidebar").addEventListener("click", () => {
    const open = document.body.classList.toggle("sidebar-open");
    $("toggle-sidebar").setAttribute("aria-expanded", String(open));
    if (open) $("new-chat").focus();
  });
  renderList();
  renderMessages();
  loadModels();
  $("input").focus();
}

init();
