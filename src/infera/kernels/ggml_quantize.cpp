// The quantize side of ggml's block formats (ggml_quants.h quantize_rows): the same float
// operations, in the same order, as ggml-quants.c's quantizers, so that the blocks written
// are byte for byte the ones llama.cpp's llama-quantize writes. The file is compiled without
// FMA contraction (CMakeLists.txt): a fused multiply-add would round differently.
//
// Without an importance matrix the K types use llama.cpp's reference quantizers
// (quantize_row_q*_K_ref: per sub-block min/scale search weighted by |x| + rms, 6-bit
// super-block scales from the largest); with one, the weighted ones (quantize_row_*_impl:
// weights imatrix * sqrt(sigma^2 + x^2), a finer scale search and least-squares 6-bit
// super-block scales). IQ4_NL / IQ4_XS always search the scale (7 steps either side).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "infera/base/error.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/tensor/dtype.h"

namespace infera::kernels::ggml {

namespace {

constexpr int kQK = 32;
constexpr int kQKK = 256;
constexpr float kGroupMaxEps = 1e-15f;

void put_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

float get_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Round to nearest (ties to even) through the float mantissa, as ggml does; |v| < 2^22.
int nearest_int(float v) {
  const float biased = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// Index of the level of `levels` (16 sorted values) nearest to x; a tie picks the upper one.
int nearest_level(const int8_t* levels, float x) {
  const float twice = x + x;
  int idx = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int j = idx + step;
    if (twice >= static_cast<float>(levels[j - 1] + levels[j])) idx = j;
  }
  return idx;
}

// Symmetric quantization of n values to [-nmax, nmax - 1] (stored +nmax in L): the scale
// maximising (sum w x l)^2 / sum w l^2 over 19 candidate inverse scales around -nmax / max.
// Weights: qw when given, else x^2.
float symmetric_scale(int n, int nmax, const float* x, int8_t* L, const float* qw) {
  float max = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  auto level = [&](float iscale, int i) { return std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))); };
  auto weight = [&](int i) { return qw ? qw[i] : x[i] * x[i]; };
  float iscale = -fmax / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, i);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i), fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(fmax + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float w = weight(i), fl = static_cast<float>(level(iscale, i));
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale, i));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Affine quantization of n values to [0, nmax] with a non-positive offset: scale and
// -min minimising the weighted error over nstep + 1 candidate inverse scales
// (rmin + rdelta * is + nmax) / (max - min); `clamped` selects the guarded rounding of the
// weighted (imatrix) variant, `mad` absolute instead of squared error. Returns the scale,
// *neg_min = -min.
float affine_scale(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min, float rmin,
                   float rdelta, int nstep, bool weighted_variant) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (weighted_variant ? max <= min : max == min) {
    std::memset(L, 0, static_cast<size_t>(n));
    *neg_min = -min;
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  float iscale = fmax / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  uint8_t Laux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + fmax) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      int l;
      if (weighted_variant) {
        const float v = iscale * (x[i] - min);
        l = v > 0.0f ? nearest_int(std::min(v, fmax)) : 0;
      } else {
        l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      }
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i], fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0.0f;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

// Non-negative values (sub-block scales or mins) to [0, nmax] with one scale, weighted by
// qw: 9 candidate scales, then up to 5 rounds of single-level coordinate moves.
float positive_scale(int n, int nmax, const float* x, uint8_t* L, const float* qw) {
  float max = 0.0f;
  for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
  if (max < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  float iscale = fmax / max;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(nearest_int(iscale * x[i]));
  const float scale = 1.0f / iscale;
  float best_mse = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * static_cast<float>(L[i]);
    best_mse += qw[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float iscale_is = (0.1f * static_cast<float>(is) + fmax) / max;
    const float scale_is = 1.0f / iscale_is;
    float mse = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, nearest_int(iscale_is * x[i]));
      const float diff = x[i] - scale_is * static_cast<float>(l);
      mse += qw[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = iscale_is;
    }
  }
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, nearest_int(iscale * x[i]));
    L[i] = static_cast<uint8_t>(l);
    const float w = qw[i], fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int round = 0; round < 5; ++round) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = qw[i], fl = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * fl;
      float sl2 = suml2 - w * fl * fl;
      if (slx > 0.0f && sl2 > 0.0f) {
        const int new_l = std::min(nmax, nearest_int(x[i] * sl2 / slx));
        if (new_l != L[i]) {
          const float fn = static_cast<float>(new_l);
          slx += w * x[i] * fn;
          sl2 += w * fn * fn;
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<uint8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (changed == 0) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// ---- 32-weight blocks ----

// Q4_0 / Q5_0 (bits 4 or 5): d = the signed value of largest magnitude / -2^(bits-1).
void q_sym_ref(const float* x, uint8_t* y, int64_t nb, int bits) {
  const int half = 1 << (bits - 1), top = (1 << bits) - 1;
  const size_t bytes = bits == 4 ? 18 : 22;
  for (int64_t b = 0; b < nb; ++b, x += kQK, y += bytes) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -static_cast<float>(half), id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(y, d);
    const float bias = static_cast<float>(half) + 0.5f;
    uint8_t* qs = y + (bits == 4 ? 2 : 6);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(top, static_cast<int>(static_cast<int8_t>(x[j] * id + bias)));
      const int hi = std::min(top, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + bias)));
      qs[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
    }
    if (bits == 5) std::memcpy(y + 2, &qh, 4);
  }
}

// Q4_1 / Q5_1: d = (max - min) / (2^bits - 1), m = min.
void q_affine_ref(const float* x, uint8_t* y, int64_t nb, int bits) {
  const int top = (1 << bits) - 1;
  const size_t bytes = bits == 4 ? 20 : 24;
  for (int64_t b = 0; b < nb; ++b, x += kQK, y += bytes) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / static_cast<float>(top), id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(y, d);
    put_half(y + 2, min);
    uint8_t* qs = y + (bits == 4 ? 4 : 8);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      // Q4_1 goes through int8 and clamps to 15; Q5_1 converts straight to uint8.
      const float a = (x[j] - min) * id + 0.5f, c = (x[j + 16] - min) * id + 0.5f;
      const int lo = bits == 4 ? std::min(top, static_cast<int>(static_cast<int8_t>(a))) : static_cast<uint8_t>(a);
      const int hi = bits == 4 ? std::min(top, static_cast<int>(static_cast<int8_t>(c))) : static_cast<uint8_t>(c);
      qs[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
    }
    if (bits == 5) std::memcpy(y + 4, &qh, 4);
  }
}

void q8_0_ref(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, y += 34) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(y, d);
    for (int j = 0; j < kQK; ++j) y[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

// Per-block imatrix weights qw * sqrt(sigma2 + x^2), sigma2 = mean x^2 of the whole row.
float row_sigma2(const float* x, int64_t n) {
  float sum_x2 = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum_x2 += x[j] * x[j];
  return sum_x2 / static_cast<float>(n);
}

void imatrix_weights(const float* qw, const float* x, float sigma2, int n, float* w) {
  for (int j = 0; j < n; ++j) w[j] = qw[j] * std::sqrt(sigma2 + x[j] * x[j]);
}

// Q4_0 / Q5_0 with an importance matrix: weighted symmetric scale search per block.
void q_sym_weighted(const float* x, uint8_t* y, int64_t n, int bits, const float* qw) {
  const float sigma2 = row_sigma2(x, n);
  const size_t bytes = bits == 4 ? 18 : 22;
  float w[kQK];
  int8_t L[kQK];
  for (int64_t b = 0; b < n / kQK; ++b, y += bytes) {
    const float* xb = x + kQK * b;
    imatrix_weights(qw + kQK * b, xb, sigma2, kQK, w);
    put_half(y, symmetric_scale(kQK, 1 << (bits - 1), xb, L, w));
    uint8_t* qs = y + (bits == 4 ? 2 : 6);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      qs[j] = static_cast<uint8_t>((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
      qh |= static_cast<uint32_t>((L[j] >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((L[j + 16] >> 4) & 1) << (j + 16);
    }
    if (bits == 5) std::memcpy(y + 2, &qh, 4);
  }
}

// Q4_1 / Q5_1 with an importance matrix: weighted affine search per block.
void q_affine_weighted(const float* x, uint8_t* y, int64_t n, int bits, const float* qw) {
  const float sigma2 = row_sigma2(x, n);
  const size_t bytes = bits == 4 ? 20 : 24;
  float w[kQK];
  uint8_t L[kQK];
  for (int64_t b = 0; b < n / kQK; ++b, y += bytes) {
    const float* xb = x + kQK * b;
    imatrix_weights(qw + kQK * b, xb, sigma2, kQK, w);
    float neg_min;
    const float d = affine_scale(kQK, (1 << bits) - 1, xb, w, L, &neg_min, -0.9f, 0.05f, 36, true);
    put_half(y, d);
    put_half(y + 2, -neg_min);
    uint8_t* qs = y + (bits == 4 ? 4 : 8);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      qs[j] = static_cast<uint8_t>((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
      qh |= static_cast<uint32_t>((L[j] >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((L[j + 16] >> 4) & 1) << (j + 16);
    }
    if (bits == 5) std::memcpy(y + 4, &qh, 4);
  }
}

// ---- K super-blocks ----

// The 12 bytes of 8 six-bit (scale, min) pairs of Q4_K / Q5_K.
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K (bits 4) / Q5_K (bits 5) super-block at y (d, dmin, scales[12], [qh[32]], qs[128]).
// qw: the imatrix weights of these 256 columns, or nullptr for the reference quantizer.
void qk_affine_block(const float* x, uint8_t* y, int bits, const float* qw) {
  const int nmax = (1 << bits) - 1;
  uint8_t L[kQKK], ls[8], lm[8];
  float scales[8], mins[8], w[32];
  uint8_t* d_ptr = y;
  uint8_t* scales_ptr = y + 4;
  std::memset(scales_ptr, 0, 12);
  if (!qw) {
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float sum_x2 = 0.0f;
      for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
      const float av_x = std::sqrt(sum_x2 / 32.0f);
      for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xs[l]);
      scales[j] = bits == 4 ? affine_scale(32, nmax, xs, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20, false)
                            : affine_scale(32, nmax, xs, w, L + 32 * j, &mins[j], -0.5f, 0.1f, 15, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; ++j) {
      ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
      lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    }
    put_half(d_ptr, max_scale / 63.0f);
    put_half(d_ptr + 2, max_min / 63.0f);
  } else {
    float sum_x2 = 0.0f;
    for (int l = 0; l < kQKK; ++l) sum_x2 += x[l] * x[l];
    const float sigma2 = 2.0f * sum_x2 / static_cast<float>(kQKK);
    float sw[8];
    for (int j = 0; j < 8; ++j) {
      imatrix_weights(qw + 32 * j, x + 32 * j, sigma2, 32, w);
      float sumw = 0.0f;
      for (int l = 0; l < 32; ++l) sumw += w[l];
      sw[j] = sumw;
      scales[j] = affine_scale(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], -0.9f, 0.05f, 36, true);
    }
    const float d_block = positive_scale(8, 63, scales, ls, sw);
    const float m_block = positive_scale(8, 63, mins, lm, sw);
    for (int j = 0; j < 8; ++j) {
      ls[j] = std::min<uint8_t>(63, ls[j]);
      lm[j] = std::min<uint8_t>(63, lm[j]);
    }
    put_half(d_ptr, d_block);
    put_half(d_ptr + 2, m_block);
  }
  pack_scale_min_k4(ls, lm, scales_ptr);
  const float d_all = get_half(d_ptr), dmin_all = get_half(d_ptr + 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, scales_ptr, &sc, &m);
    const float d = d_all * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = dmin_all * static_cast<float>(m);
    for (int i = 0; i < 32; ++i) {
      const int l = nearest_int((x[32 * j + i] + dm) / d);
      L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
  if (bits == 4) {
    uint8_t* q = y + 16;
    for (int j = 0; j < kQKK; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
    return;
  }
  uint8_t* qh = y + 16;
  uint8_t* ql = y + 48;
  std::memset(qh, 0, 32);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < kQKK; n += 64, ql += 32) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        qh[j] |= m1;
      }
      if (l2 > 15) {
        l2 -= 16;
        qh[j] |= m2;
      }
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<uint8_t>(m1 << 2);
    m2 = static_cast<uint8_t>(m2 << 2);
  }
}

// Q6_K super-block at y (ql[128], qh[64], scales[16] int8, d); qw as above (used directly
// as the sub-block weights).
void q6_k_block(const float* x, uint8_t* y, const float* qw) {
  int8_t L[kQKK];
  float scales[16];
  float max_scale = 0.0f, max_abs_scale = 0.0f;
  for (int ib = 0; ib < 16; ++ib) {
    const float scale = symmetric_scale(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + 16 * ib : nullptr);
    scales[ib] = scale;
    const float abs_scale = std::fabs(scale);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scale;
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(y, 0, 210);
    return;
  }
  uint8_t* ql = y;
  uint8_t* qh = y + 128;
  int8_t* sc = reinterpret_cast<int8_t*>(y + 192);
  const float iscale = -128.0f / max_scale;
  put_half(y + 208, 1.0f / iscale);
  for (int ib = 0; ib < 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  const float d_all = get_half(y + 208);
  for (int j = 0; j < 16; ++j) {
    const float d = d_all * static_cast<float>(sc[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      const int l = std::max(-32, std::min(31, nearest_int(x[16 * j + i] / d)));
      L[16 * j + i] = static_cast<int8_t>(l + 32);
    }
  }
  for (int j = 0; j < kQKK; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
      ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                   ((L[j + l + 96] >> 4) << 6));
    }
  }
}

// ---- IQ4_NL / IQ4_XS ----

// One super-block of `n` weights (32: IQ4_NL, 256: IQ4_XS) in 32-weight blocks of indices
// into kIq4nlValues: per block the scale maximising the weighted fit over 15 candidates,
// then (IQ4_XS) 6-bit block scales under one f16 super-scale and the indices redone with
// them. Writes d at dh, the nibbles at q4 and (IQ4_XS) the scales at scales_h / scales_l.
void iq4_super_block(int n, const float* x, uint8_t* dh, uint8_t* q4, uint8_t* scales_h, uint8_t* scales_l,
                     const float* qw) {
  const int8_t* values = kIq4nlValues;
  constexpr int ntry = 7;
  float sigma2 = 0.0f;
  for (int j = 0; j < n; ++j) sigma2 += x[j] * x[j];
  sigma2 *= 2.0f / static_cast<float>(n);
  std::memset(q4, 0, static_cast<size_t>(n / 2));
  put_half(dh, 0.0f);
  uint8_t L[kQKK];
  float scales[8], w[32];
  float max_scale = 0.0f, amax_scale = 0.0f;
  const int nb = n / 32;
  for (int ib = 0; ib < nb; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* Lb = L + 32 * ib;
    if (qw) {
      imatrix_weights(qw + 32 * ib, xb, sigma2, 32, w);
    } else {
      for (int j = 0; j < 32; ++j) w[j] = xb[j] * xb[j];
    }
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax < kGroupMaxEps) {
      scales[ib] = 0.0f;
      std::memset(Lb, 0, 32);
      continue;
    }
    float d = -max / static_cast<float>(values[0]);
    float id = 1.0f / d;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const int l = nearest_level(values, id * xb[j]);
      Lb[j] = static_cast<uint8_t>(l);
      const float q = static_cast<float>(values[l]);
      sumqx += w[j] * q * xb[j];
      sumq2 += w[j] * q * q;
    }
    d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; ++itry) {
      id = static_cast<float>(itry + values[0]) / max;
      sumqx = sumq2 = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float q = static_cast<float>(values[nearest_level(values, id * xb[j])]);
        sumqx += w[j] * q * xb[j];
        sumq2 += w[j] * q * q;
      }
      if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    const float abs_d = std::fabs(d);
    if (abs_d > amax_scale) {
      amax_scale = abs_d;
      max_scale = d;
    }
  }
  if (nb > 1) {
    uint16_t sh = 0;
    const float d = -max_scale / 32.0f;
    put_half(dh, d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int ib = 0; ib < nb; ++ib) {
      int l = std::max(-32, std::min(31, nearest_int(id * scales[ib])));
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int j = 0; j < 32; ++j) L[32 * ib + j] = static_cast<uint8_t>(nearest_level(values, idl * x[32 * ib + j]));
      l += 32;
      const uint8_t l_l = static_cast<uint8_t>(l & 0xF), l_h = static_cast<uint8_t>(l >> 4);
      if (ib % 2 == 0) {
        scales_l[ib / 2] = l_l;
      } else {
        scales_l[ib / 2] |= static_cast<uint8_t>(l_l << 4);
      }
      sh = static_cast<uint16_t>(sh | (l_h << (2 * (ib % 8))));
    }
    std::memcpy(scales_h, &sh, 2);
  } else {
    put_half(dh, scales[0]);
    const float id = scales[0] != 0.0f ? 1.0f / scales[0] : 0.0f;
    for (int j = 0; j < n; ++j) L[j] = static_cast<uint8_t>(nearest_level(values, id * x[j]));
  }
  for (int i = 0; i < n / 32; ++i) {
    for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
  }
}

// One row of n weights.
void quantize_row(uint32_t type, const float* x, uint8_t* y, int64_t n, const float* qw) {
  switch (type) {
    case kQ4_0:
    case kQ5_0:
      if (qw) {
        q_sym_weighted(x, y, n, type == kQ4_0 ? 4 : 5, qw);
      } else {
        q_sym_ref(x, y, n / kQK, type == kQ4_0 ? 4 : 5);
      }
      return;
    case kQ4_1:
    case kQ5_1:
      if (qw) {
        q_affine_weighted(x, y, n, type == kQ4_1 ? 4 : 5, qw);
      } else {
        q_affine_ref(x, y, n / kQK, type == kQ4_1 ? 4 : 5);
      }
      return;
    case kQ8_0: q8_0_ref(x, y, n / kQK); return;
    case kQ4_K:
    case kQ5_K: {
      const int bits = type == kQ4_K ? 4 : 5;
      const size_t bytes = bits == 4 ? 144 : 176;
      for (int64_t b = 0; b < n / kQKK; ++b)
        qk_affine_block(x + kQKK * b, y + bytes * b, bits, qw ? qw + kQKK * b : nullptr);
      return;
    }
    case kQ6_K:
      for (int64_t b = 0; b < n / kQKK; ++b) q6_k_block(x + kQKK * b, y + 210 * b, qw ? qw + kQKK * b : nullptr);
      return;
    case kIQ4_NL:
      for (int64_t b = 0; b < n / kQK; ++b) {
        uint8_t* blk = y + 18 * b;
        iq4_super_block(kQK, x + kQK * b, blk, blk + 2, nullptr, nullptr, qw ? qw + kQK * b : nullptr);
      }
      return;
    case kIQ4_XS:
      for (int64_t b = 0; b < n / kQKK; ++b) {
        uint8_t* blk = y + 136 * b;
        iq4_super_block(kQKK, x + kQKK * b, blk, blk + 8, blk + 2, blk + 4, qw ? qw + kQKK * b : nullptr);
      }
      return;
    default: break;
  }
  fail("ggml type {} has no quantizer", type);
}

}  // namespace

bool can_quantize(uint32_t type) {
  switch (type) {
    case kQ4_0:
    case kQ4_1:
    case kQ5_0:
    case kQ5_1:
    case kQ8_0:
    case kQ4_K:
    case kQ5_K:
    case kQ6_K:
    case kIQ4_NL:
    case kIQ4_XS: return true;
    default: return false;
  }
}

int64_t quantize_rows(uint32_t type, const float* src, void* dst, int64_t nrows, int64_t n_per_row,
                      const float* imatrix) {
  if (!can_quantize(type)) fail("ggml type {} has no quantizer", type);
  if (n_per_row <= 0 || n_per_row % block_size(type) != 0) {
    fail("a row of {} weights is not a whole number of {}-weight blocks", n_per_row, block_size(type));
  }
  const int64_t rb = row_bytes(type, n_per_row);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < nrows; ++r) quantize_row(type, src + r * n_per_row, out + r * rb, n_per_row, imatrix);
  return rb * nrows;
}

}  // namespace infera::kernels::ggml
