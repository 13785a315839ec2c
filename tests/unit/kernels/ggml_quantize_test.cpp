// The ggml block quantizers (kernels/ggml_quants.h quantize_rows) through the dequantization
// reference: dequantize(quantize(x)) stays within each format's error bound, zero rows stay
// zero, an importance matrix lowers the error where it puts weight, and bad widths are
// errors. (That the bytes equal llama.cpp's is tests/conformance/gguf_quantize.mjs.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "infera/base/error.h"
#include "infera/kernels/ggml_quants.h"

namespace infera::kernels::ggml {
namespace {

struct Case {
  uint32_t type;
  const char* name;
  double rms_bound;  // RMS error / RMS of x, for normal weights
};

// The measured RMS ratios (these normal weights, 512 per row) are 63-69% of these bounds.
const Case kCases[] = {
    {kQ8_0, "Q8_0", 0.008},    {kQ4_0, "Q4_0", 0.13},     {kQ4_1, "Q4_1", 0.12},  {kQ5_0, "Q5_0", 0.065},
    {kQ5_1, "Q5_1", 0.06},     {kQ4_K, "Q4_K", 0.11},     {kQ5_K, "Q5_K", 0.055}, {kQ6_K, "Q6_K", 0.027},
    {kIQ4_NL, "IQ4_NL", 0.11}, {kIQ4_XS, "IQ4_XS", 0.11},
};

std::vector<float> normal_rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<float> round_trip(uint32_t type, const std::vector<float>& x, int64_t rows, int64_t cols,
                              const float* imatrix = nullptr) {
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(type, cols) * rows));
  EXPECT_EQ(quantize_rows(type, x.data(), q.data(), rows, cols, imatrix), std::ssize(q));
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(type, q.data() + r * row_bytes(type, cols), y.data() + r * cols, cols);
  }
  return y;
}

double weighted_error(const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& w,
                      int64_t cols) {
  double e = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = x[i] - y[i];
    e += w.empty() ? d * d : w[i % static_cast<size_t>(cols)] * d * d;
  }
  return e;
}

TEST(GgmlQuantize, RoundTripWithinEachFormatsErrorBound) {
  const int64_t rows = 16, cols = 512;
  const std::vector<float> x = normal_rows(rows * cols, 7);
  double x2 = 0.0;
  for (float v : x) x2 += static_cast<double>(v) * v;
  for (const Case& c : kCases) {
    ASSERT_TRUE(can_quantize(c.type)) << c.name;
    const std::vector<float> y = round_trip(c.type, x, rows, cols);
    const double ratio = std::sqrt(weighted_error(x, y, {}, cols) / x2);
    EXPECT_LT(ratio, c.rms_bound) << c.name;
    EXPECT_GT(ratio, 0.0) << c.name << ": a lossy format reproduced every weight";
    // No single weight is off by more than a fifth of its row's largest magnitude.
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0.0f, emax = 0.0f;
      for (int64_t i = r * cols; i < (r + 1) * cols; ++i) {
        amax = std::max(amax, std::fabs(x[i]));
        emax = std::max(emax, std::fabs(x[i] - y[i]));
      }
      EXPECT_LT(emax, 0.2f * amax) << c.name << " row " << r;
    }
  }
}

TEST(GgmlQuantize, ImportanceMatrixLowersTheErrorItWeights) {
  // Columns 0..63 of every 256 carry 50x the importance of the rest: the weighted error
  // with the importance matrix must be lower than without it.
  const int64_t rows = 32, cols = 512;
  const std::vector<float> x = normal_rows(rows * cols, 11);
  std::vector<float> w(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) w[i] = i % 256 < 64 ? 50.0f : 1.0f;
  for (const Case& c : kCases) {
    if (c.type == kQ8_0) continue;  // Q8_0 has no weighted quantizer (llama.cpp ignores the imatrix)
    const double plain = weighted_error(x, round_trip(c.type, x, rows, cols), w, cols);
    const double weighted = weighted_error(x, round_trip(c.type, x, rows, cols, w.data()), w, cols);
    EXPECT_LT(weighted, plain) << c.name;
  }
}

TEST(GgmlQuantize, ZeroAndConstantRows) {
  const int64_t cols = 256;
  for (const Case& c : kCases) {
    const std::vector<float> zeros(static_cast<size_t>(cols), 0.0f);
    for (float v : round_trip(c.type, zeros, 1, cols)) ASSERT_EQ(v, 0.0f) << c.name;
    const std::vector<float> ones(static_cast<size_t>(cols), 0.5f);
    for (float v : round_trip(c.type, ones, 1, cols)) ASSERT_NEAR(v, 0.5f, 0.5f * 0.03f) << c.name;
  }
}

TEST(GgmlQuantize, RowsAreIndependentAndDeterministic) {
  // Quantizing 4 rows at once gives the bytes of quantizing each alone, every time.
  const int64_t cols = 512;
  const std::vector<float> x = normal_rows(4 * cols, 3);
  for (const Case& c : kCases) {
    const int64_t rb = row_bytes(c.type, cols);
    std::vector<uint8_t> all(static_cast<size_t>(4 * rb)), one(static_cast<size_t>(rb));
    quantize_rows(c.type, x.data(), all.data(), 4, cols);
    for (int64_t r = 0; r < 4; ++r) {
      quantize_rows(c.type, x.data() + r * cols, one.data(), 1, cols);
      EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * rb, static_cast<size_t>(rb))) << c.name << " row " << r;
    }
  }
}

TEST(GgmlQuantize, WidthsThatAreNotWholeBlocksAreErrors) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> q(4096);
  EXPECT_THROW(quantize_rows(kQ4_K, x.data(), q.data(), 1, 288), Error);  // 288: not 256-blocks
  EXPECT_THROW(quantize_rows(kQ8_0, x.data(), q.data(), 1, 100), Error);
  EXPECT_THROW(quantize_rows(kQ2_K, x.data(), q.data(), 1, 256), Error);  // no quantizer
  EXPECT_FALSE(can_quantize(kF16));
}

}  // namespace
}  // namespace infera::kernels::ggml
