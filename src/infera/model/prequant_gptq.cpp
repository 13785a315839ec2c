#include "infera/model/prequant_gptq.h"
#include "infera/base/ascii.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <numeric>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/model/prequant_formats.h"
#include "infera/model/quantized_weights.h"

namespace infera::prequant {

using json = nlohmann::json;

namespace {

void expect(const RawTensor& t, const std::string& what, std::initializer_list<DType> dtypes,
            const std::vector<int64_t>& shape, const std::string& where) {
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    std::string names;
    for (DType d : dtypes) names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
    fail("{}: tensor '{}' has dtype {}, expected {}", where, what, dtype_name(t.dtype), names);
  }
  if (t.shape != shape) {
    fail("{}: tensor '{}' has shape {}, expected {}", where, what, shape_string(t.shape), shape_string(shape));
  }
  if (t.data == nullptr) fail("{}: tensor '{}' has no data", where, what);
}

float scale_value(const RawTensor& t, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  switch (t.dtype) {
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return bf16_to_f32(h);
    }
    default: {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
  }
}

uint32_t word(const RawTensor& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, static_cast<const uint8_t*>(t.data) + i * 4, 4);
  return w;
}

int64_t group_count(int64_t cols, int64_t group_size, const std::string& where) {
  if (group_size == -1) return 1;
  if (group_size <= 0) fail("{}: group_size {} is not valid (-1 or a positive number)", where, group_size);
  if (cols % group_size != 0) {
    fail("{}: group_size {} does not divide the layer's {} input features", where, group_size, cols);
  }
  return cols / group_size;
}

}  // namespace

std::vector<float> IntGroupMatrix::dequantize() const {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < cols; ++k)
      w[n * cols + k] = scale(n, k) * static_cast<float>(int32_t{q[n * cols + k]} - zero(n, k));
  return w;
}

IntGroupMatrix unpack_gptq(const RawTensor& qweight, const RawTensor& qzeros, const RawTensor& scales,
                           const RawTensor* g_idx, int64_t rows, int64_t cols, int bits, int64_t group_size, bool v2,
                           const std::string& where, int64_t r0, int64_t r1) {
  if (r1 < 0) r1 = rows;
  if (bits != 2 && bits != 4 && bits != 8) fail("{}: bits {} cannot be unpacked (2, 4 or 8)", where, bits);
  const int pf = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  if (cols % pf != 0 || rows % pf != 0) {
    fail("{}: a {}-bit GPTQ layer needs input and output features that are multiples of {} (got [{}, {}])", where, bits,
         pf, rows, cols);
  }
  IntGroupMatrix m;
  m.rows = r1 - r0;
  m.cols = cols;
  m.bits = bits;
  m.groups = group_count(cols, group_size, where + ": quantization_config.group_size");
  expect(qweight, "qweight", {DType::kI32}, {cols / pf, rows}, where);
  expect(qzeros, "qzeros", {DType::kI32}, {m.groups, rows / pf}, where);
  expect(scales, "scales", {DType::kF16, DType::kBF16, DType::kF32}, {m.groups, rows}, where);
  m.q.resize(static_cast<size_t>(m.rows * cols));
  for (int64_t r = 0; r < cols / pf; ++r)
    for (int64_t n = r0; n < r1; ++n) {
      const uint32_t w = word(qweight, r * rows + n);
      for (int i = 0; i < pf; ++i) m.q[(n - r0) * cols + r * pf + i] = static_cast<uint8_t>((w >> (bits * i)) & mask);
    }
  m.scales.resize(static_cast<size_t>(m.rows * m.groups));
  m.zeros.resize(static_cast<size_t>(m.rows * m.groups));
  for (int64_t g = 0; g < m.groups; ++g)
    for (int64_t n = r0; n < r1; ++n) {
      m.scales[(n - r0) * m.groups + g] = scale_value(scales, g * rows + n);
      const uint32_t w = word(qzeros, g * (rows / pf) + n / pf);
      const int32_t stored = static_cast<int32_t>((w >> (bits * (n % pf))) & mask);
      m.zeros[(n - r0) * m.groups + g] = v2 ? stored : stored + 1;  // v1 stores zero - 1
    }
  m.group_of_col.resize(static_cast<size_t>(cols));
  if (g_idx != nullptr) {
    expect(*g_idx, "g_idx", {DType::kI32, DType::kI64}, {cols}, where);
    for (int64_t k = 0; k < cols; ++k) {
      int64_t g = 0;
      if (g_idx->dtype == DType::kI32) {
        g = static_cast<int32_t>(word(*g_idx, k));
      } else {
        std::memcpy(&g, static_cast<const uint8_t*>(g_idx->data) + k * 8, 8);
      }
      if (g < 0 || g >= m.groups) fail("{}: g_idx[{}] = {} is outside the {} groups", where, k, g, m.groups);
      m.group_of_col[k] = static_cast<int32_t>(g);
    }
  } else {
    const int64_t gs = group_size == -1 ? cols : group_size;
    for (int64_t k = 0; k < cols; ++k) m.group_of_col[k] = static_cast<int32_t>(k / gs);
  }
  return m;
}

IntGroupMatrix unpack_awq(const RawTensor& qweight, const RawTensor& qzeros, const RawTensor& scales, int64_t rows,
                          int64_t cols, int64_t group_size, const std::string& where, int64_t r0, int64_t r1) {
  if (r1 < 0) r1 = rows;
  static constexpr int kSlotOfColumn[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // inverse of [0, 2, 4, 6, 1, 3, 5, 7]
  if (rows % 8 != 0) fail("{}: an AWQ layer needs output features that are a multiple of 8 (got {})", where, rows);
  IntGroupMatrix m;
  m.rows = r1 - r0;
  m.cols = cols;
  m.bits = 4;
  m.groups = group_count(cols, group_size, where + ": quantization_config.group_size");
  const int64_t gs = group_size == -1 ? cols : group_size;
  expect(qweight, "qweight", {DType::kI32}, {cols, rows / 8}, where);
  expect(qzeros, "qzeros", {DType::kI32}, {m.groups, rows / 8}, where);
  expect(scales, "scales", {DType::kF16, DType::kBF16, DType::kF32}, {m.groups, rows}, where);
  m.q.resize(static_cast<size_t>(m.rows * cols));
  for (int64_t k = 0; k < cols; ++k)
    for (int64_t n = r0; n < r1; ++n) {
      const uint32_t w = word(qweight, k * (rows / 8) + n / 8);
      m.q[(n - r0) * cols + k] = static_cast<uint8_t>((w >> (4 * kSlotOfColumn[n % 8])) & 0xf);
    }
  m.scales.resize(static_cast<size_t>(m.rows * m.groups));
  m.zeros.resize(static_cast<size_t>(m.rows * m.groups));
  for (int64_t g = 0; g < m.groups; ++g)
    for (int64_t n = r0; n < r1; ++n) {
      m.scales[(n - r0) * m.groups + g] = scale_value(scales, g * rows + n);
      const uint32_t w = word(qzeros, g * (rows / 8) + n / 8);
      m.zeros[(n - r0) * m.groups + g] = static_cast<int32_t>((w >> (4 * kSlotOfColumn[n % 8])) & 0xf);
    }
  m.group_of_col.resize(static_cast<size_t>(cols));
  for (int64_t k = 0; k < cols; ++k) m.group_of_col[k] = static_cast<int32_t>(k / gs);
  return m;
}

std::optional<Int4Layout> to_infera_int4(const IntGroupMatrix& m, std::string* why) {
  auto no = [&](std::string reason) -> std::optional<Int4Layout> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (m.bits != 4) return no(fmt::format("{}-bit weights (the int4 kernels take 4)", m.bits));
  const int64_t rows = m.rows, cols = m.cols;
  std::vector<int64_t> count(static_cast<size_t>(m.groups), 0);
  for (int32_t g : m.group_of_col) ++count[g];
  const int64_t G = count.empty() ? 0 : count[0];
  for (int64_t c : count)
    if (c != G) return no("groups of unequal size");
  if (G % 32 != 0) return no(fmt::format("groups of {} inputs (the int4 kernels need multiples of 32)", G));
  const int64_t gs = G % 128 == 0 ? 128 : G % 64 == 0 ? 64 : 32;
  // Columns sorted by group (stable): identity unless act-order shuffled the groups.
  std::vector<int32_t> perm(static_cast<size_t>(cols));
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int32_t a, int32_t b) { return m.group_of_col[a] < m.group_of_col[b]; });
  bool identity = true;
  for (int64_t j = 0; j < cols; ++j) identity = identity && perm[j] == j;
  Int4Layout l;
  l.rows = rows;
  l.cols = cols;
  l.group_size = gs;
  l.qweight.assign(static_cast<size_t>(rows * cols / 2), 0);
  l.scales.resize(static_cast<size_t>(rows * (cols / gs)));
  const int64_t ng = cols / G;
  bool zeros_at_8 = true;
  for (int32_t z : m.zeros) zeros_at_8 = zeros_at_8 && z == 8;
  std::vector<float> corr(zeros_at_8 ? 0 : static_cast<size_t>(rows * ng));
  for (int64_t n = 0; n < rows; ++n) {
    uint8_t* row = l.qweight.data() + n * (cols / 2);
    for (int64_t j = 0; j < cols; ++j) {
      const uint8_t nib = m.q[n * cols + perm[j]];
      const int64_t run = j / 32 * 32, jj = j % 32;
      row[run / 2 + jj % 16] |= jj < 16 ? nib : static_cast<uint8_t>(nib << 4);
    }
    for (int64_t o = 0; o < ng; ++o) {
      const int32_t g = m.group_of_col[perm[o * G]];
      const uint16_t s16 = f32_to_f16(m.scales[n * m.groups + g]);
      for (int64_t i = o * G / gs; i < (o + 1) * G / gs; ++i) l.scales[n * (cols / gs) + i] = s16;
      if (!zeros_at_8) corr[o * rows + n] = f16_to_f32(s16) * static_cast<float>(8 - m.zeros[n * m.groups + g]);
    }
  }
  if (!identity || !zeros_at_8) {
    l.extras = std::make_shared<kernels::QuantExtras>();
    if (!identity) l.extras->in_perm = std::move(perm);
    if (!zeros_at_8) {
      l.extras->corr_group = G;
      l.extras->corr = std::move(corr);
    }
  }
  return l;
}

std::vector<float> dequantize_int4_layout(const Int4Layout& l) {
  kernels::QuantMatRef w(kernels::QuantScheme::kW4A16, l.rows, l.cols, l.group_size, l.qweight.data(), l.scales.data());
  w.extras = l.extras;
  std::vector<float> out(static_cast<size_t>(l.rows * l.cols));
  for (int64_t n = 0; n < l.rows; ++n) kernels::dequantize_row(w, n, out.data() + n * l.cols);
  return out;
}

kernels::QuantMatRef own_int4_layout(Int4Layout&& l, kernels::QuantScheme scheme,
                                     std::vector<std::shared_ptr<void>>& owned) {
  auto q = std::make_shared<std::vector<uint8_t>>(std::move(l.qweight));
  auto s = std::make_shared<std::vector<uint16_t>>(std::move(l.scales));
  kernels::QuantMatRef m(scheme, l.rows, l.cols, l.group_size, q->data(), s->data());
  m.extras = std::move(l.extras);
  kernels::check_quant_matrix(m);
  owned.push_back(std::move(q));
  owned.push_back(std::move(s));
  return m;
}

bool bind_int4_layouts(std::vector<Int4Layout>&& ls, const StoredLinear& w, kernels::QuantScheme scheme,
                       kernels::QuantMatRef& out, std::vector<std::shared_ptr<void>>& owned) {
  if (ls.size() == 1) {
    out = own_int4_layout(std::move(ls[0]), scheme, owned);
    return true;
  }
  auto q = std::make_shared<std::vector<uint8_t>>();
  auto s = std::make_shared<std::vector<uint16_t>>();
  std::shared_ptr<kernels::QuantExtras> extras;
  int64_t corr_group = 0;
  for (const Int4Layout& l : ls) {
    if (l.extras) corr_group = l.extras->corr_group;
  }
  const int64_t total = w.total_rows(), ng = corr_group > 0 ? w.cols / corr_group : 0;
  if (corr_group > 0) {
    extras = std::make_shared<kernels::QuantExtras>();
    extras->corr_group = corr_group;
    extras->corr.assign(static_cast<size_t>(ng * total), 0.0f);  // every zero point 8: no correction
  }
  int64_t row0 = 0;  // the expert's first row in the stacked matrix
  for (Int4Layout& l : ls) {
    if (l.group_size != ls[0].group_size || (l.extras && l.extras->corr_group != corr_group)) {
      LOG_WARN("'{}' ({}): experts with different groups: requantized", w.name, w.label);
      return false;
    }
    q->insert(q->end(), l.qweight.begin(), l.qweight.end());
    s->insert(s->end(), l.scales.begin(), l.scales.end());
    if (extras && l.extras) {  // group-major: each group's rows of this expert at row0
      for (int64_t g = 0; g < ng; ++g)
        std::copy_n(l.extras->corr.data() + g * l.rows, l.rows, extras->corr.data() + g * total + row0);
    }
    row0 += l.rows;
  }
  out = kernels::QuantMatRef(scheme, w.total_rows(), w.cols, ls[0].group_size, q->data(), s->data());
  out.extras = std::move(extras);
  kernels::check_quant_matrix(out);
  owned.push_back(std::move(q));
  owned.push_back(std::move(s));
  return true;
}

bool bind_int4_with_zeros(const PrequantFormat& f, const StoredLinear& w, kernels::QuantScheme scheme,
                          kernels::QuantMatRef& out, std::vector<std::shared_ptr<void>>& owned) {
  if (w.kind != PrequantKind::kInt || w.bits != 4 || w.permuted || w.group_size <= 0) return false;
  std::vector<Int4Layout> ls;
  IntRows ir;
  for (int64_t e = 0; e < w.experts; ++e) {
    f.int_rows(w, e * w.rows, (e + 1) * w.rows, ir);
    IntGroupMatrix m;
    m.rows = w.rows;
    m.cols = w.cols;
    m.bits = 4;
    m.groups = w.cols / w.group_size;
    m.q.resize(ir.q.size());
    for (size_t i = 0; i < ir.q.size(); ++i) m.q[i] = static_cast<uint8_t>(ir.q[i] + 8);
    m.scales = ir.scale;
    m.zeros.resize(m.scales.size(), 8);
    for (size_t i = 0; i < ir.zero.size(); ++i) m.zeros[i] = ir.zero[i] + 8;
    m.group_of_col.resize(static_cast<size_t>(w.cols));
    for (int64_t k = 0; k < w.cols; ++k) m.group_of_col[k] = static_cast<int32_t>(k / w.group_size);
    std::string why;
    std::optional<Int4Layout> l = to_infera_int4(m, &why);
    if (!l) {
      LOG_WARN("'{}' ({}): {}: requantized", w.name, w.label, why);
      return false;
    }
    ls.push_back(std::move(*l));
  }
  return bind_int4_layouts(std::move(ls), w, scheme, out, owned);
}

GptqConfig parse_gptq_config(const json& qc, const std::string& where) {
  const std::string w = where + ": quantization_config";
  GptqConfig c;
  const std::string method = qc.value("quant_method", std::string());
  c.awq = method == "awq";
  auto int_field = [&](std::initializer_list<const char*> keys, int64_t def) -> int64_t {
    for (const char* k : keys) {
      if (!qc.contains(k)) continue;
      if (!qc[k].is_number_integer()) fail("{}.{} must be an integer", w, k);
      return qc[k].get<int64_t>();
    }
    return def;
  };
  auto bool_field = [&](const char* k, bool def) {
    if (!qc.contains(k) || qc[k].is_null()) return def;
    if (!qc[k].is_boolean()) fail("{}.{} must be true or false", w, k);
    return qc[k].get<bool>();
  };
  auto string_field = [&](std::initializer_list<const char*> keys, const std::string& def) {
    for (const char* k : keys) {
      if (!qc.contains(k) || qc[k].is_null()) continue;
      if (!qc[k].is_string()) fail("{}.{} must be a string", w, k);
      return qc[k].get<std::string>();
    }
    return def;
  };
  c.bits = static_cast<int>(int_field({"bits", "w_bit"}, 4));
  if (c.bits != 4) {
    fail(
        "{}.bits is {}: only 4-bit {} checkpoints are supported (2-, 3- and 8-bit layouts are refused rather than "
        "loaded wrongly)",
        w, c.bits, c.awq ? "AWQ" : "GPTQ");
  }
  c.group_size = int_field({"group_size", "q_group_size"}, 128);
  if (c.group_size != -1 && c.group_size <= 0) fail("{}.group_size {} is not valid (-1 or positive)", w, c.group_size);
  if (c.awq) {
    c.sym = !bool_field("zero_point", true);
    if (c.sym) {
      fail(
          "{}.zero_point is false: AWQ's GEMM layout stores zero points, and a checkpoint without them is not "
          "supported",
          w);
    }
    const std::string version = string_field({"version"}, "gemm");
    if (ascii_lower(version) != "gemm") {
      fail("{}.version is '{}': only AWQ's GEMM layout is supported (GEMV and Marlin layouts differ)", w, version);
    }
    if (qc.contains("modules_to_not_convert") && qc["modules_to_not_convert"].is_array()) {
      for (const auto& m : qc["modules_to_not_convert"])
        if (m.is_string()) c.skip.push_back(m.get<std::string>());
    }
  } else {
    c.sym = bool_field("sym", true);
    c.desc_act = bool_field("desc_act", false);
    if (bool_field("is_marlin_format", false)) {
      fail("{}.is_marlin_format is true: Marlin-tiled GPTQ files are not supported", w);
    }
    const std::string fmt_name = string_field({"checkpoint_format", "format"}, "gptq");
    if (fmt_name == "gptq_v2") {
      c.v2 = true;
    } else if (fmt_name != "gptq") {
      fail("{}.checkpoint_format is '{}': supported are 'gptq' (v1) and 'gptq_v2'", w, fmt_name);
    }
    const std::string pack = string_field({"pack_dtype"}, "int32");
    if (pack != "int32") fail("{}.pack_dtype is '{}': only int32 words are supported", w, pack);
    c.lm_head = bool_field("lm_head", false);
    if (qc.contains("dynamic") && qc["dynamic"].is_object()) {
      for (const auto& [key, value] : qc["dynamic"].items()) {
        if (key.starts_with("-:")) {
          c.skip_regex.push_back(key.substr(2));
        } else {
          fail("{}.dynamic['{}']: per-module overrides of bits or group size are not supported", w, key);
        }
      }
    }
  }
  return c;
}

bool gptq_skips(const GptqConfig& c, const std::string& name) {
  const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
  for (const std::string& s : c.skip)
    if (module.find(s) != std::string::npos) return true;
  for (const std::string& r : c.skip_regex) {
    try {
      if (std::regex_search(module, std::regex(r), std::regex_constants::match_continuous)) return true;
    } catch (const std::regex_error&) {
      fail("quantization_config.dynamic: '-:{}' is not a valid regular expression", r);
    }
  }
  return false;
}

// ---- the format (model/prequant.h) ----

namespace {

RawTensor raw(const TensorInfo& t) { return RawTensor{t.data, t.dtype, t.shape}; }

// Expert e of a fused [E, ...] tensor (the whole tensor when experts == 1).
RawTensor raw(const TensorInfo& t, int64_t e, int64_t experts) {
  if (experts == 1) return raw(t);
  const int64_t per = static_cast<int64_t>(t.nbytes) / experts;
  return RawTensor{t.data + e * per, t.dtype, std::vector<int64_t>(t.shape.begin() + 1, t.shape.end())};
}

// The module a weight's tensors are stored under: "<m>" of "<m>.weight", or a fused expert
// tensor's own name ("...mlp.experts.gate_up_proj": its parts are "<name>.qweight", ...).
std::string module_of(const std::string& name) {
  std::string m = prequant_module(name);
  return m.empty() ? name : m;
}

class GptqFormat final : public PrequantFormat {
 public:
  explicit GptqFormat(const PrequantFiles& files)
      : c_(parse_gptq_config(files.quantization_config, files.dir + "/config.json")) {}

  std::string method() const override { return c_.awq ? "awq" : "gptq"; }
  std::string summary() const override {
    std::string s = fmt::format("{} int{} {}", method(), c_.bits,
                                c_.group_size == -1 ? std::string("per channel") : fmt::format("g{}", c_.group_size));
    if (!c_.awq)
      s += fmt::format("{}{}, {}", c_.sym ? " sym" : " asym", c_.desc_act ? " act-order" : "",
                       c_.v2 ? "gptq_v2" : "v1 zeros");
    return s;
  }
  bool quantizes(const WeightStore& store, const std::string& name) const override {
    return store.find(module_of(name) + ".qweight") != nullptr;
  }
  bool stores(const WeightStore& store, const std::string& name) const override {
    return store.find(name) != nullptr || quantizes(store, name);
  }

  // Per module [O, I], or fused experts (the native formats' layout: "<name>.qweight" etc. with
  // the experts first, [E, ...] of each tensor below).
  StoredLinear locate(const WeightStore& store, const std::string& name, int64_t experts, int64_t rows,
                      int64_t cols) const override {
    const std::string m = module_of(name);
    StoredLinear w;
    w.name = name;
    w.kind = PrequantKind::kInt;
    w.bits = c_.bits;
    w.experts = experts;
    w.rows = rows;
    w.cols = cols;
    auto shape = [experts](std::vector<int64_t> s) {
      if (experts > 1) s.insert(s.begin(), experts);
      return s;
    };
    const int64_t G = c_.group_size == -1 ? cols : c_.group_size;
    if (cols % G != 0) {
      prequant_fail(store, m + ".qweight",
                    fmt::format("has {} input features, which quantization_config.group_size {} does not divide", cols,
                                c_.group_size));
    }
    const int64_t ng = cols / G;
    w.group_size = G;
    w.symmetric = !c_.awq && c_.sym;
    w.label = fmt::format("{} int4 g{}{}", method(), G, w.symmetric ? " sym" : " asym");
    const TensorInfo& qw = prequant_need(store, m + ".qweight", method() + " packed weights");
    const TensorInfo& qz = prequant_need(store, m + ".qzeros", "zero points are missing");
    const TensorInfo& sc = prequant_need(store, m + ".scales", "the groups' scales");
    if (c_.awq) {
      if (rows % 8 != 0) prequant_fail(store, qw.name, fmt::format("has {} outputs, not a multiple of 8", rows));
      prequant_expect(store, qw, {DType::kI32}, shape({cols, rows / 8}));
    } else {
      if (rows % 8 != 0 || cols % 8 != 0)
        prequant_fail(store, qw.name, fmt::format("holds a [{}, {}] layer, not multiples of 8", rows, cols));
      prequant_expect(store, qw, {DType::kI32}, shape({cols / 8, rows}));
    }
    prequant_expect(store, qz, {DType::kI32}, shape({ng, rows / 8}));
    prequant_expect(store, sc, {DType::kF16, DType::kBF16, DType::kF32}, shape({ng, rows}));
    w.parts = {{"qweight", &qw}, {"qzeros", &qz}, {"scales", &sc}};
    if (!c_.awq) {
      if (const TensorInfo* gi = store.find(m + ".g_idx")) {
        prequant_expect(store, *gi, {DType::kI32, DType::kI64}, shape({cols}));
        w.parts["g_idx"] = gi;
        w.permuted = c_.desc_act;  // stored order: the data says (checked when bound)
      } else if (c_.desc_act) {
        prequant_need(store, m + ".g_idx", "quantization_config.desc_act is true: act-order needs each input's group");
      }
    }
    return w;
  }

  // Rows [r0, r1) of expert e's [rows, cols] matrix (0 <= r0 < r1 <= w.rows).
  IntGroupMatrix unpack(const StoredLinear& w, int64_t e, int64_t r0, int64_t r1) const {
    const std::string where =
        w.experts > 1 ? fmt::format("{}: {} layer '{}' expert {}", w.part("qweight").file, method(), w.name, e)
                      : fmt::format("{}: {} layer '{}'", w.part("qweight").file, method(), w.name);
    const int64_t E = w.experts;
    if (c_.awq)
      return unpack_awq(raw(w.part("qweight"), e, E), raw(w.part("qzeros"), e, E), raw(w.part("scales"), e, E), w.rows,
                        w.cols, c_.group_size, where, r0, r1);
    const auto gi = w.parts.find("g_idx");
    const RawTensor g = gi != w.parts.end() ? raw(*gi->second, e, E) : RawTensor{};
    return unpack_gptq(raw(w.part("qweight"), e, E), raw(w.part("qzeros"), e, E), raw(w.part("scales"), e, E),
                       gi != w.parts.end() ? &g : nullptr, w.rows, w.cols, c_.bits, c_.group_size, c_.v2, where, r0,
                       r1);
  }

  // Rows [r0, r1) of the [experts · rows, cols] matrix, expert by expert: f(m, first row of m).
  template <class F>
  void for_each_expert(const StoredLinear& w, int64_t r0, int64_t r1, F&& f) const {
    for (int64_t r = r0; r < r1;) {
      const int64_t e = r / w.rows, end = std::min(r1, (e + 1) * w.rows);
      f(unpack(w, e, r - e * w.rows, end - e * w.rows), r - r0);
      r = end;
    }
  }

  void int_rows(const StoredLinear& w, int64_t r0, int64_t r1, IntRows& out) const override {
    out.resize(r1 - r0, w.cols, w.group_size, w.symmetric);
    for_each_expert(w, r0, r1, [&](const IntGroupMatrix& m, int64_t at) {
      for (int64_t n = 0; n < m.rows; ++n) {
        const int64_t o = at + n;
        for (int64_t k = 0; k < w.cols; ++k) {
          if (m.group_of_col[k] != k / w.group_size)
            fail("'{}': g_idx[{}] = {} is not in input order (act-order without desc_act)", w.name, k,
                 m.group_of_col[k]);
          out.q[o * w.cols + k] = static_cast<int8_t>(m.q[n * w.cols + k] - 8);
        }
        for (int64_t g = 0; g < m.groups; ++g) {
          out.scale[o * m.groups + g] = m.scales[n * m.groups + g];
          const int32_t z = m.zeros[n * m.groups + g];
          if (w.symmetric && z != 8) {
            fail("'{}': quantization_config.sym is true but row {} group {} has zero point {} (not 8)", w.name, r0 + o,
                 g, z);
          }
          if (!w.symmetric) out.zero[o * m.groups + g] = static_cast<int8_t>(z - 8);
        }
      }
    });
  }

  void dequantize_rows(const StoredLinear& w, int64_t r0, int64_t r1, float* out) const override {
    for_each_expert(w, r0, r1, [&](const IntGroupMatrix& m, int64_t at) {
      const std::vector<float> v = m.dequantize();
      std::copy(v.begin(), v.end(), out + at * w.cols);
    });
  }

  bool binds_exactly(const StoredLinear& w, kernels::QuantScheme scheme) const override {
    return kernels::scheme_is_int4(scheme) && w.bits == 4;
  }

  // Fused experts with act-order (desc_act and a g_idx per expert): each expert its own matrix
  // with its own input permutation (the kernels take one per matrix), exactly.
  bool bind_experts_apart(const StoredLinear& w, kernels::QuantScheme scheme, std::vector<kernels::QuantMatRef>& out,
                          std::vector<std::shared_ptr<void>>& owned) const override {
    if (w.experts == 1 || !w.permuted || !binds_exactly(w, scheme)) return false;
    std::vector<Int4Layout> ls;
    for (int64_t e = 0; e < w.experts; ++e) {
      std::string why;
      std::optional<Int4Layout> l = to_infera_int4(unpack(w, e, 0, w.rows), &why);
      if (!l) {
        LOG_WARN("'{}' ({}) expert {}: {}: requantized", w.name, w.label, e, why);
        return false;
      }
      ls.push_back(std::move(*l));
    }
    for (Int4Layout& l : ls) out.push_back(own_int4_layout(std::move(l), scheme, owned));
    return true;
  }

  // Fused experts: each expert mapped on its own, then their rows concatenated (the zero-point
  // correction is indexed by row; act-order, a permutation per expert, is bound apart above).
  bool bind_in_place(const StoredLinear& w, kernels::QuantScheme scheme, kernels::QuantMatRef& out,
                     std::vector<std::shared_ptr<void>>& owned) const override {
    if (!binds_exactly(w, scheme)) return false;
    std::vector<Int4Layout> ls;
    for (int64_t e = 0; e < w.experts; ++e) {
      std::string why;
      std::optional<Int4Layout> l = to_infera_int4(unpack(w, e, 0, w.rows), &why);
      if (l && w.experts > 1 && l->extras && !l->extras->in_perm.empty()) why = "act-order in a fused expert tensor";
      if (!l || !why.empty()) {
        LOG_WARN("'{}' ({}): {}: requantized", w.name, w.label, why);
        return false;
      }
      ls.push_back(std::move(*l));
    }
    return bind_int4_layouts(std::move(ls), w, scheme, out, owned);
  }

 private:
  GptqConfig c_;
};

}  // namespace

}  // namespace infera::prequant

namespace infera {

std::unique_ptr<PrequantFormat> make_gptq_format(const PrequantFiles& files) {
  return std::make_unique<prequant::GptqFormat>(files);
}

}  // namespace infera
