// GPTQ and AWQ int4 layers (model/prequant_gptq.h): the unpackers against a packer written
// here from the published layouts, the mapping onto Infera's int4 kernels (group sizes,
// act-order permutation, zero points) dequantizing to the same weights, and qmatmul on
// every path within a stated bound of the f32 product.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/model/prequant_gptq.h"

namespace infera::prequant {
namespace {

struct Source {  // what a GPTQ/AWQ writer starts from: integers, scales, zeros, groups
  int64_t O = 0, I = 0, G = 0, ng = 0;
  std::vector<uint8_t> q;  // [O, I]
  std::vector<uint16_t> s;  // f16 [ng, O]
  std::vector<int32_t> z;  // [ng, O]
  std::vector<int32_t> g_idx;  // [I]
};

// v1 (zero − 1 stored in 4 bits) cannot hold a zero point of 0: its writers never produce one.
Source make_source(int64_t O, int64_t I, int64_t G, bool sym, bool act_order, std::mt19937& rng, bool v1 = true) {
  Source s;
  s.O = O;
  s.I = I;
  s.G = G == -1 ? I : G;
  s.ng = I / s.G;
  std::uniform_int_distribution<int> nib(0, 15), zd(v1 ? 1 : 0, 15);
  std::uniform_real_distribution<float> sc(0.002f, 0.05f);
  s.q.resize(static_cast<size_t>(O * I));
  for (auto& v : s.q) v = static_cast<uint8_t>(nib(rng));
  s.s.resize(static_cast<size_t>(s.ng * O));
  for (auto& v : s.s) v = f32_to_f16(sc(rng));
  s.z.resize(static_cast<size_t>(s.ng * O));
  for (auto& v : s.z) v = sym ? 8 : zd(rng);
  s.g_idx.resize(static_cast<size_t>(I));
  for (int64_t k = 0; k < I; ++k) s.g_idx[k] = static_cast<int32_t>(k / s.G);
  if (act_order) std::shuffle(s.g_idx.begin(), s.g_idx.end(), rng);  // every group keeps G members
  return s;
}

std::vector<float> reference(const Source& s) {  // W[n, k] = s · (q − z)
  std::vector<float> w(static_cast<size_t>(s.O * s.I));
  for (int64_t n = 0; n < s.O; ++n)
    for (int64_t k = 0; k < s.I; ++k) {
      const int64_t g = s.g_idx[k];
      w[n * s.I + k] = f16_to_f32(s.s[g * s.O + n]) * static_cast<float>(s.q[n * s.I + k] - s.z[g * s.O + n]);
    }
  return w;
}

struct Packed {
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<uint16_t> scales;
  RawTensor tq, tz, ts, tg;
};

// GPTQ: qweight [I/8, O] packed along I, qzeros [ng, O/8] along O, LSB first; v1 stores z − 1.
Packed pack_gptq(const Source& s, bool v2) {
  Packed p;
  p.qweight.assign(static_cast<size_t>(s.I / 8 * s.O), 0);
  for (int64_t k = 0; k < s.I; ++k)
    for (int64_t n = 0; n < s.O; ++n)
      p.qweight[k / 8 * s.O + n] |= static_cast<int32_t>(uint32_t{s.q[n * s.I + k]} << (4 * (k % 8)));
  p.qzeros.assign(static_cast<size_t>(s.ng * s.O / 8), 0);
  for (int64_t g = 0; g < s.ng; ++g)
    for (int64_t n = 0; n < s.O; ++n) {
      const uint32_t stored = static_cast<uint32_t>(v2 ? s.z[g * s.O + n] : s.z[g * s.O + n] - 1);
      p.qzeros[g * (s.O / 8) + n / 8] |= static_cast<int32_t>((stored & 0xf) << (4 * (n % 8)));
    }
  p.scales = s.s;
  p.g_idx = s.g_idx;
  p.tq = {p.qweight.data(), DType::kI32, {s.I / 8, s.O}};
  p.tz = {p.qzeros.data(), DType::kI32, {s.ng, s.O / 8}};
  p.ts = {p.scales.data(), DType::kF16, {s.ng, s.O}};
  p.tg = {p.g_idx.data(), DType::kI32, {s.I}};
  return p;
}

// AWQ GEMM: qweight [I, O/8], qzeros [ng, O/8], slot i of a word holds column 8c + ORDER[i].
Packed pack_awq(const Source& s) {
  static constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  Packed p;
  p.qweight.assign(static_cast<size_t>(s.I * s.O / 8), 0);
  p.qzeros.assign(static_cast<size_t>(s.ng * s.O / 8), 0);
  for (int64_t c = 0; c < s.O / 8; ++c)
    for (int i = 0; i < 8; ++i) {
      const int64_t n = 8 * c + kOrder[i];
      for (int64_t k = 0; k < s.I; ++k)
        p.qweight[k * (s.O / 8) + c] |= static_cast<int32_t>(uint32_t{s.q[n * s.I + k]} << (4 * i));
      for (int64_t g = 0; g < s.ng; ++g)
        p.qzeros[g * (s.O / 8) + c] |= static_cast<int32_t>(static_cast<uint32_t>(s.z[g * s.O + n]) << (4 * i));
    }
  p.scales = s.s;
  p.tq = {p.qweight.data(), DType::kI32, {s.I, s.O / 8}};
  p.tz = {p.qzeros.data(), DType::kI32, {s.ng, s.O / 8}};
  p.ts = {p.scales.data(), DType::kF16, {s.ng, s.O}};
  return p;
}

void expect_equal(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

TEST(PrequantGptq, AwqWordOrder) {
  // Columns 0..7 holding the values 0..7 pack to nibbles [0, 2, 4, 6, 1, 3, 5, 7].
  Source s;
  s.O = 8;
  s.I = 32;
  s.G = 32;
  s.ng = 1;
  s.q.resize(8 * 32);
  for (int64_t n = 0; n < 8; ++n)
    for (int64_t k = 0; k < 32; ++k) s.q[n * 32 + k] = static_cast<uint8_t>(n);
  s.s.assign(8, f32_to_f16(1.0f));
  s.z.assign(8, 0);
  s.g_idx.assign(32, 0);
  const Packed p = pack_awq(s);
  EXPECT_EQ(static_cast<uint32_t>(p.qweight[0]), 0x75316420u);
  const IntGroupMatrix m = unpack_awq(p.tq, p.tz, p.ts, 8, 32, 32, "test");
  for (int64_t n = 0; n < 8; ++n) EXPECT_EQ(m.q[n * 32 + 5], n);
}

TEST(PrequantGptq, V1StoresZeroMinusOne) {
  std::mt19937 rng(1);
  const Source s = make_source(16, 64, 32, /*sym=*/true, false, rng);
  const Packed p = pack_gptq(s, /*v2=*/false);
  for (int32_t w : p.qzeros) EXPECT_EQ(static_cast<uint32_t>(w), 0x77777777u);  // zero 8 stored as 7
  const IntGroupMatrix m = unpack_gptq(p.tq, p.tz, p.ts, &p.tg, 16, 64, 4, 32, false, "test");
  for (int32_t z : m.zeros) EXPECT_EQ(z, 8);
  // The same words read as v2 give zero 7: a different matrix.
  const IntGroupMatrix m2 = unpack_gptq(p.tq, p.tz, p.ts, &p.tg, 16, 64, 4, 32, true, "test");
  for (int32_t z : m2.zeros) EXPECT_EQ(z, 7);
}

struct Case {
  bool awq;
  int64_t O, I, G;
  bool sym, act_order, v2;
  int64_t expect_gs;  // the kernels' group size
};

class PrequantGptqCases : public ::testing::TestWithParam<Case> {};

TEST_P(PrequantGptqCases, UnpackMapAndMultiply) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.O * 7 + c.I + c.G + c.sym * 3 + c.act_order * 5));
  const Source s = make_source(c.O, c.I, c.G, c.sym, c.act_order, rng, !c.awq && !c.v2);
  const Packed p = c.awq ? pack_awq(s) : pack_gptq(s, c.v2);
  const IntGroupMatrix m = c.awq ? unpack_awq(p.tq, p.tz, p.ts, c.O, c.I, c.G, "test")
                                 : unpack_gptq(p.tq, p.tz, p.ts, &p.tg, c.O, c.I, 4, c.G, c.v2, "test");
  const std::vector<float> ref = reference(s);
  expect_equal(m.dequantize(), ref);
  std::string why;
  const std::optional<Int4Layout> l = to_infera_int4(m, &why);
  ASSERT_TRUE(l.has_value()) << why;
  EXPECT_EQ(l->group_size, c.expect_gs);
  EXPECT_EQ(l->extras != nullptr && !l->extras->in_perm.empty(), c.act_order);
  EXPECT_EQ(l->extras != nullptr && l->extras->corr_group > 0, !c.sym);
  // What the kernels compute with equals the checkpoint's weights (f16 scales are exact).
  const std::vector<float> deq = dequantize_int4_layout(*l);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(deq[i], ref[i], 1e-6f * (1.0f + std::fabs(ref[i]))) << i;

  // qmatmul (w4a16 and w4a8, every path, with and without a row slice) against x · Wᵀ in f64.
  const int64_t M = 3;
  std::vector<float> x(static_cast<size_t>(M * c.I));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  std::vector<double> want(static_cast<size_t>(M * c.O));
  double norm = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < c.O; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < c.I; ++k) acc += double{x[i * c.I + k]} * ref[n * c.I + k];
      want[i * c.O + n] = acc;
      norm = std::max(norm, std::fabs(acc));
    }
  for (kernels::QuantScheme scheme : {kernels::QuantScheme::kW4A16, kernels::QuantScheme::kW4A8}) {
    kernels::QuantMatRef w(scheme, c.O, c.I, l->group_size, l->qweight.data(), l->scales.data());
    w.extras = l->extras;
    // w4a16: f32 rounding only; w4a8: int8 activations (relative error ~1/127 of the row's max).
    const double tol = scheme == kernels::QuantScheme::kW4A16 ? 1e-4 * norm : 0.03 * norm;
    for (Isa isa : test::available_isas()) {
      for (bool packed : {false, true}) {
        kernels::QuantMatRef wp = w;
        if (packed) wp.packed = kernels::pack_quant_matrix_always(w);
        std::vector<float> y(static_cast<size_t>(M * c.O));
        kernels::qmatmul(isa, x.data(), M, wp, y.data());
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], want[i], tol) << kernels::scheme_name(scheme) << " " << isa_name(isa) << " " << i;
        // Rows [16, O) as their own matrix read their own rows of the extras.
        const kernels::QuantMatRef sl = kernels::quant_row_slice(wp, 16, c.O);
        std::vector<float> ys(static_cast<size_t>(M * (c.O - 16)));
        kernels::qmatmul(isa, x.data(), M, sl, ys.data());
        for (int64_t i = 0; i < M; ++i)
          for (int64_t n = 16; n < c.O; ++n) ASSERT_NEAR(ys[i * (c.O - 16) + n - 16], y[i * c.O + n], 1e-5 * norm);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PrequantGptqCases,
    ::testing::Values(Case{false, 32, 256, 128, true, false, false, 128},  // GPTQ sym: Infera's int4 as is
                      Case{false, 48, 256, 128, false, false, false, 128},  // asymmetric: zero correction
                      Case{false, 32, 256, 64, false, true, false, 64},  // act-order: permutation
                      Case{false, 32, 192, 96, true, true, true, 32},  // group 96, v2
                      Case{false, 32, 256, -1, false, false, false, 128},  // per channel
                      Case{false, 32, 512, 256, true, false, false, 128},  // group 256 = 2 x 128
                      Case{true, 32, 256, 128, false, false, false, 128},  // AWQ
                      Case{true, 40, 128, 32, false, false, false, 32}));

TEST(PrequantGptq, OddGroupsAreNotMapped) {
  std::mt19937 rng(3);
  const Source t = make_source(16, 48, 16, true, false, rng);
  const Packed p = pack_gptq(t, false);
  const IntGroupMatrix m = unpack_gptq(p.tq, p.tz, p.ts, &p.tg, 16, 48, 4, 16, false, "test");
  std::string why;
  EXPECT_FALSE(to_infera_int4(m, &why).has_value());
  EXPECT_NE(why.find("16 inputs"), std::string::npos) << why;
}

TEST(PrequantGptq, BadTensorsNameTheProblem) {
  std::mt19937 rng(4);
  const Source s = make_source(16, 64, 32, false, false, rng);
  Packed p = pack_gptq(s, false);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Group size that does not divide the inputs.
  EXPECT_NE(message([&] {
              unpack_gptq(p.tq, p.tz, p.ts, &p.tg, 16, 64, 4, 48, false, "L");
            }).find("group_size 48 does not divide the layer's 64 input features"),
            std::string::npos);
  // Scales of the wrong shape.
  RawTensor bad = p.ts;
  bad.shape = {2, 8};
  EXPECT_NE(message([&] {
              unpack_gptq(p.tq, p.tz, bad, &p.tg, 16, 64, 4, 32, false, "L");
            }).find("tensor 'scales' has shape [2, 8], expected [2, 16]"),
            std::string::npos);
  // A g_idx entry outside the groups.
  p.g_idx[5] = 9;
  EXPECT_NE(message([&] { unpack_gptq(p.tq, p.tz, p.ts, &p.tg, 16, 64, 4, 32, false, "L"); }).find("g_idx[5] = 9"),
            std::string::npos);
}

TEST(PrequantGptq, ConfigRefusesUnsupportedVariantsNamingTheField) {
  auto message = [](const nlohmann::json& j) {
    try {
      parse_gptq_config(j, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  using nlohmann::json;
  EXPECT_NE(message(json{{"quant_method", "gptq"}, {"bits", 3}}).find("quantization_config.bits is 3"),
            std::string::npos);
  EXPECT_NE(message(json{{"quant_method", "gptq"}, {"bits", 4}, {"checkpoint_format", "marlin"}})
                .find("checkpoint_format is 'marlin'"),
            std::string::npos);
  EXPECT_NE(message(json{{"quant_method", "awq"}, {"bits", 4}, {"version", "gemv"}}).find("version is 'gemv'"),
            std::string::npos);
  EXPECT_NE(message(json{{"quant_method", "awq"}, {"bits", 4}, {"zero_point", false}}).find("zero_point is false"),
            std::string::npos);
  EXPECT_NE(message(json{{"quant_method", "gptq"}, {"dynamic", {{"+:.*down_proj", {{"bits", 8}}}}}})
                .find("dynamic['+:.*down_proj']"),
            std::string::npos);
  const GptqConfig c = parse_gptq_config(json{{"quant_method", "gptq"},
                                              {"bits", 4},
                                              {"group_size", 64},
                                              {"desc_act", true},
                                              {"sym", false},
                                              {"checkpoint_format", "gptq_v2"},
                                              {"dynamic", {{"-:.*mlp\\.gate$", json::object()}}}},
                                         "config.json");
  EXPECT_EQ(c.group_size, 64);
  EXPECT_TRUE(c.desc_act);
  EXPECT_TRUE(c.v2);
  EXPECT_TRUE(gptq_skips(c, "model.layers.1.mlp.gate.weight"));
  EXPECT_FALSE(gptq_skips(c, "model.layers.1.mlp.gate_proj.weight"));
  const GptqConfig a = parse_gptq_config(
      json{{"quant_method", "awq"}, {"w_bit", 4}, {"q_group_size", 32}, {"modules_to_not_convert", {"visual"}}},
      "config.json");
  EXPECT_TRUE(a.awq);
  EXPECT_EQ(a.group_size, 32);
  EXPECT_TRUE(gptq_skips(a, "model.visual.blocks.0.attn.qkv.weight"));
}

}  // namespace
}  // namespace infera::prequant
