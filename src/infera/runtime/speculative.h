// Speculative decoding building blocks (docs/speculative.md): n-gram (prompt lookup)
// drafting, and the acceptance rule that keeps the output distribution of the target model.
//
// One verify step of a sequence feeds [x_n, d_1 .. d_k] (the last sampled token and k
// draft tokens) with every row's logits; row i gives the target distribution p_i of the
// token after d_i (row 0: after x_n). Walking i = 1..k:
//   greedy (temperature 0): accept d_i while it is the argmax of row i-1, else emit the
//     argmax (the correction) and stop: token for token what plain greedy decoding emits;
//   sampling: accept d_i with probability min(1, p(d_i) / q(d_i)), q being the draft's
//     distribution (one-hot for n-gram drafts); on rejection emit a sample of the residual
//     max(0, p - q) / sum and stop. Then every emitted token is distributed exactly as p
//     (Leviathan et al. 2023; Chen et al. 2023).
// When every draft is accepted, row k gives one more ("bonus") token. p and q come from
// the request's own sampling transform (penalties over the history including earlier
// drafts, temperature, top-k, top-p, min-p), so the guarantee holds for the distribution
// the request asked for.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "infera/runtime/sampler.h"

namespace infera {

// Prompt lookup: finds the most recent earlier occurrence of the last n tokens of
// `history` (n = max_ngram down to min_ngram, first hit wins) and writes into `out` the
// tokens that followed it, at most min(max_draft, n) (and never past the end of the
// history): a draft is trusted as far as the match behind it, since rejected drafts cost
// verify work (and on hybrid models an extra forward; measured on models/infera-default,
// drafting up to 4 tokens after any match gave 1.2-1.4x, capped at the match 1.5-1.6x).
// `out` is cleared first; it stays empty when nothing matches.
void ngram_draft(std::span<const int32_t> history, int32_t min_ngram, int32_t max_ngram, int32_t max_draft,
                 std::vector<int32_t>& out);

struct DraftVerdict {
  bool accepted = false;
  int32_t token = -1;  // the draft when accepted, else the replacement to emit
};

// The acceptance rule on explicit distributions. p: target [vocab]; q: draft [vocab], or
// empty for a deterministic draft (q = one-hot at `draft`); u_accept, u_resample: uniform
// draws in [0, 1). threshold > 0 additionally accepts any draft with p(draft) >= threshold
// (biased: trades fidelity for speed).
DraftVerdict speculative_accept(std::span<const float> p, std::span<const float> q, int32_t draft, double u_accept,
                                double u_resample, float threshold = 0.0f);

// The request's sampling distribution over the whole vocabulary: `logits` [vocab] get the
// penalties over `history` in place, then temperature, top-k, top-p and min-p. `probs`
// receives [vocab] (zero outside the kept candidates). Temperature must be > 0.
void sampling_distribution(Sampler& sampler, float* logits, std::span<const int32_t> history,
                           std::vector<float>& probs);

// Verifies one draft token against the target logits of the row before it (modified in
// place). `q`: the draft distribution [vocab], or null for a deterministic (n-gram or
// greedy) draft. Greedy requests compare with the argmax; others apply
// speculative_accept with draws from the sampler's stream. `scratch` holds p.
DraftVerdict verify_draft(Sampler& sampler, float* logits, std::span<const int32_t> history, int32_t draft,
                          const float* q, float threshold, std::vector<float>& scratch);

// Picks a draft token from draft-model logits (modified in place) with the request's own
// transform: the argmax for greedy requests (q_out untouched), else a sample of the
// transformed distribution, whose probabilities are written to q_out [vocab].
int32_t pick_draft(Sampler& sampler, float* logits, std::span<const int32_t> history, float* q_out,
                   std::vector<float>& scratch);

}  // namespace infera
