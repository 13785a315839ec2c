// Quantized linear layers: integer weights with f32 scales, computed without ever
// dequantizing the matrix (see docs/quantization.md for the on-disk format).
//
// Schemes (symmetric, no zero points):
//   W8A8  int8 weights [n, k], one f32 scale per output row; activations quantized per
//         token to int8 on the fly; int32 dot products.
//   W4A8  int4 weights in groups of `group_size` (32, 64 or 128) along k, one f16 scale per
//         group; activations per token to int8; int32 dot products per group.
//   W4A16 the same int4 weights; f32 activations (int4 groups dequantized in registers).
//
// int4 packing (llama.cpp Q4_0 order, so a group-32 matrix is exactly Q4_0): each row is
// k/2 bytes; within every run of 32 columns starting at c0, byte c0/2 + j holds column
// c0 + j in its low nibble and column c0 + j + 16 in its high nibble (j < 16). A nibble q
// in [0, 15] stands for (q - 8) * scale.
//
// VNNI (vpdpbusd) multiplies u8 x s8. W8A8 feeds activations as u8 = q + 128 and subtracts
// 128 * (sum of the row's weights), that sum itself computed by the kernel with a second
// vpdpbusd against a vector of ones (nothing is precomputed at load). W4A8 feeds the
// nibbles (already unsigned) against the s8 activations and subtracts 8 * (sum of the
// group's activations), which the activation quantizer computes once per token. AVX2 uses
// maddubs/madd (with the sign trick for W8A8: |w| x sign(x, w) can't saturate int16).
//
// Paths: ref (obviously correct: int64/double), scalar (= ref), AVX2, AVX-512 VNNI. Every
// path quantizes activations identically (bit-exact), so the integer dot products agree
// exactly; only the f32 accumulation order over groups differs.
//
// Repacked layout (PackedQuantMat, pack_quant_matrix): the on-disk layout is row-major, so
// a GEMV over it keeps one accumulator per row and needs a horizontal sum per row. At load
// the SIMD paths instead get a copy in panels of 16 rows, one 4-byte lane per row, so a
// 512-bit vpdpbusd accumulates 16 rows at once against 4 broadcast activation bytes (AVX2:
// two 256-bit halves of 8 rows, vpmaddubsw) and no horizontal sums are needed. Panel p (rows 16p .. 16p+15), 64-byte
// aligned:
//   int4  [cols / 8 chunks of 64 B][groups x 16 f16 scales], padded to 64 B. Chunk c (columns
//         8c .. 8c+7): lane r (row 16p + r), byte b = nibble(col 8c+b) | nibble(col 8c+4+b) << 4.
//   w8a8  [ceil(cols / 4) chunks of 64 B][16 f32 scales]. Chunk c: lane r, byte b = u8(w[row,
//         4c+b] + 128) (columns past `cols`: 128, i.e. w = 0); the kernel subtracts 128 * sum(x).
// Rows past `rows` in the last panel are zero weights with scale 0. Still int4/int8 plus
// f16/f32 scales (the same bytes as on disk, give or take the padding): nothing is
// dequantized. It lives in anonymous memory advised MADV_HUGEPAGE (fewer TLB misses than a
// 4 KiB file mapping: ~25% more read bandwidth on the machines measured).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "infera/base/cpu.h"
#include "infera/base/membw.h"
#include "infera/kernels/kernels.h"

namespace infera::kernels {

struct PackedQuantMat;
struct QuantExtras;

enum class QuantScheme : uint8_t { kW8A8, kW4A8, kW4A16 };

inline bool scheme_is_int4(QuantScheme s) { return s != QuantScheme::kW8A8; }
inline bool scheme_quantizes_activations(QuantScheme s) { return s != QuantScheme::kW4A16; }
std::string_view scheme_name(QuantScheme s);  // "w8a8", "w4a8", "w4a16"

// A quantized weight matrix [rows = n, cols = k], used in place (mmapped).
struct QuantMatRef {
  QuantMatRef() = default;
  QuantMatRef(QuantScheme scheme_, int64_t rows_, int64_t cols_, int64_t group_size_, const void* qweight_,
              const void* scales_, std::shared_ptr<const PackedQuantMat> packed_ = nullptr)
      : scheme(scheme_),
        rows(rows_),
        cols(cols_),
        group_size(group_size_),
        qweight(qweight_),
        scales(scales_),
        packed(std::move(packed_)) {}

  QuantScheme scheme = QuantScheme::kW8A8;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;  // W8A8: == cols (per channel); int4: 32, 64 or 128
  const void* qweight = nullptr;  // W8A8: int8 [rows, cols]; int4: uint8 [rows, cols / 2]
  const void* scales = nullptr;  // W8A8: f32 [rows]; int4: f16 [rows, cols / group_size]
  // Optional repacked copy of the same matrix (pack_quant_matrix); the AVX-512 and AVX2 paths
  // compute from it when present, the scalar path and dequantize_row from the fields above
  // (which must stay valid). Shared: copies of a LinearWeight share one packed copy.
  std::shared_ptr<const PackedQuantMat> packed;
  // Terms a checkpoint quantized by another tool needs beyond the symmetric scheme (act-order
  // permutation, zero points, static activations; QuantExtras below); nullptr for Infera's own.
  // Its rows are indexed from extras_row0 (a row slice shares its parent's).
  std::shared_ptr<const QuantExtras> extras;
  int64_t extras_row0 = 0;

  int64_t groups_per_row() const { return cols / group_size; }
  int64_t weight_bytes() const;  // qweight + scales
};

// What pre-quantized checkpoints (GPTQ, AWQ, msModelSlim: model/prequant_*.h) add to a scheme
// whose weights and scales are otherwise Infera's own layout, kept exact instead of requantized:
// - in_perm [cols]: the matrix's column j multiplies x[:, in_perm[j]] (GPTQ act-order: columns
//   sorted by group so that groups are contiguous);
// - zero points, as a correction per group of corr_group (permuted) columns: with
//   W = s·(q − z) = s·(q − 8) + s·(8 − z), the kernel computes the first term and
//   y[r] += Σ_g corr[g, r] · Σ_{j in g} x'[j] adds the second (corr = s·(8 − z), f32), corr
//   stored group-major [cols / corr_group, corr_rows()] so that one token's correction is a
//   vectorized y += sum_g · corr[g, :] per group (row-major, a row of 8 groups ran scalar);
// - static activations (msModelSlim W8A8, w8a8 only): x_q = sat_int8(round(x / in_scale +
//   in_offset)) with calibrated constants, y[r] = out_scale[r] · (Σ_j x_q[j]·w[r, j] + qbias[r])
//   in int32; the QuantMatRef scales are then out_scale / in_scale (dequantize_row).
// - FP8 weights (W8A16: float8 e4m3 checkpoints decoded in the kernel, f32 activations), when
//   fp8_group > 0: qweight then holds e4m3 bytes [rows, cols], not int8, and W[r, c] =
//   e4m3(qweight[r, c]) · fp8_scale[r, c / fp8_group] (the last group of a row may be shorter:
//   block scales with a ragged edge); the scheme says w8a8 (one byte per weight, rows contiguous,
//   so row slices and tensor-parallel row shards take it as they take int8) and scales points at
//   fp8_scale (read by nothing else). No packed copy; paths: ref::fp8_matmul (scalar), AVX2 and
//   AVX-512 (kernels/cpu/fp8_impl.h).
// The fused multi-matrix pass (qmatmul_multi) takes a matrix whose only extra is the zero-point
// correction (added after the pass); other extras compute the matrix apart.
struct QuantExtras {
  std::vector<int32_t> in_perm;  // [cols] or empty
  int64_t corr_group = 0;  // columns per correction group; 0: no correction
  std::vector<float> corr;  // [cols / corr_group, corr_rows()]: corr[g * corr_rows() + row]
  bool static_act = false;
  float in_scale = 1.0f;
  float in_offset = 0.0f;
  std::vector<float> out_scale;  // [rows]
  std::vector<int32_t> qbias;  // [rows]
  int64_t fp8_group = 0;  // columns per FP8 scale; 0: the weights are integers
  std::vector<float> fp8_scale;  // [rows, ceil(cols / fp8_group)]
  // Bytes these terms add for `rows` rows (read per token).
  int64_t bytes(int64_t rows, int64_t cols) const;
  // The rows corr holds (its stride between groups); 0 without a correction.
  int64_t corr_rows(int64_t cols) const {
    return corr_group > 0 ? static_cast<int64_t>(corr.size()) / (cols / corr_group) : 0;
  }
  int64_t static_act_rows() const { return static_cast<int64_t>(std::min(out_scale.size(), qbias.size())); }
  bool fp8() const { return fp8_group > 0; }
  int64_t fp8_groups(int64_t cols) const { return fp8_group > 0 ? (cols + fp8_group - 1) / fp8_group : 0; }
};

// float8 e4m3fn (sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities; 0x7f and
// 0xff are NaN) to f32.
float fp8_e4m3_value(uint8_t v);
// Whether w holds FP8 weights (QuantExtras::fp8_group).
inline bool quant_is_fp8(const QuantMatRef& w) { return w.extras && w.extras->fp8(); }

constexpr int64_t kPanelRows = 16;  // rows per panel of the repacked layout

// The repacked layout described at the top of this file.
struct PackedQuantMat {
  QuantScheme scheme = QuantScheme::kW8A8;
  int64_t rows = 0, cols = 0, group_size = 0;
  int64_t panels = 0;  // ceil(rows / kPanelRows)
  int64_t chunks = 0;  // 64-byte weight chunks per panel (int4: cols / 8; w8a8: ceil(cols / 4))
  int64_t panel_bytes = 0;  // chunks * 64 + scales, rounded up to 64
  HugePageBuffer storage;  // [panels, panel_bytes]; empty in a row slice
  // A row slice (quant_row_slice) shares its parent's panels from panel `first_panel` on.
  std::shared_ptr<const PackedQuantMat> parent;
  int64_t first_panel = 0;

  const uint8_t* panel(int64_t p) const {
    return parent ? parent->panel(first_panel + p) : storage.data() + p * panel_bytes;
  }
  uint8_t* panel(int64_t p) { return storage.data() + p * panel_bytes; }
};

// The repacked copy of w (checked first), packed by `threads` OpenMP threads (0: the
// kernels' count). nullptr when no kernel uses one: the kernel path is the scalar reference
// (no AVX2 either, or INFERA_ISA=scalar), or a w8a8 matrix too wide for int32 sums of u8 x s8
// (cols > 65536). Memory: about w.weight_bytes() more, in huge pages.
std::shared_ptr<const PackedQuantMat> pack_quant_matrix(const QuantMatRef& w, int threads = 0);
// Same, regardless of the CPU (tests).
std::shared_ptr<const PackedQuantMat> pack_quant_matrix_always(const QuantMatRef& w, int threads = 0);
// Rows [r0, r1) of w as a matrix of their own (a fused MoE tensor's expert, a tensor-parallel
// shard): pointers into the same on-disk data, and when w has a packed copy and r0 and r1 fall
// on panel boundaries (multiples of kPanelRows, or r1 == rows) a packed view sharing it;
// otherwise no packed copy (the slice computes from the on-disk layout).
QuantMatRef quant_row_slice(const QuantMatRef& w, int64_t r0, int64_t r1);
// Writes the on-disk layout back (qweight, scales as in QuantMatRef): the round-trip check.
void unpack_quant_matrix(const PackedQuantMat& p, void* qweight, void* scales);

// Either a plain f32/bf16/f16 matrix or a quantized one: what a model binds per linear
// layer. `name` is the checkpoint tensor name (for logs and activation observers).
struct LinearWeight {
  MatRef dense{};
  QuantMatRef quant{};
  bool quantized = false;
  std::string_view name;

  int64_t rows() const { return quantized ? quant.rows : dense.rows; }
  int64_t cols() const { return quantized ? quant.cols : dense.cols; }
  int64_t bytes() const;
};

inline LinearWeight dense_linear(const MatRef& m, std::string_view name = {}) {
  LinearWeight w;
  w.dense = m;
  w.name = name;
  return w;
}

// Throws infera::Error when the shape, group size or pointers are inconsistent.
void check_quant_matrix(const QuantMatRef& w);

// y[m, n] = x[m, k] · Wᵀ for either kind of weight (matmul() or qmatmul()).
void linear(const float* x, int64_t m, const LinearWeight& w, float* y);
void linear(Isa isa, const float* x, int64_t m, const LinearWeight& w, float* y);

// y_i[m, n_i] = x[m, k] · W_iᵀ for several weights that share their input (q/k/v, gate/up),
// the same results as one linear() per weight. For one token (m = 1), the quantized W_i
// with packed copies of one scheme, k and group size are computed in one pass on the AVX-512
// and AVX2 paths: x quantized once, the panels of all of them swept in one parallel region (no small
// matrix left to run alone); any other weight is computed on its own.
void linear_multi(const float* x, int64_t m, std::span<const LinearWeight* const> ws, std::span<float* const> ys);
void linear_multi(Isa isa, const float* x, int64_t m, std::span<const LinearWeight* const> ws,
                  std::span<float* const> ys);
// Whether linear_multi on `isa` computes two or more of these weights in one pass (tests).
bool linear_multi_fuses(Isa isa, int64_t m, std::span<const LinearWeight* const> ws);
// The same for quantized matrices only, without the calibration observer (MoE experts).
void qmatmul_multi(const float* x, int64_t m, std::span<const QuantMatRef* const> ws, std::span<float* const> ys);
void qmatmul_multi(Isa isa, const float* x, int64_t m, std::span<const QuantMatRef* const> ws,
                   std::span<float* const> ys);

// Calibration hook: when set, linear() first hands every input to the observer (the
// quantizer collects per-channel activation statistics this way, through any model's
// ordinary forward). Process-wide; set it only while nothing else runs linear(). Pass an
// empty function to remove it.
using LinearObserver = std::function<void(std::string_view weight_name, const float* x, int64_t m, int64_t k)>;
void set_linear_observer(LinearObserver observer);

// The quantized matmul kernels `isa` runs, in words (`infera sysinfo`): Infera's schemes (and
// whether AMX tiles are in use), and llama.cpp's block types of GGUF files.
std::string quant_matmul_path(Isa isa);
std::string ggml_matmul_path(Isa isa);

// y[m, n] = x[m, k] · dequant(W)ᵀ, computed in the scheme's precision. x, y f32.
// With w.packed set, the AVX-512 and AVX2 paths run the panel kernels (GEMV for m = 1, a
// tiled GEMM of up to 8 tokens otherwise, AMX tiles for W8A8 prefill where available);
// results are the same as without it (integer parts exactly, floats within the stated bound).
void qmatmul(const float* x, int64_t m, const QuantMatRef& w, float* y);
void qmatmul(Isa isa, const float* x, int64_t m, const QuantMatRef& w, float* y);

// W8A8 prefill on AMX tiles (tdpbsud) where the CPU has AMX-INT8 and the OS grants it
// (results identical to the VNNI GEMM). On by default; set_quant_amx(false) forces the VNNI
// GEMM (tests compare both). Process-wide; not to be changed while qmatmul runs.
void set_quant_amx(bool enabled);
bool quant_amx_enabled();

// The AVX2 path's W8A8 kernels use AVX-VNNI's 256-bit vpdpbusd (Intel client CPUs from Alder
// Lake, E-core Xeons) where the CPU has it: nullptr then, else why not ("not on this
// CPU", "off (INFERA_AVXVNNI=0)", or "off" after set_quant_avxvnni(false)). The same integers
// and results either way. set_quant_avxvnni(false) forces vpmaddubsw (tests compare both);
// process-wide, not to be changed while qmatmul runs.
void set_quant_avxvnni(bool enabled);
const char* avxvnni_unavailable_reason();

// Row `row` of W dequantized to f32 [cols] (quantized embedding tables).
void dequantize_row(const QuantMatRef& w, int64_t row, float* out);

// Per-token activation quantization shared by every path (exposed for tests):
// scale[i] = max|x[i, :]| / 127, q[i, t] = round_half_even(x[i, t] * (127 / max)) in
// [-127, 127], q padded with zeros to ld >= k; block_sums[i, b] = sum of q[i, 32b .. 32b+31]
// (when block_sums != nullptr; ld and k multiples of 32 then). An all-zero row has scale 0.
void quantize_activations(Isa isa, const float* x, int64_t m, int64_t k, int8_t* q, int64_t ld, float* scale,
                          int32_t* block_sums);

namespace ref {

void qmatmul(const float* x, int64_t m, const QuantMatRef& w, float* y);
void quantize_activations(const float* x, int64_t m, int64_t k, int8_t* q, int64_t ld, float* scale,
                          int32_t* block_sums);
// Integer weight value (already minus 8 for int4) and its scale.
int32_t qweight_at(const QuantMatRef& w, int64_t row, int64_t col);
// FP8 weights (QuantExtras::fp8_group): y = x · Wᵀ in double, W decoded by fp8_e4m3_value.
void fp8_matmul(const float* x, int64_t m, const QuantMatRef& w, float* y);
float qscale_at(const QuantMatRef& w, int64_t row, int64_t col);

}  // namespace ref

}  // namespace infera::kernels
