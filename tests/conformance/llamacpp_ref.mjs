// llama.cpp reference run (through node-llama-cpp's CPU build) for model conformance tests.
//
//   node llamacpp_ref.mjs MODEL.gguf '[1, 403, 407]' N [--all-logits] [--kv f32|f16]
//
// Evaluates the prompt token ids as given (no BOS is added), then decodes N tokens
// greedily. Prints one JSON object on stdout:
//   {"ids": [N greedy ids], "logits": [n_vocab floats: logits after the last prompt token],
//    "all_logits": [[...] per prompt position]   (only with --all-logits)}
//
// Runs with threads: 1 (node-llama-cpp's default thread count busy-waits on small
// machines), flash attention off and, by default, an F32 KV cache
// (experimentalKvCacheKeyType/ValueType), so logits match an f32 engine to ~1e-5 rather
// than the ~1e-3..1e-2 of llama.cpp's default f16 cache / f16 flash attention.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function usage(message) {
  if (message) console.error(`error: ${message}`);
  console.error("usage: node llamacpp_ref.mjs MODEL.gguf '[prompt ids]' N [--all-logits] [--kv f32|f16]");
  process.exit(2);
}

const args = process.argv.slice(2);
const positional = [];
let allLogits = false;
let kvType = "F32";
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--all-logits") allLogits = true;
  else if (args[i] === "--kv") kvType = (args[++i] ?? "").toUpperCase();
  else positional.push(args[i]);
}
if (positional.length !== 3) usage();
const [modelPath, promptJson, nText] = positional;
let prompt;
try {
  prompt = JSON.parse(promptJson);
} catch (e) {
  usage(`prompt is not JSON: ${e.message}`);
}
if (!Array.isArray(prompt) || prompt.length === 0 || !prompt.every(Number.isInteger)) {
  usage("prompt must be a non-empty JSON array of token ids");
}
const nGenerate = Number.parseInt(nText, 10);
if (!(nGenerate >= 0)) usage("N must be a non-negative integer");
if (kvType !== "F32" && kvType !== "F16") usage("--kv must be f32 or f16");

// Logits of every vocabulary token, indexed by id (node-llama-cpp returns a Map sorted by value).
function logitsArray(map, nVocab) {
  const out = new Array(nVocab).fill(null);
  for (const [token, value] of map) out[token] = value;
  if (out.some((v) => v === null)) throw new Error("llama.cpp returned logits for only part of the vocabulary");
  return out;
}

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({
  contextSize: Math.max(64, prompt.length + nGenerate + 8),
  batchSize: Math.max(64, prompt.length),
  threads: 1,
  // llama.cpp's CPU flash attention works in f16 whatever the cache type; off, the
  // attention is f32 end to end (checked against a float64 numpy reference: ~1e-6).
  flashAttention: false,
  experimentalKvCacheKeyType: kvType,
  experimentalKvCacheValueType: kvType,
});
const sequence = context.getSequence();
const greedy = { temperature: 0 };

const input = prompt.map((token, index) => {
  const last = index === prompt.length - 1;
  if (!last && !allLogits) return token;
  return [token, { generateNext: { token: last, logits: true, options: greedy } }];
});
const results = await sequence.controlledEvaluate(input);
const last = results[prompt.length - 1];
if (!last || !last.next.logits) throw new Error("llama.cpp returned no logits for the last prompt token");
const n = last.next.logits.size;
const output = { ids: [], logits: logitsArray(last.next.logits, n) };
if (allLogits) output.all_logits = prompt.map((_, i) => logitsArray(results[i].next.logits, n));

let next = last.next.token;
for (let i = 0; i < nGenerate; i++) {
  if (next == null) throw new Error(`llama.cpp produced no token at step ${i}`);
  output.ids.push(next);
  if (i + 1 === nGenerate) break;
  const [r] = await sequence.controlledEvaluate([[next, { generateNext: { token: true, options: greedy } }]]);
  next = r?.next.token;
}

process.stdout.write(JSON.stringify(output) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
