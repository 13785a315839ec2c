// The official `openai` npm client against `infera serve` with the real stories260K
// model (ChatML template from data/): chat, chat streaming, completions, models list,
// log-probabilities (chat, streamed through the client's stream helper, legacy), a
// tool-call round trip (assistant tool_calls + tool result accepted and rendered), and
// HTTP errors surfacing as the client's typed errors.
//
//   node server_openai.mjs <path-to-infera-binary>
import OpenAI from "openai";

import { chatmlTemplate, check, checkEq, finish, requireFixture, startServer, storiesDir } from "./server_common.mjs";

requireFixture(storiesDir);

const key = "conformance-key-0123456789";
const server = await startServer(["-m", storiesDir, "--name", "stories", "--chat-template", chatmlTemplate, "--api-key", key]);
const client = new OpenAI({ apiKey: key, baseURL: `${server.url}/v1`, maxRetries: 0 });

try {
  // Models list.
  const models = await client.models.list();
  checkEq(models.data.map((m) => m.id), ["stories"], "models.list ids");
  checkEq(models.data[0].object, "model", "model object");

  // Completions: greedy continuation of the TinyStories opening (llama2.c's published text).
  const completion = await client.completions.create({ model: "stories", prompt: "Once upon a time", max_tokens: 20, temperature: 0 });
  check(completion.choices[0].text.startsWith(", there was a little girl named Lily"), `completion text: ${JSON.stringify(completion.choices[0].text)}`);
  checkEq(completion.choices[0].finish_reason, "length", "completion finish_reason");
  checkEq(completion.usage.completion_tokens, 20, "completion usage.completion_tokens");
  check(completion.usage.prompt_tokens > 0, "completion usage.prompt_tokens");

  // Chat, then the same request streamed: identical text (greedy).
  const messages = [
    { role: "system", content: "You tell short stories." },
    { role: "user", content: "Tell me about a cat." },
  ];
  const chat = await client.chat.completions.create({ model: "stories", messages, max_tokens: 24, temperature: 0 });
  const text = chat.choices[0].message.content;
  check(typeof text === "string" && text.length > 0, "chat content is text");
  checkEq(chat.choices[0].message.role, "assistant", "chat role");
  check(["stop", "length"].includes(chat.choices[0].finish_reason), "chat finish_reason");
  checkEq(chat.object, "chat.completion", "chat object");

  const stream = await client.chat.completions.create({
    model: "stories", messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let streamed = "";
  let finishReason = null;
  let usage = null;
  let chunks = 0;
  for await (const part of stream) {
    ++chunks;
    if (part.usage) usage = part.usage;
    for (const c of part.choices) {
      streamed += c.delta?.content ?? "";
      if (c.finish_reason) finishReason = c.finish_reason;
    }
  }
  checkEq(streamed, text, "streamed chat equals the non-streamed chat");
  checkEq(finishReason, chat.choices[0].finish_reason, "streamed finish_reason");
  checkEq(usage?.completion_tokens, chat.usage.completion_tokens, "streamed usage");
  check(chunks > 3, "several chunks streamed");

  // Completions streaming.
  const cstream = await client.completions.create({ model: "stories", prompt: "Once upon a time", max_tokens: 20, temperature: 0, stream: true });
  let ctext = "";
  for await (const part of cstream) ctext += part.choices[0]?.text ?? "";
  checkEq(ctext, completion.choices[0].text, "streamed completion equals the non-streamed one");

  // Tool-call round trip: the client sends tools, then its tool result after an assistant
  // turn that called the tool; the server must render both and answer normally.
  const tools = [{
    type: "function",
    function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  }];
  const first = await client.chat.completions.create({ model: "stories", messages: [{ role: "user", content: "Weather in Paris?" }], tools, max_tokens: 8, temperature: 0 });
  check(["stop", "length", "tool_calls"].includes(first.choices[0].finish_reason), "chat with tools answers");
  const second = await client.chat.completions.create({
    model: "stories",
    tools,
    max_tokens: 8,
    temperature: 0,
    messages: [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) } }] },
      { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" },
    ],
  });
  check(typeof second.choices[0].message.content === "string", "tool result turn answered");

  // Log-probabilities (chat): OpenAI's shape, the tokens spell the text, greedy picks the
  // top alternative, and the client's stream helper assembles the same list from chunks.
  const lpChat = await client.chat.completions.create({ model: "stories", messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lpContent = lpChat.choices[0].logprobs?.content;
  check(Array.isArray(lpContent) && lpContent.length > 0, "chat logprobs.content is a list");
  checkEq(lpChat.choices[0].logprobs.refusal, null, "chat logprobs.refusal");
  const lpText = lpChat.choices[0].message.content;
  let joined = "";
  for (const [i, e] of lpContent.entries()) {
    checkEq(Object.keys(e).sort(), ["bytes", "logprob", "token", "top_logprobs"], `logprobs entry ${i} keys`);
    check(typeof e.token === "string" && typeof e.logprob === "number" && e.logprob <= 0, `logprobs entry ${i}: token and logprob`);
    checkEq(Buffer.from(e.bytes).toString("utf8"), e.token, `logprobs entry ${i}: bytes spell the token`);
    checkEq(e.top_logprobs.length, 3, `logprobs entry ${i}: 3 alternatives`);
    for (const t of e.top_logprobs) checkEq(Object.keys(t).sort(), ["bytes", "logprob", "token"], `alternative keys`);
    for (let k = 1; k < 3; ++k) check(e.top_logprobs[k - 1].logprob >= e.top_logprobs[k].logprob, `logprobs entry ${i}: alternatives sorted`);
    checkEq(e.top_logprobs[0].token, e.token, `logprobs entry ${i}: greedy takes the most likely token`);
    check(e.top_logprobs.reduce((sum, t) => sum + Math.exp(t.logprob), 0) <= 1 + 1e-5, `logprobs entry ${i}: probabilities sum to at most 1`);
    joined += e.token;
  }
  check(joined.endsWith(lpText) && joined.length - lpText.length <= 1, `logprobs tokens spell the text: ${JSON.stringify(joined)} vs ${JSON.stringify(lpText)}`);

  const lpStream = client.chat.completions.stream({ model: "stories", messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lpFinal = await lpStream.finalChatCompletion();
  const streamedContent = lpFinal.choices[0].logprobs?.content ?? [];
  checkEq(lpFinal.choices[0].message.content, lpText, "streamed logprobs request: same text");
  checkEq(streamedContent.map((e) => e.token), lpContent.map((e) => e.token), "streamed logprobs: same tokens");
  check(streamedContent.every((e, i) => Math.abs(e.logprob - lpContent[i].logprob) < 1e-4), "streamed logprobs: same values");

  // Log-probabilities (legacy completions).
  const lpCmpl = await client.completions.create({ model: "stories", prompt: "Once upon a time", max_tokens: 10, temperature: 0, logprobs: 2 });
  const legacy = lpCmpl.choices[0].logprobs;
  checkEq(Object.keys(legacy).sort(), ["text_offset", "token_logprobs", "tokens", "top_logprobs"], "legacy logprobs keys");
  checkEq(legacy.tokens.length, 10, "legacy logprobs: one entry per token");
  for (const k of ["token_logprobs", "top_logprobs", "text_offset"]) checkEq(legacy[k].length, 10, `legacy ${k} length`);
  checkEq(legacy.tokens.join("").trimStart(), lpCmpl.choices[0].text.trimStart(), "legacy tokens spell the text");
  for (let i = 0; i < 10; ++i) {
    const top = legacy.top_logprobs[i];
    check(Object.keys(top).length >= 1 && Object.keys(top).length <= 3, `legacy top_logprobs[${i}] holds 2 (+ the sampled) tokens`);
    checkEq(top[legacy.tokens[i]], legacy.token_logprobs[i], `legacy top_logprobs[${i}] has the sampled token`);
    if (i > 0) checkEq(legacy.text_offset[i], legacy.text_offset[i - 1] + [...legacy.tokens[i - 1]].length, `legacy text_offset[${i}]`);
  }
  // Scoring a text (echo + logprobs, max_tokens 0: how evaluation harnesses ask for a
  // prompt's log-likelihood): the prompt back, its first token unscored, then the others.
  const scored = await client.completions.create({ model: "stories", prompt: "Once upon a time", max_tokens: 0, echo: true, logprobs: 1 });
  const scoredLp = scored.choices[0].logprobs;
  checkEq(scored.choices[0].text, "Once upon a time", "echo, max_tokens 0: the prompt back");
  checkEq(scored.choices[0].finish_reason, "length", "echo, max_tokens 0: finish_reason");
  checkEq(scored.usage.completion_tokens, 0, "echo, max_tokens 0: no completion tokens");
  checkEq(scoredLp.tokens.length, scored.usage.prompt_tokens, "echo logprobs: one entry per prompt token");
  checkEq(scoredLp.token_logprobs[0], null, "echo logprobs: the first prompt token is unscored");
  checkEq(scoredLp.top_logprobs[0], null, "echo logprobs: no alternatives for the first token");
  for (let i = 1; i < scoredLp.tokens.length; ++i) {
    check(typeof scoredLp.token_logprobs[i] === "number" && scoredLp.token_logprobs[i] <= 0, `echo logprobs[${i}] is a log-probability`);
    checkEq(scoredLp.top_logprobs[i][scoredLp.tokens[i]], scoredLp.token_logprobs[i], `echo top_logprobs[${i}] has the prompt token`);
    checkEq(scoredLp.text_offset[i], scoredLp.text_offset[i - 1] + [...scoredLp.tokens[i - 1]].length, `echo text_offset[${i}]`);
  }
  // With a completion: the prompt's entries, then the same entries as without echo.
  const echoed = await client.completions.create({ model: "stories", prompt: "Once upon a time", max_tokens: 10, temperature: 0, logprobs: 2, echo: true });
  const echoedLp = echoed.choices[0].logprobs;
  const nPrompt = scoredLp.tokens.length;
  checkEq(echoed.choices[0].text, "Once upon a time" + lpCmpl.choices[0].text, "echo: prompt then completion");
  checkEq(echoedLp.tokens, [...scoredLp.tokens, ...legacy.tokens], "echo logprobs: prompt tokens then completion tokens");
  check(echoedLp.token_logprobs.slice(nPrompt).every((v, i) => Math.abs(v - legacy.token_logprobs[i]) < 1e-4), "echo logprobs: completion values as without echo");
  check(echoedLp.token_logprobs.slice(1, nPrompt).every((v, i) => Math.abs(v - scoredLp.token_logprobs[i + 1]) < 1e-4), "echo logprobs: prompt values as with max_tokens 0");

  // vLLM's prompt_logprobs extension passes through the client as an extra body field.
  const vllmScored = await client.completions.create({ model: "stories", prompt: "Once upon a time", max_tokens: 1, prompt_logprobs: 1 });
  const pl = vllmScored.choices[0].prompt_logprobs;
  check(Array.isArray(pl) && pl.length === vllmScored.usage.prompt_tokens && pl[0] === null, "prompt_logprobs: one entry per prompt token, the first null");
  for (let i = 1; i < (pl?.length ?? 0); ++i) {
    const entries = Object.values(pl[i]);
    check(entries.length >= 1 && entries.length <= 2 && entries.every((e) => e.logprob <= 0 && e.rank >= 1 && typeof e.decoded_token === "string"),
      `prompt_logprobs[${i}]: {logprob, rank, decoded_token} of the prompt token and 1 alternative`);
    check(Math.abs(Object.values(pl[i]).find((e) => e.decoded_token === scoredLp.tokens[i])?.logprob - scoredLp.token_logprobs[i]) < 1e-4,
      `prompt_logprobs[${i}] agrees with echo's`);
  }

  await (async () => {
    try {
      await client.chat.completions.create({ model: "stories", messages, logprobs: true, top_logprobs: 21 });
      check(false, "top_logprobs 21: no error");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError, `top_logprobs 21: BadRequestError, got ${e?.constructor?.name}`);
      checkEq(e.param, "top_logprobs", "top_logprobs 21: param");
    }
  })();

  // Errors surface as the client's typed errors.
  const expectError = async (what, cls, status, fn) => {
    try {
      await fn();
      check(false, `${what}: no error`);
    } catch (e) {
      check(e instanceof cls, `${what}: expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
      checkEq(e.status, status, `${what}: status`);
      check(typeof e.error?.message === "string" || typeof e.message === "string", `${what}: message`);
    }
  };
  await expectError("unknown model", OpenAI.NotFoundError, 404, () => client.chat.completions.create({ model: "nope", messages }));
  await expectError("max_tokens over the limit", OpenAI.BadRequestError, 400, () =>
    client.chat.completions.create({ model: "stories", messages, max_tokens: 100000 }));
  await expectError("bad temperature", OpenAI.BadRequestError, 400, () =>
    client.chat.completions.create({ model: "stories", messages, temperature: 7 }));
  await expectError("empty messages", OpenAI.BadRequestError, 400, () => client.chat.completions.create({ model: "stories", messages: [] }));
  const wrongKey = new OpenAI({ apiKey: "wrong-key-000000", baseURL: `${server.url}/v1`, maxRetries: 0 });
  await expectError("wrong key", OpenAI.AuthenticationError, 401, () => wrongKey.models.list());
  await expectError("wrong key on chat", OpenAI.AuthenticationError, 401, () => wrongKey.chat.completions.create({ model: "stories", messages }));
} finally {
  const { code } = await server.stop("SIGTERM");
  checkEq(code, 0, "server exits 0 after SIGTERM");
}
finish("server_openai");
