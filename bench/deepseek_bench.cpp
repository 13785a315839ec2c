// DeepSeek benchmark (printed, not a test): KV bytes per token and decode time per token at
// long contexts, without prefilling them, and the prefill time (TTFT). The paged KV cache
// of the context is filled with random rows (for MLA the latent [c_kv | k_pe] and, V3.2,
// the indexer key; for a GQA model K and V), then one-token forward steps at positions ctx,
// ctx + 1, ... are timed. Every step reads what a real decode step reads at that context
// (the cache's rows, all of them for dense attention; V3.2 beyond index_topk: the indexer
// keys and the selected rows).
//
//   deepseek_bench MODEL_DIR [--name NAME] [--ctx 4096,32768,114688] [--steps 3]
//                  [--threads N] [--kv-dtype f32|bf16|int8] [--block 64]
//                  [--prefill CHUNK] [--chunk-at CHUNK --ttft 4096,32768,114688]
//
// Decode (default): one line per context: model, context, KV bytes per token (all layers),
// ms per decode token (the best of --steps steps) as process CPU time (all threads; on a
// loaded machine the steadier figure: time waiting for a core is not counted) and as wall
// time, the ISA path and the load average.
// --prefill CHUNK: a real prefill of each context (random token ids) in chunks of CHUNK
// tokens, the last one computing the logits: TTFT, CPU and wall, measured once.
// --chunk-at CHUNK: one prefill chunk of CHUNK tokens at each --ctx position (random
// context before it; best of --steps), and an estimate of the TTFT of each --ttft length:
// the sum over its chunks (starting at 0, CHUNK, 2 CHUNK, ...) of the chunk time
// interpolated linearly between the measured positions (extrapolated past the last two).
// A chunk's cost is close to linear in its position (attention and indexer work grow with
// the context, the weights' work does not), so a few positions estimate a long prefill.
// bench/deepseek_bench.sh generates the models and runs it.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_args.h"
#include "infera/base/cpu.h"
#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/base/timer.h"
#include "infera/model/kv_pool.h"
#include "infera/model/model.h"

using namespace infera;

namespace {

double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// Fills rows [0, ctx) of every layer with values of a fixed pseudo-random stream (about
// unit normal: a sum of uniforms), block by block.
void fill_random(KvPool& kv, const std::vector<int32_t>& table, int64_t ctx) {
  const KvPoolShape& s = kv.shape();
  const int64_t width = s.n_kv_heads * s.head_dim, chunk = 1024;
  std::vector<float> rows(static_cast<size_t>(chunk * width));
  std::vector<int64_t> slots(static_cast<size_t>(chunk));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto uniform = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f;
  };
  for (int64_t layer = 0; layer < s.num_layers; ++layer) {
    for (int64_t p0 = 0; p0 < ctx; p0 += chunk) {
      const int64_t n = std::min(chunk, ctx - p0);
      for (int64_t i = 0; i < n * width; ++i) rows[i] = 1.7f * (uniform() + uniform() + uniform());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = p0 + i;
        slots[i] = static_cast<int64_t>(table[p / s.block_size]) * s.block_size + p % s.block_size;
      }
      // K and V halves from the same rows (their values do not matter for the timing).
      kv.write(layer, rows.data(), rows.data(), width, n, slots.data());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) {
      std::fprintf(
          stderr,
          "usage: deepseek_bench MODEL_DIR [--name NAME] [--ctx 4096,32768,114688] [--steps 3] "
          "[--threads N] [--kv-dtype bf16] [--block 64] [--prefill CHUNK] [--chunk-at CHUNK --ttft 4096,...]\n");
      return 2;
    }
    std::string dir = argv[1], name = dir, kv_dtype = "bf16";
    std::vector<int> contexts = {4096, 32768, 114688};
    int steps = 3, threads = 0, block = 64, prefill = 0, chunk_at = 0;
    std::vector<int> ttft = {4096, 32768, 114688};
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) fail("{} needs a value", a);
        return argv[++i];
      };
      if (a == "--name")
        name = next();
      else if (a == "--ctx")
        contexts = bench::parse_list(next());
      else if (a == "--steps")
        steps = std::stoi(next());
      else if (a == "--threads")
        threads = std::stoi(next());
      else if (a == "--kv-dtype")
        kv_dtype = next();
      else if (a == "--block")
        block = std::stoi(next());
      else if (a == "--prefill")
        prefill = std::stoi(next());
      else if (a == "--chunk-at")
        chunk_at = std::stoi(next());
      else if (a == "--ttft")
        ttft = bench::parse_list(next());
      else
        fail("unknown argument '{}'", a);
    }
    if (threads > 0) set_num_threads(threads);
    LoadOptions options;
    options.max_batch_tokens = std::max({1, prefill, chunk_at});
    std::unique_ptr<Model> model = load_model(dir, options);
    const int64_t vocab = model->config().vocab_size;
    std::vector<float> logits(static_cast<size_t>(vocab));
    // One forward of `n` tokens at positions [pos0, pos0 + n) (logits of the last one):
    // {CPU ms, wall ms}.
    auto run_chunk = [&](KvPool& kv, std::vector<int32_t>& table, int64_t pos0, int64_t n) {
      ForwardBatch batch;
      for (int64_t i = 0; i < n; ++i) batch.tokens.push_back(static_cast<int32_t>((7 + 31 * (pos0 + i)) % vocab));
      SeqChunk s;
      s.n_tokens = static_cast<int32_t>(n);
      s.pos0 = static_cast<int32_t>(pos0);
      s.block_table = table.data();
      s.n_blocks = static_cast<int32_t>(table.size());
      batch.seqs.push_back(s);
      const double c0 = cpu_ms();
      Timer t;
      model->forward(batch, kv, logits.data());
      return std::make_pair(cpu_ms() - c0, t.ms());
    };
    auto make_pool = [&](int64_t positions, std::vector<int32_t>& table) {
      KvPoolShape shape = model->kv_shape(block);
      shape.dtype = parse_kv_cache_dtype(kv_dtype);
      shape.num_blocks = (positions + block - 1) / block;
      table.resize(static_cast<size_t>(shape.num_blocks));
      for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
      return std::make_unique<KvPool>(shape);
    };
    if (prefill > 0) {
      for (const int ctx : contexts) {
        std::vector<int32_t> table;
        auto kv = make_pool(ctx, table);
        double cpu = 0, wall = 0;
        for (int64_t p0 = 0; p0 < ctx; p0 += prefill) {
          const auto [c, w] = run_chunk(*kv, table, p0, std::min<int64_t>(prefill, ctx - p0));
          cpu += c;
          wall += w;
        }
        std::printf(
            "%-9s prefill %7d tokens (chunks of %d)  TTFT %10.1f s CPU (wall %10.1f)  isa %s  threads %d  load %s\n",
            name.c_str(), ctx, prefill, cpu / 1e3, wall / 1e3, isa_name(best_isa()), num_threads(),
            load_average().c_str());
        std::fflush(stdout);
      }
      return 0;
    }
    if (chunk_at > 0) {
      std::vector<std::pair<double, double>> samples;  // (position, best CPU ms)
      for (const int ctx : contexts) {
        std::vector<int32_t> table;
        auto kv = make_pool(ctx + chunk_at, table);
        fill_random(*kv, table, ctx);
        double best = 1e300, best_wall = 1e300;
        for (int step = 0; step < steps; ++step) {
          const auto [c, w] = run_chunk(*kv, table, ctx, chunk_at);
          best = std::min(best, c);
          best_wall = std::min(best_wall, w);
        }
        samples.emplace_back(ctx, best);
        std::printf("%-9s chunk of %d at %7d  %10.1f ms CPU (wall %10.1f)  isa %s  threads %d  load %s\n", name.c_str(),
                    chunk_at, ctx, best, best_wall, isa_name(best_isa()), num_threads(), load_average().c_str());
        std::fflush(stdout);
      }
      std::sort(samples.begin(), samples.end());
      auto at = [&](double p) {  // piecewise linear through the samples, extended at both ends
        if (samples.size() == 1) return samples[0].second;
        size_t j = 1;
        while (j + 1 < samples.size() && samples[j].first < p) ++j;
        const auto [x0, y0] = samples[j - 1];
        const auto [x1, y1] = samples[j];
        return std::max(0.0, y0 + (y1 - y0) * (p - x0) / (x1 - x0));
      };
      for (const int n : ttft) {
        double total = 0;
        for (int64_t p0 = 0; p0 < n; p0 += chunk_at)
          total += at(static_cast<double>(p0)) * std::min<int64_t>(chunk_at, n - p0) / chunk_at;
        std::printf("%-9s TTFT estimate %7d tokens (chunks of %d): %10.1f s CPU\n", name.c_str(), n, chunk_at,
                    total / 1e3);
      }
      return 0;
    }
    for (const int ctx : contexts) {
      KvPoolShape shape = model->kv_shape(block);
      shape.dtype = parse_kv_cache_dtype(kv_dtype);
      shape.num_blocks = (ctx + steps + block - 1) / block;
      KvPool kv(shape);
      std::vector<int32_t> table(static_cast<size_t>(shape.num_blocks));
      for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
      fill_random(kv, table, ctx);
      std::vector<double> ms, cpu;
      for (int step = 0; step < steps; ++step) {
        ForwardBatch batch;
        batch.tokens = {static_cast<int32_t>((7 + 31 * step) % vocab)};
        SeqChunk s;
        s.n_tokens = 1;
        s.pos0 = ctx + step;
        s.block_table = table.data();
        s.n_blocks = static_cast<int32_t>(table.size());
        batch.seqs.push_back(s);
        const double c0 = cpu_ms();
        Timer t;
        model->forward(batch, kv, logits.data());
        ms.push_back(t.ms());
        cpu.push_back(cpu_ms() - c0);
      }
      std::sort(ms.begin(), ms.end());
      std::sort(cpu.begin(), cpu.end());
      std::printf(
          "%-9s ctx %7d  KV %6lld B/token  decode %9.2f ms/token CPU (wall %9.2f)  isa %s  threads %d  load %s\n",
          name.c_str(), ctx, static_cast<long long>(shape.bytes_per_token()), cpu.front(), ms.front(),
          isa_name(best_isa()), num_threads(), load_average().c_str());
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepseek_bench: %s\n", e.what());
    return 1;
  }
}
