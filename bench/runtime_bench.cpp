// Engine benchmark (printed, not a test): throughput of continuous batching at several
// concurrencies, and time to first token of long prompts for several prefill chunk
// sizes with the peak resident memory of each run.
//
//   runtime_bench MODEL_DIR [--name NAME] [--concurrency 1,4,16] [--prompt 32] [--gen 64]
//                 [--ttft 4096,32768] [--chunks 512,2048] [--threads N] [--kv-dtype f32|bf16|int8]
//                 [--ttft-gen 1]
//
// --concurrency "" skips the throughput part, --ttft "" the long prompts. Each long prompt
// prints its time to first token, per prompt token, and the process's peak RSS during
// the prefill next to the planner's estimate (model/planner.h: weights + KV + activations
// + runtime reserve) for that context and chunk, and without the reserve: the growth over
// the process's RSS before the model was loaded against weights + KV + activations.
// --ttft-gen N > 1 also decodes N - 1 tokens after the long prompt (ms per token: the
// decode step reads the whole KV cache, where the KV dtype shows). For a clean comparison run one length and
// one chunk per process (the model's scratch is sized for the largest chunk listed).
//
// bench/runtime_bench.sh builds it and runs it on stories260K and a generated
// TinyLlama-shaped model.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/base/timer.h"
#include "infera/tools/planner.h"
#include "infera/runtime/engine.h"

using namespace infera;

namespace {

using bench::parse_list;

// "VmHWM" (peak) or "VmRSS" (current) of this process in bytes.
int64_t proc_status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::string(key).size() + 1) * 1024;
  }
  return 0;
}

// Bytes of the model's weight files (what the planner calls weights "as stored").
int64_t stored_weight_bytes(const std::string& dir) {
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") bytes += static_cast<int64_t>(entry.file_size());
  }
  return bytes;
}

// CPU seconds (user + system) this process has used: on a shared machine the wall time
// of a run depends on the load, its CPU time much less.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";  // resets VmHWM to the current RSS (Linux >= 4.0)
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int32_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> p(n);
  p[0] = 1;
  for (int32_t i = 1; i < n; ++i) p[i] = d(rng);
  return p;
}

struct RunResult {
  double seconds = 0;
  int64_t generated = 0;
  double ttft_ms = 0;
  EngineStats stats;
};

// Runs `n_seqs` requests to completion on a fresh engine, stepping it on this thread.
RunResult run(Model& model, EngineConfig config, int32_t n_seqs, int32_t prompt_len, int32_t gen, uint32_t seed) {
  EngineCore core(model, config);
  std::mt19937 rng(seed);
  RunResult r;
  for (int32_t i = 0; i < n_seqs; ++i) {
    Request q;
    q.prompt_ids = random_prompt(rng, prompt_len, model.config().vocab_size);
    q.max_tokens = gen;
    q.ignore_eos = true;
    core.add_request(std::move(q), [&](const Event& e) {
      if (!e.is_final()) ++r.generated;
      else r.ttft_ms = std::max(r.ttft_ms, e.timings.ttft_ms);
    });
  }
  Timer t;
  while (core.has_work()) core.step();
  r.seconds = t.seconds();
  r.stats = core.stats();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [--name NAME] [--concurrency 1,4,16] [--prompt 32] [--gen 64] "
                         "[--ttft 4096,32768] [--chunks 512,2048] [--threads N]\n", argv[0]);
    return 2;
  }
  try {
    std::string dir = argv[1], name = argv[1];
    std::vector<int> concurrency = {1, 4, 16}, ttft = {4096, 32768}, chunks = {512, 2048};
    int prompt = 32, gen = 64, threads = 0;
    std::string kv_dtype = "f32";
    int ttft_gen = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--name") name = v;
      else if (k == "--concurrency") concurrency = parse_list(v);
      else if (k == "--prompt") prompt = std::stoi(v);
      else if (k == "--gen") gen = std::stoi(v);
      else if (k == "--ttft") ttft = parse_list(v);
      else if (k == "--chunks") chunks = parse_list(v);
      else if (k == "--threads") threads = std::stoi(v);
      else if (k == "--kv-dtype") kv_dtype = v;
      else if (k == "--ttft-gen") ttft_gen = std::max(1, std::stoi(v));
      else fail("unknown option {}", k);
    }
    if (threads > 0) set_num_threads(threads);
    const DType kv = parse_kv_cache_dtype(kv_dtype);
    int max_chunk = 512;
    for (int c : chunks) max_chunk = std::max(max_chunk, c);
    LoadOptions lo;
    lo.load_into_memory = true;
    lo.max_batch_tokens = max_chunk;
    const int64_t rss0 = proc_status_bytes("VmRSS");  // code and libraries, before the model
    auto model = load_model(dir, lo);
    const int64_t weights_rss = proc_status_bytes("VmRSS") - rss0;
    std::printf("# %s: %.1f M parameters, %d layers, hidden %d, weights resident %.1f MiB, %d threads\n", name.c_str(),
                model->num_parameters() / 1e6, model->config().num_layers, model->config().hidden_size,
                weights_rss / 1048576.0, num_threads());

    // Throughput.
    if (!concurrency.empty()) std::printf("\n## throughput (prompt %d tokens, %d generated per sequence, greedy)\n", prompt, gen);
    if (!concurrency.empty()) std::printf("%-12s %8s %10s %12s %10s\n", "sequences", "steps", "seconds", "tokens/s", "vs 1 seq");
    double base = 0;
    for (int n : concurrency) {
      EngineConfig c;
      c.kv_cache_bytes = int64_t{1} << 30;
      c.max_num_seqs = std::max(n, 1);
      c.max_batch_tokens = std::max(512, n);
      c.prefill_chunk = 512;
      c.kv_dtype = kv;
      const RunResult r = run(*model, c, n, prompt, gen, 1);
      const double tps = r.generated / r.seconds;
      if (base == 0) base = tps;
      std::printf("%-12d %8ld %10.2f %12.1f %9.2fx\n", n, static_cast<long>(r.stats.steps), r.seconds, tps, tps / base);
      std::fflush(stdout);
    }

    // Time to first token for long prompts, and peak memory against the planner.
    if (!ttft.empty()) {
      std::printf("\n## time to first token (one request, max_tokens %d, KV %s); peak RSS of the process vs the "
                  "planner: total (plan incl. its %.0f MiB runtime reserve) and model (peak - RSS before loading, vs "
                  "weights + KV + activations)\n",
                  ttft_gen, kv_cache_dtype_name(kv), PlanOptions{}.reserve_bytes / 1048576.0);
      std::printf("%-8s %6s %10s %9s %10s %9s %10s %10s %10s %8s %8s %8s %7s %7s\n", "prompt", "chunk", "ttft ms",
                  "us/token", "prefill/s", "decode ms", "cpu ms", "peak MiB", "plan MiB", "weights", "KV", "activ.", "total", "model");
    }
    const int64_t weight_file_bytes = stored_weight_bytes(dir);
    for (int len : ttft) {
      for (int chunk : chunks) {
        EngineConfig c;
        c.max_context = len + ttft_gen + 16;
        c.allow_context_beyond_model = true;  // positions past the model's limit: a speed test
        c.kv_dtype = kv;
        KvPoolShape shape = model->kv_shape(16);
        shape.dtype = kv;
        c.kv_cache_bytes = shape.bytes_per_token() * (len + ttft_gen + 64);  // a ceiling: pages count once written
        c.max_batch_tokens = chunk;
        c.prefill_chunk = chunk;
        PlanOptions po;
        po.scheme = model->config().torch_dtype == "float32" ? WeightScheme::kF32 : WeightScheme::kBF16;
        po.weights_bytes_override = weight_file_bytes;
        po.ctx = len + ttft_gen;  // the prompt and the generated tokens
        po.concurrency = 1;
        po.prefill_chunk = max_chunk;  // what the model's scratch was sized for
        po.kv_dtype = kv;
        const DevicePlan plan = plan_memory(model->config(), po).devices.at(0);
        reset_peak_rss();
        const double cpu0 = cpu_seconds();
        const RunResult r = run(*model, c, 1, len, ttft_gen, 2);
        const double cpu_ms = 1e3 * (cpu_seconds() - cpu0);
        const int64_t peak = proc_status_bytes("VmHWM");
        const double mib = 1048576.0;
        const double decode_ms = r.generated > 1 ? (r.seconds * 1e3 - r.ttft_ms) / (r.generated - 1) : 0.0;
        const int64_t plan_model = plan.weights_bytes + plan.kv_bytes + plan.activation_bytes;
        std::printf("%-8d %6d %10.1f %9.2f %10.1f %9.2f %10.0f %10.1f %10.1f %8.1f %8.1f %8.1f %7.3f %7.3f\n", len,
                    chunk, r.ttft_ms, 1e3 * r.ttft_ms / len, len / (r.ttft_ms / 1e3), decode_ms, cpu_ms, peak / mib,
                    plan.total_bytes / mib, plan.weights_bytes / mib, plan.kv_bytes / mib, plan.activation_bytes / mib,
                    static_cast<double>(peak) / plan.total_bytes, static_cast<double>(peak - rss0) / plan_model);
        std::fflush(stdout);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
