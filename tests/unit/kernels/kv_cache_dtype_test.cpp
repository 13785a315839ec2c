// Paged attention over bf16 and int8 KV caches (--kv-dtype), every SIMD path.
//
// Two checks per case:
//  1. exact reading: the kernel over a bf16/int8 pool equals the f32 contiguous reference
//     run on the pool's own values dequantized (the same 2e-5 bound as the f32 kernel
//     test), so any slip in conversion, scales or block lookup shows;
//  2. quantization error: against the reference on the ORIGINAL f32 K/V, within the bound
//     derived from the storage format (rigorous, computed per case):
//       each stored element is off by at most e_k (K) / e_v (V): bf16 |x| 2^-8 (8 significant bits), int8 the
//       row's max|x| / 254; so each score q.k * scale moves by at most
//       delta = scale * sum|q| * e_k, every softmax weight by a factor within e^(+-2 delta),
//       and the output (a convex combination of V rows) by at most
//       max|v| (e^(2 delta) - 1) + e_v.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/kernels/kernels.h"

namespace infera::kernels {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

using test::available_isas;

// A paged cache of `dtype` holding n_ctx tokens in shuffled blocks of a larger pool
// (garbage elsewhere), plus the original f32 rows and the stored values read back as f32.
struct QuantCache {
  DType dtype;
  int64_t block_size, n_kv, head_dim;
  std::vector<uint8_t> k_pool, v_pool;  // [pool_blocks, n_kv, block_size, head_dim] of dtype
  std::vector<float> k_scales, v_scales;  // int8: [pool_blocks, n_kv, block_size]
  std::vector<int32_t> block_table;
  std::vector<float> k, v;  // original [n_ctx, n_kv, head_dim]
  std::vector<float> k_stored, v_stored;  // as stored, read back as f32

  QuantCache(DType dt, int64_t n_ctx, int64_t bs, int64_t n_kv_, int64_t d, uint32_t seed)
      : dtype(dt), block_size(bs), n_kv(n_kv_), head_dim(d) {
    const int64_t blocks = (n_ctx + bs - 1) / bs, pool_blocks = blocks + 3;
    const int64_t row = n_kv * d;
    k = random_floats(n_ctx * row, seed);
    v = random_floats(n_ctx * row, seed + 1, -3.0f, 3.0f);
    // A few outliers, as real K rows have: int8's per-row scale must cope.
    for (int64_t i = 0; i < n_ctx * row; i += 97) k[i] *= 8.0f;
    const size_t elem = dtype_size(dtype);
    k_pool.assign(pool_blocks * bs * row * elem, 0x5a);  // garbage where unused
    v_pool.assign(pool_blocks * bs * row * elem, 0xa5);
    k_scales.assign(pool_blocks * bs * n_kv, 1e3f);
    v_scales.assign(pool_blocks * bs * n_kv, 1e3f);
    std::vector<int32_t> ids(pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    block_table.assign(ids.begin(), ids.begin() + blocks);
    std::vector<int64_t> slots(n_ctx);
    for (int64_t t = 0; t < n_ctx; ++t) slots[t] = int64_t(block_table[t / bs]) * bs + t % bs;
    store_kv_rows(dtype, k.data(), row, n_ctx, slots.data(), bs, n_kv, d, k_pool.data(), k_scales.data());
    store_kv_rows(dtype, v.data(), row, n_ctx, slots.data(), bs, n_kv, d, v_pool.data(), v_scales.data());
    k_stored.resize(k.size());
    v_stored.resize(v.size());
    for (int64_t t = 0; t < n_ctx; ++t) {
      for (int64_t i = 0; i < row; ++i) {
        const int64_t index = kv_row(slots[t], i / d, bs, n_kv) * d + i % d;
        k_stored[t * row + i] = load_kv_value(dtype, k_pool.data(), k_scales.data(), index, d);
        v_stored[t * row + i] = load_kv_value(dtype, v_pool.data(), v_scales.data(), index, d);
      }
    }
  }
  PagedKv view() const {
    return PagedKv{k_pool.data(),      v_pool.data(), block_size,      n_kv,           head_dim,
                   block_table.data(), dtype,         k_scales.data(), v_scales.data()};
  }
  // Largest error of one stored element against the original, as the format guarantees.
  float element_bound(const std::vector<float>& x) const {
    const float amax =
        *std::max_element(x.begin(), x.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    return dtype == DType::kBF16 ? std::fabs(amax) * std::ldexp(1.0f, -8) : std::fabs(amax) / 254.0f;
  }
};

struct Case {
  int64_t n_ctx, n_tokens, n_heads, n_kv, head_dim, block_size;
};

void check(Isa isa, DType dtype, const Case& c) {
  const std::string what = std::string(isa_name(isa)) + " " + std::string(dtype_name(dtype)) +
                           " ctx=" + std::to_string(c.n_ctx) + " n_tokens=" + std::to_string(c.n_tokens) +
                           " heads=" + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) +
                           " head_dim=" + std::to_string(c.head_dim) + " block=" + std::to_string(c.block_size);
  const int64_t pos0 = c.n_ctx - c.n_tokens;
  const QuantCache cache(dtype, c.n_ctx, c.block_size, c.n_kv, c.head_dim, uint32_t(c.n_ctx * 31 + c.n_heads));
  const auto q = random_floats(c.n_tokens * c.n_heads * c.head_dim, uint32_t(c.n_ctx + 7), -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  std::vector<float> out(q.size(), NAN), want_stored(q.size()), want_f32(q.size());
  attention_paged(isa, q.data(), c.n_tokens, c.n_heads, pos0, cache.view(), scale, out.data());
  ref::attention_contiguous(q.data(), c.n_tokens, c.n_heads, pos0, cache.k_stored.data(), cache.v_stored.data(),
                            c.n_ctx, c.n_kv, c.head_dim, scale, want_stored.data());
  ref::attention_contiguous(q.data(), c.n_tokens, c.n_heads, pos0, cache.k.data(), cache.v.data(), c.n_ctx, c.n_kv,
                            c.head_dim, scale, want_f32.data());
  // Bound of check 2 (see the file comment), with the largest |q| row sum.
  float q_l1 = 0.0f;
  for (int64_t r = 0; r < c.n_tokens * c.n_heads; ++r) {
    float s = 0.0f;
    for (int64_t d = 0; d < c.head_dim; ++d) s += std::fabs(q[r * c.head_dim + d]);
    q_l1 = std::max(q_l1, s);
  }
  const float v_max = std::fabs(
      *std::max_element(cache.v.begin(), cache.v.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
  const float delta = scale * q_l1 * cache.element_bound(cache.k);
  const float bound = v_max * std::expm1(2.0f * delta) + cache.element_bound(cache.v) + 2e-5f * v_max;
  double sum_err = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], want_stored[i], 2e-5f * v_max) << what << " (stored values) at " << i;
    ASSERT_NEAR(out[i], want_f32[i], bound) << what << " (original f32) at " << i;
    sum_err += std::fabs(out[i] - want_f32[i]);
  }
  // The bound is a worst case; typical errors are far below it. Also assert that the
  // quantization is not a no-op by accident (f32 stored back unchanged would pass check 1).
  const double mean_err = sum_err / out.size();
  EXPECT_LT(mean_err, 0.1 * bound) << what;
  EXPECT_GT(mean_err, 0.0) << what;
}

class KvCacheDtypeTest : public ::testing::TestWithParam<Isa> {};

TEST_P(KvCacheDtypeTest, DecodeOverBf16AndInt8MatchesReference) {
  for (DType dtype : {DType::kBF16, DType::kI8}) {
    for (int64_t ctx : {1, 15, 16, 17, 33, 1000, 2100}) {  // block boundaries; 1000+: split-K chunks
      for (int64_t ratio : {1, 4}) check(GetParam(), dtype, {ctx, 1, 2 * ratio, 2, 64, 16});
    }
    check(GetParam(), dtype, {40, 1, 8, 4, 8, 16});  // stories260K shape: head_dim 8 < lanes
    check(GetParam(), dtype, {700, 1, 4, 1, 128, 32});  // one kv head: several key chunks
    check(GetParam(), dtype, {70, 1, 4, 2, 20, 16});  // head_dim not a multiple of the lanes
  }
}

TEST_P(KvCacheDtypeTest, PrefillChunkOverBf16AndInt8MatchesReference) {
  for (DType dtype : {DType::kBF16, DType::kI8}) {
    for (int64_t ctx : {15, 16, 17, 33, 1000}) check(GetParam(), dtype, {ctx, std::min<int64_t>(ctx, 9), 4, 2, 32, 16});
    check(GetParam(), dtype, {17, 17, 4, 2, 24, 16});  // whole prompt from pos0 = 0
    check(GetParam(), dtype, {50, 3, 1, 1, 8, 4});  // block_size 4
    check(GetParam(), dtype, {1026, 5, 2, 1, 8, 512});
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KvCacheDtypeTest, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

TEST(KvCacheStore, Int8RoundTripWithinHalfAStepPerHead) {
  const int64_t n_kv = 3, d = 40, rows = 5;
  auto x = random_floats(rows * n_kv * d, 11, -4.0f, 4.0f);
  std::fill(x.begin() + n_kv * d, x.begin() + n_kv * d + d, 0.0f);  // row 1, head 0: all zero
  const std::vector<int64_t> slots = {4, 0, 7, 2, 5};
  const int64_t bs = 4;  // two blocks of 4 slots
  std::vector<int8_t> pool(8 * n_kv * d, 99);
  std::vector<float> scales(8 * n_kv, -1.0f);
  store_kv_rows(DType::kI8, x.data(), n_kv * d, rows, slots.data(), bs, n_kv, d, pool.data(), scales.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < n_kv; ++h) {
      const float* xh = x.data() + (r * n_kv + h) * d;
      float amax = 0.0f;
      for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(xh[i]));
      // Head h's rows of a block are contiguous: slot 5 (block 1, offset 1), head 2 is row
      // (1 * 3 + 2) * 4 + 1.
      const int64_t row = kv_row(slots[r], h, bs, n_kv);
      EXPECT_EQ(row, (slots[r] / bs * n_kv + h) * bs + slots[r] % bs);
      EXPECT_FLOAT_EQ(scales[row], amax / 127.0f);
      for (int64_t i = 0; i < d; ++i) {
        const int64_t index = row * d + i;
        const float back = load_kv_value(DType::kI8, pool.data(), scales.data(), index, d);
        EXPECT_LE(std::fabs(back - xh[i]), amax / 254.0f * 1.0001f + 1e-7f) << "row " << r << " head " << h;
        EXPECT_GE(pool[index], -127);
      }
    }
  }
}

TEST(KvCacheStore, Bf16RoundsToNearest) {
  const int64_t n_kv = 2, d = 16;
  const auto x = random_floats(n_kv * d, 12, -100.0f, 100.0f);
  const int64_t slot = 1;
  std::vector<uint16_t> pool(2 * n_kv * d);
  store_kv_rows(DType::kBF16, x.data(), n_kv * d, 1, &slot, 2, n_kv, d, pool.data(), nullptr);
  for (int64_t i = 0; i < n_kv * d; ++i) {
    const float back = load_kv_value(DType::kBF16, pool.data(), nullptr, kv_row(slot, i / d, 2, n_kv) * d + i % d, d);
    EXPECT_LE(std::fabs(back - x[i]), std::fabs(x[i]) * std::ldexp(1.0f, -8));
  }
}

TEST(KvCacheStore, RejectsOtherDtypes) {
  const float x[4] = {1, 2, 3, 4};
  const int64_t slot = 0;
  uint16_t pool[4];
  EXPECT_THROW(store_kv_rows(DType::kF16, x, 4, 1, &slot, 1, 1, 4, pool, nullptr), Error);
  const int32_t table[1] = {0};
  const PagedKv kv{pool, pool, 16, 1, 4, table, DType::kF16};
  float q[4] = {}, out[4];
  EXPECT_THROW(attention_paged(q, 1, 1, 0, kv, 1.0f, out), Error);
}

}  // namespace
}  // namespace infera::kernels
