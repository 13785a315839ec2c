// The web console in a real browser: Debian's chromium, headless, driven by puppeteer-core.
// Starts `infera serve` on the built-in model (models/infera-default) on free loopback
// ports, once without keys and once with one, and checks the chat page (choose the model,
// send with Enter, streamed text, stop, reload finds the conversation, "<script>" stays
// text, CSP blocks inline script, keyboard use, a 390 px wide phone viewport) and the status
// page (its numbers against /metrics after a known number of requests, a loading model's
// progress bar), with no console errors. Screenshots go to the artifacts folder.
//
//   node tests/browser/console.mjs <path-to-infera-binary> [artifacts-dir]
//
// Exits 77 (skipped, with the reason) when chromium or puppeteer-core is missing:
// scripts/install-deps.sh --test installs both.
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const SKIP = 77;

function skip(why) {
  console.log(`SKIPPED: ${why}`);
  process.exit(SKIP);
}

const bin = process.argv[2] ? path.resolve(process.argv[2]) : "";
if (!bin || !fs.existsSync(bin)) {
  console.error("usage: node tests/browser/console.mjs <path-to-infera-binary> [artifacts-dir]");
  process.exit(2);
}
const artifacts = path.resolve(process.argv[3] || path.join(path.dirname(bin), "browser-artifacts"));
fs.mkdirSync(artifacts, { recursive: true });

const chromePath = [process.env.CHROMIUM_PATH, "/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => p && fs.existsSync(p));
if (!chromePath) skip("chromium not found (Debian package 'chromium'; scripts/install-deps.sh --test installs it)");
let puppeteer;
try {
  puppeteer = (await import("puppeteer-core")).default;
} catch {
  skip("puppeteer-core is not installed in tests/browser (scripts/install-deps.sh --test runs npm ci there)");
}
if (!fs.existsSync(path.join(repo, "models", "infera-default", "config.json"))) skip("the built-in model models/infera-default is missing");

// ---- helpers ------------------------------------------------------------------------------
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const children = new Set();
process.on("exit", () => {
  for (const p of children) p.kill("SIGKILL");
});

let failures = 0;
function check(ok, what, detail = "") {
  if (ok) console.log(`ok   ${what}`);
  else {
    ++failures;
    console.log(`FAIL ${what}${detail ? `: ${detail}` : ""}`);
  }
  return ok;
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// A plain HTTP request (any Host header), resolved with {status, headers, body}.
function request(port, method, p, { headers = {}, body } = {}) {
  return new Promise((resolve) => {
    const req = http.request({ host: "127.0.0.1", port, method, path: p, headers, timeout: 10000 }, (res) => {
      const parts = [];
      res.on("data", (d) => parts.push(d));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts).toString() }));
    });
    req.on("error", (e) => resolve({ status: 0, headers: {}, body: String(e) }));
    req.on("timeout", () => req.destroy(new Error("timeout")));
    if (body !== undefined) req.write(body);
    req.end();
  });
}

async function serve(name, extra) {
  const port = await freePort();
  const proc = spawn(bin, ["serve", "--host", "127.0.0.1", "--port", String(port), "-t", "1", "--kv-cache-memory", "64MiB", ...extra], {
    cwd: repo,
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.add(proc);
  let log = "";
  proc.stdout.on("data", (d) => (log += d));
  proc.stderr.on("data", (d) => (log += d));
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`${name}: infera serve exited (${proc.exitCode}):\n${log}`);
    if ((await request(port, "GET", "/ready")).status === 200) return { port, proc, url: `http://127.0.0.1:${port}`, log: () => log };
    await sleep(100);
  }
  throw new Error(`${name}: not ready within 60 s:\n${log}`);
}

// Values of `name{...labels}` lines of a Prometheus text page, for model infera-default.
function metric(text, name, labels = "") {
  const line = text.split("\n").find((l) => l.startsWith(`${name}{model="infera-default"${labels}}`));
  return line ? Number(line.split(" ").pop()) : NaN;
}

async function chat(port, body) {
  return request(port, "POST", "/v1/chat/completions", { headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

async function waitFor(what, fn, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await fn();
    if (last) return last;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

// ---- the run -------------------------------------------------------------------------------
const t0 = Date.now();
const [open, keyed] = await Promise.all([serve("open", []), serve("keyed", ["--api-key", "console-test-key-0001"])]);
const browser = await puppeteer.launch({
  executablePath: chromePath,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check", "--disable-extensions"],
});

const consoleErrors = [];
let expectCsp = false;
const cspReports = [];
// `expect401`: the page of a server with keys asks for one after its first call gets 401,
// which the browser logs as a failed load; nothing else may be logged as an error.
async function newPage({ width = 1280, height = 860, expect401 = false } = {}) {
  const page = await browser.newPage();
  await page.setViewport({ width, height });
  page.on("console", (msg) => {
    if (msg.type() !== "error") return;
    if (expectCsp && /Content Security Policy/i.test(msg.text())) cspReports.push(msg.text());
    else if (expect401 && /status of 401/.test(msg.text())) return;
    else consoleErrors.push(`${page.url()}: ${msg.text()}`);
  });
  page.on("pageerror", (e) => consoleErrors.push(`${page.url()}: uncaught ${e.message}`));
  return page;
}
const shot = (page, name) => page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });

try {
  // -- served files: headers, caching, the guard, --no-console is covered by the unit tests --
  const index = await request(open.port, "GET", "/");
  const csp = index.headers["content-security-policy"] || "";
  check(index.status === 200 && /^text\/html/.test(index.headers["content-type"]), "GET / serves the chat page");
  check(/default-src 'self'/.test(csp) && /frame-ancestors 'none'/.test(csp) && !/unsafe-inline/.test(csp), "strict CSP", csp);
  check(index.headers["x-content-type-options"] === "nosniff", "X-Content-Type-Options: nosniff");
  const js = await request(open.port, "GET", "/console/chat.js");
  check(/^text\/javascript/.test(js.headers["content-type"]) && js.headers.etag, "scripts as text/javascript with an ETag");
  const again = await request(open.port, "GET", "/console/chat.js", { headers: { "If-None-Match": js.headers.etag } });
  check(again.status === 304 && again.body === "", "If-None-Match revalidates with 304");
  check((await request(open.port, "GET", "/status", { headers: { Host: "rebound.example" } })).status === 200, "pages answer any Host (static, no data)");
  check((await request(open.port, "GET", "/v1/stats", { headers: { Host: "rebound.example" } })).status === 403, "/v1/stats keeps the Host guard without keys");
  check((await request(keyed.port, "GET", "/v1/stats")).status === 401, "/v1/stats needs a key when keys are configured");
  check((await request(keyed.port, "GET", "/")).status === 200, "the page itself needs no key");

  // -- chat page ------------------------------------------------------------------------------
  const page = await newPage();
  await page.goto(`${open.url}/`, { waitUntil: "load" });
  await page.waitForSelector('#model option[value="infera-default"]:not([disabled])');
  await page.select("#model", "infera-default");
  check(await page.$eval("#model", (s) => s.value) === "infera-default", "the model is chosen");
  await page.click("#settings summary");
  const setField = async (id, value) => {
    await page.$eval(`#${id}`, (e, v) => {
      e.value = v;
      e.dispatchEvent(new Event("change"));
    }, String(value));
  };
  await setField("temperature", 0);
  await setField("max_tokens", 40);
  await setField("system", "You are a scribe.");

  const assistantCount = () => page.$$eval("#messages .message.assistant", (n) => n.length);
  const lastAnswer = () =>
    page.$eval("#messages .message.assistant:last-of-type", (n) => ({
      text: n.querySelector(".body")?.textContent || "",
      stats: n.querySelector(".stats")?.textContent || "",
      streaming: n.classList.contains("streaming"),
    }));
  // Records the growth of the answer being streamed.
  const watchStream = () =>
    page.evaluate(() => {
      window.__lengths = [];
      const box = document.getElementById("messages");
      window.__observer?.disconnect();
      window.__observer = new MutationObserver(() => {
        const body = box.querySelector(".message.assistant.streaming .body");
        if (body) window.__lengths.push(body.textContent.length);
      });
      window.__observer.observe(box, { childList: true, subtree: true, characterData: true });
    });

  // 1: a short answer, sent with Enter.
  await page.focus("#input");
  await page.keyboard.type("In the beginning");
  await page.keyboard.press("Enter");
  await waitFor("the first answer", async () => (await assistantCount()) === 1 && !(await lastAnswer()).streaming);
  let a = await lastAnswer();
  check(a.text.trim().length > 0, "Enter sends and an answer arrives", JSON.stringify(a));
  check(/\d+ tokens · TTFT \d+ ms · [\d.,]+ tokens\/s/.test(a.stats), "the answer shows tokens, TTFT and tokens/s", a.stats);
  await shot(page, "chat-answer");

  // 2: a long answer, streamed, stopped with the Stop button. The tiny model ends its turns
  // after a few dozen tokens and writes a thousand in well under a second, so this one
  // request gets ignore_eos and n: 16 added on its way out (the page shows choice 0): it
  // then streams for seconds, whatever the machine's speed relative to the browser's.
  await setField("max_tokens", 900);
  await setField("temperature", 1);
  await setField("seed", 7);
  await watchStream();
  await page.setRequestInterception(true);
  const addIgnoreEos = (req) => {
    if (req.method() === "POST" && req.url().endsWith("/v1/chat/completions")) {
      req.continue({ postData: JSON.stringify({ ...JSON.parse(req.postData()), ignore_eos: true, n: 16 }) });
    } else req.continue();
  };
  page.on("request", addIgnoreEos);
  await page.type("#input", "And God said");
  await page.keyboard.press("Enter");
  await waitFor("streamed text", () =>
    page.evaluate(() => new Set(window.__lengths.filter((n) => n > 0)).size >= 3 && document.querySelector(".message.assistant.streaming")),
  );
  check(true, "text arrives in pieces while streaming");
  check(await page.$eval("#stop", (b) => !b.hidden), "a Stop button shows while streaming");
  await shot(page, "chat-streaming");
  await page.click("#stop");
  await waitFor("the stop", async () => !(await lastAnswer()).streaming);
  a = await lastAnswer();
  check(/stopped/.test(a.stats), "Stop ends the answer", a.stats);
  check(await page.$eval("#send", (b) => !b.hidden), "Send returns after stopping");
  page.off("request", addIgnoreEos);
  await page.setRequestInterception(false);
  await waitFor("the server to cancel the generation", async () => {
    const m = (await request(open.port, "GET", "/metrics")).body;
    return metric(m, "infera_requests_running") === 0 && metric(m, "infera_requests_total", ',status="499"') === 1;
  }, 10000);
  check(true, "the server cancelled the stopped generation (499, nothing running)");

  // 3: markup in a message stays text; CSP blocks injected inline script.
  await setField("max_tokens", 8);
  const evil = `<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> **bold** \`code\``;
  await page.$eval("#input", (e, v) => (e.value = v), evil);
  await page.click("#send");
  await waitFor("the third answer", async () => (await assistantCount()) === 3 && !(await lastAnswer()).streaming);
  const rendered = await page.$$eval("#messages .message.user .body", (n) => n[n.length - 1].textContent);
  check(rendered.includes("<script>window.__xss = 1</script>"), "a message with <script> renders as text", rendered);
  check(await page.evaluate(() => window.__xss === undefined && !document.querySelector("#messages script, #messages img")), "no element or script came from message text");
  expectCsp = true;
  const inline = await page.evaluate(async () => {
    let violated = false;
    document.addEventListener("securitypolicyviolation", () => (violated = true));
    const s = document.createElement("script");
    s.textContent = "window.__inline = 1";
    document.body.append(s);
    const st = document.createElement("div");
    st.setAttribute("style", "color: red");
    document.body.append(st);
    await new Promise((r) => setTimeout(r, 100));
    return { ran: window.__inline === 1, violated };
  });
  expectCsp = false;
  check(!inline.ran && inline.violated && cspReports.length > 0, "CSP blocks an injected inline script (and says so)", JSON.stringify(inline));

  // 4: keyboard: Shift+Enter adds a line, Tab reaches Send, Enter on a button works.
  await page.focus("#input");
  await page.keyboard.type("line one");
  await page.keyboard.down("Shift");
  await page.keyboard.press("Enter");
  await page.keyboard.up("Shift");
  await page.keyboard.type("line two");
  check((await page.$eval("#input", (e) => e.value)) === "line one\nline two" && (await assistantCount()) === 3, "Shift+Enter adds a line without sending");
  await page.keyboard.press("Tab");
  check(await page.evaluate(() => document.activeElement?.id === "send"), "Tab moves from the message to Send");
  await page.keyboard.press("Enter");
  await waitFor("the fourth answer", async () => (await assistantCount()) === 4 && !(await lastAnswer()).streaming);
  check(true, "Enter on the focused Send button sends");

  // 5: reload: the conversation is still there.
  const before = await page.$$eval("#messages .message", (n) => n.map((m) => m.textContent));
  await page.reload({ waitUntil: "load" });
  await page.waitForSelector("#messages .message.user");
  const after = await page.$$eval("#messages .message", (n) => n.map((m) => m.textContent));
  check(after.length === 8 && JSON.stringify(after) === JSON.stringify(before), "reload finds the conversation", `${before.length} -> ${after.length}`);
  check((await page.$$eval("#conversations li", (n) => n.map((x) => x.textContent))).some((t) => t.includes("In the beginning")), "the conversation is listed by its first message");
  check(await page.evaluate(() => !JSON.stringify(localStorage).includes("console-test-key")), "no key in localStorage");
  await shot(page, "chat-desktop");

  // 6: reasoning, tool calls, Markdown and code as the page renders them, from a canned
  // stream (the built-in model writes neither reasoning nor tool calls): answered by the
  // browser's request interception, so the server never sees it.
  await page.click("#new-chat");
  const canned = [
    { choices: [{ index: 0, delta: { role: "assistant", reasoning_content: "Thinking <b>hard</b>" } }] },
    { choices: [{ index: 0, delta: { content: "# Plan\nHere is code:\n```js\nconst a = 1 < 2;\n```\n**done** and a [link](javascript:alert(1))\n<script>alert(1)</script>" } }] },
    { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":' } }] } }] },
    { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] }, finish_reason: "tool_calls" }] },
    { choices: [], usage: { prompt_tokens: 5, completion_tokens: 12, total_tokens: 17 } },
  ];
  const cannedBody = canned.map((c) => `data: ${JSON.stringify(c)}\n\n`).join("") + "data: [DONE]\n\n";
  await page.setRequestInterception(true);
  const answerCanned = (req) => {
    if (req.method() === "POST" && req.url().endsWith("/v1/chat/completions")) {
      req.respond({ status: 200, contentType: "text/event-stream", body: cannedBody });
    } else req.continue();
  };
  page.on("request", answerCanned);
  await page.type("#input", "What is the weather?");
  await page.keyboard.press("Enter");
  await waitFor("the canned answer", async () => (await assistantCount()) === 1 && !(await lastAnswer()).streaming);
  page.off("request", answerCanned);
  await page.setRequestInterception(false);
  const view = await page.$eval("#messages .message.assistant", (n) => ({
    reasoningOpen: n.querySelector("details.reasoning")?.open,
    reasoning: n.querySelector(".reasoning-text")?.textContent,
    heading: n.querySelector(".body h3")?.textContent,
    code: n.querySelector(".body .code-block pre code")?.textContent,
    lang: n.querySelector(".body .code-block .code-head")?.firstChild?.textContent,
    bold: n.querySelector(".body strong")?.textContent,
    links: [...n.querySelectorAll("a")].map((a) => a.getAttribute("href")),
    scripts: n.querySelectorAll("script, b").length,
    tool: n.querySelector(".tool-call pre code")?.textContent,
    stats: n.querySelector(".stats")?.textContent,
  }));
  check(view.reasoningOpen === false && view.reasoning === "Thinking <b>hard</b>", "reasoning shows in a closed, collapsible block, as text", JSON.stringify(view));
  check(view.heading === "Plan" && view.code === "const a = 1 < 2;" && view.lang === "js" && view.bold === "done", "Markdown: heading, code block with its language, bold", JSON.stringify(view));
  check(view.links.length === 0 && view.scripts === 0, "no javascript: link and no element from model text");
  let tool = null;
  try {
    tool = JSON.parse(view.tool);
  } catch {}
  check(tool?.name === "get_weather" && tool?.arguments?.city === "Paris" && /\n {2}"name"/.test(view.tool), "a tool call shows as formatted JSON", view.tool);
  check(/^12 tokens/.test(view.stats) && /tool_calls/.test(view.stats), "usage and finish reason of the answer", view.stats);
  await page.click("#messages details.reasoning summary");
  check(await page.$eval("#messages details.reasoning", (d) => d.open), "the reasoning block opens");
  await shot(page, "chat-rendering");
  await page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "dark" }]);
  await shot(page, "chat-rendering-dark");
  await page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "light" }]);
  // Export: the JSON file the button downloads holds both conversations.
  const exported = await page.evaluate(async () => {
    let blob = null;
    const create = URL.createObjectURL;
    URL.createObjectURL = (b) => ((blob = b), create.call(URL, b));
    const click = HTMLAnchorElement.prototype.click;
    HTMLAnchorElement.prototype.click = function () {}; // no download dialog in the test
    document.getElementById("export").click();
    HTMLAnchorElement.prototype.click = click;
    URL.createObjectURL = create;
    return blob ? JSON.parse(await blob.text()) : null;
  });
  const titles = (exported?.conversations || []).map((c) => c.messages[0]?.content);
  check(titles.includes("In the beginning") && titles.includes("What is the weather?"), "Export JSON holds every conversation", JSON.stringify(titles));

  // -- status page against /metrics after a known number of requests ---------------------------
  for (let i = 0; i < 3; ++i) {
    const r = await chat(open.port, { model: "infera-default", messages: [{ role: "user", content: `Psalm ${i}` }], max_tokens: 6 });
    check(r.status === 200, `direct request ${i + 1} of 3`);
  }
  // A request is counted when its response has gone out, so the last one may land a moment
  // after its client has the answer: wait for the known count, then read everything once.
  let metricsText = "";
  try {
    await waitFor("/metrics to count 6 completed requests", async () => {
      metricsText = (await request(open.port, "GET", "/metrics")).body;
      return metric(metricsText, "infera_requests_total", ',status="200"') === 6;
    }, 5000);
  } catch {
    // reported by the check below
  }
  const expected = {
    ok: metric(metricsText, "infera_requests_total", ',status="200"'),
    generated: metric(metricsText, "infera_generation_tokens_total"),
    prompt: metric(metricsText, "infera_prompt_tokens_total"),
    kvTotal: metric(metricsText, "infera_kv_blocks_total"),
  };
  check(expected.ok === 6, "/metrics counts the 6 completed requests (3 from the page, 3 direct)", String(expected.ok));
  const status = await newPage();
  await status.goto(`${open.url}/status`, { waitUntil: "load" });
  const card = '[data-model="infera-default"]';
  await status.waitForSelector(`${card} [data-stat="requests-ok"]`);
  const num = (sel) => status.$eval(`${card} [data-stat="${sel}"]`, (n) => Number(n.textContent.replace(/,/g, "")));
  check((await num("requests-ok")) === expected.ok, "status page: successful requests match /metrics", `${await num("requests-ok")} vs ${expected.ok}`);
  check((await num("generation-tokens")) === expected.generated, "status page: generated tokens match /metrics", `${await num("generation-tokens")} vs ${expected.generated}`);
  check((await num("prompt-tokens")) === expected.prompt, "status page: prompt tokens match /metrics");
  const kv = await status.$eval(`${card} [data-stat="kv-blocks"]`, (n) => n.textContent);
  check(Number(kv.split("/").pop().replace(/,/g, "")) === expected.kvTotal, "status page: KV blocks total matches /metrics", kv);
  check((await status.$eval(`${card} [data-stat="state"]`, (n) => n.textContent)) === "ready", "status page: the model is ready");
  check(/^(avx512|avx2|scalar)$/.test(await status.$eval('[data-stat="kernel-path"]', (n) => n.textContent)), "status page: the kernel path");
  check((await status.$$(`${card} svg.heatmap rect`)).length === 32, "status page: an expert heatmap of 4 layers x 8 experts");
  check((await status.$$(`${card} svg.chart`)).length === 3, "status page: throughput, TTFT and inter-token latency charts");
  await status.waitForFunction(() => Number(document.body.dataset.polls) >= 3, { timeout: 10000 });
  check(true, "status page polls");
  // Some load while it watches, so the charts have lines in the screenshot.
  for (let i = 0; i < 6; ++i) {
    await chat(open.port, { model: "infera-default", messages: [{ role: "user", content: `Proverbs ${i}` }], max_tokens: 48, ignore_eos: true });
    await sleep(300);
  }
  const polls = await status.evaluate(() => Number(document.body.dataset.polls));
  await status.waitForFunction((n) => Number(document.body.dataset.polls) >= n + 2, { timeout: 10000 }, polls);
  check((await status.$$(`${card} svg.chart path.series`)).length >= 3, "status page: the charts draw the load");
  await shot(status, "status-desktop");
  await status.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "dark" }]);
  await shot(status, "status-desktop-dark");
  await status.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "light" }]);

  // A model while it loads, from canned stats (the built-in model loads faster than a poll):
  // the progress bar and the step it is in, answered by the browser's request interception.
  const loading = JSON.parse((await request(open.port, "GET", "/v1/stats")).body);
  Object.assign(loading.models[0], {
    state: "loading",
    load_seconds: 3.2,
    load_progress: { fraction: 0.42, step: "binding", step_done: 42, step_total: 100, steps_done: 0, steps: 2 },
  });
  delete loading.models[0].engine;
  await status.setRequestInterception(true);
  const answerLoading = (req) => {
    if (req.url().endsWith("/v1/stats")) req.respond({ status: 200, contentType: "application/json", body: JSON.stringify(loading) });
    else req.continue();
  };
  status.on("request", answerLoading);
  await status.waitForSelector(`${card} progress[data-stat="load-progress"]`, { timeout: 10000 });
  const shown = await status.$eval(card, (n) => ({
    value: Number(n.querySelector('[data-stat="load-progress"]').value),
    text: n.querySelector('[data-stat="load-step"]').textContent,
    state: n.querySelector('[data-stat="state"]').textContent,
  }));
  check(shown.state === "loading" && shown.value === 42 && /^42% · binding the weights \(step 1 of 2\)/.test(shown.text), "status page: a loading model's progress bar and step", JSON.stringify(shown));
  await shot(status, "status-loading");
  status.off("request", answerLoading);
  await status.setRequestInterception(false);
  await status.waitForSelector(`${card} [data-stat="requests-ok"]`, { timeout: 10000 });

  // -- a phone-sized viewport --------------------------------------------------------------------
  for (const [p, name] of [[page, "chat-phone"], [status, "status-phone"]]) {
    await p.bringToFront(); // a background tab gets no animation frames
    await p.setViewport({ width: 390, height: 844, isMobile: true, hasTouch: true });
    await p.reload({ waitUntil: "load" });
    await sleep(300);
    const overflow = await p.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(overflow <= 0, `${name}: nothing wider than 390 px`, `${overflow} px too wide`);
    await shot(p, name);
  }
  await page.bringToFront();
  const visible = await page.evaluate(() => {
    const r = (id) => document.getElementById(id).getBoundingClientRect();
    return r("input").width > 200 && r("send").right <= 390 && r("toggle-sidebar").width > 0;
  });
  check(visible, "phone: the message box, Send and the conversations button fit");
  await page.click("#toggle-sidebar");
  await sleep(250);
  check(await page.evaluate(() => document.getElementById("sidebar").getBoundingClientRect().left >= 0), "phone: the conversations open from the button");
  await shot(page, "chat-phone-conversations");
  await page.keyboard.press("Escape");
  await sleep(250);
  check(await page.evaluate(() => document.getElementById("sidebar").getBoundingClientRect().right <= 0), "phone: Escape closes them");

  // -- a server with keys: the page asks for one and keeps it in the tab only -------------------
  const kpage = await newPage({ expect401: true });
  await kpage.goto(`${keyed.url}/`, { waitUntil: "load" });
  await kpage.waitForSelector("#key-dialog[open]");
  await shot(kpage, "chat-key-dialog");
  await kpage.type("#key-input", "console-test-key-0001");
  await kpage.keyboard.press("Enter");
  await kpage.waitForSelector('#model option[value="infera-default"]:not([disabled])');
  const stored = await kpage.evaluate(() => ({ session: sessionStorage.getItem("infera.apiKey"), local: JSON.stringify(localStorage) }));
  check(stored.session === "console-test-key-0001" && !stored.local.includes("console-test-key"), "the key lives in sessionStorage only");
  await kpage.goto(`${keyed.url}/status`, { waitUntil: "load" });
  await kpage.waitForSelector('[data-model="infera-default"] [data-stat="state"]');
  check(true, "the status page uses the tab's key");

  check(consoleErrors.length === 0, "no console errors", consoleErrors.join("\n"));
} catch (e) {
  ++failures;
  console.log(`FAIL ${e.stack || e}`);
  for (const [name, s] of [["open", open], ["keyed", keyed]]) console.log(`--- ${name} server log (tail)\n${s.log().slice(-3000)}`);
} finally {
  await browser.close();
  for (const p of children) p.kill("SIGTERM");
}
console.log(`screenshots: ${artifacts}`);
console.log(`${failures ? "FAILED" : "passed"} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
process.exit(failures ? 1 : 0);
