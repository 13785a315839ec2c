#include "infera/quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "infera/base/error.h"
#include "infera/base/text_file.h"
#include "infera/model/blocks.h"
#include "infera/model/model.h"
#include "infera/runtime/block_allocator.h"
#include "infera/runtime/sequence_runner.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera::quant {

std::vector<float> ChannelStats::mean_sq() const {
  std::vector<float> out(sum_sq.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(sum_sq[k] / std::max<int64_t>(count, 1));
  return out;
}

std::vector<float> ChannelStats::mean_abs() const {
  std::vector<float> out(sum_abs.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(sum_abs[k] / std::max<int64_t>(count, 1));
  return out;
}

namespace {

void accumulate(ChannelStats& s, const float* x, int64_t m, int64_t k) {
  if (s.sum_sq.empty()) {
    s.sum_sq.assign(k, 0.0);
    s.sum_abs.assign(k, 0.0);
    s.max_abs.assign(k, 0.0f);
  }
  INFERA_ASSERT(static_cast<int64_t>(s.sum_sq.size()) == k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < k; ++t) {
      const float v = x[i * k + t];
      s.sum_sq[t] += static_cast<double>(v) * v;
      s.sum_abs[t] += std::fabs(v);
      s.max_abs[t] = std::max(s.max_abs[t], std::fabs(v));
    }
  }
  s.count += m;
}

void remove_observers() {
  kernels::set_linear_observer({});
  set_expert_observer({});
}

}  // namespace

std::vector<int32_t> calibration_tokens(const std::string& model_dir, const std::string& calib_file,
                                        int64_t max_tokens) {
  if (max_tokens < 1) fail("--calib-tokens {}: the calibration needs at least 1 token", max_tokens);
  const std::string text = read_text_file(calib_file, "the calibration text (--calib)");
  if (text.empty()) fail("--calib {}: the calibration file is empty", calib_file);
  const Tokenizer tok = Tokenizer::load(model_dir);
  std::vector<int32_t> ids = tok.encode(text);
  if (ids.empty()) fail("--calib {}: the calibration text gives no tokens", calib_file);
  if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(static_cast<size_t>(max_tokens));
  return ids;
}

ActivationStats collect_activation_stats(Model& model, const std::vector<int32_t>& tokens, int32_t ctx,
                                         ExpertActivationStats* experts) {
  ActivationStats stats;
  if (tokens.empty()) return stats;
  ctx = std::max(ctx, 2);
  kernels::set_linear_observer([&stats](std::string_view name, const float* x, int64_t m, int64_t k) {
    accumulate(stats[std::string(name)], x, m, k);
  });
  if (experts) {
    set_expert_observer([experts](std::string_view name, int64_t expert, const float* x, int64_t m, int64_t k) {
      std::vector<ChannelStats>& per = (*experts)[std::string(name)];
      if (static_cast<int64_t>(per.size()) <= expert) per.resize(static_cast<size_t>(expert) + 1);
      accumulate(per[static_cast<size_t>(expert)], x, m, k);
    });
  }
  try {
    KvPoolShape shape = model.kv_shape(16);
    shape.num_blocks = (ctx + 15) / 16;
    KvPool kv(shape);
    BlockAllocator blocks(static_cast<int32_t>(shape.num_blocks));
    SequenceRunner runner(model, kv, blocks, 128);
    for (size_t begin = 0; begin < tokens.size(); begin += ctx) {
      const size_t n = std::min<size_t>(ctx, tokens.size() - begin);
      runner.reset();
      runner.feed(std::span<const int32_t>(tokens.data() + begin, n));
    }
  } catch (...) {
    remove_observers();
    throw;
  }
  remove_observers();
  return stats;
}

}  // namespace infera::quant
