// The SIMD FP8 (W8A16) kernel, written once and compiled twice: fp8_avx2.cpp
// (INFERA_FP8_AVX512 0: 8 lanes) and fp8_avx512.cpp (1: 16 lanes). Include it from nowhere
// else. The format and the reference: kernels/quant.h (QuantExtras::fp8_group) and
// ref::fp8_matmul in quant.cpp.
//
// Decoding: an e4m3 byte, sign-extended to 16 bits, shifted left by 7 and masked with 0xbf80,
// is an f16 with the byte's sign, exponent and mantissa in its fields: the e4m3 value / 2^8
// (f16's exponent bias is 15, e4m3's 7), subnormals included. F16C (vcvtph2ps, which converts
// f16 subnormals exactly whatever MXCSR says) turns it into f32, and the 2^8 is folded into
// the group scale, so every product equals the reference's e4m3 · scale · x exactly; only the
// order of the f32 sums differs. (0x7f / 0xff, NaN in e4m3fn, decode as ±480: checkpoints hold
// no NaN weights.)
//
// Tiling: threads take blocks of weight rows (~32 KiB); in a block, tokens go in tiles of up to
// 4, each row's bytes decoded once per tile and multiplied against every token of the tile
// (one accumulator per token per group, then one fma by the group scale). For one token four
// accumulators run side by side (independent fma chains).
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "infera/base/threads.h"
#include "infera/kernels/cpu/fp8_dispatch.h"

namespace infera::kernels::INFERA_FP8_NS {
namespace {

#if INFERA_FP8_AVX512
using V = __m512;
constexpr int kLanes = 16;
inline V decode(__m128i bytes) {
  const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
  return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0xbf80))));
}
inline V load_w(const uint8_t* p) { return decode(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline V load_w_partial(const uint8_t* p, int n) {
  return decode(_mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1u), p));
}
inline V load_x(const float* p) { return _mm512_loadu_ps(p); }
inline V load_x_partial(const float* p, int n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
}
inline V zero() { return _mm512_setzero_ps(); }
inline V set1(float a) { return _mm512_set1_ps(a); }
inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
#else
using V = __m256;
constexpr int kLanes = 8;
inline V decode(__m128i bytes) {
  const __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7);
  return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0xbf80))));
}
inline V load_w(const uint8_t* p) { return decode(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline V load_w_partial(const uint8_t* p, int n) {
  alignas(16) uint8_t b[16] = {};
  std::memcpy(b, p, static_cast<size_t>(n));
  return decode(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
}
inline V load_x(const float* p) { return _mm256_loadu_ps(p); }
inline V load_x_partial(const float* p, int n) {
  alignas(32) float b[8] = {};
  std::memcpy(b, p, static_cast<size_t>(n) * 4);
  return _mm256_load_ps(b);
}
inline V zero() { return _mm256_setzero_ps(); }
inline V set1(float a) { return _mm256_set1_ps(a); }
inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline float hsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

constexpr float kDecodeScale = 256.0f;  // the f16 form is the e4m3 value / 2^8

// Rows [r0, r1) of w against T tokens x[0..T) (rows of ldx floats); y[t * ldy + r].
// U accumulators per token run side by side (U * T <= 4 chains).
template <int T>
void rows_tile(const Fp8Args& a, const float* x, int64_t r0, int64_t r1, float* y) {
  constexpr int U = T >= 4 ? 1 : 4 / T;
  const int64_t k = a.cols, g = a.group, ng = (k + g - 1) / g;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = a.weights + r * k;
    const float* sr = a.scales + r * ng;
    V acc[T];
    for (int t = 0; t < T; ++t) acc[t] = zero();
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t c0 = gi * g, c1 = std::min(k, c0 + g);
      V part[U][T];
      for (int u = 0; u < U; ++u)
        for (int t = 0; t < T; ++t) part[u][t] = zero();
      int64_t c = c0;
      for (; c + U * kLanes <= c1; c += U * kLanes) {
        for (int u = 0; u < U; ++u) {
          const V w = load_w(wr + c + u * kLanes);
          for (int t = 0; t < T; ++t) part[u][t] = fma(w, load_x(x + t * a.ldx + c + u * kLanes), part[u][t]);
        }
      }
      for (; c + kLanes <= c1; c += kLanes) {
        const V w = load_w(wr + c);
        for (int t = 0; t < T; ++t) part[0][t] = fma(w, load_x(x + t * a.ldx + c), part[0][t]);
      }
      if (c < c1) {
        const int n = static_cast<int>(c1 - c);
        const V w = load_w_partial(wr + c, n);
        for (int t = 0; t < T; ++t) part[0][t] = fma(w, load_x_partial(x + t * a.ldx + c, n), part[0][t]);
      }
      const V s = set1(sr[gi] * kDecodeScale);
      for (int t = 0; t < T; ++t) {
        V p = part[0][t];
        for (int u = 1; u < U; ++u) p = add(p, part[u][t]);
        acc[t] = fma(p, s, acc[t]);
      }
    }
    for (int t = 0; t < T; ++t) y[t * a.ldy + r] = hsum(acc[t]);
  }
}

void rows_all_tokens(const Fp8Args& a, const float* x, int64_t m, int64_t r0, int64_t r1, float* y) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) rows_tile<4>(a, x + i * a.ldx, r0, r1, y + i * a.ldy);
  switch (m - i) {
    case 3: rows_tile<3>(a, x + i * a.ldx, r0, r1, y + i * a.ldy); break;
    case 2: rows_tile<2>(a, x + i * a.ldx, r0, r1, y + i * a.ldy); break;
    case 1: rows_tile<1>(a, x + i * a.ldx, r0, r1, y + i * a.ldy); break;
    default: break;
  }
}

}  // namespace

void fp8_matmul(const Fp8Args& a, const float* x, int64_t m, float* y) {
  const int64_t n = a.rows;
  // Blocks of ~32 KiB of weights (at least 4 rows): swept by every tile of tokens while in L2.
  const int64_t block = std::max<int64_t>(4, (int64_t{32} << 10) / std::max<int64_t>(1, a.cols));
  const int64_t pieces = (n + block - 1) / block;
  const int threads = num_threads();
  if (threads <= 1 || pieces < 2 || omp_in_parallel()) {
    rows_all_tokens(a, x, m, 0, n, y);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t p = 0; p < pieces; ++p) rows_all_tokens(a, x, m, p * block, std::min(n, (p + 1) * block), y);
}

}  // namespace infera::kernels::INFERA_FP8_NS
