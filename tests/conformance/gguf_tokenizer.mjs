// GGUF tokenizer conformance: Infera's tokenizer read from a GGUF file's tokenizer.ggml.*
// metadata must give llama.cpp's token ids (node-llama-cpp's model.tokenize, special-token
// text parsed, no BOS added) on the tokenizer test corpus, for both tokenizer kinds:
//   "llama" (SentencePiece BPE): stories260K.gguf (llama.cpp's own file; skipped when the
//     fixture is absent) and a generated Llama model converted by `infera convert`;
//   "gpt2" (byte-level BPE, tokenizer.ggml.pre "qwen2"): a generated Qwen3 model converted.
//
//   node gguf_tokenizer.mjs <infera-binary>
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const infera = path.resolve(process.argv[2] ?? path.join(repo, "build/infera"));
const python = fs.existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
const strings = JSON.parse(fs.readFileSync(path.join(here, "data", "tokenizer_strings.json"), "utf8"));

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "infera-gguf-tok-"));
process.on("exit", () => fs.rmSync(tmp, { recursive: true, force: true }));

function generated(name, args) {
  const dir = path.join(tmp, name);
  execFileSync(python, [path.join(repo, "tools/gen_model.py"), dir, ...args], { stdio: "ignore" });
  const gguf = path.join(tmp, `${name}.gguf`);
  execFileSync(infera, ["convert", dir, "--to", "gguf", gguf, "--type", "f16"], { stdio: "ignore" });
  return { name, gguf };
}

const cases = [
  generated("llama-spm", ["--arch", "llama", "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
    "--ffn", "64", "--vocab", "512", "--seed", "21"]),
  generated("qwen3-bpe", ["--arch", "qwen3", "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
    "--head-dim", "16", "--ffn", "64", "--vocab", "700", "--seed", "22"]),
];
const stories = path.resolve(repo, "../shared/models/stories260K.gguf");
if (fs.existsSync(stories)) cases.push({ name: "stories260K.gguf", gguf: stories });
else console.log(`note: fixture ${stories} not found (a plain clone has no ../shared/models), skipping that case`);

function runInfera(gguf, lines) {
  const result = spawnSync(infera, ["tokenize", "--tokenizer", gguf, "--jsonl", "--no-special"], {
    input: lines.map((l) => JSON.stringify(l) + "\n").join(""),
    maxBuffer: 256 * 1024 * 1024,
    encoding: "utf8",
  });
  if (result.status !== 0) throw new Error(`infera tokenize failed (${result.status}): ${result.stderr}`);
  return result.stdout.split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
let passed = 0, failed = 0;
const failures = [];
for (const c of cases) {
  const model = await llama.loadModel({ modelPath: c.gguf, gpuLayers: 0 });
  const ours = runInfera(c.gguf, strings);
  strings.forEach((s, i) => {
    const want = Array.from(model.tokenize(s, true));
    const got = ours[i];
    if (want.length === got.length && want.every((x, j) => x === got[j])) {
      passed++;
    } else {
      failed++;
      failures.push(`[${c.name}] ${JSON.stringify(s)}\n    llama.cpp ${JSON.stringify(want)}\n    infera    ${JSON.stringify(got)}`);
    }
  });
  await model.dispose();
}
await llama.dispose();
for (const f of failures.slice(0, 12)) console.log(f);
if (failures.length > 12) console.log(`... and ${failures.length - 12} more`);
console.log(`gguf tokenizer conformance: ${strings.length} strings x ${cases.length} GGUF files`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
