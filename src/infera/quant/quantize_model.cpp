#include "infera/quant/quantize_model.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/log.h"
#include "infera/io/safetensors.h"
#include "infera/model/arch_registry.h"
#include "infera/model/config.h"
#include "infera/model/model.h"
#include "infera/model/prequant.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/tensor_table.h"
#include "infera/model/weights.h"
#include "infera/quant/calibration.h"
#include "infera/quant/quantizer.h"

namespace infera::quant {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kernels::QuantScheme;

EmbedHeadMode parse_embed_head_mode(const std::string& text) {
  if (text == "bf16") return EmbedHeadMode::kBf16;
  if (text == "w8a8" || text == "int8") return EmbedHeadMode::kW8A8;
  if (text == "scheme") return EmbedHeadMode::kScheme;
  fail(
      "--embed-head: unknown value '{}' (bf16: keep embeddings and head in bf16, w8a8: int8 per channel, "
      "scheme: quantize them like every other layer)",
      text);
}

QuantRecipe parse_quant_recipe(const std::string& text) {
  if (text == "auto") return QuantRecipe::kAuto;
  if (text == "uniform") return QuantRecipe::kUniform;
  fail("--recipe: unknown recipe '{}' (expected auto or uniform)", text);
}

namespace {

// What `infera quantize` does with each tensor comes from the architecture's tensor table
// (model/tensor_table.h): the tensors a model binds as (possibly quantized) linear layers
// are the table's quantizable ones, 2-D [n, k] or fused experts 3-D [E, n, k] (quantized
// row by row like an [E * n, k] matrix so each expert is a contiguous quantized matrix).
// Attention, MLP, expert and shared-expert projections, the Gated DeltaNet projections
// in_proj_qkv, in_proj_z (in_proj_qkvz for qwen3_next) and out_proj, and mtp.fc are
// quantized; embeddings and head as --embed-head says. Stay as stored (role kFloat or
// kVector): norms, the router, shared_expert_gate and the GDN gate projections in_proj_b /
// in_proj_a / in_proj_ba ([Hv, H]: 0.4 % of a bf16 GDN layer's projection bytes in
// Qwen3.5-35B-A3B, 1.5 % of a W4A8 one, and they feed the decay and beta gates whose
// errors compound along the recurrence; docs/quantization.md).
struct TensorRoles {
  std::map<std::string, WeightRole> roles;  // every tensor of the table, by name
  bool quantizable(const std::string& name, const TensorInfo& t) const {
    auto it = roles.find(name);
    if (it == roles.end() || (t.shape.size() != 2 && t.shape.size() != 3)) return false;
    TensorSpec spec;
    spec.role = it->second;
    spec.shape = t.shape;
    return spec.quantizable();
  }
  bool embed_or_head(const std::string& name) const {
    auto it = roles.find(name);
    return it != roles.end() && (it->second == WeightRole::kEmbedding || it->second == WeightRole::kHead);
  }
};

bool glob_match(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

// An FP8 checkpoint being quantized (model/prequant.h): its e4m3 weights are read dequantized.
struct Fp8Input {
  std::unique_ptr<PrequantFormat> format;  // nullptr: a float checkpoint
  const WeightStore* store = nullptr;
  std::set<std::string> parts;  // its scales and auxiliary tensors: read through the weights, not copied
  bool holds(const TensorInfo& t) const {
    return format && t.dtype == DType::kF8E4M3 && format->quantizes(*store, t.name);
  }
};

// A tensor's values as f32 (an FP8 weight of the input dequantized with its scales).
std::vector<float> read_f32(const TensorInfo& t, const Fp8Input* fp8 = nullptr) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (fp8 != nullptr && fp8->holds(t)) {
    const int64_t cols = t.shape.back(), experts = t.shape.size() == 3 ? t.shape[0] : 1;
    const StoredLinear w = fp8->format->locate(*fp8->store, t.name, experts, t.numel() / cols / experts, cols);
    fp8->format->dequantize_rows(w, 0, w.total_rows(), v.data());
    return v;
  }
  to_f32(t.data, t.dtype, t.numel(), v.data());
  return v;
}

// The input's FP8 format, when it is a checkpoint of FP8 weights (quant_method fp8, or
// compressed-tensors float-quantized): every quantized weight must be FP8 (an integer format
// is refused: quantize its float original). nullptr for a float checkpoint.
Fp8Input fp8_input(const std::string& in_dir, const WeightStore& store) {
  Fp8Input in;
  in.store = &store;
  in.format = detect_prequant(in_dir);
  if (!in.format) return in;
  for (const std::string& name : store.names()) {
    const TensorInfo& t = store.get(name);
    if (in.format->is_auxiliary(name)) in.parts.insert(name);
    if ((t.shape.size() != 2 && t.shape.size() != 3) || !in.format->quantizes(store, name)) continue;
    const int64_t cols = t.shape.back(), experts = t.shape.size() == 3 ? t.shape[0] : 1;
    const StoredLinear w = in.format->locate(store, name, experts, t.numel() / cols / experts, cols);
    if (w.fp8_group == 0 || t.dtype != DType::kF8E4M3) {
      fail(
          "{}: '{}' is stored as {} ({}): `infera quantize` starts from float or FP8 checkpoints; quantize the "
          "original float checkpoint instead",
          in_dir, name, w.label, in.format->summary());
    }
    for (const auto& [role, part] : w.parts) {
      if (part->name != name) in.parts.insert(part->name);
    }
  }
  return in;
}

// Smoothing factors decided before the shards are written (calibration only).
struct SmoothingPlan {
  std::map<std::string, std::vector<float>> col_scale;  // linear: W[:, k] *= s_k
  std::map<std::string, std::vector<float>> row_div;  // up_proj: W[k, :] /= s_k
  std::map<std::string, std::vector<float>> elem_div;  // norm weight: g_k /= s_k
  bool zero_centred_norms = false;  // the hybrid's RMSNorms apply (1 + g): 1 + g_k <- (1 + g_k) / s_k
};

struct Planner {
  const WeightStore& store;
  const QuantizationConfig& qc;
  const ActivationStats& stats;
  const Fp8Input* fp8 = nullptr;
  SmoothingPlan plan;

  // Expected squared output error of the group's quantized layers for smoothing s.
  double group_error(const std::vector<std::string>& linears, const std::vector<float>& s, const ChannelStats& st) {
    const std::vector<float> h = st.mean_sq();
    const int64_t k = static_cast<int64_t>(s.size());
    std::vector<float> imp(k);
    for (int64_t t = 0; t < k; ++t) imp[t] = h[t] / (s[t] * s[t]);
    float amax_scaled = 0.0f;
    for (int64_t t = 0; t < k; ++t) amax_scaled = std::max(amax_scaled, st.max_abs[t] / s[t]);
    const double step = amax_scaled / 127.0;
    double err = 0.0;
    for (const std::string& name : linears) {
      const LayerQuant lq = qc.layer(name);
      const TensorInfo& t = store.get(name);
      std::vector<float> w = read_f32(t, fp8);
      const int64_t n = t.shape[0];
      double w2s2 = 0.0;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          float& x = w[r * k + c];
          x *= s[c];
          w2s2 += static_cast<double>(x) * x;
        }
      const QuantizedMatrix q = quantize_matrix(w.data(), n, k, lq.scheme, lq.group_size, imp.data());
      err += weighted_error(w.data(), q, imp.data());
      if (kernels::scheme_quantizes_activations(lq.scheme)) err += step * step / 12.0 * w2s2;
    }
    return err;
  }

  // Picks s for linears sharing one input (stats of the first), folded into `prev`
  // (a norm: elem_div, or up_proj: row_div).
  void smooth(const std::vector<std::string>& all_linears, const std::string& prev, bool prev_is_norm) {
    std::vector<std::string> linears;
    for (const auto& n : all_linears)
      if (store.find(n) && !qc.layer(n).dense) linears.push_back(n);
    if (linears.empty() || !store.find(prev)) return;
    auto it = stats.find(linears[0]);
    if (it == stats.end() || it->second.count == 0) return;
    const ChannelStats& st = it->second;
    const int64_t k = static_cast<int64_t>(st.sum_sq.size());
    const bool awq = kernels::scheme_is_int4(qc.layer(linears[0]).scheme);
    const std::vector<float> mean_abs = st.mean_abs();
    std::vector<float> wmax(k, 0.0f);
    if (!awq) {
      for (const auto& name : linears) {
        const TensorInfo& t = store.get(name);
        const std::vector<float> w = read_f32(t, fp8);
        for (int64_t r = 0; r < t.shape[0]; ++r)
          for (int64_t c = 0; c < k; ++c) wmax[c] = std::max(wmax[c], std::fabs(w[r * k + c]));
      }
    }
    double best_err = INFINITY;
    std::vector<float> best;
    for (float alpha : {0.0f, 0.25f, 0.5f, 0.75f}) {
      std::vector<float> s(k, 1.0f);
      if (alpha > 0.0f) {
        for (int64_t c = 0; c < k; ++c) {
          s[c] =
              awq ? std::pow(std::max(mean_abs[c], 1e-8f), alpha)
                  : std::pow(std::max(st.max_abs[c], 1e-5f), alpha) / std::pow(std::max(wmax[c], 1e-5f), 1.0f - alpha);
          s[c] = std::clamp(s[c], 1e-4f, 1e4f);
        }
        // Centre the factors (geometric mean of the extremes = 1) so neither side drifts.
        const auto [mn, mx] = std::minmax_element(s.begin(), s.end());
        const float centre = std::sqrt(*mn * *mx);
        for (float& v : s) v /= centre;
      }
      const double err = group_error(linears, s, st);
      if (err < best_err) {
        best_err = err;
        best = s;
      }
    }
    LOG_DEBUG("smoothing {}: err {}", linears[0], best_err);
    if (std::all_of(best.begin(), best.end(), [](float v) { return v == 1.0f; })) return;
    for (const auto& n : linears) plan.col_scale[n] = best;
    // Layers of the group kept dense get the same factor (the fold changes their input too).
    for (const auto& n : all_linears)
      if (store.find(n) && qc.layer(n).dense) plan.col_scale[n] = best;
    (prev_is_norm ? plan.elem_div : plan.row_div)[prev] = best;
  }
};

std::string human_bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / 1073741824.0);
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / 1048576.0);
  if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", b);
}

struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

OwnedTensor make_tensor(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  return OwnedTensor{std::move(name), dtype, std::move(shape), std::move(bytes)};
}

std::vector<uint8_t> from_f32(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

void progress_line(bool show, size_t shard, size_t shards, size_t done, size_t total, const std::string& name) {
  if (!show) return;
  const int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%.*s%*s] shard %zu/%zu  %zu/%zu  %-48.48s", filled, "##############################",
               width - filled, "", shard, shards, done, total, name.c_str());
  std::fflush(stderr);
}

}  // namespace

QuantizeReport quantize_model(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& o) {
  QuantizeReport report;
  const bool int4 = kernels::scheme_is_int4(o.scheme);
  if (int4 && o.group_size != 32 && o.group_size != 64 && o.group_size != 128) {
    fail("--group-size {} is not supported (use 32, 64 or 128)", o.group_size);
  }
  const ModelConfig cfg = load_model_config(in_dir);
  if (o.recipe == QuantRecipe::kAuto && cfg.mla && o.group_size != 32 && o.group_size != 64 && o.group_size != 128) {
    fail("--group-size {} is not supported (use 32, 64 or 128; the DeepSeek recipe puts routed experts in w4a8)",
         o.group_size);
  }
  const ArchInfo& arch = arch_info(cfg.arch);
  if (!arch.runnable()) {
    fail("{}: quantization supports model_type {}, not '{}'", in_dir, runnable_arch_names(), cfg.model_type);
  }
  // An FP8 checkpoint (model/prequant.h) is read through its format: its weights dequantized.
  const bool prequantized = detect_prequant(in_dir) != nullptr;
  if (!prequantized && read_quantization_config(in_dir).present) {
    fail(
        "{}: the model is already quantized (config.json has a quantization_config); quantize the original "
        "float checkpoint instead",
        in_dir);
  }
  std::error_code ec;
  if (fs::exists(out_dir) && !fs::is_empty(out_dir, ec)) {
    fail("{}: output directory exists and is not empty (choose a new or empty directory)", out_dir);
  }
  if (fs::weakly_canonical(in_dir, ec) == fs::weakly_canonical(out_dir, ec))
    fail("output directory is the input directory");

  const WeightStore store = WeightStore::open(in_dir);
  const Fp8Input fp8 = fp8_input(in_dir, store);
  std::vector<std::string> names;
  for (const std::string& name : store.names()) {
    if (!fp8.parts.contains(name)) names.push_back(name);  // FP8 scales: read with their weights
  }
  const HasTensor has = [&store](const std::string& name) { return store.find(name) != nullptr; };
  TensorRoles table;
  std::map<std::string, const TensorSpec*> specs;
  const std::vector<TensorSpec> all_specs = tensor_table(cfg, has);
  for (const TensorSpec& t : all_specs) {
    table.roles[t.name] = t.role;
    specs[t.name] = &t;
  }
  // DeepSeek's recipe (QuantizeOptions::recipe): the scheme of a layer, or none for --scheme.
  const bool deepseek_recipe = o.recipe == QuantRecipe::kAuto && cfg.mla;
  auto recipe_scheme = [&](const std::string& name) -> std::optional<std::pair<QuantScheme, std::string>> {
    if (!deepseek_recipe) return std::nullopt;
    const TensorSpec* t = specs.at(name);
    if (t->role == WeightRole::kExpert && !t->mtp) {
      return std::pair{QuantScheme::kW4A8, std::string("DeepSeek recipe: routed experts w4a8")};
    }
    if (t->role == WeightRole::kExpert)
      return std::pair{QuantScheme::kW8A8, std::string("DeepSeek recipe: MTP experts w8a8")};
    if (t->role == WeightRole::kLinear) return std::pair{QuantScheme::kW8A8, std::string("DeepSeek recipe: w8a8")};
    return std::nullopt;
  };

  // ---- per-layer decisions ----
  QuantizationConfig qc;
  qc.present = true;
  qc.scheme = o.scheme;
  qc.group_size = int4 ? o.group_size : 0;
  std::vector<int> pattern_hits(o.fallback_patterns.size(), 0);
  for (const std::string& name : names) {
    const TensorInfo& t = store.get(name);
    if (!table.quantizable(name, t)) continue;
    LayerQuant lq;
    lq.dense = false;
    lq.scheme = o.scheme;
    lq.group_size = qc.group_size;
    bool override = false;
    for (size_t p = 0; p < o.fallback_patterns.size(); ++p) {
      if (glob_match(o.fallback_patterns[p], name)) {
        ++pattern_hits[p];
        if (!lq.dense) {
          lq.dense = true;
          lq.dense_type = "bf16";
          lq.reason = "--fallback " + o.fallback_patterns[p];
          override = true;
        }
      }
    }
    if (!lq.dense && !table.embed_or_head(name)) {
      if (const auto r = recipe_scheme(name); r && r->first != lq.scheme) {
        lq.scheme = r->first;
        lq.group_size = kernels::scheme_is_int4(r->first) ? o.group_size : 0;
        lq.reason = r->second;
        override = true;
      }
    }
    if (!lq.dense && table.embed_or_head(name)) {
      if (o.embed_head == EmbedHeadMode::kBf16) {
        lq.dense = true;
        lq.dense_type = "bf16";
        lq.reason = "embeddings/head kept in bf16 (default)";
        override = true;
      } else if (o.embed_head == EmbedHeadMode::kW8A8 && o.scheme != QuantScheme::kW8A8) {
        lq.scheme = QuantScheme::kW8A8;
        lq.group_size = 0;
        lq.reason = "embeddings/head in int8 (--embed-head w8a8)";
        override = true;
      }
    }
    const int64_t cols = t.shape.back();
    if (!lq.dense && kernels::scheme_is_int4(lq.scheme) && cols % lq.group_size != 0) {
      lq.reason =
          fmt::format("group size {} does not divide its {} columns: per-channel w8a8 instead", lq.group_size, cols);
      lq.scheme = QuantScheme::kW8A8;
      lq.group_size = 0;
      override = true;
      report.warnings.push_back(name + ": " + lq.reason);
    }
    if (override) qc.overrides[name] = lq;
  }
  for (size_t p = 0; p < o.fallback_patterns.size(); ++p) {
    if (pattern_hits[p] == 0) {
      report.warnings.push_back(
          fmt::format("--fallback '{}' matches no linear layer (names look like "
                      "model.layers.0.mlp.down_proj.weight)",
                      o.fallback_patterns[p]));
    }
  }
  for (const auto& w : report.warnings) LOG_WARN("{}", w);

  // ---- calibration ----
  SmoothingPlan plan;
  ActivationStats stats;
  if (!o.calib_file.empty()) {
    const std::vector<int32_t> ids = calibration_tokens(in_dir, o.calib_file, o.calib_tokens);
    LoadOptions lo;
    lo.max_batch_tokens = 128;
    std::unique_ptr<Model> model = load_model(in_dir, lo);
    stats = collect_activation_stats(*model, ids, o.calib_ctx);
    report.calib_tokens_used = static_cast<int64_t>(ids.size());
    Planner p{store, qc, stats, &fp8, {}};
    p.plan.zero_centred_norms = arch.traits.zero_centred_norms;
    // The hybrid's text layers may be nested (model.language_model.*). Its GDN layers are
    // not smoothed: their input also feeds in_proj_b / in_proj_a, which stay as stored
    // (no factor can be folded into them), so only the clipping search uses their stats.
    const std::string trunk = text_prefix(cfg, has) + "layers.";
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      const std::string pre = trunk + std::to_string(l) + ".";
      p.smooth({pre + "mlp.down_proj.weight"}, pre + "mlp.up_proj.weight", false);
      p.smooth({pre + "self_attn.q_proj.weight", pre + "self_attn.k_proj.weight", pre + "self_attn.v_proj.weight"},
               pre + "input_layernorm.weight", true);
      p.smooth({pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight"}, pre + "post_attention_layernorm.weight",
               true);
    }
    plan = std::move(p.plan);
    json cal = json::object();
    cal["file"] = fs::path(o.calib_file).filename().string();
    cal["tokens"] = report.calib_tokens_used;
    cal["smoothed_layers"] = plan.col_scale.size();
    cal["method"] = int4 ? "awq-style scaling search + weighted clipping search"
                         : "smoothquant-style migration search + weighted clipping search";
    qc.calibration_json = cal.dump();
  }

  // ---- shards ----
  fs::create_directories(out_dir);
  std::map<std::string, std::vector<std::string>> by_file;
  for (const std::string& name : names) by_file[store.get(name).file].push_back(name);
  const bool sharded = fs::exists(fs::path(in_dir) / "model.safetensors.index.json");
  json weight_map = json::object();
  int64_t total_size = 0;
  size_t shard_i = 0;
  report.shards = by_file.size();
  for (const auto& [file, shard_names] : by_file) {
    ++shard_i;
    std::vector<OwnedTensor> out;
    size_t done = 0;
    for (const std::string& name : shard_names) {
      progress_line(o.show_progress, shard_i, by_file.size(), done++, shard_names.size(), name);
      const TensorInfo& t = store.get(name);
      const int64_t before = static_cast<int64_t>(t.nbytes);
      const bool linear = table.quantizable(name, t);
      auto norm_it = plan.elem_div.find(name);
      if (!linear && fp8.holds(t)) {  // an FP8 matrix kept as stored (a router, kv_b_proj): f32, exactly
        std::vector<float> v = read_f32(t, &fp8);
        out.push_back(make_tensor(name, DType::kF32, t.shape, from_f32(v, DType::kF32)));
        report.other_bytes_before += before;
        report.other_bytes_after += static_cast<int64_t>(v.size()) * 4;
        continue;
      }
      if (!linear) {
        if (norm_it != plan.elem_div.end()) {
          std::vector<float> g = read_f32(t);
          for (size_t c = 0; c < g.size(); ++c) {
            g[c] = plan.zero_centred_norms ? (1.0f + g[c]) / norm_it->second[c] - 1.0f : g[c] / norm_it->second[c];
          }
          out.push_back(make_tensor(name, t.dtype, t.shape, from_f32(g, t.dtype)));
        } else {
          out.push_back(make_tensor(name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)));
        }
        report.other_bytes_before += before;
        report.other_bytes_after += before;
        continue;
      }
      // [n, k], or fused experts [E, n, k] as E * n rows.
      const int64_t cols = t.shape.back(), rows = t.numel() / cols;
      std::vector<int64_t> lead(t.shape.begin(), t.shape.end() - 1);
      auto with_cols = [&lead](int64_t c) {
        std::vector<int64_t> shape = lead;
        shape.push_back(c);
        return shape;
      };
      std::vector<float> w = read_f32(t, &fp8);
      std::vector<float> imp;
      if (auto st = stats.find(name); st != stats.end()) imp = st->second.mean_sq();
      if (auto cs = plan.col_scale.find(name); cs != plan.col_scale.end()) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) w[r * cols + c] *= cs->second[c];
        for (int64_t c = 0; c < cols && !imp.empty(); ++c) imp[c] /= cs->second[c] * cs->second[c];
      }
      if (auto rd = plan.row_div.find(name); rd != plan.row_div.end()) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) w[r * cols + c] /= rd->second[r];
      }
      const LayerQuant lq = qc.layer(name);
      LayerReport lr{name, lq.label(), before, 0, lq.reason};
      if (lq.dense) {
        out.push_back(make_tensor(name, DType::kBF16, t.shape, from_f32(w, DType::kBF16)));
        lr.bytes_after = rows * cols * 2;
      } else {
        QuantizedMatrix q =
            quantize_matrix(w.data(), rows, cols, lq.scheme, lq.group_size, imp.empty() ? nullptr : imp.data());
        const bool q4 = kernels::scheme_is_int4(lq.scheme);
        lr.bytes_after = static_cast<int64_t>(q.qweight.size() + q.scales.size());
        out.push_back(make_tensor(name + ".qweight", q4 ? DType::kU8 : DType::kI8, with_cols(q4 ? cols / 2 : cols),
                                  std::move(q.qweight)));
        out.push_back(make_tensor(name + ".scales", q4 ? DType::kF16 : DType::kF32, with_cols(cols / q.group_size),
                                  std::move(q.scales)));
      }
      report.layers.push_back(lr);
    }
    progress_line(o.show_progress, shard_i, by_file.size(), shard_names.size(), shard_names.size(), "");
    std::vector<TensorToWrite> tw;
    for (const OwnedTensor& ot : out) {
      tw.push_back(TensorToWrite{ot.name, ot.dtype, ot.shape, ot.bytes.data(), ot.bytes.size()});
      weight_map[ot.name] = file;
      total_size += static_cast<int64_t>(ot.bytes.size());
    }
    write_safetensors((fs::path(out_dir) / file).string(), tw,
                      {{"format", "pt"},
                       {"quantized_by", "infera"},
                       {"scheme", std::string(kernels::scheme_name(o.scheme))}});
  }
  if (o.show_progress) std::fprintf(stderr, "\n");

  // ---- config, index, tokenizer files ----
  {
    json config = read_json_file((fs::path(in_dir) / "config.json").string(), "cannot read the model's config");
    json qj;
    quantization_config_to_json(qc, qj);
    config["quantization_config"] = qj;
    std::ofstream outc(fs::path(out_dir) / "config.json");
    outc << config.dump(2) << "\n";
    if (!outc) fail("{}: cannot write config.json", out_dir);
  }
  if (sharded) {
    json index = json::object();
    index["metadata"] = json{{"total_size", total_size}};
    index["weight_map"] = weight_map;
    std::ofstream outi(fs::path(out_dir) / "model.safetensors.index.json");
    outi << index.dump(2) << "\n";
  }
  for (const auto& entry : fs::directory_iterator(in_dir)) {
    const std::string fname = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || fname == "config.json" || fname == "model.safetensors.index.json") continue;
    if (ext == ".json" || ext == ".jinja" || ext == ".model" || ext == ".txt") {
      fs::copy_file(entry.path(), fs::path(out_dir) / fname, fs::copy_options::overwrite_existing);
    }
  }
  for (const LayerReport& l : report.layers) {
    report.total_bytes_before += l.bytes_before;
    report.total_bytes_after += l.bytes_after;
  }
  report.total_bytes_before += report.other_bytes_before;
  report.total_bytes_after += report.other_bytes_after;
  return report;
}

std::string format_report(const QuantizeReport& r) {
  // Per-expert tensors (experts.0.gate_proj ... experts.127.gate_proj) share one row per
  // layer and projection when they are stored alike: "experts.*.gate_proj.weight".
  static const std::regex expert_index(R"(experts\.\d+\.)");
  std::vector<LayerReport> rows;
  std::map<std::string, size_t> row_of;
  for (const auto& l : r.layers) {
    LayerReport c = l;
    c.name = std::regex_replace(l.name, expert_index, "experts.*.");
    const std::string key = c.name + "\n" + c.label + "\n" + c.reason;
    auto it = row_of.find(key);
    if (it == row_of.end()) {
      row_of.emplace(key, rows.size());
      rows.push_back(c);
    } else {
      rows[it->second].bytes_before += c.bytes_before;
      rows[it->second].bytes_after += c.bytes_after;
    }
  }
  size_t w = 5;
  for (const auto& l : rows) w = std::max(w, l.name.size());
  std::string s = fmt::format("{:<{}}  {:<9}  {:>11}  {:>11}  {}\n", "layer", w, "scheme", "before", "after", "note");
  for (const auto& l : rows) {
    s += fmt::format("{:<{}}  {:<9}  {:>11}  {:>11}  {}\n", l.name, w, l.label, human_bytes(l.bytes_before),
                     human_bytes(l.bytes_after), l.reason);
  }
  s += fmt::format("{:<{}}  {:<9}  {:>11}  {:>11}\n", "(norms and other tensors)", w, "as is",
                   human_bytes(r.other_bytes_before), human_bytes(r.other_bytes_after));
  const double ratio = r.total_bytes_after > 0 ? static_cast<double>(r.total_bytes_before) / r.total_bytes_after : 0.0;
  s += fmt::format("{:<{}}  {:<9}  {:>11}  {:>11}  {:.2f}x smaller\n", "total", w, "",
                   human_bytes(r.total_bytes_before), human_bytes(r.total_bytes_after), ratio);
  return s;
}

}  // namespace infera::quant
