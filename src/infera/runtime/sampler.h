// Token sampling: greedy, temperature, top-k, top-p, min-p and repetition / presence /
// frequency penalties; seeded and reproducible (the same seed and logits give the same
// token on every machine: the random stream is a fixed 64-bit generator mapped to [0,1)
// by bit arithmetic, not by a library distribution).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace infera {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int32_t top_k = 0;  // 0: off
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;  // 0: off
  float repetition_penalty = 1.0f;  // HF style: logit / r if > 0 else logit * r, for tokens seen
  float presence_penalty = 0.0f;  // OpenAI style: logit -= presence * [count > 0]
  float frequency_penalty = 0.0f;  // OpenAI style: logit -= frequency * count
  int32_t penalty_last_n = 256;  // window of history the penalties look at (-1: all)
  uint64_t seed = 0;
  // > 0: ids from here on are never picked. The tokenizer's size: checkpoints pad the output
  // head past the vocabulary (Qwen: 151936 rows for 151669 tokens), and an id the tokenizer
  // cannot decode must never reach it.
  int32_t vocab_limit = 0;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the logit before
  // sampling (-100 bans a token, +100 all but forces it); log-probabilities stay raw.
  std::vector<std::pair<int32_t, float>> logit_bias = {};
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // Picks the next token from `logits` [vocab] (modified in place) given the tokens so
  // far (prompt and generated) for the penalties.
  int32_t sample(float* logits, std::span<const int32_t> history);

  const SamplingParams& params() const { return params_; }

  // Exposed for tests and speculative decoding: the penalties (and the vocab_limit mask and
  // logit_bias: every sampling path starts here), and the final probability vector the random draw uses
  // (after temperature and truncation), as (token, prob) sorted by prob descending.
  void apply_penalties(float* logits, std::span<const int32_t> history);
  std::vector<std::pair<int32_t, float>> candidates(const float* logits);

  // The next draw of this sampler's seeded stream, in [0, 1) (speculative sampling draws
  // its acceptance tests and resamples from the same stream, so runs stay reproducible).
  double next_uniform();

 private:
  SamplingParams params_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;
  std::vector<int32_t> counts_;  // scratch, [vocab]
  std::vector<std::pair<int32_t, float>> cand_;  // scratch
};

int32_t argmax(const float* x, int32_t n);

// Log-probabilities a request asked for (Request::logprobs). They are the model's RAW
// distribution, log_softmax(logits) of the row the token was sampled from, before
// penalties, temperature and top-k/top-p/min-p (vLLM's default, "raw_logprobs"): they do
// not depend on the sampling settings, and greedy requests get meaningful numbers (the
// processed distribution at temperature 0 is one-hot). Speculative decoding reads them
// from the verify forward's row for the same position, which is that same distribution.
inline constexpr int32_t kMaxTopLogprobs = 20;  // OpenAI's limit on top_logprobs

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  TokenLogprob sampled;  // the generated token
  int32_t sampled_rank = 0;  // 1 + the tokens with a larger logit (1: the most likely)
  std::vector<TokenLogprob> top;  // the most likely tokens, most likely first (ties: lower id first)
};

// `logits` [vocab]: the raw row, used as workspace (overwritten with its softmax; pass a
// copy). `top_n` in [0, kMaxTopLogprobs]. One pass picks the top-n, one the argmax, and the
// SIMD softmax kernel gives the normalizer.
TokenLogprobs token_logprobs(float* logits, int32_t vocab, int32_t token, int32_t top_n);

}  // namespace infera
