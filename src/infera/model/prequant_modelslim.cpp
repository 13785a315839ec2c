#include "infera/model/prequant_modelslim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/log.h"
#include "infera/model/prequant_formats.h"
#include "infera/model/quantized_weights.h"
#include "infera/model/weights.h"

namespace infera::prequant {

using json = nlohmann::json;

namespace {

const std::set<std::string, std::less<>> kReserved = {"model_quant_type",  "version",
                                                      "group_size",        "kv_cache_type",
                                                      "kv_quant_type",     "fa_quant_type",
                                                      "reduce_quant_type", "indexer_quant_type",
                                                      "metadata",          "optional"};
const std::set<std::string, std::less<>> kKnownTypes = {
    "FLOAT",      "W8A8",      "W8A8_DYNAMIC", "W8A8_MIX", "W8A16", "W4A8_DYNAMIC", "W4A4_DYNAMIC", "WFP8AFP8_DYNAMIC",
    "W8A8_MXFP8", "W4A8_MXFP", "W4A4_MXFP4",   "W16A16S",  "W8A8S", "W8A8SC",       "C8",           "FAQuant"};
const std::set<std::string, std::less<>> kRunTypes = {"FLOAT", "W8A8", "W8A8_DYNAMIC", "W4A8_DYNAMIC"};

std::string module_of(const std::string& weight_name) {
  return weight_name.ends_with(".weight") ? weight_name.substr(0, weight_name.size() - 7) : weight_name;
}

// One element of a constant as f32: the float dtypes as every format reads its scales
// (prequant_scalar), msModelSlim's integer constants by value.
float value_at(const TensorInfo& t, int64_t i) {
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return prequant_scalar(t, i);
    case DType::kI64: {  // deq_scale of an f16 model: the f32 bit pattern in the low 32 bits
      uint64_t v;
      std::memcpy(&v, p + i * 8, 8);
      const auto bits = static_cast<uint32_t>(v & 0xffffffffu);
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kI8: return static_cast<float>(static_cast<int8_t>(p[i]));
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p + i * 4, 4);
      return static_cast<float>(v);
    }
    default: return 0.0f;
  }
}

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// One quantized layer's tensors, found and checked against its type.
struct SlimLayer {
  std::string type;
  const TensorInfo* weight = nullptr;
  const TensorInfo* weight_scale = nullptr;
  const TensorInfo* weight_offset = nullptr;
  const TensorInfo* input_scale = nullptr;
  const TensorInfo* input_offset = nullptr;
  const TensorInfo* deq_scale = nullptr;
  const TensorInfo* quant_bias = nullptr;
  const TensorInfo* scale_second = nullptr;
  // rows counts every expert's: a fused [E, O, I] weight (and its [E, O, 1] scales) is the
  // [E · O, I] matrix of the experts' rows one after the other.
  int64_t experts = 1;
  int64_t rows = 0, cols = 0;
  bool packed_int4 = false;  // W4A8 weight [O/2, I] (fused: [E, O/2, I])
  int64_t group = 0;  // W4A8 legacy: inputs per second-stage scale
};

// name: "<module>.weight", or a fused expert tensor's name ("...mlp.experts.gate_up_proj": its
// weight "<name>.weight", or the tensor stored under that name itself). experts / rows (one
// expert's) / cols < 0: taken from the tensors (infera check).
SlimLayer resolve(const SlimDescription& d, const WeightStore& store, const std::string& name, int64_t experts,
                  int64_t rows, int64_t cols) {
  const std::string module = module_of(name);
  const std::string where = fmt::format("{}: layer '{}' ({})", d.file, module, d.type_of(name));
  SlimLayer l;
  l.type = d.type_of(name);
  if (!kRunTypes.contains(l.type)) {
    fail("{}: quantization type '{}' is not supported (Infera runs FLOAT, W8A8, W8A8_DYNAMIC and W4A8_DYNAMIC)", where,
         l.type);
  }
  auto get = [&](const char* suffix, bool required) -> const TensorInfo* {
    const std::string key = module + "." + suffix;
    const TensorInfo* t = store.find(key);
    if (t == nullptr) {
      if (required) fail("{}: tensor '{}' is missing", where, key);
      return nullptr;
    }
    const auto it = d.types.find(key);
    if (it != d.types.end() && it->second != l.type) {
      fail("{}: the description is inconsistent: '{}' is {}, but its weight is {}", d.file, key, it->second, l.type);
    }
    return t;
  };
  // n values per expert ([n] or [n, 1]; fused: the experts first, [E, n] or [E, n, 1]).
  auto numel_is = [&](const TensorInfo* t, int64_t n, const char* what) {
    if (!t) return;
    std::vector<int64_t> s = t->shape;
    const bool fused = l.experts > 1 && !s.empty() && s[0] == l.experts;
    if (fused) s.erase(s.begin());
    int64_t numel = 1;
    for (int64_t x : s) numel *= x;
    if ((l.experts > 1 && !fused) || numel != n || s.size() > 2 || (s.size() == 2 && s[1] != 1 && n != 1)) {
      const std::string e = l.experts > 1 ? fmt::format("{}, ", l.experts) : std::string();
      fail("{}: tensor '{}' has shape {}, expected {}", where, t->name, shape_string(t->shape),
           n == 1 && l.experts == 1 ? std::string("[1]") : fmt::format("[{}{}, 1] or [{}{}] ({})", e, n, e, n, what));
    }
  };
  // Every tensor of the module must be described with its weight's type.
  for (auto it = d.types.lower_bound(module + "."); it != d.types.end() && it->first.starts_with(module + "."); ++it) {
    const bool float_bias = it->first == module + ".bias" && it->second == "FLOAT";  // as msModelSlim tags it
    if (it->second != l.type && !float_bias && it->first.find('.', module.size() + 1) == std::string::npos) {
      fail("{}: the description is inconsistent: '{}' is {}, but '{}' is {}", d.file, it->first, it->second, name,
           l.type);
    }
  }
  // A fused expert tensor stored under its own name (the float layout's name) rather than
  // "<name>.weight".
  const bool bare = name == module && store.find(module + ".weight") == nullptr && store.find(name) != nullptr;
  l.weight = bare ? store.find(name) : get("weight", true);
  const size_t rank = l.weight->shape.size();
  if (l.weight->dtype != DType::kI8 || rank < 2 || rank > 3) {
    fail("{}: tensor '{}' has dtype {} and shape {}; {} stores an int8 weight, 2-D (or 3-D: fused experts)", where,
         l.weight->name, dtype_name(l.weight->dtype), shape_string(l.weight->shape), l.type);
  }
  l.experts = rank == 3 ? l.weight->shape[0] : 1;
  if (experts >= 0 && (experts > 1) != (rank == 3)) {
    fail("{}: tensor '{}' has shape {}; the model's config implies {}", where, l.weight->name,
         shape_string(l.weight->shape),
         experts > 1 ? fmt::format("{} experts fused [E, O, I]", experts) : std::string("one [O, I] matrix"));
  }
  if (experts > 1 && l.experts != experts) {
    fail("{}: tensor '{}' holds {} experts, the model's config {}", where, l.weight->name, l.experts, experts);
  }
  if (l.experts > 1 && l.type == "W8A8") {
    fail(
        "{}: static W8A8 experts stored fused are not supported (msModelSlim quantizes experts W8A8_DYNAMIC or "
        "W4A8_DYNAMIC)",
        where);
  }
  l.weight_scale = get("weight_scale", l.type != "W8A8");
  l.weight_offset = get("weight_offset", false);
  const int64_t stored_rows = l.experts * l.weight->shape[rank - 2];  // every expert's
  l.cols = l.weight->shape[rank - 1];
  if (l.type == "W4A8_DYNAMIC") {
    l.scale_second = get("weight_scale_second", false);
    l.packed_int4 = l.scale_second == nullptr || d.version == "1.0.0";
    l.rows = l.weight_scale->numel();
    if (l.packed_int4 && l.rows != 2 * stored_rows) {
      fail("{}: tensor '{}' has shape {}: int4 packed along the output needs [{}, {}] for the {} rows of weight_scale",
           where, l.weight->name, shape_string(l.weight->shape), l.rows / 2, l.cols, l.rows);
    }
    if (!l.packed_int4 && l.rows != stored_rows) {
      fail("{}: tensor '{}' has {} rows, weight_scale {}", where, l.weight->name, stored_rows, l.rows);
    }
    if (l.scale_second) {
      l.group = d.group_size > 0 ? d.group_size : 256;
      if (l.cols % l.group != 0) {
        fail("{}: group_size {} does not divide the layer's {} input features", d.file, l.group, l.cols);
      }
      const std::vector<int64_t> want = l.experts > 1
                                            ? std::vector<int64_t>{l.experts, l.rows / l.experts, l.cols / l.group}
                                            : std::vector<int64_t>{l.rows, l.cols / l.group};
      if (l.scale_second->shape != want) {
        fail("{}: tensor '{}' has shape {}, expected {} (group_size {})", where, l.scale_second->name,
             shape_string(l.scale_second->shape), shape_string(want), l.group);
      }
      if (const TensorInfo* off2 = get("weight_offset_second", false); off2 && off2->data) {
        for (int64_t i = 0; i < off2->numel(); ++i)
          if (value_at(*off2, i) != 0.0f)
            fail("{}: tensor '{}' holds non-zero offsets (not supported)", where, off2->name);
      }
    }
  } else {
    l.rows = stored_rows;
  }
  if (l.weight_scale && l.weight_scale->numel() != l.rows) {
    if (l.weight_scale->numel() > l.rows && l.weight_scale->numel() % l.rows == 0) {
      fail("{}: tensor '{}' has shape {}: per-group {} scales are not supported (per channel: [{}, 1])", where,
           l.weight_scale->name, shape_string(l.weight_scale->shape), l.type, l.rows);
    }
  }
  if (l.rows % l.experts != 0 || (l.packed_int4 && (l.rows / l.experts) % 2 != 0)) {
    fail("{}: tensor '{}' has shape {}: {} rows do not split into {} experts", where, l.weight->name,
         shape_string(l.weight->shape), l.rows, l.experts);
  }
  numel_is(l.weight_scale, l.rows / l.experts, "one scale per output");
  numel_is(l.weight_offset, l.rows / l.experts, "one offset per output");
  if (l.weight_scale && !is_float(l.weight_scale->dtype))
    fail("{}: tensor '{}' has dtype {}, expected a float", where, l.weight_scale->name,
         dtype_name(l.weight_scale->dtype));
  if (l.type == "W8A8") {
    l.input_scale = get("input_scale", true);
    l.input_offset = get("input_offset", true);
    l.deq_scale = get("deq_scale", true);
    l.quant_bias = get("quant_bias", true);
    numel_is(l.input_scale, 1, "");
    numel_is(l.input_offset, 1, "");
    numel_is(l.deq_scale, l.rows, "one per output");
    numel_is(l.quant_bias, l.rows, "one per output");
    if (!is_float(l.input_scale->dtype))
      fail("{}: tensor '{}' has dtype {}, expected a float", where, l.input_scale->name,
           dtype_name(l.input_scale->dtype));
    if (l.deq_scale->dtype != DType::kF32 && l.deq_scale->dtype != DType::kI64)
      fail("{}: tensor '{}' has dtype {}, expected f32 or i64", where, l.deq_scale->name,
           dtype_name(l.deq_scale->dtype));
    if (l.quant_bias->dtype != DType::kI32)
      fail("{}: tensor '{}' has dtype {}, expected i32", where, l.quant_bias->name, dtype_name(l.quant_bias->dtype));
    if (l.input_scale->data && !(value_at(*l.input_scale, 0) > 0.0f))
      fail("{}: tensor '{}' is {}, not a positive scale", where, l.input_scale->name, value_at(*l.input_scale, 0));
  }
  if ((rows >= 0 && rows * l.experts != l.rows) || (cols >= 0 && cols != l.cols)) {
    fail("{}: the layer is [{}, {}], the model's config implies [{}, {}]", where, l.rows / l.experts, l.cols, rows,
         cols);
  }
  return l;
}

// Dequantized-per-channel scale of row n (W8A8 static: deq_scale / input_scale).
float row_scale(const SlimLayer& l, int64_t n) {
  if (l.type == "W8A8") return value_at(*l.deq_scale, n) / value_at(*l.input_scale, 0);
  return value_at(*l.weight_scale, n);
}

std::vector<int8_t> int4_values(const SlimLayer& l) {
  const auto* w = reinterpret_cast<const int8_t*>(l.weight->data);
  if (l.packed_int4) return unpack_slim_int4(w, l.rows, l.cols);
  std::vector<int8_t> v(w, w + l.rows * l.cols);
  for (int8_t x : v)
    if (x < -8 || x > 7) fail("{}: tensor '{}' holds {}, outside int4", l.weight->file, l.weight->name, int{x});
  return v;
}

}  // namespace

std::string SlimDescription::type_of(const std::string& weight_name) const {
  auto it = types.find(weight_name);
  if (it == types.end() && !weight_name.ends_with(".weight")) it = types.find(weight_name + ".weight");
  return it == types.end() ? std::string() : it->second;
}

bool SlimDescription::is_weight(const std::string& key) const {
  return key.ends_with(".weight") || types.contains(key + ".weight_scale");
}

bool has_slim_description(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(dir) / kSlimDescriptionFile, ec);
}

SlimDescription read_slim_description(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kSlimDescriptionFile).string();
  return parse_slim_description(read_json_file(path), path);
}

SlimDescription parse_slim_description(const json& j, const std::string& file) {
  if (!j.is_object()) fail("{}: expected a JSON object of tensor name -> quantization type", file);
  SlimDescription d;
  d.file = file;
  for (const auto& [key, value] : j.items()) {
    if (kReserved.contains(key)) {
      if (key == "version" && value.is_string()) d.version = value.get<std::string>();
      if (key == "model_quant_type" && value.is_string()) d.model_quant_type = value.get<std::string>();
      if (key == "group_size") {
        if (!value.is_number_integer() || value.get<int64_t>() < 0)
          fail("{}: group_size must be a non-negative integer", file);
        d.group_size = value.get<int64_t>();
      }
      continue;
    }
    if (!value.is_string()) fail("{}: '{}' must name a quantization type (a string)", file, key);
    const std::string type = value.get<std::string>();
    if (!kKnownTypes.contains(type)) fail("{}: '{}' has the unknown quantization type '{}'", file, key, type);
    d.types[key] = type;
  }
  return d;
}

std::vector<int8_t> unpack_slim_int4(const int8_t* packed, int64_t rows, int64_t cols) {
  std::vector<int8_t> v(static_cast<size_t>(rows * cols));
  auto sext = [](int nib) { return static_cast<int8_t>(nib >= 8 ? nib - 16 : nib); };
  for (int64_t j = 0; j < rows / 2; ++j)
    for (int64_t k = 0; k < cols; ++k) {
      const auto b = static_cast<uint8_t>(packed[j * cols + k]);
      v[(2 * j) * cols + k] = sext(b & 0xf);
      v[(2 * j + 1) * cols + k] = sext(b >> 4);
    }
  return v;
}

std::vector<std::string> check_slim(const SlimDescription& d, const WeightStore& store) {
  std::vector<std::string> problems;
  for (const auto& [name, type] : d.types) {
    if (store.find(name) == nullptr) {
      problems.push_back(
          fmt::format("{}: describes tensor '{}' ({}), which the weights do not store", d.file, name, type));
    }
  }
  for (const std::string& name : store.names()) {
    const TensorInfo& t = store.get(name);
    if (!d.types.contains(name) && !is_float(t.dtype)) {
      problems.push_back(fmt::format("{}: {} tensor '{}' is not in the description (its type is unknown)", d.file,
                                     dtype_name(t.dtype), name));
    }
  }
  for (const auto& [name, type] : d.types) {
    if (!d.is_weight(name) || type == "FLOAT" || store.find(name) == nullptr) continue;
    try {
      resolve(d, store, name, -1, -1, -1);
    } catch (const Error& e) {
      problems.emplace_back(e.what());
    }
  }
  return problems;
}

namespace {

// Rows [r0, r1) of the weights the layer computes with, f32.
void dequantize_layer_rows(const SlimLayer& l, int64_t r0, int64_t r1, float* out) {
  const int64_t cols = l.cols;
  if (l.type == "W4A8_DYNAMIC") {
    const std::vector<int8_t> v = int4_values(l);
    for (int64_t n = r0; n < r1; ++n)
      for (int64_t k = 0; k < cols; ++k) {
        const float s2 = l.scale_second ? value_at(*l.scale_second, n * (cols / l.group) + k / l.group) : 1.0f;
        out[(n - r0) * cols + k] = static_cast<float>(v[n * cols + k]) * (s2 * row_scale(l, n));
      }
    return;
  }
  const auto* w = reinterpret_cast<const int8_t*>(l.weight->data);
  for (int64_t n = r0; n < r1; ++n) {
    const float s = row_scale(l, n);
    const float off = l.type == "W8A8_DYNAMIC" && l.weight_offset ? value_at(*l.weight_offset, n) : 0.0f;
    for (int64_t k = 0; k < cols; ++k) out[(n - r0) * cols + k] = (static_cast<float>(w[n * cols + k]) - off) * s;
  }
}

class SlimFormat final : public PrequantFormat {
 public:
  explicit SlimFormat(const PrequantFiles& files)
      : d_(parse_slim_description(files.description, files.dir + "/" + kSlimDescriptionFile)) {}

  std::string method() const override { return "msmodelslim"; }
  std::string summary() const override {
    return fmt::format("msModelSlim {} (description version {})",
                       d_.model_quant_type.empty() ? std::string("mixed") : d_.model_quant_type,
                       d_.version.empty() ? std::string("0") : d_.version);
  }
  bool quantizes(const WeightStore&, const std::string& name) const override {
    const std::string t = d_.type_of(name);
    return !t.empty() && t != "FLOAT";
  }
  // A fused expert tensor ("...mlp.experts.gate_up_proj") is stored as "<name>.weight" or as
  // the name itself.
  bool stores(const WeightStore& store, const std::string& name) const override {
    return store.find(name) != nullptr || (!name.ends_with(".weight") && store.find(name + ".weight") != nullptr);
  }
  bool is_auxiliary(const std::string& tensor) const override {
    for (const char* s : {".scale_bias", ".weight_offset", ".weight_offset_second", ".input_offset"})
      if (tensor.ends_with(s)) return true;
    return false;
  }

  StoredLinear locate(const WeightStore& store, const std::string& name, int64_t experts, int64_t rows,
                      int64_t cols) const override {
    check_description(store);
    auto l = std::make_shared<SlimLayer>(resolve(d_, store, name, experts, rows, cols));
    StoredLinear w;
    w.name = name;
    w.kind = PrequantKind::kInt;
    w.bits = l->type == "W4A8_DYNAMIC" ? 4 : 8;
    w.experts = l->experts;
    w.rows = rows;
    w.cols = cols;
    w.group_size = l->scale_second ? l->group : cols;
    w.symmetric = true;
    w.quantized_activations = true;
    w.label = "msmodelslim " + l->type;
    for (const auto& [role, t] :
         {std::pair{"weight", l->weight}, std::pair{"weight_scale", l->weight_scale},
          std::pair{"weight_offset", l->weight_offset}, std::pair{"input_scale", l->input_scale},
          std::pair{"input_offset", l->input_offset}, std::pair{"deq_scale", l->deq_scale},
          std::pair{"quant_bias", l->quant_bias}, std::pair{"weight_scale_second", l->scale_second}}) {
      if (t) w.parts[role] = t;
    }
    w.state = l;
    return w;
  }

  void int_rows(const StoredLinear& w, int64_t r0, int64_t r1, IntRows& out) const override {
    const SlimLayer& l = layer(w);
    out.resize(r1 - r0, w.cols, w.group_size, true);
    const int64_t groups = w.cols / w.group_size;
    const std::vector<int8_t> v4 = l.type == "W4A8_DYNAMIC" ? int4_values(l) : std::vector<int8_t>{};
    const auto* w8 = reinterpret_cast<const int8_t*>(l.weight->data);
    for (int64_t n = r0; n < r1; ++n) {
      if (l.type == "W8A8_DYNAMIC" && l.weight_offset && value_at(*l.weight_offset, n) != 0.0f)
        fail("'{}': weight_offset of row {} is not zero (no integer form)", w.name, n);
      for (int64_t k = 0; k < w.cols; ++k)
        out.q[(n - r0) * w.cols + k] = v4.empty() ? w8[n * w.cols + k] : v4[n * w.cols + k];
      for (int64_t g = 0; g < groups; ++g) {
        const float s2 = l.scale_second ? value_at(*l.scale_second, n * groups + g) : 1.0f;
        out.scale[(n - r0) * groups + g] = s2 * row_scale(l, n);
      }
    }
  }

  void dequantize_rows(const StoredLinear& w, int64_t r0, int64_t r1, float* out) const override {
    dequantize_layer_rows(layer(w), r0, r1, out);
  }

  bool bind_in_place(const StoredLinear& w, kernels::QuantScheme scheme, kernels::QuantMatRef& out,
                     std::vector<std::shared_ptr<void>>& owned) const override {
    const SlimLayer& l = layer(w);
    const int64_t rows = w.total_rows(), cols = w.cols;
    if (l.type == "W4A8_DYNAMIC") {
      if (!kernels::scheme_is_int4(scheme)) return false;
      const int64_t gs = cols % 128 == 0 && (!l.scale_second || l.group % 128 == 0) ? 128
                         : cols % 64 == 0 && (!l.scale_second || l.group % 64 == 0) ? 64
                         : cols % 32 == 0 && (!l.scale_second || l.group % 32 == 0) ? 32
                                                                                    : 0;
      if (gs == 0) return false;
      const std::vector<int8_t> v = int4_values(l);
      auto q = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols / 2), 0);
      auto s = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(rows * (cols / gs)));
      for (int64_t n = 0; n < rows; ++n) {
        uint8_t* row = q->data() + n * (cols / 2);
        for (int64_t j = 0; j < cols; ++j) {
          const auto nib = static_cast<uint8_t>(v[n * cols + j] + 8);
          const int64_t run = j / 32 * 32, jj = j % 32;
          row[run / 2 + jj % 16] |= jj < 16 ? nib : static_cast<uint8_t>(nib << 4);
        }
        for (int64_t g = 0; g < cols / gs; ++g) {
          const float s2 = l.scale_second ? value_at(*l.scale_second, n * (cols / l.group) + g * gs / l.group) : 1.0f;
          (*s)[n * (cols / gs) + g] = f32_to_f16(s2 * row_scale(l, n));  // relative error <= 2^-11
        }
      }
      out = kernels::QuantMatRef(scheme, rows, cols, gs, q->data(), s->data());
      owned.push_back(std::move(q));
      owned.push_back(std::move(s));
      return true;
    }
    if (scheme != kernels::QuantScheme::kW8A8) return false;
    // The stored int8 bytes as they are; scales converted to f32 per row.
    auto s = std::make_shared<std::vector<float>>(static_cast<size_t>(rows));
    for (int64_t n = 0; n < rows; ++n) (*s)[n] = row_scale(l, n);
    out = kernels::QuantMatRef(kernels::QuantScheme::kW8A8, rows, cols, cols, l.weight->data, s->data());
    owned.push_back(std::move(s));
    auto extras = std::make_shared<kernels::QuantExtras>();
    bool need = false;
    if (l.type == "W8A8") {
      need = true;
      extras->static_act = true;
      extras->in_scale = value_at(*l.input_scale, 0);
      extras->in_offset = std::nearbyint(value_at(*l.input_offset, 0));
      extras->out_scale.resize(static_cast<size_t>(rows));
      extras->qbias.resize(static_cast<size_t>(rows));
      for (int64_t n = 0; n < rows; ++n) {
        extras->out_scale[n] = value_at(*l.deq_scale, n);
        int32_t b;
        std::memcpy(&b, l.quant_bias->data + n * 4, 4);
        extras->qbias[n] = b;
      }
    } else if (l.weight_offset) {
      // W = (w − offset)·scale: the offset's part is −offset·scale·Σx, one group of all inputs.
      std::vector<float> corr(static_cast<size_t>(rows));
      for (int64_t n = 0; n < rows; ++n) {
        corr[n] = -value_at(*l.weight_offset, n) * row_scale(l, n);
        need = need || corr[n] != 0.0f;
      }
      extras->corr_group = cols;
      extras->corr = std::move(corr);
    }
    if (need) out.extras = std::move(extras);
    kernels::check_quant_matrix(out);
    return true;
  }

 private:
  static const SlimLayer& layer(const StoredLinear& w) { return *static_cast<const SlimLayer*>(w.state.get()); }

  // The description against the tensors, once per checkpoint: every problem in one error.
  void check_description(const WeightStore& store) const {
    std::call_once(checked_, [&] { problems_ = check_slim(d_, store); });
    if (problems_.empty()) return;
    std::string all;
    for (size_t i = 0; i < problems_.size() && i < 5; ++i) all += "\n  " + problems_[i];
    if (problems_.size() > 5) all += fmt::format("\n  ... and {} more", problems_.size() - 5);
    fail("{}: the msModelSlim checkpoint is inconsistent ({} problem{}; `infera check` lists them):{}", store.dir(),
         problems_.size(), problems_.size() == 1 ? "" : "s", all);
  }

  SlimDescription d_;
  mutable std::once_flag checked_;
  mutable std::vector<std::string> problems_;
};

}  // namespace

std::vector<float> dequantize_slim(const WeightStore& store, const std::string& name, int64_t rows, int64_t cols,
                                   const SlimDescription& d) {
  const SlimLayer l = resolve(d, store, name, 1, rows, cols);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  dequantize_layer_rows(l, 0, rows, out.data());
  return out;
}

}  // namespace infera::prequant

namespace infera {

std::unique_ptr<PrequantFormat> make_modelslim_format(const PrequantFiles& files) {
  return std::make_unique<prequant::SlimFormat>(files);
}

}  // namespace infera
