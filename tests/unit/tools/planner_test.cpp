// infera plan: figures against hand-computed arithmetic for two published configs, and
// parameter counts against the published totals.
#include "infera/tools/planner.h"

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"

namespace infera {
namespace {

using json = nlohmann::json;

ModelConfig example(const std::string& name) {
  std::ifstream in(std::string(INFERA_SOURCE_DIR) + "/examples/configs/" + name);
  return parse_model_config(json::parse(in), name);
}

constexpr int64_t kGiB = 1024ll * 1024 * 1024;

TEST(Planner, Qwen3_32B_Bf16_Tp2_HandComputed) {
  const ModelConfig c = example("Qwen3-32B.json");
  PlanOptions o;
  o.scheme = WeightScheme::kBF16;
  o.kv_dtype = DType::kBF16;
  o.ctx = 112000;
  o.concurrency = 4;
  o.tp = 2;
  o.memory_bytes = 80 * kGiB;
  o.prefill_chunk = 512;
  const Plan p = plan_memory(c, o);
  ASSERT_EQ(p.devices.size(), 2u);
  const DevicePlan& d = p.devices[0];

  // Per layer: q 8192x5120, k/v 1024x5120, o 5120x8192, gate/up/down 25600x5120 (3x).
  const int64_t layer_matrix_params = 5120ll * (8192 + 1024 + 1024 + 8192 + 3 * 25600);
  const int64_t layer_vector_params = 2 * 5120 + 2 * 128;  // two norms, q_norm, k_norm
  const int64_t vocab_params = 151936ll * 5120;  // embedding, and again for lm_head
  EXPECT_EQ(p.params_total, 64 * (layer_matrix_params + layer_vector_params) + 2 * vocab_params + 5120);
  EXPECT_NEAR(p.params_total / 1e9, 32.8, 0.05);  // published: 32.8 B
  EXPECT_EQ(p.params_active, p.params_total);

  // bf16 = 2 bytes; matrices and the vocabulary split over 2 devices; f32 vectors replicated.
  const int64_t weights =
      64 * layer_matrix_params * 2 / 2 + 2 * vocab_params * 2 / 2 + (64 * layer_vector_params + 5120) * 4;
  EXPECT_EQ(d.weights_bytes, weights);

  // KV: 64 layers x (K and V) x 4 of the 8 KV heads x 128 x 2 bytes = 128 KiB per token.
  EXPECT_EQ(d.kv_bytes_per_token, 64 * 2 * 4 * 128 * 2);
  EXPECT_EQ(d.kv_bytes_per_token, 131072);
  EXPECT_EQ(d.kv_bytes, 131072ll * 112000 * 4);  // 112000 is a whole number of 16-token blocks
  EXPECT_EQ(d.state_bytes, 0);

  // Activations, f32, 512 tokens: residual + normed (2 x 5120), q 32x128, k+v 2x4x128,
  // attention out 32x128, gate+up 2 x 12800; positions; 4 logits rows (75968 + 5120).
  const int64_t per_token = 2 * 5120 + 4096 + 1024 + 4096 + 2 * 12800;
  const int64_t act_fixed = 512 * per_token * 4 + 512 * 4;
  const int64_t per_seq_logits = (151936 / 2 + 5120) * 4;
  EXPECT_EQ(d.activation_bytes, act_fixed + 4 * per_seq_logits);
  EXPECT_EQ(d.total_bytes, weights + d.kv_bytes + d.activation_bytes + o.reserve_bytes);
  EXPECT_FALSE(d.fits);  // 30.5 GiB weights + 54.7 GiB KV > 80 GiB

  const int64_t left = 80 * kGiB - weights - act_fixed - o.reserve_bytes;
  EXPECT_EQ(d.max_context, (left - 4 * per_seq_logits) / (131072 * 4) / 16 * 16);
  EXPECT_EQ(d.max_concurrency, left / (131072ll * 112000 + per_seq_logits));
  EXPECT_EQ(d.max_concurrency, 3);
  EXPECT_GT(d.max_context, 90000);
  EXPECT_LT(d.max_context, 112000);

  const json j = p.to_json();
  for (const char* key : {"weights_bytes", "kv_bytes_per_token", "kv_bytes", "activation_bytes", "total_bytes", "fits",
                          "max_context", "max_concurrency", "devices"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["devices"].size(), 2u);
  EXPECT_EQ(j["devices"][1]["kv_bytes"].get<int64_t>(), d.kv_bytes);
}

// int4 with one f16 scale per 128 columns.
int64_t q4(int64_t rows, int64_t cols) { return rows * cols / 2 + rows * (cols / 128) * 2; }

TEST(Planner, Qwen35_35B_A3B_W4A16_HandComputed) {
  const ModelConfig c = example("Qwen3.5-35B-A3B.json");
  PlanOptions o;
  o.scheme = WeightScheme::kW4A16;
  o.group_size = 128;
  o.kv_dtype = DType::kBF16;
  o.ctx = 112000;
  o.concurrency = 4;
  o.tp = 1;
  o.memory_bytes = 24 * kGiB;
  const Plan p = plan_memory(c, o);
  const DevicePlan& d = p.devices.at(0);

  const int64_t H = 2048;
  // MoE block (every layer, and the MTP layer): router bf16, fused experts
  // [256, 2x512, 2048] + [256, 2048, 512], shared expert 512 wide, shared gate bf16.
  const int64_t moe = 256 * H * 2 + q4(256 * 1024, H) + q4(256 * H, 512) + 2 * q4(512, H) + q4(H, 512) + H * 2;
  // Gated attention: q (+gate) 16x256x2, k/v 2x256, o; q_norm/k_norm f32.
  const int64_t attn = q4(8192, H) + 2 * q4(512, H) + q4(H, 4096) + 2 * 256 * 4;
  // Gated DeltaNet: qkv 2x16x128 + 32x128 = 8192, z 4096, a/b bf16 [32, H], conv1d
  // [8192, 1, 4], dt_bias, A_log, norm f32, out_proj.
  const int64_t gdn = q4(8192, H) + q4(4096, H) + 2 * 32 * H * 2 + (8192 * 4 + 32 + 32 + 128) * 4 + q4(H, 4096);
  const int64_t norms = 2 * H * 4;
  const int64_t trunk = 10 * (attn + moe + norms) + 30 * (gdn + moe + norms);
  const int64_t vocab = 2 * 248320ll * H * 2;  // embedding + head, bf16 fallbacks
  const int64_t mtp = q4(H, 2 * H) + 3 * H * 4 + attn + moe + norms;
  EXPECT_EQ(d.weights_bytes, trunk + vocab + H * 4 + mtp);

  // KV: 10 full-attention layers + the MTP layer, 2 KV heads x 256, K and V, bf16.
  EXPECT_EQ(p.kv_layers, 11);
  EXPECT_EQ(d.kv_bytes_per_token, 11 * 2 * 2 * 256 * 2);
  EXPECT_EQ(d.kv_bytes, 22528ll * 112000 * 4);
  // Recurrent state: 30 GDN layers x (S 32x128x128 + conv window 3 x 8192) f32.
  EXPECT_EQ(d.state_bytes_per_sequence, 30ll * (32 * 128 * 128 + 3 * 8192) * 4);
  EXPECT_EQ(d.state_bytes, 4 * d.state_bytes_per_sequence);
  EXPECT_EQ(d.total_bytes, d.weights_bytes + d.kv_bytes + d.state_bytes + d.activation_bytes + o.reserve_bytes);
  // ~19.5 GiB of weights + 9.4 GiB of KV do not fit in 24 GiB; the answers say what does.
  EXPECT_FALSE(d.fits);
  const int64_t left = 24 * kGiB - d.weights_bytes - (d.activation_bytes - 4 * (248320 + H) * 4) - o.reserve_bytes;
  const int64_t per_seq_fixed = d.state_bytes_per_sequence + (248320 + H) * 4;
  EXPECT_EQ(d.max_context, (left - 4 * per_seq_fixed) / (22528 * 4) / 16 * 16);
  EXPECT_EQ(d.max_concurrency, left / (22528ll * 112000 + per_seq_fixed));
  EXPECT_GT(d.max_context, 20000);
  EXPECT_GE(d.max_concurrency, 1);
  // Parameter counts against the published size: ~35 B total, ~3 B active.
  EXPECT_NEAR(p.params_total / 1e9, 34.7, 1.0);
  EXPECT_NEAR(p.params_active / 1e9, 3.0, 0.5);
}

TEST(Planner, PublishedParameterCounts) {
  EXPECT_NEAR(count_parameters(example("Qwen3-30B-A3B.json")).total / 1e9, 30.5, 0.1);
  EXPECT_NEAR(count_parameters(example("Qwen3-30B-A3B.json")).active / 1e9, 3.3, 0.1);
  EXPECT_NEAR(count_parameters(example("DeepSeek-R1-Distill-Llama-70B.json")).total / 1e9, 70.6, 0.1);
  const ParamCounts v3 = count_parameters(example("DeepSeek-V3.json"));
  EXPECT_NEAR(v3.total / 1e9, 671, 2);
  EXPECT_NEAR(v3.active / 1e9, 37, 1.5);
  EXPECT_NEAR((v3.total + v3.mtp) / 1e9, 685, 3);
  EXPECT_NEAR(count_parameters(example("Qwen3.5-27B.json")).total / 1e9, 27, 1.5);
  EXPECT_NEAR(count_parameters(example("Qwen3.5-122B-A10B.json")).total / 1e9, 122, 4);
  EXPECT_NEAR(count_parameters(example("Qwen3.5-122B-A10B.json")).active / 1e9, 10, 1.5);
}

TEST(Planner, MlaKvIsCompressed) {
  const ModelConfig c = example("DeepSeek-V3.json");
  PlanOptions o;
  o.kv_dtype = DType::kBF16;
  o.tp = 8;
  o.ctx = 1024;
  const Plan p = plan_memory(c, o);
  // 61 layers + 1 MTP layer x 576 values x 2 bytes, the same on every device.
  EXPECT_EQ(p.devices[0].kv_bytes_per_token, 62 * 576 * 2);
  EXPECT_EQ(p.devices[7].kv_bytes_per_token, 62 * 576 * 2);
  o.include_mtp = false;
  EXPECT_EQ(plan_memory(c, o).devices[0].kv_bytes_per_token, 61 * 576 * 2);
  // int8: the latent as the pool stores it, K half and V half each with an f32 scale.
  o.kv_dtype = DType::kI8;
  EXPECT_EQ(plan_memory(c, o).devices[0].kv_bytes_per_token, 61 * (576 + 2 * 4));
  EXPECT_EQ(plan_memory(example("DeepSeek-V3.2.json"), o).devices[0].kv_bytes_per_token, 61 * (576 + 128 + 2 * 4));
  // DeepSeek-V3.2: plus the indexer's 128-value key per token and layer.
  o.kv_dtype = DType::kBF16;
  o.include_mtp = true;
  EXPECT_EQ(plan_memory(example("DeepSeek-V3.2.json"), o).devices[0].kv_bytes_per_token, 62 * (576 + 128) * 2);
}

TEST(Planner, SizesAndErrors) {
  EXPECT_EQ(parse_byte_size("24GiB"), 24 * kGiB);
  EXPECT_EQ(parse_byte_size("80GB"), 80000000000ll);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(parse_byte_size("512MiB"), 512ll << 20);
  EXPECT_EQ(parse_byte_size("1000"), 1000);
  EXPECT_THROW(parse_byte_size("lots"), Error);
  EXPECT_THROW(parse_byte_size("24 parsecs"), Error);
  EXPECT_THROW(parse_weight_scheme("w3a3"), Error);
  EXPECT_THROW(parse_kv_cache_dtype("fp4"), Error);
  EXPECT_EQ(matrix_bytes(WeightScheme::kW8A8, 10, 64, 0), 10 * 64 + 10 * 4);
  EXPECT_EQ(matrix_bytes(WeightScheme::kW4A8, 10, 64, 32), 10 * 32 + 10 * 2 * 2);
  PlanOptions o;
  o.tp = 0;
  EXPECT_THROW(plan_memory(example("Qwen3-32B.json"), o), Error);
}

}  // namespace
}  // namespace infera
