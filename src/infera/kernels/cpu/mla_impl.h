// The hot MLA / DSA kernels (mla.h): the chunk indexer scores (over the Simd abstraction,
// simd.h) and the blocked absorbed and sparse attention (plain loops for the compiler's
// vectorizer), written once and compiled three times: mla_scalar.cpp, mla_avx2.cpp and
// mla_avx512.cpp each define INFERA_SIMD_LEVEL and INFERA_KERNEL_NS, then include this
// file (include it from nowhere else). mla.cpp picks the table at run time (best_isa(),
// INFERA_ISA caps it); the references they are tested against are kernels::ref in mla.cpp.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "infera/base/threads.h"
#include "infera/kernels/cpu/mla_dispatch.h"
#include "infera/kernels/cpu/simd.h"

namespace infera::kernels::INFERA_KERNEL_NS {
namespace {

using S = Simd;
using V = S::V;
constexpr int L = S::kLanes;

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

int threads_for(int64_t work_items) {
  const int t = omp_in_parallel() ? 1 : num_threads();
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(t, work_items)));
}

// GCC 12 warns of the unset pass-through operand inside AVX-512's _mm512_max_ps once it is
// inlined into the OpenMP region below (-Wmaybe-uninitialized, a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
void indexer_scores_chunk_impl(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                               const float* keys, int64_t ld, float* out, int64_t out_ld) {
  if (n <= 0) return;
  // Blocks of kBlock keys (kNv vectors), each transposed once ([d, kBlock]) and then used by
  // every query and head of the chunk: a head's dot products with the whole block are d
  // broadcast multiply-adds into kNv independent accumulators held in registers.
  constexpr int kNv = 4;
  constexpr int64_t kBlock = kNv * L;
  const int64_t n_keys = pos0 + n;
  const int64_t blocks = (n_keys + kBlock - 1) / kBlock;
  const int threads = threads_for(blocks);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    static thread_local std::vector<float> kt;
    kt.resize(static_cast<size_t>(d * kBlock));
    alignas(64) float acc_out[kBlock];
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t s0 = b * kBlock, m = std::min(n_keys, s0 + kBlock) - s0;
      for (int64_t j = 0; j < m; ++j)
        for (int64_t x = 0; x < d; ++x) kt[x * kBlock + j] = keys[(s0 + j) * ld + x];
      for (int64_t j = m; j < kBlock; ++j)
        for (int64_t x = 0; x < d; ++x) kt[x * kBlock + j] = 0.0f;
      // Query i sees keys [0, pos0 + i]: the first query that sees key s0 is max(0, s0 - pos0).
      for (int64_t i = std::max<int64_t>(0, s0 - pos0); i < n; ++i) {
        const float* qi = q + i * n_heads * d;
        const float* wi = w + i * n_heads;
        const V zero = S::zero();
        V acc[kNv];
        for (int v = 0; v < kNv; ++v) acc[v] = zero;
        for (int64_t h = 0; h < n_heads; ++h) {
          const float* qh = qi + h * d;
          V dv[kNv];
          for (int v = 0; v < kNv; ++v) dv[v] = S::zero();
          for (int64_t x = 0; x < d; ++x) {
            const V a = S::set1(qh[x]);
            const float* row = kt.data() + x * kBlock;
            for (int v = 0; v < kNv; ++v) dv[v] = S::fma(a, S::load(row + v * L), dv[v]);
          }
          const V wh = S::set1(wi[h]);
          for (int v = 0; v < kNv; ++v) acc[v] = S::fma(wh, S::max(dv[v], zero), acc[v]);
        }
        for (int v = 0; v < kNv; ++v) S::store(acc_out + v * L, acc[v]);
        const int64_t end = std::min(m, pos0 + i + 1 - s0);
        std::copy(acc_out, acc_out + end, out + i * out_ld + s0);
      }
    }
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Absorbed attention of heads [h0, h1) of one query over rows row(0) .. row(n_rows - 1) of
// the latent, blocked: each block of kRows rows is scored and accumulated by every head
// while it is in cache (online softmax: a running maximum, sum and output per head), so
// the context is read from memory once per head group, not once per head.
template <class RowFn>
void attend_blocked(const float* q, int64_t h0, int64_t h1, int64_t n_rows, const RowFn& row, int64_t R, int64_t P,
                    float scale, float* out) {
  constexpr int64_t kRows = 32;
  const int64_t D = R + P, nh = h1 - h0;
  static thread_local std::vector<float> m, l;
  m.assign(static_cast<size_t>(nh), -std::numeric_limits<float>::infinity());
  l.assign(static_cast<size_t>(nh), 0.0f);
  float s[kRows];
  for (int64_t h = h0; h < h1; ++h) std::fill(out + h * R, out + (h + 1) * R, 0.0f);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const int64_t nb = std::min(kRows, n_rows - r0);
    for (int64_t h = h0; h < h1; ++h) {
      const float* qh = q + h * D;
      float bm = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < nb; ++j) {
        const float* r = row(r0 + j);
        s[j] = (dot(qh, r, R) + dot(qh + R, r + R, P)) * scale;
        bm = std::max(bm, s[j]);
      }
      float& mh = m[h - h0];
      float* o = out + h * R;
      if (bm > mh) {
        const float c = std::exp(mh - bm);  // 0 on the first block
        l[h - h0] *= c;
#pragma omp simd
        for (int64_t x = 0; x < R; ++x) o[x] *= c;
        mh = bm;
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < nb; ++j) {
        const float p = std::exp(s[j] - mh);
        sum += p;
        axpy(p, row(r0 + j), o, R);
      }
      l[h - h0] += sum;
    }
  }
  for (int64_t h = h0; h < h1; ++h) {
    if (n_rows == 0) continue;
    const float inv = 1.0f / l[h - h0];
    float* o = out + h * R;
#pragma omp simd
    for (int64_t x = 0; x < R; ++x) o[x] *= inv;
  }
}

// Heads per work item: up to 16 (one pass over the context per group), fewer when that
// leaves threads idle.
int64_t head_group(int64_t n_tokens, int64_t n_heads) {
  const int64_t t = omp_in_parallel() ? 1 : num_threads();
  const int64_t per = (n_tokens * n_heads + t - 1) / t;
  return std::clamp<int64_t>(std::min(per, n_heads), 1, 16);
}

// Runs f(i, h0, h1) for every work item, token i's heads [h0, h1) of one head group,
// spread over the threads.
template <typename F>
void for_each_head_group(int64_t n_tokens, int64_t n_heads, const F& f) {
  const int64_t g = head_group(n_tokens, n_heads), groups = (n_heads + g - 1) / g;
  const int64_t items = n_tokens * groups;
  const int threads = threads_for(items);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t i = it / groups, h0 = it % groups * g;
    f(i, h0, std::min(n_heads, h0 + g));
  }
}

void attention_absorbed(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat, int64_t ld,
                        int64_t R, int64_t P, float scale, float* out) {
  const int64_t D = R + P;
  const auto row = [lat, ld](int64_t t) { return lat + t * ld; };
  for_each_head_group(n_tokens, n_heads, [&](int64_t i, int64_t h0, int64_t h1) {
    attend_blocked(q + i * n_heads * D, h0, h1, pos0 + i + 1, row, R, P, scale, out + i * n_heads * R);
  });
}

void attention_sparse(const float* q, int64_t n_tokens, int64_t n_heads, const float* lat, int64_t ld, int64_t R,
                      int64_t P, const int32_t* idx, const int32_t* n_idx, int64_t idx_stride, float scale,
                      float* out) {
  const int64_t D = R + P;
  for_each_head_group(n_tokens, n_heads, [&](int64_t i, int64_t h0, int64_t h1) {
    const int32_t* rows = idx + i * idx_stride;
    const auto row = [lat, ld, rows](int64_t j) { return lat + static_cast<int64_t>(rows[j]) * ld; };
    attend_blocked(q + i * n_heads * D, h0, h1, n_idx[i], row, R, P, scale, out + i * n_heads * R);
  });
}

}  // namespace

const MlaTable& mla_table() {
  static const MlaTable table{indexer_scores_chunk_impl, attention_absorbed, attention_sparse};
  return table;
}

}  // namespace infera::kernels::INFERA_KERNEL_NS
