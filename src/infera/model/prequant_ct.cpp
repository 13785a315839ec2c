// quant_method "compressed-tensors" (llm-compressor; docs/quantization.md "compressed-tensors").
// config.json names schemes per group of modules (config_groups: targets, weights args,
// input_activations, an optional per-group format) and an ignore list; targets and ignore
// entries are exact module names, "re:<regex>" (matched from the start of the name, as
// Python's re.match) or a class name ("Linear": every linear layer). Per quantized module <m>:
//   int-quantized / naive-quantized  <m>.weight I8 [O, I]
//   float-quantized                  <m>.weight F8_E4M3 [O, I]
//   pack-quantized                   <m>.weight_packed I32 [O, ceil(I / (32 / bits))], values
//                                    LSB-first along I, stored as q + 2^(bits-1);
//                                    <m>.weight_shape [2] = (O, I)
// and <m>.weight_scale (tensor [1], channel [O, 1], group [O, I / G], block [ceil(O / r),
// ceil(I / c)]), <m>.weight_zero_point when asymmetric (int8 in the scale's shape; packed
// int32 [ceil(O / pf), groups] along O in pack-quantized), <m>.weight_g_idx I32 [I] with
// actorder "group". W = scale * (q - zero).
//
// Fused experts (llm-compressor's repack_moe_model, for architectures whose Transformers class
// holds the experts as 3-D tensors: qwen3_5_moe, qwen3_vl_moe): every per-expert tensor above
// stacked with the experts first under the fused module, "<...>.mlp.experts.gate_up_proj.<param>"
// and ".down_proj.<param>". gate_up joins each expert's gate and up tensors along the outputs
// (dimension 1 of the stacked tensor: weight [E, 2F, ...], scales [E, 2F, ...], packed zero points
// [E, 2 ceil(F / pf), groups]); what is one value per expert (a per-tensor scale) becomes [E, 2]
// (gate, up), and 1-D tensors are joined along their last dimension (weight_shape [E, 4] = gate's
// (F, I) then up's). down_proj's tensors are stacked as they are ([E, ...], weight_shape [E, 2]).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <regex>

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/model/prequant_formats.h"
#include "infera/model/prequant_gptq.h"

namespace infera {

namespace {

using json = nlohmann::json;

enum class CtFormat { kIntQuantized, kNaiveQuantized, kFloatQuantized, kPackQuantized };

enum class Strategy { kTensor, kChannel, kGroup, kBlock };

struct CtScheme {
  std::string group;  // config_groups key
  CtFormat format = CtFormat::kPackQuantized;
  int bits = 8;
  bool is_float = false;
  bool symmetric = true;
  Strategy strategy = Strategy::kChannel;
  int64_t group_size = 0;
  int64_t block_rows = 0, block_cols = 0;
  bool actorder_group = false;  // g_idx stored
  bool quantized_activations = false;
};

struct Target {
  enum class Kind { kName, kRegex, kClass } kind = Kind::kName;
  std::string text;
  std::regex re;
};

struct CtState {
  CtScheme scheme;
  // Fused experts: experts, each expert's rows, and the parts its rows are joined from (2 for
  // gate_up_proj: gate then up, each `sub_rows` = rows / parts); 1, rows, 1 per module.
  int64_t experts = 1, rows = 0, parts = 1, sub_rows = 0;
  const TensorInfo* weight = nullptr;  // int8 / fp8 [O, I] or packed int32
  const TensorInfo* scale = nullptr;
  const TensorInfo* zero = nullptr;
  const TensorInfo* g_idx = nullptr;
  bool zero_packed = false;
  int64_t scale_cols = 1;  // per row (per expert)
  int64_t words = 0;  // packed int32 words per row
};

CtFormat parse_format(const std::string& f, const std::string& where) {
  if (f == "int-quantized") return CtFormat::kIntQuantized;
  if (f == "naive-quantized") return CtFormat::kNaiveQuantized;
  if (f == "float-quantized") return CtFormat::kFloatQuantized;
  if (f == "pack-quantized") return CtFormat::kPackQuantized;
  fail(
      "{}: format '{}' is not supported (Infera loads int-quantized, naive-quantized, float-quantized and "
      "pack-quantized)",
      where, f);
}

const char* format_name(CtFormat f) {
  switch (f) {
    case CtFormat::kIntQuantized: return "int-quantized";
    case CtFormat::kNaiveQuantized: return "naive-quantized";
    case CtFormat::kFloatQuantized: return "float-quantized";
    case CtFormat::kPackQuantized: return "pack-quantized";
  }
  return "?";
}

std::vector<Target> parse_targets(const json& j, const std::string& where) {
  std::vector<Target> out;
  if (j.is_null()) return out;
  if (!j.is_array()) fail("{} must be a list", where);
  for (const auto& e : j) {
    if (!e.is_string()) fail("{} must hold strings, got {}", where, e.dump());
    Target t;
    t.text = e.get<std::string>();
    if (t.text.starts_with("re:")) {
      t.kind = Target::Kind::kRegex;
      try {
        t.re = std::regex(t.text.substr(3), std::regex::ECMAScript);
      } catch (const std::regex_error& err) {
        fail("{}: '{}' is not a valid regular expression ({})", where, t.text, err.what());
      }
    } else if (t.text.find('.') == std::string::npos && !t.text.empty() &&
               std::isupper(static_cast<unsigned char>(t.text[0]))) {
      t.kind = Target::Kind::kClass;  // "Linear", "Qwen3MoeSparseMoeBlock", ...
    }
    out.push_back(std::move(t));
  }
  return out;
}

// 3: exact name, 2: regex, 1: class "Linear" (every matrix the table quantizes is an
// nn.Linear), 0: no match.
int match_rank(const std::vector<Target>& targets, const std::string& module) {
  int best = 0;
  for (const Target& t : targets) {
    switch (t.kind) {
      case Target::Kind::kName:
        if (t.text == module) best = std::max(best, 3);
        break;
      case Target::Kind::kRegex:
        if (std::regex_search(module, t.re, std::regex_constants::match_continuous)) best = std::max(best, 2);
        break;
      case Target::Kind::kClass:
        if (t.text == "Linear") best = std::max(best, 1);
        break;
    }
  }
  return best;
}

// The module a weight's tensors are stored under: "<m>" of "<m>.weight", or a fused expert
// tensor's own name ("...mlp.experts.gate_up_proj": its tensors are "<name>.weight_packed", ...).
std::string module_of(const std::string& name) {
  std::string m = prequant_module(name);
  return m.empty() ? name : m;
}

class CtFormatImpl final : public PrequantFormat {
 public:
  explicit CtFormatImpl(const PrequantFiles& files) {
    const json& qc = files.quantization_config;
    const std::string where = files.dir + "/config.json: quantization_config";
    const std::string status = qc.value("quantization_status", std::string("compressed"));
    if (status != "compressed")
      fail("{}.quantization_status '{}' is not supported (only 'compressed' checkpoints)", where, status);
    if (auto it = qc.find("sparsity_config"); it != qc.end() && !it->is_null() && !it->empty()) {
      const std::string sf = it->is_object() ? it->value("format", std::string("dense")) : std::string("?");
      if (sf != "dense") fail("{}.sparsity_config format '{}' is not supported (sparse weights)", where, sf);
    }
    if (auto it = qc.find("transform_config"); it != qc.end() && !it->is_null() && !it->empty())
      fail("{}.transform_config is not supported (rotated weights)", where);
    const std::string global_format = qc.value("format", std::string());
    if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty())
      fail("{}.config_groups is missing or empty", where);
    for (const auto& [gname, g] : qc["config_groups"].items()) {
      const std::string gw = where + ".config_groups." + gname;
      if (!g.is_object()) fail("{} must be an object", gw);
      CtScheme s;
      s.group = gname;
      const std::string f =
          g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : global_format;
      if (f.empty()) fail("{}: no format (neither the group nor quantization_config.format names one)", gw);
      s.format = parse_format(f, f == global_format ? where + ".format" : gw + ".format");
      const json& wa = g.contains("weights") ? g["weights"] : json();
      if (!wa.is_object()) fail("{}.weights is missing (weight-only activation schemes are not supported)", gw);
      s.bits = wa.value("num_bits", 8);
      const std::string type = wa.value("type", std::string("int"));
      if (type != "int" && type != "float") fail("{}.weights.type '{}' is not 'int' or 'float'", gw, type);
      s.is_float = type == "float";
      s.symmetric = wa.value("symmetric", true);
      if (wa.contains("group_size") && wa["group_size"].is_number_integer())
        s.group_size = wa["group_size"].get<int64_t>();
      std::string strategy =
          wa.contains("strategy") && wa["strategy"].is_string() ? wa["strategy"].get<std::string>() : std::string();
      if (strategy.empty()) strategy = s.group_size > 0 ? "group" : s.group_size == -1 ? "channel" : "tensor";
      if (strategy == "tensor") {
        s.strategy = Strategy::kTensor;
      } else if (strategy == "channel") {
        s.strategy = Strategy::kChannel;
      } else if (strategy == "group") {
        s.strategy = Strategy::kGroup;
        if (s.group_size <= 0) fail("{}.weights: strategy 'group' needs a positive group_size", gw);
      } else if (strategy == "block") {
        s.strategy = Strategy::kBlock;
        const json& bs = wa.contains("block_structure") ? wa["block_structure"] : json();
        if (!bs.is_array() || bs.size() != 2 || !bs[0].is_number_integer() || !bs[1].is_number_integer() ||
            bs[0].get<int64_t>() <= 0 || bs[1].get<int64_t>() <= 0)
          fail("{}.weights.block_structure must be two positive integers [rows, cols]", gw);
        s.block_rows = bs[0].get<int64_t>();
        s.block_cols = bs[1].get<int64_t>();
        if (!s.is_float) fail("{}.weights: block strategy is supported for float weights only", gw);
      } else {
        fail("{}.weights.strategy '{}' is not supported (tensor, channel, group, block)", gw, strategy);
      }
      const json actorder = wa.contains("actorder") ? wa["actorder"] : json();
      if (actorder.is_string()) {
        const std::string a = actorder.get<std::string>();
        s.actorder_group = a == "group" || a == "dynamic";
      } else if (actorder.is_boolean()) {
        s.actorder_group = actorder.get<bool>();
      }
      if (s.is_float) {
        if (s.bits != 8) fail("{}.weights: {}-bit float weights are not supported (only fp8 e4m3)", gw, s.bits);
        if (s.format != CtFormat::kFloatQuantized && s.format != CtFormat::kNaiveQuantized)
          fail("{}: float weights in format '{}' are not supported", gw, format_name(s.format));
        s.format = CtFormat::kFloatQuantized;
      } else {
        if (s.format == CtFormat::kFloatQuantized) fail("{}: int weights in format 'float-quantized'", gw);
        if (s.bits < 2 || s.bits > 8 || (s.format == CtFormat::kPackQuantized && 32 % s.bits != 0))
          fail("{}.weights.num_bits {} is not supported (2, 4 or 8 packed; 2..8 unpacked)", gw, s.bits);
      }
      if (s.actorder_group && s.strategy != Strategy::kGroup)
        fail("{}.weights: actorder 'group' needs strategy 'group'", gw);
      const json& ia = g.contains("input_activations") ? g["input_activations"] : json();
      s.quantized_activations = ia.is_object();
      schemes_.push_back(std::move(s));
      targets_.push_back(parse_targets(g.contains("targets") ? g["targets"] : json(), gw + ".targets"));
    }
    ignore_ = parse_targets(qc.contains("ignore") ? qc["ignore"] : json(), where + ".ignore");
  }

  std::string method() const override { return "compressed-tensors"; }

  std::string summary() const override {
    std::string s = "compressed-tensors";
    for (const CtScheme& c : schemes_) {
      s += fmt::format(" [{}: {} {}{} {}{}]", c.group, format_name(c.format), c.is_float ? "fp" : "int", c.bits,
                       strategy_label(c), c.quantized_activations ? ", activations quantized" : "");
    }
    return s;
  }

  // The scheme of a module: nullptr when ignored or targeted by no group.
  const CtScheme* scheme_of(const std::string& module) const {
    for (const Target& t : ignore_) {
      if (match_rank({t}, module) >= 2) return nullptr;  // exact name or regex (a class in ignore: rare)
    }
    int best = 0;
    const CtScheme* out = nullptr;
    for (size_t i = 0; i < schemes_.size(); ++i) {
      const int r = match_rank(targets_[i], module);
      if (r > best) {
        best = r;
        out = &schemes_[i];
      }
    }
    return out;
  }

  bool quantizes(const WeightStore& store, const std::string& name) const override {
    const std::string m = module_of(name);
    if (scheme_of(m) == nullptr) return false;
    if (m == name && store.find(m + ".weight_packed") == nullptr && store.find(m + ".weight") == nullptr)
      return false;  // a fused tensor with no compressed parts: stored as it is
    const TensorInfo* t = store.find(name);
    // A targeted module stored as float (an embedding under "Linear"): plain.
    return !(t != nullptr && (t->dtype == DType::kBF16 || t->dtype == DType::kF16 || t->dtype == DType::kF32));
  }

  bool stores(const WeightStore& store, const std::string& name) const override {
    const std::string m = module_of(name);
    return store.find(name) != nullptr || store.find(m + ".weight_packed") != nullptr ||
           (m == name && store.find(m + ".weight") != nullptr);
  }

  StoredLinear locate(const WeightStore& store, const std::string& name, int64_t experts, int64_t rows,
                      int64_t cols) const override {
    const std::string m = module_of(name);
    const CtScheme* sc = scheme_of(m);
    if (sc == nullptr) prequant_fail(store, name, "is not targeted by any config_groups entry");
    auto st = std::make_shared<CtState>();
    st->scheme = *sc;
    const CtScheme& s = st->scheme;
    st->experts = experts;
    st->rows = rows;
    st->parts = experts > 1 && m.ends_with("gate_up_proj") ? 2 : 1;
    if (rows % st->parts != 0)
      prequant_fail(store, name, fmt::format("holds {} rows per expert, not gate and up of equal size", rows));
    st->sub_rows = rows / st->parts;
    // [E, ...] for fused experts.
    auto shape = [experts](std::vector<int64_t> v) {
      if (experts > 1) v.insert(v.begin(), experts);
      return v;
    };
    StoredLinear w;
    w.name = name;
    w.experts = experts;
    w.rows = rows;
    w.cols = cols;
    w.bits = s.bits;
    w.kind = s.is_float ? PrequantKind::kFloat : PrequantKind::kInt;
    w.symmetric = s.symmetric;
    w.quantized_activations = s.quantized_activations;
    const std::string why = fmt::format("config_groups.{} quantizes '{}' as {}{}", s.group, m, format_name(s.format),
                                        experts > 1 ? ", experts stacked [E, ...] as llm-compressor repacks them" : "");
    // The values.
    if (s.format == CtFormat::kPackQuantized) {
      const int pf = 32 / s.bits;
      st->words = (cols + pf - 1) / pf;
      st->weight = &prequant_need(store, m + ".weight_packed", why);
      prequant_expect(store, *st->weight, {DType::kI32}, shape({rows, st->words}));
      const TensorInfo& wshape = prequant_need(store, m + ".weight_shape", why);
      // Per expert (O, I); gate_up's joined along the last dimension: (F, I, F, I).
      prequant_expect(store, wshape, {DType::kI64, DType::kI32}, shape({2 * st->parts}));
      if (wshape.data != nullptr) {
        for (int64_t e = 0; e < experts; ++e) {
          for (int64_t p = 0; p < st->parts; ++p) {
            const int64_t at = (e * st->parts + p) * 2;
            const int64_t o = shape_value(wshape, at), i = shape_value(wshape, at + 1);
            if (o != st->sub_rows || i != cols)
              prequant_fail(store, wshape.name,
                            fmt::format("holds ({}, {}){}, but config.json implies ({}, {})", o, i,
                                        experts > 1 ? fmt::format(" for expert {}", e) : std::string(), st->sub_rows,
                                        cols));
          }
        }
      }
      w.parts["weight_shape"] = &wshape;
    } else {
      st->weight = &prequant_need(store, m + ".weight", why);
      prequant_expect(store, *st->weight, {s.is_float ? DType::kF8E4M3 : DType::kI8}, shape({rows, cols}));
    }
    w.parts["weight"] = st->weight;
    // The scales.
    std::vector<int64_t> sshape;
    switch (s.strategy) {
      case Strategy::kTensor: sshape = experts > 1 ? std::vector<int64_t>{st->parts} : std::vector<int64_t>{1}; break;
      case Strategy::kChannel: sshape = {rows, 1}; break;
      case Strategy::kGroup:
        if (cols % s.group_size != 0) {
          prequant_fail(store, name,
                        fmt::format("has {} input features, not a multiple of config_groups.{} group_size {}", cols,
                                    s.group, s.group_size));
        }
        sshape = {rows, cols / s.group_size};
        break;
      case Strategy::kBlock:
        if (st->parts > 1 && st->sub_rows % s.block_rows != 0)
          prequant_fail(store, name,
                        fmt::format("has {} rows per gate or up, not a multiple of the block's {}", st->sub_rows,
                                    s.block_rows));
        sshape = {(rows + s.block_rows - 1) / s.block_rows, (cols + s.block_cols - 1) / s.block_cols};
        break;
    }
    sshape = shape(sshape);
    st->scale = &prequant_need(store, m + ".weight_scale", why);
    const TensorInfo& scale = *st->scale;
    // Per module, a per-tensor scale may be [] or [1] and a channel scale [O]; fused experts'
    // are exactly as stacked ([E, parts], [E, rows, 1]).
    const bool scalar_ok =
        experts == 1 && s.strategy == Strategy::kTensor && scale.numel() == 1 && scale.shape.size() <= 1;
    const bool channel_ok =
        experts == 1 && s.strategy == Strategy::kChannel && scale.shape == std::vector<int64_t>{rows};
    prequant_expect(store, scale, {DType::kF32, DType::kBF16, DType::kF16},
                    scalar_ok || channel_ok ? scale.shape : sshape);
    st->scale_cols = s.strategy == Strategy::kGroup   ? cols / s.group_size
                     : s.strategy == Strategy::kBlock ? sshape[1]
                                                      : 1;
    w.parts["weight_scale"] = st->scale;
    if (!s.symmetric) {
      if (s.is_float) prequant_fail(store, name, "asymmetric float weights are not supported");
      st->zero = &prequant_need(store, m + ".weight_zero_point", why + ", asymmetric");
      if (s.format == CtFormat::kPackQuantized && st->zero->dtype == DType::kI32) {
        const int pf = 32 / s.bits;
        st->zero_packed = true;
        prequant_expect(store, *st->zero, {DType::kI32},
                        shape({st->parts * ((st->sub_rows + pf - 1) / pf), st->scale_cols}));
      } else {
        // Unpacked int8 (int-quantized; pack-quantized before compressed-tensors 0.10).
        prequant_expect(store, *st->zero, {DType::kI8}, scalar_ok || channel_ok ? st->zero->shape : sshape);
      }
      w.parts["weight_zero_point"] = st->zero;
    }
    if (s.actorder_group) {
      if (experts > 1)
        prequant_fail(store, m + ".weight_g_idx",
                      "belongs to fused experts with actorder 'group': not supported (store the experts per expert)");
      st->g_idx = &prequant_need(store, m + ".weight_g_idx", why + " with actorder 'group'");
      prequant_expect(store, *st->g_idx, {DType::kI32, DType::kI64}, {cols});
      w.parts["weight_g_idx"] = st->g_idx;
      w.permuted = true;
    }
    w.group_size = s.is_float ? 0 : s.strategy == Strategy::kGroup ? s.group_size : cols;
    if (s.is_float) {
      w.fp8_group = s.strategy == Strategy::kGroup   ? s.group_size
                    : s.strategy == Strategy::kBlock ? s.block_cols
                                                     : cols;
    }
    w.label = fmt::format("{} {}{} {}{}", format_name(s.format), s.is_float ? "fp" : "int", s.bits, strategy_label(s),
                          s.symmetric ? "" : " asym");
    w.state = st;
    return w;
  }

  void int_rows(const StoredLinear& w, int64_t r0, int64_t r1, IntRows& out) const override {
    const auto& st = *static_cast<const CtState*>(w.state.get());
    if (w.kind != PrequantKind::kInt || w.permuted) PrequantFormat::int_rows(w, r0, r1, out);
    const CtScheme& s = st.scheme;
    const int64_t n = r1 - r0, cols = w.cols, groups = w.cols / w.group_size;
    out.resize(n, cols, w.group_size, w.symmetric);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = r0 + r;
      int8_t* q = out.q.data() + r * cols;
      read_row(st, row, cols, q);
      for (int64_t g = 0; g < groups; ++g) {
        out.scale[r * groups + g] = scale_at(st, row, g * w.group_size, groups);
        if (!w.symmetric) out.zero[r * groups + g] = static_cast<int8_t>(zero_at(st, row, g, groups));
      }
    }
    (void)s;
  }

  void fp8_scales(const StoredLinear& w, float* out) const override {
    const auto& st = *static_cast<const CtState*>(w.state.get());
    const int64_t ng = (w.cols + w.fp8_group - 1) / w.fp8_group;
    for (int64_t row = 0; row < w.total_rows(); ++row)
      for (int64_t g = 0; g < ng; ++g) out[row * ng + g] = scale_at(st, row, g * w.fp8_group, st.scale_cols);
  }

  void dequantize_rows(const StoredLinear& w, int64_t r0, int64_t r1, float* out) const override {
    const auto& st = *static_cast<const CtState*>(w.state.get());
    if (w.kind == PrequantKind::kInt && !w.permuted) {
      PrequantFormat::dequantize_rows(w, r0, r1, out);
      return;
    }
    const int64_t cols = w.cols;
    std::vector<int8_t> q(static_cast<size_t>(cols));
    for (int64_t row = r0; row < r1; ++row) {
      float* o = out + (row - r0) * cols;
      if (w.kind == PrequantKind::kFloat) {
        const uint8_t* src = st.weight->data + row * cols;
        for (int64_t c = 0; c < cols; ++c) o[c] = fp8_e4m3_to_f32(src[c]) * scale_at(st, row, c, st.scale_cols);
        continue;
      }
      // Integer with g_idx: column c's group is g_idx[c].
      read_row(st, row, cols, q.data());
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = g_idx_at(st, c);
        if (g < 0 || g >= st.scale_cols)
          fail("{}: tensor '{}' maps column {} to group {}, outside [0, {})", w.name, st.g_idx->name, c, g,
               st.scale_cols);
        const int zero = w.symmetric ? 0 : zero_at(st, row, g, st.scale_cols);
        o[c] = prequant_scalar(*st.scale, row * st.scale_cols + g) * static_cast<float>(q[c] - zero);
      }
    }
  }

  // Asymmetric int4 (W4A16_ASYM: pack-quantized with packed zero points) binds exactly onto
  // the int4 schemes, each group's zero point carried as the row-indexed correction (as GPTQ's
  // and AWQ's), instead of requantized to symmetric int4.
  bool binds_exactly(const StoredLinear& w, kernels::QuantScheme scheme) const override {
    return kernels::scheme_is_int4(scheme) && w.kind == PrequantKind::kInt && w.bits == 4 && !w.symmetric &&
           !w.permuted && w.group_size % 32 == 0;
  }

  bool bind_in_place(const StoredLinear& w, kernels::QuantScheme scheme, kernels::QuantMatRef& out,
                     std::vector<std::shared_ptr<void>>& owned) const override {
    if (binds_exactly(w, scheme)) return prequant::bind_int4_with_zeros(*this, w, scheme, out, owned);
    const auto& st = *static_cast<const CtState*>(w.state.get());
    // int8 [O, I] used where it lies; the scales as f32 [O] (converted when stored otherwise).
    if (scheme != kernels::QuantScheme::kW8A8 || st.scheme.format == CtFormat::kPackQuantized ||
        st.weight->dtype != DType::kI8 || w.group_size != w.cols)
      return false;
    const void* scales = st.scale->data;
    const int64_t rows = w.total_rows();
    if (st.scale->dtype != DType::kF32 || st.scheme.strategy == Strategy::kTensor) {
      auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(rows)]);
      for (int64_t r = 0; r < rows; ++r) buf[r] = scale_at(st, r, 0, 1);
      scales = buf.get();
      owned.push_back(std::move(buf));
    }
    out = kernels::QuantMatRef(scheme, rows, w.cols, w.cols, st.weight->data, scales);
    kernels::check_quant_matrix(out);
    return true;
  }

  bool is_auxiliary(const std::string& t) const override {
    return t.ends_with(".input_scale") || t.ends_with(".input_zero_point") || t.ends_with(".output_scale") ||
           t.ends_with(".output_zero_point") || t.ends_with(".k_scale") || t.ends_with(".v_scale");
  }

 private:
  static std::string strategy_label(const CtScheme& s) {
    switch (s.strategy) {
      case Strategy::kTensor: return "per tensor";
      case Strategy::kChannel: return "per channel";
      case Strategy::kGroup: return fmt::format("g{}{}", s.group_size, s.actorder_group ? " actorder" : "");
      case Strategy::kBlock: return fmt::format("block {}x{}", s.block_rows, s.block_cols);
    }
    return "?";
  }

  static int64_t shape_value(const TensorInfo& t, int64_t i) {
    if (t.dtype == DType::kI64) {
      int64_t v;
      std::memcpy(&v, t.data + i * 8, 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, t.data + i * 4, 4);
    return v;
  }

  static int64_t g_idx_at(const CtState& st, int64_t c) { return shape_value(*st.g_idx, c); }

  // Row `row`'s values as signed integers.
  static void read_row(const CtState& st, int64_t row, int64_t cols, int8_t* q) {
    const CtScheme& s = st.scheme;
    if (s.format != CtFormat::kPackQuantized) {
      std::memcpy(q, st.weight->data + row * cols, static_cast<size_t>(cols));
      return;
    }
    const int pf = 32 / s.bits, off = 1 << (s.bits - 1);
    const uint32_t mask = (1u << s.bits) - 1;
    const uint8_t* words = st.weight->data + row * st.words * 4;
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t word;
      std::memcpy(&word, words + (c / pf) * 4, 4);
      q[c] = static_cast<int8_t>(static_cast<int>((word >> ((c % pf) * s.bits)) & mask) - off);
    }
  }

  // The scale of (row, column c); scale_cols: the scale tensor's columns per row.
  // `row` counts over the [experts · rows, cols] matrix.
  static float scale_at(const CtState& st, int64_t row, int64_t c, int64_t scale_cols) {
    const CtScheme& s = st.scheme;
    switch (s.strategy) {
      case Strategy::kTensor:  // one per module, or per (expert, gate/up) stacked [E, parts]
        return prequant_scalar(*st.scale, (row / st.rows) * st.parts + (row % st.rows) / st.sub_rows);
      case Strategy::kChannel: return prequant_scalar(*st.scale, row);
      case Strategy::kGroup: return prequant_scalar(*st.scale, row * scale_cols + c / s.group_size);
      case Strategy::kBlock: {
        const int64_t per = (st.rows + s.block_rows - 1) / s.block_rows;  // block rows per expert
        return prequant_scalar(*st.scale, ((row / st.rows) * per + (row % st.rows) / s.block_rows) * st.scale_cols +
                                              c / s.block_cols);
      }
    }
    return 0;
  }

  // The signed zero point of (row, group g).
  static int zero_at(const CtState& st, int64_t row, int64_t g, int64_t groups) {
    const CtScheme& s = st.scheme;
    if (st.zero_packed) {
      // Packed along each expert's gate or up rows: [E, parts · ceil(sub_rows / pf), groups].
      const int pf = 32 / s.bits;
      const int64_t words = (st.sub_rows + pf - 1) / pf;
      const int64_t part = row / st.sub_rows, r = row % st.sub_rows;  // part counts over experts too
      uint32_t word;
      std::memcpy(&word, st.zero->data + ((part * words + r / pf) * groups + g) * 4, 4);
      return static_cast<int>((word >> ((r % pf) * s.bits)) & ((1u << s.bits) - 1)) - (1 << (s.bits - 1));
    }
    const auto* z = reinterpret_cast<const int8_t*>(st.zero->data);
    switch (s.strategy) {
      case Strategy::kTensor: return z[(row / st.rows) * st.parts + (row % st.rows) / st.sub_rows];
      case Strategy::kChannel: return z[row];
      default: return z[row * groups + g];
    }
  }

  std::vector<CtScheme> schemes_;
  std::vector<std::vector<Target>> targets_;
  std::vector<Target> ignore_;
};

}  // namespace

std::unique_ptr<PrequantFormat> make_compressed_tensors_format(const PrequantFiles& files) {
  return std::make_unique<CtFormatImpl>(files);
}

}  // namespace infera
