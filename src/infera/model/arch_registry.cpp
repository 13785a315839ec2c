#include "infera/model/arch_registry.h"

#include "infera/base/error.h"
#include "infera/io/safetensors.h"
#include "infera/model/model.h"
#include "infera/model/tensor_table.h"
#include "infera/model/weights.h"

namespace infera {

// The model files' create hooks (one per model file).
std::unique_ptr<Model> create_llama_model(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options);
std::unique_ptr<Model> create_qwen35_model(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options);
std::unique_ptr<Model> create_deepseek_model(const ModelConfig& cfg, ModelWeights weights, const LoadOptions& options);
// The config readers (model/config.cpp).
void read_dense_config(const ConfigReader& r, ModelConfig& c);
void read_qwen3_moe_config(const ConfigReader& r, ModelConfig& c);
void read_qwen35_config(const ConfigReader& r, ModelConfig& c);
void read_qwen35_moe_config(const ConfigReader& r, ModelConfig& c);
void read_qwen3_next_config(const ConfigReader& r, ModelConfig& c);
void read_deepseek_config(const ConfigReader& r, ModelConfig& c);
// The tensor tables (model/tensor_table.cpp).
void transformer_tensor_table(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out);
void hybrid_tensor_table(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out);
void deepseek_tensor_table(const ModelConfig& c, const HasTensor& has_tensor, std::vector<TensorSpec>& out);

namespace {

// The rows, one per architecture, in the order of the Arch values (arch_registry.h).
std::vector<ArchInfo> make_registry() {
  // Traits shared by the Qwen3 family and by its hybrids.
  constexpr ArchTraits kQwen3{.qwen3_defaults = true};
  constexpr ArchTraits kHybrid{.hybrid = true,
                               .qwen3_defaults = true,
                               .zero_centred_norms = true,
                               .plain_fallback = true};
  ArchTraits qwen3_next = kHybrid;
  qwen3_next.fused_gdn_projections = true;
  qwen3_next.mtp_from_tensors = true;
  ArchTraits qwen35 = kHybrid;
  qwen35.nested_text = true;
  qwen35.gguf_tiled_value_heads = true;
  ArchTraits qwen35_moe = qwen35;
  qwen35_moe.experts = ExpertLayout::kFused;
  return {
      {.arch = Arch::kLlama,
       .name = "llama",
       .model_types = {"llama"},
       .display_name = "Llama",
       .gguf_arch = "llama",
       .traits = {.gguf_permuted_qk = true},
       .read_config = read_dense_config,
       .tensors = transformer_tensor_table,
       .create = create_llama_model},  // model/transformer.cpp
      {.arch = Arch::kQwen3,
       .name = "qwen3",
       .model_types = {"qwen3"},
       .display_name = "Qwen3",
       .gguf_arch = "qwen3",
       .traits = kQwen3,
       .read_config = read_dense_config,
       .tensors = transformer_tensor_table,
       .create = create_llama_model},
      {.arch = Arch::kQwen3Moe,
       .name = "qwen3_moe",
       .model_types = {"qwen3_moe"},
       .display_name = "Qwen3-MoE",
       .gguf_arch = "qwen3moe",
       .traits = kQwen3,
       .read_config = read_qwen3_moe_config,
       .tensors = transformer_tensor_table,
       .create = create_llama_model},
      {.arch = Arch::kQwen3Next,
       .name = "qwen3_next",
       .model_types = {"qwen3_next"},
       .display_name = "Qwen3-Next",
       .gguf_arch = "qwen3next",
       .traits = qwen3_next,
       .read_config = read_qwen3_next_config,
       .tensors = hybrid_tensor_table,
       .create = create_qwen35_model},  // model/qwen35.cpp
      {.arch = Arch::kQwen35,
       .name = "qwen3_5",
       .model_types = {"qwen3_5", "qwen3_5_text"},
       .display_name = "Qwen3.5",
       .gguf_arch = "qwen35",
       .traits = qwen35,
       .read_config = read_qwen35_config,
       .tensors = hybrid_tensor_table,
       .create = create_qwen35_model},
      {.arch = Arch::kQwen35Moe,
       .name = "qwen3_5_moe",
       .model_types = {"qwen3_5_moe", "qwen3_5_moe_text"},
       .display_name = "Qwen3.5-MoE",
       .gguf_arch = "qwen35moe",
       .traits = qwen35_moe,
       .read_config = read_qwen35_moe_config,
       .tensors = hybrid_tensor_table,
       .create = create_qwen35_model},
      {.arch = Arch::kDeepseekV3,
       .name = "deepseek_v3",
       .model_types = {"deepseek_v3"},
       .display_name = "DeepSeek-V3",
       .gguf_arch = "deepseek2",
       .traits = {.mla = true},
       .read_config = read_deepseek_config,
       .tensors = deepseek_tensor_table,
       .create = create_deepseek_model},  // model/deepseek.cpp
      // DeepSeek-V3.2: V3 plus the lightning indexer (sparse attention), the same model file.
      {.arch = Arch::kDeepseekV32,
       .name = "deepseek_v32",
       .model_types = {"deepseek_v32"},
       .display_name = "DeepSeek-V3.2",
       .gguf_arch = "deepseek32",
       .traits = {.mla = true},
       .read_config = read_deepseek_config,
       .tensors = deepseek_tensor_table,
       .create = create_deepseek_model},
  };
}

}  // namespace

const std::vector<ArchInfo>& arch_registry() {
  static const std::vector<ArchInfo> rows = make_registry();
  return rows;
}

const ArchInfo& arch_info(Arch arch) {
  for (const ArchInfo& a : arch_registry()) {
    if (a.arch == arch) return a;
  }
  fail("architecture #{} is not registered", static_cast<int>(arch));
}

const ArchInfo* find_arch(std::string_view model_type) {
  for (const ArchInfo& a : arch_registry()) {
    for (std::string_view t : a.model_types) {
      if (t == model_type) return &a;
    }
  }
  return nullptr;
}

std::string known_model_types() {
  std::string s;
  for (const ArchInfo& a : arch_registry()) {
    for (std::string_view t : a.model_types) {
      if (t.ends_with("_text")) continue;  // the text-only wrappers' alias, not worth listing
      s += (s.empty() ? "" : ", ") + std::string(t);
    }
  }
  return s;
}

std::string runnable_arch_names() {
  std::string s;
  for (const ArchInfo& a : arch_registry()) {
    if (a.runnable()) s += (s.empty() ? "" : ", ") + std::string(a.name);
  }
  return s;
}

std::string gguf_export_arch_names() {
  std::string s;
  for (const ArchInfo& a : arch_registry()) {
    if (a.gguf_arch != nullptr) s += (s.empty() ? "" : ", ") + std::string(a.name);
  }
  return s;
}

const char* arch_name(Arch a) {
  for (const ArchInfo& row : arch_registry()) {
    if (row.arch == a) return row.name;
  }
  return "?";
}

std::string text_prefix(const ModelConfig& cfg, const HasTensor& has_tensor) {
  if (arch_info(cfg.arch).traits.nested_text) {
    const std::string nested = "model.language_model.";
    if (!has_tensor) return nested;  // no checkpoint: the published layout
    if (has_tensor(nested + "embed_tokens.weight") || has_tensor(nested + "embed_tokens.weight.qweight")) return nested;
  }
  return "model.";
}

ExpertLayout stored_expert_layout(const ModelConfig& cfg, const std::string& mlp_prefix, const HasTensor& has_tensor) {
  const std::string fused = mlp_prefix + "experts.gate_up_proj";
  if (has_tensor(fused) || has_tensor(fused + ".qweight")) return ExpertLayout::kFused;
  const std::string first = mlp_prefix + "experts.0.gate_proj.weight";
  if (has_tensor(first) || has_tensor(first + ".qweight")) return ExpertLayout::kPerExpert;
  return arch_info(cfg.arch).traits.experts;
}

int mtp_layers(const ModelConfig& cfg, const HasTensor& has_tensor) {
  if (arch_info(cfg.arch).traits.mtp_from_tensors && cfg.num_mtp_layers() == 0) {
    return stored_mtp_layers(has_tensor);
  }
  return cfg.num_mtp_layers();
}

SequenceGeometry sequence_geometry(const ModelConfig& c, int with_mtp_layers, DType kv_dtype, int64_t block_size) {
  SequenceGeometry g;
  g.kv.num_layers = c.num_full_attention_layers() + with_mtp_layers;
  g.kv.block_size = block_size;
  g.kv.dtype = kv_dtype;
  if (c.mla) {
    // The latent c_kv and the shared k_pe: one "head" of kv_lora_rank + qk_rope_head_dim,
    // counted once (K) and its V half empty; KvPoolShape has no MLA layout yet, so the
    // whole latent is modelled as one head of half the width twice.
    g.kv.n_kv_heads = 1;
    g.kv.head_dim = (c.kv_values_per_token_per_layer() + 1) / 2;
  } else {
    g.kv.n_kv_heads = c.num_kv_heads;
    g.kv.head_dim = c.head_dim;
  }
  g.recurrent_layers = c.num_layers - c.num_full_attention_layers();
  if (g.recurrent_layers > 0) {
    const int64_t conv_dim = 2LL * c.linear_num_key_heads * c.linear_key_head_dim +
                             static_cast<int64_t>(c.linear_num_value_heads) * c.linear_value_head_dim;
    const int64_t floats = (c.linear_conv_kernel_dim - 1) * conv_dim + static_cast<int64_t>(c.linear_num_value_heads) *
                                                                           c.linear_key_head_dim *
                                                                           c.linear_value_head_dim;
    g.state_bytes = g.recurrent_layers * floats * static_cast<int64_t>(sizeof(float));
  }
  return g;
}

}  // namespace infera
