// Micro-benchmarks of the CPU kernels (best ISA of this machine; INFERA_ISA caps it).
// Build with -DINFERA_BUILD_BENCH=ON; run build/kernels_bench.
//
//   GEMV (decode, m = 1): 2048 x 5632 weights (a 1.5B-class down_proj), bf16 and f32;
//     counter GB/s = weight bytes streamed per second. "hot" reuses one matrix (it stays
//     in the last-level cache when that is large); "cold" cycles through ~600 MB of copies
//     so every call streams from DRAM.
//   GEMV over a model's layers (BM_GemvLayers; dtype 0 bf16 / 1 f16 / 2 f32, m, threads):
//     the seven matrices of a TinyLlama-shaped layer (q, k, v, o: 2048 / 256 rows of 2048;
//     gate, up: 5632 x 2048; down: 2048 x 5632), one iteration = one layer, cycling
//     through 8 layers (705 MB in 16 bits) so the weights stream from DRAM as a decode
//     step's do; counter GB/s = weight bytes per second. Compare by CPU time at one thread.
//   GEMM (prefill, m = 64 / 512): same weights; counter GFLOP/s = 2 m n k per second.
//   Quantized (w8a8 / w4a8 / w4a16, group 32, repacked panels as loaded by a model): same
//     shape, m = 1 (decode GEMV) and 64 (prefill GEMM); counter GOP/s = 2 m n k per second
//     (int8 or f32 operations, whichever the scheme computes in).
//   GGUF block types (every type with a matmul; random blocks), m = 1 to 256, through
//     kernels::matmul on a DType::kGgml matrix as a GGUF model binds it; counter GOP/s =
//     2 m n k per second and GB/s = block bytes streamed per second. The fourth argument
//     picks the shape: 0 the 2048 x 5632 above (down_proj), 1 its transpose 5632 x 2048
//     (gate / up: rows of 2048 weights, as most of a 2048-wide model's matrices have); the
//     fifth asks for AMX prefill, the sixth for the load-time panels; the label names the
//     ISA path, and "amx" / "panels" where that path took them.
//   A MoE decode step's experts (BM_GgmlMoeDecode/type/threads): 8 of 64 Qwen3-30B-A3B-shaped
//     experts per iteration, each one's gate, up and down, packed as a GGUF model packs them;
//     counter GB/s = their block bytes per second.
//   Attention decode: one sequence, ctx 4096, 32 query / 8 kv heads, head_dim 128, f32 KV
//     in 16-slot blocks; counter GB/s = K and V bytes read per second.
// The last argument of every benchmark is the thread count. The machine is shared, so each
// benchmark runs 5 times and reports the "min" (time) and "max" (rate counters) over the
// repetitions: the runs least disturbed by other processes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "infera/base/cpu.h"
#include "infera/base/membw.h"
#include "infera/base/threads.h"
#include "infera/kernels/ggml_quants.h"
#include "infera/kernels/kernels.h"
#include "infera/kernels/quant.h"

namespace {

using infera::DType;
using namespace infera::kernels;

constexpr int64_t kN = 2048, kK = 5632;
constexpr int64_t kColdBytes = int64_t{600} << 20;

void least_disturbed(benchmark::internal::Benchmark* b) {
  b->UseRealTime()
      ->Repetitions(5)
      ->ComputeStatistics("min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); })
      ->ComputeStatistics("max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); })
      ->ReportAggregatesOnly(true);
}

// Deterministic cheap fill (the values only need to be finite and varied).
void fill(std::vector<float>& v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : v) x = dist(rng);
}

// `copies` weight matrices [kN, kK] of one dtype, back to back.
struct WeightSet {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  DType dtype;
  int64_t copies;
  WeightSet(DType dt, int64_t copies_) : dtype(dt), copies(copies_) {
    const int64_t count = copies * kN * kK;
    uint32_t s = 12345;
    auto next = [&s] {  // xorshift: fast enough for hundreds of MB
      s ^= s << 13;
      s ^= s >> 17;
      s ^= s << 5;
      return (static_cast<float>(s & 0xffff) - 32768.0f) / 32768.0f;
    };
    if (dt == DType::kF32) {
      f32.resize(count);
      for (auto& x : f32) x = next();
    } else {
      half.resize(count);
      for (auto& h : half) h = dt == DType::kF16 ? infera::f32_to_f16(next()) : infera::f32_to_bf16(next());
    }
  }
  MatRef matrix(int64_t i) const {
    const int64_t off = (i % copies) * kN * kK;
    const void* p =
        dtype == DType::kF32 ? static_cast<const void*>(f32.data() + off) : static_cast<const void*>(half.data() + off);
    return MatRef{p, dtype, kN, kK};
  }
  int64_t matrix_bytes() const { return kN * kK * static_cast<int64_t>(infera::dtype_size(dtype)); }
};

void run_gemv(benchmark::State& state, DType dtype, bool cold) {
  infera::set_num_threads(static_cast<int>(state.range(0)));
  const int64_t bytes = kN * kK * static_cast<int64_t>(infera::dtype_size(dtype));
  const WeightSet w(dtype, cold ? std::max<int64_t>(2, kColdBytes / bytes) : 1);
  std::vector<float> x(kK), y(kN);
  fill(x, 1);
  int64_t i = 0;
  for (auto _ : state) {
    matmul(x.data(), 1, w.matrix(i++), y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemvBf16Hot(benchmark::State& s) { run_gemv(s, DType::kBF16, false); }
void BM_GemvBf16Cold(benchmark::State& s) { run_gemv(s, DType::kBF16, true); }
void BM_GemvF32Hot(benchmark::State& s) { run_gemv(s, DType::kF32, false); }
void BM_GemvF32Cold(benchmark::State& s) { run_gemv(s, DType::kF32, true); }
BENCHMARK(BM_GemvBf16Hot)->Arg(1)->Arg(2)->Apply(least_disturbed);
BENCHMARK(BM_GemvBf16Cold)->Arg(1)->Arg(2)->Apply(least_disturbed);
BENCHMARK(BM_GemvF32Hot)->Arg(1)->Arg(2)->Apply(least_disturbed);
BENCHMARK(BM_GemvF32Cold)->Arg(1)->Arg(2)->Apply(least_disturbed);

void BM_GemvLayers(benchmark::State& state) {
  const DType dtype = state.range(0) == 0 ? DType::kBF16 : state.range(0) == 1 ? DType::kF16 : DType::kF32;
  const int64_t m = state.range(1);
  infera::set_num_threads(static_cast<int>(state.range(2)));
  constexpr int64_t kLayers = 8, kH = 2048, kKv = 256, kF = 5632;
  const int64_t shapes[7][2] = {{kH, kH}, {kKv, kH}, {kKv, kH}, {kH, kH}, {kF, kH}, {kF, kH}, {kH, kF}};
  const int64_t esize = static_cast<int64_t>(infera::dtype_size(dtype));
  int64_t layer_elems = 0;
  for (const auto& sh : shapes) layer_elems += sh[0] * sh[1];
  // One allocation, filled with finite values of every dtype (f32 reads the bytes as floats).
  std::vector<uint16_t> storage(static_cast<size_t>(kLayers * layer_elems * esize / 2));
  uint32_t seed = 99;
  for (size_t i = 0; i < storage.size(); ++i) {
    seed ^= seed << 13;
    seed ^= seed >> 17;
    seed ^= seed << 5;
    const float v = (static_cast<float>(seed & 0xffff) - 32768.0f) / 32768.0f;
    storage[i] = dtype == DType::kF16 ? infera::f32_to_f16(v) : infera::f32_to_bf16(v);
  }
  std::vector<float> x(m * kF), y(m * kF);
  fill(x, 9);
  int64_t layer = 0;
  for (auto _ : state) {
    const auto* base = reinterpret_cast<const uint8_t*>(storage.data()) + (layer++ % kLayers) * layer_elems * esize;
    for (const auto& sh : shapes) {
      matmul(x.data(), m, MatRef{base, dtype, sh[0], sh[1]}, y.data());
      base += sh[0] * sh[1] * esize;
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(dtype == DType::kBF16 ? "bf16" : dtype == DType::kF16 ? "f16" : "f32");
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(layer_elems * esize) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GemvLayers)
    ->ArgsProduct({{0, 1}, {1}, {1, 2}})
    ->Args({0, 2, 1})
    ->Args({0, 4, 1})
    ->Args({2, 1, 1})
    ->Apply(least_disturbed);

void run_gemm(benchmark::State& state, DType dtype) {
  const int64_t m = state.range(0);
  infera::set_num_threads(static_cast<int>(state.range(1)));
  const WeightSet w(dtype, 1);
  std::vector<float> x(m * kK), y(m * kN);
  fill(x, 2);
  for (auto _ : state) {
    matmul(x.data(), m, w.matrix(0), y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * kN * kK * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemmBf16(benchmark::State& s) { run_gemm(s, DType::kBF16); }
void BM_GemmF32(benchmark::State& s) { run_gemm(s, DType::kF32); }
BENCHMARK(BM_GemmBf16)->Args({64, 2})->Args({512, 1})->Args({512, 2})->Apply(least_disturbed);
BENCHMARK(BM_GemmF32)->Args({512, 2})->Apply(least_disturbed);

// Arguments: scheme (0 w8a8, 1 w4a8, 2 w4a16), m, threads.
void BM_QuantMatmul(benchmark::State& state) {
  const auto scheme = static_cast<QuantScheme>(state.range(0));
  const int64_t m = state.range(1);
  infera::set_num_threads(static_cast<int>(state.range(2)));
  const bool int4 = scheme_is_int4(scheme);
  const int64_t gs = int4 ? 32 : kK;
  std::vector<uint8_t> q(static_cast<size_t>(int4 ? kN * kK / 2 : kN * kK));
  std::mt19937 rng(7);
  for (auto& b : q) b = static_cast<uint8_t>(int4 ? rng() & 0xff : (rng() % 255) - 127 + 256);
  std::vector<uint16_t> scales16(static_cast<size_t>(kN * (kK / gs)), infera::f32_to_f16(0.01f));
  std::vector<float> scales32(static_cast<size_t>(kN), 0.01f);
  QuantMatRef w{scheme, kN, kK, gs, q.data(), int4 ? static_cast<const void*>(scales16.data()) : scales32.data()};
  w.packed = pack_quant_matrix(w);
  std::vector<float> x(m * kK), y(m * kN);
  fill(x, 8);
  for (auto _ : state) {
    qmatmul(x.data(), m, w, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(scheme_name(scheme)) + (w.packed ? " packed" : " on-disk layout"));
  state.counters["GOP/s"] = benchmark::Counter(2.0 * m * kN * kK * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_QuantMatmul)->ArgsProduct({{0, 1, 2}, {1, 64}, {1, 2}})->Apply(least_disturbed);

// `bytes` of random blocks of a GGUF type (whole blocks), every f16 field of a block a small
// finite scale (Q4_K / Q5_K: d and dmin; Q6_K: d at 208; Q3_K: d at 108; Q2_K: d and dmin at
// 80; the 32-weight types: d first).
std::vector<uint8_t> random_ggml_blocks(uint32_t type, int64_t bytes) {
  namespace ggml = infera::kernels::ggml;
  std::vector<uint8_t> q(static_cast<size_t>(bytes));
  uint32_t s = 7;
  for (auto& b : q) {  // xorshift: fast enough for hundreds of MB
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    b = static_cast<uint8_t>(s >> 8);
  }
  const int half_at = type == ggml::kQ6_K   ? 208
                      : type == ggml::kQ3_K ? 108
                      : type == ggml::kQ2_K ? 80
                                            : 0;
  const int halves = type == ggml::kQ4_K || type == ggml::kQ5_K || type == ggml::kQ2_K ? 2 : 1;
  const uint16_t d = infera::f32_to_f16(0.01f);
  for (size_t b = 0; b < q.size(); b += static_cast<size_t>(ggml::type_size(type)))
    for (int h = 0; h < halves; ++h) std::memcpy(q.data() + b + half_at + 2 * h, &d, 2);
  return q;
}

// hot_rows > 0: that many rows of one copy, read again and again from the caches (a decode
// step's compute bound, apart from memory).
void run_ggml(benchmark::State& state, int64_t hot_rows) {
  namespace ggml = infera::kernels::ggml;
  const auto type = static_cast<uint32_t>(state.range(0));
  const int64_t m = state.range(1);
  infera::set_num_threads(static_cast<int>(state.range(2)));
  const int64_t rows = hot_rows > 0 ? hot_rows : state.range(3) == 0 ? kN : kK, cols = state.range(3) == 0 ? kK : kN;
  ggml::set_ggml_amx(state.range(4) != 0);  // prefill on AMX tiles where the CPU has them, or the VNNI tiles
  // The label names the path that ran: the ISA (INFERA_ISA caps it), AMX where the tiles are
  // usable, panels where that path reads them (avx512, avx2).
  const infera::Isa isa = infera::best_isa();
  const bool amx = state.range(4) != 0 && isa == infera::Isa::kAvx512 && infera::amx_unavailable_reason() == nullptr;
  const bool panels = state.range(5) != 0 && isa != infera::Isa::kScalar;
  const int64_t rb = ggml::row_bytes(type, cols);
  // A decode step reads its weights from memory (a model's are far larger than the caches):
  // m = 1 cycles through copies of the matrix that together exceed them.
  const int64_t copies = m == 1 && hot_rows == 0 ? std::max<int64_t>(2, kColdBytes / (rows * rb)) : 1;
  const std::vector<uint8_t> q = random_ggml_blocks(type, copies * rows * rb);
  std::vector<float> x(m * cols), y(m * rows);
  fill(x, 8);
  // The panel types from their load-time panels (the sixth argument: 1 each copy's in one run,
  // 2 all copies' over one LaneBuffer's lanes, as a GGUF model has them by default).
  std::vector<MatRef> ws;
  const auto lanes = state.range(5) == 2 ? std::make_shared<infera::LaneBuffer>(copies * rows * rb / 2 + (64 << 20))
                                         : nullptr;
  for (int64_t c = 0; c < copies; ++c) {
    ws.push_back(MatRef{q.data() + c * rows * rb, DType::kGgml, rows, cols, type});
    if (state.range(5) != 0) ws.back().set_panels(ggml::pack_panels(type, ws.back().data, rows, cols, lanes));
  }
  int64_t i = 0;
  for (auto _ : state) {
    matmul(x.data(), m, ws[static_cast<size_t>(i++ % copies)], y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(type == ggml::kQ4_K   ? "q4_k"
                             : type == ggml::kQ5_K ? "q5_k"
                             : type == ggml::kQ6_K ? "q6_k"
                             : type == ggml::kQ8_0 ? "q8_0"
                             : type == ggml::kQ4_0 ? "q4_0"
                             : type == ggml::kIQ4_NL ? "iq4_nl"
                             : type == ggml::kQ4_1   ? "q4_1"
                             : type == ggml::kQ5_0   ? "q5_0"
                             : type == ggml::kQ5_1   ? "q5_1"
                             : type == ggml::kQ3_K   ? "q3_k"
                             : type == ggml::kQ2_K   ? "q2_k"
                                                   : "iq4_xs") +
                 " " + infera::isa_name(isa) + (m > 1 && amx ? " amx" : "") +
                 (panels ? state.range(5) == 2 ? " panels over lanes" : " panels" : "") +
                 (hot_rows > 0 ? " hot" : ""));
  ggml::set_ggml_amx(true);
  state.counters["GOP/s"] =
      benchmark::Counter(2.0 * m * rows * cols * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] =
      benchmark::Counter(1e-9 * static_cast<double>(rows * rb), benchmark::Counter::kIsIterationInvariantRate);
}
void BM_GgmlMatmul(benchmark::State& state) { run_ggml(state, 0); }
// 256 rows x 5632 (0.4-1.2 MB): in L2 / L3 on the CPUs measured.
void BM_GgmlDecodeHot(benchmark::State& state) { run_ggml(state, 256); }
BENCHMARK(BM_GgmlDecodeHot)
    ->ArgsProduct({{infera::kernels::ggml::kQ4_0, infera::kernels::ggml::kQ8_0, infera::kernels::ggml::kQ4_K,
                    infera::kernels::ggml::kQ5_K, infera::kernels::ggml::kQ6_K, infera::kernels::ggml::kIQ4_XS},
                   {1},
                   {1},
                   {0},
                   {0},
                   {1}})
    ->Apply(least_disturbed);
BENCHMARK(BM_GgmlMatmul)
    ->ArgsProduct({{infera::kernels::ggml::kQ4_K, infera::kernels::ggml::kQ5_K, infera::kernels::ggml::kQ6_K,
                    infera::kernels::ggml::kQ8_0, infera::kernels::ggml::kIQ4_XS, infera::kernels::ggml::kQ4_0,
                    infera::kernels::ggml::kIQ4_NL, infera::kernels::ggml::kQ3_K, infera::kernels::ggml::kQ2_K},
                   {1, 8, 16, 32, 64, 128, 256},
                   {1, 2},
                   {0, 1},
                   {1, 0},
                   {0}})
    ->Apply(least_disturbed);
BENCHMARK(BM_GgmlMatmul)
    ->ArgsProduct({{infera::kernels::ggml::kQ4_0, infera::kernels::ggml::kIQ4_NL, infera::kernels::ggml::kQ8_0,
                    infera::kernels::ggml::kQ2_K, infera::kernels::ggml::kQ3_K, infera::kernels::ggml::kQ4_K,
                    infera::kernels::ggml::kQ5_K, infera::kernels::ggml::kQ6_K, infera::kernels::ggml::kIQ4_XS},
                   {1, 2, 8, 16, 32, 64, 128, 256},
                   {1, 2},
                   {0, 1},
                   {1, 0},
                   {1}})
    ->Apply(least_disturbed);
BENCHMARK(BM_GgmlMatmul)  // a decode step over lanes (panels in one run above)
    ->ArgsProduct({{infera::kernels::ggml::kQ4_K, infera::kernels::ggml::kQ6_K, infera::kernels::ggml::kQ8_0,
                    infera::kernels::ggml::kIQ4_XS, infera::kernels::ggml::kQ4_0, infera::kernels::ggml::kQ5_K,
                    infera::kernels::ggml::kQ3_K, infera::kernels::ggml::kQ2_K},
                   {1},
                   {1, 2},
                   {0, 1},
                   {0},
                   {2}})
    ->Apply(least_disturbed);
BENCHMARK(BM_GgmlMatmul)  // the types that are only ever repacked in a model: from the rows, then the panels
    ->ArgsProduct({{infera::kernels::ggml::kQ4_1, infera::kernels::ggml::kQ5_0, infera::kernels::ggml::kQ5_1},
                   {1, 8, 64},
                   {1, 2},
                   {0},
                   {0},
                   {0, 1}})
    ->Apply(least_disturbed);

// A Qwen3-30B-A3B-shaped MoE decode step's experts (BM_GgmlMoeDecode/type/threads/joint): 64
// experts of one layer (gate and up 768 x 2048, down 2048 x 768, packed at load as a GGUF
// model packs them; 64 x 3 x 0.9 MB in Q4_K, beyond the caches), 8 of them drawn per iteration as a router
// picks them, each expert's gate and up then its down, as MoeFfn runs one token on one
// thread, or (joint) as MoeFfn runs a GGUF model's: all gate and up matrices in one
// kernels::matvec_many pass, then the downs in another. Counter GB/s: the 24 matrices' block
// bytes per second.
void BM_GgmlMoeDecode(benchmark::State& state) {
  namespace ggml = infera::kernels::ggml;
  const auto type = static_cast<uint32_t>(state.range(0));
  infera::set_num_threads(static_cast<int>(state.range(1)));
  constexpr int64_t kH = 2048, kI = 768, kE = 64, kTop = 8;
  const int64_t up_bytes = kI * ggml::row_bytes(type, kH), down_bytes = kH * ggml::row_bytes(type, kI);
  // A GGUF file's ffn_{gate,up,down}_exps: each one tensor of all the experts.
  const std::vector<uint8_t> q = random_ggml_blocks(type, kE * (2 * up_bytes + down_bytes));
  // Packed as a model packs them (one matrix of all the experts, each expert a row slice), over
  // the lanes of one LaneBuffer.
  const auto lanes = std::make_shared<infera::LaneBuffer>(kE * (2 * up_bytes + down_bytes) / 2 + (64 << 20));
  const auto fused = [&](const uint8_t* data, int64_t rows, int64_t cols) {
    MatRef all{data, DType::kGgml, kE * rows, cols, type};
    all.set_panels(ggml::pack_panels(type, data, all.rows, cols, lanes));
    std::vector<MatRef> out;
    for (int64_t e = 0; e < kE; ++e) out.push_back(row_slice(all, e * rows, (e + 1) * rows));
    return out;
  };
  const std::vector<MatRef> gate = fused(q.data(), kI, kH), up = fused(q.data() + kE * up_bytes, kI, kH),
                            down = fused(q.data() + 2 * kE * up_bytes, kH, kI);
  std::vector<float> x(kH), g(kI), u(kI), y(kH);
  fill(x, 8);
  std::mt19937 rng(5);
  const bool joint = state.range(2) != 0;
  std::vector<float> h(kTop * 2 * kI), outs(kTop * kH);
  std::vector<infera::kernels::MatVec> steps;
  for (auto _ : state) {
    int64_t picked[kTop];
    for (int64_t a = 0; a < kTop; ++a) {
      bool fresh = false;
      while (!fresh) {
        picked[a] = static_cast<int64_t>(rng() % kE);
        fresh = std::find(picked, picked + a, picked[a]) == picked + a;
      }
    }
    if (joint) {  // as MoeFfn::run_one_token_shared: every gate and up in one pass, then every down
      steps.clear();
      for (int64_t a = 0; a < kTop; ++a) {
        steps.push_back({x.data(), &gate[static_cast<size_t>(picked[a])], h.data() + 2 * kI * a});
        steps.push_back({x.data(), &up[static_cast<size_t>(picked[a])], h.data() + 2 * kI * a + kI});
      }
      infera::kernels::matvec_many(steps);
      steps.clear();
      for (int64_t a = 0; a < kTop; ++a) {
        float* ha = h.data() + 2 * kI * a;
        for (int64_t i = 0; i < kI; ++i) ha[i] = ha[i] / (1.0f + std::exp(-ha[i])) * ha[kI + i];
        steps.push_back({ha, &down[static_cast<size_t>(picked[a])], outs.data() + kH * a});
      }
      infera::kernels::matvec_many(steps);
      benchmark::DoNotOptimize(outs.data());
      benchmark::ClobberMemory();
      continue;
    }
    for (const int64_t e : picked) {
      matmul(x.data(), 1, gate[static_cast<size_t>(e)], g.data());
      matmul(x.data(), 1, up[static_cast<size_t>(e)], u.data());
      for (int64_t i = 0; i < kI; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      matmul(g.data(), 1, down[static_cast<size_t>(e)], y.data());
      benchmark::DoNotOptimize(y.data());
    }
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(infera::isa_name(infera::best_isa())) + " panels");
  state.counters["GB/s"] = benchmark::Counter(1e-9 * static_cast<double>(kTop * (2 * up_bytes + down_bytes)),
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GgmlMoeDecode)
    ->ArgsProduct(
        {{infera::kernels::ggml::kQ4_K, infera::kernels::ggml::kQ6_K, infera::kernels::ggml::kQ8_0}, {1, 2}, {0, 1}})
    ->Apply(least_disturbed);

void BM_AttentionDecode(benchmark::State& state) {
  const int64_t ctx = state.range(0);
  infera::set_num_threads(static_cast<int>(state.range(1)));
  constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
  const int64_t blocks = (ctx + kBlock - 1) / kBlock;
  std::vector<float> k_pool(blocks * kBlock * kKvHeads * kHeadDim);
  std::vector<float> v_pool(k_pool.size());
  fill(k_pool, 3);
  fill(v_pool, 4);
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));  // pages out of order, as in use
  std::vector<float> q(kHeads * kHeadDim), out(q.size());
  fill(q, 6);
  const PagedKv kv{k_pool.data(), v_pool.data(), kBlock, kKvHeads, kHeadDim, table.data()};
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  for (auto _ : state) {
    attention_paged(q.data(), 1, kHeads, ctx - 1, kv, scale, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = 2.0 * ctx * kKvHeads * kHeadDim * sizeof(float);
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionDecode)
    ->Args({4096, 1})
    ->Args({4096, 2})
    ->Args({32768, 1})
    ->Args({32768, 2})
    ->Apply(least_disturbed);

}  // namespace

BENCHMARK_MAIN();
