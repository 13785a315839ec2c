// Constrained decoding through the engine (constraint_state.h) on the trained stories260K:
// every output of a JSON-Schema constraint is whole and valid (the matcher accepts it to
// completion) at temperature 0 and 1.5, batched with unconstrained requests; greedy runs
// with n-gram speculative decoding emit exactly the tokens of plain runs while drafts are
// rejected (so the matcher is rolled back); logit_bias in the sampler.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "infera/constrain/constraint.h"
#include "infera/runtime/engine.h"
#include "infera/tokenizer/tokenizer.h"
#include "test_models.h"

using namespace infera;

namespace {

EngineConfig small_config(SpeculativeMethod method = SpeculativeMethod::kNone, int32_t k = 0) {
  EngineConfig c;
  c.block_size = 16;
  c.max_batch_tokens = 128;
  c.max_num_seqs = 6;
  c.prefill_chunk = 64;
  c.kv_cache_bytes = 64 << 20;
  c.speculative.method = method;
  c.speculative.num_draft_tokens = k;
  return c;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishReason> finish;
  EngineStats stats;
};

Outputs run_all(Model& model, const EngineConfig& config, const std::vector<Request>& requests) {
  EngineCore core(model, config);
  std::map<RequestId, std::vector<int32_t>> out;
  std::map<RequestId, FinishReason> fin;
  std::vector<RequestId> ids;
  for (const Request& r : requests) {
    ids.push_back(core.add_request(r, [&](const Event& e) {
      if (e.is_final())
        fin[e.id] = e.finish;
      else
        out[e.id].push_back(e.token);
    }));
  }
  while (core.has_work()) core.step();
  Outputs r;
  for (RequestId id : ids) {
    r.tokens.push_back(out[id]);
    r.finish.push_back(fin[id]);
  }
  r.stats = core.stats();
  return r;
}

class ConstrainedEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    INFERA_REQUIRE_FIXTURE(test::stories_dir());
    tok_ = std::make_unique<Tokenizer>(Tokenizer::load(test::stories_dir()));
    vocab_ = constrain::vocabulary_for(*tok_);
  }
  std::shared_ptr<const constrain::CompiledConstraint> compile(const std::string& schema) {
    constrain::ConstraintSpec spec;
    spec.kind = constrain::ConstraintSpec::Kind::kJsonSchema;
    spec.json = nlohmann::json::parse(schema);
    return constrain::compile_cached(spec, vocab_);
  }
  Request request(const std::string& prompt, std::shared_ptr<const constrain::CompiledConstraint> c, float temperature,
                  uint64_t seed, int32_t max_tokens) {
    Request r;
    r.prompt_ids = tok_->encode(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.vocab_limit = tok_->vocab_size();
    if (c) {
      r.constraint.compiled = std::move(c);
      r.constraint.strip_leading_spaces = tok_->strip_leading_spaces();
    }
    return r;
  }
  // The decoded output is a whole sentence of the constraint.
  void expect_valid(const constrain::CompiledConstraint& c, const std::vector<int32_t>& tokens,
                    const std::string& what) {
    const std::string text = tok_->decode(tokens);
    constrain::Matcher m(c.grammar());
    EXPECT_TRUE(m.accept(text) && m.complete()) << what << ": " << text;
  }
  std::unique_ptr<Tokenizer> tok_;
  std::shared_ptr<const constrain::Vocabulary> vocab_;
};

const char* kSchema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
  "age":{"type":"integer","minimum":0,"maximum":99},"pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":3}},
  "required":["name","age"],"additionalProperties":false})";

TEST_F(ConstrainedEngine, OutputsAreValidBatchedWithUnconstrained) {
  auto c = compile(kSchema);
  auto free_text = compile(R"({"type":"string"})");  // strings run until max_tokens steers them shut
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    const float t = i % 2 ? 1.5f : 0.0f;
    requests.push_back(request("Once upon a time", i % 4 == 3 ? free_text : c, t, 100 + i, 48));
    if (i % 3 == 0) requests.push_back(request("The cat", nullptr, 1.0f, i, 20));  // unconstrained, same batch
  }
  const Outputs r = run_all(testing_support::stories_model(), small_config(), requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!requests[i].constraint.compiled) {
      EXPECT_EQ(r.tokens[i].size(), 20u);
      continue;
    }
    EXPECT_EQ(r.finish[i], FinishReason::kStop) << "request " << i << ": " << tok_->decode(r.tokens[i]);
    expect_valid(*requests[i].constraint.compiled, r.tokens[i], "request " + std::to_string(i));
  }
}

TEST_F(ConstrainedEngine, SpeculativeGreedyEqualsPlainAndRollsBack) {
  auto c = compile(kSchema);
  std::vector<Request> requests;
  // Repetitive prompts give prompt lookup drafts, most of them outside the constraint.
  for (int i = 0; i < 4; ++i)
    requests.push_back(
        request("{\"name\":\"Lily\",\"age\":3} {\"name\":\"Lily\",\"age\":3} {\"name\":", c, 0.0f, i, 40));
  const Outputs plain = run_all(testing_support::stories_model(), small_config(), requests);
  const Outputs spec = run_all(testing_support::stories_model(), small_config(SpeculativeMethod::kNgram, 4), requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "request " << i;
    expect_valid(*c, spec.tokens[i], "speculative request " + std::to_string(i));
  }
  EXPECT_GT(spec.stats.spec_drafted, 0);
  EXPECT_LT(spec.stats.spec_accepted, spec.stats.spec_drafted) << "no draft was rejected: rollback untested";
}

TEST_F(ConstrainedEngine, StateRollbackRestoresPhaseAndMatcher) {
  ConstraintRequest req;
  req.compiled = compile(R"({"enum":["ab","cd"]})");
  const int32_t stop = 2;
  ConstraintState s(req, {stop});
  auto id_of = [&](const std::string& piece) {
    for (int32_t t = 0; t < vocab_->size(); ++t)
      if (vocab_->usable(t) && vocab_->bytes(t) == piece) return t;
    return -1;
  };
  const int32_t quote = id_of("\"");
  ASSERT_GE(quote, 0);
  std::vector<float> logits(tok_->vocab_size(), 0.0f);
  s.apply(logits.data(), tok_->vocab_size(), 100);
  EXPECT_EQ(logits[quote], 0.0f);
  EXPECT_TRUE(std::isinf(logits[stop])) << "the stop token before the output is whole";
  s.accept(quote);
  s.rollback(1);
  std::vector<float> again(tok_->vocab_size(), 0.0f);
  s.apply(again.data(), tok_->vocab_size(), 100);
  s.apply(logits.data(), tok_->vocab_size(), 100);
  EXPECT_EQ(again, logits);
}

TEST_F(ConstrainedEngine, ReasoningAndToolTriggersSwitchTheConstraintOn) {
  const int32_t open = 5, close = 6, stop = 2;  // stand-ins for <think>, </think>, EOS
  auto c = compile(R"({"const":"ok"})");
  const int32_t quote = [&] {
    for (int32_t t = 0; t < vocab_->size(); ++t)
      if (vocab_->usable(t) && vocab_->bytes(t) == "\"") return t;
    return -1;
  }();
  ASSERT_GE(quote, 0);
  const int32_t n = tok_->vocab_size();
  auto masked = [&](ConstraintState& s, int32_t t) {
    std::vector<float> logits(n, 0.0f);
    s.apply(logits.data(), n, 100);
    return std::isinf(logits[t]);
  };
  // The prompt opened reasoning: free until </think>, constrained after it.
  ConstraintRequest after;
  after.compiled = c;
  after.start_token = close;
  ConstraintState a(after, {stop});
  EXPECT_FALSE(a.active());
  EXPECT_FALSE(masked(a, 100));
  a.accept(100);
  a.accept(close);
  EXPECT_TRUE(a.active());
  EXPECT_TRUE(masked(a, 100));
  EXPECT_FALSE(masked(a, quote));
  a.rollback(1);
  EXPECT_FALSE(a.active());
  // The model may open reasoning itself: <think> allowed first, then free until </think>.
  ConstraintRequest maybe = after;
  maybe.open_token = open;
  ConstraintState b(maybe, {stop});
  EXPECT_TRUE(b.active());
  EXPECT_FALSE(masked(b, open));
  EXPECT_TRUE(masked(b, 100));
  b.accept(open);
  EXPECT_FALSE(b.active());
  // tool_choice auto: constrained from the trigger until the call is whole, then free again.
  ConstraintRequest rearm;
  rearm.compiled = compile(R"({"const":1})");
  rearm.start_token = open;
  rearm.rearm = true;
  ConstraintState t(rearm, {stop});
  t.accept(open);
  EXPECT_TRUE(t.active());
  int32_t one = -1;
  for (int32_t i = 0; i < vocab_->size(); ++i)
    if (vocab_->usable(i) && vocab_->bytes(i) == "1") one = i;
  ASSERT_GE(one, 0);
  t.accept(one);
  EXPECT_FALSE(t.active());
}

// tool_choice "auto" where the opening tag is several tokens (stories260K has no <tool_call>
// token): the tag is matched as bytes across tokens, and the constraint starts after it.
TEST_F(ConstrainedEngine, OpeningTagSpelledOverSeveralTokens) {
  constrain::ToolCallOptions after_tag;
  after_tag.with_open_tag = false;
  ConstraintRequest req;
  constrain::ConstraintSpec spec;
  spec.kind = constrain::ConstraintSpec::Kind::kToolCalls;
  spec.tool_options = after_tag;
  spec.json = nlohmann::ordered_json::parse(R"([{"name":"f","parameters":{"type":"object"}}])");
  req.compiled = constrain::compile_cached(spec, vocab_);
  req.start_text = "<tool_call>";
  req.rearm = true;
  const std::vector<int32_t> tag = tok_->encode("<tool_call>", false);
  ASSERT_GT(tag.size(), 2u) << "the tag is one token in this vocabulary";
  ASSERT_FALSE(tok_->token_to_id("<tool_call>").has_value());
  const int32_t stop = 2, n = tok_->vocab_size();
  int32_t letter = -1;
  for (int32_t t = 0; t < vocab_->size(); ++t)
    if (vocab_->usable(t) && vocab_->bytes(t) == "a") letter = t;
  ASSERT_GE(letter, 0);
  // Free text, the tag, a whole call, free text, the tag again: every token of it allowed,
  // the constraint on exactly from the tag's last token to the call's end.
  const std::string call = "\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  const std::string text = "Hello<tool_call>" + call + " and<tool_call>";
  const std::vector<int32_t> ids = tok_->encode(text, false);
  ConstraintState s(req, {stop});
  std::string written;
  int activations = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> row(n, 0.0f);
    s.apply(row.data(), n, 1000);
    ASSERT_EQ(row[ids[i]], 0.0f) << "token " << i << " '" << vocab_->bytes(ids[i]) << "' after '" << written << "'";
    const bool was = s.active();
    s.accept(ids[i]);
    written += vocab_->bytes(ids[i]);
    if (!was && s.active()) {
      ++activations;
      size_t tags = 0;
      for (size_t at = written.find("<tool_call>"); at != std::string::npos; at = written.find("<tool_call>", at + 1))
        ++tags;
      EXPECT_EQ(tags, static_cast<size_t>(activations)) << "on at the tag's last token: " << written;
      EXPECT_FALSE(written.substr(0, written.size() - vocab_->bytes(ids[i]).size()).ends_with("<tool_call>"));
      // The call's first byte is a newline: a letter is masked.
      std::vector<float> next(n, 0.0f);
      s.apply(next.data(), n, 1000);
      EXPECT_TRUE(std::isinf(next[letter]));
      s.rollback(1);
      EXPECT_FALSE(s.active());
      s.accept(ids[i]);
      EXPECT_TRUE(s.active());
    }
    if (was && !s.active()) {
      EXPECT_TRUE(written.ends_with("</tool_call>")) << written;
    }
  }
  EXPECT_EQ(activations, 2);
  EXPECT_TRUE(s.active());
}

// A token that completes the tag and goes on: its bytes after the tag are the call's first;
// while the tag is partly written, a token that would complete it with bytes the call cannot
// begin with is masked.
TEST(ConstraintStateTag, BytesAfterTheTagInOneToken) {
  std::vector<std::string> bytes = {"<",
                                    "tool",
                                    "_call",
                                    ">",
                                    ">\n",
                                    ">{",
                                    "\n",
                                    "x",
                                    "{}",
                                    "}",
                                    "\n</tool_call>",
                                    "<tool_call>\n",
                                    "{\"name\": \"f\", \"arguments\": ",
                                    "<eos>"};
  std::vector<char> usable(bytes.size(), 1);
  const int32_t eos = static_cast<int32_t>(bytes.size()) - 1;
  usable[eos] = 0;
  auto vocab = std::make_shared<const constrain::Vocabulary>(bytes, usable);
  auto id = [&](const std::string& b) {
    return static_cast<int32_t>(std::find(bytes.begin(), bytes.end(), b) - bytes.begin());
  };
  constrain::ToolCallOptions after_tag;
  after_tag.with_open_tag = false;
  ConstraintRequest req;
  req.compiled = std::make_shared<const constrain::CompiledConstraint>(
      std::make_shared<const constrain::Grammar>(
          constrain::compile_tool_calls({{"f", nlohmann::ordered_json::object()}}, after_tag)),
      vocab);
  req.start_text = "<tool_call>";
  req.rearm = true;
  const int32_t n = vocab->size();
  auto allowed = [&](ConstraintState& s, const std::string& b) {
    std::vector<float> logits(n, 0.0f);
    s.apply(logits.data(), n, 100);
    return logits[id(b)] == 0.0f;
  };
  ConstraintState s(req, {eos});
  EXPECT_TRUE(allowed(s, ">{"));  // nothing of the tag written yet: free text
  for (const char* b : {"x", "<", "tool", "_call"}) s.accept(id(b));
  EXPECT_FALSE(s.active());
  EXPECT_TRUE(allowed(s, ">"));
  EXPECT_TRUE(allowed(s, ">\n"));
  EXPECT_FALSE(allowed(s, ">{"));  // the call begins with a newline
  EXPECT_TRUE(allowed(s, "x"));  // not the tag after all
  EXPECT_TRUE(allowed(s, "<eos>"));
  s.accept(id(">\n"));
  EXPECT_TRUE(s.active());
  EXPECT_TRUE(allowed(s, "{\"name\": \"f\", \"arguments\": "));
  EXPECT_FALSE(allowed(s, "\n"));  // already written by the tag's token
  for (const char* b : {"{\"name\": \"f\", \"arguments\": ", "{}", "}", "\n</tool_call>"}) s.accept(id(b));
  EXPECT_FALSE(s.active());  // the call is whole: free text again
  s.accept(id("<tool_call>\n"));  // the tag and the call's first byte in one token
  EXPECT_TRUE(s.active());
  EXPECT_FALSE(allowed(s, "\n"));
  EXPECT_TRUE(allowed(s, "{\"name\": \"f\", \"arguments\": "));
  s.rollback(1);
  EXPECT_FALSE(s.active());
  EXPECT_TRUE(allowed(s, "x"));
}

// The mask computed ahead on a mask thread is the mask computed in place, step by step along
// a random walk (the budget shrinking into max_tokens steering), rollbacks included.
TEST_F(ConstrainedEngine, MaskComputedAheadEqualsMaskInPlace) {
  ConstraintRequest req;
  req.compiled = compile(kSchema);
  req.strip_leading_spaces = tok_->strip_leading_spaces();
  const int32_t stop = 2;
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3; ++trial) {
    ConstraintState ahead(req, {stop}), in_place(req, {stop});
    in_place.set_overlap(false);
    int32_t budget = 40;
    for (int step = 0; step < 40 && budget > 0; ++step, --budget) {
      const std::vector<uint64_t> a = ahead.mask(budget);
      const std::vector<uint64_t>& b = in_place.mask(budget);
      ASSERT_EQ(a, b) << "trial " << trial << " step " << step;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab_->size(); ++t)
        if ((a[t >> 6] >> (t & 63)) & 1) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty());
      const int32_t token = allowed[rng() % allowed.size()];
      if (token == stop) break;
      ahead.accept(token);
      in_place.accept(token);
      if (step % 7 == 6) {  // a rejected draft
        ahead.rollback(1);
        in_place.rollback(1);
        ++budget;
      }
    }
  }
}

TEST(SamplerLogitBias, BiasesBanAndForce) {
  SamplingParams p;
  p.logit_bias = {{0, -100.0f}, {2, 100.0f}};
  Sampler s(p, 4);
  std::vector<float> logits = {5.0f, 1.0f, 0.0f, 2.0f};
  EXPECT_EQ(s.sample(logits.data(), {}), 2);
  p.logit_bias = {{0, -100.0f}};
  Sampler t(p, 4);
  logits = {5.0f, 1.0f, 0.0f, 2.0f};
  EXPECT_EQ(t.sample(logits.data(), {}), 3);
}

}  // namespace
