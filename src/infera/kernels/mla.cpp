#include "infera/kernels/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/kernels/cpu/mla_dispatch.h"
#include "infera/tensor/dtype.h"

namespace infera::kernels {

void rope_interleaved(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t offset, int64_t rot_dim,
                      const int32_t* positions, const float* inv_freq, float attn_factor) {
  INFERA_ASSERT(rot_dim % 2 == 0 && offset + rot_dim <= head_stride, "rope_interleaved: bad dims");
  const int64_t half = rot_dim / 2;
  std::vector<float> cs(static_cast<size_t>(2 * half));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const double pos = positions[t];
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * static_cast<double>(inv_freq[i]);
      cs[2 * i] = static_cast<float>(std::cos(a)) * attn_factor;
      cs[2 * i + 1] = static_cast<float>(std::sin(a)) * attn_factor;
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* p = x + (t * n_heads + h) * head_stride + offset;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c - b * s;
        p[2 * i + 1] = b * c + a * s;
      }
    }
  }
}

namespace {

// Elements [a, b) of one half row.
void load_half_row_part(const void* pool, const float* scales, DType dtype, int64_t row, int64_t hd, int64_t a,
                        int64_t b, float* out) {
  const int64_t n = b - a;
  switch (dtype) {
    case DType::kF32: std::memcpy(out, static_cast<const float*>(pool) + row * hd + a, n * sizeof(float)); return;
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(pool) + row * hd + a;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::kI8: {
      const int8_t* p = static_cast<const int8_t*>(pool) + row * hd + a;
      const float s = scales[row];
      for (int64_t i = 0; i < n; ++i) out[i] = s * static_cast<float>(p[i]);
      return;
    }
    default: fail("MLA latent cache: dtype {} is not supported (f32, bf16 or int8)", dtype_name(dtype));
  }
}

void load_half_row(const void* pool, const float* scales, DType dtype, int64_t row, int64_t hd, float* out) {
  switch (dtype) {
    case DType::kF32: std::memcpy(out, static_cast<const float*>(pool) + row * hd, hd * sizeof(float)); return;
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(pool) + row * hd;
      for (int64_t i = 0; i < hd; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::kI8: {
      const int8_t* p = static_cast<const int8_t*>(pool) + row * hd;
      const float s = scales[row];
      for (int64_t i = 0; i < hd; ++i) out[i] = s * static_cast<float>(p[i]);
      return;
    }
    default: fail("MLA latent cache: dtype {} is not supported (f32, bf16 or int8)", dtype_name(dtype));
  }
}

}  // namespace

void mla_load_latent_cols(const PagedKv& kv, int64_t p0, int64_t p1, int64_t c0, int64_t c1, float* out) {
  INFERA_ASSERT(kv.n_kv_heads == 1, "mla_load_latent_cols: the latent cache has one KV head");
  const int64_t hd = kv.head_dim, bs = kv.block_size, w = c1 - c0;
  INFERA_ASSERT(c0 >= 0 && c0 <= c1 && c1 <= 2 * hd, "mla_load_latent_cols: columns out of range");
  // The part of [c0, c1) in the K half, then in the V half.
  const int64_t k0 = std::min(c0, hd), k1 = std::min(c1, hd);
  const int64_t v0 = std::max(c0, hd) - hd, v1 = std::max(c1, hd) - hd;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t slot = static_cast<int64_t>(kv.block_table[p / bs]) * bs + p % bs;
    const int64_t row = kv_row(slot, 0, bs, 1);
    float* o = out + (p - p0) * w;
    if (k1 > k0) load_half_row_part(kv.k_pool, kv.k_scales, kv.dtype, row, hd, k0, k1, o);
    if (v1 > v0) load_half_row_part(kv.v_pool, kv.v_scales, kv.dtype, row, hd, v0, v1, o + (k1 - k0));
  }
}

void mla_load_latent_rows(const PagedKv& kv, const int32_t* positions, int64_t n, float* out) {
  INFERA_ASSERT(kv.n_kv_heads == 1, "mla_load_latent_rows: the latent cache has one KV head");
  const int64_t hd = kv.head_dim, bs = kv.block_size;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = positions[j];
    const int64_t slot = static_cast<int64_t>(kv.block_table[p / bs]) * bs + p % bs;
    const int64_t row = kv_row(slot, 0, bs, 1);
    float* o = out + j * 2 * hd;
    load_half_row(kv.k_pool, kv.k_scales, kv.dtype, row, hd, o);
    load_half_row(kv.v_pool, kv.v_scales, kv.dtype, row, hd, o + hd);
  }
}

void mla_load_latent(const PagedKv& kv, int64_t p0, int64_t p1, float* out) {
  INFERA_ASSERT(kv.n_kv_heads == 1, "mla_load_latent: the latent cache has one KV head");
  const int64_t hd = kv.head_dim, bs = kv.block_size;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t slot = static_cast<int64_t>(kv.block_table[p / bs]) * bs + p % bs;
    const int64_t row = kv_row(slot, 0, bs, 1);
    float* o = out + (p - p0) * 2 * hd;
    load_half_row(kv.k_pool, kv.k_scales, kv.dtype, row, hd, o);
    load_half_row(kv.v_pool, kv.v_scales, kv.dtype, row, hd, o + hd);
  }
}

namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

const MlaTable& mla_table_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      INFERA_ASSERT(cpu_features().has_avx512_path(), "kernel path avx512 is not available on this CPU");
      return cpu_avx512::mla_table();
    case Isa::kAvx2:
      INFERA_ASSERT(cpu_features().has_avx2_path(), "kernel path avx2 is not available on this CPU");
      return cpu_avx2::mla_table();
    case Isa::kScalar: break;
  }
  return cpu_scalar::mla_table();
}

}  // namespace

void indexer_scores_chunk(Isa isa, const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const float* keys, int64_t ld, float* out, int64_t out_ld) {
  mla_table_for(isa).indexer_scores_chunk(q, w, n, n_heads, d, pos0, keys, ld, out, out_ld);
}

void indexer_scores_chunk(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const float* keys, int64_t ld, float* out, int64_t out_ld) {
  indexer_scores_chunk(best_isa(), q, w, n, n_heads, d, pos0, keys, ld, out, out_ld);
}

void indexer_scores_paged(Isa isa, const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const PagedKv& kv, int64_t c0, float* out, int64_t out_ld) {
  INFERA_ASSERT(kv.n_kv_heads == 1, "indexer_scores_paged: the latent cache has one KV head");
  INFERA_ASSERT(c0 >= 0 && c0 + d <= 2 * kv.head_dim, "indexer_scores_paged: columns out of range");
  if (kv.dtype != DType::kF32 && kv.dtype != DType::kBF16 && kv.dtype != DType::kI8)
    fail("MLA latent cache: dtype {} is not supported (f32, bf16 or int8)", dtype_name(kv.dtype));
  mla_table_for(isa).indexer_scores_paged(q, w, n, n_heads, d, pos0, kv, c0, out, out_ld);
}

void indexer_scores_paged(const float* q, const float* w, int64_t n, int64_t n_heads, int64_t d, int64_t pos0,
                          const PagedKv& kv, int64_t c0, float* out, int64_t out_ld) {
  indexer_scores_paged(best_isa(), q, w, n, n_heads, d, pos0, kv, c0, out, out_ld);
}

void mla_attention_absorbed(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat,
                            int64_t ld, int64_t R, int64_t P, float scale, float* out) {
  mla_table_for(isa).attention_absorbed(q, n_tokens, n_heads, pos0, lat, ld, R, P, scale, out);
}

void mla_attention_absorbed(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat,
                            int64_t ld, int64_t R, int64_t P, float scale, float* out) {
  mla_attention_absorbed(best_isa(), q, n_tokens, n_heads, pos0, lat, ld, R, P, scale, out);
}

void mla_attention_naive(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv,
                         int64_t nope, int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale,
                         float* out) {
  mla_table_for(isa).attention_naive(q, n_tokens, n_heads, pos0, kv, nope, V, k_pe, k_pe_ld, P, scale, out);
}

void mla_attention_naive(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv, int64_t nope,
                         int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale, float* out) {
  mla_attention_naive(best_isa(), q, n_tokens, n_heads, pos0, kv, nope, V, k_pe, k_pe_ld, P, scale, out);
}

void indexer_scores(const float* q, const float* w, int64_t n_heads, int64_t d, const float* keys, int64_t ld,
                    int64_t n_keys, float* out) {
  for (int64_t s = 0; s < n_keys; ++s) {
    const float* k = keys + s * ld;
    float acc = 0.0f;
    for (int64_t h = 0; h < n_heads; ++h) acc += w[h] * std::max(0.0f, dot(q + h * d, k, d));
    out[s] = acc;
  }
}

namespace {

// A float's bits mapped so that unsigned order is the float order (-0.0 as 0.0).
inline uint32_t order_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace

void topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out) {
  INFERA_ASSERT(k >= 0 && k <= n, "topk_indices: k out of range");
  if (k == 0) return;
  // Radix select of the k-th largest key, 12 + 10 + 10 bits: each pass histograms the
  // remaining candidates (those whose higher bits equal the threshold's so far), finds the
  // digit of the k-th largest, and keeps the candidates with that digit.
  static thread_local std::vector<uint32_t> cand, next;
  constexpr int kShifts[3] = {20, 10, 0};
  constexpr int kBits[3] = {12, 10, 10};
  uint32_t prefix = 0;  // the threshold's bits decided so far
  int64_t above = 0;  // candidates already known to beat the threshold
  int64_t n_cand = n;
  static thread_local std::vector<uint32_t> hist;
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShifts[pass], bins = 1 << kBits[pass];
    const uint32_t digit_mask = static_cast<uint32_t>(bins - 1);
    hist.assign(static_cast<size_t>(bins), 0);
    if (pass == 0) {
      for (int64_t i = 0; i < n; ++i) ++hist[order_key(scores[i]) >> shift];
    } else {
      for (int64_t i = 0; i < n_cand; ++i) ++hist[(cand[i] >> shift) & digit_mask];
    }
    // The digit holding the (k - above)-th largest.
    int64_t need = k - above, digit = bins - 1;
    for (;; --digit) {
      if (static_cast<int64_t>(hist[digit]) >= need) break;
      need -= hist[digit];
      above += hist[digit];
    }
    prefix |= static_cast<uint32_t>(digit) << shift;
    if (pass == 2) break;
    // Keep the candidates with this digit (the threshold's bits so far).
    const uint32_t keep_mask = ~((uint32_t{1} << shift) - 1);
    next.resize(static_cast<size_t>(hist[digit]));
    int64_t m = 0;
    if (pass == 0) {
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t key = order_key(scores[i]);
        if ((key & keep_mask) == prefix) next[m++] = key;
      }
    } else {
      for (int64_t i = 0; i < n_cand; ++i)
        if ((cand[i] & keep_mask) == prefix) next[m++] = cand[i];
    }
    cand.swap(next);
    n_cand = m;
  }
  // prefix is now the k-th largest key: take every key above it and, in position order,
  // as many equal to it as are still needed.
  int64_t equal_left = k - above, j = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = order_key(scores[i]);
    if (key > prefix || (key == prefix && equal_left-- > 0)) out[j++] = static_cast<int32_t>(i);
  }
  INFERA_ASSERT(j == k, "topk_indices: selection count mismatch");
}

void mla_attention_sparse(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, const float* lat, int64_t ld,
                          int64_t R, int64_t P, const int32_t* idx, const int32_t* n_idx, int64_t idx_stride,
                          float scale, float* out) {
  mla_table_for(isa).attention_sparse(q, n_tokens, n_heads, lat, ld, R, P, idx, n_idx, idx_stride, scale, out);
}

void mla_attention_sparse(const float* q, int64_t n_tokens, int64_t n_heads, const float* lat, int64_t ld, int64_t R,
                          int64_t P, const int32_t* idx, const int32_t* n_idx, int64_t idx_stride, float scale,
                          float* out) {
  mla_attention_sparse(best_isa(), q, n_tokens, n_heads, lat, ld, R, P, idx, n_idx, idx_stride, scale, out);
}

void moe_route_sigmoid(const float* logits, const float* bias, int64_t n_tokens, int64_t n_experts, int64_t k,
                       int64_t n_group, int64_t topk_group, bool normalize, float scaling, int32_t* ids,
                       float* weights) {
  INFERA_ASSERT(k >= 1 && k <= n_experts, "moe_route_sigmoid: bad k");
  const bool grouped = n_group > 1 && topk_group < n_group;
  if (grouped) {
    INFERA_ASSERT(n_experts % n_group == 0 && topk_group >= 1, "moe_route_sigmoid: bad groups");
    INFERA_ASSERT(k <= topk_group * (n_experts / n_group), "moe_route_sigmoid: k exceeds the experts of the groups");
  }
  const int64_t per_group = grouped ? n_experts / n_group : n_experts;
  std::vector<float> s(static_cast<size_t>(n_experts)), sel(static_cast<size_t>(n_experts));
  std::vector<float> gscore(static_cast<size_t>(std::max<int64_t>(n_group, 1)));
  std::vector<int32_t> order(static_cast<size_t>(std::max<int64_t>(n_experts, n_group)));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * n_experts;
    for (int64_t e = 0; e < n_experts; ++e) {
      s[e] = 1.0f / (1.0f + std::exp(-l[e]));
      sel[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
    if (grouped) {
      for (int64_t g = 0; g < n_group; ++g) {
        const float* x = sel.data() + g * per_group;
        float a = kNegInf, b = kNegInf;  // the two best
        for (int64_t j = 0; j < per_group; ++j) {
          if (x[j] > a) {
            b = a;
            a = x[j];
          } else if (x[j] > b) {
            b = x[j];
          }
        }
        gscore[g] = per_group >= 2 ? a + b : a;
      }
      std::iota(order.begin(), order.begin() + n_group, 0);
      std::stable_sort(order.begin(), order.begin() + n_group,
                       [&](int32_t x, int32_t y) { return gscore[x] > gscore[y]; });
      for (int64_t r = topk_group; r < n_group; ++r) {
        const int64_t g = order[r];
        std::fill(sel.begin() + g * per_group, sel.begin() + (g + 1) * per_group, kNegInf);
      }
    }
    std::iota(order.begin(), order.begin() + n_experts, 0);
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + n_experts,
                      [&](int32_t x, int32_t y) { return sel[x] > sel[y] || (sel[x] == sel[y] && x < y); });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[j];
      weights[t * k + j] = s[order[j]];
      sum += s[order[j]];
    }
    const float mul = normalize ? scaling / (sum + 1e-20f) : scaling;
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] *= mul;
  }
}

namespace ref {

void indexer_scores(const float* q, const float* w, int64_t n_heads, int64_t d, const float* keys, int64_t ld,
                    int64_t n_keys, float* out) {
  for (int64_t s = 0; s < n_keys; ++s) {
    double acc = 0.0;
    for (int64_t h = 0; h < n_heads; ++h) {
      double qk = 0.0;
      for (int64_t x = 0; x < d; ++x) qk += static_cast<double>(q[h * d + x]) * keys[s * ld + x];
      acc += static_cast<double>(w[h]) * std::max(0.0, qk);
    }
    out[s] = static_cast<float>(acc);
  }
}

void topk_indices(const float* scores, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [scores](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  std::copy(order.begin(), order.begin() + k, out);
  std::sort(out, out + k);
}

namespace {

// One query's attention in double: softmax over the scores s of the rows that take part
// (keep[t]; every row without keep), then out[r] = the weighted sum of value(t, r) over
// them, r < width (zeros when no row takes part).
template <typename Value>
void softmax_mix(std::vector<double>& s, const uint8_t* keep, int64_t width, const Value& value, float* out) {
  const int64_t n = static_cast<int64_t>(s.size());
  double m = -1e300;
  for (int64_t t = 0; t < n; ++t) {
    if (!keep || keep[t]) m = std::max(m, s[t]);
  }
  double sum = 0.0;
  for (int64_t t = 0; t < n; ++t) sum += !keep || keep[t] ? (s[t] = std::exp(s[t] - m)) : (s[t] = 0.0);
  for (int64_t r = 0; r < width; ++r) {
    double acc = 0.0;
    for (int64_t t = 0; t < n; ++t) acc += s[t] * value(t, r);
    out[r] = sum > 0 ? static_cast<float>(acc / sum) : 0.0f;
  }
}

double dot_d(const float* a, const float* b, int64_t n) {
  double acc = 0.0;
  for (int64_t d = 0; d < n; ++d) acc += static_cast<double>(a[d]) * b[d];
  return acc;
}

}  // namespace

void mla_attention_masked(const float* q, int64_t n_tokens, int64_t n_heads, int64_t n_ctx, const float* lat,
                          int64_t ld, int64_t R, int64_t P, const uint8_t* mask, float scale, float* out) {
  const int64_t D = R + P;
  for (int64_t i = 0; i < n_tokens; ++i) {
    const uint8_t* keep = mask + i * n_ctx;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qh = q + (i * n_heads + h) * D;
      std::vector<double> s(static_cast<size_t>(n_ctx), 0.0);
      for (int64_t t = 0; t < n_ctx; ++t) {
        if (keep[t]) s[t] = dot_d(qh, lat + t * ld, D) * scale;
      }
      softmax_mix(
          s, keep, R, [&](int64_t t, int64_t r) { return lat[t * ld + r]; }, out + (i * n_heads + h) * R);
    }
  }
}

void mla_attention_absorbed(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* lat,
                            int64_t ld, int64_t R, int64_t P, float scale, float* out) {
  const int64_t D = R + P;
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t n_ctx = pos0 + i + 1;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qh = q + (i * n_heads + h) * D;
      std::vector<double> s(static_cast<size_t>(n_ctx));
      for (int64_t t = 0; t < n_ctx; ++t) s[t] = dot_d(qh, lat + t * ld, D) * scale;
      softmax_mix(
          s, nullptr, R, [&](int64_t t, int64_t r) { return lat[t * ld + r]; }, out + (i * n_heads + h) * R);
    }
  }
}

void mla_attention_naive(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const float* kv, int64_t nope,
                         int64_t V, const float* k_pe, int64_t k_pe_ld, int64_t P, float scale, float* out) {
  const int64_t D = nope + P, KV = nope + V;
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t n_ctx = pos0 + i + 1;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qh = q + (i * n_heads + h) * D;
      std::vector<double> s(static_cast<size_t>(n_ctx));
      for (int64_t t = 0; t < n_ctx; ++t) {
        double acc = dot_d(qh, kv + (t * n_heads + h) * KV, nope);
        for (int64_t d = 0; d < P; ++d) acc += static_cast<double>(qh[nope + d]) * k_pe[t * k_pe_ld + d];
        s[t] = acc * scale;
      }
      softmax_mix(
          s, nullptr, V, [&](int64_t t, int64_t r) { return kv[(t * n_heads + h) * KV + nope + r]; },
          out + (i * n_heads + h) * V);
    }
  }
}

}  // namespace ref

}  // namespace infera::kernels
