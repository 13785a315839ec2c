// Streaming and sampling behaviour of `infera serve` with the real stories260K model:
// SSE framing as curl sees it, log-probabilities in stream chunks, stop strings split across tokens (never emitted, streamed
// or not), n > 1 choices, and seed reproducibility.
//
//   node server_sse.mjs <path-to-infera-binary>
import { spawnSync } from "node:child_process";

import { check, checkEq, finish, postJson, requireFixture, startServer, storiesDir } from "./server_common.mjs";

requireFixture(storiesDir);

const server = await startServer(["-m", storiesDir, "--name", "stories"]);
const url = `${server.url}/v1/completions`;
const prompt = "Once upon a time";

function curlStream(body) {
  const r = spawnSync("curl", ["-sS", "-N", "-i", "-H", "content-type: application/json", "-d", JSON.stringify(body), url], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`curl failed: ${r.stderr}`);
  const split = r.stdout.indexOf("\r\n\r\n");
  return { head: r.stdout.slice(0, split), body: r.stdout.slice(split + 4) };
}

// Data payloads of an SSE body, checking the framing.
function events(body, what) {
  check(body.endsWith("data: [DONE]\n\n"), `${what}: ends with data: [DONE]`);
  const blocks = body.split("\n\n");
  checkEq(blocks.pop(), "", `${what}: nothing after the last blank line`);
  const out = [];
  for (const b of blocks) {
    if (b.startsWith(":")) continue;
    check(b.startsWith("data: ") && !b.includes("\n"), `${what}: one data: line per event (${JSON.stringify(b).slice(0, 80)})`);
    out.push(b.slice(6));
  }
  return out;
}

function streamedText(body, what) {
  const ev = events(body, what);
  let text = "";
  let finishReason = null;
  for (const e of ev.slice(0, -1)) {
    const j = JSON.parse(e);
    for (const c of j.choices) {
      text += c.text ?? "";
      if (c.finish_reason) finishReason = c.finish_reason;
    }
  }
  return { text, finishReason, chunks: ev.slice(0, -1).map((e) => JSON.parse(e)) };
}

try {
  // SSE framing as curl sees it.
  const s = curlStream({ model: "stories", prompt, max_tokens: 40, temperature: 0, stream: true });
  check(/content-type: text\/event-stream/i.test(s.head), "content-type text/event-stream");
  check(/transfer-encoding: chunked/i.test(s.head), "chunked transfer");
  const streamed = streamedText(s.body, "curl stream");
  const plain = await postJson(url, { model: "stories", prompt, max_tokens: 40, temperature: 0 });
  checkEq(streamed.text, plain.json.choices[0].text, "streamed text equals the non-streamed text");
  checkEq(streamed.finishReason, "length", "finish_reason length");
  for (const c of streamed.chunks) checkEq(c.object, "text_completion", "chunk object");

  // Log-probabilities as curl sees the stream: each chunk carries the legacy lists of its
  // own tokens; together they equal the non-streamed lists and spell the text.
  const lpBody = { model: "stories", prompt, max_tokens: 24, temperature: 0, logprobs: 3 };
  const lpStream = streamedText(curlStream({ ...lpBody, stream: true }).body, "curl logprobs stream");
  const lpPlain = (await postJson(url, lpBody)).json.choices[0];
  const joinedLp = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const c of lpStream.chunks) {
    const lp = c.choices[0]?.logprobs;
    check(lp !== undefined, "a logprobs request's chunks have a logprobs field");
    if (!lp) continue;
    checkEq(lp.tokens.join(""), c.choices[0].text, "a chunk's tokens spell its text");
    for (const k of Object.keys(joinedLp)) joinedLp[k].push(...lp[k]);
  }
  checkEq(lpStream.text, lpPlain.text, "logprobs stream: same text");
  checkEq(joinedLp.tokens, lpPlain.logprobs.tokens, "streamed logprobs tokens equal the non-streamed ones");
  checkEq(joinedLp.text_offset, lpPlain.logprobs.text_offset, "streamed text_offset equals the non-streamed one");
  check(joinedLp.token_logprobs.every((v, i) => Math.abs(v - lpPlain.logprobs.token_logprobs[i]) < 1e-4), "streamed token_logprobs");

  // Stop strings straddling token boundaries: take the text of consecutive chunks (one
  // token each) and stop on the last two characters of one plus the first two of the next.
  const full = plain.json.choices[0].text;
  const pieces = streamed.chunks.map((c) => c.choices[0]?.text ?? "").filter((t) => t.length >= 2);
  let tried = 0;
  for (let k = 1; k + 1 < pieces.length && tried < 5; k += 3) {
    const stop = pieces[k].slice(-2) + pieces[k + 1].slice(0, 2);
    const cut = full.indexOf(stop);
    if (cut < 0) continue;
    ++tried;
    const r = await postJson(url, { model: "stories", prompt, max_tokens: 40, temperature: 0, stop: [stop, "never-there"] });
    checkEq(r.json.choices[0].text, full.slice(0, cut), `stop ${JSON.stringify(stop)}: text ends before it`);
    checkEq(r.json.choices[0].finish_reason, "stop", `stop ${JSON.stringify(stop)}: finish_reason`);
    const rs = streamedText(curlStream({ model: "stories", prompt, max_tokens: 40, temperature: 0, stop, stream: true }).body, "stop stream");
    checkEq(rs.text, full.slice(0, cut), `stop ${JSON.stringify(stop)} streamed: text ends before it`);
    checkEq(rs.finishReason, "stop", `stop ${JSON.stringify(stop)} streamed: finish_reason`);
  }
  check(tried >= 3, `at least 3 split stop strings tried (${tried})`);

  // n > 1.
  const many = await postJson(url, { model: "stories", prompt, max_tokens: 30, temperature: 1.0, seed: 5, n: 4 });
  checkEq(many.status, 200, "n=4 status");
  checkEq(many.json.choices.map((c) => c.index), [0, 1, 2, 3], "n=4 indices");
  check(new Set(many.json.choices.map((c) => c.text)).size > 1, "sampled choices differ");
  const greedyMany = await postJson(url, { model: "stories", prompt, max_tokens: 20, temperature: 0, n: 3 });
  checkEq(new Set(greedyMany.json.choices.map((c) => c.text)).size, 1, "greedy choices agree");
  checkEq(greedyMany.json.usage.completion_tokens, 60, "usage counts every choice");
  const manyStream = streamedText(curlStream({ model: "stories", prompt, max_tokens: 10, temperature: 0.8, n: 3, stream: true }).body, "n=3 stream");
  checkEq([...new Set(manyStream.chunks.flatMap((c) => c.choices.map((x) => x.index)))].sort(), [0, 1, 2], "n=3 stream has three choice indices");

  // Seed reproducibility.
  const sample = async (seed) =>
    (await postJson(url, { model: "stories", prompt, max_tokens: 60, temperature: 1.0, top_p: 0.95, seed })).json.choices[0].text;
  const a = await sample(123);
  const b = await sample(123);
  const c = await sample(124);
  checkEq(a, b, "same seed, same text");
  check(a !== c, "another seed, another text");
  checkEq(many.json.choices.map((x) => x.text),
          (await postJson(url, { model: "stories", prompt, max_tokens: 30, temperature: 1.0, seed: 5, n: 4 })).json.choices.map((x) => x.text),
          "n=4 with a seed is reproducible");
} finally {
  const { code } = await server.stop("SIGTERM");
  checkEq(code, 0, "server exits 0 after SIGTERM");
}
finish("server_sse");
