// The reference texts of the quantization quality tests: tokens a model finds likely,
// sampled from it at temperature 1, so that KL divergence and top-1 agreement against it
// measure what generation would see.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sequence_runner.h"

namespace infera::quant {

// `sequences` runs of `length` tokens sampled from `model`'s plain softmax (in double), run
// s starting from token first_token + s * first_step; one std::mt19937 seeded `seed` serves
// every run, in order. The runs are concatenated.
inline std::vector<int32_t> sampled_tokens(Model& model, int sequences, int length, uint32_t seed, int32_t first_token,
                                           int32_t first_step) {
  KvPoolShape s = model.kv_shape(16);
  s.num_blocks = (length + 15) / 16 + 1;
  KvPool kv(s);
  BlockAllocator blocks(static_cast<int32_t>(s.num_blocks));
  SequenceRunner runner(model, kv, blocks, 64);
  std::mt19937 rng(seed);
  std::vector<int32_t> all;
  const int64_t V = model.config().vocab_size;
  for (int seq = 0; seq < sequences; ++seq) {
    runner.reset();
    std::vector<int32_t> toks = {first_token + seq * first_step};
    const float* logits = runner.feed(toks);
    for (int i = 1; i < length; ++i) {
      std::vector<double> p(V);
      double mx = -INFINITY, sum = 0.0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
      for (int64_t v = 0; v < V; ++v) sum += p[v] = std::exp(logits[v] - mx);
      double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
      int32_t next = static_cast<int32_t>(V - 1);
      for (int64_t v = 0; v < V; ++v) {
        if ((u -= p[v]) <= 0.0) {
          next = static_cast<int32_t>(v);
          break;
        }
      }
      toks.push_back(next);
      logits = runner.feed(std::vector<int32_t>{next});
    }
    all.insert(all.end(), toks.begin(), toks.end());
  }
  return all;
}

}  // namespace infera::quant
