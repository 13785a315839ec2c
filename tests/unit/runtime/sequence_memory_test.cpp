// The sequence-memory interface (runtime/sequence_memory.h) on its own: snapshot, commit,
// rollback and checkpoints of paged KV, recurrent and hybrid memories.
//
// - Bookkeeping and state copies against a stand-in "model" that writes a known function
//   of the tokens into the state (so every copy the memory makes can be checked exactly).
// - With real models driven by hand (no engine): speculative tokens fed and rolled back
//   leave the greedy continuation unchanged (paged KV on the trained Llama default, hybrid
//   memory on the trained Qwen3.5-MoE default and a generated qwen3_5_moe), and a sequence
//   restored from a checkpoint at position p continues exactly like the original.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "infera/base/error.h"
#include "infera/base/threads.h"
#include "infera/runtime/sampler.h"
#include "infera/runtime/sequence_memory.h"
#include "test_models.h"

using namespace infera;

namespace {

// ---- a stand-in model: the state after token t is a known function of the tokens ----

constexpr int64_t kFloats = 3;

StateShape fake_shape(bool token_states = true) {
  StateShape s;
  s.num_layers = 1;
  s.floats_per_layer = kFloats;
  s.token_states = token_states;
  return s;
}

// What a model does with SeqChunk::state / token_states: state = (sum, count, last token).
void fake_forward(const SeqChunk& c, std::span<const int32_t> tokens) {
  if (c.pos0 == 0) std::fill(c.state, c.state + kFloats, 0.0f);
  for (int32_t t = 0; t < c.n_tokens; ++t) {
    c.state[0] += static_cast<float>(tokens[t]);
    c.state[1] += 1.0f;
    c.state[2] = static_cast<float>(tokens[t]);
    if (c.token_states != nullptr && t + 1 < c.n_tokens)
      std::copy(c.state, c.state + kFloats, c.token_states + t * kFloats);
  }
}

std::vector<float> expected_state(const std::vector<int32_t>& tokens, size_t n) {
  float sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<float>(tokens[i]);
  return {sum, static_cast<float>(n), n > 0 ? static_cast<float>(tokens[n - 1]) : 0.0f};
}

// Feeds tokens[pos0, pos0 + n) of sequence `id` through the stand-in; returns the chunk.
SeqChunk fake_feed(RecurrentMemory& m, SeqId id, const std::vector<int32_t>& tokens, int32_t pos0, int32_t n) {
  SeqChunk c;
  c.pos0 = pos0;
  c.n_tokens = n;
  m.bind(id, {}, c);
  fake_forward(c, std::span<const int32_t>(tokens).subspan(pos0, n));
  return c;
}

std::vector<float> state_of(const RecurrentMemory& m, SeqId id) {
  return std::vector<float>(m.state(id), m.state(id) + kFloats);
}

}  // namespace

TEST(RecurrentMemory, CommitKeepsTheStateAfterTheKeptTokens) {
  const std::vector<int32_t> t = {5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  RecurrentMemory m(fake_shape(), 2, /*max_verify_tokens=*/4);
  ASSERT_TRUE(m.keeps_token_states());
  for (int32_t keep = 1; keep <= 4; ++keep) {
    fake_feed(m, 1, t, 0, 5);
    EXPECT_EQ(m.length(1), 5);
    m.snapshot(1);
    const SeqChunk c = fake_feed(m, 1, t, 5, 4);  // a verify chunk: token states kept
    EXPECT_NE(c.token_states, nullptr);
    EXPECT_EQ(m.fed_since_snapshot(1), 4);
    EXPECT_EQ(m.commit(1, keep), 5 + keep) << keep;
    EXPECT_EQ(state_of(m, 1), expected_state(t, 5 + keep)) << keep;
    EXPECT_EQ(m.fed_since_snapshot(1), 0);
  }
  // rollback(n) drops the last n of the tokens fed since the snapshot.
  fake_feed(m, 1, t, 0, 5);
  m.snapshot(1);
  fake_feed(m, 1, t, 5, 4);
  EXPECT_EQ(m.rollback(1, 3), 6);
  EXPECT_EQ(state_of(m, 1), expected_state(t, 6));
  // The next chunk continues there; a chunk elsewhere (but at 0) is refused.
  fake_feed(m, 1, t, 6, 2);
  EXPECT_EQ(state_of(m, 1), expected_state(t, 8));
  SeqChunk bad;
  bad.pos0 = 3;
  bad.n_tokens = 1;
  EXPECT_THROW(m.bind(1, {}, bad), Error);
  // Token states begin after the chunk's first token: keeping none of it is not possible.
  m.snapshot(1);
  fake_feed(m, 1, t, 8, 2);
  EXPECT_THROW(m.commit(1, 0), Error);
  EXPECT_EQ(m.commit(1, 1), 9);  // (the snapshot stays until a commit succeeds)
  // Commit without a snapshot, or of more than was fed.
  EXPECT_THROW(m.commit(1, 1), Error);
  m.snapshot(1);
  EXPECT_THROW(m.commit(1, 1), Error);
}

TEST(RecurrentMemory, WithoutTokenStatesARollbackRestoresTheSnapshot) {
  const std::vector<int32_t> t = {5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  // The model cannot keep token states (e.g. a tensor-parallel group), or the chunk is
  // longer than the memory keeps them for: a copy of the state before the chunk instead.
  for (const auto& [model_keeps, max_verify] : {std::pair{false, 4}, std::pair{true, 2}}) {
    RecurrentMemory m(fake_shape(model_keeps), 1, max_verify);
    fake_feed(m, 7, t, 0, 5);
    m.snapshot(7);
    EXPECT_EQ(fake_feed(m, 7, t, 5, 4).token_states, nullptr);
    EXPECT_EQ(m.commit(7, 2), 5);  // back to the snapshot: the caller feeds the kept tokens again
    EXPECT_EQ(state_of(m, 7), expected_state(t, 5));
    m.snapshot(7);
    fake_feed(m, 7, t, 5, 4);
    EXPECT_EQ(m.commit(7, 4), 9);  // everything kept: nothing to undo
    EXPECT_EQ(state_of(m, 7), expected_state(t, 9));
    m.snapshot(7);
    fake_feed(m, 7, t, 9, 1);
    EXPECT_EQ(m.rollback(7, 1), 9);
    EXPECT_EQ(state_of(m, 7), expected_state(t, 9));
  }
}

TEST(RecurrentMemory, CheckpointsRestoreAnotherSequence) {
  const std::vector<int32_t> t = {5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  RecurrentMemory m(fake_shape(), 1, 4);
  fake_feed(m, 1, t, 0, 4);
  MemoryCheckpoint at4;
  m.checkpoint(1, 4, at4);
  EXPECT_EQ(at4.position, 4);
  EXPECT_EQ(at4.state, expected_state(t, 4));
  EXPECT_EQ(at4.bytes(), kFloats * 4);
  // Inside a verify chunk (from its token states), before committing.
  m.snapshot(1);
  fake_feed(m, 1, t, 4, 4);
  MemoryCheckpoint at6;
  m.checkpoint(1, 6, at6);
  EXPECT_EQ(at6.state, expected_state(t, 6));
  EXPECT_THROW(m.checkpoint(1, 3, at6), Error);  // no longer held
  m.commit(1, 4);
  // A new sequence (the memory grows a state for it) continues from the checkpoint.
  m.restore(2, at6);
  EXPECT_EQ(m.length(2), 6);
  EXPECT_EQ(m.num_slots(), 2);
  fake_feed(m, 2, t, 6, 3);
  EXPECT_EQ(state_of(m, 2), expected_state(t, 9));
  EXPECT_EQ(state_of(m, 1), expected_state(t, 8));  // untouched
  // A released sequence's state is reused.
  m.release(1);
  m.restore(3, at4);
  EXPECT_EQ(m.num_slots(), 2);
  EXPECT_EQ(state_of(m, 3), expected_state(t, 4));
  MemoryCheckpoint wrong;
  wrong.position = 2;
  wrong.state = {1.0f};
  EXPECT_THROW(m.restore(4, wrong), Error);
  // A state split over tensor-parallel ranks cannot be copied.
  StateShape split = fake_shape(false);
  split.local = false;
  RecurrentMemory tp(split, 1, 0);
  fake_feed(tp, 1, t, 0, 2);
  EXPECT_THROW(tp.snapshot(1), Error);
  EXPECT_THROW(tp.checkpoint(1, 2, at4), Error);
}

// A stand-in for the other rank of a TP 2 group: its part of each state slot is kept here,
// as ParallelModel's workers keep theirs by state id.
class FakeTransfer final : public StateTransfer {
 public:
  int64_t whole_floats() const override { return 2 * kFloats; }
  void gather(int32_t id, const float* local, float* whole) override {
    std::copy(local, local + kFloats, whole);
    const std::vector<float>& other = part(id);
    std::copy(other.begin(), other.end(), whole + kFloats);
    ++gathers;
  }
  void scatter(int32_t id, const float* whole, float* local) override {
    std::copy(whole, whole + kFloats, local);
    part(id).assign(whole + kFloats, whole + 2 * kFloats);
    ++scatters;
  }
  std::vector<float>& part(int32_t id) {
    std::vector<float>& p = parts[id];
    if (p.empty()) p.assign(kFloats, 0.0f);
    return p;
  }
  std::map<int32_t, std::vector<float>> parts;
  int gathers = 0, scatters = 0;
};

TEST(RecurrentMemory, SplitStateIsCheckpointedWholeThroughTheTransfer) {
  StateShape split = fake_shape(false);
  split.local = false;
  FakeTransfer other;
  RecurrentMemory m(split, 1, 0, &other);
  EXPECT_TRUE(m.copyable());
  EXPECT_EQ(m.state_bytes(), kFloats * 4);
  EXPECT_EQ(m.checkpoint_state_bytes(), 2 * kFloats * 4);
  const std::vector<int32_t> t = {3, 1, 4, 1, 5, 9};
  fake_feed(m, 1, t, 0, 4);
  other.part(0) = {-1.0f, -2.0f, -3.0f};  // the other rank's part of slot 0
  EXPECT_TRUE(m.has_state_at(1, 4));
  EXPECT_FALSE(m.has_state_at(1, 3));
  MemoryCheckpoint cp;
  m.checkpoint(1, 4, cp);
  EXPECT_EQ(other.gathers, 1);
  std::vector<float> whole = expected_state(t, 4);
  whole.insert(whole.end(), {-1.0f, -2.0f, -3.0f});
  EXPECT_EQ(cp.state, whole);
  // Another sequence (a new slot) resumes there: each rank gets its part back.
  m.restore(2, cp);
  EXPECT_EQ(other.scatters, 1);
  EXPECT_EQ(state_of(m, 2), expected_state(t, 4));
  EXPECT_EQ(other.part(1), (std::vector<float>{-1.0f, -2.0f, -3.0f}));
  // A checkpoint of this rank's part alone does not fit.
  MemoryCheckpoint part;
  part.position = 4;
  part.state = expected_state(t, 4);
  EXPECT_THROW(m.restore(3, part), Error);
  EXPECT_THROW(m.snapshot(1), Error);  // speculative rollback still needs a local state
}

TEST(PagedKvMemory, LengthsSnapshotsAndCheckpoints) {
  KvPoolShape shape;
  shape.num_layers = 1;
  shape.num_blocks = 4;
  shape.block_size = 4;
  shape.n_kv_heads = 1;
  shape.head_dim = 8;
  PagedKvMemory m(shape, true);
  ASSERT_NE(m.kv(), nullptr);
  EXPECT_EQ(m.blocks()->num_blocks(), 4);
  EXPECT_EQ(m.state_bytes(), 0);
  EXPECT_TRUE(m.resumes_from_prefix());
  const std::vector<int32_t> table = {2, 0};
  SeqChunk c;
  c.pos0 = 0;
  c.n_tokens = 5;
  m.bind(9, table, c);
  EXPECT_EQ(c.block_table, table.data());
  EXPECT_EQ(c.n_blocks, 2);
  EXPECT_EQ(c.state, nullptr);
  EXPECT_EQ(m.length(9), 5);
  m.snapshot(9);
  c.pos0 = 5;
  c.n_tokens = 3;
  m.bind(9, table, c);
  EXPECT_EQ(m.fed_since_snapshot(9), 3);
  EXPECT_EQ(m.rollback(9, 2), 6);  // K/V rows past the length are simply not read
  m.snapshot(9);
  c.pos0 = 6;
  c.n_tokens = 2;
  m.bind(9, table, c);
  EXPECT_EQ(m.commit(9, 0), 6);
  MemoryCheckpoint cp;
  m.checkpoint(9, 4, cp);  // any position it holds: the rows stay in the blocks
  EXPECT_EQ(cp.position, 4);
  EXPECT_TRUE(cp.state.empty());
  EXPECT_THROW(m.checkpoint(9, 7, cp), Error);
  m.restore(10, cp);
  EXPECT_EQ(m.length(10), 4);
  m.release(9);
  EXPECT_EQ(m.length(9), 0);
}

// ---- real models, driven by hand ----------------------------------------------------------

namespace {

struct OneThread {
  int saved = num_threads();
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved); }
};

// One sequence of `model` over `memory`: its id, its block table, the positions fed.
struct Stream {
  SeqId id = 0;
  std::vector<int32_t> blocks;
  int32_t pos = 0;
};

// Feeds `tokens` at s.pos; returns the logits of the last one, or of every one when `all`.
std::vector<float> feed(Model& model, SequenceMemory& memory, Stream& s, const std::vector<int32_t>& tokens,
                        bool all = false) {
  ForwardBatch b;
  b.tokens = tokens;
  SeqChunk c;
  c.n_tokens = static_cast<int32_t>(tokens.size());
  c.pos0 = s.pos;
  c.all_logits = all;
  memory.bind(s.id, s.blocks, c);
  b.seqs.push_back(c);
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> logits((all ? tokens.size() : 1) * V);
  model.forward(b, *memory.kv(), logits.data());
  s.pos += c.n_tokens;
  return logits;
}

// `n` greedy tokens from the logits of the last token fed. With `spec`, before each real
// token the stream also feeds (as a verify chunk: the token, then k wrong drafts) and rolls
// the drafts back; when the memory could only return to before the chunk, the token is
// fed again as plain decoding would.
std::vector<int32_t> greedy(Model& model, SequenceMemory& memory, Stream& s, std::vector<float> logits, int32_t n,
                            int32_t spec = 0) {
  const int32_t V = model.config().vocab_size;
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = argmax(logits.data(), V);
    out.push_back(t);
    if (i + 1 == n) break;
    if (spec > 0) {
      std::vector<int32_t> chunk = {t};
      for (int32_t k = 0; k < spec; ++k) chunk.push_back((t + 1 + 7 * k) % V);  // drafts, rejected
      const int32_t before = s.pos;
      memory.snapshot(s.id);
      std::vector<float> rows = feed(model, memory, s, chunk, /*all=*/true);
      const int32_t kept = memory.commit(s.id, 1);  // keep the real token only
      s.pos = kept;
      if (kept == before + 1) {
        logits.assign(rows.begin(), rows.begin() + V);  // row 0 predicts the next token
        continue;
      }
      EXPECT_EQ(kept, before);  // no token states: back before the chunk, fed again below
    }
    logits = feed(model, memory, s, {t});
  }
  return out;
}

std::vector<int32_t> prompt_for(const Model& model, int32_t n, int32_t seed) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back((seed + 37 * i + (i * i) % 11) % model.config().vocab_size);
  return p;
}

std::vector<int32_t> iota_blocks(int32_t first, int32_t n) {
  std::vector<int32_t> b(static_cast<size_t>(n));
  std::iota(b.begin(), b.end(), first);
  return b;
}

std::unique_ptr<SequenceMemory> memory_for(Model& model, int32_t max_verify_tokens) {
  KvPoolShape shape = model.kv_shape(16);
  shape.num_blocks = 32;
  SequenceMemoryOptions o;
  o.num_seqs = 2;
  o.max_verify_tokens = max_verify_tokens;
  return make_sequence_memory(model, shape, o);
}

Model& default_model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Model>> models;
  auto& m = models[name];
  if (!m) m = load_model(std::string(INFERA_SOURCE_DIR) + "/models/" + name);
  return *m;
}

// Rolled-back speculative tokens leave no trace: greedy with a verify chunk of wrong
// drafts before every token (rolled back through token states, or through the snapshot
// copy) equals plain greedy.
void expect_rollback_leaves_no_trace(Model& model, const std::string& what) {
  const std::vector<int32_t> prompt = prompt_for(model, 21, 3);
  std::vector<int32_t> plain;
  {
    auto memory = memory_for(model, 0);
    Stream s{1, iota_blocks(0, 8)};
    plain = greedy(model, *memory, s, feed(model, *memory, s, prompt), 24);
  }
  for (int32_t max_verify : {4, 0}) {
    auto memory = memory_for(model, max_verify);
    Stream s{1, iota_blocks(0, 8)};
    const auto spec = greedy(model, *memory, s, feed(model, *memory, s, prompt), 24, /*spec=*/3);
    EXPECT_EQ(spec, plain) << what << ", verify chunks of up to " << max_verify << " token states";
  }
}

// A sequence restored from a checkpoint at position p (its K/V blocks of [0, p) shared with
// the original, as the prefix cache would share them; its recurrent state copied) continues
// token for token like the original.
void expect_checkpoint_continues_identically(Model& model, const std::string& what) {
  const int32_t p = 32;  // two full blocks of 16
  const std::vector<int32_t> prompt = prompt_for(model, 45, 11);
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + p), tail(prompt.begin() + p, prompt.end());
  auto memory = memory_for(model, 4);
  Stream a{1, iota_blocks(0, 8)};
  feed(model, *memory, a, std::vector<int32_t>(head.begin(), head.begin() + 20));
  feed(model, *memory, a, std::vector<int32_t>(head.begin() + 20, head.end()));
  MemoryCheckpoint cp;
  memory->checkpoint(a.id, p, cp);
  EXPECT_EQ(cp.position, p);
  EXPECT_EQ(cp.bytes(), memory->state_bytes());
  const auto original = greedy(model, *memory, a, feed(model, *memory, a, tail), 20);

  Stream b{2, {0, 1, 20, 21, 22, 23}};  // blocks 0, 1 hold positions [0, 32) of `a`
  memory->restore(b.id, cp);
  b.pos = p;
  EXPECT_EQ(memory->length(b.id), p);
  const auto restored = greedy(model, *memory, b, feed(model, *memory, b, tail), 20);
  EXPECT_EQ(restored, original) << what;

  // Control: the same continuation from a zeroed state differs, so the copy is what counts.
  if (memory->state_bytes() > 0) {
    MemoryCheckpoint zero = cp;
    std::fill(zero.state.begin(), zero.state.end(), 0.0f);
    Stream c{3, {0, 1, 24, 25, 26, 27}};
    memory->restore(c.id, zero);
    c.pos = p;
    const auto from_zero = feed(model, *memory, c, tail);
    Stream d{4, {0, 1, 28, 29, 30, 31}};
    memory->restore(d.id, cp);
    d.pos = p;
    EXPECT_NE(feed(model, *memory, d, tail), from_zero) << what;
  }
}

}  // namespace

TEST(SequenceMemoryModels, PagedKvRollbackOnTrainedLlama) {
  OneThread one;
  Model& model = default_model("infera-default-llama");
  ASSERT_EQ(model.state_shape().floats(), 0);
  EXPECT_NE(dynamic_cast<PagedKvMemory*>(memory_for(model, 4).get()), nullptr);
  expect_rollback_leaves_no_trace(model, "infera-default-llama");
  expect_checkpoint_continues_identically(model, "infera-default-llama");
}

TEST(SequenceMemoryModels, HybridRollbackAndCheckpointOnTrainedDefault) {
  OneThread one;
  Model& model = default_model("infera-default");
  ASSERT_GT(model.state_shape().floats(), 0);
  auto memory = memory_for(model, 4);
  ASSERT_NE(dynamic_cast<HybridMemory*>(memory.get()), nullptr);
  EXPECT_FALSE(memory->resumes_from_prefix());
  expect_rollback_leaves_no_trace(model, "infera-default");
  expect_checkpoint_continues_identically(model, "infera-default");
}

TEST(SequenceMemoryModels, HybridRollbackAndCheckpointOnGeneratedQwen35Moe) {
  OneThread one;
  Model& model = testing_support::hybrid_model();
  expect_rollback_leaves_no_trace(model, "generated qwen3_5_moe");
  expect_checkpoint_continues_identically(model, "generated qwen3_5_moe");
}
