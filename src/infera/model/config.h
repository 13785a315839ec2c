// Normalized model configuration: every architecture's config.json is parsed into this
// one struct in one place (config.cpp). Variants come from explicit fields, never from
// layer counts or vocabulary sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace infera {

enum class Arch { kLlama, kQwen3, kQwen3Moe, kQwen3Next, kQwen35, kQwen35Moe, kDeepseekV3, kSentinel };

const char* arch_name(Arch a);

enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };

struct RopeConfig {
  float theta = 10000.0f;
  int rotary_dim = 0;  // dims rotated per head (head_dim * partial_rotary_factor)
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;   // llama3
  float high_freq_factor = 4.0f;  // llama3
  int original_max_position = 0;  // llama3, yarn
  float beta_fast = 32.0f;        // yarn
  float beta_slow = 1.0f;         // yarn
  float attention_factor = 1.0f;  // yarn: multiplies cos/sin (0.1 ln(factor) + 1 by default)
  float mscale = 0.0f;            // yarn (DeepSeek): 0 when absent; attention_factor already folds it in
  float mscale_all_dim = 0.0f;    // yarn (DeepSeek): 0 when absent
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string model_type;  // as in config.json
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;  // qwen3 family: per-head RMSNorm on q and k before RoPE
  RopeConfig rope;
  std::string torch_dtype;  // informational
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  // MoE (qwen3_moe and later): 0 experts = dense.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;

  bool is_moe_layer(int layer) const;
};

// Parses config.json content. `source` names the file in error messages. Throws
// infera::Error naming the missing/invalid field.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace infera
