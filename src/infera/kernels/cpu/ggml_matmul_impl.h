// y = x · Wᵀ for a weight matrix in one of llama.cpp's block formats, computed as llama.cpp's
// CPU backend computes it: the activations quantized to the type's activation form (Q8_0,
// Q8_1 or Q8_K: int8 with a per-block scale, ggml-cpu's vec_dot_type), integer dot products
// per block, then the block scales applied in f32. Compiled once per ISA (ggml_matmul_*.cpp,
// each with its own flags). The loops here are the scalar path; the AVX2 and AVX-512 paths
// run ggml_matmul_simd.h. All paths compute the same
// values: integer sums are exact and the f32 steps run in one order.
//
// Each thread decodes one weight row at a time into int8 weights and per-block scales and
// applies it to every activation row, so a prefill of m tokens decodes W once.
// The ISA files are compiled with -ffp-contract=off (CMakeLists.txt): no fused multiply-adds,
// so the paths built with -mfma round exactly as the scalar one does.
// Included once per ISA file with INFERA_GGML_NS naming its own namespace (no include guard).
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "infera/base/threads.h"
#include "infera/kernels/cpu/amx_tiles.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/tensor/dtype.h"

namespace infera::kernels::ggml::INFERA_GGML_NS {

enum class ActForm { kQ8_0, kQ8_1, kQ8_K };

inline ActForm act_form(uint32_t type) {
  switch (type) {
    case kQ4_1:
    case kQ5_1: return ActForm::kQ8_1;
    case kQ2_K:
    case kQ3_K:
    case kQ4_K:
    case kQ5_K:
    case kQ6_K:
    case kIQ4_XS: return ActForm::kQ8_K;
    default: return ActForm::kQ8_0;
  }
}

#ifdef __AVX2__
// Steps on 256-bit vectors (the AVX2 quantizer below, the rows' decoders in
// ggml_matmul_simd.h): |x|, the largest of 8 lanes (order-free where no NaN reaches it, as in
// quantize_activations), the sum of 8 int32 lanes, and 32 int32 quants in [-128, 127] stored
// in order as bytes.
namespace ymm {
inline __m256 abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}
inline void store32(int8_t* out, __m256i q0, __m256i q1, __m256i q2, __m256i q3) {
  // packs work within 128-bit lanes: dwords (q0 lo, q1 lo, q2 lo, q3 lo | q0 hi, ...) back in order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
}  // namespace ymm
#endif

inline float half(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return f16_to_f32(v);
}

// Activation rows quantized as llama.cpp quantizes them (x86 path: scale 127 / amax and
// round-half-even for Q8_0/Q8_1; the reference Q8_K). The AVX-512 and AVX2 builds compute the
// same values in vectors (the maxima are order-free, the products and roundings the same) for
// finite blocks whose largest |x| is 0 or above 127 / FLT_MAX; below that, and for inf / NaN,
// their conversions saturate (-128) where the scalar one is out of range (the block's scale
// then rounds to 0, or its input was not finite: no product a model uses changes). On AVX2
// the scalar loops took a decode call's fixed cost: Q8_K's search for its largest |x|
// runs a chain of compares and blends, about 1 ns a weight, 5.6 us of a 256 x 5632 Q4_K
// call's 32 (kernels_bench "hot", Zen 2: Q4_K 25.1 -> 28.7 GB/s, 64 rows 16.5 -> 24.4).
struct Activations {
  int64_t k = 0;
  std::vector<int8_t> q;  // [m, k]
  std::vector<float> d;  // Q8_0/Q8_1: [m, k/32] f16-rounded scale; Q8_K: [m, k/256] f32 scale
  std::vector<float> s;  // Q8_1: [m, k/32] f16-rounded d * sum(q)
  std::vector<int32_t> bsums;  // Q8_K: [m, k/16] sums of 16 quants
};

// Rows from which the quantization is split among the threads (a prefill's rows are each
// independent; one row is not worth waking them).
constexpr int64_t kParallelRows = 8;

// row(i) for i in [0, m): split among the threads from kParallelRows rows, else on this thread
// alone (no parallel region: a decode step's one row).
template <class Row>
inline void for_rows(int64_t m, const Row& row) {
  if (m >= kParallelRows && !omp_in_parallel()) {
#pragma omp parallel for num_threads(num_threads())
    for (int64_t i = 0; i < m; ++i) row(i);
    return;
  }
  for (int64_t i = 0; i < m; ++i) row(i);
}

inline void quantize_activations(const float* x, int64_t m, int64_t k, ActForm form, Activations& a) {
  a.k = k;
  a.q.resize(static_cast<size_t>(m * k));
  if (form == ActForm::kQ8_K) {
    a.d.resize(static_cast<size_t>(m * (k / 256)));
    a.bsums.resize(static_cast<size_t>(m * (k / 16)));
    const auto row = [&](int64_t i) {
      for (int64_t b = 0; b < k / 256; ++b) {
        const float* xb = x + i * k + b * 256;
        int8_t* qb = a.q.data() + i * k + b * 256;
        float amax = 0, max = 0;
#ifdef __AVX512F__
        // The largest |x| in vectors, then the first element of that magnitude (its sign).
        __m512 vmax = _mm512_setzero_ps();
        for (int c = 0; c < 16; ++c) vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * c)), vmax);
        amax = _mm512_reduce_max_ps(vmax);
        for (int c = 0; c < 16 && amax > 0; ++c) {
          const __mmask16 at =
              _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * c)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
          if (at != 0) {
            max = xb[16 * c + __builtin_ctz(at)];
            break;
          }
        }
#elif defined(__AVX2__)
        // As above, 8 lanes at a time. max(|x|, m) keeps m where x is NaN, as the scalar
        // loop's `ax > amax` skips it.
        __m256 vmax = _mm256_setzero_ps();
        for (int c = 0; c < 32; ++c) vmax = _mm256_max_ps(ymm::abs(_mm256_loadu_ps(xb + 8 * c)), vmax);
        amax = ymm::hmax(vmax);
        for (int c = 0; c < 32 && amax > 0; ++c) {
          const int at = _mm256_movemask_ps(
              _mm256_cmp_ps(ymm::abs(_mm256_loadu_ps(xb + 8 * c)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
          if (at != 0) {
            max = xb[8 * c + __builtin_ctz(static_cast<unsigned>(at))];
            break;
          }
        }
#else
        for (int j = 0; j < 256; ++j) {
          const float ax = std::fabs(xb[j]);
          if (ax > amax) {
            amax = ax;
            max = xb[j];
          }
        }
#endif
        int32_t* bs = a.bsums.data() + i * (k / 16) + b * 16;
        if (amax == 0) {
          a.d[i * (k / 256) + b] = 0;
          std::memset(qb, 0, 256);
          std::fill(bs, bs + 16, 0);
          continue;
        }
        const float iscale = -127.f / max;
#ifdef __AVX512F__
        // cvtps rounds half to even, as nearbyint does in the default rounding mode.
        for (int g = 0; g < 16; ++g) {
          const __m512i q =
              _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_set1_ps(iscale), _mm512_loadu_ps(xb + 16 * g))),
                               _mm512_set1_epi32(127));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16 * g), _mm512_cvtsepi32_epi8(q));
          bs[g] = _mm512_reduce_add_epi32(q);
        }
#elif defined(__AVX2__)
        for (int g = 0; g < 8; ++g) {  // 32 quants: two sums of 16
          __m256i q[4];
          for (int v = 0; v < 4; ++v)
            q[v] = _mm256_min_epi32(_mm256_cvtps_epi32(
                                        _mm256_mul_ps(_mm256_set1_ps(iscale), _mm256_loadu_ps(xb + 32 * g + 8 * v))),
                                    _mm256_set1_epi32(127));
          ymm::store32(qb + 32 * g, q[0], q[1], q[2], q[3]);
          bs[2 * g] = ymm::hsum(_mm256_add_epi32(q[0], q[1]));
          bs[2 * g + 1] = ymm::hsum(_mm256_add_epi32(q[2], q[3]));
        }
#else
        for (int j = 0; j < 256; ++j)
          qb[j] = static_cast<int8_t>(std::min(127, static_cast<int>(std::nearbyint(iscale * xb[j]))));
        for (int g = 0; g < 16; ++g) {
          int32_t sum = 0;
          for (int j = 0; j < 16; ++j) sum += qb[16 * g + j];
          bs[g] = sum;
        }
#endif
        a.d[i * (k / 256) + b] = 1 / iscale;
      }
    };
    for_rows(m, row);
    return;
  }
  a.d.resize(static_cast<size_t>(m * (k / 32)));
  if (form == ActForm::kQ8_1) a.s.resize(static_cast<size_t>(m * (k / 32)));
  const auto row = [&](int64_t i) {
    for (int64_t b = 0; b < k / 32; ++b) {
      const float* xb = x + i * k + b * 32;
      int8_t* qb = a.q.data() + i * k + b * 32;
#ifdef __AVX512F__
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      // max(|x|, m) keeps m where x is NaN, as std::max(m, |x|) does.
      const float amax =
          _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_max_ps(_mm512_abs_ps(x1), _mm512_setzero_ps())));
      const float d = amax / 127.f;
      const float id = amax != 0.0f ? 127.f / amax : 0.0f;
      // cvtps rounds half to even, as nearbyint does in the default rounding mode.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtsepi32_epi8(q1));
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#elif defined(__AVX2__)
      __m256 xv[4], mv = _mm256_setzero_ps();
      for (int v = 0; v < 4; ++v) {
        xv[v] = _mm256_loadu_ps(xb + 8 * v);
        mv = _mm256_max_ps(ymm::abs(xv[v]), mv);  // (m where x is NaN, as std::max(m, |x|))
      }
      const float amax = ymm::hmax(mv);
      const float d = amax / 127.f;
      const float id = amax != 0.0f ? 127.f / amax : 0.0f;
      __m256i q[4];
      for (int v = 0; v < 4; ++v) q[v] = _mm256_cvtps_epi32(_mm256_mul_ps(xv[v], _mm256_set1_ps(id)));
      ymm::store32(qb, q[0], q[1], q[2], q[3]);
      const int32_t sum = ymm::hsum(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
#else
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.f;
      const float id = amax != 0.0f ? 127.f / amax : 0.0f;
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        qb[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
        sum += qb[j];
      }
#endif
      a.d[i * (k / 32) + b] = f16_to_f32(f32_to_f16(d));
      if (form == ActForm::kQ8_1) a.s[i * (k / 32) + b] = f16_to_f32(f32_to_f16(static_cast<float>(sum) * d));
    }
  };
  for_rows(m, row);
}

// One weight row decoded: integer weights and what scales them.
//   32-weight types: y_block = d[b] * Σ w q_a * d_a (+ m[b] * s_a for Q4_1 / Q5_1).
//   K types: per 256-block, d[b] * d_a * Σ_g sc[g] Σ_{16 in g} w q_a - dmin[b] * d_a * Σ_g mn[g] bsum_a[g].
struct DecodedRow {
  std::vector<int8_t> w;  // [k]
  std::vector<float> d, m, dmin;  // per block
  std::vector<int16_t> sc, mn;  // per 16 weights (K types)
};

inline void decode_row(uint32_t type, const uint8_t* b, int64_t k, DecodedRow& r) {
  r.w.resize(static_cast<size_t>(k));
  int8_t* w = r.w.data();
  const int64_t bs = block_size(type), nb = k / bs, ts = type_size(type);
  r.d.resize(static_cast<size_t>(nb));
  if (bs == 256) {
    r.dmin.assign(static_cast<size_t>(nb), 0.0f);
    r.sc.resize(static_cast<size_t>(k / 16));
    r.mn.assign(static_cast<size_t>(k / 16), 0);
  } else if (type == kQ4_1 || type == kQ5_1) {
    r.m.resize(static_cast<size_t>(nb));
  }
  for (int64_t i = 0; i < nb; ++i, b += ts, w += bs) {
    int16_t* sc = bs == 256 ? r.sc.data() + i * 16 : nullptr;
    int16_t* mn = bs == 256 ? r.mn.data() + i * 16 : nullptr;
    switch (type) {
      case kQ4_0:
      case kIQ4_NL:
        r.d[i] = half(b);
        for (int j = 0; j < 16; ++j) {
          const int lo = b[2 + j] & 0xF, hi = b[2 + j] >> 4;
          w[j] = static_cast<int8_t>(type == kQ4_0 ? lo - 8 : kIq4nlValues[lo]);
          w[j + 16] = static_cast<int8_t>(type == kQ4_0 ? hi - 8 : kIq4nlValues[hi]);
        }
        break;
      case kQ4_1:
        r.d[i] = half(b);
        r.m[i] = half(b + 2);
        for (int j = 0; j < 16; ++j) {
          w[j] = static_cast<int8_t>(b[4 + j] & 0xF);
          w[j + 16] = static_cast<int8_t>(b[4 + j] >> 4);
        }
        break;
      case kQ5_0:
      case kQ5_1: {
        const bool one = type == kQ5_1;
        r.d[i] = half(b);
        if (one) r.m[i] = half(b + 2);
        uint32_t qh;
        std::memcpy(&qh, b + (one ? 4 : 2), 4);
        const uint8_t* qs = b + (one ? 8 : 6);
        const int off = one ? 0 : 16;
        for (int j = 0; j < 16; ++j) {
          w[j] = static_cast<int8_t>(((qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4)) - off);
          w[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - off);
        }
        break;
      }
      case kQ8_0:
        r.d[i] = half(b);
        std::memcpy(w, b + 2, 32);
        break;
      case kQ2_K: {
        r.d[i] = half(b + 80);
        r.dmin[i] = half(b + 82);
        for (int g = 0; g < 16; ++g) {
          sc[g] = b[g] & 0xF;
          mn[g] = b[g] >> 4;
        }
        for (int e = 0; e < 256; ++e) {
          const int h = e / 128, rr = e % 128, s = rr / 32, l = rr % 32;
          w[e] = static_cast<int8_t>((b[16 + 32 * h + l] >> (2 * s)) & 3);
        }
        break;
      }
      case kQ3_K: {
        r.d[i] = half(b + 108);
        const uint8_t* p = b + 96;
        for (int g = 0; g < 16; ++g) {
          const int low = g < 8 ? (p[g] & 0xF) : (p[g - 8] >> 4);
          sc[g] = static_cast<int16_t>((low | (((p[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32);
        }
        for (int e = 0; e < 256; ++e) {
          const int h = e / 128, rr = e % 128, s = rr / 32, l = rr % 32;
          const int q2 = (b[32 + 32 * h + l] >> (2 * s)) & 3;
          w[e] = static_cast<int8_t>(q2 - (((b[l] >> (4 * h + s)) & 1) ? 0 : 4));
        }
        break;
      }
      case kQ4_K:
      case kQ5_K: {
        r.d[i] = half(b);
        r.dmin[i] = half(b + 2);
        const uint8_t* p = b + 4;
        for (int j = 0; j < 8; ++j) {
          const int s = j < 4 ? p[j] & 63 : (p[j + 4] & 0xF) | ((p[j - 4] >> 6) << 4);
          const int mm = j < 4 ? p[j + 4] & 63 : (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
          sc[2 * j] = sc[2 * j + 1] = static_cast<int16_t>(s);
          mn[2 * j] = mn[2 * j + 1] = static_cast<int16_t>(mm);
        }
        const uint8_t* qs = b + (type == kQ4_K ? 16 : 48);
        for (int e = 0; e < 256; ++e) {
          const int c = e / 64, rr = e % 64;
          int q = rr < 32 ? qs[32 * c + rr] & 0xF : qs[32 * c + rr - 32] >> 4;
          if (type == kQ5_K) q |= ((b[16 + e % 32] >> (e / 32)) & 1) << 4;
          w[e] = static_cast<int8_t>(q);
        }
        break;
      }
      case kQ6_K: {
        r.d[i] = half(b + 208);
        for (int g = 0; g < 16; ++g) sc[g] = static_cast<int8_t>(b[192 + g]);
        for (int e = 0; e < 256; ++e) {
          const int h = e / 128, rr = e % 128, g = rr / 32, l = rr % 32;
          const int low = g < 2 ? b[64 * h + 32 * g + l] & 0xF : b[64 * h + 32 * (g - 2) + l] >> 4;
          const int high = (b[128 + 32 * h + l] >> (2 * g)) & 3;
          w[e] = static_cast<int8_t>((low | (high << 4)) - 32);
        }
        break;
      }
      case kIQ4_XS: {
        r.d[i] = half(b);
        uint16_t sh;
        std::memcpy(&sh, b + 2, 2);
        for (int ib = 0; ib < 8; ++ib) {
          const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
          sc[2 * ib] = sc[2 * ib + 1] = static_cast<int16_t>(ls - 32);
          const uint8_t* qs = b + 8 + 16 * ib;
          for (int j = 0; j < 16; ++j) {
            w[32 * ib + j] = kIq4nlValues[qs[j] & 0xF];
            w[32 * ib + j + 16] = kIq4nlValues[qs[j] >> 4];
          }
        }
        break;
      }
      default: break;
    }
  }
}

inline int32_t dot16(const int8_t* a, const int8_t* b) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) s += static_cast<int32_t>(a[j]) * static_cast<int32_t>(b[j]);
  return s;
}

// One output: decoded weight row · activation row i.
inline float dot_row(uint32_t type, ActForm form, const DecodedRow& r, const Activations& a, int64_t i) {
  const int64_t k = a.k;
  const int8_t* q = a.q.data() + i * k;
  const int8_t* w = r.w.data();
  float sum = 0;
  if (form == ActForm::kQ8_K) {
    const float* ad = a.d.data() + i * (k / 256);
    const int32_t* bs = a.bsums.data() + i * (k / 16);
    for (int64_t b = 0; b < k / 256; ++b) {
      int32_t isum = 0, msum = 0;
      for (int g = 0; g < 16; ++g) {
        isum += r.sc[b * 16 + g] * dot16(w + b * 256 + 16 * g, q + b * 256 + 16 * g);
        msum += r.mn[b * 16 + g] * bs[b * 16 + g];
      }
      const float d = r.d[b] * ad[b], dmin = r.dmin[b] * ad[b];
      sum += d * static_cast<float>(isum) - dmin * static_cast<float>(msum);
    }
    return sum;
  }
  const float* ad = a.d.data() + i * (k / 32);
  for (int64_t b = 0; b < k / 32; ++b) {
    const int32_t isum = dot16(w + 32 * b, q + 32 * b) + dot16(w + 32 * b + 16, q + 32 * b + 16);
    sum += static_cast<float>(isum) * (r.d[b] * ad[b]);
    if (form == ActForm::kQ8_1) sum += r.m[b] * a.s[i * (k / 32) + b];
  }
  (void)type;
  return sum;
}

#ifdef __AVX2__
#include "infera/kernels/cpu/ggml_matmul_simd.h"

// ggml::matvec_many on this path: each distinct (x, k, activation form) quantized once, each
// step a panel::DecodeJob, their units shared among the threads (Shares) in one region.
inline void matvec_many(std::span<const PanelMatVec> steps, PanelPrefetch pf) {
  const size_t n = steps.size();
  if (n == 0) return;
  static thread_local std::vector<Activations> acts;
  static thread_local std::vector<std::vector<int32_t>> corrs;
  static thread_local std::vector<simd::panel::DecodeJob> jobs;
  static thread_local std::vector<int64_t> ends;  // units of steps [0, j] in all
  if (acts.size() < n) acts.resize(n);
  if (corrs.size() < n) corrs.resize(n);
  jobs.resize(n);
  ends.resize(n);
  int64_t units = 0;
  for (size_t j = 0; j < n; ++j) {
    const PanelMatVec& s = steps[j];
    const ActForm form = act_form(s.type);
    size_t in = j;  // the step whose quantized x this one takes
    for (size_t i = 0; i < j && in == j; ++i)
      if (steps[i].x == s.x && steps[i].k == s.k && act_form(steps[i].type) == form) in = i;
    if (in == j) quantize_activations(s.x, 1, s.k, form, acts[j]);
    const Activations& a = acts[in];
    const bool panel_type = simd::panel::with_panel_type(s.type, [&]<uint32_t kType>() {
      simd::panel::Corr<kType>::fill(a, 1, s.k, corrs[j]);
      jobs[j] = simd::panel::decode_job<kType>(s.panels, s.k, a, corrs[j].data(), 0, s.rows, s.y, pf);
    });
    if (!panel_type) jobs[j] = {};  // (none: ggml::matvec_many lets only panel types through)
    units += jobs[j].units();
    ends[j] = units;
  }
  // (the caller's: thread_local names differ per thread inside the region)
  const simd::panel::DecodeJob* job = jobs.data();
  const int64_t* end = ends.data();
  const auto run = [job, end, n](int64_t u) {
    const size_t j = static_cast<size_t>(std::upper_bound(end, end + n, u) - end);
    job[j].run(u - (j > 0 ? end[j - 1] : 0));
  };
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int nt = static_cast<int>(std::min<int64_t>(threads, units));
  if (nt <= 1) {
    for (int64_t u = 0; u < units; ++u) run(u);
    return;
  }
  Shares shares(units, nt);
  parallel_region(nt, [&] { shares.run(omp_get_thread_num(), run); });
}
#endif

// y[i * ldy + (j - n0)] = x[i, :] · W[j, :] for rows j in [n0, n1). W: [rows, k] of `type`,
// rows `row_bytes` apart.
// panels: pack_panels' copy from row 0 (n0 a multiple of kPanelRows), or none.
inline void matmul_rows(uint32_t type, const void* data, int64_t row_bytes, int64_t k, const float* x, int64_t m,
                        int64_t n0, int64_t n1, float* y, int64_t ldy, PanelRef panels = {},
                        PanelPrefetch pf = PanelPrefetch::kL1) {
  const ActForm form = act_form(type);
  static thread_local Activations acts;
  quantize_activations(x, m, k, form, acts);
  const Activations& a = acts;
  const auto* base = static_cast<const uint8_t*>(data);
#ifdef __AVX2__
  simd::matmul_rows(type, base, row_bytes, k, a, m, n0, n1, y, ldy, panels, pf);
  return;
#else
  (void)panels;
  (void)pf;
#endif
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const int64_t n = n1 - n0;
#pragma omp parallel num_threads(n >= 2 * threads ? threads : 1)
  {
    static thread_local DecodedRow r;
#pragma omp for schedule(static)
    for (int64_t j = n0; j < n1; ++j) {
      decode_row(type, base + j * row_bytes, k, r);
      for (int64_t i = 0; i < m; ++i) y[i * ldy + (j - n0)] = dot_row(type, form, r, a, i);
    }
  }
}

}  // namespace infera::kernels::ggml::INFERA_GGML_NS
