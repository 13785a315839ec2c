// The architecture registry: every architecture Infera knows, as data. One row per
// architecture holds the config.json model_type values that select it, its names, its
// traits (what the loaders, `infera check`, `infera plan`, `infera quantize` and
// `infera convert` would otherwise each decide for themselves) and the functions that
// make it: the tensor table (model/tensor_table.h) and, when Infera can run it, the model
// file's create function. Adding an architecture is one row here plus one model file
// (docs/model.md, "Adding an architecture").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "infera/model/config.h"
#include "infera/model/kv_pool.h"

namespace infera {

class Model;
class ConfigReader;
class ModelWeights;
struct LoadOptions;
struct TensorSpec;

// One value per row, in the rows' order (model/config.h declares the type; ModelConfig::arch
// starts at the first, Llama).
enum class Arch : int {
  kLlama,
  kQwen3,
  kQwen3Moe,
  kQwen3Next,
  kQwen35,
  kQwen35Moe,
  kDeepseekV3,
  kDeepseekV32,
  kSentinel
};

// A checkpoint's tensor names: true when `name` is stored.
using HasTensor = std::function<bool(const std::string& name)>;

// How a checkpoint stores routed experts (ARCHITECTURES.md section 0.3).
enum class ExpertLayout {
  kPerExpert,  // mlp.experts.{e}.{gate,up,down}_proj.weight
  kFused,  // mlp.experts.gate_up_proj [E, 2I, H] + mlp.experts.down_proj [E, H, I]
};

struct ArchTraits {
  // Layers mix Gated DeltaNet linear attention (a fixed recurrent state per sequence) and
  // full attention (a KV cache); the layer_types / full_attention_interval config keys.
  bool hybrid = false;
  bool mla = false;  // multi-head latent attention (DeepSeek): a compressed KV cache
  bool qwen3_defaults = false;  // Qwen3Config defaults (head_dim 128, 32768 positions) and q/k norm
  // Multimodal wrapper: the text model may live under model.language_model.* (published
  // checkpoints) instead of model.* (text-only exports); text_prefix() decides per checkpoint.
  bool nested_text = false;
  bool zero_centred_norms = false;  // RMSNorm weights applied as (1 + w)
  bool fused_gdn_projections = false;  // in_proj_qkvz / in_proj_ba (Qwen3-Next) instead of split
  bool mtp_from_tensors = false;  // config.json does not declare the MTP head; the mtp.* tensors do
  // A quantized checkpoint may store any matrix plainly without an override naming it (GDN
  // gate projections; directories quantized before these layers were): SafetensorsSource.
  bool plain_fallback = false;
  ExpertLayout experts = ExpertLayout::kPerExpert;  // the layout published checkpoints use
  // llama.cpp's converter permutes q/k rows for its rope layout (convert writes them so,
  // the GGUF loader undoes it): its llama architecture.
  bool gguf_permuted_qk = false;
  // llama.cpp's converter tiles the Gated DeltaNet value heads (GgufForm::kValueHeads): its
  // qwen35 architectures; its qwen3next keeps Hugging Face's order (grouped by key head).
  bool gguf_tiled_value_heads = false;
};

// The model file's hook: binds its weights by role ((layer, slot) of the tensor table, from
// whatever checkpoint format `weights` reads) and returns the model, whose forward() (and
// MtpHead::draft(), when it has an MTP head) run it.
using CreateModelFn = std::unique_ptr<Model> (*)(const ModelConfig& cfg, ModelWeights weights,
                                                 const LoadOptions& options);
// Reads the architecture's own config.json keys into cfg, after the keys every architecture
// shares (sizes, heads, vocabulary) and before RoPE (model/config.cpp has the shared ones).
using ReadConfigFn = void (*)(const ConfigReader& r, ModelConfig& cfg);
// Appends the architecture's tensor table (model/tensor_table.h).
using TensorTableFn = void (*)(const ModelConfig& cfg, const HasTensor& has_tensor, std::vector<TensorSpec>& out);

struct ArchInfo {
  Arch arch = Arch::kSentinel;
  const char* name = "";  // Infera's name ("qwen3_5_moe"), also in check/plan output
  std::vector<std::string_view> model_types;  // config.json model_type values selecting it
  const char* display_name = "";  // "Qwen3.5-MoE"
  const char* gguf_arch = nullptr;  // llama.cpp's general.architecture; nullptr: no GGUF export
  ArchTraits traits;
  // The hooks, in the order a load runs them: read the config, list the tensors (which the
  // loaders bind by role: ModelWeights, model/weights.h), create the model (its forward
  // and, with an MTP head, its draft).
  ReadConfigFn read_config = nullptr;
  TensorTableFn tensors = nullptr;  // every tensor of the text model and MTP head
  CreateModelFn create = nullptr;  // nullptr: recognised (check, plan) but not runnable
  bool runnable() const { return create != nullptr; }
};

// All rows, in a fixed order.
const std::vector<ArchInfo>& arch_registry();
const ArchInfo& arch_info(Arch arch);
// nullptr when no row lists the model_type.
const ArchInfo* find_arch(std::string_view model_type);
// "llama, qwen3, ..." (every model_type, or only the runnable architectures' names).
std::string known_model_types();
std::string runnable_arch_names();
// "llama, qwen3, ...": the architectures `infera convert --to gguf` writes (a gguf_arch).
std::string gguf_export_arch_names();

// Where the text model's tensors live: "model.language_model." when the architecture may
// nest it and the checkpoint does (the embedding table, float or quantized, is there),
// else "model.". Without has_tensor (no checkpoint): the published layout.
std::string text_prefix(const ModelConfig& cfg, const HasTensor& has_tensor);

// How the MoE block under `mlp_prefix` ("model.layers.3.mlp.") stores its experts: fused
// when experts.gate_up_proj (float or quantized) is there, per expert when experts.0.* is,
// else the architecture's usual layout.
ExpertLayout stored_expert_layout(const ModelConfig& cfg, const std::string& mlp_prefix, const HasTensor& has_tensor);

// MTP layers the model has: the config's, or for an architecture whose config.json does
// not declare its head (Qwen3-Next), those the checkpoint stores.
int mtp_layers(const ModelConfig& cfg, const HasTensor& has_tensor);

// ---- KV and recurrent-state geometry ----
// What one sequence costs beyond the weights: the KV pool's shape (full-attention layers,
// plus `with_mtp_layers` MTP layers that keep their own KV) and the fixed recurrent state
// of the linear-attention layers. The models' kv_shape() and state size come from here,
// and so does every figure the server and the planner check before a model is loaded.
struct SequenceGeometry {
  KvPoolShape kv;  // num_blocks 0; n_kv_heads of one process (no TP)
  int32_t recurrent_layers = 0;  // Gated DeltaNet layers
  int64_t state_bytes = 0;  // per sequence: conv windows + delta-rule states, f32
};
SequenceGeometry sequence_geometry(const ModelConfig& cfg, int with_mtp_layers, DType kv_dtype = DType::kF32,
                                   int64_t block_size = 16);

}  // namespace infera
