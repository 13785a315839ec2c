// Micro-benchmarks of the Gated DeltaNet kernels at Qwen3-Next / Qwen3.5 head geometry
// (16 key heads, 32 value heads, dk = dv = 128; conv over 2*16*128 + 32*128 = 8192
// channels), one layer, one sequence. Build with -DINFERA_BUILD_BENCH=ON; run
//   build/delta_bench --benchmark_counters_tabular=true
// Arguments: path (0 = kernels::ref, the scalar reference loops; 1 scalar, 2 AVX2,
// 3 AVX-512 optimized paths; paths this CPU lacks are skipped), then threads.
// Counter tok/s = tokens of the call per second. Each benchmark runs 3 times and reports
// the min time / max rate (the runs least disturbed on a shared machine).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "infera/base/threads.h"
#include "infera/kernels/delta.h"

namespace {

using namespace infera;
using namespace infera::kernels;

const DeltaShape kShape{16, 32, 128, 128};
constexpr int64_t kConvChannels = 2 * 16 * 128 + 32 * 128, kKernel = 4;

void least_disturbed(benchmark::internal::Benchmark* b) {
  b->UseRealTime()
      ->Repetitions(3)
      ->ComputeStatistics("min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); })
      ->ComputeStatistics("max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); })
      ->ReportAggregatesOnly(true);
  for (int path : {0, 1, 2, 3})
    for (int threads : {1, 2}) b->Args({path, threads});
}

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// false (and the benchmark skipped) when the path is not available here.
bool pick(benchmark::State& state, Isa& isa) {
  const int path = static_cast<int>(state.range(0));
  isa = path == 3 ? Isa::kAvx512 : path == 2 ? Isa::kAvx2 : Isa::kScalar;
  if ((path == 3 && !cpu_features().has_avx512_path()) || (path == 2 && !cpu_features().has_avx2_path())) {
    state.SkipWithError("path not available on this CPU");
    return false;
  }
  set_num_threads(static_cast<int>(state.range(1)));
  state.SetLabel(path == 0 ? "ref" : isa_name(isa));
  return true;
}

struct Inputs {
  std::vector<float> q, k, v, g, beta, state, out;
  explicit Inputs(int64_t T) {
    q = random_vec(T * kShape.n_k_heads * kShape.dk, 1);
    k = random_vec(T * kShape.n_k_heads * kShape.dk, 2);
    v = random_vec(T * kShape.n_v_heads * kShape.dv, 3);
    l2norm_rows(q.data(), T * kShape.n_k_heads, kShape.dk, 1e-6f, 1.0f / std::sqrt(float(kShape.dk)));
    l2norm_rows(k.data(), T * kShape.n_k_heads, kShape.dk, 1e-6f);
    g.assign(T * kShape.n_v_heads, -0.05f);
    beta.assign(T * kShape.n_v_heads, 0.5f);
    state = random_vec(kShape.n_v_heads * kShape.dk * kShape.dv, 4, 0.1f);
    out.resize(T * kShape.n_v_heads * kShape.dv);
  }
};

void BM_DecodeRecurrence(benchmark::State& state) {
  Isa isa;
  if (!pick(state, isa)) return;
  Inputs in(1);
  for (auto _ : state) {
    if (state.range(0) == 0) {
      ref::gated_delta_rule_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), 1, kShape,
                                      in.state.data(), in.out.data());
    } else {
      gated_delta_rule_recurrent(isa, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), 1, kShape,
                                 in.state.data(), in.out.data());
    }
    benchmark::DoNotOptimize(in.out.data());
  }
  state.counters["tok/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeRecurrence)->Apply(least_disturbed);

void BM_PrefillChunked(benchmark::State& state) {
  Isa isa;
  if (!pick(state, isa)) return;
  const int64_t T = 512;
  Inputs in(T);
  for (auto _ : state) {
    if (state.range(0) == 0) {
      ref::gated_delta_rule_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, kShape,
                                    in.state.data(), in.out.data());
    } else {
      gated_delta_rule_chunked(isa, in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, kShape,
                               in.state.data(), in.out.data());
    }
    benchmark::DoNotOptimize(in.out.data());
  }
  state.counters["tok/s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PrefillChunked)->Apply(least_disturbed);

// Causal conv + SiLU and the gated norm of one prefill chunk of 512 tokens.
void BM_ConvAndGatedNorm(benchmark::State& state) {
  Isa isa;
  if (!pick(state, isa)) return;
  const int64_t T = 512;
  const auto x0 = random_vec(T * kConvChannels, 5);
  const auto w = random_vec(kConvChannels * kKernel, 6);
  const auto z = random_vec(T * kShape.n_v_heads * kShape.dv, 7);
  const auto nw = random_vec(kShape.dv, 8);
  std::vector<float> x = x0, conv_state((kKernel - 1) * kConvChannels, 0.0f);
  const std::vector<float> o0 = random_vec(T * kShape.n_v_heads * kShape.dv, 9);
  std::vector<float> o = o0;
  for (auto _ : state) {
    // Fresh inputs each time (both kernels work in place; norming the same rows again and
    // again drives some values into denormals) and the copies are not timed.
    state.PauseTiming();
    std::copy(x0.begin(), x0.end(), x.begin());
    std::copy(o0.begin(), o0.end(), o.begin());
    state.ResumeTiming();
    if (state.range(0) == 0) {
      ref::causal_conv1d_silu(x.data(), T, kConvChannels, w.data(), kKernel, conv_state.data());
      ref::rmsnorm_gated(o.data(), z.data(), nw.data(), T * kShape.n_v_heads, kShape.dv, 1e-6f);
    } else {
      causal_conv1d_silu(isa, x.data(), T, kConvChannels, w.data(), kKernel, conv_state.data());
      rmsnorm_gated(isa, o.data(), z.data(), nw.data(), T * kShape.n_v_heads, kShape.dv, 1e-6f);
    }
    benchmark::DoNotOptimize(x.data());
  }
  state.counters["tok/s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ConvAndGatedNorm)->Apply(least_disturbed);

}  // namespace

BENCHMARK_MAIN();
