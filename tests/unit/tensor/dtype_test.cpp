#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "infera/tensor/dtype.h"

using namespace infera;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly half way between two bf16 values: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16MatchesExhaustiveRoundTrip) {
  // Every finite f16 value converts to f32 and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    const float f = f16_to_f32(v);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), v) << "h=" << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
}

TEST(DType, F16RoundsToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = d(rng) * (i % 3 == 0 ? 1e-6f : 1.0f);
    const uint16_t h = f32_to_f16(f);
    const float back = f16_to_f32(h);
    if (std::isinf(back)) continue;
    // No other f16 is strictly closer.
    const float up = f16_to_f32(static_cast<uint16_t>(h + 1));
    const float dn = f16_to_f32(static_cast<uint16_t>(h - 1));
    if (!std::isnan(up) && !std::isinf(up)) {
      ASSERT_LE(std::fabs(back - f), std::fabs(up - f)) << f;
    }
    if (!std::isnan(dn) && !std::isinf(dn) && (h & 0x7fff) != 0) {
      ASSERT_LE(std::fabs(back - f), std::fabs(dn - f)) << f;
    }
  }
}
