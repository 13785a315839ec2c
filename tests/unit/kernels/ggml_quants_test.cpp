// The ggml block formats' dequantization reference (kernels/ggml_quants.h) against a second,
// independent reading of the format: element by element, from the per-element index rules
// (which byte, which bits, which scale) rather than the block loops, on random blocks.
#include "infera/kernels/ggml_quants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../test_support.h"
#include "ggml_random_blocks.h"
#include "infera/base/membw.h"
#include "infera/base/threads.h"
#include "infera/kernels/kernels.h"
#include "infera/kernels/quant.h"
#include "infera/tensor/dtype.h"

namespace infera::kernels::ggml {
namespace {

float h(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return f16_to_f32(v);
}
int nib(uint8_t b, bool high) { return high ? b >> 4 : b & 0xF; }

// Element e of the block at b, from the index rules of the format.
float element(uint32_t type, const uint8_t* b, int e) {
  switch (type) {
    case kQ4_0: return static_cast<float>(nib(b[2 + e % 16], e >= 16) - 8) * h(b);
    case kQ4_1: return static_cast<float>(nib(b[4 + e % 16], e >= 16)) * h(b) + h(b + 2);
    case kQ5_0:
    case kQ5_1: {
      const bool one = type == kQ5_1;
      uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      const int q = nib(b[(one ? 8 : 6) + e % 16], e >= 16) | static_cast<int>(((qh >> e) & 1u) << 4);
      return one ? static_cast<float>(q) * h(b) + h(b + 2) : static_cast<float>(q - 16) * h(b);
    }
    case kQ8_0: return static_cast<float>(static_cast<int8_t>(b[2 + e])) * h(b);
    case kIQ4_NL: return h(b) * static_cast<float>(kIq4nlValues[nib(b[2 + e % 16], e >= 16)]);
    case kIQ4_XS: {
      const int ib = e / 32, r = e % 32;
      uint16_t sh;
      std::memcpy(&sh, b + 2, 2);
      const int ls = nib(b[4 + ib / 2], ib % 2 == 1) | (((sh >> (2 * ib)) & 3) << 4);
      return h(b) * static_cast<float>(ls - 32) *
             static_cast<float>(kIq4nlValues[nib(b[8 + 16 * ib + r % 16], r >= 16)]);
    }
    case kQ4_K:
    case kQ5_K: {
      const uint8_t* s = b + 4;
      const int j = e / 32;
      const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      const int c = e / 64, r = e % 64;
      const uint8_t* qs = b + (type == kQ4_K ? 16 : 48);
      int q = nib(qs[32 * c + r % 32], r >= 32);
      if (type == kQ5_K) q |= ((b[16 + e % 32] >> (e / 32)) & 1) << 4;
      return h(b) * static_cast<float>(sc) * static_cast<float>(q) - h(b + 2) * static_cast<float>(m);
    }
    case kQ6_K: {
      const int hh = e / 128, r = e % 128, g = r / 32, l = r % 32;
      const uint8_t* ql = b;
      const int low = g < 2 ? nib(ql[64 * hh + 32 * g + l], false) : nib(ql[64 * hh + 32 * (g - 2) + l], true);
      const int high = (b[128 + 32 * hh + l] >> (2 * g)) & 3;
      const int q = (low | (high << 4)) - 32;
      return h(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + e / 16])) * static_cast<float>(q);
    }
    case kQ3_K: {
      const uint8_t* sc = b + 96;
      const int j = e / 16;
      const int low = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
      const int high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
      const int hh = e / 128, r = e % 128, s = r / 32, l = r % 32;
      const int q2 = (b[32 + 32 * hh + l] >> (2 * s)) & 3;
      const bool hb = (b[l] >> (4 * hh + s)) & 1;
      return h(b + 108) * static_cast<float>((low | (high << 4)) - 32) * static_cast<float>(q2 - (hb ? 0 : 4));
    }
    case kQ2_K: {
      const uint8_t sc = b[e / 16];
      const int hh = e / 128, r = e % 128, s = r / 32, l = r % 32;
      const int q = (b[16 + 32 * hh + l] >> (2 * s)) & 3;
      return h(b + 80) * static_cast<float>(sc & 15) * static_cast<float>(q) - h(b + 82) * static_cast<float>(sc >> 4);
    }
    default: ADD_FAILURE() << "type " << type; return 0;
  }
}

TEST(GgmlQuants, DequantizeMatchesTheFormatElementByElement) {
  std::mt19937 rng(7);
  for (uint32_t type : {kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kIQ4_NL, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_XS}) {
    const int64_t bs = block_size(type), nb = 3;
    const std::vector<uint8_t> bytes = random_blocks(type, nb, rng);
    std::vector<float> out(static_cast<size_t>(nb * bs));
    dequantize_row(type, bytes.data(), out.data(), nb * bs);
    for (int64_t i = 0; i < nb; ++i) {
      for (int e = 0; e < bs; ++e) {
        const float want = element(type, bytes.data() + i * type_size(type), e);
        // Bit-exact: the same f32 products in the same order.
        ASSERT_EQ(out[i * bs + e], want) << "type " << type << " block " << i << " element " << e;
      }
    }
  }
}

// x as llama.cpp's activation blocks hold it (Q8_0 / Q8_1 per 32, Q8_K per 256), dequantized.
std::vector<float> activation_as_quantized(uint32_t type, const std::vector<float>& x) {
  std::vector<float> out(x.size());
  const bool k_form = block_size(type) == 256;
  const size_t bs = k_form ? 256 : 32;
  for (size_t b = 0; b < x.size(); b += bs) {
    float amax = 0, max = 0;
    for (size_t j = b; j < b + bs; ++j) {
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
    }
    for (size_t j = b; j < b + bs; ++j) {
      if (amax == 0) {
        out[j] = 0;
      } else if (k_form) {
        const float iscale = -127.f / max;
        out[j] = static_cast<float>(std::min(127.0f, std::nearbyint(iscale * x[j]))) * (1 / iscale);
      } else {
        out[j] = std::nearbyint(x[j] * (127.f / amax)) * f16_to_f32(f32_to_f16(amax / 127.f));
      }
    }
  }
  return out;
}

// matmul_rows on every ISA path: equal to each other exactly, and to the dequantized weights
// times the quantized activations (up to f32 rounding), on odd shapes and row ranges: row
// ranges that end inside a tile of the SIMD paths (4 rows, also of the in-place decode steps
// of Q8_0 / Q4_K / Q6_K at one activation row; 16 for the AVX-512 VNNI prefill tiles, from 4
// activation rows on, taken in pairs, the second of a pair partial or alone, and activation
// rows 4, 2 and 1 at a time), an odd number of blocks per row, and more activation rows than
// one prefill block of those paths (64); and matrices with rows enough that the decode steps
// prefetch tiles ahead (at least 16 KB of weights ahead: tens of tiles of one-block rows),
// with one block and with many.
// Every path the matmul can take here: each ISA, and on the avx512 path the AMX tiles where
// the CPU has them (prefill of >= 16 rows) as well as the VNNI tiles.
// The panel types also from their panels (pack_panels) on the avx512 and avx2 paths, used where
// n0 is a multiple of 16 (else those paths fall back to the rows, also checked), on avx512 with
// and without AMX (Q8_0's whole groups of 16 tokens).
struct Path {
  Isa isa;
  bool amx;
  std::string name;
  bool panels = false;
};

std::vector<Path> paths() {
  std::vector<Path> out;
  for (Isa isa : test::available_isas()) {
    out.push_back({isa, false, isa_name(isa)});
    if (isa == Isa::kAvx512 && amx_unavailable_reason() == nullptr) out.push_back({isa, true, "avx512 + amx"});
    if (isa != Isa::kScalar) out.push_back({isa, false, std::string(isa_name(isa)) + " + panels", true});
    if (isa == Isa::kAvx512 && amx_unavailable_reason() == nullptr)
      out.push_back({isa, true, "avx512 + amx + panels", true});
  }
  return out;
}

class AmxScope {
 public:
  explicit AmxScope(bool enabled) : saved_(ggml_amx_enabled()) { set_ggml_amx(enabled); }
  ~AmxScope() { set_ggml_amx(saved_); }
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;

 private:
  bool saved_;
};

// Q6_K's panels in the layout given (ggml::q6k_panels_beside) while in scope.
class Q6kLayoutScope {
 public:
  explicit Q6kLayoutScope(int beside) { set_q6k_panels_beside(beside); }
  ~Q6kLayoutScope() { set_q6k_panels_beside(-1); }
  Q6kLayoutScope(const Q6kLayoutScope&) = delete;
  Q6kLayoutScope& operator=(const Q6kLayoutScope&) = delete;
};

// The layouts a case runs under (Q6kLayoutScope): both where it computes from Q6_K panels.
std::vector<int> q6k_layouts(bool q6k_panels) { return q6k_panels ? std::vector<int>{0, 1} : std::vector<int>{0}; }

struct MatmulShape {
  int64_t blocks, rows, n0, n1;
  std::vector<int64_t> ms;
};

TEST(GgmlQuants, MatmulMatchesDequantizedWeightsTimesQuantizedActivations) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const MatmulShape shapes[] = {
      {2, 37, 3, 34, {1, 3, 17}},
      {3, 23, 1, 22, {2, 70}},
      {5, 9, 0, 9, {1}},
      {1, 53, 5, 52, {4, 7}},
      {1, 301, 2, 299, {1, 2, 3, 5, 65}},
      {9, 150, 1, 149, {1, 5}},
      // Whole and partial 16-row tiles and token blocks (9: one padded block), several
      // passes' worth of K-type super-blocks (the AMX prefill).
      {8, 48, 0, 48, {16, 32, 33, 80}},
      {2, 35, 3, 35, {9, 16, 47, 64}},
      // Several 512-weight chunks of the VNNI tiles and a shorter last one, for the 32-weight
      // block types too (800 weights).
      {25, 20, 0, 20, {5, 9}},
      // Panels from the second on, the last partial; 1 to 4 tokens in one pass, more over
      // 16-block chunks (a shorter last one), a last group of 1 to 3 tokens; an odd number of panels.
      {19, 70, 16, 61, {1, 2, 3, 4, 6, 7, 13, 37}},
      {17, 33, 0, 33, {1, 5}},
      // Past the AMX threshold of the 32-weight block types' panels (128 tokens), a partial
      // last group and a partial last panel.
      {3, 21, 0, 21, {130}},
  };
  for (const MatmulShape& shape : shapes) {
    for (uint32_t type : {kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kIQ4_NL, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_XS}) {
      const int64_t k = block_size(type) * shape.blocks, rows = shape.rows, n0 = shape.n0, n1 = shape.n1;
      const std::vector<uint8_t> w = random_blocks(type, rows * k / block_size(type), rng);
      for (int64_t m : shape.ms) {
        std::vector<float> x(static_cast<size_t>(m * k));
        for (auto& v : x) v = normal(rng);
        std::vector<float> want(static_cast<size_t>(m * (n1 - n0)));
        std::vector<float> wrow(static_cast<size_t>(k));
        for (int64_t i = 0; i < m; ++i) {
          const std::vector<float> xi(x.begin() + i * k, x.begin() + (i + 1) * k);
          const std::vector<float> xq = activation_as_quantized(type, xi);
          for (int64_t j = n0; j < n1; ++j) {
            dequantize_row(type, w.data() + j * row_bytes(type, k), wrow.data(), k);
            double sum = 0, mag = 0;
            for (int64_t t = 0; t < k; ++t) {
              sum += double(wrow[t]) * double(xq[t]);
              mag += std::fabs(double(wrow[t]) * double(xq[t]));
            }
            want[i * (n1 - n0) + (j - n0)] = static_cast<float>(sum);
          }
        }
        std::vector<float> first;
        for (const Path& path : paths()) {
          for (int beside : q6k_layouts(path.panels && type == kQ6_K)) {
            const Q6kLayoutScope layout(beside);
            const std::string name =
                path.name + (path.panels && type == kQ6_K ? beside ? " (beside)" : " (apart)" : "");
            AmxScope amx(path.amx);
            std::vector<float> y(static_cast<size_t>(m * (n1 - n0) + 5), -1.0f);
            if (path.panels && !can_pack_panels(type)) continue;
            const std::shared_ptr<const uint8_t> panels = path.panels ? pack_panels(type, w.data(), rows, k) : nullptr;
            matmul_rows(path.isa, type, w.data(), k, x.data(), m, n0, n1, y.data(), n1 - n0, panels.get());
            for (size_t t = 0; t < want.size(); ++t) {
              // Q4_1 / Q5_1: llama.cpp folds the offsets in through the f16-rounded block sums.
              const float tol = 1e-3f * (1.0f + std::fabs(want[t])) + ((type == kQ4_1 || type == kQ5_1) ? 0.02f : 0.0f);
              ASSERT_NEAR(y[t], want[t], tol) << "type " << type << " path " << name << " m " << m << " at " << t;
            }
            EXPECT_EQ(y[want.size()], -1.0f) << "wrote past the output";
            y.resize(want.size());
            if (first.empty())
              first = y;
            else
              EXPECT_EQ(y, first) << "type " << type << ": " << name << " differs from the scalar path (m " << m
                                  << ", k " << k << ")";
          }
        }
      }
    }
  }
}

// Q6_K's two panel layouts hold the same bytes in other places (so the test above reads each),
// and q6k_panels_beside follows set_q6k_panels_beside until it is reset.
TEST(GgmlQuants, Q6kPanelLayoutsDiffer) {
  std::mt19937 rng(5);
  const int64_t rows = 32, k = 512;
  const std::vector<uint8_t> w = random_blocks(kQ6_K, rows * k / block_size(kQ6_K), rng);
  const int64_t bytes = 2 * panel_bytes(kQ6_K, k);
  std::shared_ptr<const uint8_t> packed[2];
  for (int beside : {0, 1}) {
    const Q6kLayoutScope layout(beside);
    EXPECT_EQ(q6k_panels_beside(), beside == 1);
    packed[beside] = pack_panels(kQ6_K, w.data(), rows, k);
  }
  EXPECT_NE(std::memcmp(packed[0].get(), packed[1].get(), static_cast<size_t>(bytes)), 0);
  // The same multiset of bytes: a permutation of where each 64-byte vector sits.
  std::vector<uint8_t> a(packed[0].get(), packed[0].get() + bytes), b(packed[1].get(), packed[1].get() + bytes);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

// The avx512 and avx2 paths compute the panel types from their panels (not silently from the
// rows): with the rows zeroed, only the panels still hold the weights. A row slice keeps the
// panels (a view into the same copy) when it starts on a panel boundary and has none elsewhere;
// every slice computes its rows as the whole matrix does, bit for bit, on every path.
TEST(GgmlQuants, PanelsAreWhatTheSimdPathsReadAndRowSlicesShareThem) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 path on this CPU";
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 16 * 4 + 5, m = 3;
  int packed = 0;
  for (uint32_t type : {kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kIQ4_NL, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_XS}) {
    if (!can_pack_panels(type)) continue;
    ++packed;
    const int64_t k = block_size(type) * 7;
    std::vector<uint8_t> w = random_blocks(type, rows * 7, rng);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (auto& v : x) v = normal(rng);
    std::vector<float> want(static_cast<size_t>(m * rows)), y(want.size(), -1.0f);
    kernels::MatRef mat{w.data(), DType::kGgml, rows, k, type};
    kernels::matmul(Isa::kScalar, x.data(), m, mat, want.data());
    mat.panels = pack_panels(type, w.data(), rows, k);
    for (auto [r0, r1, kept] : {std::tuple<int64_t, int64_t, bool>{16, 48, true},
                                {32, rows, true},
                                {0, 16, true},
                                {5, 40, false},
                                {17, rows, false}}) {
      const kernels::MatRef s = kernels::row_slice(mat, r0, r1);
      EXPECT_EQ(s.panels != nullptr, kept) << r0 << ".." << r1;
      if (s.panels) {
        EXPECT_EQ(s.panels.get(), mat.panels.get() + r0 / kPanelRows * panel_bytes(type, k));
      }
      for (Isa isa : test::available_isas()) {
        std::vector<float> ys(static_cast<size_t>(m * (r1 - r0)));
        kernels::matmul(isa, x.data(), m, s, ys.data());
        for (int64_t i = 0; i < m; ++i)
          for (int64_t r = r0; r < r1; ++r)
            ASSERT_EQ(ys[i * (r1 - r0) + (r - r0)], want[i * rows + r])
                << "type " << type << " " << isa_name(isa) << " rows " << r0 << ".." << r1;
      }
    }
    std::fill(w.begin(), w.end(), uint8_t{0});  // the rows gone: only the panels hold the weights
    for (Isa isa : test::available_isas()) {
      if (isa == Isa::kScalar) continue;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::fill(y.begin(), y.end(), -1.0f);
        kernels::matmul(isa, x.data(), m, mat, y.data());
        EXPECT_EQ(y, want) << "type " << type << ", " << isa_name(isa) << ", " << threads << " threads";
      }
    }
    set_num_threads(0);
    // Held as panels only (a tensor-parallel column slice): the same values where the panels
    // are read, a clear error where the rows would be.
    kernels::MatRef only = mat;
    only.data = nullptr;
    for (Isa isa : test::available_isas()) {
      if (isa == Isa::kScalar) {
        EXPECT_THROW(kernels::matmul(isa, x.data(), m, only, y.data()), Error);
        continue;
      }
      std::fill(y.begin(), y.end(), -1.0f);
      kernels::matmul(isa, x.data(), m, only, y.data());
      EXPECT_EQ(y, want) << "type " << type << ", " << isa_name(isa) << ", panels only";
      const kernels::MatRef tail = kernels::row_slice(only, 16, rows);
      EXPECT_EQ(tail.data, nullptr);
      std::vector<float> ys(static_cast<size_t>(m * (rows - 16)));
      kernels::matmul(isa, x.data(), m, tail, ys.data());
      for (int64_t i = 0; i < m; ++i) ASSERT_EQ(ys[i * (rows - 16)], want[i * rows + 16]) << "type " << type;
      try {
        kernels::matmul_rows(isa, x.data(), m, only, 5, rows, ys.data(), rows - 5);
        ADD_FAILURE() << "rows off a panel boundary of a matrix held as panels only";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("held as panels only"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_EQ(packed, 12);  // every type with a matmul
}

// Panels laid over a LaneBuffer's four lanes (PanelRef: panel p in lane p % 4) are the same
// panels: every type, decode and several rows, one and two threads, every prefetch mode, and
// row slices that start on any panel (so in any lane: their phase) compute what the matrix in
// one run computes, bit for bit; the rows zeroed, only the lanes hold the weights. A LaneBuffer
// without room leaves the panels in one run.
TEST(GgmlQuants, PanelsOverLanesComputeWhatPanelsInOneRunDo) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 path on this CPU";
  std::mt19937 rng(47);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // 10 panels (the last partial): two groups of four and a partial one; 1 panel; 23 panels.
  for (const int64_t rows : std::initializer_list<int64_t>{16 * 9 + 5, 7, 16 * 23})
    for (uint32_t type : {kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kIQ4_NL, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_XS}) {
      const int64_t k = block_size(type) * 5;
      std::vector<uint8_t> w = random_blocks(type, rows * 5, rng);
      const int64_t m_most = 19;
      std::vector<float> x(static_cast<size_t>(m_most * k));
      for (auto& v : x) v = normal(rng);
      kernels::MatRef run{w.data(), DType::kGgml, rows, k, type};
      run.panels = pack_panels(type, w.data(), rows, k);
      const auto lanes = std::make_shared<LaneBuffer>(size_t{1} << 20);
      LanePanels packed = pack_panels(type, w.data(), rows, k, lanes);
      ASSERT_EQ(packed.ref.lane, static_cast<int64_t>(lanes->stride())) << "type " << type;
      EXPECT_EQ(packed.ref.phase, 0);
      EXPECT_EQ(packed.ref.base, packed.owner.get());
      const int64_t groups = (rows + 63) / 64;
      EXPECT_EQ(lanes->used(), static_cast<size_t>((groups * panel_bytes(type, k) + 63) / 64 * 64));
      kernels::MatRef laned = run;
      laned.set_panels(packed);
      // Each matrix and its slices from panels 1, 2 and 3 (phases 1-3 over the lanes).
      const auto slices = [&](const kernels::MatRef& mat) {
        std::vector<kernels::MatRef> out{mat};
        for (int64_t p0 = 1; p0 < 4 && 16 * p0 < rows; ++p0) out.push_back(kernels::row_slice(mat, 16 * p0, rows));
        return out;
      };
      const std::vector<kernels::MatRef> runs = slices(run), laneds = slices(laned);
      std::fill(w.begin(), w.end(), uint8_t{0});  // only the panels hold the weights now
      for (size_t v = 0; v < runs.size(); ++v) {
        ASSERT_TRUE(laneds[v].panels) << "slice " << v;
        EXPECT_EQ(laneds[v].panel_phase, static_cast<int64_t>(v));
        for (Isa isa : test::available_isas()) {
          if (isa == Isa::kScalar) continue;
          for (int threads : {1, 2})
            for (int64_t m : {int64_t{1}, int64_t{3}, m_most}) {
              set_num_threads(threads);
              const int64_t n = runs[v].rows;
              std::vector<float> want(static_cast<size_t>(m * n)), got(want.size());
              kernels::matmul(isa, x.data(), m, runs[v], want.data());
              kernels::matmul(isa, x.data(), m, laneds[v], got.data());
              EXPECT_EQ(got, want) << "type " << type << ", " << isa_name(isa) << ", " << threads << " threads, m " << m
                                   << ", rows " << rows << ", slice from panel " << v;
              if (m == 1)
                for (PanelPrefetch pf : {PanelPrefetch::kL1, PanelPrefetch::kL2, PanelPrefetch::kNone}) {
                  std::fill(got.begin(), got.end(), -1.0f);
                  matmul_rows(isa, type, laneds[v].data, k, x.data(), 1, 0, n, got.data(), n, laneds[v].panel_ref(),
                              pf);
                  EXPECT_EQ(got, want) << "type " << type << ", prefetch mode " << static_cast<int>(pf);
                }
            }
        }
      }
      set_num_threads(0);
    }
  // No room: one run, the same values.
  std::vector<uint8_t> w = random_blocks(kQ4_K, 16 * 3, rng);
  const auto small = std::make_shared<LaneBuffer>(4096);
  ASSERT_NE(small->take(small->stride() - 64), nullptr);
  const LanePanels one = pack_panels(kQ4_K, w.data(), 16 * 3, 256, small);
  EXPECT_EQ(one.ref.lane, 0);
  EXPECT_EQ(one.ref.base, one.owner.get());
  const std::shared_ptr<const uint8_t> ref = pack_panels(kQ4_K, w.data(), 16 * 3, 256);
  EXPECT_EQ(std::memcmp(one.owner.get(), ref.get(), static_cast<size_t>(3 * panel_bytes(kQ4_K, 256))), 0);
}

// Several decode steps at once (kernels::matvec_many; ggml::matvec_many: the threads share all
// the steps' panels) give each step what matmul_rows gives it alone, bit for bit: every panel
// type, steps of different types and sizes (a partial last panel, one panel), steps that read
// one x and steps that read their own, row ranges from a panel on (any phase over the lanes),
// panels over lanes (and in one run, where kernels::matvec_many makes a call each and
// ggml::matvec_many shares them all the same), one to three threads, every prefetch mode. Steps
// that cannot be shared (no panels, a row range off a panel boundary, the scalar path) run one
// call each with the same values.
void check_matvec_many() {
  std::mt19937 rng(53);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const uint32_t types[] = {kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kIQ4_NL, kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K, kIQ4_XS};
  const auto lanes = std::make_shared<LaneBuffer>(size_t{4} << 20);
  struct Mat {
    std::vector<uint8_t> w;
    kernels::MatRef run, laned;
  };
  std::vector<Mat> mats;
  mats.reserve(std::size(types));
  const int64_t rows_of[] = {16 * 9 + 5, 7, 16 * 5, 16 * 13 + 1};
  for (size_t i = 0; i < std::size(types); ++i) {
    const uint32_t type = types[i];
    const int64_t rows = rows_of[i % 4], k = block_size(type) * (i % 2 ? 3 : 8);
    Mat m;
    m.w = random_blocks(type, rows * k / block_size(type), rng);
    m.run = {m.w.data(), DType::kGgml, rows, k, type};
    m.run.panels = pack_panels(type, m.w.data(), rows, k);
    m.laned = m.run;
    m.laned.set_panels(pack_panels(type, m.w.data(), rows, k, lanes));
    ASSERT_NE(m.laned.panel_lane, 0) << "type " << type;
    mats.push_back(std::move(m));
  }
  // One x per column count (steps of equal k read the same x), and one of its own per step.
  std::vector<std::vector<float>> xs(2 * mats.size());
  for (size_t i = 0; i < mats.size(); ++i)
    for (size_t c = 0; c < 2; ++c) {
      xs[2 * i + c].resize(static_cast<size_t>(mats[i].run.cols));
      for (auto& v : xs[2 * i + c]) v = normal(rng);
    }
  const auto shared_x = [&](int64_t k) {
    for (size_t i = 0; i < mats.size(); ++i)
      if (mats[i].run.cols == k) return xs[2 * i].data();
    return static_cast<float*>(nullptr);
  };
  for (Isa isa : test::available_isas()) {
    for (bool over_lanes : {false, true})
      for (bool own_x : {false, true})
        for (int threads : {1, 2, 3}) {
          set_num_threads(threads);
          // Every matrix whole, then rows from panel 1 (phase 1) and from panel 2 to one row short.
          std::vector<kernels::MatVec> steps;
          std::vector<std::vector<float>> want, got;
          for (size_t i = 0; i < mats.size(); ++i) {
            const kernels::MatRef& w = over_lanes ? mats[i].laned : mats[i].run;
            const float* x = own_x ? xs[2 * i + 1].data() : shared_x(w.cols);
            const int64_t ranges[3][2] = {{0, w.rows}, {16, w.rows}, {32, w.rows - 1}};
            for (const auto& r : ranges) {
              if (r[0] >= r[1]) continue;
              steps.push_back({x, &w, nullptr, r[0], r[1] == w.rows && r[0] == 0 ? -1 : r[1]});
              want.emplace_back(static_cast<size_t>(r[1] - r[0]));
              kernels::matmul_rows(isa, x, 1, w, r[0], r[1], want.back().data(), r[1] - r[0]);
            }
          }
          for (size_t s = 0; s < steps.size(); ++s) {
            got.emplace_back(want[s].size(), -1.0f);
            steps[s].y = got.back().data();
          }
          for (int pf = -1; pf < 3; ++pf) {
            kernels::set_gguf_prefetch(pf);
            for (auto& g : got) std::fill(g.begin(), g.end(), -1.0f);
            for (const kernels::MatVec& st : steps)  // (panels in one run: a call each)
              ASSERT_EQ(kernels::matvec_shares(isa, *st.w, st.r0), isa != Isa::kScalar && over_lanes);
            kernels::matvec_many(isa, steps);
            for (size_t s = 0; s < steps.size(); ++s)
              ASSERT_EQ(got[s], want[s]) << isa_name(isa) << ", step " << s << " (type " << steps[s].w->ggml_type
                                         << ", rows " << steps[s].r0 << "-" << steps[s].r1 << "), "
                                         << (over_lanes ? "over lanes" : "one run") << (own_x ? ", own x" : "") << ", "
                                         << threads << " threads, prefetch " << pf;
          }
          kernels::set_gguf_prefetch(-1);
        }
    // ggml::matvec_many itself takes panels in one run too.
    if (isa != Isa::kScalar) {
      std::vector<PanelMatVec> one_run;
      std::vector<std::vector<float>> out(mats.size());
      for (size_t i = 0; i < mats.size(); ++i) {
        out[i].assign(static_cast<size_t>(mats[i].run.rows), -1.0f);
        one_run.push_back({mats[i].run.ggml_type, mats[i].run.cols, xs[2 * i].data(), mats[i].run.panel_ref(),
                           mats[i].run.rows, out[i].data()});
      }
      set_num_threads(2);
      matvec_many(isa, one_run);
      for (size_t i = 0; i < mats.size(); ++i) {
        std::vector<float> want(out[i].size());
        kernels::matmul(isa, xs[2 * i].data(), 1, mats[i].run, want.data());
        EXPECT_EQ(out[i], want) << isa_name(isa) << ", one run, type " << mats[i].run.ggml_type;
      }
      set_num_threads(0);
    }
    // Steps that are not shared: an f32 matrix, rows off a panel boundary, a GGUF matrix without
    // panels; run one by one, with the same values.
    const Mat& q = mats[8];  // Q4_K
    std::vector<float> f32(static_cast<size_t>(5 * q.run.cols));
    for (auto& v : f32) v = normal(rng);
    const kernels::MatRef dense{f32.data(), DType::kF32, 5, q.run.cols};
    kernels::MatRef bare = q.run;
    bare.panels = nullptr;
    EXPECT_FALSE(kernels::matvec_shares(isa, dense));
    EXPECT_FALSE(kernels::matvec_shares(isa, q.laned, 3));
    EXPECT_FALSE(kernels::matvec_shares(isa, bare));
    EXPECT_FALSE(kernels::matvec_shares(isa, q.run));
    const float* x = xs[16].data();
    std::vector<float> a(5), b(static_cast<size_t>(q.run.rows - 3)), c(static_cast<size_t>(q.run.rows)), d(a.size()),
        e(b.size()), f(c.size());
    const kernels::MatVec mixed[] = {{x, &dense, a.data()}, {x, &q.laned, b.data(), 3}, {x, &bare, c.data()}};
    kernels::matvec_many(isa, mixed);
    kernels::matmul(isa, x, 1, dense, d.data());
    kernels::matmul_rows(isa, x, 1, q.run, 3, q.run.rows, e.data(), q.run.rows - 3);
    kernels::matmul(isa, x, 1, q.run, f.data());
    EXPECT_EQ(a, d) << isa_name(isa);
    EXPECT_EQ(b, e) << isa_name(isa);
    EXPECT_EQ(c, f) << isa_name(isa);
  }
  set_num_threads(0);
}

TEST(GgmlQuants, MatvecManyGivesEachStepWhatItsOwnCallGives) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 path on this CPU";
  for (int beside : q6k_layouts(true)) {
    SCOPED_TRACE(beside ? "q6k beside" : "q6k apart");
    const Q6kLayoutScope layout(beside);
    check_matvec_many();
  }
}

// kernels::linear_multi at a decode step with several threads runs a layer's GGUF matrices
// that read one input (q, k, v of mixed types; two of them; one) in one shared pass: each
// output what its own matmul gives, bit for bit.
TEST(GgmlQuants, LinearMultiSharesSameInputMatricesAndKeepsTheirValues) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 path on this CPU";
  std::mt19937 rng(59);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 512;
  const auto lanes = std::make_shared<LaneBuffer>(size_t{2} << 20);
  const struct {
    uint32_t type;
    int64_t rows;
  } shapes[] = {{kQ4_K, 16 * 7 + 3}, {kQ4_K, 32}, {kQ6_K, 16 * 5}};
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<kernels::LinearWeight> ws;
  blocks.reserve(std::size(shapes));
  for (const auto& sh : shapes) {
    blocks.push_back(random_blocks(sh.type, sh.rows * k / block_size(sh.type), rng));
    kernels::MatRef m{blocks.back().data(), DType::kGgml, sh.rows, k, sh.type};
    m.set_panels(pack_panels(sh.type, m.data, sh.rows, k, lanes));
    ws.push_back(kernels::dense_linear(m));
  }
  std::vector<float> x(static_cast<size_t>(k));
  for (auto& v : x) v = normal(rng);
  for (size_t n : {size_t{1}, size_t{2}, size_t{3}})
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      std::vector<std::vector<float>> want(n), got(n);
      std::vector<const kernels::LinearWeight*> wp;
      std::vector<float*> yp;
      for (size_t i = 0; i < n; ++i) {
        want[i].resize(static_cast<size_t>(ws[i].rows()));
        got[i].assign(want[i].size(), -1.0f);
        kernels::matmul(x.data(), 1, ws[i].dense, want[i].data());
        wp.push_back(&ws[i]);
        yp.push_back(got[i].data());
      }
      kernels::linear_multi(x.data(), 1, wp, yp);
      for (size_t i = 0; i < n; ++i)
        EXPECT_EQ(got[i], want[i]) << n << " matrices, matrix " << i << ", " << threads << " threads";
    }
  set_num_threads(0);
}

// A decode step over the panels prefetches into L1, into L2 or not at all (PanelPrefetch):
// the same values, bit for bit, on every path, for units of 1-4 panels and 1-2 threads (a
// thread's panels split into up to four streams of unequal lengths); and
// auto times the three on the first single-token calls over a matrix of >= 1 MiB and settles
// on one of them for the type and thread bucket.
TEST(GgmlQuants, DecodePrefetchModesGiveTheSameValuesAndAutoSettles) {
  if (!isa_available(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 path on this CPU";
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // 8 panels (the last partial): one thread's two units of 4, two threads' one each; 5: one
  // thread's units of 3 and 2 panels, two threads' of 2 and 3; 1; 71: groups of streams
  // (4 x 16 panels on AVX-512, 2 x 16 on AVX2) and a shorter last group.
  for (const int64_t rows : std::initializer_list<int64_t>{16 * 7 + 3, 16 * 4 + 5, 9, 16 * 70 + 5})
    for (uint32_t type : {kQ4_0, kQ8_0, kIQ4_NL, kQ4_K, kQ5_K, kQ6_K, kQ3_K, kQ2_K, kIQ4_XS}) {
      const int64_t k = 256 * 3;
      std::vector<uint8_t> w = random_blocks(type, rows * k / block_size(type), rng);
      std::vector<float> x(static_cast<size_t>(k));
      for (auto& v : x) v = normal(rng);
      std::vector<float> want(static_cast<size_t>(rows));
      matmul_rows(Isa::kScalar, type, w.data(), k, x.data(), 1, 0, rows, want.data(), rows);
      for (int beside : q6k_layouts(type == kQ6_K)) {
        const Q6kLayoutScope layout(beside);
        const auto panels = pack_panels(type, w.data(), rows, k);
        for (Isa isa : test::available_isas()) {
          if (isa == Isa::kScalar) continue;
          for (int threads : {1, 2}) {
            set_num_threads(threads);
            for (PanelPrefetch pf : {PanelPrefetch::kL1, PanelPrefetch::kL2, PanelPrefetch::kNone}) {
              std::vector<float> y(static_cast<size_t>(rows), -1.0f);
              matmul_rows(isa, type, w.data(), k, x.data(), 1, 0, rows, y.data(), rows, panels.get(), pf);
              ASSERT_EQ(y, want) << "type " << type << " " << isa_name(isa) << " mode " << static_cast<int>(pf) << ", "
                                 << threads << " threads, " << rows << " rows, q6k beside " << beside;
            }
          }
        }
      }
    }
  set_num_threads(1);
  kernels::set_gguf_prefetch(-1);
  const int64_t n = 512, k = 2048;  // 1.1 MB of Q8_0
  EXPECT_EQ(kernels::gguf_prefetch_for(kQ8_0, 1, n * k / 32 * 34), -1);  // not yet timed
  std::vector<uint8_t> w = random_blocks(kQ8_0, n * k / 32, rng);
  std::vector<float> x(static_cast<size_t>(k));
  for (auto& v : x) v = normal(rng);
  kernels::MatRef mat{w.data(), DType::kGgml, n, k, kQ8_0};
  std::vector<float> want(static_cast<size_t>(n)), y(want.size());
  kernels::matmul(Isa::kScalar, x.data(), 1, mat, want.data());
  mat.panels = pack_panels(kQ8_0, w.data(), n, k);
  for (int call = 0; call < 3 * 64; ++call) {
    kernels::matmul(x.data(), 1, mat, y.data());
    ASSERT_EQ(y, want) << "call " << call;
  }
  const int mode = kernels::gguf_prefetch_for(kQ8_0, 1, n * k / 32 * 34);
  EXPECT_TRUE(mode == 0 || mode == 1 || mode == 2) << mode;
  EXPECT_EQ(kernels::gguf_prefetch_for(kQ4_K, 1), -1);  // timed per type
  EXPECT_EQ(kernels::gguf_prefetch_for(kQ8_0, 1), -1);  // larger calls timed apart
  {
    // A matrix that streams much (24.5 MB) ends its trial after 3 calls a mode (64 MiB each).
    kernels::set_gguf_prefetch(-1);
    const int64_t rows = 8192, cols = 2816;
    std::vector<uint8_t> big = random_blocks(kQ8_0, rows * cols / 32, rng);
    kernels::MatRef head{big.data(), DType::kGgml, rows, cols, kQ8_0};
    head.panels = pack_panels(kQ8_0, big.data(), rows, cols);
    std::vector<float> xb(static_cast<size_t>(cols), 0.5f), yb(static_cast<size_t>(rows));
    for (int call = 0; call < 8; ++call) kernels::matmul(xb.data(), 1, head, yb.data());
    EXPECT_EQ(kernels::gguf_prefetch_for(kQ8_0, 1), -1);  // the third mode has had 2 calls
    kernels::matmul(xb.data(), 1, head, yb.data());
    EXPECT_NE(kernels::gguf_prefetch_for(kQ8_0, 1), -1);
  }
  kernels::set_gguf_prefetch(-1);
  set_num_threads(0);
}

// Activation blocks with ties of the largest magnitude of both signs, values half way
// between two quants (rounded half to even) and all-zero blocks: every ISA path quantizes
// them as the scalar one does.
TEST(GgmlQuants, ActivationEdgeCasesEqualOnEveryPath) {
  std::mt19937 rng(5);
  const int64_t k = 512, rows = 5, m = 6;
  std::vector<float> x(static_cast<size_t>(m * k), 0.0f);
  for (int64_t i = 0; i < m - 1; ++i) {
    for (int64_t j = 0; j < k; ++j) x[i * k + j] = static_cast<float>(static_cast<int>(rng() % 255) - 127) * 0.5f;
    // Ties of the largest |x| (others are at most 63.5), of both signs in one 256-block.
    x[i * k + 3 + i] = (i % 2 == 0 ? -1.0f : 1.0f) * 127.0f;
    x[i * k + 40 + i] = (i % 2 == 0 ? 1.0f : -1.0f) * 127.0f;
  }
  // Row m - 1 stays zero.
  for (uint32_t type : {kQ8_0, kQ4_1, kQ4_K, kQ6_K}) {
    const std::vector<uint8_t> w = random_blocks(type, rows * k / block_size(type), rng);
    std::vector<float> first;
    for (Isa isa : test::available_isas()) {
      std::vector<float> y(static_cast<size_t>(m * rows));
      matmul_rows(isa, type, w.data(), k, x.data(), m, 0, rows, y.data(), rows);
      if (first.empty())
        first = y;
      else
        EXPECT_EQ(y, first) << "type " << type << ": " << isa_name(isa) << " differs from the scalar path";
    }
  }
}

TEST(GgmlQuants, SizesAndErrors) {
  EXPECT_EQ(row_bytes(kQ4_K, 512), 288);
  EXPECT_EQ(row_bytes(kQ8_0, 64), 68);
  EXPECT_EQ(row_bytes(kIQ4_XS, 256), 136);
  EXPECT_FALSE(can_dequantize(16));  // IQ2_XXS: no reference here
  std::vector<float> out(256);
  std::vector<uint8_t> in(256);
  EXPECT_NE(test::error_of([&] { dequantize_row(kQ4_K, in.data(), out.data(), 100); }).find("blocks"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { dequantize_row(16, in.data(), out.data(), 256); }).find("16"), std::string::npos);
}

}  // namespace
}  // namespace infera::kernels::ggml
