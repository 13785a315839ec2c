// GGUF input conformance against llama.cpp (node-llama-cpp, CPU build): Infera and llama.cpp
// load the SAME .gguf file (`infera run -m FILE.gguf`). Random-weight tiny models from
// tools/gen_model.py are converted with `infera convert --to gguf` into several tensor types
// (F32, F16, Q8_0, Q4_0: the block types are computed with int8 activations as llama.cpp
// does), or from F16 by llama.cpp's own llama_model_quantize into the K-quant mixes users
// hold (Q4_K_M, Q5_K_M, Q6_K, IQ4_XS: llama_quantize.c, built here with the C compiler;
// those cases are skipped with a note when there is none), plus llama.cpp's own stories260K.gguf. Required per file: identical greedy
// continuations (32 tokens) and the same top-1 at every prompt position; the final-position
// max |logit difference| is printed per file.
//
//   node gguf_llamacpp.mjs <infera-binary> [name-filter]
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const infera = path.resolve(process.argv[2] ?? path.join(repo, "build/infera"));
const python = fs.existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
const N = 32;

const models = {
  llama: ["--arch", "llama", "--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "256",
    "--vocab", "512", "--dtype", "f32", "--seed", "11"],
  qwen3: ["--arch", "qwen3", "--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
    "--ffn", "256", "--vocab", "640", "--dtype", "f32", "--seed", "12"],
  qwen3moe: ["--arch", "qwen3_moe", "--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2",
    "--head-dim", "32", "--experts", "8", "--experts-per-tok", "2", "--moe-ffn", "64", "--vocab", "512", "--dtype", "f32",
    "--seed", "13"],
};
// Widths that are whole 256-weight super-blocks, so the K-quant mixes keep their K types.
models.llama256 = ["--arch", "llama", "--hidden", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "512",
  "--vocab", "512", "--dtype", "f32", "--seed", "14"];
models.qwen3moe256 = ["--arch", "qwen3_moe", "--hidden", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
  "--head-dim", "64", "--experts", "8", "--experts-per-tok", "2", "--moe-ffn", "256", "--vocab", "512", "--dtype", "f32",
  "--seed", "15"];
// llama.cpp's llama_ftype numbers.
const llamaFtypes = { q4_k_m: 15, q5_k_m: 17, q6_k: 18, iq4_xs: 30 };
const cases = [
  { model: "llama", type: "f32" }, { model: "llama", type: "f16" }, { model: "llama", type: "q8_0" },
  { model: "llama", type: "q4_0" }, { model: "qwen3", type: "bf16" }, { model: "qwen3", type: "q8_0" },
  { model: "qwen3moe", type: "q8_0" }, { model: "qwen3moe", type: "q4_0" },
  { model: "llama256", type: "q4_k_m" }, { model: "llama256", type: "q6_k" }, { model: "llama256", type: "q5_k_m" },
  { model: "llama256", type: "iq4_xs" }, { model: "qwen3moe256", type: "q4_k_m" },
].map((c) => ({ ...c, name: `${c.model}-${c.type}` }));
const stories = path.resolve(repo, "../shared/models/stories260K.gguf");
if (fs.existsSync(stories)) cases.push({ name: "stories260K.gguf", gguf: stories, vocab: 512 });
else console.log(`note: fixture ${stories} not found (a plain clone has no ../shared/models), skipping that case`);

function run(cmd, args) {
  return execFileSync(cmd, args, { encoding: "utf8", maxBuffer: 64 << 20, stdio: ["ignore", "pipe", "pipe"] });
}
const lastJsonLine = (text) => JSON.parse(text.trim().split("\n").pop());
function argmax(a) {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "infera-gguf-conf-"));
let passed = 0, failed = 0;
// llama_quantize.c against the libllama node-llama-cpp loads; null when it cannot be built.
let quantizer;
function llamaQuantizer() {
  if (quantizer !== undefined) return quantizer;
  const lib = path.join(here, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so");
  const bin = path.join(tmp, "llama_quantize");
  try {
    if (!fs.existsSync(lib)) throw new Error(`${lib} not found`);
    run("cc", ["-O1", "-o", bin, path.join(here, "llama_quantize.c"), "-ldl"]);
    quantizer = { bin, lib };
  } catch (e) {
    console.log(`note: cannot build llama_quantize.c (${e.message.split("\n")[0]}): skipping the K-quant cases`);
    quantizer = null;
  }
  return quantizer;
}
try {
  const filter = process.argv[3] ?? "";
  for (const c of cases.filter((c) => c.name.includes(filter))) {
    let gguf = c.gguf, vocab = c.vocab;
    if (!gguf) {
      const dir = path.join(tmp, c.model);
      if (!fs.existsSync(dir)) run(python, [path.join(repo, "tools/gen_model.py"), dir, ...models[c.model]]);
      gguf = path.join(tmp, `${c.name}.gguf`);
      const ftype = llamaFtypes[c.type];
      if (ftype === undefined) {
        run(infera, ["convert", dir, "--to", "gguf", gguf, "--type", c.type]);
      } else {
        const q = llamaQuantizer();
        if (!q) continue;
        const f16 = path.join(tmp, `${c.model}-f16-for-quantize.gguf`);
        if (!fs.existsSync(f16)) run(infera, ["convert", dir, "--to", "gguf", f16, "--type", "f16"]);
        run(q.bin, [q.lib, f16, gguf, String(ftype)]);
      }
      vocab = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8")).vocab_size;
    }
    let s = 4242 + c.name.length;
    const prompt = Array.from({ length: 12 }, () => {
      s = (s * 1103515245 + 12345) % 2147483648;
      return 3 + (s % (vocab - 3));
    });
    const ref = lastJsonLine(run("node", [path.join(here, "llamacpp_ref.mjs"), gguf, JSON.stringify(prompt), String(N), "--all-logits"]));
    const logitsFile = path.join(tmp, `${c.name}.logits`);
    const ours = lastJsonLine(run(infera, ["run", "-m", gguf, "--prompt-ids", JSON.stringify(prompt), "-n", String(N),
      "--temp", "0", "--ignore-eos", "--json", "-t", "1", "--logits-file", logitsFile]));
    const raw = fs.readFileSync(logitsFile);
    const ourLogits = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length));
    let maxDiff = 0;
    for (let i = 0; i < ref.logits.length; i++) maxDiff = Math.max(maxDiff, Math.abs(ref.logits[i] - ourLogits[i]));
    const problems = [];
    if (JSON.stringify(ref.ids) !== JSON.stringify(ours.ids)) {
      problems.push(`greedy ids differ:\n  llama.cpp ${JSON.stringify(ref.ids)}\n  infera    ${JSON.stringify(ours.ids)}`);
    }
    for (let p = 1; p <= prompt.length; p++) {
      const expect = argmax(ref.all_logits[p - 1]);
      const got = lastJsonLine(run(infera, ["run", "-m", gguf, "--prompt-ids", JSON.stringify(prompt.slice(0, p)), "-n", "1",
        "--temp", "0", "--ignore-eos", "--json", "-t", "1"])).ids[0];
      if (got !== expect) problems.push(`top-1 differs after ${p} prompt tokens: llama.cpp ${expect}, infera ${got}`);
    }
    if (problems.length === 0) {
      passed++;
      console.log(`ok   ${c.name}: ${N} greedy tokens identical, top-1 equal at ${prompt.length} positions, final logits max |diff| ${maxDiff.toExponential(2)}`);
    } else {
      failed++;
      console.log(`FAIL ${c.name} (final logits max |diff| ${maxDiff.toExponential(2)}):\n  ${problems.join("\n  ")}`);
    }
  }
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
