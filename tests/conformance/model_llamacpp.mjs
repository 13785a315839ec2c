// Model conformance against llama.cpp (node-llama-cpp, CPU build): random-weight tiny
// models from tools/gen_model.py are converted with `infera convert --to gguf`, then
// llama.cpp and Infera each run the same prompt ids. Required: identical greedy
// continuations (32 tokens), the same top-1 at every prompt position (f32 files: no near
// ties allowed, llamacpp_compare.mjs), and final-position
// logits within a small tolerance (the max abs difference is printed per model). For the
// cases marked fromGguf (the hybrid and MLA architectures) Infera also runs the GGUF file
// itself and must meet the same requirements against the same llama.cpp run.
//
//   node model_llamacpp.mjs <infera-binary> [name-filter]   (filter: run the cases whose name contains it)
import fs from "node:fs";
import path from "node:path";

import { compareWithLlamacpp, infera, lastJsonLine, promptIds, python, repo, run, runCases } from "./llamacpp_compare.mjs";

// Infera's bf16 prefill on AVX512_BF16 CPUs rounds x to bf16 before its products with the
// weights (kernels.h, set_bf16_dot); the logits here are held to 1e-3 of llama.cpp's f32
// products, so the runs below take Infera's f32 products too (inherited by the children).
process.env.INFERA_BF16_DOT = "0";

const N = 32;
// Logits are O(1..10); f32 engines that differ only in summation order agree to ~1e-5.
const LOGIT_TOL = 1e-3;

const cases = [
  { name: "llama-f32", args: ["--arch", "llama", "--hidden", "128", "--layers", "3", "--heads", "4", "--kv-heads", "2",
      "--ffn", "320", "--vocab", "512", "--dtype", "f32", "--seed", "1"] },
  { name: "llama-bf16-tied-llama3rope", fromGguf: true, args: ["--arch", "llama", "--hidden", "96", "--layers", "2", "--heads", "6",
      "--kv-heads", "2", "--ffn", "200", "--vocab", "384", "--dtype", "bf16", "--seed", "2", "--tie",
      "--rope-scaling", "llama3", "--rope-factor", "8", "--rope-orig-max-pos", "64", "--max-pos", "512"] },
  { name: "qwen3-f32", args: ["--arch", "qwen3", "--hidden", "128", "--layers", "3", "--heads", "4", "--kv-heads", "2",
      "--head-dim", "48", "--ffn", "256", "--vocab", "640", "--dtype", "f32", "--seed", "3"] },
  { name: "qwen3-f16-gqa4", args: ["--arch", "qwen3", "--hidden", "64", "--layers", "2", "--heads", "8", "--kv-heads", "2",
      "--head-dim", "16", "--ffn", "160", "--vocab", "512", "--dtype", "f16", "--seed", "4"] },
  { name: "qwen3-yarn", args: ["--arch", "qwen3", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "4",
      "--head-dim", "32", "--ffn", "128", "--vocab", "512", "--dtype", "f32", "--seed", "5",
      "--rope-scaling", "yarn", "--rope-factor", "4", "--rope-orig-max-pos", "32", "--max-pos", "256"] },
  { name: "qwen3moe-f32", args: ["--arch", "qwen3_moe", "--hidden", "128", "--layers", "3", "--heads", "4", "--kv-heads", "2",
      "--head-dim", "32", "--experts", "8", "--experts-per-tok", "2", "--moe-ffn", "64", "--vocab", "512", "--dtype", "f32",
      "--seed", "6"] },
  { name: "qwen3moe-bf16-top4of16", args: ["--arch", "qwen3_moe", "--hidden", "64", "--layers", "2", "--heads", "4",
      "--kv-heads", "1", "--head-dim", "16", "--experts", "16", "--experts-per-tok", "4", "--moe-ffn", "32", "--vocab", "384",
      "--dtype", "bf16", "--seed", "7"] },
  // Qwen3.5 hybrids: Gated DeltaNet + gated attention (+ MoE with shared expert); MTP weights
  // are in the GGUF too (llama.cpp loads them as blk.N.nextn.*). An 80-token prompt crosses
  // the 64-token delta-rule chunk.
  { name: "qwen35moe-f32", promptLen: 80, fromGguf: true, args: ["--arch", "qwen3_5_moe", "--hidden", "128", "--layers", "4", "--heads", "4",
      "--kv-heads", "2", "--head-dim", "64", "--lin-k-heads", "2", "--lin-v-heads", "4", "--lin-dk", "32", "--lin-dv", "32",
      "--experts", "8", "--experts-per-tok", "2", "--moe-ffn", "64", "--shared-ffn", "96", "--vocab", "512", "--dtype", "f32",
      "--seed", "8"] },
  { name: "qwen35moe-bf16-tied-top4of16", fromGguf: true, args: ["--arch", "qwen3_5_moe", "--hidden", "64", "--layers", "8", "--heads", "2",
      "--kv-heads", "1", "--head-dim", "32", "--lin-k-heads", "2", "--lin-v-heads", "2", "--lin-dk", "16", "--lin-dv", "16",
      "--experts", "16", "--experts-per-tok", "4", "--moe-ffn", "32", "--shared-ffn", "48", "--vocab", "384", "--dtype", "bf16",
      "--tie", "--seed", "9"] },
  { name: "qwen35-dense-f32", promptLen: 70, fromGguf: true, args: ["--arch", "qwen3_5", "--hidden", "96", "--layers", "4", "--heads", "4",
      "--kv-heads", "2", "--head-dim", "32", "--lin-k-heads", "1", "--lin-v-heads", "3", "--lin-dk", "32", "--lin-dv", "32",
      "--ffn", "192", "--vocab", "512", "--dtype", "f32", "--seed", "10", "--no-mtp"] },
  // Qwen3-Next (qwen3next): the fused in_proj_qkvz / in_proj_ba of the checkpoint, written
  // as llama.cpp's converter does (attn_qkv + attn_gate, ssm_ba; value heads in HF's order,
  // grouped by key head), every layer MoE with a shared expert, the MTP block as blk.N.nextn.*.
  { name: "qwen3next-f32", promptLen: 80, fromGguf: true, args: ["--arch", "qwen3_next", "--hidden", "128", "--layers", "4",
      "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--lin-k-heads", "2", "--lin-v-heads", "4", "--lin-dk", "32",
      "--lin-dv", "32", "--experts", "8", "--experts-per-tok", "2", "--moe-ffn", "64", "--shared-ffn", "96", "--vocab",
      "512", "--dtype", "f32", "--seed", "15"] },
  { name: "qwen3next-bf16-tied-hv6", fromGguf: true, args: ["--arch", "qwen3_next", "--hidden", "64", "--layers", "8",
      "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--lin-k-heads", "2", "--lin-v-heads", "6", "--lin-dk", "16",
      "--lin-dv", "16", "--experts", "16", "--experts-per-tok", "4", "--moe-ffn", "32", "--shared-ffn", "48", "--vocab",
      "384", "--dtype", "bf16", "--tie", "--seed", "16"] },
  // DeepSeek-V3 (deepseek2): MLA over the latent (kv_b_proj split into attn_k_b / attn_v_b),
  // sigmoid routing with e_score_correction_bias, group-limited top-k, shared experts,
  // dense first layers, YaRN with mscale; with and without q_lora. llama.cpp takes a model
  // without q_lora (a direct q_proj) only in the V2-Lite shape, 26 or 27 layers.
  { name: "deepseek2-f32-qlora-grouped-yarn", promptLen: 20, fromGguf: true, args: ["--arch", "deepseek_v3", "--hidden", "128",
      "--layers", "3", "--heads", "4", "--q-lora-rank", "48", "--kv-lora-rank", "64", "--qk-nope-dim", "32",
      "--qk-rope-dim", "16", "--v-head-dim", "32", "--ffn", "256", "--experts", "8", "--experts-per-tok", "2",
      "--moe-ffn", "64", "--n-group", "4", "--topk-group", "2", "--first-dense", "1", "--rope-scaling", "yarn",
      "--rope-factor", "4", "--rope-orig-max-pos", "32", "--max-pos", "512", "--vocab", "512", "--dtype", "f32",
      "--seed", "11", "--no-mtp"] },
  { name: "deepseek2-bf16-direct-q-dense2", fromGguf: true, args: ["--arch", "deepseek_v3", "--hidden", "64", "--layers", "26",
      "--heads", "2", "--q-lora-rank", "0", "--kv-lora-rank", "32", "--qk-nope-dim", "16", "--qk-rope-dim", "8",
      "--v-head-dim", "16", "--ffn", "128", "--experts", "6", "--experts-per-tok", "3", "--moe-ffn", "32",
      "--n-shared", "2", "--first-dense", "2", "--vocab", "384", "--dtype", "bf16", "--seed", "12", "--no-mtp"] },
  // DeepSeek-V3.2 (deepseek32): the lightning indexer picks index_topk 32 of up to 132
  // positions, so from prompt position 33 on (and every generated token) each query
  // attends to a selection. 16 indexer heads make exact score ties (all heads' ReLU at 0)
  // unlikely; index_head_dim 64 is the smallest llama.cpp's Hadamard rotation of the
  // indexer keys supports (an orthogonal rotation: it changes no score). denseDiffers: the
  // same weights attending densely (index_topk beyond the context) must give other greedy
  // tokens, so that the agreement cannot come from a selection that changes nothing.
  { name: "deepseek32-f32-topk32", promptLen: 100, fromGguf: true, denseDiffers: true, args: ["--arch", "deepseek_v32", "--hidden", "128",
      "--layers", "3", "--heads", "4", "--q-lora-rank", "48", "--kv-lora-rank", "64", "--qk-nope-dim", "32",
      "--qk-rope-dim", "16", "--v-head-dim", "32", "--ffn", "256", "--experts", "8", "--experts-per-tok", "2",
      "--moe-ffn", "64", "--n-group", "4", "--topk-group", "2", "--first-dense", "1", "--index-heads", "16",
      "--index-head-dim", "64", "--index-topk", "32", "--vocab", "512", "--dtype", "f32", "--seed", "13", "--no-mtp"] },
  // bf16 with YaRN (the indexer's NeoX RoPE takes the same YaRN frequencies and mscale as
  // MLA's), two shared experts, index_topk 16 under a 64-token prompt.
  { name: "deepseek32-bf16-yarn-topk16", promptLen: 64, fromGguf: true, denseDiffers: true, args: ["--arch", "deepseek_v32",
      "--hidden", "96", "--layers", "2", "--heads", "3", "--q-lora-rank", "32", "--kv-lora-rank", "48",
      "--qk-nope-dim", "16", "--qk-rope-dim", "8", "--v-head-dim", "24", "--ffn", "192", "--experts", "6",
      "--experts-per-tok", "2", "--moe-ffn", "48", "--n-shared", "2", "--first-dense", "1", "--rope-scaling", "yarn",
      "--rope-factor", "4", "--rope-orig-max-pos", "32", "--max-pos", "512", "--index-heads", "16",
      "--index-head-dim", "64", "--index-topk", "16", "--vocab", "384", "--dtype", "bf16", "--seed", "14",
      "--no-mtp"] },
];

runCases(cases, "infera-conf-", N, (c, tmp) => {
  const dir = path.join(tmp, c.name);
  run(python, [path.join(repo, "tools/gen_model.py"), dir, ...c.args]);
  const gguf = path.join(tmp, `${c.name}.gguf`);
  run(infera, ["convert", dir, "--to", "gguf", gguf, "--type", "f32"]);
  const config = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8"));
  const vocabSize = config.vocab_size ?? config.text_config.vocab_size;  // Qwen3.5 nests it
  // A fixed pseudo-random prompt of 12 ids (c.promptLen if set).
  const prompt = promptIds(12345 + c.name.length, c.promptLen ?? 12, vocabSize);
  const r = compareWithLlamacpp({ model: dir, gguf, prompt, n: N, tmp, name: c.name });
  if (!(r.maxDiff <= LOGIT_TOL)) r.problems.push(`final logits max abs diff ${r.maxDiff} > ${LOGIT_TOL}`);
  if (c.fromGguf) {
    // Infera running the same GGUF file (the converter's transforms undone at load).
    const g = compareWithLlamacpp({ model: gguf, gguf, prompt, n: N, tmp, name: `${c.name}-gguf`, ref: r.ref });
    if (!(g.maxDiff <= LOGIT_TOL)) g.problems.push(`final logits max abs diff ${g.maxDiff} > ${LOGIT_TOL}`);
    r.problems.push(...g.problems.map((p) => `infera -m ${c.name}.gguf: ${p}`));
    r.nearTies.push(...g.nearTies.map((p) => `infera -m ${c.name}.gguf: ${p}`));
    r.maxDiff = Math.max(r.maxDiff, g.maxDiff);
  }
  if (c.denseDiffers) {
    // The same weights attending densely (index_topk past the context) must give other
    // greedy tokens: the agreement cannot come from a selection that changes nothing.
    const dense = path.join(tmp, `${c.name}-dense`);
    fs.mkdirSync(dense);
    for (const f of fs.readdirSync(dir)) if (f !== "config.json") fs.symlinkSync(path.join(dir, f), path.join(dense, f));
    fs.writeFileSync(path.join(dense, "config.json"), JSON.stringify({ ...config, index_topk: 1 << 20 }));
    const denseIds = lastJsonLine(run(infera, ["run", "-m", dense, "--prompt-ids", JSON.stringify(prompt), "-n",
      String(N), "--temp", "0", "--ignore-eos", "--json", "-t", "1"])).ids;
    if (JSON.stringify(denseIds) === JSON.stringify(r.refIds)) {
      r.problems.push("dense attention gives the same greedy tokens: the test does not exercise the selection");
    }
  }
  return { ...r, positions: prompt.length };
});
