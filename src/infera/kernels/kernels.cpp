// Public kernels API: argument checks, then dispatch to the per-ISA table.
#include "infera/kernels/kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>

#include <omp.h>

#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/base/options.h"
#include "infera/base/threads.h"
#include "infera/kernels/cpu/dispatch.h"
#include "infera/kernels/ggml_quants.h"

namespace infera::kernels {
namespace {

const KernelTable& table_for(Isa isa) {
  INFERA_ASSERT(isa_available(isa), std::string("kernel path ") + isa_name(isa) + " is not available on this CPU");
  switch (isa) {
    case Isa::kAvx512: return cpu_avx512::table();
    case Isa::kAvx2: return cpu_avx2::table();
    case Isa::kScalar: break;
  }
  return cpu_scalar::table();
}

void check_weight(const MatRef& w) {
  if (w.dtype == DType::kGgml) {
    if (!ggml::has_matmul(w.ggml_type)) fail("matmul: ggml weight type {} has no kernel", w.ggml_type);
    INFERA_ASSERT(w.rows >= 0 && w.cols >= 0 && w.cols % ggml::block_size(w.ggml_type) == 0);
    return;
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kF16) {
    fail(
        "matmul: weight dtype {} is not supported (expected f32, bf16 or f16; quantize or "
        "convert the checkpoint)",
        dtype_name(w.dtype));
  }
  INFERA_ASSERT(w.rows >= 0 && w.cols >= 0);
  INFERA_ASSERT(w.data != nullptr || w.rows * w.cols == 0);
}

}  // namespace

namespace {
// -1: not set yet (the environment's INFERA_BF16_DOT decides on first use, after static
// initialization, when the option table exists).
std::atomic<int> g_bf16_dot{-1};
}  // namespace

namespace {
std::atomic<bool> g_bf16_amx{true};
}  // namespace

void set_bf16_amx(bool enabled) { g_bf16_amx.store(enabled, std::memory_order_relaxed); }
bool bf16_amx_enabled() { return g_bf16_amx.load(std::memory_order_relaxed) && amx_unavailable_reason() == nullptr; }

void set_bf16_dot(Bf16Dot mode) { g_bf16_dot.store(static_cast<int>(mode), std::memory_order_relaxed); }
Bf16Dot bf16_dot_mode() {
  int v = g_bf16_dot.load(std::memory_order_relaxed);
  if (v < 0) {
    static const int from_env = [] {
      const std::string e = option_env("bf16_dot", BadEnvValue::kWarnAndIgnore);
      return static_cast<int>(e == "0" ? Bf16Dot::kOff : e == "1" ? Bf16Dot::kOn : Bf16Dot::kAuto);
    }();
    int expected = -1;
    g_bf16_dot.compare_exchange_strong(expected, from_env, std::memory_order_relaxed);
    v = g_bf16_dot.load(std::memory_order_relaxed);
  }
  return static_cast<Bf16Dot>(v);
}
bool bf16_dot_enabled() { return bf16_dot_mode() != Bf16Dot::kOff; }
bool bf16_vector_dot() {
  const Bf16Dot mode = bf16_dot_mode();
  return mode == Bf16Dot::kOn || (mode == Bf16Dot::kAuto && cpu_features().amd);
}

namespace {
// A choice among kKinds variants of a kernel that give the same values and differ only in
// speed, by machine: the first calls fit to time (trial slots handed out round-robin over
// the variants) are timed until each variant has kTrialCallsEach calls, or kTrialBytesEach
// bytes over at least kTrialMinCallsEach (a model's output head, one call a token: 54 MB of
// Q6_K in a Qwen3-MoE-shaped model, which otherwise ran 192 tokens of trials, two thirds of
// them on the slower variants), and the variant whose calls read the most bytes per second
// is kept, by the mean of the logarithms of its calls' rates: every call counts alike, as
// the round robin gives each variant the same mix of a model's matrices (summed bytes over
// summed time let the one or two calls of an output head, 131 MB in bf16 against 1-23 MB,
// decide: a bf16 TinyLlama-shaped model's trials picked 512 B where none ran 6% faster).
constexpr int kKinds = 3;
constexpr int kTrialCallsEach = 64;
constexpr int kTrialMinCallsEach = 3;
constexpr int64_t kTrialBytesEach = int64_t{64} << 20;
constexpr int64_t kTrialMinBytes = int64_t{1} << 20;  // smaller matrices may sit in cache (f32 / bf16 / f16)

struct Tuner {
  std::atomic<int> chosen{-1};  // the variant, or -1 while timing
  std::atomic<int> handed{0};  // trial slots handed out
  std::atomic<bool> deciding{false};  // a thread has taken the decision
  std::atomic<int> calls[kKinds] = {};
  std::atomic<int64_t> log_rates[kKinds] = {};  // sum over the calls of ln(bytes per ns), in millionths
  std::atomic<int64_t> bytes[kKinds] = {};
  void reset() {
    for (int c = 0; c < kKinds; ++c) {
      log_rates[c] = 0;
      bytes[c] = 0;
      calls[c] = 0;
    }
    handed = 0;
    deciding = false;
    chosen = -1;
  }
  bool timed_enough(int v) const {
    const int n = calls[v].load();
    return n >= kTrialCallsEach || (n >= kTrialMinCallsEach && bytes[v].load() >= kTrialBytesEach);
  }
  // Runs run(variant) for a call of `bytes` of weights: the chosen variant, or while timing a
  // trial slot's (timed) where `timed` allows, else `untimed`. `what` (and `type`, a ggml type
  // id where >= 0) names the choice
  // (logged when made); names[c] the variants.
  template <class Run>
  void call(int64_t call_bytes, bool timed, int untimed, const char* what, int type, const char* const* names,
            Run run) {
    const int c = chosen.load(std::memory_order_relaxed);
    if (c >= 0) return run(c);
    const int slot = timed ? handed.fetch_add(1) : -1;
    if (slot < 0) return run(untimed);
    const int v = slot % kKinds;
    const auto t0 = std::chrono::steady_clock::now();
    run(v);
    const auto t1 = std::chrono::steady_clock::now();
    const int64_t ns = std::max<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count(), 1);
    log_rates[v].fetch_add(
        std::llround(1e6 * std::log(static_cast<double>(std::max<int64_t>(call_bytes, 1)) / static_cast<double>(ns))));
    bytes[v].fetch_add(call_bytes);
    calls[v].fetch_add(1);
    for (int i = 0; i < kKinds; ++i)
      if (!timed_enough(i)) return;
    if (deciding.exchange(true)) return;  // another thread's call completed the trials first
    int best = 0;
    double rate[kKinds];
    for (int i = 0; i < kKinds; ++i) {
      rate[i] = std::exp(1e-6 * static_cast<double>(log_rates[i].load()) / calls[i].load());  // GB/s
      if (rate[i] > rate[best]) best = i;
    }
    chosen = best;
    LOG_DEBUG("{}{}: {} (GB/s: {} {:.1f}, {} {:.1f}, {} {:.1f})", what,
              type >= 0 ? fmt::format(", ggml type {}", type) : std::string(), names[best], names[0], rate[0], names[1],
              rate[1], names[2], rate[2]);
  }
  // The variant decided, or -1.
  int decided() const { return chosen.load(std::memory_order_relaxed); }
};

// A setting read from the environment on first use (after static initialization, when the
// option table exists): -1 auto, else a variant; set_* overrides it.
struct Setting {
  std::atomic<int> value{-2};  // -2: not read yet
  int get(const char* option, const char* const* env_names) {
    int v = value.load(std::memory_order_relaxed);
    if (v != -2) return v;
    const std::string e = option_env(option, BadEnvValue::kWarnAndIgnore);
    int from_env = -1;
    for (int c = 0; c < kKinds; ++c)
      if (e == env_names[c]) from_env = c;
    int expected = -2;
    value.compare_exchange_strong(expected, from_env, std::memory_order_relaxed);
    return value.load(std::memory_order_relaxed);
  }
};

// f32 / bf16 / f16 decode: prefetch distances in bytes.
constexpr int kGemvPrefetchBytes[kKinds] = {0, 512, 2048};
constexpr const char* kGemvPrefetchNames[kKinds] = {"none", "512 B", "2 KiB"};
constexpr const char* kGemvPrefetchEnv[kKinds] = {"0", "512", "2048"};
constexpr int kGemvUntimed = 2;  // 2 KiB: calls outside the timing, while it runs
Tuner g_gemv_tuners[2];  // one thread, several
Setting g_gemv_setting;

// GGUF panel decode: PanelPrefetch values.
constexpr const char* kPanelPrefetchNames[kKinds] = {"L1", "L2", "none"};
constexpr const char* kPanelPrefetchEnv[kKinds] = {"l1", "l2", "none"};
constexpr int kPanelUntimed = 0;  // L1
constexpr int kGgmlTypes = 64;  // ggml type ids below this are timed apart
// Calls of kPanelSmallBytes to kPanelLargeBytes and larger ones are timed apart: which mode
// wins differs (a Qwen3-MoE-shaped Q4_K_M model at one thread on a Zen 4 EPYC, GB/s L1 / L2
// / none: its 4.7 MB Q4_K attention matrices 15-16 / 24-25 / 24-26, its 0.9 MB Q4_K experts
// 14 / 23 / 20 (kernels_bench BM_GgmlMoeDecode), so none for the first, which the experts,
// never timed below 1 MiB, took too). Until a bucket is timed it takes the other's choice
// where that is made. Smaller calls than kPanelSmallBytes are not timed (in the caches).
constexpr int64_t kPanelSmallBytes = int64_t{256} << 10, kPanelLargeBytes = int64_t{2} << 20;
Tuner g_panel_tuners[kGgmlTypes][2][2];  // [type][several threads][large calls]
// matvec_many's, by the type of most of its bytes: [type][several threads][steps of kPanelLargeBytes on average]
Tuner g_joint_tuners[kGgmlTypes][2][2];
Setting g_panel_setting;

int gemv_setting() { return g_gemv_setting.get("gemv_prefetch", kGemvPrefetchEnv); }
int panel_setting() { return g_panel_setting.get("gguf_prefetch", kPanelPrefetchEnv); }

// Decode calls of one row of x (what the settings are for: the f32 / bf16 / f16 kernels' calls
// of 2-4 rows are compute bound, and the panels' modes apply to one row), not nested in a
// parallel region (whose other threads would share the time), are timed.
bool timeable(int64_t m) { return m == 1 && !omp_in_parallel(); }

// The table's matmul_rows with the decode prefetch distance chosen (and timed, while auto
// is still timing).
void table_matmul_rows(const KernelTable& t, const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1,
                       float* y, int64_t ldy) {
  const auto run = [&](int v) { t.matmul_rows(x, m, w, n0, n1, y, ldy, kGemvPrefetchBytes[v]); };
  const int setting = gemv_setting();
  if (setting >= 0 || m >= kGemmMinRows) return run(setting >= 0 ? setting : kGemvUntimed);
  const bool several = num_threads() > 1;
  const int64_t bytes = (n1 - n0) * w.cols * static_cast<int64_t>(dtype_size(w.dtype));
  g_gemv_tuners[several ? 1 : 0].call(bytes, timeable(m) && bytes >= kTrialMinBytes, kGemvUntimed,
                                      several ? "decode matmul prefetch (several threads)"
                                              : "decode matmul prefetch (one thread)",
                                      -1, kGemvPrefetchNames, run);
}

void ggml_matmul_rows(Isa isa, const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y,
                      int64_t ldy) {
  if (w.data == nullptr && (isa == Isa::kScalar || !w.panels || n0 % ggml::kPanelRows != 0)) {
    fail(
        "matmul: this GGUF matrix is held as panels only (a tensor-parallel slice), which the {} path cannot "
        "read{}",
        isa_name(isa), w.panels && isa != Isa::kScalar ? " from a row off a panel boundary" : "");
  }
  const auto run = [&](int v) {
    ggml::matmul_rows(isa, w.ggml_type, w.data, w.cols, x, m, n0, n1, y, ldy, w.panel_ref(),
                      static_cast<ggml::PanelPrefetch>(v));
  };
  const int setting = panel_setting();
  if (setting >= 0 || m != 1 || !w.panels || w.ggml_type >= kGgmlTypes)
    return run(setting >= 0 ? setting : kPanelUntimed);
  const int64_t bytes = (n1 - n0) * ggml::row_bytes(w.ggml_type, w.cols);
  const bool several = num_threads() > 1, large = bytes >= kPanelLargeBytes;
  const int other = g_panel_tuners[w.ggml_type][several ? 1 : 0][large ? 0 : 1].decided();
  g_panel_tuners[w.ggml_type][several ? 1 : 0][large ? 1 : 0].call(
      bytes, timeable(m) && bytes >= kPanelSmallBytes, other >= 0 ? other : kPanelUntimed,
      several ? (large ? "gguf decode prefetch (several threads)"
                       : "gguf decode prefetch (several threads, small matrices)")
              : (large ? "gguf decode prefetch (one thread)" : "gguf decode prefetch (one thread, small matrices)"),
      static_cast<int>(w.ggml_type), kPanelPrefetchNames, run);
}

// matvec_many's steps in one pass, its prefetch mode timed apart (its calls stream several
// matrices; until timed, the mode matmul_rows's calls of that type decided).
void ggml_matvec_many(Isa isa, std::span<const MatVec> steps) {
  static thread_local std::vector<ggml::PanelMatVec> panel_steps;
  panel_steps.clear();
  // Timed under the type that holds most of the pass's bytes (a Q4_K_M layer's Q4_K q and k
  // with its Q6_K v: Q4_K). Every step is of a panel type (matvec_shares), each below kGgmlTypes.
  static_assert(ggml::kIQ4_XS < kGgmlTypes, "the panel types' ids index the tuners");
  int64_t bytes = 0, of_type[kGgmlTypes] = {};
  uint32_t type = steps.front().w->ggml_type;
  for (const MatVec& s : steps) {
    const MatRef& w = *s.w;
    const int64_t pb = ggml::panel_bytes(w.ggml_type, w.cols), step_bytes = (s.end() - s.r0) * row_bytes(w);
    panel_steps.push_back(
        {w.ggml_type, w.cols, s.x, w.panel_ref().from(s.r0 / ggml::kPanelRows, pb), s.end() - s.r0, s.y});
    bytes += step_bytes;
    of_type[w.ggml_type] += step_bytes;
  }
  for (const MatVec& s : steps)  // (ties: the first step's of them)
    if (of_type[s.w->ggml_type] > of_type[type]) type = s.w->ggml_type;
  const auto run = [&](int v) { ggml::matvec_many(isa, panel_steps, static_cast<ggml::PanelPrefetch>(v)); };
  const int setting = panel_setting();
  if (setting >= 0) return run(setting);
  const bool several = num_threads() > 1;
  const bool large = bytes >= kPanelLargeBytes * static_cast<int64_t>(steps.size());
  int other = g_panel_tuners[type][several ? 1 : 0][large ? 1 : 0].decided();
  if (other < 0) other = g_panel_tuners[type][several ? 1 : 0][large ? 0 : 1].decided();
  g_joint_tuners[type][several ? 1 : 0][large ? 1 : 0].call(
      bytes, timeable(1) && bytes >= kPanelSmallBytes, other >= 0 ? other : kPanelUntimed,
      several ? (large ? "gguf decode prefetch, matrices at once (several threads)"
                       : "gguf decode prefetch, small matrices at once (several threads)")
              : (large ? "gguf decode prefetch, matrices at once (one thread)"
                       : "gguf decode prefetch, small matrices at once (one thread)"),
      static_cast<int>(type), kPanelPrefetchNames, run);
}

std::string tuner_state(const Tuner& t, const char* const* names) {
  const int c = t.decided();
  return c >= 0 ? names[c] : "not yet timed";
}
}  // namespace

void set_gemv_prefetch(int bytes) {
  INFERA_ASSERT(bytes >= kGemvPrefetchAuto);
  for (auto& t : g_gemv_tuners) t.reset();
  int v = -1;
  for (int c = 0; c < kKinds; ++c)
    if (bytes == kGemvPrefetchBytes[c]) v = c;
  INFERA_ASSERT(bytes == kGemvPrefetchAuto || v >= 0, "gemv prefetch: 0, 512 or 2048 bytes");
  g_gemv_setting.value.store(v, std::memory_order_relaxed);
}

GemvPrefetch gemv_prefetch_for(int threads) {
  const int setting = gemv_setting();
  if (setting >= 0) return {kGemvPrefetchBytes[setting], true};
  const int c = g_gemv_tuners[threads > 1 ? 1 : 0].decided();
  return c >= 0 ? GemvPrefetch{kGemvPrefetchBytes[c], true} : GemvPrefetch{kGemvPrefetchBytes[kGemvUntimed], false};
}

std::string gemv_prefetch_text() {
  const int setting = gemv_setting();
  if (setting >= 0) return std::string(kGemvPrefetchNames[setting]) + " ahead (fixed)";
  return std::string("none, 512 B or 2 KiB ahead, chosen at run time (timed on the first decode calls; one thread: ") +
         tuner_state(g_gemv_tuners[0], kGemvPrefetchNames) +
         ", several: " + tuner_state(g_gemv_tuners[1], kGemvPrefetchNames) + ")";
}

void set_gguf_prefetch(int mode) {
  INFERA_ASSERT(mode >= -1 && mode < kKinds);
  for (auto& per_type : g_panel_tuners)
    for (auto& per_threads : per_type)
      for (auto& t : per_threads) t.reset();
  for (auto& per_type : g_joint_tuners)
    for (auto& per_threads : per_type)
      for (auto& t : per_threads) t.reset();
  g_panel_setting.value.store(mode, std::memory_order_relaxed);
}

int gguf_prefetch_for(uint32_t type, int threads, int64_t bytes) {
  const int setting = panel_setting();
  if (setting >= 0) return setting;
  return type < kGgmlTypes ? g_panel_tuners[type][threads > 1 ? 1 : 0][bytes >= kPanelLargeBytes ? 1 : 0].decided()
                           : -1;
}

std::string gguf_prefetch_text() {
  const int setting = panel_setting();
  if (setting >= 0) return std::string("the lines ahead: ") + kPanelPrefetchNames[setting] + " (fixed)";
  return "the lines ahead into L1, into L2 or not at all, chosen at run time per type and for one thread and several "
         "(timed on the first decode calls)";
}

std::string matmul_path(Isa isa, DType dtype) {
  INFERA_ASSERT(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16);
  return table_for(isa).matmul_path(dtype);
}

bool isa_available(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return cpu_features().has_avx512_path();
    case Isa::kAvx2: return cpu_features().has_avx2_path();
    case Isa::kScalar: return true;
  }
  return false;
}

int64_t row_bytes(const MatRef& w) {
  return w.dtype == DType::kGgml ? ggml::row_bytes(w.ggml_type, w.cols)
                                 : w.cols * static_cast<int64_t>(dtype_size(w.dtype));
}

MatRef row_slice(const MatRef& w, int64_t n0, int64_t n1) {
  INFERA_ASSERT(0 <= n0 && n0 <= n1 && n1 <= w.rows);
  const auto* base = static_cast<const char*>(w.data);
  MatRef s{base ? base + n0 * row_bytes(w) : nullptr, w.dtype, n1 - n0, w.cols, w.ggml_type};
  if (w.panels && n0 % ggml::kPanelRows == 0 && n1 > n0) {  // (a view into the same copy)
    const ggml::PanelRef from = w.panel_ref().from(n0 / ggml::kPanelRows, ggml::panel_bytes(w.ggml_type, w.cols));
    s.set_panels({std::shared_ptr<const uint8_t>(w.panels, from.base), from});
  }
  return s;
}

void matmul(Isa isa, const float* x, int64_t m, const MatRef& w, float* y) {
  matmul_rows(isa, x, m, w, 0, w.rows, y, w.rows);
}
void matmul(const float* x, int64_t m, const MatRef& w, float* y) { matmul(best_isa(), x, m, w, y); }

void matmul_rows(Isa isa, const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  check_weight(w);
  INFERA_ASSERT(m >= 0 && 0 <= n0 && n0 <= n1 && n1 <= w.rows && ldy >= n1 - n0);
  if (w.dtype == DType::kGgml) {
    INFERA_ASSERT(isa_available(isa), std::string("kernel path ") + isa_name(isa) + " is not available on this CPU");
    ggml_matmul_rows(isa, x, m, w, n0, n1, y, ldy);
    return;
  }
  table_matmul_rows(table_for(isa), x, m, w, n0, n1, y, ldy);
}
void matmul_rows(const float* x, int64_t m, const MatRef& w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  matmul_rows(best_isa(), x, m, w, n0, n1, y, ldy);
}

bool matvec_shares(Isa isa, const MatRef& w, int64_t r0) {
  return isa != Isa::kScalar && w.dtype == DType::kGgml && w.panels != nullptr && w.panel_lane != 0 &&
         ggml::can_pack_panels(w.ggml_type) && r0 % ggml::kPanelRows == 0 && isa_available(isa);
}
bool matvec_shares(const MatRef& w, int64_t r0) { return matvec_shares(best_isa(), w, r0); }

void matvec_many(Isa isa, std::span<const MatVec> steps) {
  bool shares = !steps.empty();
  for (const MatVec& s : steps) {
    INFERA_ASSERT(s.w != nullptr && s.x != nullptr && s.y != nullptr, "matvec_many: a step without its operands");
    check_weight(*s.w);
    INFERA_ASSERT(0 <= s.r0 && s.r0 <= s.end() && s.end() <= s.w->rows);
    shares = shares && matvec_shares(isa, *s.w, s.r0);
  }
  if (shares) return ggml_matvec_many(isa, steps);
  for (const MatVec& s : steps) matmul_rows(isa, s.x, 1, *s.w, s.r0, s.end(), s.y, s.end() - s.r0);
}
void matvec_many(std::span<const MatVec> steps) { matvec_many(best_isa(), steps); }

void rmsnorm(Isa isa, const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, float w_offset) {
  INFERA_ASSERT(rows >= 0 && n > 0);
  table_for(isa).rmsnorm(x, w, y, rows, n, eps, w_offset);
}
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, float w_offset) {
  rmsnorm(best_isa(), x, w, y, rows, n, eps, w_offset);
}

void silu_mul(Isa isa, float* gate, const float* up, int64_t n) {
  INFERA_ASSERT(n >= 0);
  table_for(isa).silu_mul(gate, up, n);
}
void silu_mul(float* gate, const float* up, int64_t n) { silu_mul(best_isa(), gate, up, n); }

void softmax(Isa isa, float* x, int64_t n) {
  INFERA_ASSERT(n >= 1);
  table_for(isa).softmax(x, n);
}
void softmax(float* x, int64_t n) { softmax(best_isa(), x, n); }

void add(Isa isa, float* y, const float* x, int64_t n) {
  INFERA_ASSERT(n >= 0);
  table_for(isa).add(y, x, n);
}
void add(float* y, const float* x, int64_t n) { add(best_isa(), y, x, n); }

void rope_neox(Isa isa, float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim,
               const int32_t* positions, const float* inv_freq, float attn_factor) {
  INFERA_ASSERT(rot_dim >= 0 && rot_dim % 2 == 0 && rot_dim <= head_dim,
                "rope_neox: rot_dim must be even and <= head_dim");
  table_for(isa).rope_neox(x, n_tokens, n_heads, head_dim, rot_dim, positions, inv_freq, attn_factor);
}
void rope_neox(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const int32_t* positions,
               const float* inv_freq, float attn_factor) {
  rope_neox(best_isa(), x, n_tokens, n_heads, head_dim, rot_dim, positions, inv_freq, attn_factor);
}

void attention_paged(Isa isa, const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const PagedKv& kv,
                     float scale, float* out) {
  if (kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0) {
    fail(
        "attention: num_attention_heads ({}) must be a positive multiple of num_key_value_heads "
        "({}); check the model's config.json",
        n_heads, kv.n_kv_heads);
  }
  INFERA_ASSERT(n_tokens >= 0 && pos0 >= 0 && kv.block_size > 0 && kv.head_dim > 0);
  if (kv.dtype != DType::kF32 && kv.dtype != DType::kBF16 && kv.dtype != DType::kI8) {
    fail("attention: KV cache dtype {} is not supported (f32, bf16 or int8)", dtype_name(kv.dtype));
  }
  INFERA_ASSERT(kv.dtype != DType::kI8 || (kv.k_scales && kv.v_scales), "int8 KV needs scales");
  if (n_tokens == 0) return;
  table_for(isa).attention_paged(q, n_tokens, n_heads, pos0, kv, scale, out);
}
void attention_paged(const float* q, int64_t n_tokens, int64_t n_heads, int64_t pos0, const PagedKv& kv, float scale,
                     float* out) {
  attention_paged(best_isa(), q, n_tokens, n_heads, pos0, kv, scale, out);
}

void store_kv_rows(DType dtype, const float* src, int64_t src_stride, int64_t n_rows, const int64_t* slots,
                   int64_t block_size, int64_t n_kv_heads, int64_t head_dim, void* dst, float* scales) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kI8) {
    fail("KV cache dtype {} is not supported (f32, bf16 or int8)", dtype_name(dtype));
  }
  for (int64_t i = 0; i < n_rows; ++i) {
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      const float* xh = src + i * src_stride + h * head_dim;
      const int64_t r = kv_row(slots[i], h, block_size, n_kv_heads);
      const int64_t base = r * head_dim;  // elements
      switch (dtype) {
        case DType::kF32: std::memcpy(static_cast<float*>(dst) + base, xh, head_dim * sizeof(float)); break;
        case DType::kBF16: {
          uint16_t* y = static_cast<uint16_t*>(dst) + base;
          for (int64_t d = 0; d < head_dim; ++d) y[d] = f32_to_bf16(xh[d]);
          break;
        }
        default: {  // kI8
          int8_t* y = static_cast<int8_t*>(dst) + base;
          float amax = 0.0f;
          for (int64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(xh[d]));
          const float scale = amax / 127.0f;
          const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
          scales[r] = scale;
          for (int64_t d = 0; d < head_dim; ++d) {
            y[d] = static_cast<int8_t>(std::clamp(std::nearbyint(xh[d] * inv), -127.0f, 127.0f));
          }
          break;
        }
      }
    }
  }
}

float load_kv_value(DType dtype, const void* pool, const float* scales, int64_t index, int64_t head_dim) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(pool)[index];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(pool)[index]);
    case DType::kI8: return scales[index / head_dim] * static_cast<const int8_t*>(pool)[index];
    default: fail("KV cache dtype {} is not supported (f32, bf16 or int8)", dtype_name(dtype));
  }
}

}  // namespace infera::kernels
