// A table of bad requests against `infera serve` (stories260K, ChatML template): each gets
// the right status and OpenAI's error JSON {"error": {message, type, param, code}}, no
// error leaks paths or internals, and the server keeps serving normally afterwards.
//
//   node server_bad_requests.mjs <path-to-infera-binary>
import { chatmlTemplate, check, checkEq, finish, postJson, requireFixture, startServer, storiesDir } from "./server_common.mjs";

requireFixture(storiesDir);

const key = "bad-requests-key-0123456789";
const server = await startServer([
  "-m", storiesDir, "--name", "stories", "--chat-template", chatmlTemplate, "--api-key", key,
  "--max-input-len", "100", "--max-output-len", "200", "--body-limit", "64KiB",
]);
const auth = { authorization: `Bearer ${key}` };
const msgs = [{ role: "user", content: "Hello" }];
const chat = (extra) => ({ model: "stories", messages: msgs, max_tokens: 4, ...extra });
const cmpl = (extra) => ({ model: "stories", prompt: "Once", max_tokens: 4, ...extra });
const nested = "[".repeat(10000) + "]".repeat(10000);
const invalidUtf8 = Buffer.concat([Buffer.from('{"model":"stories","messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0x80]), Buffer.from('"}]}')]);

// [name, path, body, expected status, {headers, param, code, mention}]
const C = "/v1/chat/completions";
const P = "/v1/completions";
const cases = [
  ["missing API key", C, chat(), 401, { headers: {}, code: "missing_api_key" }],
  ["wrong API key", C, chat(), 401, { headers: { authorization: "Bearer not-the-key-000" }, code: "invalid_api_key" }],
  ["empty bearer", C, chat(), 401, { headers: { authorization: "Bearer " } }],
  ["basic auth scheme", C, chat(), 401, { headers: { authorization: `Basic ${key}` } }],
  ["wrong key on /v1/models", "GET /v1/models", null, 401, { headers: { authorization: "Bearer nope-nope-nope" } }],
  ["broken JSON", C, '{"model": "stories", "messages": [', 400, {}],
  ["trailing garbage", C, JSON.stringify(chat()) + " x", 400, {}],
  ["empty body", C, "", 400, {}],
  ["array body", C, "[1, 2]", 400, {}],
  ["string body", C, '"hello"', 400, {}],
  ["NaN literal", C, '{"messages": NaN}', 400, {}],
  ["invalid UTF-8", C, invalidUtf8, 400, {}],
  ["deeply nested JSON", C, `{"messages": ${nested}}`, 400, {}],
  ["body over the limit", C, JSON.stringify(chat({ messages: [{ role: "user", content: "x".repeat(100000) }] })), 413, { code: "body_too_large" }],
  ["messages missing", C, { model: "stories" }, 400, { param: "messages" }],
  ["messages not an array", C, chat({ messages: "hi" }), 400, { param: "messages" }],
  ["messages empty", C, chat({ messages: [] }), 400, { param: "messages" }],
  ["message not an object", C, chat({ messages: ["hi"] }), 400, { param: "messages[0]" }],
  ["unknown role", C, chat({ messages: [{ role: "wizard", content: "x" }] }), 400, { param: "messages[0].role" }],
  ["role missing", C, chat({ messages: [{ content: "x" }] }), 400, { param: "messages[0].role" }],
  ["content a number", C, chat({ messages: [{ role: "user", content: 5 }] }), 400, { param: "messages[0].content" }],
  ["user content missing", C, chat({ messages: [{ role: "user" }] }), 400, { param: "messages[0].content" }],
  ["image content part", C, chat({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }), 400, {}],
  ["max_tokens negative", C, chat({ max_tokens: -5 }), 400, { param: "max_tokens" }],
  ["max_tokens zero", C, chat({ max_tokens: 0 }), 400, { param: "max_tokens" }],
  ["max_tokens huge", C, chat({ max_tokens: 1000000000 }), 400, { param: "max_tokens", mention: ["1000000000", "200"] }],
  ["max_tokens a string", C, chat({ max_tokens: "5" }), 400, { param: "max_tokens" }],
  ["max_tokens fractional", C, chat({ max_tokens: 2.5 }), 400, { param: "max_tokens" }],
  ["max_completion_tokens negative", C, chat({ max_completion_tokens: -1 }), 400, { param: "max_completion_tokens" }],
  ["temperature negative", C, chat({ temperature: -1 }), 400, { param: "temperature" }],
  ["temperature a string", C, chat({ temperature: "hot" }), 400, { param: "temperature" }],
  ["top_p above 1", C, chat({ top_p: 2 }), 400, { param: "top_p" }],
  ["top_k a string", C, chat({ top_k: "a" }), 400, { param: "top_k" }],
  ["n zero", C, chat({ n: 0 }), 400, { param: "n" }],
  ["n too large", C, chat({ n: 100 }), 400, { param: "n" }],
  ["stop a number", C, chat({ stop: 7 }), 400, { param: "stop" }],
  ["stop list with a number", C, chat({ stop: ["a", 1] }), 400, { param: "stop[1]" }],
  ["stream not a boolean", C, chat({ stream: "yes" }), 400, { param: "stream" }],
  ["stream_options without stream", C, chat({ stream_options: { include_usage: true } }), 400, { param: "stream_options" }],
  ["presence_penalty out of range", C, chat({ presence_penalty: 3 }), 400, { param: "presence_penalty" }],
  ["frequency_penalty a string", C, chat({ frequency_penalty: "x" }), 400, { param: "frequency_penalty" }],
  ["repetition_penalty zero", C, chat({ repetition_penalty: 0 }), 400, { param: "repetition_penalty" }],
  ["seed a string", C, chat({ seed: "abc" }), 400, { param: "seed" }],
  ["model not a string", C, chat({ model: 5 }), 400, { param: "model" }],
  ["unknown model", C, chat({ model: "gpt-17" }), 404, { param: "model", code: "model_not_found" }],
  ["overlong input", C, chat({ messages: [{ role: "user", content: "word ".repeat(200) }] }), 400, { code: "context_length_exceeded", mention: ["100"] }],
  ["tools not an array", C, chat({ tools: { type: "function" } }), 400, { param: "tools" }],
  ["tool without function", C, chat({ tools: [{ type: "function" }] }), 400, { param: "tools[0].function" }],
  ["tool_choice unknown", C, chat({ tools: [{ type: "function", function: { name: "f" } }], tool_choice: "sometimes" }), 400, { param: "tool_choice" }],
  ["tool_choice names a missing tool", C, chat({ tools: [{ type: "function", function: { name: "f" } }], tool_choice: { type: "function", function: { name: "g" } } }), 400, { param: "tool_choice" }],
  ["top_logprobs without logprobs", C, chat({ top_logprobs: 3 }), 400, { param: "top_logprobs" }],
  ["top_logprobs above 20", C, chat({ logprobs: true, top_logprobs: 21 }), 400, { param: "top_logprobs", mention: ["20"] }],
  ["top_logprobs negative", C, chat({ logprobs: true, top_logprobs: -1 }), 400, { param: "top_logprobs" }],
  ["logprobs not a boolean", C, chat({ logprobs: "yes" }), 400, { param: "logprobs" }],
  ["completion logprobs above 20", P, cmpl({ logprobs: 21 }), 400, { param: "logprobs", mention: ["20"] }],
  ["completion logprobs negative", P, cmpl({ logprobs: -1 }), 400, { param: "logprobs" }],
  ["completion logprobs a boolean", P, cmpl({ logprobs: true }), 400, { param: "logprobs" }],
  ["completion max_tokens zero without echo", P, cmpl({ max_tokens: 0 }), 400, { param: "max_tokens", mention: ["echo"] }],
  ["prompt missing", P, { model: "stories" }, 400, { param: "prompt" }],
  ["prompt a number", P, cmpl({ prompt: 5 }), 400, { param: "prompt" }],
  ["prompt empty list", P, cmpl({ prompt: [] }), 400, { param: "prompt" }],
  ["prompt token outside the vocabulary", P, cmpl({ prompt: [1, 100000] }), 400, { param: "prompt" }],
  ["prompt negative token", P, cmpl({ prompt: [1, -3] }), 400, { param: "prompt[1]" }],
  ["overlong completion prompt", P, cmpl({ prompt: "Once upon a time ".repeat(40) }), 400, { code: "context_length_exceeded" }],
  ["echo not a boolean", P, cmpl({ echo: "yes" }), 400, { param: "echo" }],
  ["completion max_tokens huge", P, cmpl({ max_tokens: 100000 }), 400, { param: "max_tokens" }],
  ["unknown endpoint", "/v1/engines", {}, 404, {}],
  ["tokenize without prompt", "/tokenize", { model: "stories" }, 400, { param: "prompt" }],
  ["detokenize bad id", "/detokenize", { tokens: [1, 99999] }, 400, { param: "tokens" }],
];

check(cases.length >= 40, `at least 40 cases (${cases.length})`);
try {
  for (const [name, target, body, status, opt] of cases) {
    const headers = opt.headers ?? auth;
    let r;
    if (target.startsWith("GET ")) {
      const res = await fetch(server.url + target.slice(4), { headers });
      const text = await res.text();
      r = { status: res.status, text, json: JSON.parse(text) };
    } else {
      r = await postJson(server.url + target, body, headers);
    }
    checkEq(r.status, status, `${name}: status`);
    const err = r.json?.error;
    check(err && typeof err.message === "string" && err.message.length > 0, `${name}: error.message (${r.text.slice(0, 200)})`);
    check(err && typeof err.type === "string", `${name}: error.type`);
    check(err && "param" in err && "code" in err, `${name}: error.param and error.code present`);
    if (opt.param) checkEq(err?.param, opt.param, `${name}: error.param`);
    if (opt.code) checkEq(err?.code, opt.code, `${name}: error.code`);
    for (const m of opt.mention ?? []) check(err?.message.includes(m), `${name}: message mentions ${m}: ${err?.message}`);
    check(!r.text.includes(storiesDir) && !r.text.includes("json.exception") && !r.text.includes(".cpp"),
          `${name}: no internals in ${r.text.slice(0, 200)}`);
    if (status === 401 || status === 429) check(true, "");
    const health = await fetch(`${server.url}/health`);
    checkEq(health.status, 200, `${name}: server alive afterwards`);
  }
  // And it still serves normally.
  const ok = await postJson(`${server.url}${C}`, chat({ max_tokens: 8, temperature: 0 }), auth);
  checkEq(ok.status, 200, "a good request after the bad ones");
  check(typeof ok.json?.choices?.[0]?.message?.content === "string", "a normal answer");
  const ready = await fetch(`${server.url}/ready`);
  checkEq(ready.status, 200, "still ready");
} finally {
  const { code } = await server.stop("SIGTERM");
  checkEq(code, 0, "server exits 0 after SIGTERM");
}
finish("server_bad_requests");
