// Speculative decoding benchmark (printed, not a test): decode tokens/s of one or more
// greedy sequences without speculation and with n-gram or MTP drafts of several lengths,
// with the acceptance rate, tokens per decode step, acceptance by draft position and a
// check that every run emitted exactly the tokens of the plain run.
//
//   spec_bench MODEL_DIR --method ngram|mtp [--k 1,2,4] [--gen 64] [--seqs 1] [--threads N]
//              [--text "prompt"] [--self-repeat] [--prompt 24] [--oracle P] [--name NAME]
//
// Prompts: --text is tokenized with the model's tokenizer; otherwise random token ids
// (--prompt of them). --self-repeat first decodes the prompt P plainly into G and then
// benchmarks the prompt P + G + P: the situation prompt lookup is made for (the answer
// repeats text already in the context: code edits, quoting, summaries), reproducible with
// a random-weight model, whose own continuation is the only text it "knows".
// --oracle P drafts the plain run's own continuation, each token right with probability P
// (deterministic pattern): the speedup the verify machinery gives at a known acceptance on
// this model, independent of any drafter (one sequence).
// bench/spec_bench.sh builds it and runs the standard set.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/base/timer.h"
#include "infera/runtime/engine.h"
#include "infera/tokenizer/tokenizer.h"

using namespace infera;

namespace {

using bench::parse_list;

struct Result {
  std::vector<std::vector<int32_t>> tokens;  // per sequence
  double decode_s = 0;                       // first token of the first sequence -> last token
  int64_t decode_tokens = 0;                 // tokens after each sequence's first
  EngineStats stats;
};

Result run(Model& model, SpeculativeMethod method, int32_t k, const std::vector<int32_t>& prompt, int32_t seqs,
           int32_t gen, SpeculativeConfig::Drafter drafter = {}) {
  EngineConfig c;
  c.kv_cache_bytes = int64_t{256} << 20;
  c.max_batch_tokens = 512;
  c.max_num_seqs = std::max(seqs, 1);
  c.prefill_chunk = 512;
  c.enable_prefix_cache = false;  // every sequence computes its prompt: same work in every run
  c.speculative.method = method;
  c.speculative.num_draft_tokens = k;
  c.speculative.drafter = std::move(drafter);
  EngineCore core(model, c);
  Result r;
  r.tokens.resize(seqs);
  Timer timer;
  double first = -1;
  for (int32_t s = 0; s < seqs; ++s) {
    Request req;
    req.prompt_ids = prompt;
    req.max_tokens = gen;
    req.ignore_eos = true;
    core.add_request(req, [&, s](const Event& e) {
      if (e.is_final()) return;
      if (first < 0) first = timer.seconds();
      r.tokens[s].push_back(e.token);
    });
  }
  while (core.has_work()) core.step();
  r.decode_s = timer.seconds() - first;
  for (const auto& t : r.tokens) r.decode_tokens += static_cast<int64_t>(t.size()) - 1;
  r.stats = core.stats();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) {
      std::fprintf(stderr,
                   "usage: spec_bench MODEL_DIR --method ngram|mtp [--k 1,2,4] [--gen 64] [--seqs 1] [--threads N]\n"
                   "                  [--text PROMPT] [--self-repeat] [--prompt 24] [--name NAME]\n");
      return 2;
    }
    const std::string dir = argv[1];
    std::string name = dir, method_name = "ngram", text;
    std::vector<int> ks = {1, 2, 4};
    int32_t gen = 64, seqs = 1, threads = 0, prompt_len = 24;
    bool self_repeat = false;
    double oracle = -1;  // --oracle P: drafts = the plain continuation, each right with probability P
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) fail("{} needs a value", a);
        return argv[++i];
      };
      if (a == "--method") method_name = next();
      else if (a == "--k") ks = parse_list(next());
      else if (a == "--gen") gen = std::stoi(next());
      else if (a == "--seqs") seqs = std::stoi(next());
      else if (a == "--threads") threads = std::stoi(next());
      else if (a == "--text") text = next();
      else if (a == "--prompt") prompt_len = std::stoi(next());
      else if (a == "--self-repeat") self_repeat = true;
      else if (a == "--oracle") oracle = std::stod(next());
      else if (a == "--name") name = next();
      else fail("unknown option {}", a);
    }
    set_num_threads(threads);
    const SpeculativeMethod method = parse_speculative_method(method_name, "--method");
    LoadOptions lo;
    lo.max_batch_tokens = 512;
    auto model = load_model(dir, lo);
    const int32_t vocab = model->config().vocab_size;
    std::vector<int32_t> prompt;
    if (!text.empty()) {
      prompt = Tokenizer::load(dir).encode(text, true);
    } else {
      std::mt19937 rng(42);
      std::uniform_int_distribution<int32_t> d(3, vocab - 1);
      for (int32_t i = 0; i < prompt_len; ++i) prompt.push_back(d(rng));
    }
    if (self_repeat) {
      const Result g = run(*model, SpeculativeMethod::kNone, 0, prompt, 1, gen);
      std::vector<int32_t> p = prompt;
      p.insert(p.end(), g.tokens[0].begin(), g.tokens[0].end());
      p.insert(p.end(), prompt.begin(), prompt.end());
      prompt = std::move(p);
    }
    if (oracle >= 0) method_name = fmt::format("oracle drafts right with p={:.2f}", oracle);
    std::printf("== %s: %s, prompt %zu tokens%s, %d sequence(s) x %d generated tokens, %d threads ==\n", name.c_str(),
                method_name.c_str(), prompt.size(), self_repeat ? " (P + own continuation + P)" : "", seqs, gen,
                num_threads());
    const Result plain = run(*model, SpeculativeMethod::kNone, 0, prompt, seqs, gen);
    const double plain_tps = plain.decode_tokens / plain.decode_s;
    std::printf("%-7s %11s %8s %8s %9s %9s %10s  %s\n", "drafts", "decode t/s", "speedup", "drafted", "accepted",
                "tok/step", "identical", "acceptance by position");
    std::printf("%-7s %11.2f %8s %8s %9s %9.2f %10s\n", "none", plain_tps, "1.00x", "-", "-", 1.0, "-");
    // Oracle drafts: what any drafter with a given per-token accuracy would give, on the
    // model at hand (the speedup curve of the verify machinery, independent of a drafter).
    SpeculativeConfig::Drafter drafter;
    if (oracle >= 0) {
      drafter = [&](std::span<const int32_t> history, int32_t max_draft, std::vector<int32_t>& out) {
        const size_t done = history.size() - prompt.size();
        const auto& cont = plain.tokens[0];
        for (int32_t j = 0; j < max_draft && done + j < cont.size(); ++j) {
          // Deterministic per position, so every k sees the same right/wrong pattern.
          const uint64_t h = (done + j + 1) * 0x9E3779B97F4A7C15ull;
          const bool right = static_cast<double>(h >> 11) * 0x1.0p-53 < oracle;
          out.push_back(right ? cont[done + j] : (cont[done + j] + 1) % vocab);
        }
      };
    }
    for (int k : ks) {
      const Result r = oracle >= 0 ? run(*model, SpeculativeMethod::kCustom, k, prompt, seqs, gen, drafter)
                                   : run(*model, method, k, prompt, seqs, gen);
      const double tps = r.decode_tokens / r.decode_s;
      std::string positions;
      for (size_t i = 0; i < r.stats.spec_drafted_per_pos.size(); ++i) {
        const auto d = r.stats.spec_drafted_per_pos[i];
        positions += fmt::format(" {:.2f}", d > 0 ? double(r.stats.spec_accepted_per_pos[i]) / double(d) : 0.0);
      }
      std::printf("%-7d %11.2f %7.2fx %8lld %8.1f%% %9.2f %10s %s\n", k, tps, tps / plain_tps,
                  static_cast<long long>(r.stats.spec_drafted), 100.0 * r.stats.spec_acceptance_rate(),
                  r.stats.spec_tokens_per_step(),
                  r.tokens == plain.tokens ? "yes" : "NO", positions.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
