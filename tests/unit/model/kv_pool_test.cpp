// KV pool sizing and storage per dtype, and the planner's agreement with it.
#include <gtest/gtest.h>

#include <random>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/model/config.h"
#include "infera/model/kv_pool.h"
#include "infera/tools/planner.h"

using namespace infera;

namespace {

KvPoolShape tinyllama_like(DType dtype) {
  KvPoolShape s;
  s.num_layers = 22;
  s.num_blocks = 8;
  s.block_size = 16;
  s.n_kv_heads = 4;
  s.head_dim = 64;
  s.dtype = dtype;
  return s;
}

}  // namespace

TEST(KvPool, BytesPerTokenByDtype) {
  const KvPoolShape f32 = tinyllama_like(DType::kF32), bf16 = tinyllama_like(DType::kBF16),
                    int8 = tinyllama_like(DType::kI8);
  EXPECT_EQ(f32.bytes_per_token(), 22 * 2 * 4 * 64 * 4);
  EXPECT_EQ(bf16.bytes_per_token() * 2, f32.bytes_per_token());
  EXPECT_EQ(int8.bytes_per_token(), 22 * 2 * 4 * (64 + 4));  // int8 values + an f32 scale per head
  EXPECT_EQ(f32.bytes_per_block(), 16 * f32.bytes_per_token());
}

TEST(KvPool, BudgetHoldsTwiceAndNearlyFourTimesTheTokens) {
  const int64_t budget = int64_t{1} << 30;
  const double f32 = static_cast<double>(kv_blocks_for_budget(budget, tinyllama_like(DType::kF32)));
  const double bf16 = static_cast<double>(kv_blocks_for_budget(budget, tinyllama_like(DType::kBF16)));
  const double int8 = static_cast<double>(kv_blocks_for_budget(budget, tinyllama_like(DType::kI8)));
  EXPECT_NEAR(bf16 / f32, 2.0, 0.01);
  EXPECT_NEAR(int8 / f32, 4.0 * 64 / 68, 0.01);  // 3.76x: the scales cost 4 of every 68 bytes
}

TEST(KvPool, WriteConvertsAndViewReadsBack) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8}) {
    KvPoolShape shape = tinyllama_like(dtype);
    shape.num_layers = 2;
    KvPool pool(shape);
    EXPECT_GE(pool.reserved_bytes(), shape.num_blocks * shape.bytes_per_block());
    EXPECT_EQ(pool.k_scales(1) != nullptr, dtype == DType::kI8);
    const int64_t row = shape.n_kv_heads * shape.head_dim;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> k(3 * row), v(3 * row);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    const std::vector<int64_t> slots = {5, 17, 127};  // last slot of the last block
    pool.write(1, k.data(), v.data(), row, 3, slots.data());
    const int32_t table[1] = {0};
    const kernels::PagedKv view = pool.view(1, table);
    EXPECT_EQ(view.dtype, dtype);
    const float tol = dtype == DType::kF32 ? 0.0f : dtype == DType::kBF16 ? 2.0f / 256 : 2.0f / 254;
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t e = 0; e < row; ++e) {
        const int64_t index =
            kernels::kv_row(slots[i], e / shape.head_dim, shape.block_size, shape.n_kv_heads) * shape.head_dim +
            e % shape.head_dim;
        EXPECT_NEAR(kernels::load_kv_value(dtype, view.k_pool, view.k_scales, index, shape.head_dim), k[i * row + e],
                    tol);
        EXPECT_NEAR(kernels::load_kv_value(dtype, view.v_pool, view.v_scales, index, shape.head_dim), v[i * row + e],
                    tol);
      }
    }
  }
}

TEST(KvPool, ParsesDtypeNames) {
  EXPECT_EQ(parse_kv_cache_dtype("f32"), DType::kF32);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_kv_cache_dtype("int8"), DType::kI8);
  EXPECT_STREQ(kv_cache_dtype_name(DType::kI8), "int8");
  EXPECT_THROW(parse_kv_cache_dtype("fp8"), Error);
  KvPoolShape bad = tinyllama_like(DType::kF16);
  EXPECT_THROW(KvPool{bad}, Error);
}

// The planner counts exactly the pool's bytes per token for every dtype (GQA config).
TEST(KvPool, PlannerAgreesWithThePool) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  ModelConfig cfg = load_model_config(test::stories_dir());
  for (DType d : {DType::kF32, DType::kBF16, DType::kI8}) {
    PlanOptions o;
    o.kv_dtype = d;
    const Plan plan = plan_memory(cfg, o);
    KvPoolShape shape;
    shape.num_layers = cfg.num_full_attention_layers();
    shape.n_kv_heads = cfg.num_kv_heads;
    shape.head_dim = cfg.head_dim;
    shape.dtype = d;
    EXPECT_EQ(plan.devices.at(0).kv_bytes_per_token, shape.bytes_per_token()) << kv_cache_dtype_name(d);
  }
}
