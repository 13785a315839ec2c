// llama.cpp speed on a GGUF (node-llama-cpp CPU build), for bench/quant_bench.sh.
//
//   node bench/quant_llamacpp.mjs MODEL.gguf THREADS PROMPT_TOKENS GEN_TOKENS
//
// Prints one JSON object: {"prompt_tokens_per_s": ..., "gen_tokens_per_s": ...}. The
// prompt is PROMPT_TOKENS copies of token 1000 (ids only; no tokenizer involved); decoding
// is greedy. Threads must be explicit (node-llama-cpp's default busy-waits on small machines).
// NLC_ROOT: another folder whose node_modules holds node-llama-cpp (bench/llama_overlay.sh).
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const lib = pathToFileURL(path.join(process.env.NLC_ROOT ?? path.join(here, "../tests/conformance"), "node_modules/node-llama-cpp/dist/index.js")).href;
const { getLlama, LlamaLogLevel } = await import(lib);

const [modelPath, threadsText, promptText, genText] = process.argv.slice(2);
if (!modelPath) {
  console.error("usage: node quant_llamacpp.mjs MODEL.gguf THREADS PROMPT_TOKENS GEN_TOKENS");
  process.exit(2);
}
const threads = Number(threadsText ?? 1), nPrompt = Number(promptText ?? 64), nGen = Number(genText ?? 32);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, gpuLayers: 0, useMmap: true });
const context = await model.createContext({ contextSize: nPrompt + nGen + 16, batchSize: nPrompt, threads });
const seq = context.getSequence();
const prompt = new Array(nPrompt).fill(1000);
prompt[0] = 1;

let t0 = performance.now();
let tPromptEnd = 0;
let n = 0;
for await (const token of seq.evaluate(prompt, { temperature: 0 })) {
  if (n === 0) tPromptEnd = performance.now();
  if (++n >= nGen) break;
}
const t1 = performance.now();
const promptS = (tPromptEnd - t0) / 1000;       // prompt eval + first token
const genS = (t1 - tPromptEnd) / 1000;          // the remaining nGen - 1 tokens
console.log(JSON.stringify({ prompt_tokens_per_s: nPrompt / promptS, gen_tokens_per_s: (nGen - 1) / genS }));
await context.dispose();
await model.dispose();
