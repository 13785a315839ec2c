// Quantized kernels (kernels/quant.h): every ISA path against the scalar reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/kernels/quant.h"

namespace infera::kernels {
namespace {

std::vector<test::QuantPath> paths() { return test::quant_paths(); }  // (AVX2: both kernel sets)

// A random quantized matrix with its backing storage.
struct TestMatrix {
  std::vector<uint8_t> q;
  std::vector<uint8_t> scales;
  QuantMatRef ref;
};

TestMatrix random_matrix(QuantScheme scheme, int64_t n, int64_t k, int64_t gs, std::mt19937& rng,
                         bool unit_scales = false) {
  TestMatrix m;
  const bool int4 = scheme_is_int4(scheme);
  if (!int4) gs = k;
  m.q.resize(static_cast<size_t>(int4 ? n * k / 2 : n * k));
  std::uniform_int_distribution<int> byte(0, 255), s8(-127, 127);
  for (auto& b : m.q) b = int4 ? static_cast<uint8_t>(byte(rng)) : static_cast<uint8_t>(static_cast<int8_t>(s8(rng)));
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  const int64_t groups = k / gs;
  if (int4) {
    m.scales.resize(static_cast<size_t>(n * groups * 2));
    auto* p = reinterpret_cast<uint16_t*>(m.scales.data());
    for (int64_t i = 0; i < n * groups; ++i) p[i] = f32_to_f16(unit_scales ? 1.0f : sc(rng));
  } else {
    m.scales.resize(static_cast<size_t>(n * 4));
    auto* p = reinterpret_cast<float*>(m.scales.data());
    for (int64_t i = 0; i < n; ++i) p[i] = unit_scales ? 1.0f : sc(rng);
  }
  m.ref = QuantMatRef{scheme, n, k, gs, m.q.data(), m.scales.data()};
  return m;
}

TEST(QuantActivations, EveryPathBitIdenticalToReference) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t k : {1, 7, 31, 32, 33, 64, 100, 172, 2048}) {
    const int64_t m = 3, ld = (k + 63) / 64 * 64;
    std::vector<float> x(static_cast<size_t>(m * k));
    for (auto& v : x) v = nd(rng) * 3.0f;
    x[0] = 0.5f;  // exact ties after scaling are possible; rounding must match everywhere
    std::vector<float> zero_row(static_cast<size_t>(k), 0.0f);
    std::copy(zero_row.begin(), zero_row.end(), x.begin() + k);  // an all-zero token
    std::vector<int8_t> q_ref(m * ld), q(m * ld);
    std::vector<float> s_ref(m), s(m);
    std::vector<int32_t> b_ref(m * ld / 32), b(m * ld / 32);
    ref::quantize_activations(x.data(), m, k, q_ref.data(), ld, s_ref.data(), b_ref.data());
    EXPECT_EQ(s_ref[1], 0.0f);
    for (const test::QuantPath& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      std::fill(q.begin(), q.end(), int8_t{99});
      quantize_activations(isa, x.data(), m, k, q.data(), ld, s.data(), b.data());
      EXPECT_EQ(q, q_ref) << isa_name(isa) << " k=" << k;
      EXPECT_EQ(s, s_ref) << isa_name(isa) << " k=" << k;
      EXPECT_EQ(b, b_ref) << isa_name(isa) << " k=" << k;
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t t = 0; t < k; ++t) {
        // |x - q * scale| <= scale / 2 (plus rounding of the f32 arithmetic).
        EXPECT_LE(std::fabs(x[i * k + t] - q_ref[i * ld + t] * s_ref[i]), 0.5f * s_ref[i] * 1.0001f + 1e-7f);
      }
  }
}

struct Shape {
  QuantScheme scheme;
  int64_t m, n, k, gs;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int64_t m : {1, 2, 3, 4, 5, 9}) {
    for (int64_t n : {1, 3, 4, 5, 17, 64}) {
      for (int64_t k : {1, 5, 63, 64, 65, 172, 300}) out.push_back({QuantScheme::kW8A8, m, n, k, k});
      for (QuantScheme s : {QuantScheme::kW4A8, QuantScheme::kW4A16}) {
        for (int64_t k : {32, 96, 128, 384}) {
          for (int64_t gs : {32, 64, 128})
            if (k % gs == 0) out.push_back({s, m, n, k, gs});
        }
      }
    }
  }
  return out;
}

// Integer activations with max |x| = 127 quantize to themselves (scale exactly 1), and unit
// weight scales make every product and partial sum an exact integer in f32: every path must
// then return exactly the integer dot product.
TEST(QuantMatmul, IntegerPartsExactlyEqualOnEveryPath) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> iv(-127, 127);
  for (const Shape& sh : shapes()) {
    TestMatrix w = random_matrix(sh.scheme, sh.n, sh.k, sh.gs, rng, /*unit_scales=*/true);
    std::vector<float> x(static_cast<size_t>(sh.m * sh.k));
    for (auto& v : x) v = static_cast<float>(iv(rng));
    for (int64_t i = 0; i < sh.m; ++i) x[i * sh.k] = 127.0f;
    std::vector<float> y_ref(sh.m * sh.n), y(sh.m * sh.n);
    ref::qmatmul(x.data(), sh.m, w.ref, y_ref.data());
    for (int64_t i = 0; i < sh.m; ++i)
      for (int64_t r = 0; r < sh.n; ++r) {
        int64_t dot = 0;
        for (int64_t t = 0; t < sh.k; ++t)
          dot += int64_t{ref::qweight_at(w.ref, r, t)} * static_cast<int64_t>(x[i * sh.k + t]);
        ASSERT_EQ(y_ref[i * sh.n + r], static_cast<float>(dot));
      }
    for (const test::QuantPath& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      qmatmul(isa, x.data(), sh.m, w.ref, y.data());
      ASSERT_EQ(y, y_ref) << isa_name(isa) << " " << scheme_name(sh.scheme) << " m=" << sh.m << " n=" << sh.n
                          << " k=" << sh.k << " g=" << sh.gs;
    }
  }
}

// Random f32 activations and scales: the integer dot products still agree exactly, only
// the f32 accumulation over groups differs. Bound: 1e-5 relative to the sum of |terms|.
TEST(QuantMatmul, FloatResultsWithinBoundOnEveryPath) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Shape& sh : shapes()) {
    TestMatrix w = random_matrix(sh.scheme, sh.n, sh.k, sh.gs, rng);
    std::vector<float> x(static_cast<size_t>(sh.m * sh.k));
    for (auto& v : x) v = nd(rng);
    std::vector<float> y_ref(sh.m * sh.n), y(sh.m * sh.n);
    ref::qmatmul(x.data(), sh.m, w.ref, y_ref.data());
    for (const test::QuantPath& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      qmatmul(isa, x.data(), sh.m, w.ref, y.data());
      for (int64_t i = 0; i < sh.m; ++i)
        for (int64_t r = 0; r < sh.n; ++r) {
          double mag = 0.0;
          for (int64_t t = 0; t < sh.k; ++t)
            mag += std::fabs(ref::qweight_at(w.ref, r, t) * ref::qscale_at(w.ref, r, t) * x[i * sh.k + t]);
          ASSERT_NEAR(y[i * sh.n + r], y_ref[i * sh.n + r], 1e-5 * mag + 1e-7)
              << isa_name(isa) << " " << scheme_name(sh.scheme) << " m=" << sh.m << " n=" << sh.n << " k=" << sh.k;
        }
    }
  }
}

// The quantized product approximates the f32 product of the dequantized weights: W4A16
// up to f32 rounding, A8 up to the activation rounding (|dx| / 2 per element).
TEST(QuantMatmul, MatchesDequantizedFloatMatmul) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t m = 3, n = 8, k = 256;
  for (QuantScheme s : {QuantScheme::kW8A8, QuantScheme::kW4A8, QuantScheme::kW4A16}) {
    TestMatrix w = random_matrix(s, n, k, 32, rng);
    std::vector<float> x(m * k), deq(n * k), y(m * n), y_f(m * n);
    for (auto& v : x) v = nd(rng);
    for (int64_t r = 0; r < n; ++r) dequantize_row(w.ref, r, deq.data() + r * k);
    matmul(Isa::kScalar, x.data(), m, MatRef{deq.data(), DType::kF32, n, k}, y_f.data());
    qmatmul(x.data(), m, w.ref, y.data());
    for (int64_t i = 0; i < m; ++i) {
      float amax = 0.0f;
      for (int64_t t = 0; t < k; ++t) amax = std::max(amax, std::fabs(x[i * k + t]));
      for (int64_t r = 0; r < n; ++r) {
        double wabs = 0.0;
        for (int64_t t = 0; t < k; ++t) wabs += std::fabs(deq[r * k + t]);
        const double bound = scheme_quantizes_activations(s) ? wabs * amax / 127.0 / 2.0 + 1e-5 : 1e-4;
        EXPECT_NEAR(y[i * n + r], y_f[i * n + r], bound) << scheme_name(s);
      }
    }
  }
}

TEST(QuantMatmul, LinearDispatchesOnWeightKind) {
  std::mt19937 rng(5);
  TestMatrix w = random_matrix(QuantScheme::kW4A16, 4, 64, 32, rng);
  std::vector<float> x(64, 0.5f), deq(4 * 64), y1(4), y2(4);
  for (int r = 0; r < 4; ++r) dequantize_row(w.ref, r, deq.data() + r * 64);
  LinearWeight q;
  q.quantized = true;
  q.quant = w.ref;
  linear(x.data(), 1, q, y1.data());
  linear(x.data(), 1, dense_linear(MatRef{deq.data(), DType::kF32, 4, 64}), y2.data());
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(y1[r], y2[r], 1e-4);
}

TEST(QuantMatmul, BadMatrixIsAnError) {
  std::vector<uint8_t> buf(1024);
  QuantMatRef w{QuantScheme::kW4A8, 4, 48, 32, buf.data(), buf.data()};  // 48 % 32 != 0
  std::vector<float> x(48), y(4);
  EXPECT_THROW(qmatmul(x.data(), 1, w, y.data()), Error);
  w = QuantMatRef{QuantScheme::kW8A8, 4, 48, 16, buf.data(), buf.data()};
  EXPECT_THROW(qmatmul(x.data(), 1, w, y.data()), Error);
}

}  // namespace
}  // namespace infera::kernels
