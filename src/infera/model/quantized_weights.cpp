#include "infera/model/quantized_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/mmap.h"
#include "infera/base/options.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/model/weights.h"

namespace infera {

using kernels::QuantScheme;
using json = nlohmann::json;

std::string LayerQuant::label() const {
  if (dense) return dense_type.empty() ? "dense" : dense_type;
  std::string s(kernels::scheme_name(scheme));
  if (kernels::scheme_is_int4(scheme)) s += " g" + std::to_string(group_size);
  return s;
}

LayerQuant QuantizationConfig::layer(const std::string& name) const {
  auto it = overrides.find(name);
  if (it != overrides.end()) return it->second;
  LayerQuant q;
  if (!present) return q;
  q.dense = false;
  q.scheme = scheme;
  q.group_size = group_size;
  return q;
}

QuantScheme parse_quant_scheme(const std::string& text, const std::string& where) {
  if (text == "w8a8") return QuantScheme::kW8A8;
  if (text == "w4a8") return QuantScheme::kW4A8;
  if (text == "w4a16") return QuantScheme::kW4A16;
  fail("{}: unknown quantization scheme '{}' (supported: w8a8, w4a8, w4a16)", where, text);
}

namespace {

void check_group(QuantScheme s, int64_t g, const std::string& where) {
  if (kernels::scheme_is_int4(s)) {
    if (g != 32 && g != 64 && g != 128)
      fail("{}: group_size {} is not supported for {} (use 32, 64 or 128)", where, g, kernels::scheme_name(s));
  } else if (g != 0) {
    fail("{}: w8a8 is quantized per output channel; group_size must be 0, got {}", where, g);
  }
}

LayerQuant parse_layer(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("scheme") || !j["scheme"].is_string()) {
    fail("{}: each override must be an object with a string 'scheme'", where);
  }
  LayerQuant q;
  const std::string s = j["scheme"].get<std::string>();
  if (s == "bf16" || s == "f32" || s == "f16") {
    q.dense = true;
    q.dense_type = s;
  } else {
    q.dense = false;
    q.scheme = parse_quant_scheme(s, where);
    q.group_size = j.value("group_size", int64_t{0});
    check_group(q.scheme, q.group_size, where);
  }
  if (j.contains("reason") && j["reason"].is_string()) q.reason = j["reason"].get<std::string>();
  return q;
}

}  // namespace

QuantizationConfig parse_quantization_config(const json& j, const std::string& where) {
  const std::string w = where + ": quantization_config";
  if (!j.is_object()) fail("{} must be an object", w);
  QuantizationConfig qc;
  qc.present = true;
  const std::string method = j.value("quant_method", std::string());
  if (method != "infera") {
    fail(
        "{}: quant_method '{}' is not supported (Infera reads only checkpoints written by `infera quantize`, "
        "quant_method \"infera\"; dequantize or re-quantize the original model)",
        w, method);
  }
  if (j.value("format_version", 0) != 1)
    fail("{}: format_version {} is not supported (expected 1)", w, j.value("format_version", 0));
  if (!j.contains("scheme") || !j["scheme"].is_string()) fail("{}: field 'scheme' is missing", w);
  qc.scheme = parse_quant_scheme(j["scheme"].get<std::string>(), w);
  qc.group_size = j.value("group_size", int64_t{0});
  check_group(qc.scheme, qc.group_size, w);
  if (j.contains("overrides")) {
    if (!j["overrides"].is_object()) fail("{}: 'overrides' must be an object", w);
    for (const auto& [name, v] : j["overrides"].items()) qc.overrides[name] = parse_layer(v, w + ".overrides." + name);
  }
  if (j.contains("calibration")) qc.calibration_json = j["calibration"].dump();
  return qc;
}

void quantization_config_to_json(const QuantizationConfig& qc, json& out) {
  out = json::object();
  out["quant_method"] = "infera";
  out["format_version"] = 1;
  out["scheme"] = std::string(kernels::scheme_name(qc.scheme));
  out["group_size"] = qc.group_size;
  json ov = json::object();
  for (const auto& [name, q] : qc.overrides) {
    json e = json::object();
    e["scheme"] = q.dense ? q.dense_type : std::string(kernels::scheme_name(q.scheme));
    if (!q.dense) e["group_size"] = q.group_size;
    if (!q.reason.empty()) e["reason"] = q.reason;
    ov[name] = e;
  }
  out["overrides"] = ov;
  out["calibration"] = json::parse(qc.calibration_json);
}

QuantizationConfig read_quantization_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  const std::optional<json> config = read_json_file_if_present(path, "cannot read the model's config");
  if (!config) return {};
  const json& j = *config;
  if (!j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return {};
  return parse_quantization_config(j["quantization_config"], path);
}

bool quant_repack_enabled() {
  static const bool enabled = option_env_on("quant_repack");  // INFERA_QUANT_REPACK
  return enabled;
}

FileMappings FileMappings::current() {
  FileMappings m;
  m.ranges_ = mapped_file_ranges();
  m.copies_ = copied_file_ranges();
  return m;
}

std::pair<uintptr_t, uintptr_t> FileMappings::range_of(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(a, UINTPTR_MAX));
  if (it == ranges_.begin() || a >= (it - 1)->second) return {0, 0};
  return *(it - 1);
}

bool FileMappings::contains(const void* p, size_t n) const {
  const auto [begin, end] = range_of(p);
  return begin != 0 && reinterpret_cast<uintptr_t>(p) + n <= end;
}

bool FileMappings::in_copy(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(copies_.begin(), copies_.end(), std::make_pair(a, UINTPTR_MAX));
  return it != copies_.begin() && a + n <= (it - 1)->second;
}

void release_file_pages(const void* p, size_t n, const FileMappings& maps) {
  if (n == 0) return;
  if (maps.in_copy(p, n)) {
    map_back_file_pages(p, n);
    return;
  }
  if (!maps.contains(p, n)) return;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (a + page - 1) / page * page, end = (a + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void release_repacked_source(const kernels::QuantMatRef& w, const FileMappings& maps) {
  if (!w.packed) return;
  const bool int4 = kernels::scheme_is_int4(w.scheme);
  const int64_t qbytes = w.rows * (int4 ? w.cols / 2 : w.cols);
  const int64_t sbytes = w.rows * (int4 ? w.groups_per_row() * 2 : 4);
  release_file_pages(w.qweight, static_cast<size_t>(qbytes), maps);
  release_file_pages(w.scales, static_cast<size_t>(sbytes), maps);
}

bool takes_panels(const kernels::MatRef& m) {
  return m.dtype == DType::kGgml && kernels::ggml::can_pack_panels(m.ggml_type) && quant_repack_enabled() &&
         best_isa() != Isa::kScalar && m.rows > 0;
}

kernels::MatRef with_panels(kernels::MatRef m, const std::shared_ptr<LaneBuffer>& lanes) {
  if (!takes_panels(m)) return m;
  m.set_panels(kernels::ggml::pack_panels(m.ggml_type, m.data, m.rows, m.cols, lanes));
  release_file_pages(m.data, static_cast<size_t>(m.rows * kernels::row_bytes(m)), FileMappings::current());
  return m;
}

QuantTensors find_quant_tensors(const WeightStore& store, const std::string& name, const LayerQuant& lq, int64_t cols) {
  const std::string qname = name + ".qweight", sname = name + ".scales";
  QuantTensors t;
  t.qweight = store.find(qname);
  t.scales = store.find(sname);
  if (!t.qweight || !t.scales) {
    fail(
        "{}: config.json says '{}' is stored as {}, but tensor '{}' is missing (an incomplete or foreign "
        "checkpoint: re-run `infera quantize`)",
        store.dir(), name, lq.label(), t.qweight ? sname : qname);
  }
  const bool int4 = kernels::scheme_is_int4(lq.scheme);
  t.group_size = int4 ? lq.group_size : cols;
  if (int4 && cols % t.group_size != 0) {
    fail("{}: '{}' has {} columns, not a multiple of its group size {} (config.json and the tensors disagree)",
         store.dir(), name, cols, t.group_size);
  }
  t.qweight_cols = int4 ? cols / 2 : cols;
  t.scale_cols = cols / t.group_size;
  const DType qdt = int4 ? DType::kU8 : DType::kI8;
  const DType sdt = int4 ? DType::kF16 : DType::kF32;
  if (t.qweight->dtype != qdt)
    fail("{}: tensor '{}' has dtype {}, expected {} for {}", store.dir(), qname, dtype_name(t.qweight->dtype),
         dtype_name(qdt), lq.label());
  if (t.scales->dtype != sdt)
    fail("{}: tensor '{}' has dtype {}, expected {} for {}", store.dir(), sname, dtype_name(t.scales->dtype),
         dtype_name(sdt), lq.label());
  return t;
}

std::shared_ptr<LaneBuffer> panel_lanes_for(const WeightStore& store) {
  if (!kernels::ggml::panel_lanes_enabled() || !quant_repack_enabled() || best_isa() == Isa::kScalar) return nullptr;
  size_t bytes = 0;
  for (const std::string& name : store.names()) {
    const TensorInfo* t = store.find(name);
    if (t && t->dtype == DType::kGgml && kernels::ggml::can_pack_panels(t->ggml_type)) bytes += t->nbytes;
  }
  if (bytes == 0) return nullptr;
  // A lane takes a quarter of each matrix's panels, its last group of four rounded up: half of
  // them all leaves ample room (only what is written is committed).
  try {
    return std::make_shared<LaneBuffer>(bytes / 2 + (size_t{64} << 20));
  } catch (const Error&) {
    return nullptr;
  }
}

kernels::LinearWeight bind_linear(const WeightStore& store, const std::string& name, int64_t rows, int64_t cols,
                                  const QuantizationConfig& qc, const std::shared_ptr<LaneBuffer>& lanes, bool panels) {
  const LayerQuant lq = qc.layer(name);
  if (lq.dense) {
    const TensorInfo& t = store.get(name, {rows, cols});
    return kernels::dense_linear(panels ? with_panels(as_matrix(t), lanes) : as_matrix(t), t.name);
  }
  const QuantTensors qt = find_quant_tensors(store, name, lq, cols);
  const TensorInfo* qw = qt.qweight;
  const TensorInfo* sc = qt.scales;
  const int64_t gs = qt.group_size;
  check_shape(*qw, {rows, qt.qweight_cols}, store.dir() + "/" + qw->file);
  check_shape(*sc, {rows, qt.scale_cols}, store.dir() + "/" + sc->file);
  kernels::LinearWeight w;
  w.quantized = true;
  w.name = qw->name;  // stable storage; the ".qweight" suffix marks it as quantized in logs
  w.quant.scheme = lq.scheme;
  w.quant.rows = rows;
  w.quant.cols = cols;
  w.quant.group_size = gs;
  w.quant.qweight = qw->data;
  w.quant.scales = sc->data;
  kernels::check_quant_matrix(w.quant);
  if (quant_repack_enabled()) {
    w.quant.packed = kernels::pack_quant_matrix(w.quant);
    if (w.quant.packed) release_repacked_source(w.quant, FileMappings::current());
  }
  return w;
}

std::vector<kernels::LinearWeight> bind_experts(const WeightStore& store, const std::string& name, int64_t E,
                                                int64_t rows, int64_t cols, const QuantizationConfig& qc, bool fused,
                                                const FileMappings& maps, const std::shared_ptr<LaneBuffer>& lanes,
                                                bool panels) {
  INFERA_ASSERT(fused || E == 1);
  std::vector<kernels::LinearWeight> out(static_cast<size_t>(E));
  auto shape = [&](int64_t c) { return fused ? std::vector<int64_t>{E, rows, c} : std::vector<int64_t>{rows, c}; };
  auto check = [&](const TensorInfo& t, int64_t c) {
    if (t.shape != shape(c)) {
      fail("{}: tensor '{}' has shape {}, expected {} (config.json and the weights disagree)",
           store.dir() + "/" + t.file, t.name, fmt::format("[{}]", fmt::join(t.shape, ", ")),
           fmt::format("[{}]", fmt::join(shape(c), ", ")));
    }
  };
  const LayerQuant lq = qc.layer(name);
  if (lq.dense) {
    const TensorInfo& t = store.get(name);
    check(t, cols);
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kGgml) {
      fail("{}: tensor '{}' has dtype {}; expert weights must be f32, bf16 or f16", t.file, t.name,
           dtype_name(t.dtype));
    }
    const kernels::MatRef stored{t.data, t.dtype, E * rows, cols, t.ggml_type};
    const kernels::MatRef all = panels ? with_panels(stored, lanes) : stored;  // GGUF types too
    for (int64_t e = 0; e < E; ++e)
      out[e] = kernels::dense_linear(kernels::row_slice(all, e * rows, (e + 1) * rows), t.name);
    return out;
  }
  const QuantTensors qt = find_quant_tensors(store, name, lq, cols);
  const TensorInfo* qw = qt.qweight;
  const TensorInfo* sc = qt.scales;
  const int64_t gs = qt.group_size;
  check(*qw, qt.qweight_cols);
  check(*sc, qt.scale_cols);
  kernels::QuantMatRef all(lq.scheme, E * rows, cols, gs, qw->data, sc->data);  // [E * rows, cols]
  kernels::check_quant_matrix(all);
  if (quant_repack_enabled()) {
    all.packed = kernels::pack_quant_matrix(all);
    release_repacked_source(all, maps);
  }
  for (int64_t e = 0; e < E; ++e) {
    kernels::LinearWeight& w = out[e];
    w.quantized = true;
    w.name = qw->name;
    w.quant = kernels::quant_row_slice(all, e * rows, (e + 1) * rows);
  }
  return out;
}

void linear_row(const kernels::LinearWeight& table, int64_t row, float* out) {
  if (table.quantized) {
    kernels::dequantize_row(table.quant, row, out);
    return;
  }
  const kernels::MatRef& m = table.dense;
  const auto* p = static_cast<const uint8_t*>(m.data) + row * kernels::row_bytes(m);
  if (m.dtype == DType::kGgml) {
    kernels::ggml::dequantize_row(m.ggml_type, p, out, m.cols);
    return;
  }
  to_f32(p, m.dtype, m.cols, out);
}

}  // namespace infera
