// kernels::QuantExtras (pre-quantized checkpoints): static int8 activations computed exactly
// as the formula says, a per-row zero-point correction on w8a8, int8 weights of -128, and
// the input permutation seen by dequantize_row, on every kernel path.
#include <gtest/gtest.h>

#include <cmath>
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
  for (Isa isa : test::available_isas()) {
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
  for (Isa isa : test::available_isas()) {
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

}  // namespace
}  // namespace infera::kernels
