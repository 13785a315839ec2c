#include "infera/runtime/sequence_runner.h"

#include <algorithm>

#include "infera/base/error.h"

namespace infera {

SequenceRunner::SequenceRunner(Model& model, KvPool& kv, BlockAllocator& blocks, int32_t chunk_tokens)
    : model_(model), kv_(kv), blocks_(blocks), chunk_tokens_(std::max(chunk_tokens, 1)) {
  batch_.seqs.resize(1);
  const StateShape state = model.state_shape();
  if (state.floats() > 0) state_ = std::make_unique<RecurrentMemory>(state, 1, 0);
}

SequenceRunner::~SequenceRunner() { reset(); }

void SequenceRunner::reset() {
  for (int32_t b : block_table_) blocks_.free(b);
  block_table_.clear();
  pos_ = 0;
}

void SequenceRunner::ensure_blocks(int32_t n_positions) {
  const int64_t bs = kv_.shape().block_size;
  while (static_cast<int64_t>(block_table_.size()) * bs < n_positions) {
    const int32_t b = blocks_.allocate();
    if (b < 0) {
      fail(
          "KV cache full: {} tokens need {} blocks of {} tokens but only {} exist (raise --kv-cache-memory or "
          "shorten the prompt)",
          n_positions, (n_positions + bs - 1) / bs, bs, blocks_.num_total());
    }
    block_table_.push_back(b);
  }
}

const float* SequenceRunner::feed(std::span<const int32_t> tokens, bool all_logits) {
  INFERA_ASSERT(!tokens.empty());
  const int32_t vocab = model_.config().vocab_size;
  if (all_logits)
    logits_.resize(tokens.size() * static_cast<size_t>(vocab));
  else
    logits_.resize(vocab);
  size_t done = 0;
  while (done < tokens.size()) {
    const int32_t n = static_cast<int32_t>(std::min<size_t>(chunk_tokens_, tokens.size() - done));
    ensure_blocks(pos_ + n);
    batch_.tokens.assign(tokens.begin() + done, tokens.begin() + done + n);
    SeqChunk& s = batch_.seqs[0];
    s.token_begin = 0;
    s.n_tokens = n;
    s.pos0 = pos_;
    s.block_table = block_table_.data();
    s.n_blocks = static_cast<int32_t>(block_table_.size());
    s.all_logits = all_logits;
    const bool last_chunk = done + n == tokens.size();
    s.last_logits = last_chunk;
    if (state_) state_->bind(0, block_table_, s);  // (pos0 0 after reset(): the model zeroes the state)
    float* out = all_logits ? logits_.data() + done * vocab : (last_chunk ? logits_.data() : nullptr);
    model_.forward(batch_, kv_, out);
    pos_ += n;
    done += n;
  }
  return logits_.data();
}

}  // namespace infera
