// What the llama.cpp conformance scripts (model_llamacpp.mjs, gguf_llamacpp.mjs) share: the
// case loop (name filter, scratch folder, ok / FAIL lines, exit status) and the comparison
// of one model against llama.cpp (llamacpp_ref.mjs) on one prompt: identical greedy
// continuations and the same top-1 at every prompt position, but for near ties where the
// caller allows them (NEAR_TIE_DIFF); the final-position max |logit difference| is measured.
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

// Two engines that agree up to the order of their float sums still part where a quantized
// activation lands on a rounding boundary: one engine rounds an int8 (or llama.cpp's f16 /
// bf16) activation up, the other down. On these random tiny models one such flip moved later
// logits by up to 0.2 (measured: Qwen3-MoE-shaped Q4_K_M files, llama.cpp's haswell and
// generic x86 variants against Infera: 0.07-0.2 over three seeds), and a greedy step whose
// top two logits lie closer than that can go either way. A step counts as such a near tie
// only when llama.cpp's logit of Infera's pick lies within the two engines' measured |logit
// difference| at that step of its own top-1, and that difference stays within the caller's
// bound (NEAR_TIE_DIFF for files whose activations are rounded; 0, no near ties, for f32
// files, where nothing is); at most kMaxNearTies per case. A wrong layout, norm or kernel
// moves the logits far more, at many positions.
export const NEAR_TIE_DIFF = 0.3;
const kMaxNearTies = 2;

function maxAbsDiff(a, b) {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
  return d;
}

// The logits `infera run --logits-file` wrote to `file`.
function readLogits(file) {
  const raw = fs.readFileSync(file);  // may be a view into Node's shared pool
  return new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length));
}

// Infera's logits after `ids` (a prefix run, no generation; `extra`: more flags).
function inferaLogits(model, ids, file, extra = []) {
  run(infera, ["run", "-m", model, "--prompt-ids", JSON.stringify(ids), "-n", "0", "--temp", "0", "--json", "-t", "1",
    "--logits-file", file, ...extra]);
  return readLogits(file);
}

// Infera's pick `got` against llama.cpp's logits `ref` at one position, `ours` Infera's
// logits there: null when it is llama.cpp's top-1, { nearTie } when it parts within a near
// tie (bound: the caller's), else a problem's text.
function pickCheck(ref, ours, got, bound, where) {
  const expect = argmax(ref);
  if (expect === got) return null;
  const diff = maxAbsDiff(ref, ours), gap = ref[expect] - ref[got];
  if (gap <= diff && diff <= bound) {
    return {
      nearTie: `${where}: llama.cpp ${expect}, infera ${got} ` +
        `(gap ${gap.toExponential(1)} within |diff| ${diff.toExponential(1)})`,
    };
  }
  return `top-1 differs ${where}: llama.cpp ${expect}, infera ${got} ` +
    `(llama.cpp's gap ${gap.toExponential(2)}, |diff| ${diff.toExponential(2)})`;
}

// Runs `prompt` through llama.cpp (the GGUF file `gguf`; or `ref`, its llamacppReference
// already taken) and Infera (`-m model`, a directory or the same file), `n` greedy tokens.
// Infera's all-position logits come from feeding the prompt prefixes. Where the greedy
// continuations part, at step k: Infera's pick there must part from llama.cpp's within a
// near tie (against Infera's logits over the shared prefix), and every later step is checked
// along llama.cpp's continuation (llama.cpp's logits over it as one batch; Infera fed the
// same prefix one token per forward, the decode path's one-row kernels): Infera's top-1 must
// be llama.cpp's or part from it within a near tie. `nearTieDiff`: the bound (0: none).
// Returns the problems found, the near ties, the final logits' max |diff|, llama.cpp's
// greedy ids and its reference run.
export function compareWithLlamacpp({ model, gguf, prompt, n, tmp, name, ref = llamacppReference(gguf, prompt, n),
  nearTieDiff = 0 }) {
  const logitsFile = path.join(tmp, `${name}.logits`);
  const ours = lastJsonLine(run(infera, ["run", "-m", model, "--prompt-ids", JSON.stringify(prompt), "-n", String(n),
    "--temp", "0", "--ignore-eos", "--json", "-t", "1", "--logits-file", logitsFile]));
  const ourLogits = readLogits(logitsFile);  // (after the whole prompt)
  const maxDiff = maxAbsDiff(ref.logits, ourLogits);
  const problems = [], nearTies = [];
  const note = (r) => {
    if (r === null) return;
    if (typeof r === "string") problems.push(r);
    else nearTies.push(r.nearTie);
  };
  for (let p = 1; p <= prompt.length; p++) {
    const logits = p === prompt.length ? ourLogits : inferaLogits(model, prompt.slice(0, p), logitsFile);
    note(pickCheck(ref.all_logits[p - 1], logits, argmax(logits), nearTieDiff, `after ${p} prompt tokens`));
  }
  const idsText = `\n  llama.cpp ${JSON.stringify(ref.ids)}\n  infera    ${JSON.stringify(ours.ids)}`;
  if (ours.ids.length !== ref.ids.length) {
    problems.push(`infera gave ${ours.ids.length} greedy ids, llama.cpp ${ref.ids.length}:${idsText}`);
  } else if (JSON.stringify(ref.ids) !== JSON.stringify(ours.ids)) {
    const first = ref.ids.findIndex((id, i) => id !== ours.ids[i]);
    const path_ = [...prompt, ...ref.ids.slice(0, n - 1)];
    const along = llamacppReference(gguf, path_, 0).all_logits;  // [i]: after path_[0..i]
    const shared = path_.slice(0, prompt.length + first);
    const parted = pickCheck(along[shared.length - 1], inferaLogits(model, shared, logitsFile), ours.ids[first],
      nearTieDiff, `at greedy step ${first + 1}, where the greedy ids part`);
    // (null: llama.cpp's logits over its continuation as one batch pick Infera's token there,
    // its own greedy run the other: a near tie within llama.cpp)
    note(parted ?? { nearTie: `greedy step ${first + 1}: llama.cpp ${ref.ids[first]}, infera ${ours.ids[first]}, ` +
      `which llama.cpp's logits over its continuation as one batch pick too` });
    for (let step = first + 1; step < n; step++) {
      const ids = path_.slice(0, prompt.length + step);
      const logits = inferaLogits(model, ids, logitsFile, ["--prefill-chunk", "1"]);
      note(pickCheck(along[ids.length - 1], logits, argmax(logits), nearTieDiff,
        `at greedy step ${step + 1} of llama.cpp's continuation`));
    }
    if (problems.length > 0) problems.push(`(greedy ids:${idsText})`);
  }
  if (nearTies.length > kMaxNearTies) {
    problems.push(`${nearTies.length} near ties, more than ${kMaxNearTies}:\n  ${nearTies.join("\n  ")}`);
  }
  return { problems, nearTies, maxDiff, refIds: ref.ids, ref };
}

// Runs every case whose name contains the script's filter argument (argv[3]): `check(c,
// tmp)` returns null (skipped) or { problems, nearTies, maxDiff, positions }. Prints one line per
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
      if (r.problems.length === 0 && r.nearTies.length > 0) {
        passed++;
        console.log(`ok   ${c.name}: ${n} greedy tokens and top-1 at ${r.positions} prompt positions equal but for near ties ` +
          `(final logits max |diff| ${diff}):\n  ${r.nearTies.join("\n  ")}`);
      } else if (r.problems.length === 0) {
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
