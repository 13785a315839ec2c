#include "infera/model/parallel_model.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "infera/base/error.h"

namespace infera {

namespace {

// The step message, int32 words:
//   [0] total words  [1] op  [2] want_logits  [3] n_tokens  [4] n_seqs  [5] total block ids
//   [6] KV pool blocks  [7] KV block size  [8] KV dtype  [9] recurrent-state ids (1 + the largest)
//   tokens[n_tokens]
//   per chunk: token_begin, n_tokens, pos0, n_blocks, flags (1 all_logits | 2 last_logits), state_id
//   block ids of every chunk, concatenated
// Merged sync sends the first kInlineWords words in one fixed-size broadcast (a decode step
// of a few sequences fits whole) and only longer messages need a second one.
constexpr int32_t kOpForward = 1;
constexpr int32_t kOpStop = 2;
// Between forwards, a recurrent state copied whole (StateTransfer): [6] floats of each
// rank's part, [7] the state id. Gather: every rank sends its part to rank 0. Scatter: rank
// 0 broadcasts the whole state and each rank keeps its part.
constexpr int32_t kOpStateGather = 3;
constexpr int32_t kOpStateScatter = 4;
// Between forwards, a message for the runtime's handler on every rank (GroupChannel):
// [3] its words (sent as the step's tokens), [6..8] the KV pool's geometry as for a forward.
constexpr int32_t kOpRuntime = 5;
constexpr int64_t kHeaderWords = 10;
constexpr int64_t kChunkWords = 6;
constexpr int64_t kInlineWords = 256;  // 1 KiB: one sequence decoding at 3800 tokens of context still fits

// The pool and states a step runs against; workers size theirs to match.
struct StepMemory {
  int32_t kv_blocks = 0;
  int32_t kv_block_size = 0;
  int32_t kv_dtype = 0;
  int32_t state_ids = 0;
};

void encode(const ForwardBatch& b, int32_t op, bool want_logits, const StepMemory& mem, std::vector<int32_t>& m) {
  int64_t blocks = 0;
  for (const SeqChunk& s : b.seqs) blocks += s.n_blocks;
  const int64_t T = static_cast<int64_t>(b.tokens.size()), S = static_cast<int64_t>(b.seqs.size());
  m.clear();
  m.reserve(static_cast<size_t>(kHeaderWords + T + S * kChunkWords + blocks));
  m.insert(m.end(), {0, op, want_logits ? 1 : 0, static_cast<int32_t>(T), static_cast<int32_t>(S),
                     static_cast<int32_t>(blocks), mem.kv_blocks, mem.kv_block_size, mem.kv_dtype, mem.state_ids});
  m.insert(m.end(), b.tokens.begin(), b.tokens.end());
  for (const SeqChunk& s : b.seqs) {
    m.insert(m.end(), {s.token_begin, s.n_tokens, s.pos0, s.n_blocks, (s.all_logits ? 1 : 0) | (s.last_logits ? 2 : 0),
                       s.state_id});
  }
  for (const SeqChunk& s : b.seqs) m.insert(m.end(), s.block_table, s.block_table + s.n_blocks);
  m[0] = static_cast<int32_t>(m.size());
}

// Rebuilds the batch; block tables point into `blocks`.
void decode(const std::vector<int32_t>& m, ForwardBatch& b, std::vector<int32_t>& blocks) {
  const int64_t T = m[3], S = m[4], B = m[5];
  INFERA_ASSERT(static_cast<int64_t>(m.size()) >= kHeaderWords + T + S * kChunkWords + B, "short step message");
  const int32_t* p = m.data() + kHeaderWords;
  b.tokens.assign(p, p + T);
  p += T;
  const int32_t* chunks = p;
  blocks.assign(p + S * kChunkWords, p + S * kChunkWords + B);
  b.seqs.resize(static_cast<size_t>(S));
  int64_t off = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int32_t* c = chunks + i * kChunkWords;
    SeqChunk& s = b.seqs[i];
    s.token_begin = c[0];
    s.n_tokens = c[1];
    s.pos0 = c[2];
    s.n_blocks = c[3];
    s.all_logits = (c[4] & 1) != 0;
    s.last_logits = (c[4] & 2) != 0;
    s.state_id = c[5];
    s.block_table = blocks.data() + off;
    off += s.n_blocks;
  }
}

void encode_state_op(int32_t op, int32_t state_id, int64_t floats, std::vector<int32_t>& m) {
  INFERA_ASSERT(floats > 0 && floats <= INT32_MAX && state_id >= 0);
  m.assign(static_cast<size_t>(kHeaderWords), 0);
  m[0] = static_cast<int32_t>(kHeaderWords);
  m[1] = op;
  m[6] = static_cast<int32_t>(floats);
  m[7] = state_id;
  m[9] = state_id + 1;
}

void send(parallel::Communicator& comm, std::vector<int32_t>& m, bool merged) {
  if (merged) {
    const int64_t total = static_cast<int64_t>(m.size());
    m.resize(static_cast<size_t>(std::max(total, kInlineWords)));
    comm.broadcast(m.data(), kInlineWords * 4, 0);
    if (total > kInlineWords) comm.broadcast(m.data() + kInlineWords, (total - kInlineWords) * 4, 0);
    m.resize(static_cast<size_t>(total));
    return;
  }
  // Textbook: the header, then the token ids, then the chunk layout and block tables.
  const int64_t T = m[3];
  comm.broadcast(m.data(), kHeaderWords * 4, 0);
  if (T > 0) comm.broadcast(m.data() + kHeaderWords, T * 4, 0);
  const int64_t rest = static_cast<int64_t>(m.size()) - kHeaderWords - T;
  if (rest > 0) comm.broadcast(m.data() + kHeaderWords + T, rest * 4, 0);
}

void receive(parallel::Communicator& comm, std::vector<int32_t>& m, bool merged) {
  parallel::Communicator::IdleWait idle(comm);  // the next step may be far away (a server idles)
  if (merged) {
    m.resize(static_cast<size_t>(kInlineWords));
    comm.broadcast(m.data(), kInlineWords * 4, 0);
    const int64_t total = m[0];
    INFERA_ASSERT(total >= kHeaderWords, "bad step message");
    if (total > kInlineWords) {
      m.resize(static_cast<size_t>(total));
      comm.broadcast(m.data() + kInlineWords, (total - kInlineWords) * 4, 0);
    }
    return;
  }
  m.resize(static_cast<size_t>(kHeaderWords));
  comm.broadcast(m.data(), kHeaderWords * 4, 0);
  const int64_t T = m[3], S = m[4], B = m[5];
  m.resize(static_cast<size_t>(kHeaderWords + T + S * kChunkWords + B));
  if (T > 0) comm.broadcast(m.data() + kHeaderWords, T * 4, 0);
  const int64_t rest = S * kChunkWords + B;
  if (rest > 0) comm.broadcast(m.data() + kHeaderWords + T, rest * 4, 0);
}

}  // namespace

ParallelModel::ParallelModel(std::unique_ptr<Model> local, parallel::Communicator& comm, bool merged_sync)
    : local_(std::move(local)), comm_(comm), merged_sync_(merged_sync) {
  INFERA_ASSERT(comm.rank() == 0, "only rank 0 drives a parallel model");
  config_ = local_->config();
}

ParallelModel::~ParallelModel() {
  try {
    stop_workers();
  } catch (const std::exception& e) {
    // The group is already broken (a collective failed); the workers end with it.
    std::fprintf(stderr, "error: rank 0 could not stop the other ranks: %s\n", e.what());
  }
}

void ParallelModel::forward(const ForwardBatch& batch, KvPool& kv, float* logits) {
  INFERA_ASSERT(!stopped_, "forward after stop_workers");
  if (batch.tokens.empty()) return;
  const KvPoolShape& shape = kv.shape();
  int32_t state_ids = 0;
  for (const SeqChunk& s : batch.seqs) {
    // Rank 0's state lives in its sequence memory; the workers keep theirs under the same id.
    if (s.state != nullptr && s.state_id < 0)
      fail("a chunk with a recurrent state needs SeqChunk::state_id on --tp/--ep ranks");
    state_ids = std::max(state_ids, s.state_id + 1);
  }
  const StepMemory mem{static_cast<int32_t>(shape.num_blocks), static_cast<int32_t>(shape.block_size),
                       static_cast<int32_t>(shape.dtype), state_ids};
  encode(batch, kOpForward, logits != nullptr, mem, message_);
  send(comm_, message_, merged_sync_);
  local_->forward(batch, kv, logits);
}

Model::ParallelStats ParallelModel::parallel_stats() const {
  const parallel::CommStats& s = comm_.stats();
  return ParallelStats{comm_.size(), s.calls(), s.bytes(), s.seconds()};
}

void ParallelModel::gather(int32_t state_id, const float* local, float* whole) {
  INFERA_ASSERT(!stopped_, "state transfer after stop_workers");
  const int64_t floats = local_->state_shape().floats();
  encode_state_op(kOpStateGather, state_id, floats, message_);
  send(comm_, message_, merged_sync_);
  comm_.gather(local, floats * static_cast<int64_t>(sizeof(float)), whole, 0);
}

void ParallelModel::scatter(int32_t state_id, const float* whole, float* local) {
  INFERA_ASSERT(!stopped_, "state transfer after stop_workers");
  const int64_t floats = local_->state_shape().floats();
  encode_state_op(kOpStateScatter, state_id, floats, message_);
  send(comm_, message_, merged_sync_);
  // Broadcast as the communicator has no scatter; restores are rare (a prefix hit).
  comm_.broadcast(const_cast<float*>(whole), whole_floats() * static_cast<int64_t>(sizeof(float)), 0);
  std::memcpy(local, whole, static_cast<size_t>(floats) * sizeof(float));
}

void ParallelModel::post(const std::vector<int32_t>& words, const KvPool& kv) {
  INFERA_ASSERT(!stopped_, "post after stop_workers");
  const KvPoolShape& shape = kv.shape();
  message_.assign(static_cast<size_t>(kHeaderWords), 0);
  message_[1] = kOpRuntime;
  message_[3] = static_cast<int32_t>(words.size());
  message_[6] = static_cast<int32_t>(shape.num_blocks);
  message_[7] = static_cast<int32_t>(shape.block_size);
  message_[8] = static_cast<int32_t>(shape.dtype);
  message_.insert(message_.end(), words.begin(), words.end());
  message_[0] = static_cast<int32_t>(message_.size());
  send(comm_, message_, merged_sync_);
}

void ParallelModel::stop_workers() {
  if (stopped_) return;
  stopped_ = true;
  stop_parallel_workers(comm_, merged_sync_);
}

void stop_parallel_workers(parallel::Communicator& comm, bool merged_sync) {
  std::vector<int32_t> message;
  encode(ForwardBatch{}, kOpStop, false, StepMemory{}, message);
  send(comm, message, merged_sync);
}

void run_parallel_worker(Model& local, parallel::Communicator& comm, bool merged_sync,
                         const GroupMessageHandler& on_message) {
  INFERA_ASSERT(comm.rank() != 0, "rank 0 drives; the other ranks run the worker loop");
  std::vector<int32_t> message, blocks;
  std::vector<float> logits;  // filled only when logits are all-gathered (textbook sync)
  std::unique_ptr<KvPool> kv;
  // This rank's heads of each sequence's recurrent state, by SeqChunk::state_id (rank 0's
  // sequence memory hands the ids out and zeroes nothing: the model zeroes a state at pos0 0).
  std::vector<std::vector<float>> states;
  std::vector<float> whole;  // a scattered state, every rank's part
  const int64_t state_floats = local.state_shape().floats();
  ForwardBatch batch;
  const int64_t V = local.config().vocab_size;
  for (;;) {
    receive(comm, message, merged_sync);
    if (message[1] == kOpStop) return;
    if (message[1] == kOpStateGather || message[1] == kOpStateScatter) {
      const int64_t floats = message[6];
      const int32_t id = message[7];
      if (floats != state_floats || id < 0) {
        fail("rank {}: a recurrent state of {} floats from rank 0, this rank's part has {} (mismatched shards?)",
             comm.rank(), floats, state_floats);
      }
      if (id >= static_cast<int32_t>(states.size())) states.resize(static_cast<size_t>(id) + 1);
      std::vector<float>& state = states[static_cast<size_t>(id)];
      if (state.empty()) state.assign(static_cast<size_t>(state_floats), 0.0f);
      const int64_t bytes = floats * static_cast<int64_t>(sizeof(float));
      if (message[1] == kOpStateGather) {
        comm.gather(state.data(), bytes, nullptr, 0);
      } else {
        whole.resize(static_cast<size_t>(floats * comm.size()));
        comm.broadcast(whole.data(), bytes * comm.size(), 0);
        std::memcpy(state.data(), whole.data() + static_cast<size_t>(floats) * comm.rank(), static_cast<size_t>(bytes));
      }
      continue;
    }
    if (message[1] != kOpForward && message[1] != kOpRuntime)
      fail("rank {}: unknown step op {} from rank 0 (mismatched infera versions?)", comm.rank(), message[1]);
    // Rank 0's pool geometry: created on the first step, again only if it ever changes
    // (the pool reserves address space; pages are committed as blocks are written).
    const auto dtype = static_cast<DType>(message[8]);
    if (!kv || kv->shape().num_blocks != message[6] || kv->shape().block_size != message[7] || kv->dtype() != dtype) {
      KvPoolShape shape = local.kv_shape(message[7]);
      shape.num_blocks = message[6];
      shape.dtype = dtype;
      kv.reset();
      kv = std::make_unique<KvPool>(shape);
    }
    if (message[1] == kOpRuntime) {
      if (!on_message) fail("rank {}: a runtime message from rank 0 that this rank has no handler for", comm.rank());
      const std::vector<int32_t> words(message.begin() + kHeaderWords, message.begin() + kHeaderWords + message[3]);
      on_message(words, *kv, comm);
      continue;
    }
    decode(message, batch, blocks);
    if (state_floats > 0) {
      if (message[9] > static_cast<int32_t>(states.size())) states.resize(static_cast<size_t>(message[9]));
      for (SeqChunk& s : batch.seqs) {
        if (s.state_id < 0) continue;
        std::vector<float>& state = states[static_cast<size_t>(s.state_id)];
        if (state.empty()) state.assign(static_cast<size_t>(state_floats), 0.0f);
        s.state = state.data();
      }
    }
    const bool want_logits = message[2] != 0;
    if (want_logits) logits.resize(static_cast<size_t>(std::max<int64_t>(batch.num_logit_rows(), 1) * V));
    local.forward(batch, *kv, want_logits ? logits.data() : nullptr);
  }
}

}  // namespace infera
