// Normalized model configuration: every architecture's config.json is parsed into this
// one struct in one place (config.cpp). Variants come from explicit fields, never from
// layer counts or vocabulary sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace infera {

// An architecture: the id of its row in the registry, where the values are listed beside
// the rows (model/arch_registry.h). 0 is Llama.
enum class Arch : int;

const char* arch_name(Arch a);

enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };

struct RopeConfig {
  float theta = 10000.0f;
  int rotary_dim = 0;  // dims rotated per head (head_dim * partial_rotary_factor)
  RopeScaling scaling = RopeScaling::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;  // llama3
  float high_freq_factor = 4.0f;  // llama3
  int original_max_position = 0;  // llama3, yarn
  float beta_fast = 32.0f;  // yarn
  float beta_slow = 1.0f;  // yarn
  float attention_factor = 1.0f;  // yarn: multiplies cos/sin (0.1 ln(factor) + 1 by default)
  float mscale = 0.0f;  // yarn (DeepSeek): 0 when absent; attention_factor already folds it in
  float mscale_all_dim = 0.0f;  // yarn (DeepSeek): 0 when absent
  // Per-frequency divisors of inv_freq (rotary_dim / 2 of them), after any scaling above:
  // a GGUF's rope_freqs.weight (llama.cpp's form of Llama 3 scaling); empty: none.
  std::vector<float> freq_factors;
};

// The most layers (trunk and MTP) and experts in all (layers x experts) a config may give:
// far above any published model, they bound what a config or GGUF header can make a load
// list before its checkpoint is read (parse_model_config).
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxExpertsInAll = int64_t{1} << 18;

struct ModelConfig {
  Arch arch{};  // Arch::kLlama unless config.json names another
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
  // q_proj / k_proj rows in llama.cpp's order (a `llama` GGUF file): within each head, rows
  // 2i and 2i + 1 are Hugging Face's rows i and head_dim / 2 + i (the rotary pairs adjacent).
  // The weights stay as stored; the model restores Hugging Face's order on q and k.
  bool qk_rows_pairs_adjacent = false;
  // Gated DeltaNet value heads in llama.cpp's tiled order (a Qwen3.5 GGUF file with more value
  // than key heads): value head j of Hugging Face's grouped order is head (j % r) Hk + j / r
  // (r = Hv / Hk) of in_proj_qkv's v rows, in_proj_z / in_proj_b / in_proj_a rows and
  // out_proj's columns. Those matrices stay as stored; the layer moves its activations.
  bool gdn_value_heads_tiled = false;
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

  // ---- Hybrid attention (qwen3_next, qwen3_5, qwen3_5_moe) ---------------------------
  // Layers are full (softmax) attention or linear attention (Gated DeltaNet, which keeps a
  // fixed-size recurrent state instead of a KV cache). Empty layer_types = all full.
  enum class LayerType { kFullAttention, kLinearAttention };
  std::vector<LayerType> layer_types;  // one per layer, from layer_types or full_attention_interval
  int full_attention_interval = 0;  // 0 when layer_types was given or the family has none
  bool attn_output_gate = false;  // q_proj also yields a sigmoid gate on the attention output
  float partial_rotary_factor = 1.0f;  // rope.rotary_dim = head_dim * this
  int linear_conv_kernel_dim = 0;  // GDN causal depthwise conv width (4)
  int linear_key_head_dim = 0;  // dk (128)
  int linear_value_head_dim = 0;  // dv (128)
  int linear_num_key_heads = 0;  // Hk (16)
  int linear_num_value_heads = 0;  // Hv (32)
  std::string mamba_ssm_dtype;  // recurrent-state dtype ("float32"), informational
  int shared_expert_intermediate_size = 0;  // 0 = no shared expert
  int mtp_num_hidden_layers = 0;  // multi-token-prediction layers (Qwen3.5: 1)

  bool is_linear_attention_layer(int layer) const;
  int num_full_attention_layers() const;  // layers that keep a KV cache

  // ---- MLA + DeepSeek MoE (deepseek_v3, deepseek_v32) -----------------------------
  // For deepseek_v3, head_dim = qk_nope_head_dim + qk_rope_head_dim (the q/k head width)
  // and rope.rotary_dim = qk_rope_head_dim; num_experts = n_routed_experts.
  bool mla = false;
  int q_lora_rank = 0;  // 0 = q projected directly (no low-rank q)
  int kv_lora_rank = 0;  // compressed KV width (512)
  int qk_nope_head_dim = 0;  // 128
  int qk_rope_head_dim = 0;  // 64
  int v_head_dim = 0;  // 128
  int n_shared_experts = 0;  // shared experts, each moe_intermediate_size wide
  int first_k_dense_replace = 0;  // layers [0, k) use the dense MLP
  int moe_layer_freq = 1;  // layer i >= k is MoE iff i % moe_layer_freq == 0
  int n_group = 0;  // expert groups for group-limited routing
  int topk_group = 0;
  float routed_scaling_factor = 1.0f;
  std::string scoring_func;  // "sigmoid" | "softmax"
  std::string topk_method;  // "noaux_tc" | "greedy" | ...
  int num_nextn_predict_layers = 0;  // MTP layers (stored after the trunk, model.layers.{n})
  int index_n_heads = 0;  // DeepSeek-V3.2 lightning indexer (0 = none)
  int index_head_dim = 0;
  int index_topk = 0;

  // Values cached per token per attention layer: MLA caches c_kv ⊕ k_pe
  // (kv_lora_rank + qk_rope_head_dim = 576; V3.2 also the indexer key, index_head_dim),
  // others 2 * num_kv_heads * head_dim.
  int64_t kv_values_per_token_per_layer() const;
  // Multi-token-prediction layers of either family.
  int num_mtp_layers() const { return mtp_num_hidden_layers + num_nextn_predict_layers; }

  bool is_moe_layer(int layer) const;
};

// Which head of llama.cpp's tiled order holds value head j of Hugging Face's grouped order, of
// hv value heads reading hk key heads (ModelConfig::gdn_value_heads_tiled).
inline int64_t tiled_value_head(int64_t j, int64_t hk, int64_t hv) {
  const int64_t r = hv / hk;
  return (j % r) * hk + j / r;
}

// Parses config.json content. `source` names the file in error messages. Throws
// infera::Error naming the missing/invalid field.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace infera
