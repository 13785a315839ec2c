// kernels::QuantExtras (pre-quantized checkpoints): static int8 activations computed exactly
// as the formula says, a per-row zero-point correction on w8a8, int8 weights of -128, and
// the input permutation seen by dequantize_row, and FP8 weights decoded in the kernel (W8A16),
// on every kernel path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/kernels/quant.h"

namespace infera::kernels {
namespace {

TEST(QuantExtras, StaticActivationsAreExact) {
  const int64_t n = 37, k = 100, m = 5;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> w8(-128, 127), qb(-5000, 5000);
  std::vector<int8_t> w(static_cast<size_t>(n * k));
  for (auto& v : w) v = static_cast<int8_t>(w8(rng));
  auto e = std::make_shared<QuantExtras>();
  e->static_act = true;
  e->in_scale = 0.037f;
  e->in_offset = -3.0f;
  std::vector<float> scales(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    e->out_scale.push_back(0.0001f * static_cast<float>(r + 1));
    e->qbias.push_back(qb(rng));
    scales[r] = e->out_scale[r] / e->in_scale;
  }
  std::vector<float> x(static_cast<size_t>(m * k));
  std::normal_distribution<float> nd(0.0f, 2.5f);  // some beyond the int8 range: saturated
  for (auto& v : x) v = nd(rng);
  QuantMatRef q(QuantScheme::kW8A8, n, k, k, w.data(), scales.data());
  q.extras = e;
  for (const test::QuantPath& path : test::quant_paths()) {
    const Isa isa = path.select();
    SCOPED_TRACE(path.name());
    std::vector<float> y(static_cast<size_t>(m * n));
    qmatmul(isa, x.data(), m, q, y.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < n; ++r) {
        int32_t acc = 0;
        for (int64_t j = 0; j < k; ++j) {
          const float v = std::nearbyint(x[i * k + j] * (1.0f / e->in_scale) + e->in_offset);
          acc += static_cast<int32_t>(std::fmin(std::fmax(v, -128.0f), 127.0f)) * w[r * k + j];
        }
        ASSERT_EQ(y[i * n + r], e->out_scale[r] * static_cast<float>(acc + e->qbias[r])) << isa_name(isa);
      }
    // A row slice reads its own rows' constants.
    const QuantMatRef s = quant_row_slice(q, 5, 20);
    std::vector<float> ys(static_cast<size_t>(m * 15));
    qmatmul(isa, x.data(), m, s, ys.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 5; r < 20; ++r) ASSERT_EQ(ys[i * 15 + r - 5], y[i * n + r]);
  }
}

TEST(QuantExtras, W8A8RowCorrectionAndFullRange) {
  const int64_t n = 32, k = 128, m = 3;
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> w8(-128, 127);
  std::vector<int8_t> w(static_cast<size_t>(n * k));
  for (auto& v : w) v = static_cast<int8_t>(w8(rng));
  w[0] = -128;
  std::vector<float> scales(static_cast<size_t>(n)), off(static_cast<size_t>(n));
  auto e = std::make_shared<QuantExtras>();
  e->corr_group = k;
  for (int64_t r = 0; r < n; ++r) {
    scales[r] = 0.01f + 0.001f * static_cast<float>(r);
    off[r] = static_cast<float>(r % 5) - 2.0f;
    e->corr.push_back(-off[r] * scales[r]);  // W = (w - off) * s
  }
  std::vector<float> x(static_cast<size_t>(m * k));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  QuantMatRef q(QuantScheme::kW8A8, n, k, k, w.data(), scales.data());
  q.extras = e;
  for (const test::QuantPath& path : test::quant_paths()) {
    const Isa isa = path.select();
    SCOPED_TRACE(path.name());
    for (bool packed : {false, true}) {
      QuantMatRef p = q;
      if (packed) p.packed = pack_quant_matrix_always(q);
      std::vector<float> y(static_cast<size_t>(m * n));
      qmatmul(isa, x.data(), m, p, y.data());
      for (int64_t i = 0; i < m; ++i) {
        // The kernel's own int8 activations (every path quantizes them identically), then
        // the offset's correction on the float inputs.
        std::vector<int8_t> xq(static_cast<size_t>(k));
        float sx = 0.0f;
        quantize_activations(Isa::kScalar, x.data() + i * k, 1, k, xq.data(), k, &sx, nullptr);
        double sum_x = 0.0;
        for (int64_t j = 0; j < k; ++j) sum_x += x[i * k + j];
        for (int64_t r = 0; r < n; ++r) {
          int64_t dot = 0;
          for (int64_t j = 0; j < k; ++j) dot += int64_t{w[r * k + j]} * xq[j];
          const double want = double{sx} * scales[r] * static_cast<double>(dot) - off[r] * scales[r] * sum_x;
          ASSERT_NEAR(y[i * n + r], want, 1e-4 * (1.0 + std::fabs(want))) << isa_name(isa) << " " << r;
        }
      }
    }
  }
  std::vector<float> row(static_cast<size_t>(k));
  dequantize_row(q, 3, row.data());
  for (int64_t j = 0; j < k; ++j) EXPECT_FLOAT_EQ(row[j], (float(w[3 * k + j]) - off[3]) * scales[3]);
}

TEST(QuantExtras, RejectsInconsistentExtras) {
  std::vector<int8_t> w(64, 1);
  std::vector<float> s(2, 1.0f);
  QuantMatRef q(QuantScheme::kW8A8, 2, 32, 32, w.data(), s.data());
  auto e = std::make_shared<QuantExtras>();
  e->in_perm = {0, 1, 2};
  q.extras = e;
  EXPECT_THROW(check_quant_matrix(q), Error);
  auto e2 = std::make_shared<QuantExtras>();
  e2->static_act = true;  // no output scales
  q.extras = e2;
  EXPECT_THROW(check_quant_matrix(q), Error);
}

TEST(QuantExtras, Fp8E4m3Values) {
  EXPECT_EQ(fp8_e4m3_value(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_value(0x80)));
  EXPECT_EQ(fp8_e4m3_value(0x38), 1.0f);  // exponent 7, mantissa 0
  EXPECT_EQ(fp8_e4m3_value(0x7e), 448.0f);  // the largest
  EXPECT_EQ(fp8_e4m3_value(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_value(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(fp8_e4m3_value(0x0f), 1.875f * std::ldexp(1.0f, -6));  // exponent 1, mantissa 7
  EXPECT_TRUE(std::isnan(fp8_e4m3_value(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_value(0xff)));
}

// FP8 weights (QuantExtras::fp8_group) on shapes that exercise every edge of the SIMD paths:
// columns not a multiple of 8 or 16, a ragged last scale group (block scales: 100 = 3 x 32 + 4,
// 300 = 2 x 128 + 44), per-channel scales (one group), one column, and 1 to 9 tokens (tiles of
// 4 and their remainders). Bytes random, subnormals included (no NaN codes). Every path equals
// the reference up to the order of its f32 sums; a row slice reads its own rows' scales;
// dequantize_row is the decoded byte times its scale, exactly.
TEST(QuantExtras, Fp8WeightsMatchTheReferenceOnEveryPath) {
  struct Shape {
    int64_t n, k, group;
  };
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sd(0.001f, 0.05f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Shape sh : {Shape{37, 100, 32}, Shape{5, 300, 128}, Shape{16, 16, 16}, Shape{33, 7, 7},
                         Shape{70, 1000, 1000}, Shape{3, 1, 1}, Shape{130, 257, 128}}) {
    const int64_t n = sh.n, k = sh.k, ng = (k + sh.group - 1) / sh.group;
    std::vector<uint8_t> w(static_cast<size_t>(n * k));
    for (auto& v : w) {
      do v = static_cast<uint8_t>(byte(rng));
      while ((v & 0x7f) == 0x7f);
    }
    w[0] = 0x01;  // a subnormal
    w[w.size() - 1] = 0xfe;  // -448
    auto e = std::make_shared<QuantExtras>();
    e->fp8_group = sh.group;
    for (int64_t i = 0; i < n * ng; ++i) e->fp8_scale.push_back(sd(rng));
    QuantMatRef q(QuantScheme::kW8A8, n, k, k, w.data(), e->fp8_scale.data());
    q.extras = e;
    ASSERT_NO_THROW(check_quant_matrix(q));
    EXPECT_EQ(pack_quant_matrix_always(q), nullptr);  // computed from the stored bytes
    for (int64_t m : {1, 2, 3, 4, 5, 9}) {
      std::vector<float> x(static_cast<size_t>(m * k));
      for (auto& v : x) v = nd(rng);
      std::vector<float> want(static_cast<size_t>(m * n)), bound(static_cast<size_t>(m * n));
      ref::fp8_matmul(x.data(), m, q, want.data());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t r = 0; r < n; ++r) {
          double mag = 0;  // Σ |w·x|: the scale of the f32 rounding of the sums
          for (int64_t c = 0; c < k; ++c)
            mag += std::fabs(double{fp8_e4m3_value(w[r * k + c])} * e->fp8_scale[r * ng + c / sh.group] * x[i * k + c]);
          bound[i * n + r] = static_cast<float>(1e-5 * mag + 1e-30);
        }
      for (const test::QuantPath& path : test::quant_paths()) {
        const Isa isa = path.select();
        SCOPED_TRACE(path.name());
        SCOPED_TRACE(::testing::Message()
                     << isa_name(isa) << " n " << n << " k " << k << " group " << sh.group << " m " << m);
        std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
        qmatmul(isa, x.data(), m, q, y.data());
        for (size_t i = 0; i < y.size(); ++i) ASSERT_LE(std::fabs(y[i] - want[i]), bound[i]) << i;
        if (n > 4) {
          const QuantMatRef s = quant_row_slice(q, 2, n - 1);
          std::vector<float> ys(static_cast<size_t>(m * (n - 3)));
          qmatmul(isa, x.data(), m, s, ys.data());
          for (int64_t i = 0; i < m; ++i)
            for (int64_t r = 2; r < n - 1; ++r)
              ASSERT_LE(std::fabs(ys[i * (n - 3) + r - 2] - want[i * n + r]), bound[i * n + r]);
        }
      }
    }
    std::vector<float> row(static_cast<size_t>(k));
    dequantize_row(q, n - 1, row.data());
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(row[c], fp8_e4m3_value(w[(n - 1) * k + c]) * e->fp8_scale[(n - 1) * ng + c / sh.group]);
  }
}

TEST(QuantExtras, Fp8RejectsInconsistentLayouts) {
  std::vector<uint8_t> w(64, 0x38);
  auto e = std::make_shared<QuantExtras>();
  e->fp8_group = 16;
  e->fp8_scale.assign(3, 1.0f);  // 2 rows x 2 groups need 4
  QuantMatRef q(QuantScheme::kW8A8, 2, 32, 32, w.data(), e->fp8_scale.data());
  q.extras = e;
  EXPECT_THROW(check_quant_matrix(q), Error);
  e->fp8_scale.assign(4, 1.0f);
  EXPECT_NO_THROW(check_quant_matrix(q));
  QuantMatRef q4(QuantScheme::kW4A16, 2, 32, 32, w.data(), e->fp8_scale.data());
  q4.extras = e;
  EXPECT_THROW(check_quant_matrix(q4), Error);
}

}  // namespace
}  // namespace infera::kernels
