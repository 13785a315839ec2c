#include "infera/kernels/ggml_quants.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/base/membw.h"
#include "infera/base/options.h"
#include "infera/base/threads.h"
#include "infera/tensor/dtype.h"

namespace infera::kernels::ggml {

const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

constexpr int64_t kQK = 32;  // weights per block of the 32-weight types
constexpr int64_t kQKK = 256;  // weights per K-quant super-block

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block (12 packed bytes).
void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// ---- 32-weight blocks ----

void row_q4_0(const uint8_t* b, float* y, int64_t nb) {  // d, qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 18, y += kQK) {
    const float d = half_at(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void row_q4_1(const uint8_t* b, float* y, int64_t nb) {  // d, m, qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 20, y += kQK) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

void row_q5_0(const uint8_t* b, float* y, int64_t nb) {  // d, qh[4], qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 22, y += kQK) {
    const float d = half_at(b);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + 16] = static_cast<float>(hi - 16) * d;
    }
  }
}

void row_q5_1(const uint8_t* b, float* y, int64_t nb) {  // d, m, qh[4], qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 24, y += kQK) {
    const float d = half_at(b), m = half_at(b + 2);
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + 16] = static_cast<float>(hi) * d + m;
    }
  }
}

void row_q8_0(const uint8_t* b, float* y, int64_t nb) {  // d, qs[32] int8
  for (int64_t i = 0; i < nb; ++i, b += 34, y += kQK) {
    const float d = half_at(b);
    const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

void row_iq4_nl(const uint8_t* b, float* y, int64_t nb) {  // d, qs[16]
  for (int64_t i = 0; i < nb; ++i, b += 18, y += kQK) {
    const float d = half_at(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      y[j + 16] = d * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

// ---- 256-weight super-blocks ----

void row_q2_k(const uint8_t* b, float* y, int64_t nb) {  // scales[16], qs[64], d, dmin
  for (int64_t i = 0; i < nb; ++i, b += 84) {
    const uint8_t* scales = b;
    const uint8_t* q = b + 16;
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    int is = 0;
    for (int n = 0; n < kQKK; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void row_q3_k(const uint8_t* b, float* y, int64_t nb) {  // hmask[32], qs[64], scales[12], d
  for (int64_t i = 0; i < nb; ++i, b += 110) {
    const uint8_t* hm = b;
    const uint8_t* q = b + 32;
    const uint8_t* packed = b + 96;
    const float d_all = half_at(b + 108);
    int8_t scales[16];
    for (int j = 0; j < 16; ++j) {
      const int low = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
      const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
      scales[j] = static_cast<int8_t>((low | (high << 4)) - 32);
    }
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < kQKK; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(scales[is++]);
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int v = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

void row_q4_k(const uint8_t* b, float* y, int64_t nb) {  // d, dmin, scales[12], qs[128]
  for (int64_t i = 0; i < nb; ++i, b += 144) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    for (int j = 0, is = 0; j < kQKK; j += 64, q += 32, is += 2) {
      uint8_t sc, m;
      scale_min_k4(is, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void row_q5_k(const uint8_t* b, float* y, int64_t nb) {  // d, dmin, scales[12], qh[32], qs[128]
  for (int64_t i = 0; i < nb; ++i, b += 176) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQKK; j += 64, ql += 32, is += 2) {
      uint8_t sc, m;
      scale_min_k4(is, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void row_q6_k(const uint8_t* b, float* y, int64_t nb) {  // ql[128], qh[64], scales[16] int8, d
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void row_iq4_xs(const uint8_t* b, float* y, int64_t nb) {  // d, scales_h u16, scales_l[4], qs[128]
  for (int64_t i = 0; i < nb; ++i, b += 136) {
    const float d = half_at(b);
    uint16_t scales_h;
    std::memcpy(&scales_h, b + 2, 2);
    const uint8_t* scales_l = b + 4;
    const uint8_t* qs = b + 8;
    for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
      const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
      }
    }
  }
}

}  // namespace

bool can_dequantize(uint32_t type) { return block_size(type) != 0; }

int64_t block_size(uint32_t type) {
  switch (type) {
    case kF32:
    case kF16:
    case kBF16: return 1;
    case kQ4_0:
    case kQ4_1:
    case kQ5_0:
    case kQ5_1:
    case kQ8_0:
    case kIQ4_NL: return kQK;
    case kQ2_K:
    case kQ3_K:
    case kQ4_K:
    case kQ5_K:
    case kQ6_K:
    case kIQ4_XS: return kQKK;
    default: return 0;
  }
}

int64_t type_size(uint32_t type) {
  switch (type) {
    case kF32: return 4;
    case kF16:
    case kBF16: return 2;
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ5_0: return 22;
    case kQ5_1: return 24;
    case kQ8_0: return 34;
    case kIQ4_NL: return 18;
    case kQ2_K: return 84;
    case kQ3_K: return 110;
    case kQ4_K: return 144;
    case kQ5_K: return 176;
    case kQ6_K: return 210;
    case kIQ4_XS: return 136;
    default: return 0;
  }
}

int64_t row_bytes(uint32_t type, int64_t n) {
  const int64_t bs = block_size(type);
  return bs == 0 ? 0 : n / bs * type_size(type);
}

void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n) {
  const int64_t bs = block_size(type);
  if (bs == 0) fail("cannot dequantize ggml type {}", type);
  if (n < 0 || n % bs != 0)
    fail("ggml type {}: a row of {} weights is not a whole number of {}-weight blocks", type, n, bs);
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / bs;
  switch (type) {
    case kF32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_at(b + 2 * i);
      return;
    case kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case kQ4_0: row_q4_0(b, dst, nb); return;
    case kQ4_1: row_q4_1(b, dst, nb); return;
    case kQ5_0: row_q5_0(b, dst, nb); return;
    case kQ5_1: row_q5_1(b, dst, nb); return;
    case kQ8_0: row_q8_0(b, dst, nb); return;
    case kIQ4_NL: row_iq4_nl(b, dst, nb); return;
    case kQ2_K: row_q2_k(b, dst, nb); return;
    case kQ3_K: row_q3_k(b, dst, nb); return;
    case kQ4_K: row_q4_k(b, dst, nb); return;
    case kQ5_K: row_q5_k(b, dst, nb); return;
    case kQ6_K: row_q6_k(b, dst, nb); return;
    case kIQ4_XS: row_iq4_xs(b, dst, nb); return;
    default: fail("cannot dequantize ggml type {}", type);
  }
}

void matmul_rows_scalar(uint32_t type, const void* data, int64_t row_bytes, int64_t k, const float* x, int64_t m,
                        int64_t n0, int64_t n1, float* y, int64_t ldy);
void matmul_rows_avx2(uint32_t type, const void* data, int64_t row_bytes, int64_t k, const float* x, int64_t m,
                      int64_t n0, int64_t n1, float* y, int64_t ldy, PanelRef panels, PanelPrefetch pf);
void matmul_rows_avx512(uint32_t type, const void* data, int64_t row_bytes, int64_t k, const float* x, int64_t m,
                        int64_t n0, int64_t n1, float* y, int64_t ldy, PanelRef panels, PanelPrefetch pf);

bool has_matmul(uint32_t type) { return can_dequantize(type) && block_size(type) > 1; }

void matvec_many_avx2(std::span<const PanelMatVec> steps, PanelPrefetch pf);
void matvec_many_avx512(std::span<const PanelMatVec> steps, PanelPrefetch pf);

void matvec_many(Isa isa, std::span<const PanelMatVec> steps, PanelPrefetch pf) {
  for (const PanelMatVec& s : steps) {
    INFERA_ASSERT(can_pack_panels(s.type) && s.panels && s.k > 0 && s.k % block_size(s.type) == 0 && s.rows >= 0,
                  "matvec_many: a step without panels");
  }
  switch (isa) {
    case Isa::kAvx512: matvec_many_avx512(steps, pf); return;
    case Isa::kAvx2: matvec_many_avx2(steps, pf); return;
    case Isa::kScalar: break;
  }
  fail("matvec_many: the scalar path has no panels");
}

namespace {
std::atomic<bool> g_amx{true};
}  // namespace

void set_ggml_amx(bool enabled) { g_amx.store(enabled, std::memory_order_relaxed); }
bool ggml_amx_enabled() { return g_amx.load(std::memory_order_relaxed); }

void matmul_rows(Isa isa, uint32_t type, const void* data, int64_t k, const float* x, int64_t m, int64_t n0, int64_t n1,
                 float* y, int64_t ldy, PanelRef panels, PanelPrefetch pf) {
  if (!has_matmul(type)) fail("no matmul for ggml type {}", type);
  if (k % block_size(type) != 0) fail("ggml type {}: {} columns are not whole blocks", type, k);
  INFERA_ASSERT(m >= 0 && 0 <= n0 && n0 <= n1 && ldy >= n1 - n0);
  if (m == 0 || n1 == n0) return;
  const int64_t rb = row_bytes(type, k);
  const PanelRef p = can_pack_panels(type) && n0 % kPanelRows == 0 ? panels : PanelRef();
  switch (isa) {
    case Isa::kAvx512: matmul_rows_avx512(type, data, rb, k, x, m, n0, n1, y, ldy, p, pf); return;
    case Isa::kAvx2: matmul_rows_avx2(type, data, rb, k, x, m, n0, n1, y, ldy, p, pf); return;
    case Isa::kScalar: break;
  }
  matmul_rows_scalar(type, data, rb, k, x, m, n0, n1, y, ldy);
}

bool can_pack_panels(uint32_t type) {
  switch (type) {
    case kQ4_0:
    case kQ4_1:
    case kQ5_0:
    case kQ5_1:
    case kQ8_0:
    case kQ2_K:
    case kQ3_K:
    case kQ4_K:
    case kQ5_K:
    case kQ6_K:
    case kIQ4_NL:
    case kIQ4_XS: return true;
    default: return false;
  }
}

PanelLayout panel_layout(uint32_t type, int64_t k) {
  INFERA_ASSERT(can_pack_panels(type) && k % block_size(type) == 0);
  PanelLayout l;
  l.blocks = k / block_size(type);
  l.scale_stride = panel_scale_stride(type);
  l.scale_bytes = (l.scale_stride * l.blocks + 63) / 64 * 64;
  l.quant_stride = panel_quant_stride(type);
  l.bytes = l.scale_bytes + l.quant_stride * l.blocks;
  return l;
}

int64_t panel_bytes(uint32_t type, int64_t k) { return panel_layout(type, k).bytes; }

namespace {
// One row's dword of a panel part: the nibbles (low: shift 0, high: 4) of bytes q[0..3] in
// the low nibbles, of q[4..7] in the high ones.
uint32_t panel_dword(const uint8_t* q, int shift) {
  uint32_t lo, hi;
  std::memcpy(&lo, q, 4);
  std::memcpy(&hi, q + 4, 4);
  return ((lo >> shift) & 0x0F0F0F0Fu) | (((hi >> shift) & 0x0F0F0F0Fu) << 4);
}

// Bits shift, shift + 1 of 32 bytes q as row r's dwords of a chunk's two 64-byte vectors of
// two-bit fields (out: the chunk's 128 bytes): field f of byte 4r + e of vector v holds those
// of q[16v + 4f + e] (Q6_K's top bits, Q3_K's low ones, Q2_K's quants).
void pack_two_bit_fields(const uint8_t* q, int shift, int r, uint8_t* out) {
  for (int v = 0; v < 2; ++v) {
    uint32_t bits = 0;
    for (int f = 0; f < 4; ++f) {
      uint32_t x;
      std::memcpy(&x, q + 16 * v + 4 * f, 4);
      bits |= ((x >> shift) & 0x03030303u) << (2 * f);
    }
    std::memcpy(out + 64 * v + 4 * r, &bits, 4);
  }
}

// Bit `bit` of the four bytes q[0..3] into bit m of bytes 4r .. 4r + 3 of the 64-byte plane
// vector at `plane` (Q5_K's fifth bits, Q3_K's third bits: bit m of byte 4r + e is that of
// byte 4r + e of the chunk's operand vector m).
void or_plane_bits(const uint8_t* q, int bit, int r, int m, uint8_t* plane) {
  for (int e = 0; e < 4; ++e) plane[4 * r + e] |= static_cast<uint8_t>(((q[e] >> bit) & 1) << m);
}
}  // namespace

namespace {
// Writes the panels of rows [0, rows) at out (zeroed memory or not: each panel is cleared first).
void write_panels(uint32_t type, const void* data, int64_t rows, int64_t k, int threads, PanelRef out) {
  INFERA_ASSERT(rows >= 0);
  const PanelLayout lay = panel_layout(type, k);
  const int64_t nb = lay.blocks, pb = lay.bytes, panels = (rows + kPanelRows - 1) / kPanelRows;
  const int64_t rb = row_bytes(type, k), ts = type_size(type);
  const auto* src = static_cast<const uint8_t*>(data);
  const bool offset = type == kQ4_1 || type == kQ5_1, five = type == kQ5_0 || type == kQ5_1;
  // Where a block's 16 bytes of nibbles start (after d, m and the 5-bit types' qh).
  const int qs_at = 2 + (offset ? 2 : 0) + (five ? 4 : 0);
  const int nt = threads > 0 ? threads : num_threads();
  const bool q6k_beside = type == kQ6_K && q6k_panels_beside();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    auto* panel = const_cast<uint8_t*>(out.at(p, pb));
    std::memset(panel, 0, static_cast<size_t>(pb));
    // Block by block, the panel's rows of each in turn: the writes of a block stay in L1 (row by
    // row they strided the whole panel, from L2; 16 row streams read instead).
    const int panel_rows = static_cast<int>(std::min<int64_t>(kPanelRows, rows - p * kPanelRows));
    for (int64_t b = 0; b < nb; ++b) {
      for (int r = 0; r < panel_rows; ++r) {
        const uint8_t* blk = src + (p * kPanelRows + r) * rb + ts * b;
        uint8_t* scales = panel + lay.scale_stride * b;
        uint8_t* qs = panel + lay.scale_bytes + lay.quant_stride * b;
        if (type == kQ4_K || type == kQ5_K) {
          // d, dmin; the 6-bit scales [s][row] and mins [pair p][row][2] as bytes, then per
          // sub-block s its nibbles as a 32-weight block's (weight j of s: the low nibble of
          // byte 32 (s / 2) + j for even s, the high one for odd s), Q5_K's followed by its
          // fifth bits (bit s of qh[j]) as eight bit planes (or_plane_bits).
          std::memcpy(scales + 2 * r, blk, 2);
          std::memcpy(scales + 32 + 2 * r, blk + 2, 2);
          const uint8_t* sm = blk + 4;
          for (int sb = 0; sb < 8; ++sb) {
            const int sc = sb < 4 ? sm[sb] & 63 : (sm[sb + 4] & 0xF) | ((sm[sb - 4] >> 6) << 4);
            const int mn = sb < 4 ? sm[sb + 4] & 63 : (sm[sb + 4] >> 4) | ((sm[sb] >> 6) << 4);
            qs[panel_k_scales(type) + 16 * sb + r] = static_cast<uint8_t>(sc);
            qs[panel_k_scales(type) + 128 + 32 * (sb / 2) + 2 * r + sb % 2] = static_cast<uint8_t>(mn);
            const uint8_t* q = blk + (type == kQ5_K ? 48 : 16) + 32 * (sb / 2);
            uint8_t* chunk = qs + panel_k_chunk(type, sb);
            for (int part = 0; part < 4; ++part) {
              const uint32_t v = panel_dword(q + 8 * part, 4 * (sb % 2));
              std::memcpy(chunk + 64 * part + 4 * r, &v, 4);
              for (int h = 0; h < 2 && type == kQ5_K; ++h)  // bit sb of qh[8 part + 4 h + e], into plane 2 part + h
                or_plane_bits(blk + 16 + 8 * part + 4 * h, sb, r, 2 * part + h, qs + panel_k_bits(kQ5_K, sb));
            }
          }
          continue;
        }
        if (type == kQ2_K) {
          // d, dmin; the 16 sub-blocks' scale / min bytes as stored (scale in the low four
          // bits), [s][row], then per 32-weight chunk c its quants as two 64-byte vectors of
          // two-bit fields (as Q3_K's low bits: bits 2 (c % 4) of qs[32 (c / 4) + l]).
          std::memcpy(scales + 2 * r, blk + 80, 2);
          std::memcpy(scales + 32 + 2 * r, blk + 82, 2);
          for (int g = 0; g < 16; ++g) qs[panel_k_scales(kQ2_K) + 16 * g + r] = blk[g];
          for (int c = 0; c < 8; ++c)
            pack_two_bit_fields(blk + 16 + 32 * (c / 4), 2 * (c % 4), r, qs + panel_k_chunk(kQ2_K, c));
          continue;
        }
        if (type == kQ3_K) {
          // d; the 16 signed sub-scales (sc - 32) as bytes [s][row], then per 32-weight chunk c
          // its quants' two low bits as two 64-byte vectors (as Q6_K's top bits: field f of
          // byte 4 r + e of vector v is weight 32 c + 16 v + 4 f + e) and a 64-byte vector of
          // their third bits as eight planes (bit o of byte 4 r + e: weight 32 c + 4 o + e). Chunk c is group
          // c % 4 of half c / 4: its low bits bits 2 (c % 4) of qs[32 (c / 4) + l], its third
          // bit bit c of hmask[l], l < 32.
          std::memcpy(scales + 2 * r, blk + 108, 2);
          for (int c = 0; c < 8; ++c) {
            uint8_t* chunk = qs + panel_k_chunk(kQ3_K, c);
            pack_two_bit_fields(blk + 32 + 32 * (c / 4), 2 * (c % 4), r, chunk);
            for (int o = 0; o < 8; ++o) or_plane_bits(blk + 4 * o, c, r, o, qs + panel_k_bits(kQ3_K, c));
          }
          const uint8_t* p = blk + 96;
          for (int g = 0; g < 16; ++g) {
            const int low = g < 8 ? (p[g] & 0xF) : (p[g - 8] >> 4);
            qs[panel_k_scales(kQ3_K) + 16 * g + r] =
                static_cast<uint8_t>(static_cast<int8_t>((low | (((p[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32));
          }
          continue;
        }
        if (type == kIQ4_XS) {
          // d; the signed scales ls - 32 as bytes [s][row], then per 32-weight sub-block s its
          // nibbles as an IQ4_NL block's (its 16 bytes at 8 + 16 s).
          std::memcpy(scales + 2 * r, blk, 2);
          uint16_t sh;
          std::memcpy(&sh, blk + 2, 2);
          for (int sb = 0; sb < 8; ++sb) {
            const int ls = ((blk[4 + sb / 2] >> (4 * (sb % 2))) & 0xF) | (((sh >> (2 * sb)) & 3) << 4);
            qs[panel_k_scales(kIQ4_XS) + 16 * sb + r] = static_cast<uint8_t>(static_cast<int8_t>(ls - 32));
            for (int part = 0; part < 4; ++part) {
              const uint32_t v = panel_dword(blk + 8 + 16 * sb + 8 * (part % 2), 4 * (part / 2));
              std::memcpy(qs + panel_k_chunk(kIQ4_XS, sb) + 64 * part + 4 * r, &v, 4);
            }
          }
          continue;
        }
        if (type == kQ6_K) {
          // d; the 16 sub-scales as bytes [s][row]; the 6-bit quants u (w + 32) per 32-weight
          // chunk c: their low four bits as a 32-weight block's nibbles, their top two bits as
          // two 64-byte vectors (field f of byte 4 r + e of vector v: weight 32 c + 16 v + 4 f
          // + e). Chunk c is group g = c % 4 of half c / 4 in the block: its low bits
          // the low (g < 2) or high nibbles of ql[64 (c / 4) + 32 (g % 2) + l], its top bits
          // bits 2g, 2g + 1 of qh[32 (c / 4) + l], l < 32; four weights at a time.
          std::memcpy(scales + 2 * r, blk + 208, 2);
          for (int sb = 0; sb < 16; ++sb) qs[panel_k_scales(kQ6_K, q6k_beside) + 16 * sb + r] = blk[192 + sb];
          for (int c = 0; c < 8; ++c) {
            const int n = c / 4, g = c % 4;
            const uint8_t* ql = blk + 64 * n + 32 * (g % 2);
            uint8_t* chunk = qs + panel_k_chunk(kQ6_K, c, q6k_beside);
            for (int part = 0; part < 4; ++part) {
              const uint32_t v = panel_dword(ql + 8 * part, 4 * (g / 2));
              std::memcpy(chunk + 64 * part + 4 * r, &v, 4);
            }
            pack_two_bit_fields(blk + 128 + 32 * n, 2 * g, r, qs + panel_k_bits(kQ6_K, c, q6k_beside));
          }
          continue;
        }
        std::memcpy(scales + 2 * r, blk, 2);  // d
        if (offset) std::memcpy(scales + 32 + 2 * r, blk + 2, 2);  // m
        if (type == kQ8_0) {  // 32 int8 quants -> dword g of the row
          for (int g = 0; g < 8; ++g) std::memcpy(qs + 64 * g + 4 * r, blk + 2 + 4 * g, 4);
          continue;
        }
        // Part L takes weights 8L'..8L'+7 (L' = L % 2) from bytes 8L'.. of the nibbles: their
        // low nibbles for L < 2, their high ones (weights + 16) for L >= 2; four at a time.
        for (int part = 0; part < 4; ++part) {
          const uint32_t v = panel_dword(blk + qs_at + 8 * (part % 2), 4 * (part / 2));
          std::memcpy(qs + 64 * part + 4 * r, &v, 4);
        }
        if (five) {  // the fifth bits: mask 2L + h, bit 4r + e, of weight 16(L / 2) + 8(L % 2) + 4h + e
          uint32_t qh;
          std::memcpy(&qh, blk + qs_at - 4, 4);
          for (int part = 0; part < 4; ++part) {
            for (int h = 0; h < 2; ++h) {
              uint64_t mask;
              std::memcpy(&mask, qs + 256 + 8 * (2 * part + h), 8);
              for (int e = 0; e < 4; ++e) {
                const int j = 16 * (part / 2) + 8 * (part % 2) + 4 * h + e;
                mask |= static_cast<uint64_t>((qh >> j) & 1u) << (4 * r + e);
              }
              std::memcpy(qs + 256 + 8 * (2 * part + h), &mask, 8);
            }
          }
        }
      }
    }
  }
}
}  // namespace

std::shared_ptr<const uint8_t> pack_panels(uint32_t type, const void* data, int64_t rows, int64_t k, int threads) {
  INFERA_ASSERT(rows >= 0);
  const int64_t panels = (rows + kPanelRows - 1) / kPanelRows;
  const size_t total = static_cast<size_t>(std::max<int64_t>(1, panels * panel_bytes(type, k)));
  // Advised huge pages, as Infera's own repacked layers are: a decode step streams the panels,
  // and with 4 KiB pages its TLB misses cost it (membw.h).
  auto storage = std::make_shared<HugePageBuffer>(total);
  uint8_t* out = storage->data();
  std::shared_ptr<const uint8_t> owner(std::move(storage), out);
  write_panels(type, data, rows, k, threads, PanelRef(out));
  return owner;
}

namespace {
std::atomic<int> g_q6k_beside_override{-1};
}  // namespace

bool q6k_panels_beside() {
  const int forced = g_q6k_beside_override.load(std::memory_order_relaxed);
  if (forced >= 0) return forced != 0;
  static const bool beside = [] {
    const std::string e = option_env("q6k_panels", BadEnvValue::kWarnAndIgnore);  // INFERA_Q6K_PANELS
    if (e == "apart" || e == "beside") return e == "beside";
    return !cpu_features().has_avx512_path();  // (apart measured faster on the avx512 path)
  }();
  return beside;
}

void set_q6k_panels_beside(int beside) { g_q6k_beside_override.store(beside < 0 ? -1 : beside != 0); }

bool panel_lanes_enabled() {
  static const bool enabled = option_env_on("panel_lanes");  // INFERA_PANEL_LANES
  return enabled;
}

LanePanels pack_panels(uint32_t type, const void* data, int64_t rows, int64_t k,
                       const std::shared_ptr<LaneBuffer>& lanes, int threads) {
  INFERA_ASSERT(rows >= 0);
  constexpr int64_t kGroupRows = LaneBuffer::kLanes * kPanelRows;  // (a panel from each lane)
  const int64_t pb = panel_bytes(type, k), groups = (rows + kGroupRows - 1) / kGroupRows;
  uint8_t* at = lanes && rows > 0 ? lanes->take(static_cast<size_t>(groups * pb)) : nullptr;
  if (at == nullptr) {
    LanePanels one;
    one.owner = pack_panels(type, data, rows, k, threads);
    one.ref = PanelRef(one.owner.get());
    return one;
  }
  const PanelRef ref(at, static_cast<int64_t>(lanes->stride()), 0);
  write_panels(type, data, rows, k, threads, ref);
  return {std::shared_ptr<const uint8_t>(lanes, at), ref};
}

}  // namespace infera::kernels::ggml
