// Log-probabilities (Request::logprobs): token_logprobs against a plain log-softmax and
// full sort written here, and the engine's numbers against the logits of an independent
// path (SequenceRunner, one sequence, no scheduler) on the trained stories260K, for
// greedy, sampled-with-penalties and speculative runs (n-gram on stories260K; MTP and
// oracle drafts with planted errors on a Gated DeltaNet hybrid).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/runtime/engine.h"
#include "infera/runtime/sequence_runner.h"
#include "test_models.h"

using namespace infera;

namespace {

Model& stories() { return testing_support::stories_model(); }

// log_softmax in long double, the straightforward way.
std::vector<double> reference_log_softmax(const float* logits, int32_t n) {
  long double max_l = logits[0];
  for (int32_t i = 1; i < n; ++i) max_l = std::max<long double>(max_l, logits[i]);
  long double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<long double>(logits[i]) - max_l);
  std::vector<double> out(n);
  for (int32_t i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i] - max_l - std::log(sum));
  return out;
}

// Checks `lp` (for `token`, asking top_n) against the reference log-probabilities.
void expect_matches(const TokenLogprobs& lp, const std::vector<double>& ref, int32_t token, int32_t top_n, double tol,
                    const std::string& what) {
  EXPECT_EQ(lp.sampled.token, token) << what;
  EXPECT_NEAR(lp.sampled.logprob, ref[token], tol) << what;
  // Rank: 1 + the tokens more likely than it (the reference keeps the logits' order).
  EXPECT_EQ(lp.sampled_rank, 1 + std::count_if(ref.begin(), ref.end(), [&](double v) { return v > ref[token]; }))
      << what;
  EXPECT_LE(lp.sampled.logprob, 0.0f) << what;
  ASSERT_EQ(lp.top.size(), static_cast<size_t>(top_n)) << what;
  // The reference ranking: by log-probability, ties by lower id.
  std::vector<int32_t> order(ref.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
  double mass = 0;
  for (int32_t i = 0; i < top_n; ++i) {
    const TokenLogprob& t = lp.top[i];
    EXPECT_NEAR(t.logprob, ref[t.token], tol) << what << " top " << i;
    // Same rank as the reference, up to near-ties between neighbours.
    EXPECT_NEAR(ref[t.token], ref[order[i]], tol) << what << " top " << i;
    if (i > 0) {
      EXPECT_GE(lp.top[i - 1].logprob, t.logprob) << what << " top list not sorted at " << i;
    }
    if (t.token == token) {
      EXPECT_EQ(t.logprob, lp.sampled.logprob) << what;
    }
    mass += std::exp(static_cast<double>(t.logprob));
  }
  EXPECT_LE(mass, 1.0 + 1e-5) << what;
  // The sampled token belongs in the top list exactly when its log-probability reaches the last entry's.
  if (top_n > 0 && lp.sampled.logprob > lp.top.back().logprob) {
    EXPECT_TRUE(std::any_of(lp.top.begin(), lp.top.end(), [&](const TokenLogprob& t) { return t.token == token; }))
        << what;
  }
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;  // one per token event
};

// Runs the prompts through one EngineCore (batched) and collects each one's events.
std::vector<Generated> run_engine(Model& model, const EngineConfig& config,
                                  const std::vector<std::vector<int32_t>>& prompts, int32_t gen,
                                  const SamplingParams& sampling, bool logprobs, int32_t top_n,
                                  EngineStats* stats = nullptr) {
  EngineCore core(model, config);
  std::map<RequestId, Generated> out;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt_ids = prompts[i];
    r.max_tokens = gen;
    r.ignore_eos = true;
    r.sampling = sampling;
    r.sampling.seed = sampling.seed + i;
    r.logprobs = logprobs;
    r.top_logprobs = top_n;
    ids.push_back(core.add_request(r, [&](const Event& e) {
      if (e.is_final()) {
        EXPECT_FALSE(e.logprobs.has_value()) << "the final event carries no token";
        return;
      }
      Generated& g = out[e.id];
      g.tokens.push_back(e.token);
      EXPECT_EQ(e.logprobs.has_value(), logprobs);
      if (e.logprobs) g.logprobs.push_back(*e.logprobs);
    }));
  }
  while (core.has_work()) core.step();
  if (stats) *stats = core.stats();
  std::vector<Generated> result;
  for (RequestId id : ids) result.push_back(out[id]);
  return result;
}

// stories260K run alone (SequenceRunner: one sequence, no scheduler): the independent side.
struct LoneRunner {
  KvPool kv{[] {
    KvPoolShape shape = stories().kv_shape(16);
    shape.num_blocks = 64;
    return shape;
  }()};
  BlockAllocator blocks{64};
  SequenceRunner runner{stories(), kv, blocks, 512};
};

// Every generated token's numbers against SequenceRunner's logits at its position.
void expect_matches_runner(const std::vector<int32_t>& prompt, const Generated& g, int32_t top_n,
                           const std::string& what) {
  LoneRunner lone;
  SequenceRunner& runner = lone.runner;
  const int32_t vocab = stories().config().vocab_size;
  ASSERT_EQ(g.logprobs.size(), g.tokens.size()) << what;
  const float* logits = runner.feed(prompt);
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    const std::vector<double> ref = reference_log_softmax(logits, vocab);
    // Batched forwards sum in a different order than the lone runner: float rounding only.
    expect_matches(g.logprobs[i], ref, g.tokens[i], top_n, 2e-4, what + " token " + std::to_string(i));
    logits = runner.feed(std::span<const int32_t>(&g.tokens[i], 1));
  }
}

EngineConfig config(SpeculativeMethod method = SpeculativeMethod::kNone, int32_t k = 0) {
  EngineConfig c;
  c.block_size = 16;
  c.max_batch_tokens = 128;
  c.max_num_seqs = 4;
  c.prefill_chunk = 32;
  c.kv_cache_bytes = 32 << 20;
  c.speculative.method = method;
  c.speculative.num_draft_tokens = k;
  return c;
}

std::vector<std::vector<int32_t>> prompts(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(259, 511);
  std::vector<std::vector<int32_t>> out;
  for (int32_t n : {4, 19, 9}) {
    std::vector<int32_t> p{1};
    // A repeated phrase gives prompt lookup (n-gram drafts) something to find.
    std::vector<int32_t> phrase;
    for (int32_t i = 0; i < n; ++i) phrase.push_back(d(rng));
    for (int rep = 0; rep < 3; ++rep) p.insert(p.end(), phrase.begin(), phrase.end());
    out.push_back(p);
  }
  return out;
}

struct OneThread {  // the model is tiny: threads would only add start-up and spinning
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
};

}  // namespace

TEST(TokenLogprobs, MatchLogSoftmaxAndSortedTopList) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int32_t vocab : {1, 7, 1000}) {
    std::vector<float> logits(vocab);
    for (float& l : logits) l = normal(rng);
    if (vocab > 10) logits[5] = logits[9] = 30.0f;  // a tie at the top: lower id first
    const std::vector<double> ref = reference_log_softmax(logits.data(), vocab);
    for (int32_t top_n : {0, 1, std::min(vocab, 5), std::min(vocab, kMaxTopLogprobs)}) {
      for (int32_t token : {0, vocab - 1, argmax(logits.data(), vocab)}) {
        std::vector<float> work = logits;  // token_logprobs uses the row as workspace
        const TokenLogprobs lp = token_logprobs(work.data(), vocab, token, top_n);
        expect_matches(lp, ref, token, top_n, 1e-5, "vocab " + std::to_string(vocab));
        if (vocab > 10 && top_n >= 2) {
          EXPECT_EQ(lp.top[0].token, 5);
          EXPECT_EQ(lp.top[1].token, 9);
        }
      }
    }
  }
  // Extreme logits stay finite where they should (no overflow in the normalizer).
  std::vector<float> wide = {1e4f, -1e4f, 0.0f};
  const TokenLogprobs lp = token_logprobs(wide.data(), 3, 1, 3);
  EXPECT_EQ(lp.top[0].token, 0);
  EXPECT_NEAR(lp.top[0].logprob, 0.0f, 1e-6);
  EXPECT_EQ(lp.top[1].token, 2);
  EXPECT_NEAR(lp.top[1].logprob, -1e4f, 1e-2);
  // Far in the tail, where the probability underflows to 0, the value is still exact.
  EXPECT_NEAR(lp.sampled.logprob, -2e4f, 1e-2);
  EXPECT_EQ(lp.top[2].logprob, lp.sampled.logprob);
}

TEST(EngineLogprobs, GreedyMatchesTheModelsLogSoftmax) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  OneThread one;
  const auto ps = prompts(11);
  const std::vector<Generated> out = run_engine(stories(), config(), ps, 20, SamplingParams{}, true, 5);
  for (size_t i = 0; i < ps.size(); ++i) {
    expect_matches_runner(ps[i], out[i], 5, "prompt " + std::to_string(i));
    // Greedy: the emitted token is the most likely one.
    for (const TokenLogprobs& lp : out[i].logprobs) EXPECT_EQ(lp.top[0].token, lp.sampled.token);
  }
}

TEST(EngineLogprobs, SampledWithPenaltiesReportsTheRawDistribution) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  OneThread one;
  const auto ps = prompts(12);
  SamplingParams s;
  s.temperature = 0.8f;
  s.top_k = 40;
  s.repetition_penalty = 1.3f;
  s.presence_penalty = 0.5f;
  s.seed = 77;
  const std::vector<Generated> out = run_engine(stories(), config(), ps, 24, s, true, kMaxTopLogprobs);
  for (size_t i = 0; i < ps.size(); ++i)
    expect_matches_runner(ps[i], out[i], kMaxTopLogprobs, "prompt " + std::to_string(i));
  // Asking for logprobs does not change what is sampled.
  const std::vector<Generated> plain = run_engine(stories(), config(), ps, 24, s, false, 0);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(plain[i].tokens, out[i].tokens);
}

TEST(EngineLogprobs, SpeculativeVerifyGivesThePlainRunsLogprobs) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  OneThread one;
  const auto ps = prompts(13);
  const std::vector<Generated> plain = run_engine(stories(), config(), ps, 40, SamplingParams{}, true, 3);
  EngineStats stats;
  const std::vector<Generated> spec =
      run_engine(stories(), config(SpeculativeMethod::kNgram, 4), ps, 40, SamplingParams{}, true, 3, &stats);
  // Drafts were both accepted (tokens from verify rows) and rejected (replacements).
  EXPECT_GT(stats.spec_accepted, 0);
  EXPECT_LT(stats.spec_accepted, stats.spec_drafted);
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(spec[i].tokens, plain[i].tokens) << "prompt " << i;
    ASSERT_EQ(spec[i].logprobs.size(), plain[i].logprobs.size());
    for (size_t t = 0; t < plain[i].logprobs.size(); ++t) {
      const TokenLogprobs& a = spec[i].logprobs[t];
      const TokenLogprobs& b = plain[i].logprobs[t];
      EXPECT_NEAR(a.sampled.logprob, b.sampled.logprob, 2e-4) << "prompt " << i << " token " << t;
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t k = 0; k < a.top.size(); ++k) EXPECT_NEAR(a.top[k].logprob, b.top[k].logprob, 2e-4);
    }
    expect_matches_runner(ps[i], spec[i], 3, "speculative prompt " + std::to_string(i));
  }
}

TEST(EngineLogprobs, SpeculativeOnTheHybridGivesThePlainRunsLogprobs) {
  // On a Gated DeltaNet hybrid, where a rejection also restores the recurrent state and
  // re-feeds the kept tokens: MTP drafts (the model's own head; random, so mostly
  // rejected) and drafts of an oracle that knows the plain continuation but gets chosen
  // positions wrong (so drafts are accepted, partly accepted and rejected).
  OneThread one;
  Model& model = testing_support::hybrid_model();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> d(3, 290);
  std::vector<std::vector<int32_t>> ps;
  for (int32_t n : {6, 21, 13}) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < n; ++i) p.push_back(d(rng));
    ps.push_back(p);
  }
  const int32_t gen = 24;
  const std::vector<Generated> plain = run_engine(model, config(), ps, gen, SamplingParams{}, true, 4);
  EngineConfig oracle = config(SpeculativeMethod::kCustom, 3);
  std::vector<std::vector<int32_t>> continuations;
  for (const Generated& g : plain) continuations.push_back(g.tokens);
  oracle.speculative.drafter =
      testing_support::oracle_drafter(ps, continuations, [](size_t at) { return at % 4 == 2; });
  for (const auto& [what, c] :
       {std::pair{std::string("mtp"), config(SpeculativeMethod::kMtp, 2)}, std::pair{std::string("oracle"), oracle}}) {
    EngineStats stats;
    const std::vector<Generated> spec = run_engine(model, c, ps, gen, SamplingParams{}, true, 4, &stats);
    EXPECT_GT(stats.spec_drafted, 10) << what;
    EXPECT_LT(stats.spec_accepted, stats.spec_drafted) << what;
    if (what == "oracle") {
      EXPECT_GT(stats.spec_accepted, 10);
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      ASSERT_EQ(spec[i].tokens, plain[i].tokens) << what << " prompt " << i;
      ASSERT_EQ(spec[i].logprobs.size(), plain[i].logprobs.size());
      for (size_t t = 0; t < plain[i].logprobs.size(); ++t) {
        const TokenLogprobs& a = spec[i].logprobs[t];
        const TokenLogprobs& b = plain[i].logprobs[t];
        EXPECT_NEAR(a.sampled.logprob, b.sampled.logprob, 2e-4) << what << " prompt " << i << " token " << t;
        ASSERT_EQ(a.top.size(), 4u);
        for (size_t j = 0; j < a.top.size(); ++j) EXPECT_NEAR(a.top[j].logprob, b.top[j].logprob, 2e-4);
        EXPECT_EQ(a.top[0].token, a.sampled.token);  // greedy
      }
    }
  }
}

TEST(EngineLogprobs, RequestsAreValidated) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  EngineCore core(stories(), config());
  Request r;
  r.prompt_ids = {1, 300};
  r.max_tokens = 2;
  r.logprobs = true;
  r.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(core.validate(r), Error);
  r.top_logprobs = -1;
  EXPECT_THROW(core.validate(r), Error);
  r.top_logprobs = 2;
  r.logprobs = false;
  EXPECT_THROW(core.validate(r), Error);
  r.logprobs = true;
  EXPECT_NO_THROW(core.validate(r));
}

// --- Prompt log-probabilities (Request::prompt_logprobs) ---------------------------------

namespace {

struct Scored {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> prompt;  // Event::prompt_logprobs
  int32_t events_with_prompt = 0;  // exactly one per request
  Usage usage;
  FinishReason finish = FinishReason::kNone;
};

// Runs the requests through `core` together and collects each one's events.
std::vector<Scored> run_scoring(EngineCore& core, const std::vector<Request>& requests) {
  std::map<RequestId, Scored> out;
  std::vector<RequestId> ids;
  for (const Request& r : requests) {
    ids.push_back(core.add_request(r, [&out](const Event& e) {
      Scored& s = out[e.id];
      if (e.prompt_logprobs) {
        ++s.events_with_prompt;
        s.prompt = *e.prompt_logprobs;
      }
      if (e.is_final()) {
        s.usage = e.usage;
        s.finish = e.finish;
      } else {
        s.tokens.push_back(e.token);
      }
    }));
  }
  while (core.has_work()) core.step();
  std::vector<Scored> result;
  for (RequestId id : ids) result.push_back(out[id]);
  return result;
}

Request scoring_request(const std::vector<int32_t>& prompt, int32_t gen, int32_t top_n) {
  Request r;
  r.prompt_ids = prompt;
  r.max_tokens = gen;
  r.ignore_eos = true;
  r.prompt_logprobs = top_n;
  return r;
}

std::vector<int32_t> random_prompt(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(259, 511);
  std::vector<int32_t> p{1};
  while (static_cast<int32_t>(p.size()) < n) p.push_back(d(rng));
  return p;
}

// Each prompt token's numbers against SequenceRunner's row at the position before it
// (one forward over the whole prompt with every row's logits).
void expect_prompt_matches_runner(const std::vector<int32_t>& prompt, const Scored& s, int32_t top_n,
                                  const std::string& what) {
  LoneRunner lone;
  const int32_t vocab = stories().config().vocab_size;
  EXPECT_EQ(s.events_with_prompt, 1) << what;
  ASSERT_EQ(s.prompt.size() + 1, prompt.size()) << what;
  const float* rows = lone.runner.feed(prompt, /*all_logits=*/true);
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const std::vector<double> ref = reference_log_softmax(rows + p * vocab, vocab);
    expect_matches(s.prompt[p], ref, prompt[p + 1], top_n, 2e-4, what + " prompt token " + std::to_string(p + 1));
  }
}

}  // namespace

TEST(EnginePromptLogprobs, EveryPromptTokenMatchesTheRunnersRows) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  // Prompts shorter than a chunk, over several prefill_chunk (32) chunks, and, with a
  // larger prefill_chunk, over several kPromptLogprobsChunk chunks; batched together, with
  // a request that does not score its prompt in the same steps.
  OneThread one;
  for (int32_t chunk : {32, 512}) {
    EngineConfig c = config();
    c.prefill_chunk = chunk;
    c.max_batch_tokens = chunk;
    const std::vector<std::vector<int32_t>> ps = {random_prompt(5, 1), random_prompt(77, 2), random_prompt(300, 3)};
    std::vector<Request> rs;
    for (size_t i = 0; i < ps.size(); ++i) rs.push_back(scoring_request(ps[i], 6, static_cast<int32_t>(i) * 2));
    Request plain = scoring_request(ps[1], 6, -1);
    rs.push_back(plain);
    EngineCore core(stories(), c);
    const std::vector<Scored> out = run_scoring(core, rs);
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string what = "chunk " + std::to_string(chunk) + " prompt " + std::to_string(i);
      expect_prompt_matches_runner(ps[i], out[i], static_cast<int32_t>(i) * 2, what);
      EXPECT_EQ(out[i].tokens.size(), 6u) << what;
      EXPECT_EQ(out[i].finish, FinishReason::kLength) << what;
    }
    // Scoring the prompt does not change the generated tokens.
    EXPECT_EQ(out[1].tokens, out[3].tokens);
    EXPECT_EQ(out[3].events_with_prompt, 0);
  }
}

TEST(EnginePromptLogprobs, MaxTokensZeroScoresThePromptOnly) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  OneThread one;
  EngineCore core(stories(), config());
  const std::vector<int32_t> prompt = random_prompt(40, 4);
  const std::vector<Scored> out = run_scoring(core, {scoring_request(prompt, 0, 3), scoring_request({1}, 0, 3)});
  EXPECT_TRUE(out[0].tokens.empty());
  EXPECT_EQ(out[0].finish, FinishReason::kLength);
  EXPECT_EQ(out[0].usage.completion_tokens, 0);
  EXPECT_EQ(out[0].usage.prompt_tokens, 40);
  expect_prompt_matches_runner(prompt, out[0], 3, "max_tokens 0");
  // A one-token prompt has nothing to score: an empty list, still delivered once.
  EXPECT_EQ(out[1].events_with_prompt, 1);
  EXPECT_TRUE(out[1].prompt.empty());
  EXPECT_TRUE(out[1].tokens.empty());
}

TEST(EnginePromptLogprobs, ScoringBypassesThePrefixCacheAndStillFillsIt) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  OneThread one;
  EngineConfig c = config();
  c.enable_prefix_cache = true;
  EngineCore core(stories(), c);
  const std::vector<int32_t> prompt = random_prompt(70, 5);
  // 1. Fills the cache. 2. Scores the same prompt: computed in full (no cached tokens),
  // the same numbers as a cold run. 3. A plain request hits the cache again.
  const Scored first = run_scoring(core, {scoring_request(prompt, 2, -1)})[0];
  EXPECT_EQ(first.usage.cached_tokens, 0);
  const Scored scored = run_scoring(core, {scoring_request(prompt, 2, 2)})[0];
  EXPECT_EQ(scored.usage.cached_tokens, 0);
  expect_prompt_matches_runner(prompt, scored, 2, "after a cached run");
  EXPECT_EQ(scored.tokens, first.tokens);
  const Scored again = run_scoring(core, {scoring_request(prompt, 2, -1)})[0];
  EXPECT_EQ(again.usage.cached_tokens, 64);  // the prompt's full blocks but its last token's
  EXPECT_EQ(again.tokens, first.tokens);
}

TEST(EnginePromptLogprobs, PreemptedSequencesScoreEachTokenOnce) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  // A KV cache too small for the batch: sequences are preempted (some mid-prompt) and
  // recomputed; each prompt token is still scored once, with the same numbers.
  OneThread one;
  EngineConfig c = config();
  c.prefill_chunk = 16;
  c.max_batch_tokens = 48;
  c.kv_cache_bytes = stories().kv_shape(c.block_size).bytes_per_block() * 14;
  EngineCore core(stories(), c);
  std::vector<std::vector<int32_t>> ps;
  std::vector<Request> rs;
  for (uint32_t i = 0; i < 3; ++i) {
    ps.push_back(random_prompt(60 + 17 * static_cast<int32_t>(i), 10 + i));
    rs.push_back(scoring_request(ps.back(), 70, 1));
  }
  const std::vector<Scored> out = run_scoring(core, rs);
  EXPECT_GT(core.stats().preemptions, 0);
  for (size_t i = 0; i < ps.size(); ++i) {
    expect_prompt_matches_runner(ps[i], out[i], 1, "preempted prompt " + std::to_string(i));
    EXPECT_EQ(out[i].tokens.size(), 70u);
  }
}

TEST(EnginePromptLogprobs, AStepReturnsAtMostOneScoringChunkOfRows) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  // Three prompts scored together with room for all of them in one step: the logits rows of
  // a step (one per scoring token) stay within kPromptLogprobsChunk over all sequences, so
  // the 900 rows take at least ceil(900 / 128) forwards; the numbers are unaffected.
  OneThread one;
  EngineConfig c = config();
  c.prefill_chunk = 512;
  c.max_batch_tokens = 1024;
  EngineCore core(stories(), c);
  std::vector<std::vector<int32_t>> ps;
  std::vector<Request> rs;
  for (uint32_t i = 0; i < 3; ++i) {
    ps.push_back(random_prompt(300, 20 + i));
    rs.push_back(scoring_request(ps.back(), 0, 2));
  }
  const std::vector<Scored> out = run_scoring(core, rs);
  EXPECT_GE(core.stats().steps, (900 + kPromptLogprobsChunk - 1) / kPromptLogprobsChunk);
  for (size_t i = 0; i < ps.size(); ++i) expect_prompt_matches_runner(ps[i], out[i], 2, "prompt " + std::to_string(i));
}

TEST(EnginePromptLogprobs, RequestsAreValidated) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  EngineCore core(stories(), config());
  Request r = scoring_request({1, 300}, 0, kMaxTopLogprobs + 1);
  EXPECT_THROW(core.validate(r), Error);
  r.prompt_logprobs = -2;
  EXPECT_THROW(core.validate(r), Error);
  r.prompt_logprobs = kMaxTopLogprobs;
  EXPECT_NO_THROW(core.validate(r));
  r.max_tokens = -2;
  EXPECT_THROW(core.validate(r), Error);
  // Scoring only (max_tokens 0), a prompt may fill the whole context; generating may not.
  EngineConfig small = config();
  small.max_context = 64;
  EngineCore tight(stories(), small);
  Request full = scoring_request(random_prompt(64, 7), 0, 1);
  EXPECT_NO_THROW(tight.validate(full));
  full.max_tokens = 1;
  EXPECT_THROW(tight.validate(full), Error);
}
