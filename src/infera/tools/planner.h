// Memory and capacity planning: what a model needs per device for a given weight scheme,
// context, concurrency and tensor parallelism, before anything is loaded. Figures model
// what Infera allocates (f32 KV cache and f32 activations by default, f32 recurrent state
// of Gated DeltaNet layers, norms copied to f32), so a plan can be checked against the
// measured peak memory of `infera run`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "infera/model/config.h"
#include "infera/model/kv_pool.h"
#include "infera/model/tensor_table.h"
#include "infera/tensor/dtype.h"

namespace infera {

// The tensors a plan counts: the architecture's tensor table (model/tensor_table.h:
// expected_tensors(), WeightRole).

enum class WeightScheme { kF32, kBF16, kF16, kW8A8, kW4A8, kW4A16 };
// "f32" | "bf16" | "f16" | "w8a8" | "w4a8" | "w4a16"; throws infera::Error naming them.
WeightScheme parse_weight_scheme(const std::string& text);
const char* weight_scheme_name(WeightScheme s);
// Bytes of one [rows, cols] matrix in `scheme` (int4 with one f16 scale per group of
// `group_size` along cols; w8a8 with one f32 scale per row).
int64_t matrix_bytes(WeightScheme scheme, int64_t rows, int64_t cols, int64_t group_size);

// "24GiB", "24GB", "512MiB", "1.5TiB", "1000000": bytes. Throws infera::Error.
int64_t parse_byte_size(const std::string& text);
std::string format_bytes(int64_t bytes);  // "23.4 GiB"
std::string format_count(int64_t n);  // "32.76 B", "15.2 M", "260.1 K"

struct PlanOptions {
  WeightScheme scheme = WeightScheme::kBF16;
  int64_t group_size = 32;  // int4 schemes
  int64_t weights_bytes_override = 0;  // > 0: weights as measured from the files (whole model)
  int64_t ctx = 4096;  // tokens per sequence (prompt + output)
  int64_t concurrency = 1;  // sequences resident at once
  int tp = 1;  // tensor-parallel devices
  int64_t memory_bytes = 0;  // budget per device; 0 = none given
  DType kv_dtype = DType::kF32;  // KV cache storage, as --kv-dtype parses it (parse_kv_cache_dtype)
  int64_t prefill_chunk = 512;  // tokens per forward (scratch buffers are sized for it)
  int64_t block_size = 16;  // KV block size (tokens); contexts round up to blocks
  int64_t reserve_bytes =
      16ll << 20;  // runtime: code, libraries, tokenizer, threads (infera run on a tiny model peaks at ~14 MiB)
  bool include_mtp = true;  // MTP weights and its KV layer count when the config has one
  // Hybrids: recurrent-state checkpoints the prefix cache keeps (each one sequence's state;
  // docs/runtime.md). The engine takes them out of the KV budget; the plan adds them.
  int64_t prefix_checkpoints = 0;
};

struct DevicePlan {
  int device = 0;
  int64_t weights_bytes = 0;
  int64_t weights_quantized_bytes = 0;  // in the scheme
  int64_t weights_fallback_bytes = 0;  // embeddings, head, routers and gates at bf16, f32 vectors
  int64_t kv_bytes_per_token = 0;  // one token of one sequence, all KV layers on this device
  int64_t kv_bytes = 0;  // ctx (rounded to blocks) x concurrency
  int64_t state_bytes_per_sequence = 0;  // fixed recurrent state (GDN layers)
  int64_t state_bytes = 0;
  int64_t checkpoint_bytes_each = 0;  // one prefix-cache state checkpoint: the whole state, on device 0 only
  int64_t checkpoint_bytes = 0;  // PlanOptions::prefix_checkpoints of them
  int64_t activation_bytes = 0;
  int64_t reserve_bytes = 0;
  int64_t total_bytes = 0;
  int64_t budget_bytes = 0;  // 0: none given
  bool fits = true;
  int64_t max_context = 0;  // at the requested concurrency (0 = nothing fits); -1 without a budget
  int64_t max_concurrency = 0;  // at the requested context; -1 without a budget
};

struct Plan {
  std::string model_type;
  PlanOptions options;
  int64_t params_total = 0;
  int64_t params_active = 0;  // per token (MoE: k of E experts), MTP excluded
  int64_t params_mtp = 0;
  int kv_layers = 0;  // layers that keep KV (incl. MTP when counted)
  int recurrent_layers = 0;  // Gated DeltaNet layers (fixed state per sequence)
  int64_t kv_values_per_token_per_layer = 0;
  int64_t context_rounded = 0;
  int64_t model_max_context = 0;
  std::vector<DevicePlan> devices;
  std::vector<std::string> notes;

  nlohmann::json to_json() const;
  std::string to_text() const;
};

Plan plan_memory(const ModelConfig& cfg, const PlanOptions& options);

// Parameter counts from the config: {total, active per token, MTP}.
struct ParamCounts {
  int64_t total = 0;
  int64_t active = 0;
  int64_t mtp = 0;
};
ParamCounts count_parameters(const ModelConfig& cfg);

}  // namespace infera
