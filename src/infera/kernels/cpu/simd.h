// A thin vector abstraction so one kernel source (kernels_impl.h) compiles into the
// scalar, AVX2 and AVX-512 paths. The including file defines INFERA_SIMD_LEVEL
// (0 scalar, 1 AVX2 + FMA + F16C, 2 AVX-512 F/BW/VL/DQ) and is compiled with the matching
// flags (files named *_avx2.cpp / *_avx512.cpp get them from CMake). Everything here is
// static inline inside a per-ISA namespace, so the three copies never mix at link time.
#pragma once

#include <cmath>
#include <cstdint>

#include "infera/tensor/dtype.h"

#if !defined(INFERA_SIMD_LEVEL)
#error "define INFERA_SIMD_LEVEL before including simd.h"
#endif

#if INFERA_SIMD_LEVEL > 0
#include <immintrin.h>
#endif

namespace infera::kernels::INFERA_KERNEL_NS {

// exp() for f32 vectors: Cephes-style range reduction x = n ln2 + r, |r| <= ln2/2, degree-6
// polynomial for e^r, then 2^n through the exponent bits. Relative error ~2 ulp. Inputs
// are clamped to [-87.3, 88.0] so 2^n stays a normal number (results below e^-87.3 ~ 1e-38
// come out as ~1e-38 instead of 0: negligible against any sum they join).
#define INFERA_EXP_CONSTANTS                                                                                      \
  constexpr float kExpHi = 88.0f, kExpLo = -87.3f;                                                                \
  constexpr float kLog2e = 1.44269504088896341f;                                                                  \
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;                                                \
  constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f, \
                  kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

#if INFERA_SIMD_LEVEL == 2

struct Simd {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_f16_kept(const uint16_t* p, const uint16_t* keep) {
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keep))));
  }
  // 2 x kLanes bf16 as f32: the even-indexed ones and the odd-indexed ones (a shift and a
  // mask of one load: no widening shuffle).
  static void load_bf16_pairs(const uint16_t* p, V& even, V& odd) {
    const __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  // The same with each of the 2L halves ANDed with keep's (0 or 0xFFFF: a zero weight).
  static void load_bf16_pairs_kept(const uint16_t* p, const uint16_t* keep, V& even, V& odd) {
    const __m512i v = _mm512_and_si512(_mm512_loadu_si512(p), _mm512_loadu_si512(keep));
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  // First n lanes (0 <= n < kLanes); the others read as 0 / are not written.
  static V load_partial(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store_partial(float* p, V v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static V keep_first(V v, int n) { return _mm512_maskz_mov_ps(mask(n), v); }  // others -> 0
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  // In-register transpose of a kLanes x kLanes block: r[i][j] <-> r[j][i].
  static void transpose(V* r) {
    V t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 16; h += 8) {
      for (int i = 0; i < 4; ++i) {
        t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
        t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
      }
    }
    for (int i = 0; i < 8; ++i) {
      r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
      r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
  }
  // Lane i of the result = reduce_add(r[i]), i < 16: 16 horizontal sums in 45 shuffles and
  // adds (halving twice across 128-bit quarters, twice within them) and one permute.
  __attribute__((always_inline)) static V reduce_lanes(const V* r) {
    V b[8], c[4], d[2];
    for (int j = 0; j < 8; ++j) {
      b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(r[j], r[j + 8], 0x44), _mm512_shuffle_f32x4(r[j], r[j + 8], 0xee));
    }
    for (int j = 0; j < 4; ++j) {
      c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[j], b[j + 4], 0x88), _mm512_shuffle_f32x4(b[j], b[j + 4], 0xdd));
    }
    for (int j = 0; j < 2; ++j) {
      d[j] = _mm512_add_ps(_mm512_shuffle_ps(c[j], c[j + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(c[j], c[j + 2], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    const V e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
    // Lane i of e holds the sum of r[order[i]]; the order is its own inverse.
    const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return _mm512_permutexvar_ps(order, e);
  }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static V exp(V x) {
    INFERA_EXP_CONSTANTS
    x = _mm512_min_ps(_mm512_max_ps(x, set1(kExpLo)), set1(kExpHi));
    const V fx = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, set1(kLn2Hi), x);
    x = _mm512_fnmadd_ps(fx, set1(kLn2Lo), x);
    V y = set1(kP0);
    y = fma(y, x, set1(kP1));
    y = fma(y, x, set1(kP2));
    y = fma(y, x, set1(kP3));
    y = fma(y, x, set1(kP4));
    y = fma(y, x, set1(kP5));
    y = fma(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, set1(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
  }
};

#elif INFERA_SIMD_LEVEL == 1

struct Simd {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load_f16_kept(const uint16_t* p, const uint16_t* keep) {
    return _mm256_cvtph_ps(_mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(keep))));
  }
  static void load_bf16_pairs(const uint16_t* p, V& even, V& odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static void load_bf16_pairs_kept(const uint16_t* p, const uint16_t* keep, V& even, V& odd) {
    const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keep)));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load_partial(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  static void store_partial(float* p, V v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  static V keep_first(V v, int n) { return _mm256_and_ps(v, _mm256_castsi256_ps(mask(n))); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void transpose(V* r) {  // 8 x 8, as the AVX-512 one
    V t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
      r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
      r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
  }
  // Lane i of the result = reduce_add(r[i]), i < 8 (as the AVX-512 one).
  __attribute__((always_inline)) static V reduce_lanes(const V* r) {
    V b[4], c[2];
    for (int j = 0; j < 4; ++j) {
      b[j] = _mm256_add_ps(_mm256_permute2f128_ps(r[j], r[j + 4], 0x20), _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
    }
    for (int j = 0; j < 2; ++j) {
      c[j] = _mm256_add_ps(_mm256_shuffle_ps(b[j], b[j + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(b[j], b[j + 2], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    const V e = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(e, _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7));  // its own inverse
  }
  static float reduce_max(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V exp(V x) {
    INFERA_EXP_CONSTANTS
    x = _mm256_min_ps(_mm256_max_ps(x, set1(kExpLo)), set1(kExpHi));
    const V fx = _mm256_round_ps(_mm256_mul_ps(x, set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, set1(kLn2Hi), x);
    x = _mm256_fnmadd_ps(fx, set1(kLn2Lo), x);
    V y = set1(kP0);
    y = fma(y, x, set1(kP1));
    y = fma(y, x, set1(kP2));
    y = fma(y, x, set1(kP3));
    y = fma(y, x, set1(kP4));
    y = fma(y, x, set1(kP5));
    y = fma(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, set1(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
};

#else  // scalar: one lane; the compiler may still auto-vectorize the loops around it.

struct Simd {
  using V = float;
  static constexpr int kLanes = 1;
  static V zero() { return 0.0f; }
  static void prefetch(const void*) {}
  static void prefetch_l2(const void*) {}
  static V set1(float a) { return a; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static V load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static V load_f16_kept(const uint16_t* p, const uint16_t* keep) {
    return f16_to_f32(static_cast<uint16_t>(*p & *keep));
  }
  static void load_bf16_pairs(const uint16_t* p, V& even, V& odd) {
    even = bf16_to_f32(p[0]);
    odd = bf16_to_f32(p[1]);
  }
  static void load_bf16_pairs_kept(const uint16_t* p, const uint16_t* keep, V& even, V& odd) {
    even = bf16_to_f32(static_cast<uint16_t>(p[0] & keep[0]));
    odd = bf16_to_f32(static_cast<uint16_t>(p[1] & keep[1]));
  }
  static V load_partial(const float*, int) { return 0.0f; }  // n is always 0 with one lane
  static void store_partial(float*, V, int) {}
  static V keep_first(V v, int n) { return n > 0 ? v : 0.0f; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V max(V a, V b) { return a > b ? a : b; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float reduce_add(V v) { return v; }
  static void transpose(V*) {}  // 1 x 1
  __attribute__((always_inline)) static V reduce_lanes(const V* r) { return r[0]; }
  static float reduce_max(V v) { return v; }
  static V exp(V x) { return std::exp(x); }
};

#endif

#undef INFERA_EXP_CONSTANTS

}  // namespace infera::kernels::INFERA_KERNEL_NS
