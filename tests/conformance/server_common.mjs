// Helpers for the server conformance tests: start `infera serve` on a free loopback
// port, wait until it is ready, talk HTTP, and always kill what was started.
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, "..", "..");
// The trained stories260K model lives beside the source tree, in ../shared/models; a plain
// clone has no such folder.
export const storiesDir = path.resolve(repo, "..", "shared", "models", "stories260K");

// Exit code that CTest reads as "skipped" (SKIP_RETURN_CODE in CMakeLists.txt).
export const SKIP_EXIT_CODE = 77;

// Ends the test as skipped, naming the fixture, when `dir` does not exist.
export function requireFixture(dir) {
  if (!fs.existsSync(dir)) {
    console.log(`SKIP: fixture ${dir} not found (the ../shared/models folder beside the source tree; a plain clone does not have it)`);
    process.exit(SKIP_EXIT_CODE);
  }
}
export const chatmlTemplate = path.join(here, "data", "chatml.jinja");

const started = new Set();
function killAll() {
  for (const p of started) {
    try {
      p.kill("SIGKILL");
    } catch {}
  }
}
process.on("exit", killAll);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(1));

export function inferaBinary() {
  const bin = process.argv[2];
  if (!bin) {
    console.error(`usage: node ${path.basename(process.argv[1])} <path-to-infera-binary>`);
    process.exit(2);
  }
  return path.resolve(bin);
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `infera serve ARGS` and resolves once GET /ready is 200 (or `readyPath` answers).
export async function startServer(args, { port, env = {}, waitReady = true, timeoutMs = 30000 } = {}) {
  port ??= await freePort();
  const bin = inferaBinary();
  const fullArgs = ["serve", "--host", "127.0.0.1", "--port", String(port), ...args];
  const proc = spawn(bin, fullArgs, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  started.add(proc);
  let log = "";
  proc.stdout.on("data", (d) => (log += d));
  proc.stderr.on("data", (d) => (log += d));
  const exited = new Promise((resolve) => proc.on("exit", (code, signal) => resolve({ code, signal })));
  exited.then(() => started.delete(proc));
  const server = {
    proc,
    port,
    url: `http://127.0.0.1:${port}`,
    log: () => log,
    exited,
    async stop(signal = "SIGTERM") {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
  if (!waitReady) return server;
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`infera serve exited early (${proc.exitCode}):\n${log}`);
    try {
      const r = await fetch(`${server.url}/ready`);
      if (r.status === 200) return server;
    } catch {}
    await sleep(50);
  }
  await server.stop("SIGKILL");
  throw new Error(`infera serve did not become ready in ${timeoutMs} ms:\n${log}`);
}

// Runs `infera serve ARGS` expecting it to fail; resolves with {code, output}.
export async function runServeExpectingFailure(args, { timeoutMs = 20000, env = {} } = {}) {
  const proc = spawn(inferaBinary(), ["serve", ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  started.add(proc);
  let output = "";
  proc.stdout.on("data", (d) => (output += d));
  proc.stderr.on("data", (d) => (output += d));
  const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
  const code = await new Promise((resolve) => proc.on("exit", (c) => resolve(c)));
  clearTimeout(timer);
  started.delete(proc);
  return { code, output };
}

export async function postJson(url, body, headers = {}) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: r.status, headers: r.headers, text, json };
}

// Parses Prometheus text into {"name{labels}": value}.
// Polls `cond` (async) every 50 ms until it holds or `ms` have passed; its last answer. For
// effects that land just after a client has its response (metrics, freed blocks).
export async function waitFor(cond, ms = 10000) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (await cond()) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return cond();
}

export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

let failures = 0;
let checks = 0;
export function check(cond, what) {
  ++checks;
  if (!cond) {
    ++failures;
    console.error(`FAIL: ${what}`);
  }
}
export function checkEq(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  check(a === e, `${what}: expected ${e}, got ${a}`);
}
export function finish(name) {
  if (failures) {
    console.error(`${name}: ${failures} of ${checks} checks failed`);
    process.exit(1);
  }
  console.log(`${name}: all ${checks} checks passed`);
  process.exit(0);
}
