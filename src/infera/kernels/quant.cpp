// Quantized kernels: argument checks, per-ISA dispatch, and the scalar reference (which is
// also the scalar path).
#include "infera/kernels/quant.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/base/threads.h"
#include "infera/kernels/cpu/fp8_dispatch.h"
#include "infera/kernels/cpu/quant_dispatch.h"
#include "infera/kernels/ggml_quants.h"

namespace infera::kernels {

namespace {
std::atomic<bool> g_quant_amx{true};
std::atomic<bool> g_quant_avxvnni{true};
}  // namespace

void set_quant_amx(bool enabled) { g_quant_amx.store(enabled, std::memory_order_relaxed); }
bool quant_amx_enabled() { return g_quant_amx.load(std::memory_order_relaxed); }

void set_quant_avxvnni(bool enabled) { g_quant_avxvnni.store(enabled, std::memory_order_relaxed); }
const char* avxvnni_unavailable_reason() {
  static const char* const why = []() -> const char* {
    if (option_env("avxvnni", BadEnvValue::kWarnAndIgnore) == "0") return "off (INFERA_AVXVNNI=0)";  // A/B runs
    return cpu_features().avxvnni ? nullptr : "not on this CPU";
  }();
  if (why == nullptr && !g_quant_avxvnni.load(std::memory_order_relaxed)) return "off";
  return why;
}

std::string_view scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::kW8A8: return "w8a8";
    case QuantScheme::kW4A8: return "w4a8";
    case QuantScheme::kW4A16: return "w4a16";
  }
  return "?";
}

int64_t QuantExtras::bytes(int64_t rows, int64_t cols) const {
  int64_t b = static_cast<int64_t>(in_perm.size()) * 4;
  if (corr_group > 0) b += rows * (cols / corr_group) * 4;
  if (static_act) b += rows * 8;
  b += rows * fp8_groups(cols) * 4;
  return b;
}

float fp8_e4m3_value(uint8_t v) {
  const int exp = (v >> 3) & 0xf, mant = v & 7;
  if (exp == 0xf && mant == 7) return std::nanf("");
  // Subnormal (exp 0): mant/8 · 2^-6; normal: (1 + mant/8) · 2^(exp - 7).
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9) : std::ldexp(8.0f + mant, exp - 10);
  return (v & 0x80) ? -mag : mag;
}

int64_t QuantMatRef::weight_bytes() const {
  const int64_t extra = extras ? extras->bytes(rows, cols) : 0;
  if (scheme_is_int4(scheme)) return rows * (cols / 2) + rows * groups_per_row() * 2 + extra;
  return rows * cols + rows * 4 + extra;
}

int64_t LinearWeight::bytes() const { return quantized ? quant.weight_bytes() : dense.rows * row_bytes(dense); }

void check_quant_matrix(const QuantMatRef& w) {
  if (w.rows < 0 || w.cols <= 0) fail("quantized matrix: bad shape [{}, {}]", w.rows, w.cols);
  if (scheme_is_int4(w.scheme)) {
    if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128) {
      fail("quantized matrix: {} group size {} is not 32, 64 or 128", scheme_name(w.scheme), w.group_size);
    }
    if (w.cols % w.group_size != 0) {
      fail("quantized matrix: {} columns are not a multiple of the group size {}", w.cols, w.group_size);
    }
  } else if (w.group_size != w.cols) {
    fail("quantized matrix: w8a8 is per output channel (group size must equal the {} columns, got {})", w.cols,
         w.group_size);
  }
  if (w.rows > 0 && (w.qweight == nullptr || w.scales == nullptr)) fail("quantized matrix: missing data");
  if (const QuantExtras* e = w.extras.get()) {
    if (!e->in_perm.empty() && static_cast<int64_t>(e->in_perm.size()) != w.cols)
      fail("quantized matrix: input permutation of {} entries for {} columns", e->in_perm.size(), w.cols);
    if (e->corr_group < 0 || (e->corr_group > 0 && w.cols % e->corr_group != 0))
      fail("quantized matrix: zero-point group {} does not divide {} columns", e->corr_group, w.cols);
    if (e->corr_group > 0 && (static_cast<int64_t>(e->corr.size()) % (w.cols / e->corr_group) != 0 ||
                              e->corr_rows(w.cols) < w.extras_row0 + w.rows))
      fail("quantized matrix: {} zero-point corrections for {} groups of rows {}..{}", e->corr.size(),
           w.cols / e->corr_group, w.extras_row0, w.extras_row0 + w.rows);
    if (e->static_act && (scheme_is_int4(w.scheme) || e->static_act_rows() < w.extras_row0 + w.rows))
      fail("quantized matrix: static activations need w8a8 and one output scale and bias per row");
    if (e->fp8_group < 0 ||
        (e->fp8() && (scheme_is_int4(w.scheme) || e->static_act || !e->in_perm.empty() || e->corr_group > 0 ||
                      static_cast<int64_t>(e->fp8_scale.size()) < (w.extras_row0 + w.rows) * e->fp8_groups(w.cols))))
      fail("quantized matrix: fp8 weights need the w8a8 layout, no other extras and one scale per row and group");
  }
}

// ---- reference ------------------------------------------------------------------------------

namespace ref {

int32_t qweight_at(const QuantMatRef& w, int64_t row, int64_t col) {
  if (!scheme_is_int4(w.scheme)) return static_cast<const int8_t*>(w.qweight)[row * w.cols + col];
  const uint8_t* p = static_cast<const uint8_t*>(w.qweight) + row * (w.cols / 2);
  const int64_t run = col / 32 * 32, j = col % 32;
  const uint8_t byte = p[run / 2 + (j % 16)];
  const int nib = j < 16 ? (byte & 0x0f) : (byte >> 4);
  return nib - 8;
}

float qscale_at(const QuantMatRef& w, int64_t row, int64_t col) {
  if (!scheme_is_int4(w.scheme)) return static_cast<const float*>(w.scales)[row];
  return f16_to_f32(static_cast<const uint16_t*>(w.scales)[row * w.groups_per_row() + col / w.group_size]);
}

void quantize_activations(const float* x, int64_t m, int64_t k, int8_t* q, int64_t ld, float* scale,
                          int32_t* block_sums) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    int8_t* qr = q + i * ld;
    float amax = 0.0f;
    for (int64_t t = 0; t < k; ++t) amax = std::max(amax, std::fabs(xr[t]));
    scale[i] = amax == 0.0f ? 0.0f : amax / 127.0f;
    const float inv = amax == 0.0f ? 0.0f : 127.0f / amax;
    for (int64_t t = 0; t < k; ++t) {
      const float v = std::nearbyint(xr[t] * inv);  // round half to even, as cvtps2dq
      qr[t] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
    for (int64_t t = k; t < ld; ++t) qr[t] = 0;
    if (block_sums) {
      for (int64_t b = 0; b < ld / 32; ++b) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += qr[b * 32 + j];
        block_sums[i * (ld / 32) + b] = s;
      }
    }
  }
}

void qmatmul(const float* x, int64_t m, const QuantMatRef& w, float* y) {
  const int64_t k = w.cols, n = w.rows, gs = w.group_size;
  const int64_t ld = activation_ld(k);
  std::vector<int8_t> xq(static_cast<size_t>(ld));
  float dx = 0.0f;
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    if (scheme_quantizes_activations(w.scheme)) quantize_activations(xr, 1, k, xq.data(), ld, &dx, nullptr);
    for (int64_t r = 0; r < n; ++r) {
      double acc = 0.0;
      for (int64_t g0 = 0; g0 < k; g0 += gs) {
        const double d = qscale_at(w, r, g0);
        if (scheme_quantizes_activations(w.scheme)) {
          int64_t dot = 0;  // exact
          for (int64_t t = g0; t < g0 + gs; ++t) dot += int64_t{qweight_at(w, r, t)} * xq[t];
          acc += d * static_cast<double>(dot);
        } else {
          double dot = 0.0;
          for (int64_t t = g0; t < g0 + gs; ++t) dot += static_cast<double>(qweight_at(w, r, t)) * xr[t];
          acc += d * dot;
        }
      }
      if (scheme_quantizes_activations(w.scheme)) acc *= dx;
      y[i * n + r] = static_cast<float>(acc);
    }
  }
}

void fp8_matmul(const float* x, int64_t m, const QuantMatRef& w, float* y) {
  const QuantExtras& e = *w.extras;
  const int64_t k = w.cols, n = w.rows, g = e.fp8_group, ng = e.fp8_groups(k);
  const auto* wq = static_cast<const uint8_t*>(w.qweight);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < n; ++r) {
      const float* s = e.fp8_scale.data() + (w.extras_row0 + r) * ng;
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c)
        acc += static_cast<double>(fp8_e4m3_value(wq[r * k + c])) * s[c / g] * x[i * k + c];
      y[i * n + r] = static_cast<float>(acc);
    }
  }
}

}  // namespace ref

// ---- dispatch -------------------------------------------------------------------------------

namespace {

const QuantKernelTable& scalar_table() {
  static const QuantKernelTable t{&ref::quantize_activations, &ref::qmatmul, nullptr, nullptr, nullptr};
  return t;
}

const QuantKernelTable& quant_table_for(Isa isa) {
  INFERA_ASSERT(isa_available(isa), std::string("kernel path ") + isa_name(isa) + " is not available on this CPU");
  switch (isa) {
    case Isa::kAvx512: return quant_avx512::table();
    case Isa::kAvx2: return avxvnni_unavailable_reason() == nullptr ? quant_avxvnni::table() : quant_avx2::table();
    case Isa::kScalar: break;
  }
  return scalar_table();
}

}  // namespace

std::string quant_matmul_path(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: {
      std::string s =
          "W8A8 / W4A8 (int8 activations per token): avx512 VNNI (vpdpbusd) on packed panels, a GEMV per token "
          "and tiles of up to 8 tokens x 16-48 rows; W4A16: int4 widened to f32 FMA; W8A8 prefill (>= 8 tokens, "
          "k a multiple of 64) on AMX int8 tiles (tdpbsud): ";
      return s + quant_table_for(isa).amx_status();
    }
    case Isa::kAvx2: {
      const char* vnni = avxvnni_unavailable_reason();
      return std::string(
                 "W8A8 / W4A8 (int8 activations per token): avx2 on packed panels (8 rows per vector, vpmaddubsw: "
                 "W4A8 summing 32 columns in int16 before vpmaddwd widens them; W8A8 ") +
             (vnni == nullptr ? "as w + 128 against q by AVX-VNNI's 256-bit vpdpbusd"
                              : "as |w| x q with w's sign, widened per step") +
             "), a GEMV per token and tiles of up to 8 tokens; W4A16: int4 widened to f32 FMA; no AMX; AVX-VNNI: " +
             (vnni == nullptr ? "in use" : vnni);
    }
    case Isa::kScalar: break;
  }
  return "scalar reference";
}

namespace {
std::string gguf_lanes_text() {
  return ggml::panel_lanes_enabled()
             ? "a model's panels over four lanes far apart in memory, a decode step's panels one from each; with "
               "several threads a decode step's matrices that read one input, and a MoE token's experts, in one "
               "shared pass"
             : "each matrix's panels in one run (INFERA_PANEL_LANES=0)";
}
// (INFERA_Q6K_PANELS)
std::string q6k_layout_text() {
  return ggml::q6k_panels_beside() ? "; Q6_K's sub-scales first, its top bits beside each chunk's nibbles"
                                   : "; Q6_K's nibbles, top bits and sub-scales apart";
}
}  // namespace

std::string ggml_matmul_path(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: {
      const char* amx = amx_unavailable_reason();
      return std::string(
                 "avx512: activations as llama.cpp's Q8 blocks; Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / Q8_0 / Q2_K / "
                 "Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS repacked at load into 16-row panels (huge pages; " +
                 gguf_lanes_text() + q6k_layout_text() +
                 "; decode: vpdpbusd on 16 rows per vector, 4 panels per step, prefetching " + gguf_prefetch_text() +
                 "; prefill: 2 panels x up to 4 tokens per step, from 16 tokens on AMX "
                 "tiles: Q8_0's B straight from the panel, Q4_K's / Q5_K's / Q3_K's from two planes, Q6_K's from "
                 "four and Q2_K's from one (its mins on vectors) with the sub-scales folded in, 256 weights per sum; "
                 "Q4_0 / Q5_0 / IQ4_NL from 128 tokens as Q8_0's, "
                 "unpacked to signed bytes per call); decode: the panel types not repacked read in place, 4 rows "
                 "per step (vpdpbusd, rows prefetched >= 16 KB ahead), other types decoded per tile of 4 rows; "
                 "prefill (>= 4 tokens): pairs of 16-row VNNI tiles decoded 512 weights at a time, each chunk "
                 "multiplied by every token while it is in L1 (vpdpbusd; Q4_K / Q5_K / Q6_K / IQ4_XS unpacked "
                 "straight from the file); prefill on AMX int8 tiles for Q8_0 (>= 8 tokens, read in place) and "
                 "Q4_K / Q5_K (>= 16) / Q6_K (>= 64) as sub-scale planes when read in place: ") +
             (amx != nullptr             ? amx
              : ggml::ggml_amx_enabled() ? "in use"
                                         : "off (set_ggml_amx)");
    }
    case Isa::kAvx2:
      return "avx2: activations as llama.cpp's Q8 blocks; Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / Q8_0 / Q2_K / Q3_K / "
             "Q4_K / Q5_K / Q6_K / IQ4_XS repacked at load into 16-row panels (huge pages; " +
             gguf_lanes_text() + q6k_layout_text() +
             "; maddubs on 8 rows per vector, the unsigned ones' int16 sums widened once per (sub-)block, IQ4_XS's per "
             "step against its "
             "sub-block scales; decode: 4 panels per step "
             "(2 for Q5_0 / Q5_1 / Q5_K; Q6_K's and Q3_K's sub-blocks one chain against their scales, Q6_K, Q3_K "
             "and Q2_K one panel's chains at a time, Q5_K half a panel's, Q5_K's fifth and Q3_K's third bits as "
             "bit planes; IQ4_NL's and IQ4_XS's level "
             "magnitudes from a second lookup), "
             "prefetching " +
             gguf_prefetch_text() +
             "; prefill: "
             "1 panel x up to 4 tokens per step (2 for Q5_0 / Q5_1 / Q5_K, whose sums take two int16 chains; Q6_K's "
             "and Q3_K's sub-blocks one chain against their scales; Q8_0 / Q4_K / Q5_K / IQ4_XS one half of the panel, "
             "8 rows, at a time, "
             "Q4_K / Q5_K's and Q2_K's sub-block chains widened and scaled in one madd), "
             "from 3 tokens on each chunk unpacked once (Q4_K from 33; fewer read the panels as they are)); other "
             "types and rows read in place: "
             "tiles of 4 decoded rows, maddubs / madd dot products";
    case Isa::kScalar: break;
  }
  return "scalar reference (decoded rows, integer dot products)";
}

void quantize_activations(Isa isa, const float* x, int64_t m, int64_t k, int8_t* q, int64_t ld, float* scale,
                          int32_t* block_sums) {
  INFERA_ASSERT(m >= 0 && k >= 0 && ld >= k && (block_sums == nullptr || ld % 32 == 0));
  quant_table_for(isa).quantize_activations(x, m, k, q, ld, scale, block_sums);
}

namespace {

// x_q = sat_int8(round(x / in_scale + in_offset)), y = out_scale · (x_q · w + qbias), int32.
void qmatmul_static(const float* x, int64_t m, const QuantMatRef& w, float* y) {
  const QuantExtras& e = *w.extras;
  const int64_t k = w.cols, n = w.rows, r0 = w.extras_row0;
  static thread_local std::vector<int8_t> xq;
  xq.resize(static_cast<size_t>(m * k));
  const float inv = 1.0f / e.in_scale;  // the reciprocal, as Ascend's quantize op is fed
  for (int64_t i = 0; i < m * k; ++i) {
    const float v = std::nearbyint(x[i] * inv + e.in_offset);
    xq[i] = static_cast<int8_t>(std::clamp(v, -128.0f, 127.0f));
  }
  const int8_t* xqp = xq.data();  // thread_local: the worker threads read the caller's
  const auto* wq = static_cast<const int8_t*>(w.qweight);
  const int nt = num_threads();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n * k * m >= (1 << 16))
  for (int64_t r = 0; r < n; ++r) {
    const int8_t* wr = wq + r * k;
    for (int64_t i = 0; i < m; ++i) {
      const int8_t* xr = xqp + i * k;
      int32_t acc = 0;
      for (int64_t j = 0; j < k; ++j) acc += int32_t{xr[j]} * int32_t{wr[j]};
      y[i * n + r] = e.out_scale[r0 + r] * static_cast<float>(acc + e.qbias[r0 + r]);
    }
  }
}

void qmatmul_core(Isa isa, const float* x, int64_t m, const QuantMatRef& w, float* y);

// FP8 weights decoded in the kernel (QuantExtras::fp8_group).
void qmatmul_fp8(Isa isa, const float* x, int64_t m, const QuantMatRef& w, float* y) {
  INFERA_ASSERT(isa_available(isa), std::string("kernel path ") + isa_name(isa) + " is not available on this CPU");
  const QuantExtras& e = *w.extras;
  Fp8Args a;
  a.weights = static_cast<const uint8_t*>(w.qweight);
  a.scales = e.fp8_scale.data() + w.extras_row0 * e.fp8_groups(w.cols);
  a.rows = w.rows;
  a.cols = w.cols;
  a.group = e.fp8_group;
  a.ldx = w.cols;
  a.ldy = w.rows;
  switch (isa) {
    case Isa::kAvx512: fp8_avx512::fp8_matmul(a, x, m, y); return;
    case Isa::kAvx2: fp8_avx2::fp8_matmul(a, x, m, y); return;
    case Isa::kScalar: break;
  }
  ref::fp8_matmul(x, m, w, y);
}

// The inputs' sums over groups of g columns: sums [m, k / g]. Eight partial sums a group
// (summed pairwise at the end), so that the compiler vectorizes it: one running sum was a chain
// of k dependent adds per token, as long as a decode step's int4 pass over a small expert.
void group_sums(const float* x, int64_t m, int64_t k, int64_t g, float* sums) {
  const int64_t ng = k / g;
  constexpr int kLanes = 8;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < ng; ++t) {
      const float* xg = x + i * k + t * g;
      float part[kLanes] = {};
      int64_t j = 0;
      for (; j + kLanes <= g; j += kLanes)
        for (int l = 0; l < kLanes; ++l) part[l] += xg[j + l];
      for (; j < g; ++j) part[j % kLanes] += xg[j];
      sums[i * ng + t] = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    }
  }
}

// y += S · corr with S [m, ng] the inputs' group sums (sums_of_x, from group_sums) and corr
// [ng, rows] (group-major). The fused multi-matrix pass and the per-matrix path both call it, so
// their results are the same bits. Decode (a few tokens): per token and group one
// y += S[i, g] · corr[g, :], vectorized over the rows (the f32 GEMV on a row-major [rows, ng]
// ran each row scalar when ng is below its vector width: 14% of an AWQ MoE decode step). A
// prompt: a small f32 matmul on the rows transposed, threaded and vectorized like any other (a
// scalar loop over rows x groups per token was 15% of an AWQ prefill).
void add_group_correction(Isa isa, const float* sums_of_x, int64_t m, const QuantMatRef& w, float* y) {
  const QuantExtras& e = *w.extras;
  const int64_t n = w.rows, ng = w.cols / e.corr_group, stride = e.corr_rows(w.cols);
  const float* c = e.corr.data() + w.extras_row0;  // group g's rows at c + g * stride
  constexpr int64_t kAxpyTokens = 4;
  if (m <= kAxpyTokens) {
    for (int64_t i = 0; i < m; ++i) {
      float* yi = y + i * n;
      for (int64_t g = 0; g < ng; ++g) {
        const float sg = sums_of_x[i * ng + g];
        const float* cg = c + g * stride;
        for (int64_t r = 0; r < n; ++r) yi[r] += sg * cg[r];
      }
    }
    return;
  }
  static thread_local std::vector<float> ct, add;
  ct.resize(static_cast<size_t>(n * ng));
  add.resize(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < ng; ++g) ct[r * ng + g] = c[g * stride + r];
  matmul(isa, sums_of_x, m, MatRef{ct.data(), DType::kF32, n, ng}, add.data());
  for (int64_t i = 0; i < m * n; ++i) y[i] += add[i];
}

// The zero-point correction of w (if it has one) for the (permuted) inputs xin.
void add_zero_point_correction(Isa isa, const float* xin, int64_t m, const QuantMatRef& w, float* y) {
  const QuantExtras& e = *w.extras;
  if (e.corr_group == 0) return;
  static thread_local std::vector<float> sums;
  sums.resize(static_cast<size_t>(m * (w.cols / e.corr_group)));
  group_sums(xin, m, w.cols, e.corr_group, sums.data());
  add_group_correction(isa, sums.data(), m, w, y);
}

// Extras the fused multi-matrix pass can take: a zero-point correction alone (AWQ, GPTQ
// sym=false without act-order), added after the pass from the same inputs.
bool extras_fuse(const QuantMatRef& w) {
  const QuantExtras* e = w.extras.get();
  return e == nullptr || (!e->static_act && !e->fp8() && e->in_perm.empty());
}

// Permutation and zero-point correction around the symmetric kernel.
void qmatmul_extras(Isa isa, const float* x, int64_t m, const QuantMatRef& w, float* y) {
  const QuantExtras& e = *w.extras;
  if (e.static_act) {
    qmatmul_static(x, m, w, y);
    return;
  }
  if (e.fp8()) {
    qmatmul_fp8(isa, x, m, w, y);
    return;
  }
  const int64_t k = w.cols;
  const float* xin = x;
  static thread_local std::vector<float> xp;
  if (!e.in_perm.empty()) {
    xp.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) xp[i * k + j] = x[i * k + e.in_perm[j]];
    xin = xp.data();
  }
  qmatmul_core(isa, xin, m, w, y);
  add_zero_point_correction(isa, xin, m, w, y);
}

}  // namespace

void qmatmul(Isa isa, const float* x, int64_t m, const QuantMatRef& w, float* y) {
  check_quant_matrix(w);
  INFERA_ASSERT(m >= 0);
  if (m == 0 || w.rows == 0) return;
  if (w.extras) {
    qmatmul_extras(isa, x, m, w, y);
    return;
  }
  qmatmul_core(isa, x, m, w, y);
}

namespace {
void qmatmul_core(Isa isa, const float* x, int64_t m, const QuantMatRef& w, float* y) {
  const QuantKernelTable& t = quant_table_for(isa);
  if (w.packed && t.qmatmul_packed) {
    const PackedQuantMat& p = *w.packed;
    INFERA_ASSERT(p.scheme == w.scheme && p.rows == w.rows && p.cols == w.cols && p.group_size == w.group_size,
                  "packed copy does not match its matrix");
    t.qmatmul_packed(x, m, w, y);
  } else {
    t.qmatmul(x, m, w, y);
  }
}
}  // namespace
void qmatmul(const float* x, int64_t m, const QuantMatRef& w, float* y) { qmatmul(best_isa(), x, m, w, y); }

namespace {
LinearObserver& linear_observer() {
  static LinearObserver observer;
  return observer;
}
}  // namespace

void set_linear_observer(LinearObserver observer) { linear_observer() = std::move(observer); }

void linear(Isa isa, const float* x, int64_t m, const LinearWeight& w, float* y) {
  if (const LinearObserver& obs = linear_observer()) obs(w.name, x, m, w.cols());
  if (w.quantized) {
    qmatmul(isa, x, m, w.quant, y);
  } else {
    matmul(isa, x, m, w.dense, y);
  }
}
void linear(const float* x, int64_t m, const LinearWeight& w, float* y) { linear(best_isa(), x, m, w, y); }

namespace {
bool multi_fuses(Isa isa, int64_t m, std::span<const QuantMatRef* const> ws) {
  bool fused = m == 1 && !ws.empty() && quant_table_for(isa).qgemv_packed_multi != nullptr;
  for (const QuantMatRef* w : ws) {
    fused = fused && w->packed && extras_fuse(*w) && w->scheme == ws[0]->scheme && w->cols == ws[0]->cols &&
            w->group_size == ws[0]->group_size;
  }
  return fused;
}
}  // namespace

void qmatmul_multi(Isa isa, const float* x, int64_t m, std::span<const QuantMatRef* const> ws,
                   std::span<float* const> ys) {
  INFERA_ASSERT(ws.size() == ys.size(), "qmatmul_multi: one output per matrix");
  if (!multi_fuses(isa, m, ws)) {
    for (size_t i = 0; i < ws.size(); ++i) qmatmul(isa, x, m, *ws[i], ys[i]);
    return;
  }
  for (const QuantMatRef* w : ws) {
    check_quant_matrix(*w);
    const PackedQuantMat& p = *w->packed;
    INFERA_ASSERT(p.scheme == w->scheme && p.rows == w->rows && p.cols == w->cols && p.group_size == w->group_size,
                  "packed copy does not match its matrix");
  }
  quant_table_for(isa).qgemv_packed_multi(x, ws.data(), ys.data(), static_cast<int>(ws.size()));
  // Zero-point corrections after the pass, each matrix's as qmatmul adds it; the group sums
  // of x are shared by the matrices of one correction group size (an expert's gate and up).
  static thread_local std::vector<float> sums;
  int64_t sums_group = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const QuantMatRef& w = *ws[i];
    if (!w.extras || w.extras->corr_group == 0 || w.rows == 0) continue;
    if (w.extras->corr_group != sums_group) {
      sums_group = w.extras->corr_group;
      sums.resize(static_cast<size_t>(w.cols / sums_group));
      group_sums(x, 1, w.cols, sums_group, sums.data());
    }
    add_group_correction(isa, sums.data(), 1, w, ys[i]);
  }
}
void qmatmul_multi(const float* x, int64_t m, std::span<const QuantMatRef* const> ws, std::span<float* const> ys) {
  qmatmul_multi(best_isa(), x, m, ws, ys);
}

namespace {
// The quantized weights among ws and their outputs (ys may be empty): what linear_multi
// computes in one pass.
struct QuantizedPart {
  std::vector<const QuantMatRef*> mats;
  std::vector<float*> outs;
  void assign(std::span<const LinearWeight* const> ws, std::span<float* const> ys) {
    mats.clear();
    outs.clear();
    for (size_t i = 0; i < ws.size(); ++i) {
      if (!ws[i]->quantized) continue;
      mats.push_back(&ws[i]->quant);
      if (!ys.empty()) outs.push_back(ys[i]);
    }
  }
};
}  // namespace

bool linear_multi_fuses(Isa isa, int64_t m, std::span<const LinearWeight* const> ws) {
  QuantizedPart part;
  part.assign(ws, {});
  return part.mats.size() >= 2 && multi_fuses(isa, m, part.mats);
}

void linear_multi(Isa isa, const float* x, int64_t m, std::span<const LinearWeight* const> ws,
                  std::span<float* const> ys) {
  INFERA_ASSERT(ws.size() == ys.size(), "linear_multi: one output per weight");
  // The quantized weights in one pass (a float weight among them, such as Qwen3.5's small
  // GDN gate projections, runs on its own). Per-thread lists: this runs per layer and token.
  static thread_local QuantizedPart part;
  part.assign(ws, ys);
  // A decode step's GGUF matrices (q, k and v; gate and up) with several threads: one shared
  // pass (matvec_many), one region instead of one each.
  static thread_local std::vector<MatVec> shared;
  shared.clear();
  const bool joint = m == 1 && ws.size() > 1 && !omp_in_parallel() && num_threads() > 1;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (const LinearObserver& obs = linear_observer()) obs(ws[i]->name, x, m, ws[i]->cols());
    if (ws[i]->quantized) continue;
    if (joint && matvec_shares(isa, ws[i]->dense))
      shared.push_back({x, &ws[i]->dense, ys[i]});
    else
      matmul(isa, x, m, ws[i]->dense, ys[i]);
  }
  if (shared.size() == 1) matmul(isa, x, m, *shared[0].w, shared[0].y);
  if (shared.size() > 1) matvec_many(isa, shared);
  qmatmul_multi(isa, x, m, part.mats, part.outs);
}
void linear_multi(const float* x, int64_t m, std::span<const LinearWeight* const> ws, std::span<float* const> ys) {
  linear_multi(best_isa(), x, m, ws, ys);
}

// ---- repacking (kernels/quant.h, "Repacked layout") ----------------------------------------

std::shared_ptr<const PackedQuantMat> pack_quant_matrix_always(const QuantMatRef& w, int threads) {
  check_quant_matrix(w);
  if (quant_is_fp8(w)) return nullptr;  // the FP8 kernel reads the stored bytes
  const bool int4 = scheme_is_int4(w.scheme);
  if (!int4 && w.cols > 65536) return nullptr;  // sum of (w + 128) * x could overflow int32
  auto out = std::make_shared<PackedQuantMat>();
  PackedQuantMat& p = *out;
  p.scheme = w.scheme;
  p.rows = w.rows;
  p.cols = w.cols;
  p.group_size = w.group_size;
  p.panels = (w.rows + kPanelRows - 1) / kPanelRows;
  const int64_t groups = w.groups_per_row();
  p.chunks = int4 ? w.cols / 8 : (w.cols + 3) / 4;
  const int64_t scale_bytes = int4 ? groups * kPanelRows * 2 : kPanelRows * 4;
  p.panel_bytes = (p.chunks * 64 + scale_bytes + 63) / 64 * 64;
  p.storage = HugePageBuffer(static_cast<size_t>(p.panels * p.panel_bytes));
  if (p.panels == 0) return out;
  const auto* qw = static_cast<const uint8_t*>(w.qweight);
  const int64_t row_bytes = int4 ? w.cols / 2 : w.cols;
  const int nt = threads > 0 ? threads : num_threads();
  // Each thread writes (first-touches) its own panels.
#pragma omp parallel num_threads(nt) if (nt > 1 && p.panels > 1)
  {
    std::vector<uint8_t> nib(static_cast<size_t>(int4 ? w.cols : 0));  // one row's nibbles in column order
#pragma omp for schedule(static)
    for (int64_t pi = 0; pi < p.panels; ++pi) {
      uint8_t* dst = p.panel(pi);
      for (int64_t lane = 0; lane < kPanelRows; ++lane) {
        const int64_t r = pi * kPanelRows + lane;
        const bool real = r < w.rows;
        const uint8_t* src = qw + r * row_bytes;
        if (int4) {
          if (real) {
            for (int64_t run = 0; run < w.cols; run += 32)
              for (int64_t j = 0; j < 16; ++j) {
                const uint8_t byte = src[run / 2 + j];
                nib[run + j] = byte & 0x0f;
                nib[run + j + 16] = byte >> 4;
              }
          } else {
            std::fill(nib.begin(), nib.end(), uint8_t{8});  // weight 0
          }
          for (int64_t c = 0; c < p.chunks; ++c) {
            uint8_t* d = dst + c * 64 + lane * 4;
            for (int64_t b = 0; b < 4; ++b) d[b] = static_cast<uint8_t>(nib[8 * c + b] | (nib[8 * c + 4 + b] << 4));
          }
          const auto* s = static_cast<const uint16_t*>(w.scales) + r * groups;
          for (int64_t g = 0; g < groups; ++g) {
            const uint16_t v = real ? s[g] : uint16_t{0};
            std::memcpy(dst + p.chunks * 64 + (g * kPanelRows + lane) * 2, &v, 2);
          }
        } else {
          for (int64_t c = 0; c < p.chunks; ++c) {
            uint8_t* d = dst + c * 64 + lane * 4;
            for (int64_t b = 0; b < 4; ++b) {
              const int64_t col = 4 * c + b;
              const int v = real && col < w.cols ? static_cast<int8_t>(src[col]) : 0;
              d[b] = static_cast<uint8_t>(v + 128);
            }
          }
          const float v = real ? static_cast<const float*>(w.scales)[r] : 0.0f;
          std::memcpy(dst + p.chunks * 64 + lane * 4, &v, 4);
        }
      }
    }
  }
  return out;
}

std::shared_ptr<const PackedQuantMat> pack_quant_matrix(const QuantMatRef& w, int threads) {
  if (best_isa() == Isa::kScalar) return nullptr;  // (the reference reads the on-disk layout)
  return pack_quant_matrix_always(w, threads);
}

QuantMatRef quant_row_slice(const QuantMatRef& w, int64_t r0, int64_t r1) {
  INFERA_ASSERT(0 <= r0 && r0 <= r1 && r1 <= w.rows, "quantized row slice out of range");
  const bool int4 = scheme_is_int4(w.scheme);
  const int64_t qweight_row = int4 ? w.cols / 2 : w.cols;
  const int64_t scales_row = w.groups_per_row() * (int4 ? 2 : 4);  // f16 per group / one f32
  QuantMatRef s(w.scheme, r1 - r0, w.cols, w.group_size, static_cast<const uint8_t*>(w.qweight) + r0 * qweight_row,
                static_cast<const uint8_t*>(w.scales) + r0 * scales_row);
  s.extras = w.extras;
  s.extras_row0 = w.extras_row0 + r0;
  if (w.packed && r0 % kPanelRows == 0 && (r1 % kPanelRows == 0 || r1 == w.rows) && r1 > r0) {
    auto view = std::make_shared<PackedQuantMat>();
    const PackedQuantMat& full = *w.packed;
    view->scheme = full.scheme;
    view->rows = r1 - r0;
    view->cols = full.cols;
    view->group_size = full.group_size;
    view->panels = (view->rows + kPanelRows - 1) / kPanelRows;
    view->chunks = full.chunks;
    view->panel_bytes = full.panel_bytes;
    view->parent = w.packed;
    view->first_panel = r0 / kPanelRows;
    s.packed = std::move(view);
  }
  return s;
}

void unpack_quant_matrix(const PackedQuantMat& p, void* qweight, void* scales) {
  const bool int4 = scheme_is_int4(p.scheme);
  const int64_t groups = p.cols / p.group_size, row_bytes = int4 ? p.cols / 2 : p.cols;
  auto* qw = static_cast<uint8_t*>(qweight);
  for (int64_t r = 0; r < p.rows; ++r) {
    const uint8_t* src = p.panel(r / kPanelRows);
    const int64_t lane = r % kPanelRows;
    uint8_t* row = qw + r * row_bytes;
    if (int4) {
      std::memset(row, 0, static_cast<size_t>(row_bytes));
      for (int64_t col = 0; col < p.cols; ++col) {
        const int64_t c = col / 8, j = col % 8;
        const uint8_t byte = src[c * 64 + lane * 4 + j % 4];
        const uint8_t nib = j < 4 ? (byte & 0x0f) : (byte >> 4);
        row[col / 32 * 16 + (col % 32) % 16] |= (col % 32) < 16 ? nib : static_cast<uint8_t>(nib << 4);
      }
      for (int64_t g = 0; g < groups; ++g)
        std::memcpy(static_cast<uint16_t*>(scales) + r * groups + g, src + p.chunks * 64 + (g * kPanelRows + lane) * 2,
                    2);
    } else {
      for (int64_t col = 0; col < p.cols; ++col) {
        row[col] = static_cast<uint8_t>(static_cast<int8_t>(src[col / 4 * 64 + lane * 4 + col % 4] - 128));
      }
      std::memcpy(static_cast<float*>(scales) + r, src + p.chunks * 64 + lane * 4, 4);
    }
  }
}

void dequantize_row(const QuantMatRef& w, int64_t row, float* out) {
  INFERA_ASSERT(row >= 0 && row < w.rows);
  const QuantExtras* e = w.extras.get();
  if (e != nullptr && e->fp8()) {
    const int64_t ng = e->fp8_groups(w.cols);
    const uint8_t* q = static_cast<const uint8_t*>(w.qweight) + row * w.cols;
    const float* s = e->fp8_scale.data() + (w.extras_row0 + row) * ng;
    for (int64_t t = 0; t < w.cols; ++t) out[t] = fp8_e4m3_value(q[t]) * s[t / e->fp8_group];
    return;
  }
  if (e == nullptr || e->static_act) {
    for (int64_t t = 0; t < w.cols; ++t)
      out[t] = static_cast<float>(ref::qweight_at(w, row, t)) * ref::qscale_at(w, row, t);
    return;
  }
  const int64_t ng = e->corr_group > 0 ? w.cols / e->corr_group : 0;
  for (int64_t t = 0; t < w.cols; ++t) {
    float v = static_cast<float>(ref::qweight_at(w, row, t)) * ref::qscale_at(w, row, t);
    if (ng > 0) v += e->corr[t / e->corr_group * e->corr_rows(w.cols) + w.extras_row0 + row];
    out[e->in_perm.empty() ? t : e->in_perm[t]] = v;
  }
}

}  // namespace infera::kernels
