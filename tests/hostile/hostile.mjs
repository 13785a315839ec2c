// The hostile suite: what an attacker sends to `infera serve`, over raw sockets and HTTP.
// Starts the server on the built-in model (models/infera-default) on free loopback ports,
// once without API keys and once with keys that carry limits, and runs every case with its
// expected status. After each case the process must still run and GET /health must answer
// within 1 s; at the end the peak resident memory may have grown by at most a bound.
// Groups: framing, limits, bombs, nesting, amplification, slow clients, the bad values of
// every request parameter, auth, rate limits, the browser guard of a keyless server.
//
//   node tests/hostile/hostile.mjs <path-to-infera-binary> [--list] [--only SUBSTRING]
//
// Cases whose behaviour depends on work not yet landed carry their correct expectation and
// are listed in EXPECTED_TO_FAIL_UNTIL_HTTP_LAYER (at the end of the case table): they are
// skipped, with a message, until that work lands; then delete their names from the list.
// --run-expected-failures runs them anyway.
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const modelDir = path.join(repo, "models", "infera-default");

const EXPECTED_TO_FAIL_UNTIL_HTTP_LAYER = new Set([
  // filled in below the case table, by name
]);

// ---------------------------------------------------------------------------------------
// Process and socket helpers (every wait bounded).
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const started = new Set();
process.on("exit", () => {
  for (const p of started) {
    try {
      p.kill("SIGKILL");
    } catch {}
  }
});
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(1));

function binary() {
  const bin = process.argv[2];
  if (!bin || bin.startsWith("--")) {
    console.error("usage: node hostile.mjs <path-to-infera-binary> [--list] [--only SUBSTRING]");
    process.exit(2);
  }
  return path.resolve(bin);
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

// How many complete final responses (1xx skipped) `buf` holds; framed by Content-Length
// or chunked encoding (a response framed by the close is never complete here).
function completeResponses(buf) {
  let pos = 0;
  let count = 0;
  for (let guard = 0; guard < 100 && pos < buf.length; ++guard) {
    const headEnd = buf.indexOf("\r\n\r\n", pos, "latin1");
    if (headEnd < 0) break;
    const head = buf.subarray(pos, headEnd).toString("latin1");
    const status = Number((/^HTTP\/1\.[01] (\d{3})/.exec(head) || [])[1]);
    let end = headEnd + 4;
    if (status >= 100 && status < 200) {
      pos = end;
      continue;
    }
    const cl = /\r\ncontent-length:\s*(\d+)/i.exec(head);
    if (/\r\ntransfer-encoding:\s*chunked/i.test(head)) {
      const term = buf.indexOf("\r\n0\r\n\r\n", end - 2, "latin1");
      if (term < 0) break;
      end = term + 7;
    } else if (cl) {
      end += Number(cl[1]);
      if (buf.length < end) break;
    } else if (/^HEAD /.test(head) || status === 204 || status === 304) {
      // no body
    } else {
      break;
    }
    ++count;
    pos = end;
  }
  return count;
}

// Raw exchange: writes `chunks` (strings/Buffers, with optional delays between them),
// then reads until the server closes, `responses` complete responses arrived (then 200 ms
// more, to see whether the server closes), or `timeoutMs`. Resolves with {status, head,
// body, bytes, closed, error}. Never rejects.
function raw(port, chunks, { timeoutMs = 5000, gapMs = 0, maxBytes = 64 << 20, endAfterWrite = false, responses = 1 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect({ host: "127.0.0.1", port });
    let buf = [];
    let size = 0;
    let done = false;
    let closed = false;
    let error = null;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      clearTimeout(grace);
      sock.destroy();
      const all = Buffer.concat(buf);
      const text = all.toString("latin1");
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(text);
      const headEnd = text.indexOf("\r\n\r\n");
      resolve({
        status: m ? Number(m[1]) : null,
        head: headEnd >= 0 ? text.slice(0, headEnd) : text,
        body: headEnd >= 0 ? all.subarray(headEnd + 4) : Buffer.alloc(0),
        bytes: size,
        closed,
        error,
        text,
      });
    };
    const timer = setTimeout(finish, timeoutMs);
    let grace = null;
    sock.on("data", (d) => {
      size += d.length;
      if (size <= maxBytes) buf.push(d);
      else finish();
      if (!grace && !done && completeResponses(Buffer.concat(buf)) >= responses) grace = setTimeout(finish, 200);
    });
    sock.on("error", (e) => {
      error = e.code || String(e);
      finish();
    });
    sock.on("close", () => {
      closed = true;
      finish();
    });
    sock.on("connect", async () => {
      try {
        for (const c of chunks) {
          if (done) return;
          if (!sock.write(c)) await new Promise((r) => sock.once("drain", r).once("close", r));
          if (gapMs) await sleep(gapMs);
        }
        if (endAfterWrite) sock.end();
      } catch {}
    });
  });
}

// A well-formed HTTP/1.1 request (Connection: close), all headers under our control.
function build(method, target, { headers = {}, body = null, host = "127.0.0.1", contentType = "application/json" } = {}) {
  const h = { ...headers };
  const lower = Object.fromEntries(Object.keys(h).map((k) => [k.toLowerCase(), k]));
  let out = `${method} ${target} HTTP/1.1\r\n`;
  if (host !== null && !("host" in lower)) out += `Host: ${host}\r\n`;
  let payload = null;
  if (body !== null) {
    payload = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === "string" ? body : JSON.stringify(body));
    if (contentType && !("content-type" in lower)) out += `Content-Type: ${contentType}\r\n`;
    if (!("content-length" in lower) && !("transfer-encoding" in lower)) out += `Content-Length: ${payload.length}\r\n`;
  }
  if (!("connection" in lower)) out += "Connection: close\r\n";
  for (const [k, v] of Object.entries(h)) out += `${k}: ${v}\r\n`;
  out += "\r\n";
  return payload ? [Buffer.from(out, "latin1"), payload] : [Buffer.from(out, "latin1")];
}

function dechunk(buf) {
  // Best effort: decodes a chunked body; returns the input when it is not chunked.
  const out = [];
  let pos = 0;
  for (let guard = 0; guard < 1e6 && pos < buf.length; ++guard) {
    const eol = buf.indexOf("\r\n", pos, "latin1");
    if (eol < 0) break;
    const n = parseInt(buf.subarray(pos, eol).toString("latin1"), 16);
    if (!Number.isFinite(n)) return buf;
    if (n === 0) break;
    out.push(buf.subarray(eol + 2, eol + 2 + n));
    pos = eol + 2 + n + 2;
  }
  return Buffer.concat(out);
}

async function request(port, method, target, opts = {}) {
  const r = await raw(port, build(method, target, opts), { timeoutMs: opts.timeoutMs ?? 20000 });
  const chunked = /\r\ntransfer-encoding:\s*chunked/i.test(r.head);
  const body = chunked ? dechunk(r.body) : r.body;
  let json = null;
  try {
    json = JSON.parse(body.toString("utf8"));
  } catch {}
  return { ...r, body, json, bodyText: body.toString("utf8") };
}

function rssKiB(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/status`, "utf8");
    const get = (k) => Number((new RegExp(`^${k}:\\s+(\\d+)`, "m").exec(s) || [])[1] || 0);
    return { rss: get("VmRSS"), hwm: get("VmHWM") };
  } catch {
    return { rss: 0, hwm: 0 };
  }
}

async function startServe(name, args) {
  const port = await freePort();
  const proc = spawn(binary(), ["serve", "--host", "127.0.0.1", "--port", String(port), ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    cwd: repo,
  });
  started.add(proc);
  let log = "";
  const keep = (d) => {
    log += d;
    if (log.length > 200000) log = log.slice(-100000);
  };
  proc.stdout.on("data", keep);
  proc.stderr.on("data", keep);
  proc.on("exit", () => started.delete(proc));
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`${name}: infera serve exited early (${proc.exitCode}):\n${log}`);
    const r = await request(port, "GET", "/ready", { timeoutMs: 1000 });
    if (r.status === 200) return { name, proc, port, log: () => log };
    await sleep(100);
  }
  proc.kill("SIGKILL");
  throw new Error(`${name}: not ready within 60 s:\n${log}`);
}

// ---------------------------------------------------------------------------------------
// The servers: one without keys (the keyless loopback default, with small limits), one
// with keys that carry limits, loading the same model twice under two names.
const OPEN_ARGS = ["--max-input-len", "256", "--max-output-len", "32", "--body-limit", "256KiB", "--kv-cache-memory", "64MiB",
                   "--max-num-seqs", "8", "-t", "1", "--request-timeout", "20", "--head-timeout", "2"];
const KEYS = {
  open: "hostile-open-key-0001",
  rpm: "hostile-rpm-key-00002",
  tpm: "hostile-tpm-key-00003",
  conc: "hostile-conc-key-0004",
  scoped: "hostile-scoped-key-05",
};
function keyedConfig(port) {
  const m = (name) => `  - name: ${name}\n    path: ${modelDir}\n    threads: 1\n    max_input_len: 256\n    max_output_len: 32\n` +
                      `    max_num_seqs: 8\n    kv_cache_memory: 64MiB\n`;
  return `server:
  host: 127.0.0.1
  port: ${port}
  body_limit: 256KiB
  request_timeout_s: 20
  max_concurrent_requests_per_key: 4
  api_keys:
    - {id: open, key: ${KEYS.open}, max_concurrent_requests: 0}
    - {id: rpm, key: ${KEYS.rpm}, requests_per_minute: 3}
    - {id: tpm, key: ${KEYS.tpm}, tokens_per_minute: 300}
    - {id: conc, key: ${KEYS.conc}, max_concurrent_requests: 1}
    - {id: scoped, key: ${KEYS.scoped}, models: [other]}
models:
${m("main")}${m("other")}`;
}

// ---------------------------------------------------------------------------------------
// Cases: {name, server: "open" | "keyed", expect: status or [statuses] (null: no
// response, the connection closed), run(server) -> response, check?(response) -> problem}.
const cases = [];
const add = (name, server, expect, run, check) => cases.push({ name, server, expect, run, check });
const C = "/v1/chat/completions";
const P = "/v1/completions";
const chat = (extra = {}) => ({ messages: [{ role: "user", content: "Hello" }], max_tokens: 4, ...extra });
const cmpl = (extra = {}) => ({ prompt: "In the beginning", max_tokens: 4, ...extra });
const post = (target, body, opts = {}) => (s) => request(s.port, "POST", target, { body, ...opts });
const get = (target, opts = {}) => (s) => request(s.port, "GET", target, opts);
const rawCase = (bytes, opts = {}) => (s) => raw(s.port, Array.isArray(bytes) ? bytes : [bytes], opts);
const errorShape = (r) => (r.json?.error && typeof r.json.error.message === "string" ? null : `no OpenAI error JSON: ${r.bodyText?.slice(0, 200)}`);
const noInternals = (r) =>
  /\.cpp|json\.exception|std::|\/work\/|what\(\)/.test(r.bodyText ?? "") ? `internals leaked: ${r.bodyText.slice(0, 200)}` : null;
const all = (...checks) => (r) => {
  for (const c of checks) {
    const p = c(r);
    if (p) return p;
  }
  return null;
};
const hasCode = (code) => (r) => (r.json?.error?.code === code ? null : `error.code ${JSON.stringify(r.json?.error?.code)}, expected ${code}`);
const hasParam = (param) => (r) => (r.json?.error?.param === param ? null : `error.param ${JSON.stringify(r.json?.error?.param)}, expected ${param}`);
const closes = (r) => (r.closed ? null : "the connection stayed open");
const bounded = (bytes) => (r) => (r.bytes <= bytes ? null : `response of ${r.bytes} bytes, over ${bytes}`);

// --- framing (raw sockets) ------------------------------------------------------------
const H = "Host: 127.0.0.1\r\n";
const J = "Content-Type: application/json\r\n";
const okBody = JSON.stringify(cmpl());
add("framing: a plain GET /health", "open", 200, rawCase(`GET /health HTTP/1.1\r\n${H}Connection: close\r\n\r\n`));
add("framing: HTTP/1.0 without Host", "open", 200, rawCase("GET /health HTTP/1.0\r\n\r\n"));
add("framing: two pipelined requests answer twice", "open", 200,
    rawCase(`GET /health HTTP/1.1\r\n${H}\r\nGET /health HTTP/1.1\r\n${H}Connection: close\r\n\r\n`, { responses: 2 }),
    (r) => ((r.text.match(/HTTP\/1\.1 200/g) || []).length === 2 ? null : "expected two responses"));
add("framing: garbage request line", "open", 400, rawCase("GARBAGE\r\n\r\n"), closes);
add("framing: request line without version", "open", 400, rawCase("GET /health\r\n\r\n"));
add("framing: unknown HTTP version 9.9", "open", [400, 505], rawCase(`GET /health HTTP/9.9\r\n${H}\r\n`));
add("framing: HTTP/2 preface on HTTP/1", "open", [400, 505], rawCase("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
add("framing: header without colon", "open", 400, rawCase(`GET /health HTTP/1.1\r\n${H}NoColonHere\r\n\r\n`));
add("framing: space in header name", "open", 400, rawCase(`GET /health HTTP/1.1\r\n${H}Bad Header: x\r\n\r\n`));
add("framing: obsolete line folding", "open", 400, rawCase(`GET /health HTTP/1.1\r\n${H}X-A: a\r\n  folded\r\n\r\n`));
add("framing: NUL inside a header", "open", 400, rawCase(Buffer.from(`GET /health HTTP/1.1\r\n${H}X-A: a\0b\r\n\r\n`, "latin1")));
add("framing: bare LF line endings", "open", 400, rawCase(`POST ${P} HTTP/1.1\nHost: 127.0.0.1\n${J.trim()}\nContent-Length: ${okBody.length}\n\n${okBody}`), closes);
add("framing: Content-Length -1", "open", 400, rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: -1\r\n\r\n${okBody}`), closes);
add("framing: Content-Length with a plus sign", "open", 400, rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: +${okBody.length}\r\n\r\n${okBody}`), closes);
add("framing: Content-Length not a number", "open", 400, rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: abc\r\n\r\n${okBody}`), closes);
add("framing: percent-encoded Content-Length", "open", 400, rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: %34%30\r\n\r\n${okBody}`), closes);
add("framing: two different Content-Lengths", "open", 400,
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: ${okBody.length}\r\nContent-Length: 5\r\n\r\n${okBody}`), closes);
add("framing: Content-Length list", "open", 400,
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: ${okBody.length}, ${okBody.length}\r\n\r\n${okBody}`), closes);
add("framing: Content-Length overflowing 64 bits", "open", [400, 413], rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: 99999999999999999999999\r\n\r\n`), closes);
add("framing: Transfer-Encoding with space before colon", "open", 400,
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Transfer-Encoding : chunked\r\n\r\n${okBody.length.toString(16)}\r\n${okBody}\r\n0\r\n\r\n`), closes);
add("framing: Transfer-Encoding and Content-Length together", "open", 400,
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n${okBody.length.toString(16)}\r\n${okBody}\r\n0\r\n\r\n`), closes);
add("framing: unknown transfer coding", "open", [400, 501], rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n`), closes);
add("framing: chunked not last", "open", [400, 501], rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n`), closes);
add("framing: invalid chunk size", "open", 400, rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Transfer-Encoding: chunked\r\n\r\nzz\r\n${okBody}\r\n0\r\n\r\n`), closes);
add("framing: chunk size overflowing 64 bits", "open", [400, 413],
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\nxx\r\n0\r\n\r\n`), closes);
add("framing: a valid chunked body", "open", 200,
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n${okBody.length.toString(16)}\r\n${okBody}\r\n0\r\n\r\n`));
add("framing: smuggled request in a refused body", "open", 415,
    rawCase(`POST /tokenize HTTP/1.1\r\n${H}Content-Type: text/plain\r\nContent-Length: 36\r\n\r\nGET /health HTTP/1.1\r\n${H.trim()}\r\n\r\n`),
    (r) => ((r.text.match(/HTTP\/1\.1 /g) || []).length === 1 ? null : "the body was read as a second request"));
add("framing: Content-Length longer than the body, then close", "open", [400, null],
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: 1000\r\n\r\n{"prompt":`, { endAfterWrite: true, timeoutMs: 3000 }));
add("framing: unknown method", "open", [400, 404, 405, 501], rawCase(`BREW /health HTTP/1.1\r\n${H}Connection: close\r\n\r\n`));
add("framing: path traversal", "open", [400, 404], rawCase(`GET /../../../etc/passwd HTTP/1.1\r\n${H}Connection: close\r\n\r\n`),
    (r) => (/root:/.test(r.text) ? "file contents served" : null));
add("framing: absolute-form target", "open", [200, 400, 404], rawCase(`GET http://127.0.0.1/health HTTP/1.1\r\n${H}Connection: close\r\n\r\n`));
add("framing: HEAD /health", "open", [200, 404, 405], rawCase(`HEAD /health HTTP/1.1\r\n${H}Connection: close\r\n\r\n`));
add("framing: OPTIONS preflight gets no CORS grant", "open", [200, 204, 403, 404, 405],
    rawCase(`OPTIONS ${C} HTTP/1.1\r\n${H}Origin: http://evil.example\r\nAccess-Control-Request-Method: POST\r\nConnection: close\r\n\r\n`),
    (r) => (/access-control-allow-origin/i.test(r.head) ? "a CORS grant" : null));
add("framing: multi-range Range header", "open", [200, 416],
    rawCase(`GET /v1/models HTTP/1.1\r\n${H}Range: bytes=${Array.from({ length: 2000 }, () => "0-").join(",")}\r\nConnection: close\r\n\r\n`),
    bounded(64 << 10));
add("framing: empty request then close", "open", null, rawCase("", { endAfterWrite: true, timeoutMs: 2000 }));
add("framing: only CRLFs", "open", [400, null], rawCase("\r\n\r\n\r\n\r\n", { endAfterWrite: true, timeoutMs: 2000 }));
add("framing: binary noise", "open", [400, null], rawCase(Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 97 + 13) & 255)), { timeoutMs: 3000 }));
add("framing: TLS ClientHello on plain HTTP", "open", [400, null],
    rawCase(Buffer.from("160301002c010000280303" + "00".repeat(32) + "000002002f0100", "hex"), { timeoutMs: 3000 }));

// --- limits --------------------------------------------------------------------------------
const big = (n) => JSON.stringify(cmpl({ prompt: "a".repeat(n) }));
add("limits: body over body_limit", "open", 413, post(P, big(300 << 10)), hasCode("body_too_large"));
add("limits: body just under body_limit, prompt too long", "open", 400, post(P, big(250 << 10)), hasCode("context_length_exceeded"));
add("limits: Content-Length over the limit, no body sent", "open", 413,
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: 1000000000\r\n\r\n`, { timeoutMs: 5000 }));
add("limits: Expect 100-continue over the limit", "open", [413, 417],
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Expect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n`, { timeoutMs: 5000 }));
add("limits: chunked body over body_limit", "open", 413, (s) => {
  const piece = "a".repeat(16384);
  const chunks = [`POST ${P} HTTP/1.1\r\n${H}${J}Transfer-Encoding: chunked\r\n\r\n`];
  for (let i = 0; i < 40; ++i) chunks.push(`${piece.length.toString(16)}\r\n${piece}\r\n`);
  chunks.push("0\r\n\r\n");
  return raw(s.port, chunks, { timeoutMs: 8000 });
});
add("limits: chunked body that never ends", "open", [408, 413, null], (s) => {
  const chunks = [`POST ${P} HTTP/1.1\r\n${H}${J}Transfer-Encoding: chunked\r\n\r\n`];
  for (let i = 0; i < 400; ++i) chunks.push(`400\r\n${"b".repeat(1024)}\r\n`);
  return raw(s.port, chunks, { timeoutMs: 6000 });
}, bounded(1 << 16));
add("limits: POST without any length", "open", [400, 411],
    rawCase(`POST ${P} HTTP/1.1\r\n${H}${J}Connection: close\r\n\r\n${okBody}`, { endAfterWrite: true, timeoutMs: 4000 }));
add("limits: request line of 100 KB", "open", [400, 414, 431], rawCase(`GET /health?${"a".repeat(100000)} HTTP/1.1\r\n${H}\r\n`, { timeoutMs: 5000 }), closes);
add("limits: one header of 100 KB", "open", [400, 431], rawCase(`GET /health HTTP/1.1\r\n${H}X-Big: ${"a".repeat(100000)}\r\n\r\n`, { timeoutMs: 5000 }), closes);
add("limits: 10000 headers", "open", [400, 431],
    rawCase(`GET /health HTTP/1.1\r\n${H}${Array.from({ length: 10000 }, (_, i) => `X-H${i}: v`).join("\r\n")}\r\n\r\n`, { timeoutMs: 5000 }), closes);
add("limits: a header line that never ends", "open", [400, 408, 431, null],
    rawCase([`GET /health HTTP/1.1\r\n${H}X-Endless: `, ..."x".repeat(64).split("").map(() => "y".repeat(16384))], { timeoutMs: 6000 }), closes);
add("limits: 200 KB URL on a POST", "open", [400, 414, 431], rawCase(`POST ${P}?${"q".repeat(200000)} HTTP/1.1\r\n${H}${J}Content-Length: 2\r\n\r\n{}`, { timeoutMs: 5000 }));
add("limits: 16 stop strings of 256 bytes is fine", "open", 200, post(P, cmpl({ stop: Array.from({ length: 16 }, (_, i) => `${i}`.padEnd(256, "z")) })));
add("limits: 17 stop strings", "open", 400, post(P, cmpl({ stop: Array.from({ length: 17 }, (_, i) => `s${i}`) })), hasParam("stop"));
add("limits: a stop string of 257 bytes", "open", 400, post(P, cmpl({ stop: ["z".repeat(257)] })));
add("limits: 5000 messages", "open", 400, post(C, chat({ messages: Array.from({ length: 5000 }, () => ({ role: "user", content: "hi" })) })),
    hasCode("context_length_exceeded"));
add("limits: 2000 tools", "open", [200, 400], post(C, chat({ tools: Array.from({ length: 2000 }, (_, i) => ({ type: "function", function: { name: `f${i}` } })) })));
add("limits: token-id prompt of 50000 ids", "open", 400, post(P, cmpl({ prompt: Array.from({ length: 50000 }, () => 5) })), hasCode("context_length_exceeded"));
add("limits: 1000 prompts in one request", "open", [400, 429], post(P, cmpl({ prompt: Array.from({ length: 1000 }, () => "hi") })));
add("limits: tokenize 250 KB of text", "open", 200, post("/tokenize", { prompt: "word ".repeat(50000) }));
add("limits: detokenize 60000 ids", "open", 200, post("/detokenize", { tokens: Array.from({ length: 60000 }, () => 100) }));

// --- bombs ---------------------------------------------------------------------------------
const bomb = (fn) => fn(Buffer.alloc(64 << 20, 32));  // 64 MiB of spaces in a few KB
const gz = bomb((b) => zlib.gzipSync(b, { level: 9 }));
const df = bomb((b) => zlib.deflateSync(b, { level: 9 }));
const br = bomb((b) => zlib.brotliCompressSync(b));
for (const [enc, data] of [["gzip", gz], ["deflate", df], ["br", br]]) {
  add(`bombs: ${enc} body inflating to 64 MiB`, "open", [413, 415], post(P, data, { headers: { "Content-Encoding": enc } }));
}
add("bombs: gzip bomb sent chunked", "open", [413, 415], (s) =>
  raw(s.port, [`POST ${P} HTTP/1.1\r\n${H}${J}Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n${gz.length.toString(16)}\r\n`, gz, "\r\n0\r\n\r\n"]));
add("bombs: unknown Content-Encoding", "open", [400, 415], post(P, okBody, { headers: { "Content-Encoding": "zstd" } }));
add("bombs: gzip that is not gzip", "open", [400, 415], post(P, "not gzip at all", { headers: { "Content-Encoding": "gzip" } }));
add("bombs: a small honest gzip body", "open", [200, 415], post(P, zlib.gzipSync(okBody), { headers: { "Content-Encoding": "gzip" } }));
add("bombs: Accept-Encoding br on a large response", "open", 200,
    post("/detokenize", { tokens: Array.from({ length: 20000 }, () => 100) }, { headers: { "Accept-Encoding": "br, gzip" } }));
add("bombs: prompt of a million combining marks", "open", [400, 413], post("/tokenize", { prompt: "a" + "\u0301\u0316".repeat(100000) }));

// --- nesting -------------------------------------------------------------------------------
const nest = (n) => "[".repeat(n) + "]".repeat(n);
add("nesting: 10000 levels in the body", "open", 400, post(C, `{"messages": ${nest(10000)}}`));
add("nesting: 65 levels in the body", "open", 400, post(C, JSON.stringify({ ...chat(), x: JSON.parse(nest(65)) })));
add("nesting: 60 levels in an ignored field", "open", 200, post(C, JSON.stringify({ ...chat(), x: JSON.parse(nest(60)) })));
add("nesting: deep objects in chat_template_kwargs", "open", 400, post(C, `{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":${'{"a":'.repeat(5000)}1${"}".repeat(5000)}}`));
add("nesting: 100000 brackets in tool-call arguments", "open", 400, post(C, chat({
  messages: [{ role: "user", content: "x" }, { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: nest(100000) } }] }],
})), hasParam("messages[1].tool_calls[0].function.arguments"));
add("nesting: 1000 brackets in tool-call arguments", "open", 400, post(C, chat({
  messages: [{ role: "user", content: "x" }, { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: nest(1000) } }] }],
})));
add("nesting: tool-call arguments object with 12000 keys", "open", [200, 400], post(C, chat({
  messages: [{ role: "user", content: "x" }, { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function",
    function: { name: "f", arguments: JSON.stringify(Object.fromEntries(Array.from({ length: 12000 }, (_, i) => [`k${i}`, 1]))) } }] }],
  max_tokens: 1,
})), null);
add("nesting: deep tool parameters schema", "open", 400, post(C, `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":${'{"a":'.repeat(2000)}1${"}".repeat(2000)}}}]}`));
add("nesting: long string of backslashes", "open", [200, 400], post(P, JSON.stringify(cmpl({ prompt: "\\".repeat(1000) }))));

// --- amplification -------------------------------------------------------------------------
add("amplification: n x echo x logprobs x prompt_logprobs is bounded", "open", [200, 400],
    post(P, cmpl({ prompt: "word ".repeat(200), n: 16, echo: true, logprobs: 20, prompt_logprobs: 20, max_tokens: 32 }), { timeoutMs: 30000 }),
    bounded(8 << 20));
add("amplification: chat n=16 with top_logprobs 20", "open", [200, 400],
    post(C, chat({ n: 16, logprobs: true, top_logprobs: 20, prompt_logprobs: 20, max_tokens: 32 }), { timeoutMs: 30000 }), bounded(8 << 20));
add("amplification: 16 prompts x n 16", "open", [200, 400, 429], post(P, cmpl({ prompt: Array.from({ length: 16 }, () => "In the"), n: 16, max_tokens: 2 }), { timeoutMs: 30000 }));
add("amplification: brotli on a scored echo", "open", [200, 400],
    post(P, cmpl({ prompt: "word ".repeat(200), echo: true, logprobs: 20, max_tokens: 0 }), { headers: { "Accept-Encoding": "br" }, timeoutMs: 30000 }),
    bounded(4 << 20));

// --- slow clients ---------------------------------------------------------------------------
// Connections that trickle or idle while /health is asked; the health check after each
// case then proves the server still answers within 1 s.
async function withConnections(s, count, behaviour, holdMs) {
  const socks = [];
  for (let i = 0; i < count; ++i) {
    const sock = net.connect({ host: "127.0.0.1", port: s.port });
    sock.on("error", () => {});
    socks.push(sock);
  }
  const timers = [];
  if (behaviour === "trickle") {
    for (const sock of socks) sock.write(`GET /health HTTP/1.1\r\n${H}`);
    timers.push(setInterval(() => {
      for (const sock of socks) sock.write("X-Slow: y\r\n");
    }, 200));
  } else if (behaviour === "slow-body") {
    for (const sock of socks) sock.write(`POST ${P} HTTP/1.1\r\n${H}${J}Content-Length: 100000\r\n\r\n`);
    timers.push(setInterval(() => {
      for (const sock of socks) sock.write("a");
    }, 200));
  }
  await sleep(Math.min(holdMs, 500));
  const t0 = Date.now();
  const h = await request(s.port, "GET", "/health", { timeoutMs: 1000 });
  const ms = Date.now() - t0;
  await sleep(Math.max(0, holdMs - 500));
  for (const t of timers) clearInterval(t);
  for (const sock of socks) sock.destroy();
  return { ...h, healthMs: ms };
}
const fast = (r) => (r.healthMs <= 1000 ? null : `/health took ${r.healthMs} ms`);
add("slow clients: 20 idle connections", "open", 200, (s) => withConnections(s, 20, "idle", 1500), fast);
add("slow clients: 20 connections trickling headers", "open", 200, (s) => withConnections(s, 20, "trickle", 1500), fast);
add("slow clients: 20 connections trickling a body", "open", 200, (s) => withConnections(s, 20, "slow-body", 1500), fast);
add("slow clients: 200 idle connections", "open", 200, (s) => withConnections(s, 200, "idle", 1500), fast);
add("slow clients: 200 connections trickling headers", "open", 200, (s) => withConnections(s, 200, "trickle", 2000), fast);
// The open server's --head-timeout is 2 s: a head still incomplete then loses its connection
// (408, or the close without a response).
add("slow clients: a request head that stalls is cut off", "open", [408, null],
    rawCase(`POST ${P} HTTP/1.1\r\n${H}Content-Ty`, { timeoutMs: 8000 }), closes);
add("slow clients: a request head trickled a byte at a time is cut off", "open", [408, null],
    rawCase(`GET /health HTTP/1.1\r\n${H}X-Slow: ${"s".repeat(200)}\r\n\r\n`.split(""), { gapMs: 50, timeoutMs: 12000 }), closes);
add("slow clients: 64 long generations and /health", "open", 200, async (s) => {
  const streams = Array.from({ length: 64 }, () =>
    request(s.port, "POST", C, { body: chat({ max_tokens: 32, stream: true, ignore_eos: true }), timeoutMs: 20000 }));
  await sleep(200);
  const t0 = Date.now();
  const h = await request(s.port, "GET", "/health", { timeoutMs: 1000 });
  const ms = Date.now() - t0;
  await Promise.all(streams);
  return { ...h, healthMs: ms };
}, fast);
add("slow clients: stream reader that stops reading", "open", [200, null], async (s) => {
  const sock = net.connect({ host: "127.0.0.1", port: s.port });
  sock.on("error", () => {});
  sock.pause();
  const [head, body] = build("POST", C, { body: chat({ max_tokens: 32, stream: true, ignore_eos: true }) });
  sock.write(Buffer.concat([head, body]));
  await sleep(1500);
  sock.destroy();
  return { status: 200 };
});
add("slow clients: many clients hang up mid-stream", "open", 200, async (s) => {
  const socks = [];
  for (let i = 0; i < 16; ++i) {
    const sock = net.connect({ host: "127.0.0.1", port: s.port });
    sock.on("error", () => {});
    const [head, body] = build("POST", C, { body: chat({ max_tokens: 32, stream: true, ignore_eos: true }) });
    sock.write(Buffer.concat([head, body]));
    socks.push(sock);
  }
  await sleep(300);
  for (const sock of socks) sock.destroy();
  // Every generation is cancelled and its KV blocks come back.
  for (let i = 0; i < 100; ++i) {
    const m = await request(s.port, "GET", "/metrics", { timeoutMs: 1000 });
    const used = /infera_kv_blocks_used\{[^}]*\} (\d+)/.exec(m.bodyText || "");
    const running = /infera_requests_running\{[^}]*\} (\d+)/.exec(m.bodyText || "");
    if (used && Number(used[1]) === 0 && running && Number(running[1]) === 0) return { status: 200 };
    await sleep(50);
  }
  return { status: 500, bodyText: "KV blocks still in use 5 s after the clients left" };
});
add("slow clients: non-streaming client hangs up", "open", [200, null], async (s) => {
  const sock = net.connect({ host: "127.0.0.1", port: s.port });
  sock.on("error", () => {});
  const [head, body] = build("POST", C, { body: chat({ max_tokens: 32, ignore_eos: true }) });
  sock.write(Buffer.concat([head, body]));
  await sleep(50);
  sock.destroy();
  return { status: 200 };
});

// --- every request parameter's bad values -------------------------------------------------
const bad = [
  // [parameter, endpoint, values]
  ["model", "both", [5, true, [], {}, ""]],
  ["max_tokens", "both", [-1, "5", 2.5, 1e12, true, [], {}]],
  ["max_completion_tokens", C, [-1, "5", 2.5, 1e12, false]],
  ["temperature", "both", [-1, "hot", 1e9, [], true]],
  ["top_p", "both", [-0.1, 1.5, "x", []]],
  ["top_k", "both", ["a", 2.5, 1e12, {}]],
  ["min_p", "both", [-0.5, 2, "x"]],
  ["seed", "both", ["abc", 1.5, {}, 1e30]],
  ["stop", "both", [7, [1], [""].concat(Array(20).fill("x")), { a: 1 }]],
  ["presence_penalty", "both", [3, -3, "x"]],
  ["frequency_penalty", "both", [3, -3, "x"]],
  ["repetition_penalty", "both", [0, -1, "x", 1e9]],
  ["n", "both", [0, -1, 100, "2", 1.5]],
  ["stream", "both", ["yes", 1, {}]],
  ["stream_options", "both", ["x", 5]],
  ["ignore_eos", "both", ["yes", 1]],
  ["prompt_logprobs", "both", [-1, 21, "x", true]],
  ["logprobs", C, ["yes", 5, {}]],
  ["top_logprobs", C, [21, -1, "x"]],
  ["logprobs", P, [21, -1, true, "x"]],
  ["echo", P, ["yes", 1]],
  ["suffix", P, [5, "tail"]],
  ["prompt", P, [5, [], [[]], [1, -3], [1, 1e9], [1.5], {}, null, [["a"]], ""]],
  ["messages", C, ["hi", [], ["hi"], [{ role: "wizard", content: "x" }], [{ content: "x" }], [{ role: "user", content: 5 }],
                   [{ role: "user" }], [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }],
                   [{ role: "user", content: [{ type: "text" }] }], [{ role: 5, content: "x" }], null]],
  ["tools", C, [{ type: "function" }, [{ type: "function" }], [{ type: "other", function: { name: "f" } }], "x", [5]]],
  ["tool_choice", C, ["sometimes", 5, { type: "function", function: { name: "g" } }]],
  ["chat_template_kwargs", C, ["x", 5, { enable_thinking: "yes" }]],
];
for (const [param, where, values] of bad) {
  const endpoints = where === "both" ? [C, P] : [where];
  for (const ep of endpoints) {
    for (const v of values) {
      const body = ep === C ? chat({ [param]: v }) : cmpl({ [param]: v });
      if (param === "tool_choice") body.tools = [{ type: "function", function: { name: "f" } }];
      const expect = param === "model" && v !== "" && typeof v === "string" ? 404 : 400;
      add(`params: ${ep === C ? "chat" : "completions"} ${param} = ${JSON.stringify(v)?.slice(0, 40)}`, "open", expect, post(ep, body),
          all(errorShape, noInternals));
    }
  }
}
add("params: body is an array", "open", 400, post(C, "[1,2]"), errorShape);
add("params: body is a string", "open", 400, post(C, '"hi"'), errorShape);
add("params: empty body", "open", 400, post(C, ""), errorShape);
add("params: broken JSON", "open", 400, post(C, '{"messages": ['), errorShape);
add("params: trailing garbage", "open", 400, post(C, JSON.stringify(chat()) + " x"), errorShape);
add("params: NaN literal", "open", 400, post(C, '{"messages": NaN}'), errorShape);
add("params: invalid UTF-8", "open", 400, post(C, Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')])), errorShape);
add("params: lone surrogate escape", "open", [200, 400], post(C, '{"messages":[{"role":"user","content":"\\ud800"}],"max_tokens":2}'));
add("params: duplicate keys", "open", [200, 400], post(C, '{"max_tokens":2,"max_tokens":3,"messages":[{"role":"user","content":"x"}]}'));
add("params: max_tokens over the context", "open", 400, post(P, cmpl({ max_tokens: 100000 })), hasParam("max_tokens"));
add("params: max_tokens 0 without echo", "open", 400, post(P, cmpl({ max_tokens: 0 })), hasParam("max_tokens"));
add("params: tokenize without prompt", "open", 400, post("/tokenize", {}), hasParam("prompt"));
add("params: tokenize prompt a number", "open", 400, post("/tokenize", { prompt: 5 }));
add("params: detokenize an id outside the vocabulary", "open", 400, post("/detokenize", { tokens: [1, 99999] }), hasParam("tokens"));
add("params: detokenize a negative id", "open", 400, post("/detokenize", { tokens: [-1] }));
add("params: detokenize not a list", "open", 400, post("/detokenize", { tokens: "abc" }));
add("params: unknown endpoint", "open", 404, post("/v1/engines", {}), hasCode("unknown_endpoint"));
add("params: GET on a POST endpoint", "open", [404, 405], get(C));
add("params: a good chat request still works", "open", 200, post(C, chat()));
add("params: a good completion still works", "open", 200, post(P, cmpl()));
add("params: a good stream ends with [DONE]", "open", 200, post(C, chat({ stream: true })),
    (r) => (r.bodyText.includes("data: [DONE]") ? null : "no [DONE]"));

// --- the browser guard of a server without keys -------------------------------------------
add("guard: text/plain POST (a cross-site simple request)", "open", 415, post(C, chat(), { contentType: "text/plain" }), hasCode("unsupported_media_type"));
add("guard: form-encoded POST", "open", 415, post(C, chat(), { contentType: "application/x-www-form-urlencoded" }));
add("guard: multipart POST", "open", 415, post(C, chat(), { contentType: "multipart/form-data; boundary=x" }));
add("guard: POST without Content-Type", "open", 415, post(C, chat(), { contentType: null }));
add("guard: application/json with charset", "open", 200, post(C, chat(), { contentType: "application/json; charset=utf-8" }));
add("guard: DNS-rebound Host", "open", 403, get("/v1/models", { host: "rebind.attacker.example:8000" }), hasCode("host_not_allowed"));
add("guard: DNS-rebound Host on a POST", "open", 403, post(C, chat(), { host: "attacker.example" }));
add("guard: rebound Host on /metrics", "open", 403, get("/metrics", { host: "attacker.example" }));
add("guard: localhost Host", "open", 200, get("/v1/models", { host: "localhost:1234" }));
add("guard: [::1] Host", "open", 200, get("/v1/models", { host: "[::1]:1234" }));
add("guard: a *.localhost Host", "open", 200, get("/v1/models", { host: "app.localhost" }));
add("guard: localhost as a subdomain of another name", "open", 403, get("/v1/models", { host: "localhost.attacker.example" }));
add("guard: malformed Host", "open", 403, get("/v1/models", { host: "a b c" }));
add("guard: /health with any Host", "open", 200, get("/health", { host: "pod.cluster.local" }));
add("guard: /ready with any Host", "open", 200, get("/ready", { host: "pod.cluster.local" }));
add("guard: cross-site Origin", "open", 403, post(C, chat(), { headers: { Origin: "http://attacker.example" } }), hasCode("origin_not_allowed"));
add("guard: Origin null", "open", 403, post(C, chat(), { headers: { Origin: "null" } }));
add("guard: same-origin Origin", "open", 200, (s) => request(s.port, "POST", C, { body: chat(), host: `127.0.0.1:${s.port}`, headers: { Origin: `http://127.0.0.1:${s.port}` } }));
add("guard: loopback Origin on another port", "open", 403, (s) => request(s.port, "POST", C, { body: chat(), host: `127.0.0.1:${s.port}`, headers: { Origin: `http://127.0.0.1:${s.port + 1}` } }));

// --- auth (the server with keys) -----------------------------------------------------------
const bearer = (k) => ({ Authorization: `Bearer ${k}` });
const kchat = (extra = {}) => ({ model: "main", ...chat(extra) });
add("auth: no key", "keyed", 401, post(C, kchat()), hasCode("missing_api_key"));
add("auth: wrong key", "keyed", 401, post(C, kchat(), { headers: bearer("hostile-wrong-key-0000") }), hasCode("invalid_api_key"));
add("auth: key prefix only", "keyed", 401, post(C, kchat(), { headers: bearer(KEYS.open.slice(0, 10)) }));
add("auth: key with a suffix", "keyed", 401, post(C, kchat(), { headers: bearer(KEYS.open + "x") }));
add("auth: lower-case bearer scheme", "keyed", [200, 401], post(C, kchat(), { headers: { Authorization: `bearer ${KEYS.open}` } }));
add("auth: Basic scheme", "keyed", 401, post(C, kchat(), { headers: { Authorization: `Basic ${KEYS.open}` } }));
add("auth: empty bearer", "keyed", 401, post(C, kchat(), { headers: { Authorization: "Bearer " } }));
add("auth: x-api-key header", "keyed", 200, post(C, kchat(), { headers: { "x-api-key": KEYS.open } }));
add("auth: 64 KB key", "keyed", [400, 401, 431], post(C, kchat(), { headers: bearer("k".repeat(65536)) }));
add("auth: key with NUL bytes", "keyed", [400, 401], (s) => raw(s.port, [Buffer.from(`GET /v1/models HTTP/1.1\r\n${H}Authorization: Bearer ${KEYS.open}\0x\r\nConnection: close\r\n\r\n`, "latin1")]));
add("auth: right key", "keyed", 200, post(C, kchat(), { headers: bearer(KEYS.open) }));
add("auth: /v1/models without key", "keyed", 401, get("/v1/models"));
add("auth: /metrics without key", "keyed", 401, get("/metrics"), hasCode("missing_api_key"));
add("auth: /metrics with a wrong key", "keyed", 401, get("/metrics", { headers: bearer("hostile-wrong-key-0000") }));
add("auth: /metrics with a key", "keyed", 200, get("/metrics", { headers: bearer(KEYS.open) }));
add("auth: /health without key", "keyed", 200, get("/health"));
add("auth: /ready without key", "keyed", 200, get("/ready"));
add("auth: /tokenize without key", "keyed", 401, post("/tokenize", { model: "main", prompt: "x" }));
add("auth: /detokenize without key", "keyed", 401, post("/detokenize", { model: "main", tokens: [1] }));
add("auth: a model the key may not use is 404", "keyed", 404, post(C, kchat(), { headers: bearer(KEYS.scoped) }), hasCode("model_not_found"));
add("auth: an unknown model is the same 404", "keyed", 404, post(C, kchat({ model: "nope" }), { headers: bearer(KEYS.scoped) }), hasCode("model_not_found"));
add("auth: the scoped key's own model", "keyed", 200, post(C, kchat({ model: "other" }), { headers: bearer(KEYS.scoped) }));
add("auth: scoped key lists only its model", "keyed", 200, get("/v1/models", { headers: bearer(KEYS.scoped) }),
    (r) => (r.json?.data?.length === 1 && r.json.data[0].id === "other" ? null : `listed ${JSON.stringify(r.json?.data?.map((m) => m.id))}`));
add("auth: scoped key tokenizing another model is 404", "keyed", 404, post("/tokenize", { model: "main", prompt: "x" }, { headers: bearer(KEYS.scoped) }));
add("auth: keys turn the browser guard off", "keyed", 200, post(C, kchat(), { headers: bearer(KEYS.open), host: "api.example.com", contentType: "text/plain" }));
add("auth: many wrong keys in a row", "keyed", 401, async (s) => {
  let last;
  for (let i = 0; i < 50; ++i) last = await request(s.port, "POST", C, { body: kchat(), headers: bearer(`wrong-key-${i}-padding`) });
  return last;
});

// --- rate limits ---------------------------------------------------------------------------
add("rate: rpm key, n=2 counts twice", "keyed", 200, post(C, kchat({ n: 2 }), { headers: bearer(KEYS.rpm) }));
add("rate: rpm key, another n=2 is over", "keyed", 429, post(C, kchat({ n: 2 }), { headers: bearer(KEYS.rpm) }),
    all(hasCode("rate_limit_exceeded"), (r) => (/\r\nretry-after: \d+/i.test(r.head) ? null : "no Retry-After")));
add("rate: rpm key, the last request fits", "keyed", 200, post(C, kchat(), { headers: bearer(KEYS.rpm) }));
add("rate: rpm key, then /tokenize is limited too", "keyed", 429, post("/tokenize", { model: "main", prompt: "x" }, { headers: bearer(KEYS.rpm) }));
add("rate: rpm key, /detokenize too", "keyed", 429, post("/detokenize", { model: "main", tokens: [1] }, { headers: bearer(KEYS.rpm) }));
add("rate: rpm key, /v1/models is not limited", "keyed", 200, get("/v1/models", { headers: bearer(KEYS.rpm) }));
add("rate: tpm key, a request within the budget", "keyed", 200,
    post(C, kchat({ max_tokens: 32 }), { headers: bearer(KEYS.tpm) }));
add("rate: tpm key, a burst of 20 concurrent requests gets its budget", "keyed", 200, async (s) => {
  const rs = await Promise.all(Array.from({ length: 20 }, () =>
    request(s.port, "POST", C, { body: kchat({ max_tokens: 32 }), headers: bearer(KEYS.tpm) })));
  const ok = rs.filter((r) => r.status === 200).length;
  const limited = rs.filter((r) => r.status === 429).length;
  if (ok + limited !== 20) return { status: 500, bodyText: `statuses ${rs.map((r) => r.status)}` };
  // 300 tokens a minute, each request reserves ~15 + 32: at most 6 fit, however many run at once.
  if (ok > 7) return { status: 500, bodyText: `${ok} of 20 admitted on a 300 tokens/minute key` };
  return { status: 200 };
});
add("rate: concurrency-capped key, two at once", "keyed", 200, async (s) => {
  const rs = await Promise.all(Array.from({ length: 6 }, () =>
    request(s.port, "POST", C, { body: kchat({ max_tokens: 32, ignore_eos: true }), headers: bearer(KEYS.conc) })));
  const statuses = rs.map((r) => r.status);
  if (!statuses.includes(200) || !statuses.includes(429) || statuses.some((x) => x !== 200 && x !== 429)) {
    return { status: 500, bodyText: `statuses ${statuses}` };
  }
  return { status: 200 };
});
add("rate: concurrency-capped key after the others finished", "keyed", 200, post(C, kchat(), { headers: bearer(KEYS.conc) }));
add("rate: the server default caps keys at 4 in flight", "keyed", 200, async (s) => {
  const rs = await Promise.all(Array.from({ length: 10 }, () =>
    request(s.port, "POST", C, { body: kchat({ model: "other", max_tokens: 32, ignore_eos: true, stream: true }), headers: bearer(KEYS.scoped) })));
  const ok = rs.filter((r) => r.status === 200).length;
  if (ok < 1 || ok > 4 || rs.some((r) => r.status !== 200 && r.status !== 429)) return { status: 500, bodyText: `statuses ${rs.map((r) => r.status)}` };
  return { status: 200 };
});
add("rate: unlimited key takes 10 at once", "keyed", 200, async (s) => {
  const rs = await Promise.all(Array.from({ length: 10 }, () => request(s.port, "POST", C, { body: kchat(), headers: bearer(KEYS.open) })));
  return rs.every((r) => r.status === 200) ? { status: 200 } : { status: 500, bodyText: `statuses ${rs.map((r) => r.status)}` };
});
add("rate: a limited key does not limit another", "keyed", 200, post(C, kchat(), { headers: bearer(KEYS.open) }));

// Names of cases that stay skipped until the work they depend on lands (none today: the
// HTTP layer and the nested-JSON depth limits have landed and their cases run). Add a
// case's name here, with the issue item it waits for, to land a case before its fix.
for (const name of []) {
  EXPECTED_TO_FAIL_UNTIL_HTTP_LAYER.add(name);
}

// ---------------------------------------------------------------------------------------
async function main() {
  const argv = process.argv.slice(3);
  const only = argv.includes("--only") ? argv[argv.indexOf("--only") + 1] : null;
  const runSkipped = argv.includes("--run-expected-failures");
  const names = new Set();
  for (const c of cases) {
    if (names.has(c.name)) throw new Error(`duplicate case name: ${c.name}`);
    names.add(c.name);
  }
  for (const n of EXPECTED_TO_FAIL_UNTIL_HTTP_LAYER) {
    if (!names.has(n)) throw new Error(`EXPECTED_TO_FAIL_UNTIL_HTTP_LAYER names no case: ${n}`);
  }
  if (argv.includes("--list")) {
    for (const c of cases) console.log(`${EXPECTED_TO_FAIL_UNTIL_HTTP_LAYER.has(c.name) ? "[until http layer] " : ""}${c.name}`);
    console.log(`${cases.length} cases`);
    return 0;
  }
  if (cases.length < 200) throw new Error(`only ${cases.length} cases`);

  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "infera-hostile-"));
  const keyedPort = await freePort();
  fs.writeFileSync(path.join(tmp, "deploy.yaml"), keyedConfig(keyedPort));
  const servers = {
    open: await startServe("open", OPEN_ARGS),
    keyed: await startServe("keyed", ["--config", path.join(tmp, "deploy.yaml")]),
  };
  // Warm up, then take the baseline memory.
  for (const s of Object.values(servers)) {
    const headers = s.name === "keyed" ? bearer(KEYS.open) : {};
    for (let i = 0; i < 3; ++i) await request(s.port, "POST", C, { body: s.name === "keyed" ? kchat() : chat(), headers });
  }
  const baseline = Object.fromEntries(Object.entries(servers).map(([k, s]) => [k, rssKiB(s.proc.pid)]));

  let passed = 0, failed = 0, skipped = 0;
  const t0 = Date.now();
  for (const c of cases) {
    if (only && !c.name.includes(only)) continue;
    if (EXPECTED_TO_FAIL_UNTIL_HTTP_LAYER.has(c.name) && !runSkipped) {
      ++skipped;
      console.log(`SKIP (expected to fail until the HTTP layer work lands): ${c.name}`);
      continue;
    }
    const s = servers[c.server];
    const started = Date.now();
    let r;
    try {
      r = await c.run(s);
    } catch (e) {
      r = { status: "exception", bodyText: String(e?.stack || e) };
    }
    const expected = Array.isArray(c.expect) ? c.expect : [c.expect];
    const problems = [];
    if (!expected.includes(r.status ?? null)) problems.push(`status ${r.status}, expected ${expected.join(" or ")}: ${(r.bodyText ?? r.text ?? "").slice(0, 300)}`);
    if (c.check && r.status !== null && expected.includes(r.status)) {
      const p = c.check(r);
      if (p) problems.push(p);
    }
    if (s.proc.exitCode !== null || s.proc.signalCode !== null) problems.push(`the server died (${s.proc.exitCode ?? s.proc.signalCode})`);
    const h0 = Date.now();
    const h = await request(s.port, "GET", "/health", { timeoutMs: 1000 });
    const hms = Date.now() - h0;
    if (h.status !== 200 || hms > 1000) problems.push(`/health afterwards: ${h.status} in ${hms} ms`);
    const took = Date.now() - started;
    if (problems.length) {
      ++failed;
      console.log(`FAIL ${c.name} (${took} ms)\n     ${problems.join("\n     ")}`);
      if (s.proc.exitCode !== null || s.proc.signalCode !== null) {
        console.log(s.log().slice(-3000));
        break;
      }
    } else {
      ++passed;
      if (process.env.HOSTILE_VERBOSE) console.log(`ok   ${c.name} (${took} ms)`);
    }
  }
  // Peak memory: growth over the warmed-up baseline, bounded (the body limit is 256 KiB,
  // the KV budget 64 MiB).
  const limitKiB = 256 * 1024;
  for (const [k, s] of Object.entries(servers)) {
    const now = rssKiB(s.proc.pid);
    const growth = now.hwm - baseline[k].rss;
    console.log(`memory ${k}: rss ${baseline[k].rss} KiB at start, ${now.rss} KiB now, peak ${now.hwm} KiB (+${growth} KiB)`);
    if (growth > limitKiB) {
      ++failed;
      console.log(`FAIL peak memory of the ${k} server grew by ${growth} KiB, over ${limitKiB} KiB`);
    }
  }
  for (const s of Object.values(servers)) {
    s.proc.kill("SIGTERM");
    await Promise.race([new Promise((r) => s.proc.once("exit", r)), sleep(10000)]);
  }
  fs.rmSync(tmp, { recursive: true, force: true });
  console.log(`hostile: ${passed} passed, ${failed} failed, ${skipped} skipped (expected to fail until the HTTP layer work lands) ` +
              `of ${cases.length} cases in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  return failed ? 1 : 0;
}

process.exit(await main());
