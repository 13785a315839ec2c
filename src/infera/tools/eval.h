// Perplexity of a model over a token sequence and, against a reference model, the KL
// divergence and top-1 agreement of the next-token distributions (`infera eval`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace infera {
class Model;
}

namespace infera::tools {

struct EvalResult {
  int64_t tokens = 0;  // predictions scored
  double ppl = 0.0;  // exp(mean negative log-likelihood)
  bool has_ref = false;
  double ref_ppl = 0.0;
  double kl_mean = 0.0;  // mean over tokens of KL(ref || model), nats
  double kl_p99 = 0.0;  // 99th percentile of the per-token KL
  double top1_agreement = 0.0;  // fraction of tokens where both argmaxes agree
};

// Splits `tokens` into consecutive windows of `ctx` tokens, each a fresh sequence (its
// first token is context only); inside a window token i + 1 is scored from the logits at
// i. `ref` may be nullptr (perplexity only). Throws infera::Error when the models'
// vocabularies differ or there are fewer than 2 tokens.
EvalResult evaluate(Model& model, Model* ref, const std::vector<int32_t>& tokens, int32_t ctx);

std::string eval_result_json(const EvalResult& r);

}  // namespace infera::tools
