// Running GGUF files of the hybrid (Qwen3.5: qwen35, qwen35moe; Qwen3-Next: qwen3next) and
// MLA (DeepSeek: deepseek2, deepseek32) architectures (model/gguf_loader.h): tiny random checkpoints from
// tools/gen_model.py, converted by `infera convert --to gguf` (tools/gguf_export.h), must
// give the logits of the Hugging Face directory they came from at every prompt position.
// The converter's transforms (Qwen3.5: norms stored as 1 + w, A_log as -exp(A_log), value
// heads reordered in every GDN tensor, conv1d reshaped, experts stacked; Qwen3-Next:
// in_proj_qkvz de-interleaved into attn_qkv + attn_gate; DeepSeek: kv_b_proj split into
// attn_k_b / attn_v_b) are undone at load, so f32 and bf16 files give the
// directory's logits to rounding; a Q8_0 file's weights differ only by its quantization.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/base/cpu.h"
#include "infera/base/load_progress.h"
#include "infera/base/mmap.h"
#include "infera/io/gguf.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/kernels/kernels.h"
#include "infera/model/arch_registry.h"
#include "infera/model/gguf_loader.h"
#include "infera/model/model.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/rope.h"
#include "infera/model/weights.h"
#include "infera/tools/gguf_export.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

const fs::path kScratch = test::process_scratch_dir("infera_gguf_arch_test");

struct Case {
  const char* name;
  const char* args;  // tools/gen_model.py, without --dtype
  int prompt_len;
};

// Hk 2 / Hv 4 with value heads 16 wide (a Q8_0 out_proj's heads split its blocks: kept tiled
// as stored, or dequantized to f32 when moved back for a group); Hk 2 / Hv 6 with 32-wide heads
// (whole blocks). (With one key
// head, or as many key as value heads, the two orders agree.) DeepSeek-V3.2: index_topk 8
// of a 40-token prompt.
const Case kCases[] = {
    {"qwen35moe",
     "--arch qwen3_5_moe --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 "
     "--lin-v-heads 4 --lin-dk 16 --lin-dv 16 --experts 8 --experts-per-tok 2 --moe-ffn 32 --shared-ffn 48 "
     "--vocab 320 --seed 21",
     70},
    {"qwen35",
     "--arch qwen3_5 --hidden 96 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 --lin-v-heads 6 "
     "--lin-dk 32 --lin-dv 32 --ffn 192 --vocab 320 --seed 22 --tie",
     40},
    // Qwen3-Next: in_proj_qkvz written de-interleaved as attn_qkv + attn_gate, in_proj_ba as
    // ssm_ba, value heads in HF's order; read back as split projections (b / a from ssm_ba).
    {"qwen3next",
     "--arch qwen3_next --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2 "
     "--lin-v-heads 4 --lin-dk 16 --lin-dv 16 --experts 8 --experts-per-tok 2 --moe-ffn 32 --shared-ffn 48 "
     "--vocab 320 --seed 26",
     70},
    {"deepseek2",
     "--arch deepseek_v3 --hidden 64 --layers 3 --heads 4 --q-lora-rank 32 --kv-lora-rank 32 --qk-nope-dim 16 "
     "--qk-rope-dim 8 --v-head-dim 16 --ffn 128 --experts 8 --experts-per-tok 2 --moe-ffn 32 --n-group 4 "
     "--topk-group 2 --first-dense 1 --rope-scaling yarn --rope-factor 4 --rope-orig-max-pos 32 --max-pos 512 "
     "--vocab 320 --seed 23",
     30},
    {"deepseek32",
     "--arch deepseek_v32 --hidden 64 --layers 2 --heads 2 --q-lora-rank 32 --kv-lora-rank 32 --qk-nope-dim 16 "
     "--qk-rope-dim 8 --v-head-dim 16 --ffn 128 --experts 6 --experts-per-tok 2 --moe-ffn 32 --n-shared 2 "
     "--first-dense 1 --index-heads 4 --index-head-dim 64 --index-topk 8 --vocab 320 --seed 24",
     40},
};

std::string model_dir(const Case& c, const char* dtype) {
  return test::generate_model(kScratch / (std::string(c.name) + "-" + dtype),
                              std::string(c.args) + " --dtype " + dtype);
}

std::string gguf_of(const std::string& dir, GgufOutType type, const char* tag) {
  const std::string out = dir + "-" + tag + ".gguf";
  if (!fs::exists(out)) {
    GgufExportOptions o;
    o.out_type = type;
    export_gguf(dir, out, o);
  }
  return out;
}

std::vector<int32_t> prompt_of(int n, int vocab) {
  std::vector<int32_t> p;
  uint32_t s = 12345;
  for (int i = 0; i < n; ++i) {
    s = s * 1103515245u + 12345u;
    p.push_back(3 + static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(vocab - 3)));
  }
  return p;
}

// Logits of every prompt position, [n, vocab].
std::vector<float> all_logits(Model& model, const std::vector<int32_t>& prompt) {
  KvPoolShape shape = model.kv_shape(16);
  shape.num_blocks = 8;
  KvPool kv(shape);
  return test::forward_chunk(model, kv, prompt, 8, true);
}

// The same from the model at `path`, and its parameter count.
std::vector<float> all_logits(const std::string& path, const std::vector<int32_t>& prompt, int64_t* params) {
  std::unique_ptr<Model> model = load_model(path);
  *params = model->num_parameters();
  return all_logits(*model, prompt);
}

float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The directory and the GGUF: same logits within `tol` (absolute), same parameter count
// (every tensor, MTP head included, bound from the file).
void expect_same_logits(const Case& c, const std::string& dir, const std::string& gguf, float tol) {
  const ModelConfig cfg = load_model_config(dir);
  const std::vector<int32_t> prompt = prompt_of(c.prompt_len, cfg.vocab_size);
  int64_t hf_params = 0, gguf_params = 0;
  const std::vector<float> want = all_logits(dir, prompt, &hf_params);
  const std::vector<float> got = all_logits(gguf, prompt, &gguf_params);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(gguf_params, hf_params) << gguf;
  const float diff = max_diff(got, want);
  EXPECT_LE(diff, tol) << gguf << " (max |logit| " << max_abs(want) << ")";
  std::printf("%s: max |logit diff| %.3g over %d positions (max |logit| %.3g)\n", fs::path(gguf).filename().c_str(),
              diff, c.prompt_len, max_abs(want));
}

class GgufArch : public ::testing::TestWithParam<Case> {};

TEST_P(GgufArch, ConfigMatchesTheDirectory) {
  const Case& c = GetParam();
  const std::string dir = model_dir(c, "f32");
  const ModelConfig h = load_model_config(dir);
  const ModelConfig g = load_model_config(gguf_of(dir, GgufOutType::kF32, "f32"));
  EXPECT_EQ(g.arch, h.arch);
  EXPECT_EQ(g.hidden_size, h.hidden_size);
  EXPECT_EQ(g.num_layers, h.num_layers);
  EXPECT_EQ(g.num_heads, h.num_heads);
  EXPECT_EQ(g.head_dim, h.head_dim);
  EXPECT_EQ(g.vocab_size, h.vocab_size);
  EXPECT_EQ(g.rope.rotary_dim, h.rope.rotary_dim);
  EXPECT_EQ(g.rope.scaling, h.rope.scaling);
  EXPECT_FLOAT_EQ(g.rope.attention_factor, h.rope.attention_factor);
  EXPECT_FLOAT_EQ(g.rope.theta, h.rope.theta);
  EXPECT_EQ(g.tie_word_embeddings, h.tie_word_embeddings);
  EXPECT_EQ(g.num_experts, h.num_experts);
  EXPECT_EQ(g.num_experts_per_tok, h.num_experts_per_tok);
  EXPECT_EQ(g.moe_intermediate_size, h.moe_intermediate_size);
  EXPECT_EQ(g.norm_topk_prob, h.norm_topk_prob);
  // Qwen3-Next's config.json does not declare its MTP head; the directory's tensors do.
  const WeightStore store = WeightStore::open(dir);
  EXPECT_EQ(g.num_mtp_layers(), mtp_layers(h, [&store](const std::string& n) { return store.find(n) != nullptr; }));
  for (int l = 0; l < h.num_layers; ++l) {
    EXPECT_EQ(g.is_linear_attention_layer(l), h.is_linear_attention_layer(l)) << l;
    EXPECT_EQ(g.is_moe_layer(l), h.is_moe_layer(l)) << l;
  }
  // Hybrid.
  EXPECT_EQ(g.linear_conv_kernel_dim, h.linear_conv_kernel_dim);
  EXPECT_EQ(g.linear_key_head_dim, h.linear_key_head_dim);
  EXPECT_EQ(g.linear_value_head_dim, h.linear_value_head_dim);
  EXPECT_EQ(g.linear_num_key_heads, h.linear_num_key_heads);
  EXPECT_EQ(g.linear_num_value_heads, h.linear_num_value_heads);
  EXPECT_EQ(g.shared_expert_intermediate_size, h.shared_expert_intermediate_size);
  EXPECT_EQ(g.attn_output_gate, h.attn_output_gate);
  // MLA.
  EXPECT_EQ(g.mla, h.mla);
  EXPECT_EQ(g.q_lora_rank, h.q_lora_rank);
  EXPECT_EQ(g.kv_lora_rank, h.kv_lora_rank);
  EXPECT_EQ(g.qk_nope_head_dim, h.qk_nope_head_dim);
  EXPECT_EQ(g.qk_rope_head_dim, h.qk_rope_head_dim);
  EXPECT_EQ(g.v_head_dim, h.v_head_dim);
  EXPECT_EQ(g.n_shared_experts, h.n_shared_experts);
  EXPECT_EQ(g.first_k_dense_replace, h.first_k_dense_replace);
  EXPECT_FLOAT_EQ(g.routed_scaling_factor, h.routed_scaling_factor);
  EXPECT_EQ(g.scoring_func, h.scoring_func);
  EXPECT_EQ(std::max(g.n_group, 1), std::max(h.n_group, 1));
  EXPECT_EQ(std::max(g.topk_group, 1), std::max(h.topk_group, 1));
  EXPECT_EQ(g.index_n_heads, h.index_n_heads);
  EXPECT_EQ(g.index_head_dim, h.index_head_dim);
  EXPECT_EQ(g.index_topk, h.index_topk);
  EXPECT_FLOAT_EQ(g.rope.mscale_all_dim, h.rope.mscale_all_dim);
}

// f32: the same weights through the same kernels; only the converter's round trips
// (1 + w - 1, log(exp)) round, ~1e-7 relative, so logits of magnitude ~10 agree to 1e-4.
TEST_P(GgufArch, F32LogitsEqualTheDirectory) {
  const Case& c = GetParam();
  const std::string dir = model_dir(c, "f32");
  expect_same_logits(c, dir, gguf_of(dir, GgufOutType::kF32, "f32"), 1e-4f);
}

// bf16 checkpoint to a bf16 GGUF: matrices bit for bit, vectors f32 in the file. Some
// matrices are f32 in the file where the directory has bf16 (the MoE router, DeepSeek's
// kv_b_proj joined back from attn_k_b / attn_v_b): with the f32 products
// (kernels::set_bf16_dot(false)) both give the same sums, so this compares the loading
// alone, not where the bf16 products round activations.
TEST_P(GgufArch, Bf16LogitsEqualTheDirectory) {
  const Case& c = GetParam();
  const std::string dir = model_dir(c, "bf16");
  const kernels::Bf16Dot saved_dot = kernels::bf16_dot_mode();
  kernels::set_bf16_dot(false);
  expect_same_logits(c, dir, gguf_of(dir, GgufOutType::kBF16, "bf16"), 1e-3f);
  kernels::set_bf16_dot(saved_dot);
}

// Q8_0: every tensor bound from the Q8_0 file equals the same tensor bound from the f32
// file (which gives the directory's logits exactly, above) within Q8_0's rounding: half a
// block scale, at most max |row| / 127 per value; a row, block or head moved to the wrong
// place misses by the weights' own size. (Logits are no test here: the random models'
// routing and gates turn 8-bit rounding into logit changes of several units; the
// conformance test compares Q8_0 files with llama.cpp's run of the same file.)
std::vector<float> values_of(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype != DType::kGgml) {
    to_f32(t.data, t.dtype, t.numel(), v.data());
    return v;
  }
  const int64_t cols = t.shape.back(), rows = t.numel() / cols;
  const int64_t row_bytes = kernels::ggml::row_bytes(t.ggml_type, cols);
  for (int64_t r = 0; r < rows; ++r)
    kernels::ggml::dequantize_row(t.ggml_type, t.data + r * row_bytes, v.data() + r * cols, cols);
  return v;
}

TEST_P(GgufArch, Q8WeightsEqualTheF32FileWithinRounding) {
  const Case& c = GetParam();
  const std::string dir = model_dir(c, "f32");
  // The file's own config (Qwen3-Next's config.json does not declare the MTP head the file
  // holds, and a load refuses tensors its config leaves out).
  const ModelConfig cfg = load_model_config(gguf_of(dir, GgufOutType::kF32, "f32"));
  const WeightStore f32 = open_gguf_weights(gguf_of(dir, GgufOutType::kF32, "f32"), cfg);
  const WeightStore q8 = open_gguf_weights(gguf_of(dir, GgufOutType::kQ8_0, "q8_0"), cfg);
  ASSERT_EQ(q8.names(), f32.names());
  int blocks = 0;
  for (const std::string& name : f32.names()) {
    const TensorInfo& a = f32.get(name);
    const TensorInfo& b = q8.get(name);
    ASSERT_EQ(a.shape, b.shape) << name;
    blocks += b.dtype == DType::kGgml;
    const std::vector<float> want = values_of(a), got = values_of(b);
    const int64_t cols = a.shape.back();
    float worst = 0;  // the largest error as a fraction of its row's bound
    for (size_t r = 0; r * cols < want.size(); ++r) {
      float amax = 0, err = 0;
      for (int64_t i = 0; i < cols; ++i) {
        amax = std::max(amax, std::fabs(want[r * cols + i]));
        err = std::max(err, std::fabs(got[r * cols + i] - want[r * cols + i]));
      }
      if (amax > 0) worst = std::max(worst, err / (amax / 127.0f));
    }
    EXPECT_LE(worst, 1.0f) << name << " (" << dtype_name(b.dtype) << ")";
  }
  EXPECT_GT(blocks, 0);  // some matrices are Q8_0 blocks, bound in place
  // And the model runs from the file.
  const std::vector<int32_t> prompt = prompt_of(c.prompt_len, cfg.vocab_size);
  int64_t params = 0;
  for (float x : all_logits(gguf_of(dir, GgufOutType::kQ8_0, "q8_0"), prompt, &params)) ASSERT_TRUE(std::isfinite(x));
}

// A GGUF token embedding is read by rows, so it gets no panels (a copy beside the rows that its
// lookups fault back in); the head, a matrix like the layers', gets them where they are made
// (AVX-512 or AVX2, INFERA_QUANT_REPACK on); with a tied head neither does.
TEST(GgufPanels, TheTokenEmbeddingKeepsItsRowsAndTheHeadIsRepacked) {
  for (const Case& c : {kCases[0], kCases[1]}) {  // qwen35moe: its own head; qwen35: tied
    const std::string dir = model_dir(c, "f32");
    const ModelConfig cfg = load_model_config(dir);
    const ModelWeights w(cfg,
                         std::make_unique<SafetensorsSource>(open_gguf_weights(gguf_of(dir, GgufOutType::kQ8_0, "q8_0"),
                                                                               cfg),
                                                             QuantizationConfig{}));
    const kernels::LinearWeight embed = w.linear(-1, "token_embd");
    ASSERT_EQ(embed.dense.dtype, DType::kGgml) << c.name;
    EXPECT_EQ(embed.dense.panels, nullptr) << c.name;
    if (cfg.tie_word_embeddings) continue;
    const kernels::LinearWeight head = w.linear(-1, "output");
    ASSERT_EQ(head.dense.dtype, DType::kGgml) << c.name;
    const bool made = best_isa() != Isa::kScalar && quant_repack_enabled();
    EXPECT_EQ(head.dense.panels != nullptr, made) << c.name;
  }
}

// Llama 3 RoPE scaling goes into a GGUF as rope_freqs.weight (one divisor per rotated
// pair) instead of metadata; positions past original_max_position_embeddings (64) show it.
TEST(GgufRopeFreqs, Llama3ScalingFromTheFactorsEqualsTheDirectory) {
  const Case c{"llama3rope",
               "--arch llama --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 320 --seed 25 "
               "--rope-scaling llama3 --rope-factor 8 --rope-orig-max-pos 16 --max-pos 512",
               100};
  const std::string dir = model_dir(c, "f32");
  const std::string gguf = gguf_of(dir, GgufOutType::kF32, "f32");
  const ModelConfig g = load_model_config(gguf);
  ASSERT_EQ(g.rope.freq_factors.size(), static_cast<size_t>(g.rope.rotary_dim / 2));
  EXPECT_EQ(g.rope.freq_factors, llama3_rope_factors(load_model_config(dir)));
  expect_same_logits(c, dir, gguf, 1e-4f);
  // The same file without the factors gives other logits: the test sees them.
  ModelConfig plain = g;
  plain.rope.freq_factors.clear();
  EXPECT_NE(compute_rope_tables(plain.rope, plain.rope.rotary_dim).inv_freq,
            compute_rope_tables(g.rope, g.rope.rotary_dim).inv_freq);
}

// A llama file's q / k rows are stored with the rotary pairs adjacent (llama.cpp's order):
// they stay views of the file, in that order (no copy in Hugging Face's order beside the
// panels), and the model puts q and k back in Hugging Face's order (the f32 file gives the
// directory's logits at every prompt position).
TEST(GgufLlamaQk, RowsStayViewsOfTheFileInItsOrder) {
  const Case c{"llamaqk", "--arch llama --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 320 --seed 31",
               100};
  const std::string dir = model_dir(c, "f32");
  for (const auto& [type, tag] : {std::pair{GgufOutType::kF32, "f32"}, std::pair{GgufOutType::kQ8_0, "q8_0"}}) {
    const std::string gguf = gguf_of(dir, type, tag);
    const ModelConfig cfg = load_model_config(gguf);
    ASSERT_TRUE(cfg.qk_rows_pairs_adjacent);
    EXPECT_FALSE(load_model_config(dir).qk_rows_pairs_adjacent);
    const WeightStore store = open_gguf_weights(gguf, cfg);
    const FileMappings maps = FileMappings::current();
    for (const char* name : {"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"}) {
      const TensorInfo& t = store.get(name);
      EXPECT_TRUE(maps.contains(t.data, t.nbytes)) << tag << " " << name << ": copied out of the file";
    }
    // A config that does not say so gets the rows in Hugging Face's order (a copy).
    ModelConfig hf_order = cfg;
    hf_order.qk_rows_pairs_adjacent = false;
    const WeightStore moved = open_gguf_weights(gguf, hf_order);
    const TensorInfo& q = moved.get("model.layers.1.self_attn.q_proj.weight");
    EXPECT_FALSE(FileMappings::current().contains(q.data, q.nbytes)) << tag;
    const size_t row = q.nbytes / static_cast<size_t>(q.shape[0]);
    EXPECT_NE(std::memcmp(q.data + row, store.get("model.layers.1.self_attn.q_proj.weight").data + row, row), 0)
        << tag << ": row 1 should move (it is the file's row 2)";
  }
  expect_same_logits(c, dir, gguf_of(dir, GgufOutType::kF32, "f32"), 1e-4f);
}

// Pages of [begin, end) this process has mapped (/proc/self/pagemap's present bit).
int64_t present_pages(uintptr_t begin, uintptr_t end) {
  std::FILE* f = std::fopen("/proc/self/pagemap", "rb");
  if (!f) return -1;
  const uintptr_t page = 4096;
  std::vector<uint64_t> entries(static_cast<size_t>((end - begin) / page));
  const bool read = std::fseek(f, static_cast<long>(begin / page * 8), SEEK_SET) == 0 &&
                    std::fread(entries.data(), 8, entries.size(), f) == entries.size();
  std::fclose(f);
  if (!read) return -1;
  return std::count_if(entries.begin(), entries.end(), [](uint64_t e) { return (e >> 63) & 1; });
}

const Case kQwen35Pages{"qwen35pages",
                        "--arch qwen3_5 --hidden 256 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --lin-k-heads 2 "
                        "--lin-v-heads 4 --lin-dk 64 --lin-dv 64 --ffn 512 --vocab 320 --seed 27 --no-mtp",
                        8};

// A Qwen3.5 file's Gated DeltaNet projections keep llama.cpp's tiled value heads: views of the
// file like every other matrix (ModelConfig::gdn_value_heads_tiled; the layer moves its
// activations instead: the Archs tests' logits equal the directory's). Bound for a group (the
// flag off) they are copies in Hugging Face's order.
TEST(GgufQwen35, ValueHeadProjectionsStayViewsOfTheFile) {
  const std::string gguf = gguf_of(model_dir(kQwen35Pages, "f32"), GgufOutType::kQ8_0, "q8_0");
  ModelConfig cfg = load_model_config(gguf);
  ASSERT_TRUE(cfg.gdn_value_heads_tiled);
  const char* names[] = {"model.layers.0.linear_attn.in_proj_qkv.weight", "model.layers.0.linear_attn.in_proj_z.weight",
                         "model.layers.0.linear_attn.in_proj_b.weight", "model.layers.0.linear_attn.out_proj.weight"};
  for (bool tiled : {true, false}) {
    cfg.gdn_value_heads_tiled = tiled;
    const WeightStore store = open_gguf_weights(gguf, cfg);
    const FileMappings maps = FileMappings::current();
    for (const char* name : names) {
      const TensorInfo& t = store.get(name);
      EXPECT_EQ(maps.contains(t.data, t.nbytes), tiled) << name << (tiled ? ": copied" : ": not moved");
    }
  }
}

// The tensors the loader copies (here Qwen3.5's value heads moved back into Hugging Face's
// order, as for a group) leave no file pages mapped behind them. After binding, the file's
// mapping holds the header's pages and those the kernel's fault-around mapped beside each read
// (views, read when their panels are packed): 104 of this file's 735 pages; with the copies'
// pages kept, 304.
TEST(GgufLoad, CopiesDropTheFilePagesTheyRead) {
  const std::string gguf = gguf_of(model_dir(kQwen35Pages, "f32"), GgufOutType::kQ8_0, "q8_0");
  ModelConfig cfg = load_model_config(gguf);
  cfg.gdn_value_heads_tiled = false;
  const WeightStore store = open_gguf_weights(gguf, cfg);
  const TensorInfo& view = store.get("model.layers.0.mlp.gate_proj.weight");  // as stored: in the mapping
  const auto [begin, end] = FileMappings::current().range_of(view.data);
  ASSERT_NE(begin, 0u) << "the matrix should be a view of the mapped file";
  const int64_t pages = static_cast<int64_t>((end - begin) / 4096), mapped = present_pages(begin, end);
  ASSERT_GE(mapped, 0) << "cannot read /proc/self/pagemap";
  EXPECT_LT(mapped, pages / 4) << mapped << " of the file's " << pages << " pages still mapped";
}

// --no-mmap keeps one copy of the weights: the file read into memory gives back the pages of
// what the model repacked (its matrices' panels) or copied, by mapping the file's bytes there
// (map_back_file_pages), as a mapped file's pages are dropped; the model computes the same
// (its logits equal the mapped load's, bit for bit). Before, all 735 pages stayed resident.
TEST(GgufLoad, ReadIntoMemoryKeepsOneCopy) {
  if (best_isa() == Isa::kScalar || !quant_repack_enabled())
    GTEST_SKIP() << "no panels here (the scalar path, or INFERA_QUANT_REPACK=0): the rows are read in place";
  const std::string gguf = gguf_of(model_dir(kQwen35Pages, "f32"), GgufOutType::kQ8_0, "q8_0");
  const std::vector<int32_t> prompt = prompt_of(kQwen35Pages.prompt_len, 320);
  LoadOptions in_memory;
  in_memory.load_into_memory = true;
  std::unique_ptr<Model> model = load_model(gguf, in_memory);
  const auto copies = copied_file_ranges();
  ASSERT_EQ(copies.size(), 1u) << "the one file read into memory";
  const auto [begin, end] = copies[0];
  const int64_t pages = static_cast<int64_t>((end - begin) / 4096), present = present_pages(begin, end / 4096 * 4096);
  ASSERT_GE(present, 0) << "cannot read /proc/self/pagemap";
  EXPECT_LT(present, pages / 4) << present << " of the copy's " << pages << " pages still resident";
  // The bytes given back read the same (from the file now).
  std::ifstream in(gguf, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(file.size(), end - begin);
  EXPECT_EQ(std::memcmp(file.data(), reinterpret_cast<const void*>(begin), file.size()), 0);
  const std::vector<float> got = all_logits(*model, prompt);
  int64_t params = 0;
  EXPECT_EQ(got, all_logits(gguf, prompt, &params)) << "read into memory and mapped: the same logits";
}

// The file rewritten with metadata key `key` set to `value` (or dropped, value empty).
std::string with_key(const std::string& gguf, const std::string& tag, const std::string& key,
                     std::optional<gguf::Value> value) {
  const std::string out = (kScratch / (fs::path(gguf).stem().string() + "-" + tag + ".gguf")).string();
  const gguf::Reader r(gguf);
  gguf::Writer w;
  for (const auto& [k, v] : r.metadata()) {
    if (k != key) w.set(k, v);
  }
  if (value) w.set(key, *value);
  for (const gguf::Tensor& t : r.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data);
  w.write(out);
  return out;
}

// Metadata that disagrees with the tensors is refused, naming what disagrees, at once: a
// block count of a million (which used to list tensors for minutes and take gigabytes before
// the first missing one), an MTP block count that leaves no trunk, and tensors the metadata
// leaves out (here DeepSeek's MTP block, read as a fourth trunk layer once its count is gone,
// and a Qwen3.5 layer past a smaller block_count), which would otherwise run, wrongly.
TEST(GgufMetadata, CountsThatDisagreeWithTheTensorsAreErrors) {
  const std::string ds = gguf_of(model_dir(kCases[3], "f32"), GgufOutType::kF32, "f32");
  ASSERT_NO_THROW(load_model_config(ds));
  const auto load_error = [](const std::string& file) {
    return test::error_of([&] {
      const ModelConfig cfg = load_model_config(file);
      open_gguf_weights(file, cfg);
    });
  };
  std::string e = load_error(with_key(ds, "layers", "deepseek2.block_count", gguf::Value::u32(1000000)));
  EXPECT_NE(e.find("1000000 layers (999999 + 1 MTP); Infera reads models of at most 1024 layers"), std::string::npos)
      << e;
  e = load_error(with_key(ds, "nextn", "deepseek2.nextn_predict_layers", gguf::Value::u32(4)));
  EXPECT_NE(e.find("deepseek2.nextn_predict_layers 4 must be at least 0 and below block_count 4"), std::string::npos)
      << e;
  e = load_error(with_key(ds, "no-nextn", "deepseek2.nextn_predict_layers", std::nullopt));
  EXPECT_NE(e.find("GGUF tensors are not part of the DeepSeek-V3 model the metadata describes (4 layers), e.g. "
                   "'blk.3.nextn."),
            std::string::npos)
      << e;
  // (`infera check` reports it too: the same binding, without the data.)
  const std::string no_nextn = (kScratch / (fs::path(ds).stem().string() + "-no-nextn.gguf")).string();
  // Found from the names, before a byte is read into memory or converted.
  for (const bool into_memory : {false, true}) {
    std::vector<std::string> steps;
    LoadProgress progress([&](const LoadProgress::Snapshot& s) {
      if (s.done > 0) steps.push_back(s.step);
    });
    e = test::error_of([&] { open_gguf_weights(no_nextn, load_model_config(no_nextn), into_memory, &progress); });
    EXPECT_NE(e.find("metadata and the tensors disagree"), std::string::npos) << e;
    EXPECT_TRUE(steps.empty()) << (into_memory ? "read into memory: " : "mapped: ") << steps.size()
                               << " progress updates with work done before the error, the first in step '"
                               << steps.front() << "'";
  }
  e = test::error_of([&] { inspect_gguf_weights(no_nextn, load_model_config(no_nextn)); });
  EXPECT_NE(e.find("metadata and the tensors disagree"), std::string::npos) << e;

  // The unsplit attn_kv_b beside attn_k_b / attn_v_b (as ik_llama.cpp's converter keeps it)
  // is the same weights again: left unread, not refused.
  {
    const std::string kv_b = (kScratch / (fs::path(ds).stem().string() + "-kv-b.gguf")).string();
    const gguf::Reader r(ds);
    gguf::Writer w;
    for (const auto& [k, v] : r.metadata()) w.set(k, v);
    int added = 0;
    for (const gguf::Tensor& t : r.tensors()) {
      w.add_tensor(t.name, t.type, t.ne, t.data);
      if (!t.name.ends_with("attn_k_b.weight")) continue;
      std::string name = t.name;
      w.add_tensor(name.replace(name.rfind("attn_k_b"), 8, "attn_kv_b"), t.type, t.ne, t.data);
      ++added;
    }
    w.write(kv_b);
    EXPECT_GT(added, 0);
    EXPECT_NO_THROW(open_gguf_weights(kv_b, load_model_config(kv_b)));
  }

  const std::string q35 = gguf_of(model_dir(kCases[0], "f32"), GgufOutType::kF32, "f32");
  const int64_t blocks = gguf::Reader(q35).find("qwen35moe.block_count")->to_i64();
  e = load_error(with_key(q35, "fewer", "qwen35moe.block_count", gguf::Value::u32(static_cast<uint32_t>(blocks - 1))));
  EXPECT_NE(e.find("not part of the Qwen3.5-MoE model the metadata describes"), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufArch, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace infera
