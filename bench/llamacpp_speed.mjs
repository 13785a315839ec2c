// llama.cpp side of the speed benchmarks (node-llama-cpp's CPU build, pinned in
// tests/conformance/package.json): prompt processing and generation tokens/s for one
// GGUF at a given thread count, with llama.cpp's default settings otherwise.
//
//   node llamacpp_speed.mjs MODEL.gguf THREADS PROMPT_TOKENS GEN_TOKENS
// Prints {"prompt_tokens_per_s": x, "generated_tokens_per_s": y}. NLC_ROOT: another folder whose
// node_modules holds node-llama-cpp (gguf_bench.sh's overlay without AMX); NLC_LOG=1: llama.cpp's
// debug log on stderr (which CPU variant it loaded, whether it repacked weights for AMX).
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const lib = pathToFileURL(path.join(process.env.NLC_ROOT ?? path.join(here, "../tests/conformance"), "node_modules/node-llama-cpp/dist/index.js")).href;
const { getLlama, LlamaLogLevel } = await import(lib);

const [modelPath, threadsText, promptText, genText] = process.argv.slice(2);
const threads = Number(threadsText), nPrompt = Number(promptText), nGen = Number(genText);
const llama = await getLlama({ gpu: false, build: "never", logLevel: process.env.NLC_LOG ? LlamaLogLevel.debug : LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({ contextSize: nPrompt + nGen + 16, batchSize: Math.min(nPrompt, 512), threads });
const seq = context.getSequence();
// Pseudo-random prompt ids away from the special tokens (fixed, like Infera's side).
let s = 7;
const prompt = Array.from({ length: nPrompt }, () => { s = (s * 1103515245 + 12345) % 2147483648; return 300 + (s % 20000); });

let t0 = performance.now();
await seq.evaluateWithoutGeneratingNewTokens(prompt);
const pp = nPrompt / ((performance.now() - t0) / 1000);

let produced = 0;
t0 = performance.now();
let first = true, tFirst = 0;
for await (const token of seq.evaluate([prompt[prompt.length - 1]], { temperature: 0 })) {
  void token;
  if (first) { tFirst = performance.now(); first = false; }
  if (++produced >= nGen) break;
}
// The first token's time includes re-evaluating the last prompt token; count the rest.
const tg = (produced - 1) / ((performance.now() - tFirst) / 1000);
process.stdout.write(JSON.stringify({ prompt_tokens_per_s: pp, generated_tokens_per_s: tg }) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
