// Repacked quantized weights (kernels/quant.h, "Repacked layout"): the packing round-trips,
// and qmatmul over a packed matrix (the AVX-512 and AVX2 panel GEMV/GEMM; the scalar path
// reads the on-disk layout) matches the scalar reference on every path, odd shapes included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../test_support.h"
#include "infera/base/cpu.h"
#include "infera/base/threads.h"
#include "infera/kernels/quant.h"

namespace infera::kernels {
namespace {

using Path = test::QuantPath;
std::vector<Path> paths() { return test::quant_paths(); }
struct TestMatrix {
  std::vector<uint8_t> q, scales;
  QuantMatRef ref;
};

// Random weights; unit_scales: every scale 1 (integer results exact in f32).
TestMatrix random_matrix(QuantScheme scheme, int64_t n, int64_t k, int64_t gs, std::mt19937& rng, bool unit_scales) {
  TestMatrix m;
  const bool int4 = scheme_is_int4(scheme);
  if (!int4) gs = k;
  m.q.resize(static_cast<size_t>(int4 ? n * k / 2 : n * k));
  std::uniform_int_distribution<int> byte(0, 255), s8(-127, 127);
  for (auto& b : m.q) b = int4 ? static_cast<uint8_t>(byte(rng)) : static_cast<uint8_t>(static_cast<int8_t>(s8(rng)));
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  if (int4) {
    m.scales.resize(static_cast<size_t>(n * (k / gs) * 2));
    auto* p = reinterpret_cast<uint16_t*>(m.scales.data());
    for (int64_t i = 0; i < n * (k / gs); ++i) p[i] = f32_to_f16(unit_scales ? 1.0f : sc(rng));
  } else {
    m.scales.resize(static_cast<size_t>(n * 4));
    auto* p = reinterpret_cast<float*>(m.scales.data());
    for (int64_t i = 0; i < n; ++i) p[i] = unit_scales ? 1.0f : sc(rng);
  }
  m.ref = QuantMatRef{scheme, n, k, gs, m.q.data(), m.scales.data()};
  return m;
}

struct Shape {
  QuantScheme scheme;
  int64_t n, k, gs;
};

// Rows around the 16-row panel (and the w8a8 panel pair), columns not a multiple of the
// 4-byte lane (w8a8) and every int4 group size.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  // 33, 50: the 3-panel w8a8 / w4a16 and 2-panel w4a8 prefill groups end in a partial panel;
  // 50 and 83 (6 panels: 4 + 2): the 4-panel decode groups, whole and cut short.
  for (int64_t n : {1, 15, 16, 17, 33, 50, 83}) {
    for (int64_t k : {1, 3, 5, 64, 65, 172, 301}) out.push_back({QuantScheme::kW8A8, n, k, k});
    for (QuantScheme s : {QuantScheme::kW4A8, QuantScheme::kW4A16})
      for (int64_t k : {32, 96, 128, 320, 384})  // 320: W4A16 prefill blocks of 128, 128, 64 columns
        for (int64_t gs : {32, 64, 128})
          if (k % gs == 0) out.push_back({s, n, k, gs});
  }
  return out;
}

std::string describe(Isa isa, const Shape& sh, int64_t m) {
  return std::string(isa_name(isa)) + " " + std::string(scheme_name(sh.scheme)) + " m=" + std::to_string(m) +
         " n=" + std::to_string(sh.n) + " k=" + std::to_string(sh.k) + " g=" + std::to_string(sh.gs);
}

// Around the 8-token prefill tile (and one past 64, the benchmark's prompt).
const int64_t kTokenCounts[] = {1, 2, 3, 8, 9, 17, 65};

TEST(QuantPacked, RepackRoundTripsExactly) {
  std::mt19937 rng(11);
  for (const Shape& sh : shapes()) {
    TestMatrix w = random_matrix(sh.scheme, sh.n, sh.k, sh.gs, rng, false);
    auto packed = pack_quant_matrix_always(w.ref);
    ASSERT_TRUE(packed);
    EXPECT_EQ(packed->panels, (sh.n + kPanelRows - 1) / kPanelRows);
    EXPECT_EQ(packed->panel_bytes % 64, 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(packed->storage.data()) % 64, 0u);
    std::vector<uint8_t> q(w.q.size(), 0xAA), s(w.scales.size(), 0xAA);
    unpack_quant_matrix(*packed, q.data(), s.data());
    EXPECT_EQ(q, w.q) << scheme_name(sh.scheme) << " n=" << sh.n << " k=" << sh.k;
    EXPECT_EQ(s, w.scales) << scheme_name(sh.scheme) << " n=" << sh.n << " k=" << sh.k;
  }
}

TEST(QuantPacked, TooWideW8A8IsNotPacked) {
  std::vector<uint8_t> q(70000), s(4);
  const QuantMatRef w{QuantScheme::kW8A8, 1, 70000, 70000, q.data(), s.data()};
  EXPECT_EQ(pack_quant_matrix_always(w), nullptr);  // int32 sums of u8 x s8 could overflow
}

// Integer activations with max |x| = 127 (activation scale exactly 1) and unit weight
// scales: every path must return exactly the integer dot product the reference returns.
TEST(QuantPacked, IntegerPartsExactlyEqualOnEveryPath) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> iv(-127, 127);
  for (const Shape& sh : shapes()) {
    TestMatrix w = random_matrix(sh.scheme, sh.n, sh.k, sh.gs, rng, true);
    w.ref.packed = pack_quant_matrix_always(w.ref);
    for (int64_t m : kTokenCounts) {
      std::vector<float> x(static_cast<size_t>(m * sh.k));
      for (auto& v : x) v = static_cast<float>(iv(rng));
      for (int64_t i = 0; i < m; ++i) x[i * sh.k] = 127.0f;
      std::vector<float> y_ref(m * sh.n), y(m * sh.n, -1.0f);
      ref::qmatmul(x.data(), m, w.ref, y_ref.data());
      for (const Path& path : paths()) {
        const Isa isa = path.select();
        SCOPED_TRACE(path.name());
        qmatmul(isa, x.data(), m, w.ref, y.data());
        ASSERT_EQ(y, y_ref) << describe(isa, sh, m);
      }
    }
  }
}

// Random activations and scales. Bound: 1e-5 relative to the sum of |terms| (the integer
// parts agree exactly; only the f32 accumulation over groups and the scale products differ;
// the W4A16 prefill sums exact f32 products over k <= 384 columns: first order k * 2^-24 =
// 2.3e-5 in the worst case, ~sqrt(k) * 2^-24 = 1.2e-6 typically).
TEST(QuantPacked, FloatResultsWithinBoundOnEveryPath) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Shape& sh : shapes()) {
    TestMatrix w = random_matrix(sh.scheme, sh.n, sh.k, sh.gs, rng, false);
    w.ref.packed = pack_quant_matrix_always(w.ref);
    for (int64_t m : {1, 2, 3, 9, 17, 65}) {
      std::vector<float> x(static_cast<size_t>(m * sh.k));
      for (auto& v : x) v = nd(rng);
      std::vector<float> y_ref(m * sh.n), y(m * sh.n);
      ref::qmatmul(x.data(), m, w.ref, y_ref.data());
      for (const Path& path : paths()) {
        const Isa isa = path.select();
        SCOPED_TRACE(path.name());
        qmatmul(isa, x.data(), m, w.ref, y.data());
        for (int64_t i = 0; i < m; ++i)
          for (int64_t r = 0; r < sh.n; ++r) {
            double mag = 0.0;
            for (int64_t t = 0; t < sh.k; ++t)
              mag += std::fabs(ref::qweight_at(w.ref, r, t) * ref::qscale_at(w.ref, r, t) * x[i * sh.k + t]);
            ASSERT_NEAR(y[i * sh.n + r], y_ref[i * sh.n + r], 1e-5 * mag + 1e-7) << describe(isa, sh, m);
          }
      }
    }
  }
}

// W8A8 prefill runs on AMX tiles where the CPU has them, else on the VNNI tile: both give
// the reference's integer results exactly, and the same floats bit for bit (same integer
// sums, same epilogue). Token counts around the 16- and 32-token tile blocks, rows around
// the panel pairs, k a multiple of 64 (AMX's condition) and one that is not (VNNI either way).
TEST(QuantPacked, W8A8AmxAndVnniGemmAgreeExactly) {
  if (!isa_available(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 path on this CPU";
  std::mt19937 rng(16);
  std::uniform_int_distribution<int> iv(-127, 127);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {15, 16, 17, 33, 50}) {
    for (int64_t k : {64, 128, 320, 100}) {
      for (bool integer : {true, false}) {
        TestMatrix w = random_matrix(QuantScheme::kW8A8, n, k, k, rng, integer);
        w.ref.packed = pack_quant_matrix_always(w.ref);
        for (int64_t m : {8, 9, 16, 17, 31, 32, 33, 65}) {
          std::vector<float> x(static_cast<size_t>(m * k));
          for (auto& v : x) v = integer ? static_cast<float>(iv(rng)) : nd(rng);
          if (integer)
            for (int64_t i = 0; i < m; ++i) x[i * k] = 127.0f;
          std::vector<float> y_amx(m * n, -1.0f), y_vnni(m * n, -2.0f), y_ref(m * n);
          set_quant_amx(true);
          qmatmul(Isa::kAvx512, x.data(), m, w.ref, y_amx.data());
          set_quant_amx(false);
          qmatmul(Isa::kAvx512, x.data(), m, w.ref, y_vnni.data());
          set_quant_amx(true);
          const std::string what = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
          ASSERT_EQ(y_amx, y_vnni) << what;
          if (integer) {
            ref::qmatmul(x.data(), m, w.ref, y_ref.data());
            ASSERT_EQ(y_amx, y_ref) << what;
          }
        }
      }
    }
  }
}

// `infera sysinfo` names the quantized kernels: each path its ISA, and on the AVX-512 path
// whether AMX tiles run W8A8 prefill or why not, consistent with the CPU's AMX bits.
TEST(QuantPacked, PathsNameTheirIsaAndAmxState) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_available(isa)) continue;
    const std::string q = quant_matmul_path(isa), g = ggml_matmul_path(isa);
    const std::string name = isa == Isa::kScalar ? "scalar" : isa_name(isa);
    EXPECT_NE(q.find(name), std::string::npos) << q;
    EXPECT_NE(g.find(name), std::string::npos) << g;
  }
  // The AVX2 path names whether its AVX-VNNI kernels run, and set_quant_avxvnni turns them off.
  if (isa_available(Isa::kAvx2)) {
    const char* why = avxvnni_unavailable_reason();
    const std::string on = quant_matmul_path(Isa::kAvx2);
    EXPECT_EQ(on.ends_with("in use"), why == nullptr) << on;
    if (why == nullptr) {
      EXPECT_TRUE(cpu_features().avxvnni);
    }
    // A CPU with AVX-VNNI runs its kernels unless the environment says otherwise.
    if (cpu_features().avxvnni && std::getenv("INFERA_AVXVNNI") == nullptr) {
      EXPECT_EQ(why, nullptr);
    }
    set_quant_avxvnni(false);
    const std::string off = quant_matmul_path(Isa::kAvx2);
    set_quant_avxvnni(true);
    EXPECT_TRUE(off.ends_with("off") || off.ends_with("not on this CPU") || off.ends_with("off (INFERA_AVXVNNI=0)"))
        << off;
  }
  if (!isa_available(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 path on this CPU (AMX state not reported)";
  const std::string q = quant_matmul_path(Isa::kAvx512);
  const CpuFeatures& f = cpu_features();
  const bool amx = f.amx_tile && f.amx_int8 && f.amx_bf16;
  const bool off = q.ends_with("off (INFERA_AMX=0)");
  EXPECT_EQ(q.ends_with("in use"), amx_unavailable_reason() == nullptr) << q;
  if (!amx) {
    EXPECT_TRUE(q.ends_with("not on this CPU") || off) << q;
  } else {
    EXPECT_TRUE(q.ends_with("in use") || q.ends_with("not granted by the kernel") || off) << q;
  }
  // The GGUF block types' prefill names the same AMX state.
  const std::string g = ggml_matmul_path(Isa::kAvx512);
  EXPECT_NE(g.find("AMX int8 tiles"), std::string::npos) << g;
  EXPECT_EQ(g.ends_with("in use"), amx_unavailable_reason() == nullptr) << g;
  if (amx_unavailable_reason() != nullptr) {
    EXPECT_TRUE(g.ends_with(amx_unavailable_reason())) << g;
  }
}

// The extremes the AVX2 kernels' int16 pair sums are sized for: W4A8 nibbles all 15 (weight
// 7) or all 0 (-8) against quants of +-127 over whole 32-column chains (8 vpmaddubsw steps of
// 2 x 15 x 127: 30480), W8A8 weights of -128 (|w| 128: pairs of 32512, as pre-quantized int8
// checkpoints may hold) and 127. Integer activations with max |x| = 127 and unit scales: the
// exact integers on every path.
TEST(QuantPacked, ExtremeWeightsAndActivationsExactOnEveryPath) {
  const int64_t n = 17, k = 256;
  for (QuantScheme s : {QuantScheme::kW4A8, QuantScheme::kW8A8}) {
    const bool int4 = s == QuantScheme::kW4A8;
    for (int w_case = 0; w_case < 3; ++w_case) {
      std::vector<uint8_t> q(static_cast<size_t>(int4 ? n * k / 2 : n * k));
      for (size_t b = 0; b < q.size(); ++b) {
        const uint8_t hi = int4 ? 0xff : 0x7f, lo = int4 ? 0x00 : 0x80;  // int4: 7 / -8; int8: 127 / -128
        q[b] = w_case == 0 ? hi : w_case == 1 ? lo : (b % 3 == 0 ? hi : lo);
      }
      std::vector<uint16_t> s16(static_cast<size_t>(n * (k / 32)), f32_to_f16(1.0f));
      std::vector<float> s32(static_cast<size_t>(n), 1.0f);
      QuantMatRef w{s, n, k, int4 ? 32 : k, q.data(), int4 ? static_cast<const void*>(s16.data()) : s32.data()};
      w.packed = pack_quant_matrix_always(w);
      for (int x_case = 0; x_case < 3; ++x_case) {
        for (int64_t m : {1, 3, 9}) {
          std::vector<float> x(static_cast<size_t>(m * k));
          for (size_t t = 0; t < x.size(); ++t)
            x[t] = x_case == 0 ? 127.0f : x_case == 1 ? -127.0f : ((t / 8) % 2 == 0 ? 127.0f : -127.0f);
          std::vector<float> y_ref(m * n), y(m * n, -1.0f);
          ref::qmatmul(x.data(), m, w, y_ref.data());
          for (const Path& path : paths()) {
            const Isa isa = path.select();
            SCOPED_TRACE(path.name());
            qmatmul(isa, x.data(), m, w, y.data());
            ASSERT_EQ(y, y_ref) << isa_name(isa) << " " << scheme_name(s) << " weights " << w_case << " x " << x_case
                                << " m=" << m;
          }
        }
      }
    }
  }
}

// The SIMD paths must compute from the packed copy (not silently from the on-disk layout):
// with the on-disk bytes zeroed, only the packed copy still holds the weights. A decode
// token and a prefill tile each.
TEST(QuantPacked, SimdPathsComputeFromThePackedCopy) {
  std::mt19937 rng(14);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0;
  for (const Path& path : paths()) {
    const Isa isa = path.select();
    SCOPED_TRACE(path.name());
    if (isa == Isa::kScalar) continue;
    for (QuantScheme s : {QuantScheme::kW8A8, QuantScheme::kW4A8, QuantScheme::kW4A16}) {
      TestMatrix w = random_matrix(s, 40, 128, 32, rng, false);
      for (int64_t m : {1, 5}) {
        std::vector<float> x(m * 128), y_ref(m * 40), y(m * 40);
        for (auto& v : x) v = nd(rng);
        ref::qmatmul(x.data(), m, w.ref, y_ref.data());
        QuantMatRef stale = w.ref;
        stale.packed = pack_quant_matrix_always(w.ref);
        std::vector<uint8_t> zeros(w.q.size(), 0);
        stale.qweight = zeros.data();
        qmatmul(isa, x.data(), m, stale, y.data());
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], y_ref[i], 1e-3 * (std::fabs(y_ref[i]) + 1.0f))
              << isa_name(isa) << " " << scheme_name(s) << " m=" << m;
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no SIMD path on this CPU";
}

// The AVX2 (both kernel sets) and AVX-512 panel kernels add the same integers and run the
// same float epilogue: W8A8 and W4A8 give the same bits on both for every token count, W4A16
// its prefill (its decode adds the column products in a different number of chains).
TEST(QuantPacked, Avx2AndAvx512PanelsGiveTheSameBits) {
  if (!isa_available(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 path on this CPU to compare the AVX2 path with";
  std::mt19937 rng(15);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // (AMX tiles give the VNNI kernel's bits: W8A8AmxAndVnniGemmAgreeExactly.) Back on however
  // the test ends.
  struct AmxOff {
    AmxOff() { set_quant_amx(false); }
    ~AmxOff() { set_quant_amx(true); }
  } amx_off;
  for (const Shape& sh : shapes()) {
    TestMatrix w = random_matrix(sh.scheme, sh.n, sh.k, sh.gs, rng, false);
    w.ref.packed = pack_quant_matrix_always(w.ref);
    for (int64_t m : kTokenCounts) {
      if (sh.scheme == QuantScheme::kW4A16 && m == 1) continue;
      std::vector<float> x(static_cast<size_t>(m * sh.k));
      for (auto& v : x) v = nd(rng);
      std::vector<float> y512(m * sh.n, -2.0f);
      qmatmul(Isa::kAvx512, x.data(), m, w.ref, y512.data());
      for (const Path& path : paths()) {
        if (path.isa != Isa::kAvx2) continue;
        std::vector<float> y2(m * sh.n, -1.0f);
        qmatmul(path.select(), x.data(), m, w.ref, y2.data());
        ASSERT_EQ(y2, y512) << path.name() << " " << describe(Isa::kAvx2, sh, m);
      }
    }
  }
}

// A row slice on panel boundaries keeps a packed view (same panels, no copy); elsewhere it
// has none; either way it computes the sliced rows exactly as the reference does.
TEST(QuantPacked, RowSliceSharesPanelsOnBoundaries) {
  std::mt19937 rng(16);
  std::uniform_int_distribution<int> iv(-127, 127);
  for (QuantScheme s : {QuantScheme::kW8A8, QuantScheme::kW4A8, QuantScheme::kW4A16}) {
    const int64_t n = 16 * 5 + 3, k = 128, m = 3;
    TestMatrix w = random_matrix(s, n, k, 32, rng, true);
    w.ref.packed = pack_quant_matrix_always(w.ref);
    std::vector<float> x(m * k);
    for (auto& v : x) v = static_cast<float>(iv(rng));
    for (int64_t i = 0; i < m; ++i) x[i * k] = 127.0f;
    std::vector<float> full(m * n);
    ref::qmatmul(x.data(), m, w.ref, full.data());
    for (auto [r0, r1, packed] : {std::tuple<int64_t, int64_t, bool>{16, 48, true},
                                  {32, n, true},
                                  {0, 16, true},
                                  {5, 40, false},
                                  {16, 40, false}}) {
      const QuantMatRef slice = quant_row_slice(w.ref, r0, r1);
      EXPECT_EQ(slice.packed != nullptr, packed) << r0 << ".." << r1;
      if (slice.packed) {
        EXPECT_EQ(slice.packed->panel(0), w.ref.packed->panel(r0 / kPanelRows));
      }
      std::vector<float> y(m * (r1 - r0));
      for (const Path& path : paths()) {
        const Isa isa = path.select();
        SCOPED_TRACE(path.name());
        qmatmul(isa, x.data(), m, slice, y.data());
        for (int64_t i = 0; i < m; ++i)
          for (int64_t r = r0; r < r1; ++r)
            ASSERT_EQ(y[i * (r1 - r0) + (r - r0)], full[i * n + r])
                << isa_name(isa) << " " << scheme_name(s) << " rows " << r0 << ".." << r1;
      }
    }
  }
}

// Several threads split the panels (pieces handed out dynamically): same results.
TEST(QuantPacked, ThreadedSplitMatchesReference) {
  std::mt19937 rng(15);
  std::uniform_int_distribution<int> iv(-127, 127);
  set_thread_num_threads(2);
  for (QuantScheme s : {QuantScheme::kW8A8, QuantScheme::kW4A8, QuantScheme::kW4A16}) {
    const int64_t n = 16 * 37 + 5, k = 256, m = 11;
    TestMatrix w = random_matrix(s, n, k, 64, rng, true);
    w.ref.packed = pack_quant_matrix_always(w.ref, 2);
    std::vector<float> x(m * k), y_ref(m * n), y(m * n);
    for (auto& v : x) v = static_cast<float>(iv(rng));
    for (int64_t i = 0; i < m; ++i) x[i * k] = 127.0f;
    ref::qmatmul(x.data(), m, w.ref, y_ref.data());
    for (const Path& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      for (int64_t mm : {int64_t{1}, m}) {
        qmatmul(isa, x.data(), mm, w.ref, y.data());
        for (int64_t i = 0; i < mm * n; ++i)
          ASSERT_EQ(y[i], y_ref[i]) << isa_name(isa) << " " << scheme_name(s) << " m=" << mm;
      }
    }
  }
  set_thread_num_threads(0);
}

// linear_multi: one token against several packed matrices in one pass (q/k/v, gate/up)
// gives exactly the results of one linear() per matrix: odd row counts (pieces of the joint
// panel space end inside a matrix), a one-row matrix, 1 and 2 threads; float weights among
// them run on their own. Weights it cannot fuse (mixed schemes, an unpacked one, more than
// one token) take the per-weight path, with the same results.
TEST(QuantPacked, LinearMultiEqualsOneLinearPerWeight) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (QuantScheme s : {QuantScheme::kW8A8, QuantScheme::kW4A8, QuantScheme::kW4A16}) {
    const int64_t k = 320;
    std::vector<TestMatrix> mats;
    for (int64_t n : {16 * 9 + 5, 1, 16 * 4, 37}) mats.push_back(random_matrix(s, n, k, 64, rng, false));
    std::vector<LinearWeight> lw(mats.size());
    for (size_t i = 0; i < mats.size(); ++i) {
      mats[i].ref.packed = pack_quant_matrix_always(mats[i].ref);
      lw[i].quant = mats[i].ref;
      lw[i].quantized = true;
    }
    std::vector<float> x(2 * k);
    for (auto& v : x) v = nd(rng);
    // The SIMD paths have panel kernels; the scalar one calls per weight.
    auto check = [&](Isa isa, std::vector<const LinearWeight*> ws, int64_t m, bool fusable, const std::string& what) {
      std::vector<std::vector<float>> want(ws.size()), got(ws.size());
      std::vector<float*> ys;
      for (size_t i = 0; i < ws.size(); ++i) {
        want[i].assign(static_cast<size_t>(m * ws[i]->rows()), 0.0f);
        got[i].assign(want[i].size(), -1.0f);
        linear(isa, x.data(), m, *ws[i], want[i].data());
        ys.push_back(got[i].data());
      }
      EXPECT_EQ(linear_multi_fuses(isa, m, ws), fusable && isa != Isa::kScalar) << isa_name(isa) << " " << what;
      linear_multi(isa, x.data(), m, ws, ys);
      for (size_t i = 0; i < ws.size(); ++i)
        for (size_t j = 0; j < want[i].size(); ++j)
          ASSERT_EQ(got[i][j], want[i][j])
              << isa_name(isa) << " " << scheme_name(s) << " " << what << " weight " << i << " value " << j;
    };
    for (const Path& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      for (int threads : {1, 2}) {
        set_thread_num_threads(threads);
        const std::string t = " threads " + std::to_string(threads);
        check(isa, {&lw[0], &lw[1], &lw[2], &lw[3]}, 1, true, "four matrices" + t);
        check(isa, {&lw[3]}, 1, false, "one matrix" + t);
        check(isa, {&lw[1], &lw[2]}, 1, true, "two matrices" + t);
        check(isa, {&lw[0], &lw[1]}, 2, false, "two tokens" + t);
      }
    }
    set_thread_num_threads(0);
    // Mixed: another scheme, a float weight, an unpacked copy.
    std::mt19937 rng2(18);
    const QuantScheme other = s == QuantScheme::kW8A8 ? QuantScheme::kW4A8 : QuantScheme::kW8A8;
    TestMatrix o = random_matrix(other, 16, k, 64, rng2, false);
    o.ref.packed = pack_quant_matrix_always(o.ref);
    LinearWeight lo;
    lo.quant = o.ref;
    lo.quantized = true;
    std::vector<float> dense(static_cast<size_t>(8 * k));
    for (auto& v : dense) v = nd(rng2);
    const LinearWeight ld = dense_linear(MatRef{dense.data(), DType::kF32, 8, k});
    std::vector<float> dense2(static_cast<size_t>(3 * k));
    for (auto& v : dense2) v = nd(rng2);
    const LinearWeight ld2 = dense_linear(MatRef{dense2.data(), DType::kF32, 3, k});
    LinearWeight unpacked = lw[2];
    unpacked.quant.packed = nullptr;
    for (const Path& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      check(isa, {&lw[0], &lo}, 1, false, "mixed schemes");
      check(isa, {&lw[0], &ld}, 1, false, "a float weight");
      check(isa, {&ld, &lw[0], &ld2, &lw[3]}, 1, true, "two float weights among two quantized ones");
      check(isa, {&lw[0], &unpacked}, 1, false, "an unpacked weight");
    }
  }
}

// Zero-point corrections (AWQ, GPTQ sym=false: QuantExtras::corr) ride the fused pass: the
// matrices still fuse (AVX-512, AVX2), each gets its own correction from its own rows (row slices of
// one corrected matrix, as fused experts are bound, included), and the results are the bits of
// one qmatmul per matrix, which is checked against W = s·(q − 8) + corr per group in double.
// Extras the pass cannot take (act-order permutation) send the whole list per matrix.
TEST(QuantPacked, MultiPassAddsZeroPointCorrections) {
  std::mt19937 rng(19);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (QuantScheme s : {QuantScheme::kW4A16, QuantScheme::kW4A8, QuantScheme::kW8A8}) {
    const int64_t k = 384;
    // Correction groups of 128 (AWQ's), 32, and one per row (corr_group = k); none on one matrix.
    const int64_t corr_groups[] = {128, 32, k, 0, 128};
    const int64_t rows[] = {16 * 7 + 3, 37, 1, 16 * 2, 2 * 48};
    std::vector<TestMatrix> mats;
    std::vector<LinearWeight> lw;
    for (size_t i = 0; i < std::size(rows); ++i) {
      mats.push_back(random_matrix(s, rows[i], k, 64, rng, false));
      QuantMatRef& q = mats.back().ref;
      q.packed = pack_quant_matrix_always(q);
      if (corr_groups[i] > 0) {
        auto e = std::make_shared<QuantExtras>();
        e->corr_group = corr_groups[i];
        for (int64_t j = 0; j < rows[i] * (k / corr_groups[i]); ++j) e->corr.push_back(0.02f * nd(rng));
        q.extras = e;
      }
    }
    for (size_t i = 0; i < mats.size(); ++i) {
      LinearWeight w;
      w.quant = mats[i].ref;
      w.quantized = true;
      lw.push_back(w);
    }
    // The last one split into an expert's gate and up rows (a row slice keeps its corrections;
    // cut at a panel edge, it keeps its packed copy).
    LinearWeight gate = lw.back(), up = lw.back();
    gate.quant = quant_row_slice(lw.back().quant, 0, 48);
    up.quant = quant_row_slice(lw.back().quant, 48, 96);
    // Act-order: a permutation of the inputs.
    LinearWeight perm = lw[0];
    {
      auto e = std::make_shared<QuantExtras>(*lw[0].quant.extras);
      for (int64_t j = 0; j < k; ++j) e->in_perm.push_back(static_cast<int32_t>((j * 7) % k));
      perm.quant.extras = e;
    }
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = nd(rng);
    auto check = [&](Isa isa, std::vector<const LinearWeight*> ws, bool fusable, const std::string& what) {
      std::vector<std::vector<float>> want(ws.size()), got(ws.size());
      std::vector<float*> ys;
      for (size_t i = 0; i < ws.size(); ++i) {
        want[i].assign(static_cast<size_t>(ws[i]->rows()), 0.0f);
        got[i].assign(want[i].size(), -1.0f);
        linear(isa, x.data(), 1, *ws[i], want[i].data());
        ys.push_back(got[i].data());
      }
      EXPECT_EQ(linear_multi_fuses(isa, 1, ws), fusable && isa != Isa::kScalar) << isa_name(isa) << " " << what;
      linear_multi(isa, x.data(), 1, ws, ys);
      for (size_t i = 0; i < ws.size(); ++i)
        for (size_t j = 0; j < want[i].size(); ++j)
          ASSERT_EQ(got[i][j], want[i][j])
              << isa_name(isa) << " " << scheme_name(s) << " " << what << " weight " << i << " row " << j;
    };
    for (const Path& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      for (int threads : {1, 2}) {
        set_thread_num_threads(threads);
        const std::string t = " threads " + std::to_string(threads);
        check(isa, {&lw[0], &lw[1], &lw[2], &lw[3], &lw[4]}, true, "five matrices, four corrected" + t);
        check(isa, {&gate, &up}, true, "an expert's gate and up rows" + t);
        check(isa, {&lw[3], &gate, &lw[1], &up}, true, "uncorrected first" + t);
        check(isa, {&lw[1], &perm}, false, "an act-order permutation" + t);
      }
    }
    set_thread_num_threads(0);
    // The corrected result against the dequantized weights plus the correction, in double.
    for (const Path& path : paths()) {
      const Isa isa = path.select();
      SCOPED_TRACE(path.name());
      std::vector<float> yg(48), yu(48);
      std::vector<const QuantMatRef*> ws = {&gate.quant, &up.quant};
      std::vector<float*> ys = {yg.data(), yu.data()};
      qmatmul_multi(isa, x.data(), 1, ws, ys);
      const QuantMatRef& full = lw.back().quant;
      const QuantExtras& e = *full.extras;
      std::vector<float> row(static_cast<size_t>(k));
      std::vector<int8_t> xq(static_cast<size_t>(k));
      float sx = 1.0f;
      if (scheme_quantizes_activations(s)) {
        quantize_activations(Isa::kScalar, x.data(), 1, k, xq.data(), k, &sx, nullptr);
      }
      for (int64_t r = 0; r < 96; ++r) {
        dequantize_row(QuantMatRef{full.scheme, full.rows, full.cols, full.group_size, full.qweight, full.scales}, r,
                       row.data());
        double want = 0.0, mag = 0.0;
        for (int64_t j = 0; j < k; ++j) {
          const double xv = scheme_quantizes_activations(s) ? double{sx} * xq[j] : double{x[j]};
          want += double{row[j]} * xv;
          mag += std::fabs(double{row[j]} * xv);
        }
        for (int64_t g = 0; g < k / e.corr_group; ++g) {  // corr is group-major [groups, rows]
          double sum = 0.0;
          for (int64_t j = g * e.corr_group; j < (g + 1) * e.corr_group; ++j) sum += x[j];
          want += double{e.corr[g * 96 + r]} * sum;
          mag += std::fabs(double{e.corr[g * 96 + r]} * sum);
        }
        const float got = r < 48 ? yg[r] : yu[r - 48];
        ASSERT_NEAR(got, want, 1e-5 * (1.0 + mag)) << isa_name(isa) << " " << scheme_name(s) << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace infera::kernels
