#include "infera/tools/eval.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sequence_runner.h"

namespace infera::tools {
namespace {

// One model's private KV for windows of ctx tokens.
struct Runner {
  KvPool kv;
  BlockAllocator blocks;
  SequenceRunner runner;
  static KvPoolShape shape_for(Model& m, int32_t ctx) {
    KvPoolShape s = m.kv_shape(16);
    s.num_blocks = (ctx + 15) / 16;
    return s;
  }
  Runner(Model& m, int32_t ctx)
      : kv(shape_for(m, ctx)), blocks(static_cast<int32_t>((ctx + 15) / 16)), runner(m, kv, blocks, 128) {}
};

// log-softmax of one row into out (double precision).
void log_softmax(const float* logits, int64_t n, std::vector<double>& out) {
  out.resize(n);
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - lse;
}

}  // namespace

EvalResult evaluate(Model& model, Model* ref, const std::vector<int32_t>& tokens, int32_t ctx) {
  if (tokens.size() < 2) fail("eval: the text has {} tokens; at least 2 are needed", tokens.size());
  const int64_t V = model.config().vocab_size;
  if (ref && ref->config().vocab_size != V) {
    fail("eval: the reference model's vocabulary ({}) differs from the model's ({})", ref->config().vocab_size, V);
  }
  ctx = std::max(ctx, 2);
  Runner a(model, ctx);
  std::unique_ptr<Runner> b = ref ? std::make_unique<Runner>(*ref, ctx) : nullptr;
  EvalResult r;
  r.has_ref = ref != nullptr;
  double nll = 0.0, ref_nll = 0.0;
  int64_t agree = 0;
  std::vector<double> kls, lp, lq;
  for (size_t begin = 0; begin + 1 < tokens.size(); begin += ctx) {
    const size_t n = std::min<size_t>(ctx, tokens.size() - begin);
    if (n < 2) break;
    const std::span<const int32_t> window(tokens.data() + begin, n);
    a.runner.reset();
    const float* la = a.runner.feed(window, /*all_logits=*/true);
    const float* lb = nullptr;
    if (b) {
      b->runner.reset();
      lb = b->runner.feed(window, true);
    }
    for (size_t i = 0; i + 1 < n; ++i) {
      const int32_t next = window[i + 1];
      log_softmax(la + i * V, V, lq);
      nll -= lq[next];
      if (b) {
        log_softmax(lb + i * V, V, lp);
        ref_nll -= lp[next];
        double kl = 0.0;
        for (int64_t v = 0; v < V; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
        kls.push_back(std::max(kl, 0.0));
        const int64_t am = std::max_element(la + i * V, la + (i + 1) * V) - (la + i * V);
        const int64_t bm = std::max_element(lb + i * V, lb + (i + 1) * V) - (lb + i * V);
        agree += am == bm;
      }
      ++r.tokens;
    }
  }
  r.ppl = std::exp(nll / r.tokens);
  if (b) {
    r.ref_ppl = std::exp(ref_nll / r.tokens);
    double sum = 0.0;
    for (double k : kls) sum += k;
    r.kl_mean = sum / kls.size();
    std::sort(kls.begin(), kls.end());
    r.kl_p99 = kls[std::min(kls.size() - 1, static_cast<size_t>(std::ceil(0.99 * kls.size())) - 1)];
    r.top1_agreement = static_cast<double>(agree) / r.tokens;
  }
  return r;
}

std::string eval_result_json(const EvalResult& r) {
  nlohmann::json j;
  j["tokens"] = r.tokens;
  j["ppl"] = r.ppl;
  if (r.has_ref) {
    j["ref_ppl"] = r.ref_ppl;
    j["kl_mean"] = r.kl_mean;
    j["kl_p99"] = r.kl_p99;
    j["top1_agreement"] = r.top1_agreement;
  }
  return j.dump();
}

}  // namespace infera::tools
