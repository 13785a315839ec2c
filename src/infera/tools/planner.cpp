#include "infera/tools/planner.h"
#include "infera/base/ascii.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/model/arch_registry.h"
#include "infera/model/kv_pool.h"

namespace infera {
namespace {

using json = nlohmann::json;

}  // namespace

WeightScheme parse_weight_scheme(const std::string& text) {
  if (text == "f32") return WeightScheme::kF32;
  if (text == "bf16") return WeightScheme::kBF16;
  if (text == "f16") return WeightScheme::kF16;
  if (text == "w8a8") return WeightScheme::kW8A8;
  if (text == "w4a8") return WeightScheme::kW4A8;
  if (text == "w4a16") return WeightScheme::kW4A16;
  fail("unknown weight scheme '{}' (expected f32, bf16, f16, w8a8, w4a8 or w4a16)", text);
}

const char* weight_scheme_name(WeightScheme s) {
  switch (s) {
    case WeightScheme::kF32: return "f32";
    case WeightScheme::kBF16: return "bf16";
    case WeightScheme::kF16: return "f16";
    case WeightScheme::kW8A8: return "w8a8";
    case WeightScheme::kW4A8: return "w4a8";
    case WeightScheme::kW4A16: return "w4a16";
  }
  return "?";
}

int64_t matrix_bytes(WeightScheme scheme, int64_t rows, int64_t cols, int64_t group_size) {
  switch (scheme) {
    case WeightScheme::kF32: return rows * cols * 4;
    case WeightScheme::kBF16:
    case WeightScheme::kF16: return rows * cols * 2;
    case WeightScheme::kW8A8: return rows * cols + rows * 4;  // int8 + f32 scale per row
    case WeightScheme::kW4A8:
    case WeightScheme::kW4A16: {
      const int64_t groups = (cols + group_size - 1) / group_size;
      return rows * ((cols + 1) / 2) + rows * groups * 2;  // packed int4 + f16 scale per group
    }
  }
  return 0;
}

int64_t parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  double value = 0;
  try {
    if (i == 0) throw std::invalid_argument("no number");
    value = std::stod(text.substr(0, i));
  } catch (const std::exception&) {
    fail("'{}' is not a size (examples: 24GiB, 80GB, 512MiB, 1000000)", text);
  }
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  unit = ascii_lower(unit);
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "t" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "tb")
    mult = 1e12;
  else
    fail("'{}': unknown size unit '{}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", text, unit);
  const double bytes = value * mult;
  if (!(bytes >= 0) || bytes > 9e18) fail("'{}' is out of range", text);
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (std::abs(b) >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (std::abs(b) >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (std::abs(b) >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string format_count(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.2f} B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.1f} M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f} K", x / 1e3);
  return fmt::format("{}", n);
}

ParamCounts count_parameters(const ModelConfig& cfg) {
  ParamCounts p;
  int64_t experts = 0;
  for (const ExpectedTensor& t : expected_tensors(cfg)) {
    const int64_t n = t.numel();
    if (t.mtp) {
      p.mtp += n;
      continue;
    }
    p.total += n;
    if (t.role == WeightRole::kExpert) experts += n;
  }
  // Each token runs k of the E routed experts.
  const int64_t inactive =
      cfg.num_experts > 0 ? experts / cfg.num_experts * (cfg.num_experts - cfg.num_experts_per_tok) : 0;
  p.active = p.total - inactive;
  return p;
}

Plan plan_memory(const ModelConfig& c, const PlanOptions& o) {
  if (o.tp < 1) fail("--tp must be at least 1, got {}", o.tp);
  if (o.ctx < 1) fail("--ctx must be positive, got {}", o.ctx);
  if (o.concurrency < 1) fail("--concurrency must be positive, got {}", o.concurrency);
  if (o.prefill_chunk < 1) fail("--prefill-chunk must be positive, got {}", o.prefill_chunk);
  const int64_t tp = o.tp;
  auto split = [tp](int64_t n) { return (n + tp - 1) / tp; };

  Plan plan;
  plan.model_type = c.model_type;
  plan.options = o;
  const ParamCounts params = count_parameters(c);
  plan.params_total = params.total;
  plan.params_active = params.active;
  plan.params_mtp = params.mtp;
  const bool mtp = o.include_mtp && c.num_mtp_layers() > 0;

  // ---- Weights: column/row-parallel matrices and the vocabulary split across devices;
  // vectors replicated.
  int64_t quantized = 0, fallback = 0;
  const bool float_scheme =
      o.scheme == WeightScheme::kF32 || o.scheme == WeightScheme::kBF16 || o.scheme == WeightScheme::kF16;
  const WeightScheme keep = o.scheme == WeightScheme::kF32 ? WeightScheme::kF32 : WeightScheme::kBF16;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    if (t.mtp && !mtp) continue;
    if (t.role == WeightRole::kVector) {
      fallback += t.numel() * 4;
      continue;
    }
    // Matrices: [rows, cols] or experts [E, rows, cols].
    const int64_t cols = t.shape.back();
    const int64_t rows = t.numel() / cols;
    const bool in_scheme = t.role == WeightRole::kLinear || t.role == WeightRole::kExpert;
    const int64_t bytes = split(matrix_bytes(in_scheme ? o.scheme : keep, rows, cols, o.group_size));
    if (in_scheme && !float_scheme)
      quantized += bytes;
    else if (in_scheme)
      quantized += bytes;
    else
      fallback += bytes;
  }
  if (o.weights_bytes_override > 0) {
    plan.notes.push_back("weights as stored in the model's files");
    quantized = split(o.weights_bytes_override);
    fallback = 0;
  }

  // ---- KV cache: full-attention layers (+ the MTP layer's own); MLA keeps the compressed
  // latent (kv_lora_rank + rope dims) per token, replicated on every device.
  plan.kv_layers = c.num_full_attention_layers() + (mtp ? c.num_mtp_layers() : 0);
  plan.recurrent_layers = c.num_layers - c.num_full_attention_layers();
  plan.kv_values_per_token_per_layer = c.kv_values_per_token_per_layer();
  int64_t kv_per_token = 0;
  if (c.mla) {
    // The latent, as the KV pool holds it (sequence_geometry: one KV head, K half and V
    // half; int8 with an f32 scale per half row).
    KvPoolShape pool = sequence_geometry(c, 0, o.kv_dtype, o.block_size).kv;
    pool.num_layers = plan.kv_layers;
    kv_per_token = pool.bytes_per_token();  // V3.2: the indexer key is part of the row
  } else {
    // Exactly what the KV pool allocates (model/kv_pool.h): int8 with an f32 scale per
    // token and KV head, for K and for V. KV heads split across devices; with more devices
    // than KV heads each keeps a replica.
    KvPoolShape pool;
    pool.num_layers = plan.kv_layers;
    pool.n_kv_heads = split(c.num_kv_heads);
    pool.head_dim = c.head_dim;
    pool.dtype = o.kv_dtype;
    kv_per_token = pool.bytes_per_token();
  }
  plan.context_rounded = (o.ctx + o.block_size - 1) / o.block_size * o.block_size;
  plan.model_max_context = c.max_position_embeddings;

  // ---- Recurrent state (Gated DeltaNet): S [Hv, dk, dv] f32 + conv window [K-1, conv_dim] f32.
  int64_t state_per_seq = 0;
  if (plan.recurrent_layers > 0) {
    const int64_t hv = split(c.linear_num_value_heads), hk = split(c.linear_num_key_heads);
    const int64_t conv_dim = 2 * hk * c.linear_key_head_dim + hv * c.linear_value_head_dim;
    state_per_seq = plan.recurrent_layers *
                    (hv * c.linear_key_head_dim * c.linear_value_head_dim + (c.linear_conv_kernel_dim - 1) * conv_dim) *
                    4;
  }

  // ---- Activations: f32 scratch of one forward over T tokens (the prefill chunk, or the
  // decode batch when larger), all buffers live at once as Infera allocates them.
  const int64_t T = std::max(o.prefill_chunk, o.concurrency);
  const int64_t H = c.hidden_size;
  int64_t per_token = 2 * H;  // residual stream + normed input
  if (c.mla) {
    const int64_t nh = split(c.num_heads);
    per_token += nh * c.head_dim + (c.kv_lora_rank + c.qk_rope_head_dim) + nh * (c.qk_nope_head_dim + c.v_head_dim) +
                 nh * c.v_head_dim + std::max<int64_t>(c.q_lora_rank, 0);
  } else {
    const int64_t q_dim = split(c.num_heads) * c.head_dim, kv_dim = split(c.num_kv_heads) * c.head_dim;
    per_token += q_dim * (c.attn_output_gate ? 2 : 1) + 2 * kv_dim + q_dim;  // q (+gate), k, v, attention out
  }
  if (plan.recurrent_layers > 0) {
    const int64_t hv = split(c.linear_num_value_heads), hk = split(c.linear_num_key_heads);
    per_token += 2 * hk * c.linear_key_head_dim + 3 * hv * c.linear_value_head_dim + 2 * hv;  // qkv, z, out, a/b
  }
  int64_t ffn = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    if (!c.is_moe_layer(i)) ffn = std::max<int64_t>(ffn, c.intermediate_size);
  }
  if (c.num_experts > 0) {
    const int64_t shared = c.mla ? c.moe_intermediate_size * c.n_shared_experts : c.shared_expert_intermediate_size;
    // Routed rows (k per token) plus the shared expert; router probabilities.
    ffn = std::max(ffn, c.num_experts_per_tok * c.moe_intermediate_size + shared);
    per_token += c.num_experts;
  }
  per_token += 2 * split(ffn);  // gate, up
  const int64_t logit_rows = std::min(o.concurrency, T);
  const int64_t logits_per_seq = split(c.vocab_size) * 4 + H * 4;  // logits row + its hidden row
  const int64_t activation_fixed = T * per_token * 4 + T * 4;  // + positions
  const int64_t activations = activation_fixed + logit_rows * logits_per_seq;

  for (int d = 0; d < o.tp; ++d) {
    DevicePlan dp;
    dp.device = d;
    dp.weights_quantized_bytes = quantized;
    dp.weights_fallback_bytes = fallback;
    dp.weights_bytes = quantized + fallback;
    dp.kv_bytes_per_token = kv_per_token;
    dp.kv_bytes = kv_per_token * plan.context_rounded * o.concurrency;
    dp.state_bytes_per_sequence = state_per_seq;
    dp.state_bytes = state_per_seq * o.concurrency;
    // Rank 0 keeps the checkpoints whole (every rank's part; docs/runtime.md).
    dp.checkpoint_bytes_each = d == 0 ? state_per_seq * o.tp : 0;
    dp.checkpoint_bytes = dp.checkpoint_bytes_each * o.prefix_checkpoints;
    dp.activation_bytes = activations;
    dp.reserve_bytes = o.reserve_bytes;
    dp.total_bytes =
        dp.weights_bytes + dp.kv_bytes + dp.state_bytes + dp.checkpoint_bytes + dp.activation_bytes + dp.reserve_bytes;
    dp.budget_bytes = o.memory_bytes;
    if (o.memory_bytes > 0) {
      dp.fits = dp.total_bytes <= o.memory_bytes;
      const int64_t fixed = dp.weights_bytes + activation_fixed + dp.reserve_bytes;
      const int64_t left = o.memory_bytes - fixed;
      // Largest context at this concurrency: whole blocks per sequence.
      const int64_t per_seq_fixed = state_per_seq + std::min(o.concurrency, T) * logits_per_seq / o.concurrency;
      const int64_t for_kv = left - o.concurrency * per_seq_fixed;
      if (for_kv <= 0 || kv_per_token == 0) {
        dp.max_context = for_kv > 0 ? plan.model_max_context : 0;
      } else {
        const int64_t tokens = for_kv / (kv_per_token * o.concurrency);
        dp.max_context = tokens / o.block_size * o.block_size;
      }
      // Largest concurrency at this context.
      const int64_t per_seq = kv_per_token * plan.context_rounded + state_per_seq + logits_per_seq;
      dp.max_concurrency = left > 0 ? left / per_seq : 0;
    } else {
      dp.max_context = -1;
      dp.max_concurrency = -1;
    }
    plan.devices.push_back(dp);
  }
  if (plan.context_rounded > plan.model_max_context) {
    plan.notes.push_back(
        fmt::format("--ctx {} exceeds max_position_embeddings {} of the config", o.ctx, plan.model_max_context));
  }
  if (!c.mla && o.tp > c.num_kv_heads) {
    plan.notes.push_back(fmt::format("--tp {} exceeds the {} KV heads: each device keeps a replica of one KV head",
                                     o.tp, c.num_kv_heads));
  }
  if (plan.recurrent_layers > 0) {
    plan.notes.push_back(
        fmt::format("{} Gated DeltaNet layers keep a fixed f32 state per sequence instead of a KV cache",
                    plan.recurrent_layers));
  }
  if (c.mla)
    plan.notes.push_back(
        "MLA: the KV cache holds the compressed latent (kv_lora_rank + qk_rope_head_dim values per token and layer)");
  if (c.index_n_heads > 0)
    plan.notes.push_back(
        fmt::format("DSA: the lightning indexer's key adds {} values per token and layer", c.index_head_dim));
  return plan;
}

json Plan::to_json() const {
  json devs = json::array();
  for (const DevicePlan& d : devices) {
    devs.push_back({{"device", d.device},
                    {"weights_bytes", d.weights_bytes},
                    {"weights_quantized_bytes", d.weights_quantized_bytes},
                    {"weights_fallback_bytes", d.weights_fallback_bytes},
                    {"kv_bytes_per_token", d.kv_bytes_per_token},
                    {"kv_bytes", d.kv_bytes},
                    {"state_bytes_per_sequence", d.state_bytes_per_sequence},
                    {"state_bytes", d.state_bytes},
                    {"checkpoint_bytes_each", d.checkpoint_bytes_each},
                    {"checkpoint_bytes", d.checkpoint_bytes},
                    {"activation_bytes", d.activation_bytes},
                    {"reserve_bytes", d.reserve_bytes},
                    {"total_bytes", d.total_bytes},
                    {"budget_bytes", d.budget_bytes},
                    {"fits", d.fits},
                    {"max_context", d.max_context},
                    {"max_concurrency", d.max_concurrency}});
  }
  const DevicePlan& d0 = devices.at(0);
  return {{"model_type", model_type},
          {"scheme", weight_scheme_name(options.scheme)},
          {"group_size", options.group_size},
          {"kv_dtype", kv_cache_dtype_name(options.kv_dtype)},
          {"ctx", options.ctx},
          {"ctx_rounded", context_rounded},
          {"concurrency", options.concurrency},
          {"tp", options.tp},
          {"prefill_chunk", options.prefill_chunk},
          {"params_total", params_total},
          {"params_active", params_active},
          {"params_mtp", params_mtp},
          {"kv_layers", kv_layers},
          {"recurrent_layers", recurrent_layers},
          {"model_max_context", model_max_context},
          // Device 0's figures at the top level (all devices are alike).
          {"weights_bytes", d0.weights_bytes},
          {"kv_bytes_per_token", d0.kv_bytes_per_token},
          {"kv_bytes", d0.kv_bytes},
          {"state_bytes", d0.state_bytes},
          {"checkpoint_bytes_each", d0.checkpoint_bytes_each},
          {"checkpoint_bytes", d0.checkpoint_bytes},
          {"prefix_checkpoints", options.prefix_checkpoints},
          {"activation_bytes", d0.activation_bytes},
          {"reserve_bytes", d0.reserve_bytes},
          {"total_bytes", d0.total_bytes},
          {"budget_bytes", d0.budget_bytes},
          {"fits", d0.fits},
          {"max_context", d0.max_context},
          {"max_concurrency", d0.max_concurrency},
          {"devices", devs},
          {"notes", notes}};
}

std::string Plan::to_text() const {
  std::string s;
  s += fmt::format("model {}: {} parameters ({} active per token{})\n", model_type, format_count(params_total),
                   format_count(params_active), params_mtp ? ", MTP " + format_count(params_mtp) : "");
  s += fmt::format("scheme {}{}, KV {}, context {} (x{} sequences), prefill chunk {}, TP {}\n",
                   weight_scheme_name(options.scheme),
                   options.scheme == WeightScheme::kW4A8 || options.scheme == WeightScheme::kW4A16
                       ? fmt::format(" g{}", options.group_size)
                       : "",
                   kv_cache_dtype_name(options.kv_dtype), context_rounded, options.concurrency, options.prefill_chunk,
                   options.tp);
  s += fmt::format("KV layers {} ({} values/token/layer){}\n", kv_layers, kv_values_per_token_per_layer,
                   recurrent_layers ? fmt::format(", recurrent layers {}", recurrent_layers) : "");
  const DevicePlan& d = devices.at(0);
  s += fmt::format("per device ({} device{} alike):\n", devices.size(), devices.size() > 1 ? "s" : "");
  s += fmt::format("  weights        {:>12}  (in scheme {}, fallback bf16/f32 {})\n", format_bytes(d.weights_bytes),
                   format_bytes(d.weights_quantized_bytes), format_bytes(d.weights_fallback_bytes));
  s += fmt::format("  KV cache       {:>12}  ({} per token per sequence)\n", format_bytes(d.kv_bytes),
                   format_bytes(d.kv_bytes_per_token));
  if (d.state_bytes) {
    s += fmt::format("  recurrent      {:>12}  ({} per sequence)\n", format_bytes(d.state_bytes),
                     format_bytes(d.state_bytes_per_sequence));
    s +=
        fmt::format("  checkpoints    {:>12}  ({} x {} each = {} KV tokens; prefix cache, --prefix-checkpoints)\n",
                    format_bytes(d.checkpoint_bytes), options.prefix_checkpoints, format_bytes(d.checkpoint_bytes_each),
                    d.kv_bytes_per_token > 0 ? d.checkpoint_bytes_each / d.kv_bytes_per_token : 0);
  }
  s += fmt::format("  activations    {:>12}\n", format_bytes(d.activation_bytes));
  s += fmt::format("  runtime        {:>12}\n", format_bytes(d.reserve_bytes));
  s += fmt::format("  total          {:>12}", format_bytes(d.total_bytes));
  if (d.budget_bytes > 0) {
    s += fmt::format("  of {} -> {}\n", format_bytes(d.budget_bytes), d.fits ? "fits" : "DOES NOT FIT");
    s += fmt::format("largest context at {} sequences: {}\n", options.concurrency, d.max_context);
    s += fmt::format("largest concurrency at {} tokens: {}\n", context_rounded, d.max_concurrency);
  } else {
    s += "\n(give --memory to get the largest context and concurrency)\n";
  }
  for (const std::string& n : notes) s += "note: " + n + "\n";
  return s;
}

}  // namespace infera
