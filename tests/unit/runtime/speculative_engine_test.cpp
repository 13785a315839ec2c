// Speculative decoding through the engine. Greedy runs with n-gram or MTP drafts must emit
// exactly the tokens of the same engine without speculation, batched, staggered and under
// KV pressure, while drafts are both accepted and rejected (so rollback of attention K/V,
// of the hybrid's recurrent state and of the MTP head's cache is exercised: a rejected
// draft that left a trace would change a later token). Sampled runs must keep the token
// distribution (frequency check against the non-speculative engine).
//
// Models: the trained stories260K (llama, attention only) and a tiny random qwen3_5_moe
// with an MTP head from tools/gen_model.py (Gated DeltaNet + attention + MoE).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <span>

#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/runtime/engine.h"
#include "infera/tokenizer/tokenizer.h"
#include "test_models.h"

using namespace infera;

namespace {

namespace fs = std::filesystem;

Model& stories() { return testing_support::stories_model(); }
Model& hybrid() { return testing_support::hybrid_model(); }

std::vector<int32_t> random_tokens(std::mt19937& rng, int32_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> p;
  while (static_cast<int32_t>(p.size()) < n) p.push_back(d(rng));
  return p;
}

// A prompt that repeats a phrase: prompt lookup then has something to find.
std::vector<int32_t> repetitive(std::mt19937& rng, int32_t phrase, int32_t times, int32_t lo, int32_t hi) {
  const std::vector<int32_t> p = random_tokens(rng, phrase, lo, hi);
  std::vector<int32_t> out;
  for (int32_t i = 0; i < times; ++i) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// These models' steps are too small to share between threads (OpenMP start-up and
// spinning dominate on a loaded machine): one thread for the test's duration.
// One sequence's chunk of `tokens` at pos0 over `blocks`, as the engine batches it, with
// its recurrent state bound by `memory` (sequence id 1).
ForwardBatch one_chunk(std::vector<int32_t> tokens, int32_t pos0, const std::vector<int32_t>& blocks, bool all_logits,
                       RecurrentMemory& memory) {
  ForwardBatch b;
  b.tokens = std::move(tokens);
  SeqChunk c;
  c.n_tokens = static_cast<int32_t>(b.tokens.size());
  c.pos0 = pos0;
  c.block_table = blocks.data();
  c.n_blocks = static_cast<int32_t>(blocks.size());
  c.all_logits = all_logits;
  memory.bind(1, blocks, c);
  b.seqs.push_back(c);
  return b;
}

struct OneThread {
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per prompt, in submission order
  EngineStats stats;
};

// Adds the first three prompts, then one more every second step (staggered arrivals).
Outcome run_engine(Model& model, EngineConfig config, const std::vector<std::vector<int32_t>>& prompts, int32_t gen,
                   const SamplingParams& sampling = {}) {
  EngineCore core(model, config);
  std::map<RequestId, std::vector<int32_t>> out;
  std::vector<RequestId> ids;
  auto add = [&](size_t i) {
    Request r;
    r.prompt_ids = prompts[i];
    r.max_tokens = gen;
    r.ignore_eos = true;
    r.sampling = sampling;
    r.sampling.seed = sampling.seed + i;
    ids.push_back(core.add_request(r, [&](const Event& e) {
      if (!e.is_final()) out[e.id].push_back(e.token);
    }));
  };
  size_t next = 0;
  for (; next < std::min<size_t>(3, prompts.size()); ++next) add(next);
  int steps = 0;
  while (core.has_work()) {
    core.step();
    if (next < prompts.size() && ++steps % 2 == 0) add(next++);
  }
  Outcome run;
  for (RequestId id : ids) run.tokens.push_back(out[id]);
  run.stats = core.stats();
  return run;
}

EngineConfig config_for(SpeculativeMethod method, int32_t k) {
  EngineConfig c;
  c.block_size = 16;
  c.max_batch_tokens = 128;
  c.max_num_seqs = 4;
  c.prefill_chunk = 32;
  c.kv_cache_bytes = 64 << 20;
  c.speculative.method = method;
  c.speculative.num_draft_tokens = k;
  return c;
}

int64_t block_bytes(Model& model) {
  const KvPoolShape s = model.kv_shape(16);
  return s.num_layers * 2 * 16 * s.n_kv_heads * s.head_dim * static_cast<int64_t>(sizeof(float));
}

void expect_same(const Outcome& spec, const Outcome& plain, const std::string& what) {
  ASSERT_EQ(spec.tokens.size(), plain.tokens.size());
  for (size_t i = 0; i < plain.tokens.size(); ++i) {
    EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << what << ": prompt " << i;
  }
}

void expect_rejections_and_acceptances(const EngineStats& s, const std::string& what) {
  EXPECT_GT(s.spec_drafted, 0) << what;
  EXPECT_GT(s.spec_accepted, 0) << what;
  EXPECT_LT(s.spec_accepted, s.spec_drafted) << what << ": no draft was rejected, rollback untested";
  int64_t per_pos = 0;
  for (int64_t a : s.spec_accepted_per_pos) per_pos += a;
  EXPECT_EQ(per_pos, s.spec_accepted) << what;
  for (size_t i = 1; i < s.spec_accepted_per_pos.size(); ++i) {
    // Draft i is only accepted after draft i-1 was.
    EXPECT_LE(s.spec_accepted_per_pos[i], s.spec_accepted_per_pos[i - 1]) << what;
  }
}

}  // namespace

TEST(SpeculativeEngine, NgramGreedyEqualsPlainOnStories260K) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  OneThread one;
  std::mt19937 rng(21);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> p{1};
    const auto r = repetitive(rng, 7 + 3 * i, 4, 259, 511);
    p.insert(p.end(), r.begin(), r.end());
    prompts.push_back(p);
  }
  for (int32_t n : {5, 40, 17}) {
    std::vector<int32_t> p{1};
    const auto r = random_tokens(rng, n, 259, 511);
    p.insert(p.end(), r.begin(), r.end());
    prompts.push_back(p);
  }
  const int32_t gen = 48;
  const Outcome plain = run_engine(stories(), config_for(SpeculativeMethod::kNone, 0), prompts, gen);
  EXPECT_EQ(plain.stats.spec_drafted, 0);
  for (int32_t k : {1, 4}) {
    const Outcome spec = run_engine(stories(), config_for(SpeculativeMethod::kNgram, k), prompts, gen);
    expect_same(spec, plain, "ngram k=" + std::to_string(k));
    expect_rejections_and_acceptances(spec.stats, "ngram k=" + std::to_string(k));
    EXPECT_EQ(spec.stats.spec_accepted_per_pos.size(), static_cast<size_t>(k));
    // Fewer forwards for the same tokens.
    EXPECT_LT(spec.stats.steps, plain.stats.steps) << "k=" << k;
    EXPECT_GT(spec.stats.spec_tokens_per_step(), 1.0) << "k=" << k;
  }
  // Under KV pressure (preemptions drop drafts with the blocks) and without the prefix
  // cache (with it, only accepted tokens' blocks may ever be registered).
  EngineConfig tight = config_for(SpeculativeMethod::kNgram, 4);
  tight.kv_cache_bytes = 14 * block_bytes(stories());
  const Outcome spec_tight = run_engine(stories(), tight, prompts, gen);
  expect_same(spec_tight, plain, "ngram, tight KV");
  EXPECT_GT(spec_tight.stats.preemptions, 0);
  tight.enable_prefix_cache = false;
  expect_same(run_engine(stories(), tight, prompts, gen), plain, "ngram, tight KV, no prefix cache");
}

TEST(SpeculativeEngine, NgramGreedyEqualsPlainOnHybrid) {
  OneThread one;
  // Every rejected draft here has to be undone in the Gated DeltaNet state as well.
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts = {repetitive(rng, 6, 4, 3, 290), random_tokens(rng, 30, 3, 290),
                                               repetitive(rng, 9, 3, 3, 290), random_tokens(rng, 11, 3, 290)};
  const int32_t gen = 32;
  const Outcome plain = run_engine(hybrid(), config_for(SpeculativeMethod::kNone, 0), prompts, gen);
  const Outcome spec = run_engine(hybrid(), config_for(SpeculativeMethod::kNgram, 3), prompts, gen);
  expect_same(spec, plain, "hybrid ngram");
  // This random model does not repeat itself, so its n-gram drafts are all rejected:
  // every verify step restores the recurrent state. (Accepted-then-rejected drafts on
  // the hybrid are covered by the MTP test below.) Drafts are at most as long as their
  // match, mostly 1-2 tokens here.
  EXPECT_GE(spec.stats.spec_drafted, 8);
  EXPECT_LT(spec.stats.spec_accepted, spec.stats.spec_drafted);
}

TEST(SpeculativeEngine, MtpGreedyEqualsPlainOnHybridBatchedAndPreempted) {
  OneThread one;
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : {3, 70, 20, 45, 9}) prompts.push_back(random_tokens(rng, n, 3, 290));
  prompts.push_back(repetitive(rng, 5, 5, 3, 290));
  const int32_t gen = 24;
  const Outcome plain = run_engine(hybrid(), config_for(SpeculativeMethod::kNone, 0), prompts, gen);
  for (int32_t k : {1, 3}) {
    const std::string what = "mtp k=" + std::to_string(k);
    const Outcome spec = run_engine(hybrid(), config_for(SpeculativeMethod::kMtp, k), prompts, gen);
    expect_same(spec, plain, what);
    // A random MTP head almost never agrees with the trunk: mostly rejections here
    // (accepted-then-rejected drafts on the hybrid: the oracle test below).
    EXPECT_GT(spec.stats.spec_drafted, 20) << what;
    EXPECT_LT(spec.stats.spec_accepted, spec.stats.spec_drafted) << what;
  }
  EngineConfig tight = config_for(SpeculativeMethod::kMtp, 2);
  tight.kv_cache_bytes = 12 * block_bytes(hybrid());
  const Outcome spec_tight = run_engine(hybrid(), tight, prompts, gen);
  expect_same(spec_tight, plain, "mtp k=2, tight KV");
  EXPECT_GT(spec_tight.stats.preemptions, 0);
}

// DeepSeek-V3: the MTP layer drafts from the latent cache's own KV layer; greedy output
// is the plain run's, batched, staggered and preempted (the MLA cache rolled back).
TEST(SpeculativeEngine, MtpGreedyEqualsPlainOnDeepseek) {
  OneThread one;
  Model& model = testing_support::deepseek_model();
  ASSERT_NE(model.mtp_head(), nullptr);
  std::mt19937 rng(9);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : {4, 40, 17}) prompts.push_back(random_tokens(rng, n, 3, 290));
  prompts.push_back(repetitive(rng, 4, 5, 3, 290));
  const int32_t gen = 20;
  const Outcome plain = run_engine(model, config_for(SpeculativeMethod::kNone, 0), prompts, gen);
  for (int32_t k : {1, 3}) {
    const std::string what = "deepseek mtp k=" + std::to_string(k);
    const Outcome spec = run_engine(model, config_for(SpeculativeMethod::kMtp, k), prompts, gen);
    expect_same(spec, plain, what);
    EXPECT_GT(spec.stats.spec_drafted, 10) << what;
  }
  EngineConfig tight = config_for(SpeculativeMethod::kMtp, 2);
  tight.kv_cache_bytes = 8 * block_bytes(model);
  const Outcome spec_tight = run_engine(model, tight, prompts, gen);
  expect_same(spec_tight, plain, "deepseek mtp k=2, tight KV");
  EXPECT_GT(spec_tight.stats.preemptions, 0);
}

TEST(SpeculativeEngine, OracleDraftsWithPlantedErrorsOnHybrid) {
  // Drafts from a drafter that knows the plain run's continuation but gets chosen
  // positions wrong: every pattern of k = 3 (all accepted, 0/1/2 accepted then a
  // rejection) occurs, on several sequences at once, and each rollback of the recurrent
  // state and the KV must leave the later tokens exactly as without speculation.
  OneThread one;
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : {6, 33, 17, 50}) prompts.push_back(random_tokens(rng, n, 3, 290));
  const int32_t gen = 30;
  const Outcome plain = run_engine(hybrid(), config_for(SpeculativeMethod::kNone, 0), prompts, gen);
  EngineConfig c = config_for(SpeculativeMethod::kCustom, 3);
  c.speculative.drafter =
      testing_support::oracle_drafter(prompts, plain.tokens, [](size_t at) { return at % 5 == 2 || at % 7 == 4; });
  const Outcome spec = run_engine(hybrid(), c, prompts, gen);
  expect_same(spec, plain, "oracle drafts");
  expect_rejections_and_acceptances(spec.stats, "oracle drafts");
  const auto& acc = spec.stats.spec_accepted_per_pos;
  ASSERT_EQ(acc.size(), 3u);
  EXPECT_GT(acc[2], 0);  // all three accepted sometimes
  EXPECT_GT(acc[0], acc[2]);  // and partial acceptance other times
  EXPECT_LT(spec.stats.steps, plain.stats.steps);
}

TEST(SpeculativeEngine, MtpNeedsAnMtpHead) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  try {
    EngineCore core(stories(), config_for(SpeculativeMethod::kMtp, 1));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no multi-token-prediction head"), std::string::npos) << e.what();
  }
  EngineConfig bad = config_for(SpeculativeMethod::kNgram, SpeculativeConfig::kMaxDraftTokens + 1);
  EXPECT_THROW(EngineCore(stories(), bad), Error);
  EXPECT_THROW(parse_speculative_method("medusa"), Error);
  EXPECT_EQ(parse_speculative_method("mtp"), SpeculativeMethod::kMtp);
}

namespace {

// Two-sample chi-square over the categories both runs produced (rare ones pooled).
double two_sample_chi_square(const std::map<int32_t, int64_t>& a, const std::map<int32_t, int64_t>& b, int64_t n,
                             int* dof) {
  std::map<int32_t, std::pair<int64_t, int64_t>> cells;
  for (const auto& [t, c] : a) cells[t].first += c;
  for (const auto& [t, c] : b) cells[t].second += c;
  std::vector<std::pair<int64_t, int64_t>> pooled;
  std::pair<int64_t, int64_t> rare{0, 0};
  for (const auto& [t, c] : cells) {
    if (c.first + c.second < 20) {
      rare.first += c.first;
      rare.second += c.second;
    } else {
      pooled.push_back(c);
    }
  }
  if (rare.first + rare.second > 0) pooled.push_back(rare);
  double x2 = 0;
  for (const auto& [x, y] : pooled) {
    // Equal sample sizes: (x - y)^2 / (x + y).
    x2 += static_cast<double>((x - y) * (x - y)) / static_cast<double>(x + y);
  }
  *dof = static_cast<int>(pooled.size()) - 1;
  (void)n;
  return x2;
}

// Upper 1e-4 quantile of chi-square with `dof` degrees of freedom (Wilson-Hilferty).
double chi_square_limit(int dof) {
  const double z = 3.719;  // standard normal 1 - 1e-4
  const double k = dof;
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

void expect_same_distribution(Model& model, SpeculativeMethod method, int32_t k, const std::vector<int32_t>& prompt,
                              int32_t n_runs, float temperature, int32_t bins, const std::string& what) {
  SamplingParams sp;
  sp.temperature = temperature;
  std::vector<std::vector<int32_t>> prompts(n_runs, prompt);
  EngineConfig c = config_for(SpeculativeMethod::kNone, 0);
  c.max_num_seqs = 64;
  c.max_batch_tokens = 512;
  sp.seed = 1000;
  const Outcome plain = run_engine(model, c, prompts, 3, sp);
  c.speculative.method = method;
  c.speculative.num_draft_tokens = k;
  sp.seed = 500000;  // independent samples
  const Outcome spec = run_engine(model, c, prompts, 3, sp);
  if (std::getenv("SPEC_DEBUG"))
    printf("drafted %ld accepted %ld\n", spec.stats.spec_drafted, spec.stats.spec_accepted);
  EXPECT_GT(spec.stats.spec_accepted, 0) << what;
  EXPECT_LT(spec.stats.spec_accepted, spec.stats.spec_drafted) << what;
  // Tokens 2 and 3 come out of verify steps; token 2 alone, and the pair (2, 3).
  for (int pos : {1, 2}) {
    std::map<int32_t, int64_t> a, b;
    // Tokens grouped by id modulo `bins` (any fixed grouping keeps equal distributions
    // equal) so that a small sample fills the cells of a large vocabulary.
    auto cell = [&](const std::vector<int32_t>& t) {
      return pos == 1 ? t[1] % bins : (t[1] % bins) * bins + t[2] % bins;
    };
    for (const auto& t : plain.tokens) ++a[cell(t)];
    for (const auto& t : spec.tokens) ++b[cell(t)];
    int dof = 0;
    const double x2 = two_sample_chi_square(a, b, n_runs, &dof);
    ASSERT_GT(dof, 1) << what;
    EXPECT_LT(x2, chi_square_limit(dof)) << what << ": token " << pos + 1 << ", " << dof << " dof";
  }
}

}  // namespace

TEST(SpeculativeEngine, SampledNgramKeepsTheDistributionOnStories260K) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  OneThread one;
  // Story text the model knows, repeated: drafts are often but not always right.
  const Tokenizer tok = Tokenizer::load(test::stories_dir());
  const std::vector<int32_t> prompt =
      tok.encode("Once upon a time, there was a little girl. Once upon a time, there was a little girl. Once upon a");
  expect_same_distribution(stories(), SpeculativeMethod::kNgram, 2, prompt, 3000, 1.5f, 1 << 20, "stories ngram");
}

TEST(SpeculativeEngine, SampledMtpKeepsTheDistributionOnHybrid) {
  // MTP drafts are sampled from the head's distribution q under the request's transform
  // (temperature 2 here, for the target too): the residual max(0, p - q) path is
  // exercised. The random head rarely agrees with the trunk; a high temperature makes
  // p and q overlap enough for acceptances.
  OneThread one;
  std::mt19937 rng(8);
  expect_same_distribution(hybrid(), SpeculativeMethod::kMtp, 2, repetitive(rng, 4, 3, 3, 290), 1500, 2.0f, 4,
                           "hybrid mtp");
}

TEST(SpeculativeModelSeam, StateRestoreAndAllTokenHiddenStates) {
  OneThread one;
  Model& model = hybrid();
  MtpHead* head = model.mtp_head();
  ASSERT_NE(head, nullptr);
  const int32_t V = model.config().vocab_size, H = model.config().hidden_size;
  KvPoolShape shape = model.kv_shape(16);
  shape.num_blocks = 4;
  KvPool kv(shape);
  // No per-token states: a rollback restores the copy taken when the chunk was bound.
  RecurrentMemory memory(model.state_shape(), 1, 0);
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  auto batch_of = [&](std::vector<int32_t> tokens, int32_t pos0, bool all) {
    return one_chunk(std::move(tokens), pos0, blocks, all, memory);
  };
  std::vector<float> prompt_logits(V), a(3 * V), b(3 * V);
  model.forward(batch_of({5, 17, 42, 99, 7}, 0, false), kv, prompt_logits.data());
  // A "verify" chunk, then the state rolled back and a different chunk at the same place,
  // then the first chunk again: the rollback must make it as if nothing had happened.
  memory.snapshot(1);
  model.forward(batch_of({11, 12, 13}, 5, true), kv, a.data());
  EXPECT_EQ(memory.rollback(1, 3), 5);
  memory.snapshot(1);
  model.forward(batch_of({200, 201, 202}, 5, true), kv, b.data());
  EXPECT_NE(a, b);
  EXPECT_EQ(memory.commit(1, 0), 5);
  std::vector<float> again(3 * V);
  head->set_hidden_for_all_tokens(true);
  memory.snapshot(1);
  model.forward(batch_of({11, 12, 13}, 5, false), kv, again.data());  // last row only
  std::vector<float> all_hidden(head->last_hidden(), head->last_hidden() + 3 * H);
  head->set_hidden_for_all_tokens(false);
  // (A tolerance, not equality: 3-row and 1-row matmuls may round differently.)
  float diff = 0;
  for (int32_t i = 0; i < V; ++i) diff = std::max(diff, std::abs(a[2 * V + i] - again[i]));
  EXPECT_LT(diff, 1e-4f);
  // Every token's hidden state is there, and the last one equals the logits-row hidden state.
  EXPECT_EQ(memory.rollback(1, 3), 5);
  model.forward(batch_of({11, 12, 13}, 5, false), kv, again.data());
  float hdiff = 0;
  for (int32_t i = 0; i < H; ++i) hdiff = std::max(hdiff, std::abs(all_hidden[2 * H + i] - head->last_hidden()[i]));
  EXPECT_LT(hdiff, 1e-5f);
}

namespace {

// Passes everything to `inner` and records where each forward's chunks start per
// recurrent state. A sequence's chunks start ever later unless tokens are fed again: the
// re-feed after a rollback starts a chunk where the rolled-back verify chunk started (a
// chunk after a partial rejection without re-feed starts past the kept tokens).
// `token_states` false hides StateShape::token_states: the sequence memory's fallback path.
class RecordingModel final : public Model {
 public:
  RecordingModel(Model& inner, bool token_states) : inner_(inner), token_states_(token_states) {
    config_ = inner.config();
  }
  KvPoolShape kv_shape(int64_t block_size) const override { return inner_.kv_shape(block_size); }
  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override {
    ++forwards;
    for (const SeqChunk& s : batch.seqs) {
      auto [it, fresh] = last_pos0_.try_emplace(s.state_id, s.pos0);
      if (!fresh && s.pos0 > 0 && s.pos0 <= it->second) ++refeeds;  // (pos0 0: the state's next sequence)
      it->second = s.pos0;
      if (s.token_states != nullptr) ++token_state_chunks;
    }
    inner_.forward(batch, kv, logits);
  }
  int64_t weight_bytes_per_token() const override { return inner_.weight_bytes_per_token(); }
  int64_t num_parameters() const override { return inner_.num_parameters(); }
  StateShape state_shape() const override {
    StateShape s = inner_.state_shape();
    s.token_states = s.token_states && token_states_;
    return s;
  }
  MtpHead* mtp_head() override { return inner_.mtp_head(); }

  int64_t forwards = 0;
  int64_t refeeds = 0;  // chunks that started at or before the slot's previous chunk
  int64_t token_state_chunks = 0;  // chunks run with SeqChunk::token_states

 private:
  Model& inner_;
  bool token_states_;
  std::map<int32_t, int32_t> last_pos0_;  // state id -> pos0 of its last chunk
};

}  // namespace

TEST(SpeculativeEngine, HybridCommitsTheKeptTokensStateWithoutAReFeed) {
  // Oracle drafts with planted errors (0, 1, 2 of k = 3 accepted, then a rejection): with
  // per-token states no chunk starts where an earlier one did (no re-feed forward), and the output is still exactly the
  // plain run's. With the states hidden (the fallback, e.g. a tensor-parallel group) the same run re-feeds after each
  // partial rejection, costs more forwards, and gives the same tokens too. No preemption here (it would recompute
  // positions legitimately).
  OneThread one;
  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t n : {9, 40, 23}) prompts.push_back(random_tokens(rng, n, 3, 290));
  const int32_t gen = 30;
  const Outcome plain = run_engine(hybrid(), config_for(SpeculativeMethod::kNone, 0), prompts, gen);
  EngineConfig c = config_for(SpeculativeMethod::kCustom, 3);
  c.speculative.drafter =
      testing_support::oracle_drafter(prompts, plain.tokens, [](size_t at) { return at % 4 == 1 || at % 9 == 6; });
  RecordingModel direct(hybrid(), true);
  const Outcome spec = run_engine(direct, c, prompts, gen);
  expect_same(spec, plain, "token states");
  expect_rejections_and_acceptances(spec.stats, "token states");
  EXPECT_GT(spec.stats.spec_accepted_per_pos[0], spec.stats.spec_accepted_per_pos[2]);  // partial acceptances
  EXPECT_GT(direct.token_state_chunks, 0);
  EXPECT_EQ(direct.refeeds, 0);
  EXPECT_EQ(spec.stats.steps, direct.forwards);

  RecordingModel fallback(hybrid(), false);
  const Outcome refed = run_engine(fallback, c, prompts, gen);
  expect_same(refed, plain, "re-feed fallback");
  EXPECT_EQ(fallback.token_state_chunks, 0);
  EXPECT_GT(fallback.refeeds, 0);
  EXPECT_GT(fallback.forwards, direct.forwards);
}

TEST(SpeculativeModelSeam, CommittedTokenStateEqualsDecodingTheTokens) {
  // A verify chunk that keeps token states, then commit(j): the sequence's state must be bit
  // for bit the state of decoding the chunk's first j tokens one at a time (both run the
  // same single-token recurrence on the same rows: the prompt before them went through the
  // chunked rule once, identically, in both), and so must every logits row of the chunk
  // within matmul rounding (a 5-row and a 1-row matmul may round apart).
  OneThread one;
  Model& model = hybrid();
  ASSERT_TRUE(model.state_shape().token_states);
  RecurrentMemory memory(model.state_shape(), 1, 5);
  ASSERT_TRUE(memory.keeps_token_states());
  const int32_t V = model.config().vocab_size;
  const size_t floats = static_cast<size_t>(model.state_shape().floats());
  KvPoolShape shape = model.kv_shape(16);
  shape.num_blocks = 4;
  KvPool kv(shape);
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  auto run = [&](std::vector<int32_t> tokens, int32_t pos0, bool all, float* logits) {
    ForwardBatch b = one_chunk(std::move(tokens), pos0, blocks, all, memory);
    model.forward(b, kv, logits);
    return b.seqs[0].token_states != nullptr;
  };
  auto state = [&] { return std::vector<float>(memory.state(1), memory.state(1) + floats); };
  const std::vector<int32_t> prompt = {5, 17, 42, 99, 7, 250, 3, 64, 12};  // chunked rule (9 tokens)
  const std::vector<int32_t> chunk = {11, 12, 13, 14, 15};
  const int32_t P = static_cast<int32_t>(prompt.size()), n = static_cast<int32_t>(chunk.size());
  std::vector<float> logits(static_cast<size_t>(n) * V);
  // Plain: decode the chunk's tokens one by one, the state after each saved.
  run(prompt, 0, false, logits.data());
  std::vector<std::vector<float>> decoded;
  std::vector<float> decode_logits(static_cast<size_t>(n) * V);
  for (int32_t t = 0; t < n; ++t) {
    run({chunk[t]}, P + t, false, decode_logits.data() + static_cast<size_t>(t) * V);
    decoded.push_back(state());
  }
  for (int32_t keep = 1; keep <= n; ++keep) {
    run(prompt, 0, false, logits.data());
    memory.snapshot(1);
    EXPECT_TRUE(run(chunk, P, true, logits.data()));
    EXPECT_EQ(memory.commit(1, keep), P + keep);  // the whole chunk's state is already there when keep == n
    EXPECT_EQ(state(), decoded[keep - 1]) << "state after " << keep << " of " << n << " tokens";
  }
  float diff = 0;
  for (size_t i = 0; i < logits.size(); ++i) diff = std::max(diff, std::abs(logits[i] - decode_logits[i]));
  EXPECT_LT(diff, 1e-4f);
  // A longer chunk than the memory keeps token states for runs with a copy of the state
  // before it instead: a partial commit goes back there (the caller feeds the kept tokens again).
  run(prompt, 0, false, logits.data());
  const std::vector<float> before = state();
  memory.snapshot(1);
  EXPECT_FALSE(run({1, 2, 3, 4, 5, 6}, P, true, nullptr));
  EXPECT_EQ(memory.commit(1, 3), P);
  EXPECT_EQ(state(), before);
}
