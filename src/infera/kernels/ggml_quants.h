// llama.cpp's (ggml's) weight block formats: the scalar dequantization reference, bit-exact
// with the format's definition (ggml-quants.c dequantize_row_*: the same f32 products in the
// same order, so every value equals what llama.cpp computes).
//
// A row of n weights is n / block_size consecutive blocks of type_size bytes; blocks hold
// f16 scales (only 2-byte aligned in a file: read with memcpy). Types, numbered as ggml's
// ggml_type (the ids a GGUF file stores):
//   F32 0, F16 1, BF16 30: plain elements.
//   Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, IQ4_NL 20: 32 weights per block, one f16 scale
//     (Q4_1 / Q5_1: and an f16 offset).
//   Q2_K 10, Q3_K 11, Q4_K 12, Q5_K 13, Q6_K 14, IQ4_XS 23: 256-weight super-blocks with
//     sub-block scales packed in 4 to 8 bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "infera/base/cpu.h"
#include "infera/base/membw.h"

namespace infera::kernels::ggml {

enum Type : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

// True when dequantize_row() knows the type.
bool can_dequantize(uint32_t type);
// Weights per block and bytes per block of a type dequantize_row() knows; 0 otherwise.
int64_t block_size(uint32_t type);
int64_t type_size(uint32_t type);
// Bytes of a row of n weights (n a multiple of block_size(type)).
int64_t row_bytes(uint32_t type, int64_t n);

// dst[0, n) = the n weights stored at src. n must be a multiple of block_size(type); throws
// infera::Error for an unknown type or a bad n.
void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);

// Where a matrix's panels (pack_panels) lie, each panel_bytes(type, k) bytes: one run (lane 0:
// panel p at base + p x bytes), or spread over the four lanes of a LaneBuffer (lane: its
// stride): panel p at base + (q % 4) x lane + (q / 4) x bytes with q = phase + p, so that a
// decode step's four consecutive panels are four streams far apart, each running on through
// its lane (a matrix's panels from a panel not a multiple of four on keep their lanes: phase).
struct PanelRef {
  static_assert(LaneBuffer::kLanes == 4, "PanelRef spreads panels over four lanes");
  const uint8_t* base = nullptr;
  int64_t lane = 0;
  int64_t phase = 0;  // (lanes only) 0-3

  PanelRef() = default;
  PanelRef(const uint8_t* run) : base(run) {}  // NOLINT(google-explicit-constructor): one run
  PanelRef(const uint8_t* b, int64_t lane_stride, int64_t first) : base(b), lane(lane_stride), phase(first) {}
  explicit operator bool() const { return base != nullptr; }
  const uint8_t* at(int64_t p, int64_t bytes) const {
    if (lane == 0) return base + p * bytes;
    p += phase;
    return base + (p & 3) * lane + (p >> 2) * bytes;
  }
  // The panels from panel p on, as a matrix's of their own.
  PanelRef from(int64_t p, int64_t bytes) const {
    if (lane == 0) return PanelRef(base + p * bytes);
    p += phase;
    return {base + (p >> 2) * bytes, lane, p & 3};
  }
};

// y[i * ldy + (j - n0)] = x[i, :] · W[j, :] for j in [n0, n1), i < m, with W [rows, k] of
// `type` stored row after row (rows of row_bytes(type, k) bytes), x f32 [m, k]. Computed as
// llama.cpp's CPU backend does: x quantized per block to int8 (Q8_0 for Q4_0 / Q5_0 / Q8_0 /
// IQ4_NL, Q8_1 for Q4_1 / Q5_1, Q8_K for the K types and IQ4_XS), integer block dot
// products, f32 block scales. Every ISA path gives the same values. F32 / F16 / BF16 are
// not handled here (kernels::matmul).
// panels: the same matrix repacked (pack_panels), from its row 0, or null; the avx512 and
// avx2 paths compute from it when n0 is a multiple of kPanelRows (else, and on the scalar
// path, from data): the same values either way. pf: how a decode step (m == 1) over the
// panels prefetches the lines ahead (the values do not depend on it): into L1, into L2
// only, or not at all, where the hardware prefetchers alone keep up. Which is fastest
// differs by machine: kernels::matmul_rows times them (kernels.h, gguf_prefetch).
enum class PanelPrefetch : int { kL1 = 0, kL2 = 1, kNone = 2 };
void matmul_rows(Isa isa, uint32_t type, const void* data, int64_t k, const float* x, int64_t m, int64_t n0, int64_t n1,
                 float* y, int64_t ldy, PanelRef panels = {}, PanelPrefetch pf = PanelPrefetch::kL1);
// Whether matmul_rows() computes with `type`.
bool has_matmul(uint32_t type);

// One decode step of matvec_many: y[j] = x · W[j, :] for j < rows, the rows whose panels
// start at `panels` (a matrix's PanelRef from a panel on: PanelRef::from), W of `type`
// (can_pack_panels) with k columns.
struct PanelMatVec {
  uint32_t type = 0;
  int64_t k = 0;
  const float* x = nullptr;
  PanelRef panels;
  int64_t rows = 0;
  float* y = nullptr;
};
// The steps, each computed as matmul_rows computes one activation row from panels (the same
// values), in one parallel region whose threads share all the steps' panels (base/threads.h
// Shares over their units, step after step): a MoE token's experts, or the matrices that
// read one input, without a region and a wait per matrix. Each distinct x (and activation
// form) is quantized once. The avx512 and avx2 paths only (the panels are theirs).
void matvec_many(Isa isa, std::span<const PanelMatVec> steps, PanelPrefetch pf = PanelPrefetch::kL1);
// Prefill of the avx512 path on AMX int8 tiles (Q8_0 from 8 activation rows, Q4_K / Q5_K
// from 16, Q6_K from 64) where the CPU has them and Linux grants the tile state (base/cpu.h
// amx_unavailable_reason): the same integer sums and f32 steps as the VNNI tiles, so the
// same values. On by default;
// set_ggml_amx(false) forces the VNNI tiles (tests, A/B runs; INFERA_AMX=0 too).
void set_ggml_amx(bool enabled);
bool ggml_amx_enabled();

// Whether quantize_rows() writes `type`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
// IQ4_NL, IQ4_XS.
bool can_quantize(uint32_t type);
// dst = nrows rows of n_per_row weights from src (f32 [nrows, n_per_row]) in `type` blocks,
// byte for byte what llama.cpp's ggml_quantize_chunk writes (ggml_quantize.cpp): its
// reference quantizers when imatrix is null, else its importance-weighted ones with imatrix
// [n_per_row] (one weight per column, as llama-quantize passes it; Q8_0 ignores it).
// n_per_row must be a multiple of block_size(type). Returns the bytes written.
int64_t quantize_rows(uint32_t type, const float* src, void* dst, int64_t nrows, int64_t n_per_row,
                      const float* imatrix = nullptr);

// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS matrices repacked at load for the
// avx512 path (AVX-512 VNNI), as llama.cpp's AMX buffer repacks them: rows in panels of kPanelRows, so that one vector
// load holds a block's weights of 16 rows and vpdpbusd sums them against an activation's four quants broadcast, one row
// per 32-bit lane, with no horizontal reduction and no scale gathering. Panel p holds rows 16p..16p+15 (past the last
// row: zero scales and nibbles) of nb = k / 32 blocks: first the blocks' f16 scales, 16 per block in row order (32
// bytes a block; the region padded to a multiple of 64 bytes), then the blocks' nibbles, 256 bytes a block in four
// 64-byte parts: byte 4r
// + e of part L holds the index of weight 8L + e of row r in its low nibble and of weight 8L + 4 + e in its high one
// (Q4_0: the quant q, the weight d (q - 8); IQ4_NL: the index into kIq4nlValues). So the low nibbles of part L are the
// block's dword 2L of every row, the high ones dword 2L + 1. Q8_0 the same with 512 bytes a block, its eight dwords in
// order (an AMX B tile of the 16 rows). Same bytes as the rows'. Q4_1 / Q5_1 add the 16 rows' f16 offsets m after each
// block's scales (64 bytes a block); Q5_0 / Q5_1 add after each block's nibbles its fifth bits as eight 64-bit masks,
// mask 2L + h (h: the low, then the high nibbles of part L) with bit 4r + e for byte 4r + e.
// The K types and IQ4_XS keep per 256-weight super-block their 16 rows' d (Q4_K, Q5_K, Q2_K: then dmin; 64 bytes of
// scales, else 32) in the scales, and lay out its quant bytes in the order a decode step reads them, front to back (a
// field read kilobytes ahead of the quants it serves, as the sub-scales and extra bits once were, held the hardware
// prefetchers back: Q4_K's decode step from memory 16-17 against 22-23 GB/s with no software prefetch, kernels_bench,
// Zen 4, one thread): first the sub-blocks' scales (panel_k_head bytes), then per 32-weight chunk c (panel_k_chunk)
// its quants with their extra bits beside them. Q4_K: the 6-bit
// scales as bytes [s][row] (128) and mins as bytes [pair p][row][s % 2] (128), then per sub-block s its nibbles as a
// 32-weight block's (256 bytes). Q5_K: Q4_K's, each sub-block's nibbles followed by its fifth bits as a 64-byte
// vector of eight bit planes (bit m of byte 4r + e: that of byte 4r + e of the sub-block's operand vector m, part
// m / 2's low nibbles for even m, its high ones for odd). Q6_K has two layouts (q6k_panels_beside, below: which is
// faster differs by machine). Apart: its 6-bit quants u = w + 32 per chunk c, their low four bits as a 32-weight
// block's nibbles (256 bytes a chunk, 2048), then their top two bits as two 64-byte vectors a chunk (1024: vector v's
// byte 4r + e holds in bits 2f, 2f + 1 those of weight 32c + 16v + 4f + e of row r, so vector v is the 16-weight
// sub-block 2c + v), then the 16 signed sub-scales as bytes [s][row] (256). Beside: the same fields, the sub-scales
// first (256), then per chunk its nibbles and right after them its two top-bit vectors (384 bytes a chunk). IQ4_XS: the
// signed scales (ls - 32) as bytes [s][row] (128), then per sub-block its nibbles as an IQ4_NL block's (256). Q3_K: the
// 16 signed sub-scales as bytes [s][row] (256), then per chunk c the quants' two low bits as two 64-byte vectors (as
// Q6_K's top bits) and their third bits as a 64-byte vector of eight bit planes (bit o of byte 4r + e: weight
// 32c + 4o + e, so a shift and a mask put plane o beside the two low bits of operand vector o).
// Q2_K: the sub-blocks' scale / min bytes as stored, [s][row] (256), then per chunk its quants as Q3_K's low bits
// (128). Same bytes as the rows' (Q5_K, Q3_K, Q2_K: the same bits).
constexpr int64_t kPanelRows = 16;
bool can_pack_panels(uint32_t type);
// A panel block's bytes (32 weights; 256 for the K types and IQ4_XS) as laid out above: its 16
// rows' scales, then its quants. pack_panels lays panels out by these and the kernels read them
// by these.
constexpr int panel_scale_stride(uint32_t type) {
  return type == kQ4_1 || type == kQ5_1 || type == kQ2_K || type == kQ4_K || type == kQ5_K ? 64 : 32;
}
// A K type's (or IQ4_XS's) super-block of panel quants, as laid out above: the sub-blocks' scales (and mins) at
// panel_k_scales (the first panel_k_head bytes but for Q6_K's apart layout), per 32-weight chunk c its quants at
// panel_k_chunk and their extra bits (Q5_K's fifth bits, Q6_K's top bits, Q3_K's third bits) at panel_k_bits.
constexpr int panel_k_head(uint32_t type) { return type == kIQ4_XS ? 128 : 256; }
// A chunk's quants' bytes (the low bits: nibbles or two-bit fields) and extra bits' bytes.
constexpr int panel_k_low_bytes(uint32_t type) { return type == kQ2_K || type == kQ3_K ? 128 : 256; }
constexpr int panel_k_bit_bytes(uint32_t type) { return type == kQ6_K ? 128 : type == kQ5_K || type == kQ3_K ? 64 : 0; }
// (q6_beside: Q6_K's other layout, q6k_panels_beside)
constexpr int panel_k_scales(uint32_t type, bool q6_beside = false) {
  return type == kQ6_K && !q6_beside ? 8 * (256 + 128) : 0;
}
constexpr int panel_k_chunk(uint32_t type, int c, bool q6_beside = false) {
  if (type == kQ6_K)
    return q6_beside ? panel_k_head(type) + (panel_k_low_bytes(type) + panel_k_bit_bytes(type)) * c
                     : panel_k_low_bytes(type) * c;
  return panel_k_head(type) + (panel_k_low_bytes(type) + panel_k_bit_bytes(type)) * c;
}
constexpr int panel_k_bits(uint32_t type, int c, bool q6_beside = false) {
  if (type == kQ6_K && !q6_beside) return 8 * 256 + 128 * c;
  return panel_k_chunk(type, c, q6_beside) + panel_k_low_bytes(type);
}
// Which of its two layouts Q6_K's panels take (pack_panels writes it, the kernels read it):
// apart (false), as above, or beside (true): the sub-scales first, then per chunk c its 256
// bytes of nibbles and its 128 bytes of top bits (at 256 + 384 c), so a decode step reads a
// super-block front to back. (With the sub-scales after the chunks, as apart has them, each
// sub-block's read of its scales jumped 3 KB ahead and back, and the hardware prefetcher did
// not follow the streams: kernels_bench 2048 x 5632 from memory, Zen 2, one | two threads,
// 15.3 | 28.5 GB/s, scales first 17.2 | 32.2, 18.4 | 33.9 with the AVX2 decode step a panel's
// chains at a time; with no software prefetch 10.3 against 18.2.) Which is faster differs
// by machine (docs/model.md): INFERA_Q6K_PANELS=auto (the default) takes apart on CPUs with
// the avx512 kernel path (AVX-512 VNNI and BF16) and beside on the others; apart / beside fix
// it. The values are the same.
bool q6k_panels_beside();
// Tests only: the layout panels packed from now on take (-1: back to the setting). Panels
// packed before are read wrongly after a change.
void set_q6k_panels_beside(int beside);
constexpr int panel_quant_stride(uint32_t type) {
  switch (type) {
    case kQ8_0: return 512;
    case kQ5_0:
    case kQ5_1: return 320;
    case kQ2_K:
    case kQ3_K:
    case kQ4_K:
    case kQ5_K:
    case kQ6_K:
    case kIQ4_XS: return panel_k_head(type) + 8 * (panel_k_low_bytes(type) + panel_k_bit_bytes(type));
    default: return 256;  // Q4_0, Q4_1, IQ4_NL
  }
}
// Where things are in a panel of k-weight rows (k a multiple of 32): block b's scales at
// scale_stride * b, its quants at scale_bytes + quant_stride * b; `bytes` in all.
struct PanelLayout {
  int64_t blocks, scale_stride, scale_bytes, quant_stride, bytes;
};
PanelLayout panel_layout(uint32_t type, int64_t k);
int64_t panel_bytes(uint32_t type, int64_t k);
// The panels of rows [0, rows) of a matrix stored row after row at data (64-byte aligned),
// packed by `threads` OpenMP threads (0: all).
std::shared_ptr<const uint8_t> pack_panels(uint32_t type, const void* data, int64_t rows, int64_t k, int threads = 0);
// The same panels laid over the lanes of `lanes` (PanelRef) where it has room (else one run, as
// above); `owner` keeps the memory (and so `lanes`) alive. The values computed from either are
// the same.
struct LanePanels {
  std::shared_ptr<const uint8_t> owner;
  PanelRef ref;
};
LanePanels pack_panels(uint32_t type, const void* data, int64_t rows, int64_t k,
                       const std::shared_ptr<LaneBuffer>& lanes, int threads = 0);
// Whether a model's GGUF panels go over lanes (INFERA_PANEL_LANES, default on).
bool panel_lanes_enabled();

// IQ4_NL / IQ4_XS: the 16 non-uniform levels a 4-bit index selects.
extern const int8_t kIq4nlValues[16];

}  // namespace infera::kernels::ggml
