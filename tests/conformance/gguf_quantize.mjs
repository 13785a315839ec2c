// `infera convert --type <mix>` against llama.cpp's own llama-quantize (llama_model_quantize
// from the libllama node-llama-cpp ships, driven by llama_quantize.c): random-weight tiny
// models from tools/gen_model.py, one per architecture the converter writes, with widths
// that exercise the fallbacks (rows not whole 256-blocks, rows not whole 32-blocks, tied
// embeddings, 8 experts). For every mix, `infera convert --type X` straight from the
// Hugging Face directory must write the same tensors, with the same types, shapes and bytes,
// as llama_model_quantize applied to `infera convert --type f32` of the same directory; and
// the same again with an importance matrix (`--imatrix FILE.gguf` for Infera, the same
// values handed to llama_model_quantize), and with the importance matrix Infera computes
// from calibration text (`infera imatrix` writes the file llama_model_quantize gets, as
// llama-quantize reads it; `infera convert --calib` computes it on the fly).
//
//   node gguf_quantize.mjs <infera-binary> [name-filter]
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import { infera, llamaQuantizer, python, repo, run } from "./llamacpp_compare.mjs";

const models = {
  // 8 layers (every use_more_bits case), GQA 4, ffn 320: ffn_down rows of 320 (not 256-blocks).
  llama: ["--arch", "llama", "--hidden", "256", "--layers", "8", "--heads", "4", "--kv-heads", "1", "--head-dim",
    "64", "--ffn", "320", "--vocab", "512", "--seed", "21"],
  // Tied embeddings of width 96 (the output type falls back to Q8_0), ffn 200 (F16 fallback).
  qwen3: ["--arch", "qwen3", "--hidden", "96", "--layers", "3", "--heads", "2", "--kv-heads", "1", "--head-dim", "48",
    "--ffn", "200", "--vocab", "640", "--tie", "--seed", "22"],
  // 8 experts (attn_v / attn_k Q8_0, attn_output Q5_K), expert rows of 96.
  qwen3moe: ["--arch", "qwen3_moe", "--hidden", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
    "--head-dim", "64", "--experts", "8", "--experts-per-tok", "2", "--moe-ffn", "96", "--vocab", "512", "--seed", "23"],
  qwen35: ["--arch", "qwen3_5", "--hidden", "256", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim",
    "64", "--ffn", "512", "--vocab", "512", "--seed", "24"],
  qwen35moe: ["--arch", "qwen3_5_moe", "--hidden", "256", "--layers", "4", "--heads", "4", "--kv-heads", "2",
    "--head-dim", "64", "--experts", "4", "--moe-ffn", "256", "--shared-ffn", "128", "--vocab", "512", "--seed", "25"],
  // Qwen3-Next: attn_qkv / attn_gate / ssm_ba from the fused projections, experts per expert.
  qwen3next: ["--arch", "qwen3_next", "--hidden", "256", "--layers", "4", "--heads", "4", "--kv-heads", "2",
    "--head-dim", "64", "--lin-k-heads", "2", "--lin-v-heads", "4", "--lin-dk", "64", "--lin-dv", "64", "--experts", "4",
    "--moe-ffn", "256", "--shared-ffn", "128", "--vocab", "512", "--seed", "28"],
  deepseek2: ["--arch", "deepseek_v3", "--hidden", "256", "--layers", "3", "--heads", "4", "--experts", "4",
    "--moe-ffn", "256", "--q-lora-rank", "64", "--kv-lora-rank", "64", "--qk-nope-dim", "32", "--qk-rope-dim", "32",
    "--v-head-dim", "32", "--vocab", "512", "--seed", "26"],
  deepseek32: ["--arch", "deepseek_v32", "--hidden", "256", "--layers", "2", "--heads", "4", "--experts", "4",
    "--moe-ffn", "256", "--q-lora-rank", "64", "--kv-lora-rank", "64", "--qk-nope-dim", "32", "--qk-rope-dim", "32",
    "--v-head-dim", "32", "--index-heads", "2", "--index-head-dim", "64", "--vocab", "512", "--seed", "27"],
};
// llama.cpp's llama_ftype numbers; q4_0 is llama-quantize --pure Q4_0 (what it wrote before the mixes).
const ftypes = { q4_0: "2p", q4_1: 3, q8_0: 7, q5_0: 8, q5_1: 9, q4_k_s: 14, q4_k_m: 15, q5_k_s: 16, q5_k_m: 17,
  q6_k: 18, iq4_nl: 25, iq4_xs: 30 };
// Every mix on the llama model (every quantizer, every fallback); the rules that differ by
// architecture (tied output, experts, attn_qkv, MLA's attn_k_b / attn_v_b) on the others.
const typesOf = { llama: Object.keys(ftypes), qwen3: ["q8_0", "q4_k_m", "iq4_xs"], qwen3moe: ["q4_k_m", "iq4_xs"],
  qwen3next: ["q4_k_m", "q6_k"], deepseek2: ["q4_k_m", "iq4_xs"] };
const cases = [];
for (const model of Object.keys(models)) {
  for (const type of typesOf[model] ?? ["q4_k_m"]) cases.push({ model, type, name: `${model}-${type}` });
}
// Every weighted quantizer: Q4_0 (and Q5_0, the Q4_K fallback), Q5_1 (Q4_1's too), Q4_K
// with Q6_K, Q5_K, IQ4_XS with IQ4_NL; and per-expert importance rows.
for (const type of ["q4_0", "q5_1", "q4_k_m", "q5_k_s", "iq4_xs"]) {
  cases.push({ model: "llama", type, imatrix: true, name: `llama-${type}-imatrix` });
}
cases.push({ model: "qwen3moe", type: "q4_k_m", imatrix: true, name: "qwen3moe-q4_k_m-imatrix" });
// Importance from Infera's own calibration: dense, and per expert from the routed tokens.
cases.push({ model: "llama", type: "q4_k_m", calib: true, name: "llama-q4_k_m-calib" });
cases.push({ model: "qwen3moe", type: "q4_k_m", calib: true, name: "qwen3moe-q4_k_m-calib" });
// The same importance values from a legacy .dat file.
cases.push({ model: "llama", type: "q4_k_m", imatrix: true, dat: true, name: "llama-q4_k_m-imatrix-dat" });

// ---- GGUF files: just enough to read tensors and to write an imatrix ----

const TYPE = { 0: ["F32", 1, 4], 1: ["F16", 1, 2], 2: ["Q4_0", 32, 18], 3: ["Q4_1", 32, 20], 6: ["Q5_0", 32, 22],
  7: ["Q5_1", 32, 24], 8: ["Q8_0", 32, 34], 12: ["Q4_K", 256, 144], 13: ["Q5_K", 256, 176], 14: ["Q6_K", 256, 210],
  20: ["IQ4_NL", 32, 18], 23: ["IQ4_XS", 256, 136], 30: ["BF16", 1, 2] };
const SCALAR = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };

// name -> { type, ne, bytes }
function readGguf(file) {
  const b = fs.readFileSync(file);
  let pos = 0;
  const u32 = () => { const v = b.readUInt32LE(pos); pos += 4; return v; };
  const u64 = () => { const v = Number(b.readBigUInt64LE(pos)); pos += 8; return v; };
  const str = () => { const n = u64(); const s = b.toString("utf8", pos, pos + n); pos += n; return s; };
  const skipValue = (t) => {
    if (t === 8) str();
    else if (t === 9) {
      const et = u32(), n = u64();
      for (let i = 0; i < n; i++) skipValue(et);
    } else pos += SCALAR[t];
  };
  if (b.toString("latin1", 0, 4) !== "GGUF") throw new Error(`${file}: not a GGUF file`);
  pos = 4;
  u32();
  const nTensors = u64(), nKv = u64();
  let alignment = 32;
  for (let i = 0; i < nKv; i++) {
    const key = str(), t = u32();
    if (key === "general.alignment") alignment = b.readUInt32LE(pos);
    skipValue(t);
  }
  const infos = [];
  for (let i = 0; i < nTensors; i++) {
    const name = str(), nd = u32();
    const ne = Array.from({ length: nd }, u64);
    infos.push({ name, ne, type: u32(), offset: u64() });
  }
  const data = Math.ceil(pos / alignment) * alignment;
  const out = new Map();
  for (const t of infos) {
    const [tname, bs, ts] = TYPE[t.type] ?? [`type${t.type}`, 1, 0];
    const n = t.ne.reduce((a, x) => a * x, 1);
    out.set(t.name, { type: tname, ne: t.ne, bytes: b.subarray(data + t.offset, data + t.offset + (n / bs) * ts) });
  }
  return out;
}

// An imatrix GGUF as llama-imatrix writes it: "<w>.in_sum2" F32 {cols, matrices} and
// "<w>.counts" F32 {1, matrices}.
function writeImatrixGguf(file, entries) {
  const parts = [];
  const u32 = (v) => { const x = Buffer.alloc(4); x.writeUInt32LE(v); parts.push(x); };
  const u64 = (v) => { const x = Buffer.alloc(8); x.writeBigUInt64LE(BigInt(v)); parts.push(x); };
  const str = (s) => { u64(Buffer.byteLength(s)); parts.push(Buffer.from(s)); };
  const tensors = [];
  for (const e of entries) {
    tensors.push({ name: `${e.name}.in_sum2`, ne: [e.cols, e.matrices], data: e.sums });
    tensors.push({ name: `${e.name}.counts`, ne: [1, e.matrices], data: e.counts });
  }
  parts.push(Buffer.from("GGUF"));
  u32(3);
  u64(tensors.length);
  u64(4);
  str("general.type");
  u32(8);
  str("imatrix");
  str("imatrix.datasets");
  u32(9);
  u32(8);
  u64(1);
  str("random.txt");
  str("imatrix.chunk_count");
  u32(4);
  u32(16);
  str("imatrix.chunk_size");
  u32(4);
  u32(512);
  let offset = 0;
  for (const t of tensors) {
    str(t.name);
    u32(2);
    u64(t.ne[0]);
    u64(t.ne[1]);
    u32(0);
    u64(offset);
    offset += Math.ceil((t.data.length * 4) / 32) * 32;
  }
  const head = Buffer.concat(parts);
  const dataStart = Math.ceil(head.length / 32) * 32;
  const out = Buffer.alloc(dataStart + offset);
  head.copy(out);
  offset = dataStart;
  for (const t of tensors) {
    Buffer.from(t.data.buffer, t.data.byteOffset, t.data.length * 4).copy(out, offset);
    offset += Math.ceil((t.data.length * 4) / 32) * 32;
  }
  fs.writeFileSync(file, out);
}

// Importance data for every matrix of the F32 file: pseudo-random sums over counts that are
// powers of two (exact quotients); one matrix of the first 3-D tensor has count 0 (weights 1).
function makeImatrix(f32File, ggufOut, rawOut, datOut) {
  let s = 12345;
  const rnd = () => { s = (s * 1103515245 + 12345) % 2147483648; return s / 2147483648; };
  const entries = [], raw = [], dat = [];
  const i32 = (v) => { const x = Buffer.alloc(4); x.writeInt32LE(v); return x; };
  let zeroDone = false;
  for (const [name, t] of readGguf(f32File)) {
    if (t.ne.length < 2 || name.includes("norm") || name === "token_embd.weight") continue;
    const cols = t.ne[0], matrices = t.ne.length > 2 ? t.ne[2] : 1;
    const sums = new Float32Array(cols * matrices), counts = new Float32Array(matrices), values = new Float32Array(sums.length);
    for (let j = 0; j < matrices; j++) {
      counts[j] = (zeroDone || matrices === 1 || j !== 1) ? 2 ** (1 + Math.floor(rnd() * 4)) : 0;
      if (counts[j] === 0) zeroDone = true;
      for (let i = 0; i < cols; i++) {
        sums[j * cols + i] = Math.fround(0.05 + 4 * rnd() * rnd());
        values[j * cols + i] = counts[j] > 0 ? Math.fround(sums[j * cols + i] / counts[j]) : 1;
      }
    }
    entries.push({ name, cols, matrices, sums, counts });
    const head = Buffer.alloc(4);
    head.writeUInt32LE(Buffer.byteLength(name));
    const count = Buffer.alloc(4);
    count.writeUInt32LE(values.length);
    raw.push(head, Buffer.from(name), count, Buffer.from(values.buffer));
    // Legacy .dat: values scaled by ncall (4: exact), divided back on reading.
    dat.push(i32(Buffer.byteLength(name)), Buffer.from(name), i32(4), i32(values.length),
      Buffer.from(values.map((v) => v * 4).buffer));
  }
  writeImatrixGguf(ggufOut, entries);
  fs.writeFileSync(rawOut, Buffer.concat(raw));
  fs.writeFileSync(datOut, Buffer.concat([i32(entries.length), ...dat]));
}

// What llama-quantize hands its quantizers from an imatrix GGUF: in_sum2 / counts per
// matrix (1 where the count is 0), in llama_quantize.c's raw format.
function imatrixGgufToRaw(ggufFile, rawOut) {
  const t = readGguf(ggufFile), raw = [];
  for (const [name, sums] of t) {
    if (!name.endsWith(".in_sum2")) continue;
    const w = name.slice(0, -".in_sum2".length), counts = t.get(`${w}.counts`);
    const s = new Float32Array(sums.bytes.buffer.slice(sums.bytes.byteOffset, sums.bytes.byteOffset + sums.bytes.length));
    const c = new Float32Array(counts.bytes.buffer.slice(counts.bytes.byteOffset, counts.bytes.byteOffset + counts.bytes.length));
    const cols = s.length / c.length, values = new Float32Array(s.length);
    for (let j = 0; j < c.length; j++) {
      const n = Math.round(c[j]);
      for (let i = 0; i < cols; i++) values[j * cols + i] = n > 0 ? Math.fround(s[j * cols + i] / n) : 1;
    }
    const head = Buffer.alloc(4);
    head.writeUInt32LE(Buffer.byteLength(w));
    const count = Buffer.alloc(4);
    count.writeUInt32LE(values.length);
    raw.push(head, Buffer.from(w), count, Buffer.from(values.buffer));
  }
  if (raw.length === 0) throw new Error(`${ggufFile}: no in_sum2 tensors`);
  fs.writeFileSync(rawOut, Buffer.concat(raw));
}

// Calibration text for the calib cases (any text: the tokenizers fall back to bytes).
function writeCalibText(file) {
  const lines = [];
  for (let i = 0; i < 40; i++) {
    lines.push(`Line ${i}: the river ${i * 13} carried stones and light past the old mill, while ${i % 7} birds sang.`);
  }
  fs.writeFileSync(file, lines.join("\n"));
}

function compare(ours, ref) {
  const problems = [];
  for (const name of ref.keys()) if (!ours.has(name)) problems.push(`missing tensor ${name}`);
  for (const name of ours.keys()) if (!ref.has(name)) problems.push(`extra tensor ${name}`);
  for (const [name, r] of ref) {
    const o = ours.get(name);
    if (!o) continue;
    if (o.type !== r.type) problems.push(`${name}: type ${o.type}, llama-quantize ${r.type}`);
    else if (JSON.stringify(o.ne) !== JSON.stringify(r.ne)) problems.push(`${name}: shape ${o.ne}, llama-quantize ${r.ne}`);
    else if (!o.bytes.equals(r.bytes)) {
      let i = 0;
      while (o.bytes[i] === r.bytes[i]) i++;
      let n = 0;
      for (let j = 0; j < o.bytes.length; j++) n += o.bytes[j] !== r.bytes[j] ? 1 : 0;
      problems.push(`${name} (${r.type}): ${n} of ${r.bytes.length} bytes differ, first at ${i}`);
    }
  }
  return problems;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "infera-gguf-quantize-"));
let passed = 0, failed = 0, skipped = false;
try {
  const q = llamaQuantizer(tmp);
  skipped = !q;
  const filter = process.argv[3] ?? "";
  for (const c of skipped ? [] : cases.filter((x) => x.name.includes(filter))) {
    const dir = path.join(tmp, c.model);
    const f32 = path.join(tmp, `${c.model}-f32.gguf`);
    if (!fs.existsSync(dir)) {
      run(python, [path.join(repo, "tools/gen_model.py"), dir, ...models[c.model], "--dtype", "bf16"]);
      run(infera, ["convert", dir, "--to", "gguf", f32, "--type", "f32"]);
    }
    const imGguf = path.join(tmp, `${c.model}-imatrix.gguf`), imRaw = path.join(tmp, `${c.model}-imatrix.bin`);
    const imDat = path.join(tmp, `${c.model}-imatrix.dat`);
    if (c.imatrix && !fs.existsSync(imGguf)) makeImatrix(f32, imGguf, imRaw, imDat);
    const ref = path.join(tmp, `${c.name}-ref.gguf`), ours = path.join(tmp, `${c.name}.gguf`);
    let imArgs = c.imatrix ? [imRaw] : [], ourArgs = c.imatrix ? ["--imatrix", c.dat ? imDat : imGguf] : [];
    if (c.calib) {
      const text = path.join(tmp, "calib.txt"), calImatrix = path.join(tmp, `${c.model}-calib-imatrix.gguf`);
      const calRaw = path.join(tmp, `${c.model}-calib-imatrix.bin`);
      const calibArgs = ["--calib", text, "--calib-tokens", "300", "--chunk-size", "128"];
      if (!fs.existsSync(text)) writeCalibText(text);
      run(infera, ["imatrix", dir, "-o", calImatrix, ...calibArgs]);
      imatrixGgufToRaw(calImatrix, calRaw);
      imArgs = [calRaw];
      ourArgs = calibArgs;
    }
    run(q.bin, [q.lib, f32, ref, String(ftypes[c.type]), ...imArgs]);
    run(infera, ["convert", dir, "--to", "gguf", ours, "--type", c.type, ...ourArgs]);
    const refT = readGguf(ref), ourT = readGguf(ours);
    const problems = compare(ourT, refT);
    if ((c.imatrix || c.calib) && c.type !== "q8_0") {
      // The importance matrix must have changed something (else the case tests nothing).
      const plain = path.join(tmp, `${c.model}-${c.type}-ref.gguf`);
      if (!fs.existsSync(plain)) run(q.bin, [q.lib, f32, plain, String(ftypes[c.type])]);
      const plainT = readGguf(plain);
      const changed = [...refT].filter(([n, t]) => plainT.get(n)?.type === t.type && !plainT.get(n).bytes.equals(t.bytes));
      if (changed.length === 0) problems.push("the importance matrix changed no tensor's bytes");
    }
    const types = {};
    for (const t of refT.values()) types[t.type] = (types[t.type] ?? 0) + 1;
    const mix = Object.entries(types).map(([t, n]) => `${t} x${n}`).join(", ");
    if (problems.length === 0) {
      passed++;
      console.log(`ok   ${c.name}: ${refT.size} tensors, types and bytes identical (${mix})`);
    } else {
      failed++;
      console.log(`FAIL ${c.name}: ${problems.length} problems (llama-quantize: ${mix})\n  ${problems.slice(0, 12).join("\n  ")}`);
    }
  }
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
if (skipped) process.exit(77);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
