// Concurrency against `infera serve` with the real stories260K model: 32 streaming clients
// at once all get the same text as when asked one by one; KV blocks in use return to zero
// afterwards; clients killed mid-stream (curl, SIGKILL) cancel their generations and free
// their blocks (the audit log shows them as 499 with fewer tokens); SIGTERM drains:
// new requests get 503, in-flight streams complete, the process exits 0.
//
//   node server_concurrency.mjs <path-to-infera-binary>
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { check, checkEq, finish, metrics, postJson, requireFixture, startServer, storiesDir, waitFor } from "./server_common.mjs";

requireFixture(storiesDir);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "infera-server-concurrency-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));
const auditPath = path.join(tmp, "audit.jsonl");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A drain grace far above what the in-flight streams need, so a slow or loaded machine does
// not cut them (the grace bounds the test; it is not what is being measured).
const server = await startServer(["-m", storiesDir, "--name", "stories", "--max-num-seqs", "32", "--audit-log", auditPath, "--drain-grace", "300"]);
const url = `${server.url}/v1/completions`;
const label = '{model="stories"}';

async function streamText(body) {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
  const raw = await r.text();
  let text = "";
  const parts = raw.split("\n\n").filter((b) => b.startsWith("data: "));
  const done = parts.at(-1) === "data: [DONE]";
  for (const p of parts.slice(0, -1)) text += JSON.parse(p.slice(6)).choices[0]?.text ?? "";
  return { status: r.status, text, done };
}

// Kills a curl client as soon as its first bytes arrive.
function killedClient(body) {
  return new Promise((resolve) => {
    const curl = spawn("curl", ["-sS", "-N", "-H", "content-type: application/json", "-d", JSON.stringify({ ...body, stream: true }), url]);
    let got = false;
    curl.stdout.on("data", () => {
      if (!got) {
        got = true;
        curl.kill("SIGKILL");
      }
    });
    curl.on("exit", () => resolve(got));
  });
}

try {
  // 32 concurrent streams, each compared with its one-by-one greedy answer.
  const prompts = Array.from({ length: 32 }, (_, i) => `Once upon a time there was a ${["cat", "dog", "bird", "girl"][i % 4]} number ${i}`);
  const reference = [];
  for (const p of prompts) reference.push((await postJson(url, { model: "stories", prompt: p, max_tokens: 48, temperature: 0 })).json.choices[0].text);
  const results = await Promise.all(prompts.map((p) => streamText({ model: "stories", prompt: p, max_tokens: 48, temperature: 0 })));
  results.forEach((r, i) => {
    checkEq(r.status, 200, `stream ${i}: status`);
    check(r.done, `stream ${i}: ends with [DONE]`);
    checkEq(r.text, reference[i], `stream ${i}: same text as alone`);
  });
  check(await waitFor(async () => (await metrics(server.url))[`infera_kv_blocks_used${label}`] === 0), "KV blocks in use back to 0 after 32 streams");
  checkEq((await metrics(server.url))[`infera_requests_running${label}`], 0, "no request running afterwards");

  // Clients killed mid-stream.
  const long = { model: "stories", prompt: "Once upon a time", max_tokens: 450, temperature: 0.8, ignore_eos: true };
  const killed = await Promise.all(Array.from({ length: 8 }, () => killedClient(long)));
  checkEq(killed.filter(Boolean).length, 8, "8 clients started streaming and were killed");
  check(await waitFor(async () => {
    const m = await metrics(server.url);
    return m[`infera_kv_blocks_used${label}`] === 0 && m[`infera_requests_running${label}`] === 0 && m[`infera_requests_waiting${label}`] === 0;
  }), "KV blocks freed after the clients were killed");
  const audit = fs.readFileSync(auditPath, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const cancelled = audit.filter((a) => a.status === 499);
  check(cancelled.length >= 1, `killed clients logged as 499 (${cancelled.length})`);
  check(cancelled.every((a) => a.completion_tokens < 450), "killed clients' generations stopped early");
  check(audit.filter((a) => a.status === 200).length >= 64, "64 completed requests in the audit log");
  check(audit.every((a) => a.time && "key_id" in a && a.model === "stories" && "ttft_ms" in a && "latency_ms" in a), "audit lines complete");
  check(audit.every((a) => !("prompt" in a)), "no prompt text in the audit log by default");

  // Still serving, then SIGTERM drains.
  // Enough in-flight work (16 x 450 tokens) that the drain is still going on when the
  // next request arrives, even on a fast machine (stories260K decodes thousands of tokens/s).
  const streams = Array.from({ length: 16 }, () => streamText({ ...long }));
  await sleep(150);
  server.proc.kill("SIGTERM");
  await sleep(20);
  let refused = null;
  try {
    refused = await postJson(url, { model: "stories", prompt: "x", max_tokens: 2 });
  } catch {}
  if (refused) {
    checkEq(refused.status, 503, "new request while draining: 503");
    checkEq(refused.json?.error?.code, "draining", "draining error code");
    check(refused.headers.get("retry-after") !== null, "Retry-After while draining");
  } else {
    check(false, "the server should still answer (503) while draining");
  }
  const finished = await Promise.all(streams);
  finished.forEach((r, i) => check(r.done && r.status === 200, `in-flight stream ${i} completed during the drain`));
  const { code } = await server.exited;
  checkEq(code, 0, "exit 0 after draining");
} finally {
  await server.stop("SIGKILL");
}
finish("server_concurrency");
