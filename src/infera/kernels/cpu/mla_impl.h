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
#include <cstring>
#include <limits>
#include <vector>

#include "infera/base/threads.h"
#include "infera/kernels/cpu/mla_dispatch.h"
#include "infera/kernels/cpu/simd.h"
#include "infera/kernels/kernels.h"

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

// GCC 12 warns of the unset pass-through operands inside AVX-512's intrinsics (max,
// reduce_add) once they are inlined into the OpenMP regions below (-Wmaybe-uninitialized,
// -Wuninitialized: false positives).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// ---- Lightning-indexer scores ----
//
// score(i, s) = Σ_h w[i, h] · max(0, q[i, h] · k_s). The queries are transposed once
// ([d, heads] per query, heads padded to whole vectors with zero weights), so a key is
// used as it is stored (row-major, no transpose): each of its d values is broadcast and
// multiplied into the head vectors. kKeys keys at a time share the loads of the query
// vectors, in kKeys x HB accumulators held in registers.
constexpr int kKeys = 4;

// Keys k[0..kKeys) against head vectors [g, g + HB) of one transposed query; tot[j] +=
// the weighted, rectified head scores of key j (a vector to be summed across lanes).
template <int HB>
inline void score_keys(const float* qt, int64_t nhp, int64_t g, const float* wp, const float* const* k, int64_t d,
                       V* tot) {
  V acc[kKeys][HB];
  for (int j = 0; j < kKeys; ++j)
    for (int v = 0; v < HB; ++v) acc[j][v] = S::zero();
  const float* col = qt + g * L;
  for (int64_t x = 0; x < d; ++x, col += nhp) {
    V qv[HB];
    for (int v = 0; v < HB; ++v) qv[v] = S::load(col + v * L);
    for (int j = 0; j < kKeys; ++j) {
      const V b = S::set1(k[j][x]);
      for (int v = 0; v < HB; ++v) acc[j][v] = S::fma(b, qv[v], acc[j][v]);
    }
  }
  const V zero = S::zero();
  for (int v = 0; v < HB; ++v) {
    const V wv = S::load(wp + (g + v) * L);
    for (int j = 0; j < kKeys; ++j) tot[j] = S::fma(wv, S::max(acc[j][v], zero), tot[j]);
  }
}

// Scores of kKeys keys for one transposed query: out[j] for j < kKeys.
inline void score_key_group(const float* qt, const float* wp, int64_t hv, const float* const* k, int64_t d,
                            float* out) {
  const int64_t nhp = hv * L;
  V tot[kKeys];
  for (int j = 0; j < kKeys; ++j) tot[j] = S::zero();
  for (int64_t g = 0; g < hv; g += 4) {
    switch (std::min<int64_t>(4, hv - g)) {
      case 1: score_keys<1>(qt, nhp, g, wp, k, d, tot); break;
      case 2: score_keys<2>(qt, nhp, g, wp, k, d, tot); break;
      case 3: score_keys<3>(qt, nhp, g, wp, k, d, tot); break;
      default: score_keys<4>(qt, nhp, g, wp, k, d, tot); break;
    }
  }
  for (int j = 0; j < kKeys; ++j) out[j] = S::reduce_add(tot[j]);
}

// Key rows [s0, s0 + m) of the paged latent cache, columns [c0, c0 + d), as f32: out [m, d].
void load_key_rows(const PagedKv& kv, int64_t s0, int64_t m, int64_t c0, int64_t d, float* out) {
  const int64_t hd = kv.head_dim, bs = kv.block_size;
  // The part of the columns in the K half, then in the V half.
  const int64_t k0 = std::min(c0, hd), k1 = std::min(c0 + d, hd);
  const int64_t v0 = std::max(c0, hd) - hd, v1 = std::max(c0 + d, hd) - hd;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t p = s0 + j;
    const int64_t row = kv_row(static_cast<int64_t>(kv.block_table[p / bs]) * bs + p % bs, 0, bs, 1);
    float* o = out + j * d;
    const auto part = [&](const void* pool, const float* scales, int64_t a, int64_t b, float* dst) {
      const int64_t cnt = b - a;
      if (cnt <= 0) return;
      if (kv.dtype == DType::kF32) {
        std::memcpy(dst, static_cast<const float*>(pool) + row * hd + a, cnt * sizeof(float));
      } else if (kv.dtype == DType::kBF16) {
        const uint16_t* src = static_cast<const uint16_t*>(pool) + row * hd + a;
        int64_t x = 0;
        for (; x + L <= cnt; x += L) S::store(dst + x, S::load_bf16(src + x));
        for (; x < cnt; ++x) dst[x] = bf16_to_f32(src[x]);
      } else {  // kI8 (the callers check the dtype)
        const int8_t* src = static_cast<const int8_t*>(pool) + row * hd + a;
        const float sc = scales[row];
#pragma omp simd
        for (int64_t x = 0; x < cnt; ++x) dst[x] = sc * static_cast<float>(src[x]);
      }
    };
    part(kv.k_pool, kv.k_scales, k0, k1, o);
    part(kv.v_pool, kv.v_scales, v0, v1, o + (k1 - k0));
  }
}

// The chunk's scores; key_rows(s0, m, buf) returns the rows of keys [s0, s0 + m) (d
// floats each, consecutive at stride ld_rows), filling buf [kBlock, d] if it needs to.
template <class KeyRows>
void indexer_scores_blocked(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                            const KeyRows& key_rows, float* out, int64_t out_ld) {
  if (n <= 0) return;
  constexpr int64_t kBlock = 64;
  const int64_t hv = (n_heads + L - 1) / L, nhp = hv * L;
  // Transposed, padded queries [n, d, nhp] and weights [n, nhp] (padded heads weigh 0).
  static thread_local std::vector<float> qt, wp;
  qt.assign(static_cast<size_t>(n * d * nhp), 0.0f);
  wp.assign(static_cast<size_t>(n * nhp), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < n_heads; ++h) {
      wp[i * nhp + h] = w[i * n_heads + h];
      for (int64_t x = 0; x < d; ++x) qt[(i * d + x) * nhp + h] = q[(i * n_heads + h) * d + x];
    }
  const float* qt_all = qt.data();
  const float* wp_all = wp.data();
  const int64_t n_keys = pos0 + n;
  const int64_t blocks = (n_keys + kBlock - 1) / kBlock;
  const int threads = threads_for(blocks);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    static thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(kBlock * d));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t s0 = b * kBlock, m = std::min(n_keys, s0 + kBlock) - s0;
      int64_t ld_rows = 0;
      const float* rows = key_rows(s0, m, buf.data(), ld_rows);
      // Query i sees keys [0, pos0 + i]: the first query that sees key s0 is max(0, s0 - pos0).
      for (int64_t i = std::max<int64_t>(0, s0 - pos0); i < n; ++i) {
        const int64_t end = std::min(m, pos0 + i + 1 - s0);  // keys [s0, s0 + end) of this block
        float* oi = out + i * out_ld + s0;
        for (int64_t j0 = 0; j0 < end; j0 += kKeys) {
          const float* k[kKeys];
          for (int j = 0; j < kKeys; ++j) k[j] = rows + std::min<int64_t>(j0 + j, end - 1) * ld_rows;
          float sc[kKeys];
          score_key_group(qt_all + i * d * nhp, wp_all + i * nhp, hv, k, d, sc);
          for (int64_t j = 0; j < kKeys && j0 + j < end; ++j) oi[j0 + j] = sc[j];
        }
      }
    }
  }
}

void indexer_scores_chunk_impl(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                               const float* keys, int64_t ld, float* out, int64_t out_ld) {
  indexer_scores_blocked(
      q, w, n, n_heads, d, pos0,
      [keys, ld](int64_t s0, int64_t, float*, int64_t& ld_rows) {
        ld_rows = ld;
        return keys + s0 * ld;
      },
      out, out_ld);
}

void indexer_scores_paged_impl(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                               const PagedKv& kv, int64_t c0, float* out, int64_t out_ld) {
  indexer_scores_blocked(
      q, w, n, n_heads, d, pos0,
      [&kv, c0, d](int64_t s0, int64_t m, float* buf, int64_t& ld_rows) {
        load_key_rows(kv, s0, m, c0, d, buf);
        ld_rows = d;
        return static_cast<const float*>(buf);
      },
      out, out_ld);
}

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
    const float* rows[kRows];
    for (int64_t j = 0; j < nb; ++j) rows[j] = row(r0 + j);
    for (int64_t j = nb; j < kRows; ++j) rows[j] = rows[nb - 1];  // padding for the 4-row steps
    const int64_t Rv = R / L * L;  // the part of R in whole vectors
    for (int64_t h = h0; h < h1; ++h) {
      const float* qh = q + h * D;
      // Scores, 4 rows at a time: each load of q serves 4 rows.
      for (int64_t j = 0; j < nb; j += 4) {
        V acc[4] = {S::zero(), S::zero(), S::zero(), S::zero()};
        for (int64_t x = 0; x < Rv; x += L) {
          const V qv = S::load(qh + x);
          for (int k = 0; k < 4; ++k) acc[k] = S::fma(qv, S::load(rows[j + k] + x), acc[k]);
        }
        for (int k = 0; k < 4 && j + k < nb; ++k) {
          const float* r = rows[j + k];
          float t = S::reduce_add(acc[k]);
          for (int64_t x = Rv; x < R; ++x) t += qh[x] * r[x];
          s[j + k] = (t + dot(qh + R, r + R, P)) * scale;
        }
      }
      float bm = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < nb; ++j) bm = std::max(bm, s[j]);
      float& mh = m[h - h0];
      float* o = out + h * R;
      float c = 1.0f;
      if (bm > mh) {
        c = std::exp(mh - bm);  // 0 on the first block
        l[h - h0] *= c;
        mh = bm;
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < nb; ++j) {
        s[j] = std::exp(s[j] - mh);
        sum += s[j];
      }
      l[h - h0] += sum;
      // o = c o + Σ_j p_j row_j, a vector of o at a time held in a register across the block.
      const V cv = S::set1(c);
      for (int64_t x = 0; x < Rv; x += L) {
        V ov = S::mul(S::load(o + x), cv);
        for (int64_t j = 0; j < nb; ++j) ov = S::fma(S::set1(s[j]), S::load(rows[j] + x), ov);
        S::store(o + x, ov);
      }
      for (int64_t x = Rv; x < R; ++x) {
        float ox = o[x] * c;
        for (int64_t j = 0; j < nb; ++j) ox += s[j] * rows[j][x];
        o[x] = ox;
      }
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

// Naive form, blocked over queries: a work item is one head and a block of up to kQueries
// consecutive query tokens; the context's expanded rows [k_nope | v] of that head are
// walked in blocks of kRows, each used by every query of the block while it is in cache
// (online softmax per query: running maximum, sum and output), so the expanded context is
// read from memory once per query block rather than once per query.
void attention_naive(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv, int64_t nope,
                     int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale, float* out) {
  constexpr int64_t kQueries = 16, kRows = 32;
  const int64_t D = nope + P, KV = nope + V;
  const int64_t qblocks = (n_tokens + kQueries - 1) / kQueries, items = n_heads * qblocks;
  const int threads = threads_for(items);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t h = it / qblocks, i0 = it % qblocks * kQueries, i1 = std::min(n_tokens, i0 + kQueries);
    float m[kQueries], l[kQueries], s[kRows];
    for (int64_t i = i0; i < i1; ++i) {
      m[i - i0] = -std::numeric_limits<float>::infinity();
      l[i - i0] = 0.0f;
      std::fill(out + (i * n_heads + h) * V, out + (i * n_heads + h + 1) * V, 0.0f);
    }
    const int64_t n_rows = pos0 + i1;  // the last query's context
    for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
      const int64_t nb = std::min(kRows, n_rows - r0);
      for (int64_t i = std::max(i0, r0 - pos0); i < i1; ++i) {  // queries that see row r0
        const int64_t nbi = std::min(nb, pos0 + i + 1 - r0);
        const float* qh = q + (i * n_heads + h) * D;
        float bm = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < nbi; ++j) {
          const int64_t t = r0 + j;
          s[j] = (dot(qh, kv + (t * n_heads + h) * KV, nope) + dot(qh + nope, k_pe + t * k_pe_ld, P)) * scale;
          bm = std::max(bm, s[j]);
        }
        float& mi = m[i - i0];
        float* o = out + (i * n_heads + h) * V;
        if (bm > mi) {
          const float c = std::exp(mi - bm);  // 0 on the first block
          l[i - i0] *= c;
#pragma omp simd
          for (int64_t x = 0; x < V; ++x) o[x] *= c;
          mi = bm;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < nbi; ++j) {
          const float p = std::exp(s[j] - mi);
          sum += p;
          axpy(p, kv + ((r0 + j) * n_heads + h) * KV + nope, o, V);
        }
        l[i - i0] += sum;
      }
    }
    for (int64_t i = i0; i < i1; ++i) {
      const float inv = 1.0f / l[i - i0];
      float* o = out + (i * n_heads + h) * V;
#pragma omp simd
      for (int64_t x = 0; x < V; ++x) o[x] *= inv;
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

const MlaTable& mla_table() {
  static const MlaTable table{indexer_scores_chunk_impl, indexer_scores_paged_impl, attention_absorbed,
                              attention_sparse, attention_naive};
  return table;
}

}  // namespace infera::kernels::INFERA_KERNEL_NS
