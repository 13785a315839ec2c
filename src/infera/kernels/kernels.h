// CPU kernels of the forward pass. Activations are always f32; weights are f32, bf16 or
// f16, row-major [n, k] (out_features x in_features, the Hugging Face layout), used in
// place (never converted as a whole).
//
// Every function exists three times: the scalar reference (namespace ref, obviously
// correct, slow, used by tests), and the optimized path, compiled for scalar / AVX2 /
// AVX-512 and picked at run time by infera::best_isa() (INFERA_ISA=scalar|avx2|avx512 caps
// it). The overloads taking an explicit `Isa` run that path (tests use them to check each
// path on one machine); the ones without use the best path of this CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "infera/base/cpu.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/tensor/dtype.h"

namespace infera::kernels {

// Weight matrix W [rows = n, cols = k], row-major, dtype f32 / bf16 / f16, or kGgml: rows
// of llama.cpp blocks of type ggml_type (kernels/ggml_quants.h), computed with int8
// activations as llama.cpp does.
struct MatRef {
  const void* data;
  DType dtype;
  int64_t rows;
  int64_t cols;
  uint32_t ggml_type = 0;  // dtype kGgml only
  // dtype kGgml of a type ggml::can_pack_panels() takes: optionally the same rows repacked
  // (ggml::pack_panels) from row 0, which the avx512 and avx2 paths compute from; data stays valid
  // (it may be dropped from memory and read back from its file), or is null where the rows
  // exist only as panels (a tensor-parallel rank's column slice: model/tensor_parallel.h), which
  // the scalar path and row ranges off a panel boundary then refuse.
  std::shared_ptr<const uint8_t> panels = nullptr;
  // Where they lie: ggml::PanelRef's lane stride (0: one run from panels) and phase.
  int64_t panel_lane = 0;
  int64_t panel_phase = 0;

  // The panels as the kernels address them.
  ggml::PanelRef panel_ref() const { return {panels.get(), panel_lane, panel_phase}; }
  // Takes the panels pack_panels laid out (over lanes or in one run).
  void set_panels(ggml::LanePanels packed) {
    panels = std::move(packed.owner);
    panel_lane = packed.ref.lane;
    panel_phase = packed.ref.phase;
  }
};

// Bytes of one row of w.
int64_t row_bytes(const MatRef& w);

// Rows [n0, n1) of w, as a matrix of their own (no copy: rows are contiguous). Its panels
// are kept (shared) when n0 falls on a panel boundary (ggml::kPanelRows).
MatRef row_slice(const MatRef& w, int64_t n0, int64_t n1);

// True when this CPU (after the INFERA_ISA cap) can run the given path.
bool isa_available(Isa isa);

// y[m, n] = x[m, k] · Wᵀ ; x, y f32 row-major; k == w.cols; n == w.rows. y is overwritten
// (x and y must not overlap). m < 16: GEMV passes streaming W; m >= 16: cache-blocked GEMM
// (W converted to f32 once per panel). Threads split the output columns.
// Throws infera::Error for a weight dtype other than f32/bf16/f16.
void matmul(const float* x, int64_t m, const MatRef& w, float* y);
void matmul(Isa isa, const float* x, int64_t m, const MatRef& w, float* y);

// bf16 weights times m >= 16 rows of x (prefill) on a CPU with AVX512_BF16 (the avx512
// path) may round x to bf16 and multiply in bf16 pairs, each product exact and summed in f32;
// the one extra error is x's rounding, relative 2^-8 per term (llama.cpp's bf16 path rounds
// the same way). Bf16Dot::kAuto (the default; INFERA_BF16_DOT=auto) does so on AMX tiles
// where they are usable, and with vdpbf16ps only where that outruns the f32 FMAs: on AMD
// (Zen 4 / 5: one 512-bit FMA a cycle, vdpbf16ps twice its products); on Intel, whose two
// FMA ports match vdpbf16ps, the f32 products stay (measured there 1.4-1.7x a TinyLlama
// prompt's rate). kOn (INFERA_BF16_DOT=1) takes vdpbf16ps on every AVX512_BF16 CPU; kOff
// (INFERA_BF16_DOT=0, set_bf16_dot(false)) gives the f32 products, as the other paths and
// decode (m < 16) compute them, for tests that need one rounding everywhere.
enum class Bf16Dot { kOff, kOn, kAuto };
void set_bf16_dot(Bf16Dot mode);
Bf16Dot bf16_dot_mode();
inline void set_bf16_dot(bool enabled) { set_bf16_dot(enabled ? Bf16Dot::kOn : Bf16Dot::kOff); }
// Whether bf16 products are allowed at all (not kOff).
bool bf16_dot_enabled();
// Whether prefill off the AMX tiles takes vdpbf16ps (kOn, or kAuto on AMD).
bool bf16_vector_dot();

// That bf16 prefill on AMX tiles (tdpbf16ps, 16 tokens x 16 weight rows x 32 k per
// instruction) where the CPU has AMX-BF16 and Linux grants the tile state
// (amx_unavailable_reason): the same products (x rounded to bf16, each product exact, summed
// in f32 in another order), within the same bound. On by default (INFERA_AMX=0 turns it off
// with the int8 AMX kernels); set_bf16_amx(false) keeps the path off the tiles (vdpbf16ps
// where bf16_vector_dot()), for tests of both.
void set_bf16_amx(bool enabled);
bool bf16_amx_enabled();

// The decode (m < 16) kernels of f32 / bf16 / f16 weights read W as four row streams, each
// also prefetched in software some bytes ahead into L1, or not: the one setting whose best
// value differs between machines (2 KiB ahead won by ~15% on one AMD EPYC and lost by ~20%
// to none on another). Auto (kGemvPrefetchAuto; INFERA_GEMV_PREFETCH=auto, the default)
// times the candidates (none, 512 B, 2 KiB) on the process's first calls of one row of x
// (a decode step: calls of 2-4 rows, such as a short prompt's, are compute bound and favoured
// other distances) over matrices of at least 1 MiB, interleaved, 64 calls each (or 64 MiB
// over at least 3 calls), separately for one thread and for several, and keeps the fastest
// (by the mean log of its calls' bytes per second); until then other calls take 2 KiB. A
// number of bytes (0: none) fixes it. Results do not depend on it.
constexpr int kGemvPrefetchAuto = -1;
void set_gemv_prefetch(int bytes);  // kGemvPrefetchAuto (restarts the timing) or bytes >= 0
// The distance in bytes the next decode call with `threads` threads takes (0: none), and
// whether it is settled (fixed, or auto and timed).
struct GemvPrefetch {
  int bytes;
  bool settled;
};
GemvPrefetch gemv_prefetch_for(int threads);
// In words, for sysinfo and the benchmarks.
std::string gemv_prefetch_text();

// The same for GGUF weights repacked into panels (ggml::PanelPrefetch: a decode step's lines
// ahead into L1, into L2 only, or none; the values do not depend on it): auto
// (INFERA_GGUF_PREFETCH=auto, the default) times the three per tensor type and thread bucket
// as above (Q4_K on a Zen 4 EPYC: L2 1.15x L1 at one thread, 1.1-1.35x at two; Q4_0: none
// 1.2x L1); l1 / l2 / none fix it. set_gguf_prefetch(-1) is auto (restarts the timing), else a
// PanelPrefetch value; gguf_prefetch_for gives the mode decided for the type and calls of
// `bytes` of weights (-1: not yet). Calls of 256 KiB to 2 MiB (a MoE's experts) are timed
// apart from larger ones, and a trial ends early for matrices that stream much (kernels.cpp).
void set_gguf_prefetch(int mode);
int gguf_prefetch_for(uint32_t type, int threads, int64_t bytes = int64_t{4} << 20);
std::string gguf_prefetch_text();

// The matmul kernels the given path runs for weights of dtype (f32, bf16, f16), prefill
// and decode, in words (`infera sysinfo`, benchmarks).
std::string matmul_path(Isa isa, DType dtype);

// Output columns [n0, n1) only (rows n0..n1 of W): y[i * ldy + (j - n0)] for j in [n0, n1),
// i < m (tensor parallel shards, experts). ldy >= n1 - n0.
void matmul_rows(const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y, int64_t ldy);
void matmul_rows(Isa isa, const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y, int64_t ldy);

// One decode step of matvec_many: y[j - r0] = x · W[j, :] for rows j in [r0, r1) (r1 < 0: to
// the last row) of *w.
struct MatVec {
  const float* x = nullptr;
  const MatRef* w = nullptr;
  float* y = nullptr;
  int64_t r0 = 0, r1 = -1;

  int64_t end() const { return r1 < 0 ? w->rows : r1; }  // r1, resolved
};
// The steps (one activation row each), each with the values matmul_rows gives it. Where every
// step can be shared (matvec_shares), in one parallel region whose threads share all the
// steps' panels (ggml::matvec_many): a MoE token's experts, or matrices that read one input,
// stream as one matrix instead of a region and a wait each; its prefetch mode is timed as
// matmul_rows's (gguf_prefetch), apart. Else one matmul_rows call per step, in order.
void matvec_many(std::span<const MatVec> steps);
void matvec_many(Isa isa, std::span<const MatVec> steps);
// Whether matvec_many shares out a step over rows [r0, ...) of w on this path: a GGUF matrix
// with panels (ggml::can_pack_panels) over lanes, as a model lays them (panels in one run keep
// their own calls, which read them as 16-panel streams), r0 on a panel boundary, the avx512 or
// avx2 path.
bool matvec_shares(Isa isa, const MatRef& w, int64_t r0 = 0);
bool matvec_shares(const MatRef& w, int64_t r0 = 0);

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * (w + w_offset); x, y [rows, n];
// in place allowed (x == y). w_offset = 1 for norms stored as (1 + w) (Gemma, Qwen3-Next).
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, float w_offset = 0.0f);
void rmsnorm(Isa isa, const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
             float w_offset = 0.0f);

// gate[i] = silu(gate[i]) * up[i], i < n.
void silu_mul(float* gate, const float* up, int64_t n);
void silu_mul(Isa isa, float* gate, const float* up, int64_t n);

// In place, numerically stable (max subtracted first). n >= 1.
void softmax(float* x, int64_t n);
void softmax(Isa isa, float* x, int64_t n);

// y += x.
void add(float* y, const float* x, int64_t n);
void add(Isa isa, float* y, const float* x, int64_t n);

// RoPE, NeoX (rotate_half) pairing: pairs (i, i + rot_dim/2) for i < rot_dim/2 within each
// head; dims >= rot_dim untouched. x: [n_tokens, n_heads, head_dim], in place;
// positions[n_tokens]; inv_freq[rot_dim/2] precomputed by the model (scaling applied);
// attn_factor multiplies cos and sin (YaRN mscale; 1 otherwise). rot_dim even, <= head_dim.
void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* positions,
               const float* inv_freq, float attn_factor);
void rope_neox(Isa isa, float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
               const int32_t* positions, const float* inv_freq, float attn_factor);

// One sequence's view of a paged KV cache. K/V are stored as f32, bf16 or int8 (dtype);
// the kernels convert to f32 in registers. int8 rows carry one f32 scale per (token, KV
// head): value = scale * q, q in [-127, 127] (store_kv_rows below writes them).
// Pool layout: [num_blocks, n_kv_heads, block_size, head_dim]: within a block each KV head's
// rows are contiguous, so attention streams one head's keys of a page as one run of
// block_size * head_dim elements (kv_row() gives a row's index).
struct PagedKv {
  const void* k_pool;  // [num_blocks, n_kv_heads, block_size, head_dim] of dtype
  const void* v_pool;  // same layout
  int64_t block_size, n_kv_heads, head_dim;
  // Block ids of this sequence, in order: token t lives in block_table[t / block_size],
  // slot t % block_size.
  const int32_t* block_table;
  DType dtype = DType::kF32;  // kF32, kBF16 or kI8
  const float* k_scales = nullptr;  // int8 only: [num_blocks, n_kv_heads, block_size]
  const float* v_scales = nullptr;  // same layout
};

// The row of (slot, KV head) in a pool (PagedKv's layout), slot = block * block_size + offset:
// its elements start at kv_row(...) * head_dim, an int8 pool's scale is scales[kv_row(...)].
inline int64_t kv_row(int64_t slot, int64_t head, int64_t block_size, int64_t n_kv_heads) {
  return (slot / block_size * n_kv_heads + head) * block_size + slot % block_size;
}

// Writes n_rows rows of K or V (each [n_kv_heads, head_dim] f32, `src_stride` floats apart)
// into slots of a pool of `dtype`: head h of row i goes to row kv_row(slots[i], h, ...).
// bf16: rounded to nearest even. int8: per (token, KV head) symmetric scale = max|x| / 127
// into scales[kv_row(...)], values round(x / scale), so each element is off by at most
// scale / 2 = max|x| / 254 of its head row. A zero row stores scale 0.
void store_kv_rows(DType dtype, const float* src, int64_t src_stride, int64_t n_rows, const int64_t* slots,
                   int64_t block_size, int64_t n_kv_heads, int64_t head_dim, void* dst, float* scales);
// The f32 value of element `index` of a pool of `dtype` (index counts elements from the
// pool's start; scales as above). Tests and references.
float load_kv_value(DType dtype, const void* pool, const float* scales, int64_t index, int64_t head_dim);

// q: [n_tokens, n_heads, head_dim] (head_dim == kv.head_dim). Query token i is at absolute
// position pos0 + i and attends causally to keys [0, pos0 + i] (already in the cache).
// GQA: query head h uses kv head h / (n_heads / n_kv_heads). out: [n_tokens, n_heads,
// head_dim]. scale is typically 1/sqrt(head_dim). Decode with a long context is split over
// key chunks (flash-decoding) so every thread works even for one sequence.
// Throws infera::Error when n_heads is not a multiple of kv.n_kv_heads, or for a KV dtype
// other than f32/bf16/int8 (int8 without scales).
void attention_paged(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const PagedKv& kv, float scale,
                     float* out);
void attention_paged(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const PagedKv& kv,
                     float scale, float* out);

// Scalar references: straightforward loops, double accumulators; the truth tests compare
// the optimized paths against. Same contracts as above.
namespace ref {

void matmul(const float* x, int64_t m, const MatRef& w, float* y);
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, float w_offset = 0.0f);
void silu_mul(float* gate, const float* up, int64_t n);
void softmax(float* x, int64_t n);
void add(float* y, const float* x, int64_t n);
void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* positions,
               const float* inv_freq, float attn_factor);
// k, v: CONTIGUOUS [n_ctx, n_kv_heads, head_dim]; n_ctx >= pos0 + n_tokens. Otherwise as
// attention_paged.
void attention_contiguous(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* k,
                          const float* v, int64_t n_ctx, int64_t n_kv_heads, int64_t head_dim, float scale, float* out);

// One weight element as f32 (any supported dtype).
float weight_at(const MatRef& w, int64_t row, int64_t col);

}  // namespace ref

}  // namespace infera::kernels
