// Every optimized kernel against its scalar reference, on every ISA path this CPU can run
// (scalar always; AVX2 and AVX-512 where present), on odd shapes that exercise the vector
// tails, the GEMV/GEMM switch, partial weight panels and page boundaries.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../test_support.h"
#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/kernels/kernels.h"

namespace infera::kernels {
namespace {

constexpr float kU = 5.96e-8f;  // unit roundoff of f32, 2^-24

using test::available_isas;

int lanes(Isa isa) { return isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 1; }

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A weight matrix in one dtype, built from f32 values.
struct TestWeights {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  MatRef ref;
  TestWeights(DType dtype, int64_t n, int64_t k, uint32_t seed) : f32(random_floats(n * k, seed)) {
    if (dtype == DType::kF32) {
      ref = MatRef{f32.data(), dtype, n, k};
      return;
    }
    half.resize(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) half[i] = dtype == DType::kBF16 ? f32_to_bf16(f32[i]) : f32_to_f16(f32[i]);
    ref = MatRef{half.data(), dtype, n, k};
  }
};

class KernelsTest : public ::testing::TestWithParam<Isa> {};

// ---------------------------------------------------------------------------------------
// matmul. Bound: the kernels sum k products in f32, each lane sequentially over about
// k / lanes terms, then panel (k / 256) and lane (<= 16) reductions. The classic bound for
// a sum of n terms in f32 is |error| <= n * u * sum |x_t w_t|, so n_eff = k / lanes +
// k / 256 + 32 (slack for the reductions). Weight conversion from bf16/f16 is exact, so
// this is the whole error against the double reference; a wrong or missing product shows
// up far above it (the small-k cases make the bound tight enough to catch a dropped tail).
void expect_matmul_close(Isa isa, const std::vector<float>& x, int64_t m, const MatRef& w, const float* y, int64_t ldy,
                         int64_t n0, int64_t n1, const std::string& what) {
  const int64_t k = w.cols;
  const double n_eff = double(k) / lanes(isa) + double(k) / 256 + 32;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n0; j < n1; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t t = 0; t < k; ++t) {
        const double p = double(x[i * k + t]) * ref::weight_at(w, j, t);
        exact += p;
        magnitude += std::fabs(p);
      }
      const double got = y[i * ldy + (j - n0)];
      ASSERT_LE(std::fabs(got - exact), n_eff * kU * magnitude + 1e-30)
          << what << " at y[" << i << "][" << j << "]: got " << got << ", expected " << exact;
    }
  }
}

// Sets the bf16 prefill's vdpbf16ps path on or off for one scope.
class Bf16DotScope {
 public:
  explicit Bf16DotScope(bool enabled) : saved_(bf16_dot_mode()) { set_bf16_dot(enabled); }
  ~Bf16DotScope() { set_bf16_dot(saved_); }

 private:
  Bf16Dot saved_;
};

TEST_P(KernelsTest, MatmulMatchesReferenceOnOddShapes) {
  const Isa isa = GetParam();
  const Bf16DotScope f32_products(false);  // the vdpbf16ps path has its own tests below
  struct Shape {
    int64_t m, n, k;
  };
  // m < 16: GEMV passes of up to 4 rows over tiles of 4 (AVX-512) or 8 weight rows, so n
  // % 8 = 1..7 occur, and k past the last whole 64-byte line (k % 32 != 0 for 16-bit
  // weights); m >= 16: packed GEMM, whose microkernel covers 6 rows (so m % 6 = 1..5 all
  // occur) and 64 columns (so n % 64 != 0 leaves partial panels); 5-15 rows (two to four
  // passes) over hundreds of weight rows, long and short (the last three).
  const Shape shapes[] = {{1, 1, 1},      {1, 7, 13},    {1, 33, 100},  {2, 5, 64},     {3, 17, 37},    {4, 9, 31},
                          {5, 65, 129},   {6, 64, 16},   {16, 64, 16},  {21, 33, 70},   {22, 1, 40},    {23, 65, 129},
                          {67, 130, 300}, {1, 96, 5632}, {3, 5, 5632},  {13, 70, 5632}, {20, 70, 5632}, {1, 11, 2050},
                          {1, 14, 2081},  {2, 6, 47},    {2, 19, 1000}, {4, 13, 2047},  {7, 10, 65},    {9, 300, 2048},
                          {15, 97, 4096}, {6, 301, 1024}};
  uint32_t seed = 1;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& s : shapes) {
      const TestWeights w(dtype, s.n, s.k, seed++);
      const auto x = random_floats(s.m * s.k, seed++);
      std::vector<float> y(s.m * s.n, NAN);
      matmul(isa, x.data(), s.m, w.ref, y.data());
      const std::string what = std::string(isa_name(isa)) + " " + std::string(dtype_name(dtype)) +
                               " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
      expect_matmul_close(isa, x, s.m, w.ref, y.data(), s.n, 0, s.n, what);
    }
  }
}

// bf16 and f16 decode of rows that do not start on a 64-byte line (a safetensors tensor sits
// at any even offset): read as whole lines from the line holding each row's first weight,
// the weights before and after the row masked. The memory around the matrix holds NaN and
// Inf patterns, which a missed mask would carry into y; rows k long with k a multiple of 32
// (the line path) and not (the plain one), one and two threads, n past a tile of 4 rows.
TEST_P(KernelsTest, HalfDecodeOfRowsOffALine) {
  const Isa isa = GetParam();
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 32}, {1, 5, 64}, {2, 9, 96}, {1, 13, 2048}, {4, 6, 160}, {1, 7, 40}, {3, 3, 70}};
  uint32_t seed = 300;
  for (const DType dtype : {DType::kBF16, DType::kF16})
    for (const auto& s : shapes)
      for (const int64_t off : {0, 1, 8, 16, 31})
        for (const int threads : {1, 2}) {
          const TestWeights w(dtype, s.n, s.k, seed++);
          std::vector<uint16_t> buf(static_cast<size_t>(s.n * s.k + 128));
          const uint16_t nan = dtype == DType::kBF16 ? 0x7fc0 : 0x7e00,
                         minus_inf = dtype == DType::kBF16 ? 0xff80 : 0xfc00;
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = i % 2 == 0 ? nan : minus_inf;
          size_t base = 0;
          while (reinterpret_cast<uintptr_t>(buf.data() + base) % 64 != 0) ++base;
          uint16_t* at = buf.data() + base + 32 + off;  // a line of garbage before the matrix at least
          std::copy(w.half.begin(), w.half.end(), at);
          const MatRef ref{at, dtype, s.n, s.k};
          const auto x = random_floats(s.m * s.k, seed++);
          std::vector<float> y(s.m * s.n, NAN);
          set_num_threads(threads);
          matmul(isa, x.data(), s.m, ref, y.data());
          set_num_threads(0);
          const std::string what = std::string(isa_name(isa)) + " " + std::string(dtype_name(dtype)) +
                                   " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                                   " k=" + std::to_string(s.k) + " " + std::to_string(2 * off) + " bytes off a line, " +
                                   std::to_string(threads) + " thread(s)";
          expect_matmul_close(isa, x, s.m, ref, y.data(), s.n, 0, s.n, what);
        }
}

// ---------------------------------------------------------------------------------------
// bf16 prefill on AVX512_BF16 (vdpbf16ps): x rounded to bf16, pairs of products exact, sums
// in f32. Shapes: m >= 16 (the GEMM) with m % 6 != 0 (partial row tiles), n % 64 != 0
// (partial panels), odd k (a pair with one element), k below one 16-pair block, and k
// across the 512-long panels with tails of every kind.
struct DotShape {
  int64_t m, n, k;
};
const DotShape kDotShapes[] = {{16, 1, 1},      {17, 33, 13},    {18, 64, 32},   {19, 65, 33},
                               {20, 7, 100},    {23, 130, 129},  {24, 64, 512},  {25, 70, 513},
                               {31, 129, 1023}, {67, 130, 1100}, {16, 96, 5632}, {21, 17, 5631}};

std::vector<float> bf16_rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return r;
}

// The error bound of y = round_bf16(x) . W summed in f32: relative 2^-8 per term for x's
// rounding (round to nearest even, 8 significant bits), plus the f32 sum of k terms (each
// lane adds its k products one after the other, then panels of 512 are added: n_eff = k +
// k / 512 + 32, the classic worst case); rounded_x: x already holds bf16 values, so only the
// sum's error remains.
void expect_dot_close(const std::vector<float>& x, int64_t m, const MatRef& w, const std::vector<float>& y,
                      bool rounded_x, const std::string& what) {
  const int64_t k = w.cols, n = w.rows;
  const double rel = (rounded_x ? 0.0 : std::ldexp(1.0, -8)) + (double(k) + double(k) / 512 + 32) * kU;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t t = 0; t < k; ++t) {
        const double p = double(x[i * k + t]) * ref::weight_at(w, j, t);
        exact += p;
        magnitude += std::fabs(p);
      }
      const double got = y[i * n + j];
      ASSERT_LE(std::fabs(got - exact), rel * magnitude + 1e-30)
          << what << " at y[" << i << "][" << j << "]: got " << got << ", expected " << exact;
    }
  }
}

void bf16_prefill_odd_shapes() {
  uint32_t seed = 100;
  for (const auto& s : kDotShapes) {
    const TestWeights w(DType::kBF16, s.n, s.k, seed++);
    const auto x = random_floats(s.m * s.k, seed++);
    const auto xr = bf16_rounded(x);
    const std::string what = "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
    std::vector<float> y(s.m * s.n, NAN), yr(s.m * s.n, NAN);
    matmul(Isa::kAvx512, x.data(), s.m, w.ref, y.data());
    expect_dot_close(x, s.m, w.ref, y, false, what);
    // With x already bf16 the rounding is exact: only the f32 sums' error is left (a lost
    // tail pair or a wrong pairing shows up far above it), and the result is the same bit
    // for bit as from the unrounded x (x is rounded once, to nearest even, in the kernel).
    matmul(Isa::kAvx512, xr.data(), s.m, w.ref, yr.data());
    expect_dot_close(xr, s.m, w.ref, yr, true, what + " (x bf16)");
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], yr[i]) << what << " at " << i;
  }
}

class Bf16AmxScope {
 public:
  explicit Bf16AmxScope(bool enabled) : saved_(bf16_amx_enabled()) { set_bf16_amx(enabled); }
  ~Bf16AmxScope() { set_bf16_amx(saved_); }

 private:
  bool saved_;
};

// Both bf16 prefill kernels on one machine where it has AMX (tdpbf16ps tiles, and
// vdpbf16ps with AMX off); the vdpbf16ps kernel alone elsewhere.
TEST(KernelsBf16Dot, PrefillMatchesReferenceOnOddShapes) {
  if (!isa_available(Isa::kAvx512)) GTEST_SKIP() << "the vdpbf16ps path needs the avx512 path (AVX512_BF16)";
  const Bf16DotScope dot(true);
  const bool amx = amx_unavailable_reason() == nullptr;
  std::printf("[ bf16 ] AMX tiles: %s\n", amx ? "in use (both kernels tested)" : amx_unavailable_reason());
  for (bool use_amx : {false, true}) {
    if (use_amx && !amx) break;
    const Bf16AmxScope scope(use_amx);
    SCOPED_TRACE(use_amx ? "AMX tdpbf16ps" : "vdpbf16ps");
    EXPECT_EQ(matmul_path(Isa::kAvx512, DType::kBF16).find("tdpbf16ps") != std::string::npos, use_amx);
    bf16_prefill_odd_shapes();
  }
}

// f16 prefill on AMX-BF16 tiles: each f16 weight split exactly into two bf16 parts and x into
// two, three products (xh.wh + xh.wl + xl.wh). Per term the dropped xl.wl and x's rest are
// each below 2^-17 |x w| (bound: 2^-16), plus the f32 sums of the three products' k terms
// one after the other (n_eff = 3 k + k / 512 + 32). With x already bf16 (xl = 0) the
// products are exact and only the sums' error is left, so a lost or misplaced weight part
// (2^-9 of a term) shows far above it.
TEST(KernelsF16Amx, PrefillMatchesReferenceOnOddShapes) {
  if (!isa_available(Isa::kAvx512) || amx_unavailable_reason() != nullptr)
    GTEST_SKIP() << "f16 prefill on AMX tiles needs AMX: "
                 << (isa_available(Isa::kAvx512) ? amx_unavailable_reason() : "no avx512 path");
  const Bf16DotScope dot(true);
  const Bf16AmxScope amx(true);
  EXPECT_NE(matmul_path(Isa::kAvx512, DType::kF16).find("tdpbf16ps"), std::string::npos);
  uint32_t seed = 300;
  for (const auto& s : kDotShapes) {
    const TestWeights w(DType::kF16, s.n, s.k, seed++);
    const auto x = random_floats(s.m * s.k, seed++);
    const auto xr = bf16_rounded(x);
    for (bool rounded : {false, true}) {
      const std::vector<float>& xs = rounded ? xr : x;
      std::vector<float> y(s.m * s.n, NAN);
      matmul(Isa::kAvx512, xs.data(), s.m, w.ref, y.data());
      const double rel = (rounded ? 0.0 : std::ldexp(1.0, -16)) + (3.0 * s.k + s.k / 512.0 + 32) * kU;
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          double exact = 0.0, magnitude = 0.0;
          for (int64_t t = 0; t < s.k; ++t) {
            const double p = double(xs[i * s.k + t]) * ref::weight_at(w.ref, j, t);
            exact += p;
            magnitude += std::fabs(p);
          }
          ASSERT_LE(std::fabs(y[i * s.n + j] - exact), rel * magnitude + 1e-30)
              << "m=" << s.m << " n=" << s.n << " k=" << s.k << (rounded ? " (x bf16)" : "") << " at y[" << i << "]["
              << j << "]";
        }
      }
    }
  }
  // AMX off: the f32 products of the FMA tiles again (the tight bound).
  const Bf16AmxScope off(false);
  EXPECT_EQ(matmul_path(Isa::kAvx512, DType::kF16).find("tdpbf16ps"), std::string::npos);
  const TestWeights w(DType::kF16, 70, 300, 77);
  const auto x = random_floats(20 * 300, 78);
  std::vector<float> y(20 * 70);
  matmul(Isa::kAvx512, x.data(), 20, w.ref, y.data());
  expect_matmul_close(Isa::kAvx512, x, 20, w.ref, y.data(), 70, 0, 70, "f16, AMX off");
}

TEST(KernelsBf16Dot, RowsAndColumnsOfAShard) {
  if (!isa_available(Isa::kAvx512)) GTEST_SKIP() << "the vdpbf16ps path needs the avx512 path (AVX512_BF16)";
  const Bf16DotScope dot(true);
  const int64_t m = 29, n = 150, k = 77, n0 = 21, n1 = 118, ldy = 130;
  const TestWeights w(DType::kBF16, n, k, 31);
  const auto x = random_floats(m * k, 32);
  std::vector<float> y(m * ldy, -7.0f);
  matmul_rows(Isa::kAvx512, x.data(), m, w.ref, n0, n1, y.data(), ldy);
  std::vector<float> y_slice((n1 - n0) * m);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < n1 - n0; ++c) y_slice[i * (n1 - n0) + c] = y[i * ldy + c];
  expect_dot_close(x, m, row_slice(w.ref, n0, n1), y_slice, false, "matmul_rows");
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = n1 - n0; c < ldy; ++c) ASSERT_EQ(y[i * ldy + c], -7.0f) << i << "," << c;
}

TEST(KernelsBf16Dot, OffGivesTheF32Products) {
  // set_bf16_dot(false): the exact f32 products (the tight bound of the other paths), and
  // a different result from the vdpbf16ps path on the same unrounded x (the switch works).
  if (!isa_available(Isa::kAvx512)) GTEST_SKIP() << "the vdpbf16ps path needs the avx512 path (AVX512_BF16)";
  const int64_t m = 20, n = 70, k = 300;
  const TestWeights w(DType::kBF16, n, k, 41);
  const auto x = random_floats(m * k, 42);
  std::vector<float> y_f32(m * n), y_dot(m * n);
  {
    const Bf16DotScope off(false);
    matmul(Isa::kAvx512, x.data(), m, w.ref, y_f32.data());
  }
  {
    const Bf16DotScope on(true);
    matmul(Isa::kAvx512, x.data(), m, w.ref, y_dot.data());
  }
  expect_matmul_close(Isa::kAvx512, x, m, w.ref, y_f32.data(), n, 0, n, "bf16 dot off");
  EXPECT_NE(y_f32, y_dot);
  {
    const Bf16DotScope on(true);
    EXPECT_NE(matmul_path(Isa::kAvx512, DType::kBF16).find("vdpbf16ps"), std::string::npos);
  }
  const Bf16DotScope off(false);
  EXPECT_EQ(matmul_path(Isa::kAvx512, DType::kBF16).find("vdpbf16ps"), std::string::npos);
}

TEST(KernelsBf16Dot, AutoTakesVdpbf16psOnlyOnAmd) {
  // kAuto: vdpbf16ps off the AMX tiles only where it outruns the f32 FMAs (AMD); off the
  // tiles elsewhere the f32 products, the same sums as kOff.
  const Bf16DotScope saved(true);
  set_bf16_dot(Bf16Dot::kAuto);
  EXPECT_TRUE(bf16_dot_enabled());
  EXPECT_EQ(bf16_vector_dot(), cpu_features().amd);
  set_bf16_dot(Bf16Dot::kOn);
  EXPECT_TRUE(bf16_vector_dot());
  set_bf16_dot(Bf16Dot::kOff);
  EXPECT_FALSE(bf16_dot_enabled());
  EXPECT_FALSE(bf16_vector_dot());
  if (!isa_available(Isa::kAvx512) || cpu_features().amd) return;
  const int64_t m = 20, n = 70, k = 300;  // (a GEMM: m >= 16, off the AMX tiles)
  const TestWeights w(DType::kBF16, n, k, 43);
  const auto x = random_floats(m * k, 44);
  std::vector<float> y_auto(m * n), y_f32(m * n);
  const Bf16AmxScope tiles_off(false);
  set_bf16_dot(Bf16Dot::kAuto);
  matmul(Isa::kAvx512, x.data(), m, w.ref, y_auto.data());
  set_bf16_dot(Bf16Dot::kOff);
  matmul(Isa::kAvx512, x.data(), m, w.ref, y_f32.data());
  EXPECT_EQ(y_auto, y_f32);
}

// The decode kernels' software prefetch (none, 512 B or 2 KiB ahead) changes nothing in the
// values, on every path and dtype; auto times the three on the first single-token calls over
// a matrix of >= 1 MiB and settles on one of them (per thread bucket).
TEST_P(KernelsTest, DecodePrefetchDistancesGiveTheSameValues) {
  const Isa isa = GetParam();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    TestWeights w(dtype, 37, 300, 5);
    const std::vector<float> x = random_floats(3 * 300, 6);
    std::vector<float> first;
    for (int bytes : {0, 512, 2048}) {
      set_gemv_prefetch(bytes);
      EXPECT_TRUE(gemv_prefetch_for(1).settled);
      EXPECT_EQ(gemv_prefetch_for(1).bytes, bytes);
      for (int64_t m : {1, 3}) {
        std::vector<float> y(static_cast<size_t>(m * 37));
        matmul(isa, x.data(), m, w.ref, y.data());
        expect_matmul_close(isa, x, m, w.ref, y.data(), 37, 0, 37,
                            std::string(dtype_name(dtype)) + " m " + std::to_string(m) + " prefetch " +
                                std::to_string(bytes));
        if (m == 1 && first.empty()) first = y;
        if (m == 1) {
          EXPECT_EQ(y, first) << dtype_name(dtype) << " prefetch " << bytes;
        }
      }
    }
  }
  set_gemv_prefetch(kGemvPrefetchAuto);
}

TEST(KernelsDecodePrefetch, AutoSettlesOnOneOfTheDistances) {
  set_num_threads(1);
  set_gemv_prefetch(kGemvPrefetchAuto);
  EXPECT_FALSE(gemv_prefetch_for(1).settled);
  TestWeights w(DType::kBF16, 512, 1024, 8);  // 1 MiB
  const std::vector<float> x = random_floats(1024, 9);
  std::vector<float> want(512), y(512);
  set_gemv_prefetch(0);
  matmul(x.data(), 1, w.ref, want.data());
  set_gemv_prefetch(kGemvPrefetchAuto);
  {
    // Calls of two rows of x (compute bound) are not timed.
    std::vector<float> x2(x), y2(2 * 512);
    x2.insert(x2.end(), x.begin(), x.end());
    for (int call = 0; call < 3 * 64; ++call) matmul(x2.data(), 2, w.ref, y2.data());
    EXPECT_FALSE(gemv_prefetch_for(1).settled);
  }
  for (int call = 0; call < 3 * 64; ++call) {
    matmul(x.data(), 1, w.ref, y.data());
    ASSERT_EQ(y, want) << "call " << call;
  }
  const GemvPrefetch p = gemv_prefetch_for(1);
  EXPECT_TRUE(p.settled);
  EXPECT_TRUE(p.bytes == 0 || p.bytes == 512 || p.bytes == 2048) << p.bytes;
  EXPECT_FALSE(gemv_prefetch_for(2).settled);  // timed apart
  set_gemv_prefetch(kGemvPrefetchAuto);
  set_num_threads(0);
}

TEST_P(KernelsTest, MatmulPathNamesItsIsa) {
  const Isa isa = GetParam();
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::string p = matmul_path(isa, d);
    EXPECT_NE(p.find(isa_name(isa)), std::string::npos) << p;
    EXPECT_NE(p.find("prefill"), std::string::npos) << p;
    EXPECT_NE(p.find("decode"), std::string::npos) << p;
  }
}

TEST_P(KernelsTest, MatmulAgreesWithRefKernel) {
  // ref::matmul itself is what other modules' tests use; keep it honest against the kernels.
  const Isa isa = GetParam();
  const TestWeights w(DType::kBF16, 19, 45, 7);
  const auto x = random_floats(9 * 45, 8);
  std::vector<float> y(9 * 19), y_ref(9 * 19);
  matmul(isa, x.data(), 9, w.ref, y.data());
  ref::matmul(x.data(), 9, w.ref, y_ref.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_ref[i], 1e-5f) << i;
}

TEST_P(KernelsTest, MatmulRowsWritesOnlyItsColumns) {
  const Isa isa = GetParam();
  for (int64_t m : {1, 3, 7, 20}) {
    const int64_t n = 150, k = 77, n0 = 21, n1 = 118, ldy = 130;
    const TestWeights w(DType::kF16, n, k, 11);
    const auto x = random_floats(m * k, 12);
    std::vector<float> y(m * ldy, -7.0f);
    matmul_rows(isa, x.data(), m, w.ref, n0, n1, y.data(), ldy);
    expect_matmul_close(isa, x, m, w.ref, y.data(), ldy, n0, n1, "matmul_rows");
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = n1 - n0; c < ldy; ++c) ASSERT_EQ(y[i * ldy + c], -7.0f) << i << "," << c;
    // row_slice is the same thing as a matrix of its own.
    std::vector<float> y2(m * (n1 - n0));
    matmul(isa, x.data(), m, row_slice(w.ref, n0, n1), y2.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < n1 - n0; ++c) ASSERT_EQ(y2[i * (n1 - n0) + c], y[i * ldy + c]);
  }
}

TEST(KernelsErrors, MatmulRejectsUnsupportedDtype) {
  std::vector<int8_t> data(4);
  std::vector<float> x(2), y(2);
  const MatRef w{data.data(), DType::kI8, 2, 2};
  EXPECT_THROW(matmul(x.data(), 1, w, y.data()), Error);
}

// ---------------------------------------------------------------------------------------
// Element-wise ops: a handful of roundings per element plus, for rmsnorm, an n-term sum of
// squares; the vector exp is within a few ulp. 1e-5 relative (~170 ulp) leaves margin for
// both while any wrong lane or tail is off by O(1).
void expect_close_rel(const std::vector<float>& got, const std::vector<float>& want, float rel, float abs,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - want[i]), rel * std::fabs(want[i]) + abs)
        << what << " at " << i << ": got " << got[i] << ", expected " << want[i];
  }
}

TEST_P(KernelsTest, RmsnormMatchesReference) {
  const Isa isa = GetParam();
  for (int64_t n : {1, 7, 16, 64, 172, 2048}) {
    for (float offset : {0.0f, 1.0f}) {
      const int64_t rows = 3;
      const auto x = random_floats(rows * n, 100 + n, -3.0f, 3.0f);
      const auto w = random_floats(n, 200 + n);
      std::vector<float> y(rows * n), want(rows * n);
      rmsnorm(isa, x.data(), w.data(), y.data(), rows, n, 1e-5f, offset);
      ref::rmsnorm(x.data(), w.data(), want.data(), rows, n, 1e-5f, offset);
      const std::string what = std::string(isa_name(isa)) + " rmsnorm n=" + std::to_string(n);
      expect_close_rel(y, want, 1e-5f, 1e-7f, what);
      auto inplace = x;  // x == y is allowed
      rmsnorm(isa, inplace.data(), w.data(), inplace.data(), rows, n, 1e-5f, offset);
      expect_close_rel(inplace, want, 1e-5f, 1e-7f, what + " in place");
    }
  }
}

TEST_P(KernelsTest, SiluMulMatchesReference) {
  const Isa isa = GetParam();
  for (int64_t n : {1, 5, 16, 17, 100, 70001}) {
    auto gate = random_floats(n, 300 + n, -20.0f, 20.0f);
    gate[0] = n > 1 ? -100.0f : 100.0f;  // exp saturates on either side
    const auto up = random_floats(n, 400 + n, -2.0f, 2.0f);
    auto want = gate;
    silu_mul(isa, gate.data(), up.data(), n);
    ref::silu_mul(want.data(), up.data(), n);
    // abs 1e-30: silu(-100) ~ -4e-42 underflows differently (clamped exp gives ~1e-36).
    expect_close_rel(gate, want, 1e-5f, 1e-30f, std::string(isa_name(isa)) + " silu_mul");
  }
}

TEST_P(KernelsTest, SoftmaxIsStableWithLargeValues) {
  const Isa isa = GetParam();
  for (int64_t n : {1, 3, 16, 33, 1000}) {
    for (float shift : {0.0f, 1e4f, -1e4f}) {
      auto x = random_floats(n, 500 + n, -30.0f, 30.0f);
      for (auto& v : x) v += shift;
      if (n > 2) x[1] = -1e30f;  // a masked-out entry
      auto want = x;
      softmax(isa, x.data(), n);
      ref::softmax(want.data(), n);
      expect_close_rel(x, want, 1e-5f, 1e-30f, std::string(isa_name(isa)) + " softmax");
      EXPECT_NEAR(std::accumulate(x.begin(), x.end(), 0.0), 1.0, 1e-5);
    }
  }
}

TEST_P(KernelsTest, AddMatchesReference) {
  const Isa isa = GetParam();
  for (int64_t n : {1, 9, 31, 100000}) {
    auto y = random_floats(n, 600 + n);
    const auto x = random_floats(n, 700 + n);
    auto want = y;
    add(isa, y.data(), x.data(), n);
    ref::add(want.data(), x.data(), n);
    ASSERT_EQ(y, want);  // one rounding, same on every path
  }
}

// ---------------------------------------------------------------------------------------
// RoPE: cos/sin are computed identically (f32 angle, std::cos/sin); what differs is one
// rounding per product, so 1e-6 of the pair's magnitude. Dims past rot_dim must not move.
TEST_P(KernelsTest, RopeNeoxMatchesReference) {
  const Isa isa = GetParam();
  struct Case {
    int64_t heads, head_dim, rot_dim;
    float attn_factor;
  };
  for (const Case c : {Case{4, 64, 32, 1.0f}, Case{3, 8, 8, 1.0f}, Case{2, 128, 128, 1.2f}, Case{5, 80, 40, 1.0f},
                       Case{2, 36, 10, 0.9f}}) {
    const int64_t n_tokens = 5;
    auto x = random_floats(n_tokens * c.heads * c.head_dim, 800 + c.head_dim, -2.0f, 2.0f);
    const std::vector<int32_t> positions = {0, 1, 17, 1000, 32767};
    std::vector<float> inv_freq(c.rot_dim / 2);
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * float(i) / float(c.rot_dim));
    auto want = x;
    const auto original = x;
    rope_neox(isa, x.data(), n_tokens, c.heads, c.head_dim, c.rot_dim, positions.data(), inv_freq.data(),
              c.attn_factor);
    ref::rope_neox(want.data(), n_tokens, c.heads, c.head_dim, c.rot_dim, positions.data(), inv_freq.data(),
                   c.attn_factor);
    expect_close_rel(x, want, 1e-6f, 1e-6f, std::string(isa_name(isa)) + " rope");
    for (int64_t th = 0; th < n_tokens * c.heads; ++th)
      for (int64_t d = c.rot_dim; d < c.head_dim; ++d) ASSERT_EQ(x[th * c.head_dim + d], original[th * c.head_dim + d]);
  }
}

// ---------------------------------------------------------------------------------------
// Attention over a paged cache vs the contiguous reference. Blocks are scattered through a
// larger pool in shuffled order, so a wrong block or slot lookup reads the wrong keys.
// Bound: scores carry ~head_dim ulp, exp a few more; the output is a convex combination of
// V rows, so its error is ~1e-6 * max|v|; 2e-5 * max|v| leaves margin.
struct PagedCache {
  int64_t block_size, n_kv, head_dim;
  std::vector<float> k_pool, v_pool;  // [num_blocks, n_kv, block_size, head_dim] (kv_row)
  std::vector<int32_t> block_table;
  std::vector<float> k, v;  // contiguous copies [n_ctx, n_kv, head_dim]

  PagedCache(int64_t n_ctx, int64_t bs, int64_t n_kv_, int64_t d, uint32_t seed)
      : block_size(bs), n_kv(n_kv_), head_dim(d) {
    const int64_t blocks = (n_ctx + bs - 1) / bs, pool_blocks = blocks + 3;
    const int64_t row = n_kv * d;
    k = random_floats(n_ctx * row, seed);
    v = random_floats(n_ctx * row, seed + 1);
    k_pool = random_floats(pool_blocks * bs * row, seed + 2);  // garbage where unused
    v_pool = random_floats(pool_blocks * bs * row, seed + 3);
    std::vector<int32_t> ids(pool_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    block_table.assign(ids.begin(), ids.begin() + blocks);
    for (int64_t t = 0; t < n_ctx; ++t) {
      const int64_t slot = int64_t(block_table[t / bs]) * bs + t % bs;
      for (int64_t h = 0; h < n_kv; ++h) {
        const int64_t dst = kv_row(slot, h, bs, n_kv) * d;
        std::copy_n(k.begin() + t * row + h * d, d, k_pool.begin() + dst);
        std::copy_n(v.begin() + t * row + h * d, d, v_pool.begin() + dst);
      }
    }
  }
  PagedKv view() const { return PagedKv{k_pool.data(), v_pool.data(), block_size, n_kv, head_dim, block_table.data()}; }
};

void check_attention(Isa isa, int64_t n_ctx, int64_t n_tokens, int64_t n_heads, int64_t n_kv, int64_t head_dim,
                     int64_t block_size) {
  const int64_t pos0 = n_ctx - n_tokens;
  const PagedCache cache(n_ctx, block_size, n_kv, head_dim, uint32_t(n_ctx * 31 + n_heads));
  const auto q = random_floats(n_tokens * n_heads * head_dim, uint32_t(n_ctx + 7), -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(float(head_dim));
  std::vector<float> out(q.size(), NAN), want(q.size());
  attention_paged(isa, q.data(), n_tokens, n_heads, pos0, cache.view(), scale, out.data());
  ref::attention_contiguous(q.data(), n_tokens, n_heads, pos0, cache.k.data(), cache.v.data(), n_ctx, n_kv, head_dim,
                            scale, want.data());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], want[i], 2e-5f) << isa_name(isa) << " ctx=" << n_ctx << " n_tokens=" << n_tokens
                                        << " heads=" << n_heads << "/" << n_kv << " head_dim=" << head_dim << " at "
                                        << i;
  }
}

TEST_P(KernelsTest, AttentionDecodeMatchesContiguousReference) {
  const Isa isa = GetParam();
  for (int64_t ctx : {1, 15, 16, 17, 33, 1000, 2100}) {
    for (int64_t ratio : {1, 2, 4}) {
      check_attention(isa, ctx, 1, 2 * ratio, 2, 64, 16);
    }
  }
  check_attention(isa, 40, 1, 8, 4, 8, 16);  // stories260K shape: head_dim 8 < 16 lanes
  check_attention(isa, 700, 1, 4, 1, 128, 32);  // one kv head: several key chunks
}

TEST_P(KernelsTest, AttentionPrefillChunkMatchesContiguousReference) {
  const Isa isa = GetParam();
  for (int64_t ctx : {15, 16, 17, 33, 1000}) {
    for (int64_t ratio : {1, 2, 4}) {
      check_attention(isa, ctx, std::min<int64_t>(ctx, 9), 2 * ratio, 2, 32, 16);  // pos0 > 0
    }
  }
  check_attention(isa, 17, 17, 4, 2, 24, 16);  // whole prompt from pos0 = 0
  check_attention(isa, 50, 3, 1, 1, 8, 4);  // block_size 4
  // Few (token, head) units and a long context: split into key chunks even for a prefill;
  // with 512-slot blocks the last chunk [1024, 1026) lies past the first token's end.
  check_attention(isa, 1026, 5, 2, 1, 8, 512);
}

TEST(KernelsErrors, AttentionRejectsBadGrouping) {
  const PagedCache cache(4, 16, 3, 8, 1);
  std::vector<float> q(4 * 8), out(4 * 8);
  EXPECT_THROW(attention_paged(q.data(), 1, 4, 3, cache.view(), 1.0f, out.data()), Error);
}

TEST(KernelsDispatch, DefaultPathIsTheBestAvailable) {
  EXPECT_TRUE(isa_available(best_isa()));
  const TestWeights w(DType::kBF16, 3, 40, 5);
  const auto x = random_floats(40, 6);
  std::vector<float> y(3), y_best(3);
  matmul(x.data(), 1, w.ref, y.data());
  matmul(best_isa(), x.data(), 1, w.ref, y_best.data());
  EXPECT_EQ(y, y_best);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelsTest, ::testing::ValuesIn(available_isas()),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace infera::kernels
