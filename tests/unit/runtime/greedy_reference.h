// The reference the batched and speculative paths are compared with: one sequence alone
// through SequenceRunner, greedy.
#pragma once

#include <span>
#include <vector>

#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sampler.h"
#include "infera/runtime/sequence_runner.h"

namespace infera::testing_support {

// `n` greedy tokens after `prompt`, prefilled in chunks of `chunk` tokens.
inline std::vector<int32_t> greedy_alone(Model& model, const std::vector<int32_t>& prompt, int32_t n,
                                         int32_t chunk = 512) {
  KvPoolShape shape = model.kv_shape(16);
  shape.num_blocks = 64;
  KvPool kv(shape);
  BlockAllocator blocks(64);
  SequenceRunner runner(model, kv, blocks, chunk);
  const int32_t vocab = model.config().vocab_size;
  std::vector<int32_t> out;
  const float* logits = runner.feed(prompt);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = argmax(logits, vocab);
    out.push_back(t);
    if (i + 1 < n) logits = runner.feed(std::span<const int32_t>(&t, 1));
  }
  return out;
}

}  // namespace infera::testing_support
