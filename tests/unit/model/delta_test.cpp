// Gated DeltaNet kernels: the chunked (WY/UT) delta rule equals the token-by-token
// recurrence, outputs and final state, across chunk sizes and a carried-in state; the
// causal conv with state equals one pass over the concatenated input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../test_support.h"
#include "infera/kernels/delta.h"

namespace infera {
namespace {

using test::random_vec;

using test::DeltaInputs;

// Inputs shaped like a real layer's: L2-normed q (scaled) and k, log decays in (-3, 0),
// beta in (0, 1).
DeltaInputs make_inputs(int64_t T, const kernels::DeltaShape& s, uint32_t seed) {
  return test::delta_rule_inputs(T, s, seed, [](int64_t h) { return -std::exp(0.2f * float(h)); });
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(GatedDeltaRule, ChunkedEqualsRecurrence) {
  const kernels::DeltaShape s{2, 4, 16, 24};
  for (int64_t T : {1, 5, 64, 100, 150}) {
    for (int64_t chunk : {64, 16, 7}) {
      const DeltaInputs in = make_inputs(T, s, 11 + T);
      // Start from a non-zero state, as a later prefill chunk of a sequence does.
      const auto s0 = random_vec(s.n_v_heads * s.dk * s.dv, 99, 0.3f);
      std::vector<float> st_rec = s0, st_ch = s0;
      std::vector<float> o_rec(T * s.n_v_heads * s.dv), o_ch(o_rec.size(), -1.0f);
      kernels::gated_delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                          st_rec.data(), o_rec.data());
      kernels::gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                        st_ch.data(), o_ch.data(), chunk);
      EXPECT_LT(max_abs_diff(o_rec, o_ch), 2e-5f) << "T=" << T << " chunk=" << chunk;
      EXPECT_LT(max_abs_diff(st_rec, st_ch), 2e-5f) << "T=" << T << " chunk=" << chunk;
    }
  }
}

TEST(GatedDeltaRule, SplitPrefillCarriesState) {
  const kernels::DeltaShape s{1, 2, 8, 8};
  const int64_t T = 40;
  const DeltaInputs in = make_inputs(T, s, 3);
  std::vector<float> st_a(s.n_v_heads * s.dk * s.dv, 0.0f), st_b = st_a;
  std::vector<float> o_a(T * s.n_v_heads * s.dv), o_b(o_a.size());
  kernels::gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                    st_a.data(), o_a.data());
  const int64_t t1 = 13;
  const int64_t qk = s.n_k_heads * s.dk, vv = s.n_v_heads * s.dv, hv = s.n_v_heads;
  kernels::gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), t1, s,
                                    st_b.data(), o_b.data());
  kernels::gated_delta_rule_chunked(in.q.data() + t1 * qk, in.k.data() + t1 * qk, in.v.data() + t1 * vv,
                                    in.g.data() + t1 * hv, in.beta.data() + t1 * hv, T - t1, s, st_b.data(),
                                    o_b.data() + t1 * vv);
  EXPECT_LT(max_abs_diff(o_a, o_b), 1e-5f);
  EXPECT_LT(max_abs_diff(st_a, st_b), 1e-5f);
}

TEST(GatedDeltaRule, RecurrenceMatchesHandComputedStep) {
  // One head, dk = dv = 2, zero state: S = k (beta v)^T, o = S^T q.
  const kernels::DeltaShape s{1, 1, 2, 2};
  const std::vector<float> q = {1, 0}, k = {0.6f, 0.8f}, v = {2, -1}, g = {-0.5f}, beta = {0.5f};
  std::vector<float> st(4, 0.0f), o(2);
  kernels::gated_delta_rule_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), 1, s, st.data(), o.data());
  EXPECT_NEAR(st[0], 0.6f * 1.0f, 1e-6f);
  EXPECT_NEAR(st[1], 0.6f * -0.5f, 1e-6f);
  EXPECT_NEAR(o[0], 0.6f, 1e-6f);
  EXPECT_NEAR(o[1], -0.3f, 1e-6f);
}

TEST(CausalConv, StateContinuationEqualsOnePass) {
  const int64_t C = 6, K = 4, T = 9;
  const auto x = random_vec(T * C, 1);
  const auto w = random_vec(C * K, 2);
  std::vector<float> one = x, state1((K - 1) * C, 0.0f);
  kernels::causal_conv1d_silu(one.data(), T, C, w.data(), K, state1.data());
  // Direct: zero history.
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += double(w[c * K + j]) * x[src * C + c];
      }
      const double y = acc / (1 + std::exp(-acc));
      EXPECT_NEAR(one[t * C + c], y, 1e-5) << t << "," << c;
    }
  }
  // Split 2 + 1 + 6 tokens with the carried state.
  std::vector<float> split = x, state2((K - 1) * C, 0.0f);
  int64_t t0 = 0;
  for (int64_t n : {2, 1, 6}) {
    kernels::causal_conv1d_silu(split.data() + t0 * C, n, C, w.data(), K, state2.data());
    t0 += n;
  }
  for (int64_t i = 0; i < T * C; ++i) EXPECT_NEAR(split[i], one[i], 1e-6f);
  EXPECT_EQ(state1, state2);
}

}  // namespace
}  // namespace infera
