// Runs one sequence through a model: prefill in chunks, then token-by-token decode,
// growing its KV block table on demand (a hybrid model's recurrent state in a
// RecurrentMemory of its own). Used by `infera run` and `infera eval`; the serving engine
// batches many sequences instead.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sequence_memory.h"

namespace infera {

class SequenceRunner {
 public:
  SequenceRunner(Model& model, KvPool& kv, BlockAllocator& blocks, int32_t chunk_tokens);
  ~SequenceRunner();

  // Appends `tokens` and returns the logits of the last one [vocab] (or of every token,
  // [n, vocab], when all_logits). Throws infera::Error when the KV budget is exhausted.
  const float* feed(std::span<const int32_t> tokens, bool all_logits = false);
  int32_t num_tokens() const { return pos_; }
  void reset();

 private:
  void ensure_blocks(int32_t n_positions);
  Model& model_;
  KvPool& kv_;
  BlockAllocator& blocks_;
  int32_t chunk_tokens_;
  int32_t pos_ = 0;
  std::vector<int32_t> block_table_;
  std::unique_ptr<RecurrentMemory> state_;  // null for attention-only models
  std::vector<float> logits_;
  ForwardBatch batch_;
};

}  // namespace infera
