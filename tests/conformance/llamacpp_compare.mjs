// What the llama.cpp conformance scripts (model_llamacpp.mjs, gguf_llamacpp.mjs) share: the
// case loop (name filter, scratch folder, ok / FAIL lines, exit status) and the comparison
// of one model against llama.cpp (llamacpp_ref.mjs) on one prompt: identical greedy
// continuations and the same top-1 at every prompt position; the final-position max
// |logit difference| is measured.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, "../..");
export const infera = path.resolve(process.argv[2] ?? path.join(repo, "build/infera"));
export const python = fs.existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";

export function run(cmd, args) {
  return execFileSync(cmd, args, { encoding: "utf8", maxBuffer: 64 << 20, stdio: ["ignore", "pipe", "pipe"] });
}

// llama_quantize.c built against the libllama node-llama-cpp loads ({ bin, lib }); null (with
// a note) when it cannot be built. Built once per process, into `tmp`.
let quantizer;
export function llamaQuantizer(tmp) {
  if (quantizer !== undefined) return quantizer;
  const lib = path.join(here, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so");
  const bin = path.join(tmp, "llama_quantize");
  try {
    if (!fs.existsSync(lib)) throw new Error(`${lib} not found`);
    run("cc", ["-O1", "-o", bin, path.join(here, "llama_quantize.c"), "-ldl"]);
    quantizer = { bin, lib };
  } catch (e) {
    console.log(`note: cannot build llama_quantize.c (${e.message.split("\n")[0]}): skipping the cases that need it`);
    quantizer = null;
  }
  return quantizer;
}

export const lastJsonLine = (text) => JSON.parse(text.trim().split("\n").pop());

function argmax(a) {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

// A fixed pseudo-random prompt of `length` ids in [3, vocab) (not special tokens).
export function promptIds(seed, length, vocab) {
  let s = seed;
  return Array.from({ length }, () => {
    s = (s * 1103515245 + 12345) % 2147483648;
    return 3 + (s % (vocab - 3));
  });
}

// llama.cpp's run of `prompt` on the GGUF file `gguf`: `n` greedy ids, the final logits
// and the logits of every prompt position.
export function llamacppReference(gguf, prompt, n) {
  return lastJsonLine(run("node", [path.join(here, "llamacpp_ref.mjs"), gguf, JSON.stringify(prompt), String(n),
    "--all-logits"]));
}

// Runs `prompt` through llama.cpp (the GGUF file `gguf`; or `ref`, its llamacppReference
// already taken) and Infera (`-m model`, a directory or the same file), `n` greedy tokens.
// Infera's all-position top-1 comes from feeding the prompt prefixes. Returns the problems
// found, the final logits' max |diff|, llama.cpp's greedy ids and its reference run.
export function compareWithLlamacpp({ model, gguf, prompt, n, tmp, name, ref = llamacppReference(gguf, prompt, n) }) {
  const logitsFile = path.join(tmp, `${name}.logits`);
  const ours = lastJsonLine(run(infera, ["run", "-m", model, "--prompt-ids", JSON.stringify(prompt), "-n", String(n),
    "--temp", "0", "--ignore-eos", "--json", "-t", "1", "--logits-file", logitsFile]));
  const raw = fs.readFileSync(logitsFile);  // may be a view into Node's shared pool
  const ourLogits = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length));
  let maxDiff = 0;
  for (let i = 0; i < ref.logits.length; i++) maxDiff = Math.max(maxDiff, Math.abs(ref.logits[i] - ourLogits[i]));
  const problems = [];
  if (JSON.stringify(ref.ids) !== JSON.stringify(ours.ids)) {
    problems.push(`greedy ids differ:\n  llama.cpp ${JSON.stringify(ref.ids)}\n  infera    ${JSON.stringify(ours.ids)}`);
  }
  for (let p = 1; p <= prompt.length; p++) {
    const expect = argmax(ref.all_logits[p - 1]);
    const got = lastJsonLine(run(infera, ["run", "-m", model, "--prompt-ids", JSON.stringify(prompt.slice(0, p)), "-n",
      "1", "--temp", "0", "--ignore-eos", "--json", "-t", "1"])).ids[0];
    if (got !== expect) problems.push(`top-1 differs after ${p} prompt tokens: llama.cpp ${expect}, infera ${got}`);
  }
  return { problems, maxDiff, refIds: ref.ids, ref };
}

// Runs every case whose name contains the script's filter argument (argv[3]): `check(c,
// tmp)` returns null (skipped) or { problems, maxDiff, positions }. Prints one line per
// case and a total, removes the scratch folder and exits 0 when nothing failed.
export function runCases(cases, tmpPrefix, n, check) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), tmpPrefix));
  let passed = 0, failed = 0;
  try {
    const filter = process.argv[3] ?? "";
    for (const c of cases.filter((c) => c.name.includes(filter))) {
      const r = check(c, tmp);
      if (!r) continue;
      const diff = r.maxDiff.toExponential(2);
      if (r.problems.length === 0) {
        passed++;
        console.log(`ok   ${c.name}: ${n} greedy tokens identical, top-1 equal at ${r.positions} positions, final logits max |diff| ${diff}`);
      } else {
        failed++;
        console.log(`FAIL ${c.name} (final logits max |diff| ${diff}):\n  ${r.problems.join("\n  ")}`);
      }
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}
