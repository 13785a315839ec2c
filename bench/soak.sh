#!/usr/bin/env bash
# Soak test: N minutes (default 30) of mixed load on the built-in model over loopback:
# streams, streams cancelled after their first chunk, clients that disconnect mid-request,
# completions with n > 1, tokenize, bad requests, a rate-limited key, with a KV budget small
# enough that sequences are preempted. Every request has a timeout; the run is bounded in
# time and in request count. Reports resident memory over time and fails when it is not
# flat within 5% after warm-up, when KV blocks do not return to zero (/metrics), when
# any response is a 5xx or when nothing was preempted.
#
# Usage: bench/soak.sh [--minutes N] [--concurrency C] [--binary build/infera] [--max-requests N]
#                      [--actions stream,chat,...]   (a subset of the actions, to find which one leaks)
#                      [--wrap "heaptrack -o /tmp/ht"]  (the server runs under this command)
#                      [--keep DIR]   (the deploy.yaml and the server's log stay in DIR)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
minutes=30
concurrency=8
binary="$root/build/infera"
max_requests=2000000
actions=""
wrap=""
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --max-requests) max_requests="$2"; shift 2 ;;
    --actions) actions="$2"; shift 2 ;;
    --wrap) wrap="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$binary" ] || { echo "no infera binary at $binary; build first (scripts/build.sh)" >&2; exit 2; }
command -v node >/dev/null || { echo "node is needed for the load driver" >&2; exit 2; }

if [ -n "$keep" ]; then
  mkdir -p "$keep"
  tmp=$(cd "$keep" && pwd)
else
  tmp=$(mktemp -d)
fi
server_pid=""
wrapper_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  # A wrapper (a profiler) writes its results after the server ends.
  if [ -n "$wrapper_pid" ]; then wait "$wrapper_pid" 2>/dev/null || true; fi
  [ -n "$keep" ] || rm -rf "$tmp"
}
trap cleanup EXIT

port=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
cat > "$tmp/deploy.yaml" <<EOF
server:
  host: 127.0.0.1
  port: $port
  body_limit: 256KiB
  request_timeout_s: 60
  drain_grace_s: 5
  api_keys:
    - {id: soak, key: soak-key-unlimited-0001, max_concurrent_requests: 0}
    - {id: limited, key: soak-key-limited-00002, requests_per_minute: 30, tokens_per_minute: 3000, max_concurrent_requests: 2}
models:
  - name: default
    path: $root/models/infera-default
    threads: 1
    max_input_len: 192
    max_output_len: 96
    max_num_seqs: 8
    prefill_chunk: 64
    kv_cache_memory: 640KiB  # about one full-length sequence: the scheduler preempts
EOF
# shellcheck disable=SC2086
$wrap "$binary" serve --config "$tmp/deploy.yaml" > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log" >&2; echo "the server exited" >&2; exit 1; }
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/ready" >/dev/null || { cat "$tmp/server.log" >&2; echo "not ready" >&2; exit 1; }
if [ -n "$wrap" ]; then  # the server is a child of the wrapper: measure (and stop) it
  wrapper_pid=$server_pid
  server_pid=$(pgrep -n -f -- "serve --config $tmp/deploy.yaml" || true)
  [ -n "$server_pid" ] || { echo "cannot find the server under --wrap" >&2; exit 1; }
  [ "$server_pid" != "$wrapper_pid" ] || wrapper_pid=""  # the wrapper became the server (env, nice)
fi

echo "soak: ${minutes} min, ${concurrency} clients, server pid $server_pid on 127.0.0.1:$port"
status=0
SOAK_PORT=$port SOAK_PID=$server_pid SOAK_MINUTES=$minutes SOAK_CONCURRENCY=$concurrency SOAK_MAX_REQUESTS=$max_requests SOAK_ACTIONS=$actions \
node --input-type=module - <<'EOF' || status=$?
import fs from "node:fs";
import http from "node:http";

const port = Number(process.env.SOAK_PORT);
const pid = Number(process.env.SOAK_PID);
const durationMs = Number(process.env.SOAK_MINUTES) * 60000;
const concurrency = Number(process.env.SOAK_CONCURRENCY);
const maxRequests = Number(process.env.SOAK_MAX_REQUESTS);
const KEY = "soak-key-unlimited-0001";
const LIMITED = "soak-key-limited-00002";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function rssKiB() {
  try {
    return Number(/^VmRSS:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))[1]);
  } catch {
    return 0;
  }
}

// One request; `abortAfter`: "first-chunk" or milliseconds. Resolves {status, body}.
function send(path, body, { key = KEY, method = "POST", abortAfter = null, timeoutMs = 60000 } = {}) {
  return new Promise((resolve) => {
    const payload = body === null ? null : Buffer.from(typeof body === "string" ? body : JSON.stringify(body));
    const headers = { authorization: `Bearer ${key}` };
    if (payload) Object.assign(headers, { "content-type": "application/json", "content-length": payload.length });
    let settled = false;
    const done = (v) => {
      if (!settled) {
        settled = true;
        clearTimeout(timer);
        resolve(v);
      }
    };
    // A connection per request: no client-side keep-alive races to mistake for server faults.
    const req = http.request({ host: "127.0.0.1", port, path, method, headers, agent: false }, (res) => {
      let data = "";
      res.on("data", (d) => {
        if (data.length < 1 << 20) data += d;
        if (abortAfter === "first-chunk") {
          req.destroy();
          done({ status: res.statusCode, aborted: true });
        }
      });
      res.on("end", () => done({ status: res.statusCode, body: data }));
      res.on("error", () => done({ status: res.statusCode, aborted: true }));
    });
    req.on("error", (e) => done({ status: "conn-error", error: e.code || String(e) }));
    const timer = setTimeout(() => {
      req.destroy();
      done({ status: typeof abortAfter === "number" ? "hung-up" : "timeout" });
    }, typeof abortAfter === "number" ? abortAfter : timeoutMs);
    if (payload) req.write(payload);
    req.end();
  });
}

const prompts = ["In the beginning", "And the LORD said unto Moses", "Continue: Blessed are the meek", "The heavens declare",
                 "静夜思\n李白", "Give thanks unto the LORD, for he is good; " .repeat(4)];
const pick = (a) => a[Math.floor(Math.random() * a.length)];
const chat = (extra = {}) => ({ messages: [{ role: "user", content: pick(prompts) }], max_tokens: 16 + Math.floor(Math.random() * 80), ...extra });

const actions = [
  ["stream", 4, () => send("/v1/chat/completions", chat({ stream: true }))],
  ["stream-cancel", 2, () => send("/v1/chat/completions", chat({ stream: true, ignore_eos: true }), { abortAfter: "first-chunk" })],
  ["disconnect", 2, () => send("/v1/chat/completions", chat({ ignore_eos: true }), { abortAfter: 30 + Math.floor(Math.random() * 200) })],
  ["chat", 3, () => send("/v1/chat/completions", chat())],
  ["completion-n2", 2, () => send("/v1/completions", { prompt: pick(prompts), max_tokens: 32, n: 2, temperature: 0.8 })],
  ["long-prompt", 1, () => send("/v1/completions", { prompt: "And it came to pass ".repeat(30), max_tokens: 64, ignore_eos: true })],
  ["tokenize", 1, () => send("/tokenize", { prompt: pick(prompts) })],
  ["bad-request", 1, () => send("/v1/chat/completions", pick(['{"messages": [', '{"messages": []}', '{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}', "[1,2]"]))],
  ["too-long", 1, () => send("/v1/completions", { prompt: "word ".repeat(400), max_tokens: 8 })],
  ["limited-key", 2, () => send("/v1/chat/completions", chat({ max_tokens: 16 }), { key: LIMITED })],
  ["wrong-key", 1, () => send("/v1/chat/completions", chat(), { key: "soak-wrong-key-000000" })],
];
const only = (process.env.SOAK_ACTIONS || "").split(",").filter(Boolean);
for (const name of only) if (!actions.some(([n]) => n === name)) throw new Error(`unknown action ${name}`);
const weighted = actions.filter(([name]) => !only.length || only.includes(name)).flatMap(([name, w, fn]) => Array(w).fill([name, fn]));
const stats = {};
let total = 0;
let fivexx = 0;
let timeouts = 0;
let connErrors = 0;
const samples = [];
const t0 = Date.now();
const end = t0 + durationMs;

const sampler = setInterval(() => samples.push([Math.round((Date.now() - t0) / 1000), rssKiB()]), 5000);
samples.push([0, rssKiB()]);

async function worker() {
  while (Date.now() < end && total < maxRequests) {
    const [name, fn] = pick(weighted);
    ++total;
    const r = await fn();
    const key = `${name} ${r.status ?? "aborted"}`;
    stats[key] = (stats[key] ?? 0) + 1;
    if (typeof r.status === "number" && r.status >= 500) {
      ++fivexx;
      if (fivexx <= 5) console.log(`5xx on ${name}: ${r.status} ${String(r.body).slice(0, 300)}`);
    }
    if (r.status === "conn-error") {
      ++connErrors;
      if (connErrors <= 5) console.log(`connection error on ${name}: ${r.error}`);
    }
    if (r.status === "timeout") {
      ++timeouts;
      if (timeouts <= 5) console.log(`timeout on ${name}`);
    }
  }
}
await Promise.all(Array.from({ length: concurrency }, worker));
clearInterval(sampler);

// Idle: every generation finished or cancelled, every KV block back.
let metrics = "";
let used = -1, running = -1, waiting = -1;
for (let i = 0; i < 200; ++i) {
  const r = await send("/metrics", null, { method: "GET" });
  metrics = r.body ?? "";
  const num = (name) => Number((new RegExp(`^${name}\\{[^}]*\\} (\\S+)`, "m").exec(metrics) || [])[1] ?? -1);
  used = num("infera_kv_blocks_used");
  running = num("infera_requests_running");
  waiting = num("infera_requests_waiting");
  if (used === 0 && running === 0 && waiting === 0) break;
  await sleep(100);
}
samples.push([Math.round((Date.now() - t0) / 1000), rssKiB()]);
const preemptions = Number((/^infera_preemptions_total\{[^}]*\} (\S+)/m.exec(metrics) || [])[1] ?? 0);

console.log("\nrequests by action and status:");
for (const k of Object.keys(stats).sort()) console.log(`  ${k.padEnd(28)} ${stats[k]}`);
console.log(`total ${total} requests in ${((Date.now() - t0) / 1000).toFixed(0)} s; preemptions ${preemptions}`);
console.log("\nresident memory (s, MiB):");
const step = Math.max(1, Math.floor(samples.length / 40));
for (let i = 0; i < samples.length; i += step) console.log(`  ${String(samples[i][0]).padStart(6)}  ${(samples[i][1] / 1024).toFixed(1)}`);
// Flat: after a warm-up of a fifth of the run (at least the first sample past 30 s), the
// resident set stays within 5% of its level then.
const warmIndex = samples.findIndex(([t]) => t >= Math.min(Math.max(30, durationMs / 5000), durationMs / 2000));
const base = samples[Math.max(1, warmIndex)][1];
const later = samples.slice(Math.max(1, warmIndex));
const peak = Math.max(...later.map(([, v]) => v));
const low = Math.min(...later.map(([, v]) => v));
const drift = (peak - base) / base;
console.log(`rss after warm-up ${(base / 1024).toFixed(1)} MiB, later peak ${(peak / 1024).toFixed(1)} MiB, low ${(low / 1024).toFixed(1)} MiB: ` +
            `${(drift * 100).toFixed(2)}% growth`);
console.log(`kv blocks used at the end ${used}, requests running ${running}, waiting ${waiting}; 5xx responses ${fivexx}; ` +
            `timeouts ${timeouts}; connection errors ${connErrors}`);
const problems = [];
if (drift > 0.05) problems.push(`resident memory grew ${(drift * 100).toFixed(1)}% (over 5%)`);
if (used !== 0 || running !== 0 || waiting !== 0) problems.push("KV blocks / requests did not return to zero");
if (fivexx) problems.push(`${fivexx} responses were 5xx`);
if (!only.length && !preemptions) problems.push("no sequence was preempted (the KV budget did not bind)");
if (timeouts) problems.push(`${timeouts} requests got no answer within 60 s`);
if (connErrors) problems.push(`${connErrors} requests failed to connect or were reset`);
if (problems.length) {
  console.log(`SOAK FAILED: ${problems.join("; ")}`);
  process.exit(1);
}
console.log("SOAK PASSED");
process.exit(0);
EOF
kill -0 "$server_pid" 2>/dev/null || { echo "the server died during the soak" >&2; tail -50 "$tmp/server.log" >&2; exit 1; }
exit $status
