#include "infera/runtime/speculative.h"

#include <algorithm>

#include "infera/base/error.h"

namespace infera {

void ngram_draft(std::span<const int32_t> history, int32_t min_ngram, int32_t max_ngram, int32_t max_draft,
                 std::vector<int32_t>& out) {
  out.clear();
  const int64_t len = static_cast<int64_t>(history.size());
  if (max_draft <= 0 || len < 2 || max_ngram < 1) return;
  const int32_t* h = history.data();
  // Every earlier position `from` (followed by at least one token) scored by how many
  // tokens before it equal the history's last tokens, up to max_ngram; the longest wins,
  // the most recent on ties (in repetitive text it is the likeliest continuation).
  int64_t best_from = -1, best_len = 0;
  for (int64_t from = len - 1; from >= 1; --from) {
    int64_t m = 0;
    while (m < max_ngram && from - 1 - m >= 0 && h[from - 1 - m] == h[len - 1 - m]) ++m;
    if (m > best_len) {
      best_len = m;
      best_from = from;
      if (m == max_ngram) break;
    }
  }
  if (best_len < std::max(min_ngram, 1)) return;
  // Draft no further than the evidence: at most as many tokens as matched. A rejected
  // draft is not free (the verify chunk grows, and a hybrid model restores its recurrent
  // state and re-feeds the kept tokens in an extra forward), and a continuation after a
  // short match is the likeliest to diverge.
  const int64_t count = std::min<int64_t>({max_draft, len - best_from, best_len});
  out.assign(history.begin() + best_from, history.begin() + best_from + count);
}

DraftVerdict speculative_accept(std::span<const float> p, std::span<const float> q, int32_t draft, double u_accept,
                                double u_resample, float threshold) {
  const int64_t V = static_cast<int64_t>(p.size());
  INFERA_ASSERT(draft >= 0 && draft < V);
  INFERA_ASSERT(q.empty() || q.size() == p.size());
  const double p_d = p[draft];
  const double q_d = q.empty() ? 1.0 : q[draft];
  // u < p/q, written without the division (q_d may be 0 for a draft outside q's support).
  if (u_accept * q_d < p_d || (threshold > 0.0f && p_d >= threshold)) return {true, draft};
  // Residual max(0, p - q), normalized: one pass for the mass, one to sample it.
  auto residual = [&](int64_t i) {
    const double qi = q.empty() ? (i == draft ? 1.0 : 0.0) : q[i];
    return std::max(0.0, static_cast<double>(p[i]) - qi);
  };
  double mass = 0;
  for (int64_t i = 0; i < V; ++i) mass += residual(i);
  if (!(mass > 0)) {
    // Only when p == q up to rounding (a rejection then has probability ~0): fall back to p.
    double cum = 0;
    for (int64_t i = 0; i < V; ++i) {
      cum += p[i];
      if (u_resample < cum) return {false, static_cast<int32_t>(i)};
    }
    return {false, draft};
  }
  const double target = u_resample * mass;
  double cum = 0;
  int32_t last = -1;
  for (int64_t i = 0; i < V; ++i) {
    const double r = residual(i);
    if (r <= 0) continue;
    cum += r;
    last = static_cast<int32_t>(i);
    if (target < cum) return {false, last};
  }
  return {false, last};  // rounding at the very top of the range
}

void sampling_distribution(Sampler& sampler, float* logits, std::span<const int32_t> history,
                           std::vector<float>& probs) {
  INFERA_ASSERT(sampler.params().temperature > 0.0f);
  sampler.apply_penalties(logits, history);
  const auto candidates = sampler.candidates(logits);
  const size_t V = probs.size();
  std::fill(probs.begin(), probs.end(), 0.0f);
  for (const auto& [token, prob] : candidates) {
    if (static_cast<size_t>(token) < V) probs[token] = prob;
  }
}

DraftVerdict verify_draft(Sampler& sampler, float* logits, std::span<const int32_t> history, int32_t draft,
                          const float* q, float threshold, std::vector<float>& scratch) {
  const int32_t V = static_cast<int32_t>(scratch.size());
  if (sampler.params().temperature <= 0.0f) {
    // Exactly Sampler::sample's greedy path: penalties, then the argmax.
    sampler.apply_penalties(logits, history);
    const int32_t best = argmax(logits, V);
    return {best == draft, best};
  }
  sampling_distribution(sampler, logits, history, scratch);
  const double u_accept = sampler.next_uniform();
  const double u_resample = sampler.next_uniform();
  return speculative_accept(scratch, q ? std::span<const float>(q, V) : std::span<const float>(), draft, u_accept,
                            u_resample, threshold);
}

int32_t pick_draft(Sampler& sampler, float* logits, std::span<const int32_t> history, float* q_out,
                   std::vector<float>& scratch) {
  const int32_t V = static_cast<int32_t>(scratch.size());
  if (sampler.params().temperature <= 0.0f) {
    sampler.apply_penalties(logits, history);
    return argmax(logits, V);
  }
  sampling_distribution(sampler, logits, history, scratch);
  std::copy(scratch.begin(), scratch.end(), q_out);
  const double u = sampler.next_uniform();
  double cum = 0;
  int32_t last = 0;
  for (int32_t i = 0; i < V; ++i) {
    if (scratch[i] <= 0) continue;
    cum += scratch[i];
    last = i;
    if (u < cum) return i;
  }
  return last;
}

}  // namespace infera
