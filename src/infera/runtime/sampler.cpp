#include "infera/runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "infera/base/error.h"
#include "infera/kernels/kernels.h"

namespace infera {

int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size)
    : params_(params), vocab_size_(vocab_size), rng_(params.seed), counts_(vocab_size, 0) {}

double Sampler::next_uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::apply_penalties(float* logits, std::span<const int32_t> history) {
  const SamplingParams& p = params_;
  if (p.vocab_limit > 0) {
    // Padding rows of the output head: -inf gives them probability 0 on every path (greedy,
    // truncation, speculative acceptance). The limit keeps at least one id.
    for (int32_t i = std::max<int32_t>(p.vocab_limit, 1); i < vocab_size_; ++i) logits[i] = -INFINITY;
  }
  for (const auto& [token, bias] : p.logit_bias) {
    if (token >= 0 && token < vocab_size_) logits[token] += bias;
  }
  if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  size_t begin = 0;
  if (p.penalty_last_n >= 0 && history.size() > static_cast<size_t>(p.penalty_last_n)) {
    begin = history.size() - p.penalty_last_n;
  }
  for (size_t i = begin; i < history.size(); ++i) {
    if (history[i] >= 0 && history[i] < vocab_size_) ++counts_[history[i]];
  }
  for (size_t i = begin; i < history.size(); ++i) {
    const int32_t t = history[i];
    if (t < 0 || t >= vocab_size_ || counts_[t] == 0) continue;
    float& l = logits[t];
    if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(counts_[t]);
    counts_[t] = 0;  // each distinct token once; also resets the scratch
  }
}

std::vector<std::pair<int32_t, float>> Sampler::candidates(const float* logits) {
  const SamplingParams& p = params_;
  cand_.clear();
  cand_.reserve(vocab_size_);
  for (int32_t i = 0; i < vocab_size_; ++i) cand_.emplace_back(i, logits[i]);
  auto by_logit = [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  size_t n = cand_.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p.top_k, cand_.end(), by_logit);
    n = p.top_k;
    cand_.resize(n);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax at temperature over the survivors (sorted: cand_[0] is the max).
  const float inv_t = 1.0f / p.temperature;
  const float max_l = cand_[0].second;
  double sum = 0;
  for (auto& c : cand_) {
    c.second = std::exp((c.second - max_l) * inv_t);
    sum += c.second;
  }
  for (auto& c : cand_) c.second = static_cast<float>(c.second / sum);
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      cum += cand_[i].second;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
  }
  if (p.min_p > 0.0f) {
    const float threshold = p.min_p * cand_[0].second;
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].second >= threshold) ++keep;
    cand_.resize(keep);
  }
  double total = 0;
  for (const auto& c : cand_) total += c.second;
  for (auto& c : cand_) c.second = static_cast<float>(c.second / total);
  return cand_;
}

int32_t Sampler::sample(float* logits, std::span<const int32_t> history) {
  apply_penalties(logits, history);
  if (params_.temperature <= 0.0f) return argmax(logits, vocab_size_);
  const auto& cand = candidates(logits);
  const double u = next_uniform();
  double cum = 0;
  for (const auto& c : cand) {
    cum += c.second;
    if (u < cum) return c.first;
  }
  return cand.back().first;
}

TokenLogprobs token_logprobs(float* logits, int32_t vocab, int32_t token, int32_t top_n) {
  INFERA_ASSERT(vocab > 0 && token >= 0 && token < vocab);
  INFERA_ASSERT(top_n >= 0 && top_n <= kMaxTopLogprobs);
  // The raw values needed afterwards: the sampled token's and the top-n's logits. Insertion
  // into a list of at most top_n (token, logit), best first: after the first few rows almost
  // every logit loses to the current last entry in one comparison.
  TokenLogprobs out;
  out.sampled = {token, logits[token]};
  std::vector<TokenLogprob>& top = out.top;
  top.reserve(top_n + 1);
  auto better = [](float a_logit, int32_t a, const TokenLogprob& b) {
    return a_logit > b.logprob || (a_logit == b.logprob && a < b.token);
  };
  const float own = logits[token];
  int32_t above = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    above += l > own ? 1 : 0;
    if (top_n == 0 || (static_cast<int32_t>(top.size()) == top_n && !better(l, i, top.back()))) continue;
    auto at = top.end();
    while (at != top.begin() && better(l, i, *(at - 1))) --at;
    top.insert(at, TokenLogprob{i, l});
    if (static_cast<int32_t>(top.size()) > top_n) top.pop_back();
  }
  // log Z = max + log(sum exp(l - max)). The SIMD softmax kernel does the exponentials; its
  // entry at the argmax is exp(0) / sum = 1 / sum, which gives the sum back.
  const int32_t best = argmax(logits, vocab);
  const double max_logit = logits[best];
  kernels::softmax(logits, vocab);
  const double log_z = max_logit - std::log(static_cast<double>(logits[best]));
  // Differences of raw logits, not logs of probabilities: exact far into the tail, where a
  // probability would underflow to 0.
  out.sampled.logprob = static_cast<float>(out.sampled.logprob - log_z);
  out.sampled_rank = 1 + above;
  for (TokenLogprob& t : top) t.logprob = static_cast<float>(t.logprob - log_z);
  return out;
}

}  // namespace infera
