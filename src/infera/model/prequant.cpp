#include "infera/model/prequant.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/log.h"
#include "infera/base/options.h"
#include "infera/base/threads.h"
#include "infera/model/prequant_formats.h"
#include "infera/model/quantized_weights.h"

namespace infera {

using kernels::QuantScheme;
using json = nlohmann::json;

// ---- StoredLinear, IntRows, format defaults ----

int64_t StoredLinear::stored_bytes() const {
  int64_t n = 0;
  for (const auto& [role, t] : parts) n += static_cast<int64_t>(t->nbytes);
  return n;
}

const TensorInfo& StoredLinear::part(const std::string& role) const {
  auto it = parts.find(role);
  if (it == parts.end() || it->second == nullptr) fail("'{}' ({}): no stored '{}' tensor", name, label, role);
  return *it->second;
}

void IntRows::resize(int64_t rows_, int64_t cols_, int64_t group_size_, bool symmetric) {
  rows = rows_;
  cols = cols_;
  group_size = group_size_;
  const int64_t groups = group_size > 0 ? cols / group_size : 0;
  q.assign(static_cast<size_t>(rows * cols), 0);
  scale.assign(static_cast<size_t>(rows * groups), 0.0f);
  if (symmetric)
    zero.clear();
  else
    zero.assign(static_cast<size_t>(rows * groups), 0);
}

void PrequantFormat::int_rows(const StoredLinear& w, int64_t, int64_t, IntRows&) const {
  fail("'{}' ({}): the {} format has no integer form", w.name, w.label, method());
}

void PrequantFormat::dequantize_rows(const StoredLinear& w, int64_t r0, int64_t r1, float* out) const {
  IntRows ir;
  int_rows(w, r0, r1, ir);
  const int64_t g = ir.group_size, groups = w.cols / g;
  for (int64_t r = 0; r < r1 - r0; ++r) {
    for (int64_t c = 0; c < w.cols; ++c) {
      const int64_t gi = r * groups + c / g;
      const int zero = ir.zero.empty() ? 0 : ir.zero[gi];
      out[r * w.cols + c] = ir.scale[gi] * static_cast<float>(ir.q[r * w.cols + c] - zero);
    }
  }
}

void PrequantFormat::fp8_scales(const StoredLinear& w, float*) const {
  fail("'{}' ({}): the {} format has no FP8 scales", w.name, w.label, method());
}

bool PrequantFormat::bind_in_place(const StoredLinear&, QuantScheme, kernels::QuantMatRef&,
                                   std::vector<std::shared_ptr<void>>&) const {
  return false;
}

bool PrequantFormat::stores(const WeightStore& store, const std::string& name) const {
  if (store.find(name)) return true;
  const std::string m = prequant_module(name);
  return !m.empty() && (store.find(m + ".qweight") || store.find(m + ".weight_packed"));
}

// ---- Helpers ----

void prequant_fail(const WeightStore& store, const std::string& tensor, const std::string& what) {
  fail("{}: tensor '{}' {}", store.dir(), tensor, what);
}

const TensorInfo& prequant_need(const WeightStore& store, const std::string& name, const std::string& why) {
  const TensorInfo* t = store.find(name);
  if (t == nullptr) prequant_fail(store, name, "is missing (" + why + ")");
  return *t;
}

void prequant_expect(const WeightStore& store, const TensorInfo& t, std::initializer_list<DType> dtypes,
                     const std::vector<int64_t>& shape) {
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    std::string want;
    for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    prequant_fail(store, t.name, fmt::format("has dtype {}, expected {}", dtype_name(t.dtype), want));
  }
  if (t.shape != shape) {
    prequant_fail(store, t.name, fmt::format("has shape {}, expected {}", shape_string(t.shape), shape_string(shape)));
  }
}

float prequant_scalar(const TensorInfo& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, t.data + i * 4, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.data + i * 2, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.data + i * 2, 2);
      return f16_to_f32(h);
    }
    default: fail("tensor '{}': dtype {} is not a float scale", t.name, dtype_name(t.dtype));
  }
}

std::string prequant_module(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() <= kSuffix.size() || !weight_name.ends_with(kSuffix)) return {};
  return weight_name.substr(0, weight_name.size() - kSuffix.size());
}

float fp8_e4m3_to_f32(uint8_t v) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) {
      const int sign = i >> 7, exp = (i >> 3) & 0xf, mant = i & 7;
      float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)  // subnormal: mant/8 * 2^-6
                           : std::ldexp(static_cast<float>(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp-7)
      if (exp == 0xf && mant == 7) mag = std::nanf("");
      t[static_cast<size_t>(i)] = sign ? -mag : mag;
    }
    return t;
  }();
  return table[v];
}

// ---- Detection ----

namespace {

struct FormatEntry {
  const char* method;  // quantization_config.quant_method
  std::unique_ptr<PrequantFormat> (*make)(const PrequantFiles&);
};

// One row per format; a format whose detection is not by quant_method (a description file)
// is tried in detect_prequant below.
const std::vector<FormatEntry> kFormats = {
    {"fp8", make_fp8_format},
    {"compressed-tensors", make_compressed_tensors_format},
    {"gptq", make_gptq_format},
    {"awq", make_gptq_format},
};

// The JSON in `path`; null where there is no such file.
json read_json_if_present(const std::filesystem::path& path) {
  return read_json_file_if_present(path.string()).value_or(json());
}

}  // namespace

std::unique_ptr<PrequantFormat> detect_prequant(const std::string& dir) {
  PrequantFiles files;
  files.dir = dir;
  const std::filesystem::path d(dir);
  const json config = read_json_if_present(d / "config.json");
  if (config.is_object()) {
    if (auto it = config.find("quantization_config"); it != config.end()) files.quantization_config = *it;
  }
  files.description = read_json_if_present(d / "quant_model_description.json");
  return detect_prequant(files);
}

std::unique_ptr<PrequantFormat> detect_prequant(const PrequantFiles& files) {
  const json& qc = files.quantization_config;
  if (!qc.is_object()) {
    // msModelSlim deletes quantization_config and describes every tensor in its own file.
    if (files.description.is_object()) return make_modelslim_format(files);
    return nullptr;  // a float checkpoint
  }
  const std::string method = qc.value("quant_method", std::string());
  if (method == "infera") return nullptr;  // `infera quantize`'s own format (model/quantized_weights.h)
  for (const FormatEntry& f : kFormats) {
    if (method == f.method) return f.make(files);
  }
  std::string known;
  for (const FormatEntry& f : kFormats) known += std::string(known.empty() ? "" : ", ") + f.method;
  fail(
      "{}/config.json: quantization_config.quant_method '{}' is not supported (Infera loads 'infera' from `infera "
      "quantize` and the published formats {})",
      files.dir, method, known);
}

// ---- Native plans and conversion ----

PrequantTarget prequant_target_from_options() {
  const std::string s = option_env("prequant_scheme");
  if (s.empty() || s == "auto") return PrequantTarget::kAuto;
  if (s == "w8a8") return PrequantTarget::kW8A8;
  if (s == "w4a8") return PrequantTarget::kW4A8;
  if (s == "w4a16") return PrequantTarget::kW4A16;
  fail("INFERA_PREQUANT_SCHEME '{}' is not one of auto, w8a8, w4a8, w4a16", s);
}

Fp8Mode prequant_fp8_from_options() {
  const std::string s = option_env("prequant_fp8");
  if (s.empty() || s == "auto") return Fp8Mode::kAuto;
  if (s == "w8a8") return Fp8Mode::kW8A8;
  if (s == "w8a16") return Fp8Mode::kW8A16;
  fail("INFERA_PREQUANT_FP8 '{}' is not one of auto, w8a8, w8a16", s);
}

namespace {

// The largest native int4 group (128, 64, 32) dividing n; 0 when none does.
int64_t native_int4_group(int64_t n) {
  for (int64_t g : {128, 64, 32}) {
    if (n > 0 && n % g == 0) return g;
  }
  return 0;
}

}  // namespace

NativePlan plan_native(const StoredLinear& w, PrequantTarget target, Fp8Mode fp8) {
  NativePlan p;
  const bool is_int = w.kind == PrequantKind::kInt;
  if (w.fp8_group > 0 && (target == PrequantTarget::kAuto || target == PrequantTarget::kW8A8)) {
    if (fp8 == Fp8Mode::kAuto) fp8 = target == PrequantTarget::kAuto ? kFp8AutoMode : Fp8Mode::kW8A8;
    if (fp8 == Fp8Mode::kW8A16) {
      p.scheme = QuantScheme::kW8A8;
      p.group_size = w.cols;
      p.exact = true;
      p.fp8 = true;
      return p;
    }
  }
  if (target == PrequantTarget::kAuto) {
    // int4 needs input features in whole 32-blocks; otherwise W8A8 (exact for per-channel int4).
    target = !is_int || w.bits > 4 || w.cols % 32 != 0 ? PrequantTarget::kW8A8
             : w.quantized_activations                 ? PrequantTarget::kW4A8
                                                       : PrequantTarget::kW4A16;
  }
  if (target == PrequantTarget::kW8A8) {
    p.scheme = QuantScheme::kW8A8;
    p.group_size = w.cols;
    p.exact = is_int && !w.permuted && w.symmetric && w.group_size == w.cols && w.bits <= 8;
    return p;
  }
  p.scheme = target == PrequantTarget::kW4A8 ? QuantScheme::kW4A8 : QuantScheme::kW4A16;
  if (w.cols % 32 != 0) {
    fail("'{}' ({}): {} input features are not a multiple of 32, which the int4 schemes need (use w8a8)", w.name,
         w.label, w.cols);
  }
  p.exact = is_int && !w.permuted && w.symmetric && w.bits <= 4 && native_int4_group(w.group_size) > 0;
  // Exact: the largest native group inside the stored one (its scale repeated). Requantized:
  // 32, the finest (least error).
  p.group_size = p.exact ? native_int4_group(w.group_size) : 32;
  return p;
}

int64_t native_bytes(const NativePlan& p, int64_t rows, int64_t cols, int64_t fp8_group) {
  if (p.fp8) return rows * cols + rows * ((cols + fp8_group - 1) / std::max<int64_t>(1, fp8_group)) * 4;
  if (p.scheme == QuantScheme::kW8A8) return rows * cols + rows * 4;
  return rows * cols / 2 + rows * (cols / p.group_size) * 2;
}

namespace {

// Gives back this process's pages of a stored tensor once nothing reads it
// (release_file_pages: the file's bytes stay readable).
void release_stored(const TensorInfo& t, const FileMappings& maps) {
  if (t.data != nullptr) release_file_pages(t.data, t.nbytes, maps);
}

// Q4_0 order (kernels/quant.h): in each run of 32 columns from c0, byte c0/2 + j holds
// column c0 + j (low nibble) and c0 + j + 16 (high).
void put_nibble(uint8_t* row, int64_t c, int v) {
  const int64_t c0 = c / 32 * 32, j = c - c0;
  uint8_t& b = row[c0 / 2 + (j & 15)];
  const auto u = static_cast<uint8_t>(v + 8);
  b = j < 16 ? static_cast<uint8_t>((b & 0xf0) | u) : static_cast<uint8_t>((b & 0x0f) | (u << 4));
}

int8_t clamp_round(float x, int lo, int hi) {
  const float r = std::nearbyint(x);
  return static_cast<int8_t>(std::clamp(r, static_cast<float>(lo), static_cast<float>(hi)));
}

}  // namespace

kernels::QuantMatRef convert_to_native(const PrequantFormat& f, const StoredLinear& w, const NativePlan& p,
                                       std::vector<std::shared_ptr<void>>& owned, PrequantStats& stats) {
  const int64_t rows = w.total_rows(), cols = w.cols;
  stats.weights += w.experts;
  stats.stored_bytes += w.stored_bytes();
  stats.native_bytes += native_bytes(p, rows, cols, w.fp8_group);
  kernels::QuantMatRef out;
  if (p.fp8) {
    // W8A16: the e4m3 bytes as stored, decoded in the kernel; the scales expanded per row.
    auto e = std::make_shared<kernels::QuantExtras>();
    e->fp8_group = w.fp8_group;
    e->fp8_scale.resize(static_cast<size_t>(rows * e->fp8_groups(cols)));
    f.fp8_scales(w, e->fp8_scale.data());
    out = kernels::QuantMatRef(QuantScheme::kW8A8, rows, cols, cols, w.part("weight").data, e->fp8_scale.data());
    out.extras = std::move(e);
    kernels::check_quant_matrix(out);
    stats.exact += w.experts;
    stats.in_place += w.experts;
    return out;
  }
  // A format may bind exactly what the plan would requantize (zero points, act-order) by
  // carrying the terms the symmetric scheme lacks (kernels::QuantExtras).
  if ((p.exact || f.binds_exactly(w, p.scheme)) && f.bind_in_place(w, p.scheme, out, owned)) {
    stats.exact += w.experts;
    stats.in_place += w.experts;
    return out;
  }
  const bool int4 = kernels::scheme_is_int4(p.scheme);
  const int64_t qbytes = int4 ? rows * cols / 2 : rows * cols;
  const int64_t ng = int4 ? cols / p.group_size : 1;
  auto qbuf = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(qbytes)]());
  std::shared_ptr<void> sbuf;
  if (int4)
    sbuf = std::shared_ptr<uint16_t[]>(new uint16_t[static_cast<size_t>(rows * ng)]());
  else
    sbuf = std::shared_ptr<float[]>(new float[static_cast<size_t>(rows)]());
  auto* q8 = reinterpret_cast<int8_t*>(qbuf.get());
  auto* s16 = static_cast<uint16_t*>(sbuf.get());
  auto* s32 = static_cast<float*>(sbuf.get());

  // Rows [r0, r0 + kBlock) converted; the worst requantization error among them (relative
  // to each row's max |W|).
  constexpr int64_t kBlock = 16;  // rows converted at a time: no copy of the whole matrix
  auto convert_block = [&](int64_t r0, IntRows& ir, std::vector<float>& x) {
    const int64_t r1 = std::min(rows, r0 + kBlock), n = r1 - r0;
    double worst = 0;
    if (p.exact) {
      f.int_rows(w, r0, r1, ir);
      const int64_t sg = ir.group_size, sgroups = cols / sg;
      for (int64_t r = 0; r < n; ++r) {
        const int8_t* qr = ir.q.data() + r * cols;
        const float* sr = ir.scale.data() + r * sgroups;
        if (int4) {
          uint8_t* dst = qbuf.get() + (r0 + r) * cols / 2;
          for (int64_t c = 0; c < cols; ++c) put_nibble(dst, c, qr[c]);
          for (int64_t g = 0; g < ng; ++g) {
            const float s = sr[g * p.group_size / sg];
            const uint16_t h = f32_to_f16(s);
            if (std::isfinite(s) && !std::isfinite(f16_to_f32(h)))
              fail("'{}' ({}): scale {} of row {} does not fit in f16", w.name, w.label, s, r0 + r);
            s16[(r0 + r) * ng + g] = h;
          }
        } else {
          std::memcpy(q8 + (r0 + r) * cols, qr, static_cast<size_t>(cols));
          s32[r0 + r] = sr[0];
        }
      }
      return worst;
    }
    x.resize(static_cast<size_t>(n * cols));
    f.dequantize_rows(w, r0, r1, x.data());
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x.data() + r * cols;
      float amax_row = 0;
      for (int64_t c = 0; c < cols; ++c) amax_row = std::max(amax_row, std::fabs(xr[c]));
      double err = 0;
      if (int4) {
        uint8_t* dst = qbuf.get() + (r0 + r) * cols / 2;
        for (int64_t g = 0; g < ng; ++g) {
          const float* xg = xr + g * p.group_size;
          float amax = 0;
          for (int64_t c = 0; c < p.group_size; ++c) amax = std::max(amax, std::fabs(xg[c]));
          const uint16_t h = f32_to_f16(amax / 7.0f);
          const float s = f16_to_f32(h);
          s16[(r0 + r) * ng + g] = h;
          for (int64_t c = 0; c < p.group_size; ++c) {
            const int8_t v = s > 0 ? clamp_round(xg[c] / s, -8, 7) : 0;
            put_nibble(dst, g * p.group_size + c, v);
            err = std::max(err, static_cast<double>(std::fabs(xg[c] - s * v)));
          }
        }
      } else {
        const float s = amax_row / 127.0f;
        s32[r0 + r] = s;
        int8_t* dst = q8 + (r0 + r) * cols;
        for (int64_t c = 0; c < cols; ++c) {
          dst[c] = s > 0 ? clamp_round(xr[c] / s, -127, 127) : 0;
          err = std::max(err, static_cast<double>(std::fabs(xr[c] - s * dst[c])));
        }
      }
      if (amax_row > 0) worst = std::max(worst, err / amax_row);
    }
    return worst;
  };
  // Blocks on the kernels' threads for matrices of 1M values and more (a 700 GB FP8 checkpoint
  // is converted at load); an error in one is rethrown after the parallel region.
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  double worst = 0;
  std::string error;
#pragma omp parallel num_threads(num_threads()) if (rows * cols >= (int64_t{1} << 20))
  {
    IntRows ir;
    std::vector<float> x;
    double local = 0;
#pragma omp for schedule(dynamic, 4)
    for (int64_t b = 0; b < blocks; ++b) {
      try {
        local = std::max(local, convert_block(b * kBlock, ir, x));
      } catch (const std::exception& e) {
#pragma omp critical(prequant_convert_error)
        if (error.empty()) error = e.what();
      }
    }
#pragma omp critical(prequant_convert_worst)
    worst = std::max(worst, local);
  }
  if (!error.empty()) fail("{}", error);
  if (worst > stats.max_rel_error) {
    stats.max_rel_error = worst;
    stats.worst = w.name;
  }
  if (p.exact) stats.exact += w.experts;
  out = kernels::QuantMatRef(p.scheme, rows, cols, p.group_size, qbuf.get(), sbuf.get());
  kernels::check_quant_matrix(out);
  owned.push_back(std::move(qbuf));
  owned.push_back(std::move(sbuf));
  return out;
}

// ---- PrequantSource ----

PrequantSource::PrequantSource(WeightStore store, std::unique_ptr<PrequantFormat> format, PrequantTarget target,
                               Fp8Mode fp8)
    : plain_(std::make_unique<SafetensorsSource>(std::move(store), QuantizationConfig{})),
      format_(std::move(format)),
      target_(target),
      fp8_(fp8) {}

std::unique_ptr<PrequantSource> PrequantSource::open(const std::string& dir, bool load_into_memory,
                                                     LoadProgress* progress) {
  std::unique_ptr<PrequantFormat> format = detect_prequant(dir);
  if (!format) return nullptr;
  const PrequantTarget target = prequant_target_from_options();
  const Fp8Mode fp8 = prequant_fp8_from_options();
  return std::make_unique<PrequantSource>(WeightStore::open(dir, load_into_memory, progress), std::move(format), target,
                                          fp8);
}

PrequantStats PrequantSource::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

HasTensor PrequantSource::has_tensor() const {
  return [this](const std::string& name) { return format_->stores(store(), name); };
}

bool PrequantSource::has(const TensorSpec& t) const { return format_->stores(store(), t.name); }

std::vector<kernels::LinearWeight> PrequantSource::bind(const std::string& name, int64_t experts, int64_t rows,
                                                        int64_t cols) const {
  const StoredLinear w = format_->locate(store(), name, experts, rows, cols);
  const NativePlan p = plan_native(w, target_, fp8_);
  std::lock_guard<std::mutex> lock(mu_);
  // Names for logs and observers: the stored name of the weight's first part (stable storage).
  const std::string_view label = w.parts.begin()->second->name;
  std::vector<kernels::LinearWeight> out(static_cast<size_t>(experts));
  std::vector<kernels::QuantMatRef> apart;
  if (experts > 1 && !p.fp8 && (p.exact || format_->binds_exactly(w, p.scheme)) &&
      format_->bind_experts_apart(w, p.scheme, apart, owned_)) {
    INFERA_ASSERT(static_cast<int64_t>(apart.size()) == experts, "bind_experts_apart: one matrix per expert");
    stats_.weights += experts;
    stats_.exact += experts;
    stats_.in_place += experts;
    stats_.stored_bytes += w.stored_bytes();
    stats_.native_bytes += native_bytes(p, w.total_rows(), cols, w.fp8_group);
    for (int64_t e = 0; e < experts; ++e) {
      if (quant_repack_enabled()) apart[e].packed = kernels::pack_quant_matrix(apart[e]);
      out[e].quantized = true;
      out[e].name = label;
      out[e].quant = std::move(apart[e]);
    }
    return out;
  }
  const int64_t in_place_before = stats_.in_place;
  kernels::QuantMatRef all = convert_to_native(*format_, w, p, owned_, stats_);
  if (stats_.in_place == in_place_before) {  // converted: the stored bytes are read no more
    const FileMappings maps = FileMappings::current();
    for (const auto& [role, t] : w.parts) release_stored(*t, maps);
  }
  // Static activations (msModelSlim W8A8) compute from the stored layout: no repacked copy.
  if (quant_repack_enabled() && !(all.extras && all.extras->static_act)) all.packed = kernels::pack_quant_matrix(all);
  for (int64_t e = 0; e < experts; ++e) {
    out[e].quantized = true;
    out[e].name = label;
    out[e].quant = experts == 1 ? all : kernels::quant_row_slice(all, e * rows, (e + 1) * rows);
  }
  return out;
}

kernels::LinearWeight PrequantSource::linear(const TensorSpec& t) const {
  if (t.shape.size() != 2) fail("{}: tensor '{}' is not a matrix in the tensor table", where(), t.name);
  if (!format_->quantizes(store(), t.name)) return plain_->linear(t);
  if (t.role == WeightRole::kFloat) {
    // Kept as float by design (a router, a gate): the checkpoint's values dequantized, f32.
    const StoredLinear w = format_->locate(store(), t.name, 1, t.shape[0], t.shape[1]);
    auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(w.rows * w.cols)]);
    format_->dequantize_rows(w, 0, w.rows, buf.get());
    const kernels::MatRef m{buf.get(), DType::kF32, w.rows, w.cols};
    std::lock_guard<std::mutex> lock(mu_);
    owned_.push_back(std::move(buf));
    return kernels::dense_linear(m, w.parts.begin()->second->name);
  }
  return bind(t.name, 1, t.shape[0], t.shape[1])[0];
}

std::vector<kernels::LinearWeight> PrequantSource::experts(const std::vector<const TensorSpec*>& parts) const {
  if (parts.size() == 1 && parts[0]->shape.size() == 3) {
    const std::vector<int64_t>& s = parts[0]->shape;
    if (!format_->quantizes(store(), parts[0]->name)) return plain_->experts(parts);
    return bind(parts[0]->name, s[0], s[1], s[2]);
  }
  std::vector<kernels::LinearWeight> out;
  out.reserve(parts.size());
  for (const TensorSpec* p : parts) {
    if (p->shape.size() != 2) fail("{}: expert tensor '{}' is not a matrix in the tensor table", where(), p->name);
    if (!format_->quantizes(store(), p->name))
      out.push_back(plain_->experts({p})[0]);
    else
      out.push_back(bind(p->name, 1, p->shape[0], p->shape[1])[0]);
  }
  return out;
}

std::vector<float> PrequantSource::values(const TensorSpec& t) const {
  // A quantized matrix the model holds as f32 (DeepSeek's kv_b_proj): its values dequantized.
  if (t.shape.size() == 2 && format_->quantizes(store(), t.name)) {
    const StoredLinear w = format_->locate(store(), t.name, 1, t.shape[0], t.shape[1]);
    std::vector<float> v(static_cast<size_t>(w.rows * w.cols));
    format_->dequantize_rows(w, 0, w.rows, v.data());
    return v;
  }
  return plain_->values(t);
}

int64_t PrequantSource::num_parameters() const { return plain_->num_parameters(); }

int64_t PrequantSource::stored_bytes(const TensorSpec& t) const {
  if (t.role != WeightRole::kVector && (t.shape.size() == 2 || t.shape.size() == 3) &&
      format_->quantizes(store(), t.name)) {
    const bool fused = t.shape.size() == 3;
    try {
      return format_->locate(store(), t.name, fused ? t.shape[0] : 1, t.shape[fused ? 1 : 0], t.shape.back())
          .stored_bytes();
    } catch (const Error&) {
      // Binding it will name the problem; progress counts what is stored under its name.
    }
  }
  return plain_->stored_bytes(t);
}

// ---- check / plan ----

PrequantReport check_prequant(const PrequantFormat& f, const WeightStore& store, const std::vector<TensorSpec>& table,
                              PrequantTarget target, Fp8Mode fp8) {
  PrequantReport r;
  r.summary = f.summary();
  for (const TensorSpec& t : table) {
    if (t.role == WeightRole::kVector || (t.shape.size() != 2 && t.shape.size() != 3)) continue;
    if (!f.quantizes(store, t.name)) {
      ++r.plain;
      continue;
    }
    if (t.mtp && !f.stores(store, t.name)) continue;  // MTP weights are optional
    const bool fused = t.shape.size() == 3;
    const int64_t E = fused ? t.shape[0] : 1, rows = t.shape[fused ? 1 : 0], cols = t.shape.back();
    try {
      const StoredLinear w = f.locate(store, t.name, E, rows, cols);
      r.stored_bytes += w.stored_bytes();
      if (t.role == WeightRole::kFloat) {  // kept as float: dequantized to f32 (PrequantSource)
        r.dequantized += E;
        r.native_bytes += E * rows * cols * 4;
      } else {
        const NativePlan p = plan_native(w, target, fp8);
        r.quantized += E;
        if (p.exact || f.binds_exactly(w, p.scheme)) r.exact += E;
        r.native_bytes += native_bytes(p, E * rows, cols, w.fp8_group);
      }
      for (const auto& [role, part] : w.parts) r.used.push_back(part->name);
    } catch (const Error& e) {
      r.errors.push_back(e.what());
    }
  }
  return r;
}

}  // namespace infera
