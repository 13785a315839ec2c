#include "infera/runtime/constraint_state.h"

#include <algorithm>
#include <cmath>

#include "infera/base/log.h"

namespace infera {

namespace {
// A token can add at most this many bytes to the fewest that complete the output (closing
// brackets and quotes of what it opens); with more budget left the mask ignores the budget.
constexpr int32_t kBudgetSlack = 128;
}  // namespace

ConstraintState::ConstraintState(ConstraintRequest request, std::vector<int32_t> stop_ids)
    : request_(std::move(request)),
      stop_ids_(std::move(stop_ids)),
      matcher_(request_.compiled->grammar()),
      phase_(request_.start_token >= 0 && request_.open_token < 0 ? Phase::kWaiting : Phase::kActive),
      strip_(request_.strip_leading_spaces) {
  mask_.resize(request_.compiled->vocab().mask_words());
}

bool ConstraintState::is_stop(int32_t token) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
}

size_t ConstraintState::leading_spaces(const std::string& bytes) const {
  size_t n = 0;
  while (n < bytes.size() && n < static_cast<size_t>(strip_) && bytes[n] == ' ') ++n;
  return n;
}

std::string ConstraintState::stripped(int32_t token) const {
  const auto& vocab = request_.compiled->vocab();
  if (token < 0 || token >= vocab.size()) return {};
  std::string bytes = vocab.bytes(token);
  if (strip_ > 0) bytes.erase(0, leading_spaces(bytes));
  return bytes;
}

const std::vector<uint64_t>& ConstraintState::mask(int32_t budget) {
  const auto& vocab = request_.compiled->vocab();
  std::fill(mask_.begin(), mask_.end(), 0);
  if (phase_ != Phase::kActive) {
    std::fill(mask_.begin(), mask_.end(), ~uint64_t{0});
    return mask_;
  }
  if (finished()) {  // the engine ends the sequence; a token verified past it is not constrained
    std::fill(mask_.begin(), mask_.end(), ~uint64_t{0});
    return mask_;
  }
  int64_t allowed = 0;
  if (strip_ > 0) {
    // The output has not begun: tokens count without the spaces the detokenizer drops
    // (rare, one position; the trie holds the unstripped bytes, so every token is tried).
    for (int32_t t = 0; t < vocab.size(); ++t) {
      if (!vocab.usable(t) || vocab.bytes(t).empty()) continue;
      const std::string b = stripped(t);
      if (matcher_.accept(b)) {
        matcher_.rollback(1);
        mask_[t >> 6] |= uint64_t{1} << (t & 63);
        ++allowed;
      }
    }
  } else {
    // One token of the budget is kept for the stop token that ends a whole output.
    const int32_t room = budget - (stop_ids_.empty() ? 0 : 1);
    const uint32_t rest = matcher_.min_remaining();
    if (room > 0 && static_cast<int64_t>(room) <= static_cast<int64_t>(rest) + kBudgetSlack)
      allowed = request_.compiled->mask(matcher_, mask_.data(), static_cast<uint32_t>(room));
    // Nothing fits the budget: a whole output ends (stop tokens below); else the budget is
    // lost anyway (max_tokens below the fewest bytes that complete it), the mask unbounded.
    if (allowed == 0 && !matcher_.complete()) allowed = request_.compiled->mask(matcher_, mask_.data());
  }
  if (matcher_.complete()) {
    for (int32_t t : stop_ids_) {
      if (t >= 0 && t < vocab.size()) {
        mask_[t >> 6] |= uint64_t{1} << (t & 63);
        ++allowed;
      }
    }
  }
  if (steps_.empty() && request_.open_token >= 0 && request_.open_token < vocab.size()) {
    mask_[request_.open_token >> 6] |= uint64_t{1} << (request_.open_token & 63);
    ++allowed;
  }
  if (allowed == 0) {
    // Nothing in this vocabulary continues the constraint: better unconstrained than stuck.
    LOG_WARN("constraint: no token of the vocabulary continues the output; this position is unconstrained");
    std::fill(mask_.begin(), mask_.end(), ~uint64_t{0});
  }
  return mask_;
}

void ConstraintState::apply(float* logits, int32_t vocab_size, int32_t budget) {
  if (phase_ != Phase::kActive) return;
  const std::vector<uint64_t>& m = mask(budget);
  const int32_t covered = std::min<int32_t>(vocab_size, static_cast<int32_t>(m.size() * 64));
  for (int32_t w = 0; w * 64 < covered; ++w) {
    const uint64_t bits = m[w];
    if (bits == ~uint64_t{0}) continue;
    const int32_t end = std::min(covered, (w + 1) * 64);
    for (int32_t t = w * 64; t < end; ++t) {
      if (!((bits >> (t & 63)) & 1)) logits[t] = -INFINITY;
    }
  }
  for (int32_t t = covered; t < vocab_size; ++t) logits[t] = -INFINITY;  // padding rows
}

void ConstraintState::accept(int32_t token) {
  Step s{phase_, false, strip_};
  if (phase_ == Phase::kWaiting) {
    if (token == request_.start_token) {
      phase_ = Phase::kActive;
      matcher_.restart();
      s.fed = true;
    }
  } else if (steps_.empty() && token == request_.open_token && request_.open_token >= 0) {
    phase_ = Phase::kWaiting;
  } else if (!is_stop(token)) {
    const std::string bytes = stripped(token);
    const size_t dropped = strip_ > 0 ? leading_spaces(request_.compiled->vocab().bytes(token)) : 0;
    if (matcher_.accept(bytes)) {
      s.fed = true;
      // As the detokenizer: the spaces it dropped count, and any other byte begins the output.
      strip_ = bytes.empty() ? strip_ - static_cast<int32_t>(dropped) : 0;
      if (request_.rearm && matcher_.complete() && !matcher_.can_continue()) phase_ = Phase::kWaiting;
    } else {
      LOG_DEBUG("constraint: token {} is outside the constraint (an unconstrained position)", token);
    }
  }
  steps_.push_back(s);
}

void ConstraintState::rollback(size_t n) {
  n = std::min(n, steps_.size());
  for (size_t i = 0; i < n; ++i) {
    const Step s = steps_.back();
    steps_.pop_back();
    if (s.fed) matcher_.rollback(1);
    phase_ = s.before;
    strip_ = s.strip_before;
  }
}

bool ConstraintState::finished() const {
  return phase_ == Phase::kActive && !request_.rearm && stop_ids_.empty() && matcher_.complete() &&
         !matcher_.can_continue();
}

}  // namespace infera
