// The optimized Gated DeltaNet kernels (scalar / AVX2 / AVX-512 paths of cpu/delta_impl.h)
// against the scalar references (kernels::ref): the recurrence, the chunked delta rule,
// the causal conv + SiLU and the gated RMSNorm, over shapes with vector tails (dk, dv not
// multiples of 16 or 8), several heads per key head, chunk tails and a carried-in state.
//
// Tolerance: |got - want| <= 2e-5 + 1e-5 |want|. The paths reorder sums (FMA, vector
// partial sums, the decay applied before or after Sᵀk) and the vector SiLU uses a ~2 ulp
// exp; with L2-normed q/k and O(1) values the observed gaps are ~1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/kernels/delta.h"

namespace infera {
namespace {

using test::random_vec;

std::vector<Isa> isas() { return test::available_isas(); }

// Largest violation of the tolerance (<= 0: within it), and where.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = -1, gap = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float d = std::fabs(got[i] - want[i]);
    const float excess = d - (2e-5f + 1e-5f * std::fabs(want[i]));
    if (!(excess <= worst) || std::isnan(d)) {
      worst = std::isnan(d) ? 1e30f : excess;
      gap = d;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0f) << what << ": |diff| " << gap << " at " << at << " (got " << got[at] << ", want " << want[at]
                         << ")";
}

using Inputs = test::DeltaInputs;

Inputs make_inputs(int64_t T, const kernels::DeltaShape& s, uint32_t seed, float decay_scale = 1.0f) {
  return test::delta_rule_inputs(T, s, seed, [&](int64_t h) { return -decay_scale * std::exp(0.3f * float(h % 5)); });
}

const std::vector<kernels::DeltaShape> kShapes = {
    {2, 4, 16, 24},  // r = 2, dv with an AVX-512 tail
    {2, 4, 48, 48},  // the built-in model's GDN
    {1, 3, 5, 7},  // odd dims: every loop's tail, dk not a multiple of the row tile
    {1, 2, 128, 128},  // Qwen3.5 / Qwen3-Next head dims
    {2, 2, 32, 72},  // several column blocks, last one partial
};

TEST(DeltaKernels, RecurrenceMatchesReference) {
  for (const auto& s : kShapes) {
    for (int64_t T : {1, 3, 17}) {
      const Inputs in = make_inputs(T, s, 7 + static_cast<uint32_t>(T + s.dk));
      std::vector<float> st_ref = in.state, o_ref(T * s.n_v_heads * s.dv);
      kernels::ref::gated_delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                               st_ref.data(), o_ref.data());
      for (Isa isa : isas()) {
        std::vector<float> st = in.state, o(o_ref.size(), -7.0f);
        kernels::gated_delta_rule_recurrent(isa, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T,
                                            s, st.data(), o.data());
        const std::string what = std::string(isa_name(isa)) + " dk=" + std::to_string(s.dk) +
                                 " dv=" + std::to_string(s.dv) + " T=" + std::to_string(T);
        expect_close(o, o_ref, what + " out");
        expect_close(st, st_ref, what + " state");
      }
    }
  }
}

TEST(DeltaKernels, ChunkedMatchesReferenceAndRecurrence) {
  for (const auto& s : kShapes) {
    for (int64_t T : {2, 5, 64, 70}) {
      for (int64_t chunk : {64, 16}) {
        const Inputs in = make_inputs(T, s, 21 + static_cast<uint32_t>(T * 3 + s.dv));
        std::vector<float> st_ref = in.state, o_ref(T * s.n_v_heads * s.dv);
        kernels::ref::gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                               st_ref.data(), o_ref.data(), chunk);
        std::vector<float> st_rec = in.state, o_rec(o_ref.size());
        kernels::ref::gated_delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T,
                                                 s, st_rec.data(), o_rec.data());
        for (Isa isa : isas()) {
          std::vector<float> st = in.state, o(o_ref.size(), -7.0f);
          kernels::gated_delta_rule_chunked(isa, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T,
                                            s, st.data(), o.data(), chunk);
          const std::string what = std::string(isa_name(isa)) + " dk=" + std::to_string(s.dk) +
                                   " dv=" + std::to_string(s.dv) + " T=" + std::to_string(T) +
                                   " chunk=" + std::to_string(chunk);
          expect_close(o, o_ref, what + " out vs chunked ref");
          expect_close(st, st_ref, what + " state vs chunked ref");
          expect_close(o, o_rec, what + " out vs recurrence");
          expect_close(st, st_rec, what + " state vs recurrence");
        }
      }
    }
  }
}

// Decays of e^-20 and more per token: exp(gc_i - gc_j) underflows inside a chunk and the
// state decays towards zero (the optimized paths flush denormals to zero; results agree).
TEST(DeltaKernels, StrongDecayMatchesReference) {
  const kernels::DeltaShape s{2, 4, 32, 48};
  const int64_t T = 70;
  const Inputs in = make_inputs(T, s, 99, 30.0f);
  std::vector<float> st_ref = in.state, o_ref(T * s.n_v_heads * s.dv);
  kernels::ref::gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                         st_ref.data(), o_ref.data());
  std::vector<float> st_rec = in.state, o_rec(o_ref.size());
  kernels::ref::gated_delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                           st_rec.data(), o_rec.data());
  for (Isa isa : isas()) {
    std::vector<float> st = in.state, o(o_ref.size());
    kernels::gated_delta_rule_chunked(isa, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                      st.data(), o.data());
    expect_close(o, o_ref, std::string(isa_name(isa)) + " strong decay chunked out");
    expect_close(st, st_ref, std::string(isa_name(isa)) + " strong decay chunked state");
    std::vector<float> st2 = in.state, o2(o_ref.size());
    kernels::gated_delta_rule_recurrent(isa, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, s,
                                        st2.data(), o2.data());
    expect_close(o2, o_rec, std::string(isa_name(isa)) + " strong decay recurrent out");
    expect_close(st2, st_rec, std::string(isa_name(isa)) + " strong decay recurrent state");
  }
}

TEST(DeltaKernels, ConvAndGatedNormMatchReference) {
  for (int64_t C : {7, 64, 101}) {
    for (int64_t T : {1, 4, 13}) {
      const int64_t K = 4;
      const auto x = random_vec(T * C, 3 + static_cast<uint32_t>(C + T), 2.0f);
      const auto w = random_vec(C * K, 4 + static_cast<uint32_t>(C));
      const auto state0 = random_vec((K - 1) * C, 5 + static_cast<uint32_t>(C));
      std::vector<float> y_ref = x, st_ref = state0;
      kernels::ref::causal_conv1d_silu(y_ref.data(), T, C, w.data(), K, st_ref.data());
      for (Isa isa : isas()) {
        std::vector<float> y = x, st = state0;
        kernels::causal_conv1d_silu(isa, y.data(), T, C, w.data(), K, st.data());
        const std::string what = std::string(isa_name(isa)) + " C=" + std::to_string(C) + " T=" + std::to_string(T);
        expect_close(y, y_ref, what + " conv out");
        EXPECT_EQ(st, st_ref) << what << " conv state (a copy of the last inputs)";
      }
    }
  }
  for (int64_t n : {7, 48, 128}) {
    const int64_t rows = 70;
    const auto x = random_vec(rows * n, 8 + static_cast<uint32_t>(n), 3.0f);
    const auto z = random_vec(rows * n, 9 + static_cast<uint32_t>(n), 4.0f);
    const auto w = random_vec(n, 10 + static_cast<uint32_t>(n));
    std::vector<float> y_ref = x;
    kernels::ref::rmsnorm_gated(y_ref.data(), z.data(), w.data(), rows, n, 1e-6f);
    for (Isa isa : isas()) {
      std::vector<float> y = x;
      kernels::rmsnorm_gated(isa, y.data(), z.data(), w.data(), rows, n, 1e-6f);
      expect_close(y, y_ref, std::string(isa_name(isa)) + " gated norm n=" + std::to_string(n));
    }
  }
}

}  // namespace
}  // namespace infera
