// A stand-in Model for runtime tests: no weights, O(1) per token, but its next token is a
// hash of the WHOLE history read back from the paged KV cache, and every read checks the
// position stored with the token. So any block-table bug (a block shared that should
// not be, a cached block overwritten, a preempted sequence resumed with stale blocks)
// changes the output or throws, exactly as it would corrupt a real model's attention,
// while tests stay fast enough to run thousands of steps.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "infera/base/error.h"
#include "infera/model/model.h"

namespace infera::testing {

// The token ProbeModel predicts after `history` (what a correct engine must generate).
inline int32_t probe_next_token(std::span<const int32_t> history, int32_t vocab) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : history) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
  return static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(vocab));
}

// Greedy continuation of `prompt` for `n` tokens, computed directly.
inline std::vector<int32_t> probe_generate(std::vector<int32_t> prompt, int32_t n, int32_t vocab) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = probe_next_token(prompt, vocab);
    out.push_back(t);
    prompt.push_back(t);
  }
  return out;
}

class ProbeModel : public Model {
 public:
  // KV geometry is free: tests of resident memory pick a realistic bytes-per-token.
  ProbeModel(int32_t vocab = 64, int32_t max_positions = 4096, int64_t num_layers = 2, int64_t n_kv_heads = 1,
             int64_t head_dim = 2)
      : layers_(num_layers), heads_(n_kv_heads), dim_(head_dim) {
    INFERA_ASSERT(head_dim >= 2);
    config_.vocab_size = vocab;
    config_.max_position_embeddings = max_positions;
    config_.num_layers = static_cast<int>(num_layers);
  }

  KvPoolShape kv_shape(int64_t block_size) const override {
    KvPoolShape s;
    s.num_layers = layers_;
    s.block_size = block_size;
    s.n_kv_heads = heads_;
    s.head_dim = dim_;
    return s;
  }

  void forward(const ForwardBatch& batch, KvPool& kv, float* logits) override {
    ++num_forwards;
    const KvPoolShape& s = kv.shape();
    const int64_t row = s.n_kv_heads * s.head_dim;  // floats per token per layer
    const int32_t vocab = config_.vocab_size;
    int64_t out_row = 0;
    for (const SeqChunk& c : batch.seqs) {
      tokens_fed += c.n_tokens;
      max_chunk_tokens = std::max<int64_t>(max_chunk_tokens, c.n_tokens);
      for (int32_t i = 0; i < c.n_tokens; ++i) {
        const int32_t p = c.pos0 + i;
        for (int64_t l = 0; l < s.num_layers; ++l) {
          for (int is_v = 0; is_v < 2; ++is_v) {
            float* dst = slot(kv, c, p, l, is_v != 0);
            // Touch the whole row, as a real model writes every head.
            for (int64_t j = 0; j < row; ++j) dst[j] = static_cast<float>(j);
            dst[0] = static_cast<float>(batch.tokens[c.token_begin + i]);
            dst[1] = static_cast<float>(p);
          }
        }
      }
      if (!c.last_logits && !c.all_logits) continue;
      if (c.all_logits) throw Error("ProbeModel: all_logits is not supported");
      // Read the history back from the cache (layer 1's V if present: a different
      // region than the one just written first), checking every stored position.
      const int64_t last = c.pos0 + c.n_tokens - 1;
      history_.clear();
      for (int64_t q = 0; q <= last; ++q) {
        const float* src = slot(kv, c, q, s.num_layers - 1, true);
        if (static_cast<int64_t>(src[1]) != q) {
          throw Error(fmt::format("ProbeModel: KV slot for position {} holds position {}", q, src[1]));
        }
        history_.push_back(static_cast<int32_t>(src[0]));
      }
      float* out = logits + out_row * vocab;
      for (int32_t v = 0; v < vocab; ++v) out[v] = 0.0f;
      out[probe_next_token(history_, vocab)] = 1.0f;
      ++out_row;
    }
  }

  int64_t weight_bytes_per_token() const override { return 0; }
  int64_t num_parameters() const override { return 0; }

  int64_t num_forwards = 0;
  int64_t tokens_fed = 0;
  int64_t max_chunk_tokens = 0;

 private:
  static float* slot(KvPool& kv, const SeqChunk& c, int64_t pos, int64_t layer, bool is_v) {
    const KvPoolShape& s = kv.shape();
    const int64_t bi = pos / s.block_size;
    if (bi >= c.n_blocks)
      throw Error(fmt::format("ProbeModel: position {} is past the block table ({} blocks)", pos, c.n_blocks));
    const int64_t block = c.block_table[bi];
    if (block < 0 || block >= s.num_blocks) throw Error(fmt::format("ProbeModel: block id {} out of range", block));
    float* base = is_v ? kv.v(layer) : kv.k(layer);
    return base + ((block * s.block_size + pos % s.block_size) * s.n_kv_heads) * s.head_dim;
  }

  int64_t layers_, heads_, dim_;
  std::vector<int32_t> history_;
};

}  // namespace infera::testing
