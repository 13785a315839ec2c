#include "infera/runtime/constraint_state.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "infera/base/log.h"

namespace infera {

namespace {
// A token can add at most this many bytes to the fewest that complete the output (closing
// brackets and quotes of what it opens); with more budget left the mask ignores the budget.
constexpr int32_t kBudgetSlack = 128;
}  // namespace

// One mask computed ahead. The owner and a pool thread race to start it (the first to move
// it out of kQueued runs it); the owner may instead cancel it while still queued.
struct ConstraintState::Pending {
  enum : int { kQueued, kRunning, kDone, kCancelled };
  std::atomic<int> state{kQueued};
  std::function<void()> fn;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;

  bool try_run() {
    int expected = kQueued;
    if (!state.compare_exchange_strong(expected, kRunning)) return false;
    fn();
    {
      std::lock_guard lock(mutex);
      done = true;
      state = kDone;
    }
    cv.notify_all();
    return true;
  }
  void wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return done; });
  }
  // Runs it here unless a pool thread has it; then waits for that thread.
  void settle() {
    if (!try_run()) wait();
  }
  void cancel() {
    int expected = kQueued;
    if (!state.compare_exchange_strong(expected, kCancelled)) wait();  // running or done
  }
};

namespace {

// The process-wide mask threads: a fixed number, started on first use.
class MaskPool {
 public:
  static MaskPool& instance() {
    static MaskPool pool;
    return pool;
  }
  static int threads() {
    static const int n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 4);
    return n;
  }
  void submit(std::shared_ptr<ConstraintState::Pending> p) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(p));
    }
    cv_.notify_one();
  }
  ~MaskPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  MaskPool() {
    for (int i = 0; i < threads(); ++i) threads_.emplace_back([this] { run(); });
  }
  void run() {
    for (;;) {
      std::shared_ptr<ConstraintState::Pending> p;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      p->try_run();  // no-op when its owner took it over or cancelled it
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ConstraintState::Pending>> queue_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace

int ConstraintState::mask_threads() { return MaskPool::threads(); }

ConstraintState::ConstraintState(ConstraintRequest request, std::vector<int32_t> stop_ids)
    : request_(std::move(request)),
      stop_ids_(std::move(stop_ids)),
      matcher_(request_.compiled->grammar()),
      phase_((request_.start_token >= 0 || !request_.start_text.empty()) && request_.open_token < 0 ? Phase::kWaiting
                                                                                                    : Phase::kActive),
      strip_(request_.strip_leading_spaces) {
  mask_.resize(request_.compiled->vocab().mask_words());
  const std::string& tag = request_.start_text;
  tag_fail_.assign(tag.size(), 0);
  for (size_t i = 1, k = 0; i < tag.size(); ++i) {
    while (k > 0 && tag[i] != tag[k]) k = static_cast<size_t>(tag_fail_[k - 1]);
    if (tag[i] == tag[k]) ++k;
    tag_fail_[i] = static_cast<int32_t>(k);
  }
  update_finished();
}

ConstraintState::~ConstraintState() { cancel_next(); }

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

int32_t ConstraintState::tag_step(int32_t matched, uint8_t byte) const {
  const std::string& tag = request_.start_text;
  if (matched == static_cast<int32_t>(tag.size())) matched = tag_fail_[matched - 1];
  while (matched > 0 && static_cast<uint8_t>(tag[matched]) != byte) matched = tag_fail_[matched - 1];
  if (static_cast<uint8_t>(tag[matched]) == byte) ++matched;
  return matched;
}

void ConstraintState::update_finished() {
  finished_ = phase_ == Phase::kActive && !request_.rearm && stop_ids_.empty() && matcher_.complete() &&
              !matcher_.can_continue();
}

void ConstraintState::compute_tag_mask(std::vector<uint64_t>& out) {
  // Every token is allowed except one that completes start_text with bytes after it that the
  // constraint cannot begin with. Only while the text is partly written (a token or two).
  const auto& vocab = request_.compiled->vocab();
  std::fill(out.begin(), out.end(), ~uint64_t{0});
  const int32_t n = static_cast<int32_t>(request_.start_text.size());
  for (int32_t t = 0; t < vocab.size(); ++t) {
    const std::string& bytes = vocab.bytes(t);
    int32_t k = tag_;
    for (size_t i = 0; i < bytes.size(); ++i) {
      k = tag_step(k, static_cast<uint8_t>(bytes[i]));
      if (k < n) continue;
      const std::string_view rest = std::string_view(bytes).substr(i + 1);
      matcher_.restart();
      const bool ok = rest.empty() || matcher_.accept(rest);
      matcher_.rollback(ok && !rest.empty() ? 2 : 1);
      if (!ok) out[t >> 6] &= ~(uint64_t{1} << (t & 63));
      break;
    }
  }
}

void ConstraintState::compute(int32_t budget, std::vector<uint64_t>& out) {
  const auto& vocab = request_.compiled->vocab();
  if (phase_ != Phase::kActive) {
    if (tag_ > 0)
      compute_tag_mask(out);
    else
      std::fill(out.begin(), out.end(), ~uint64_t{0});
    return;
  }
  if (finished_) {  // the engine ends the sequence; a token verified past it is not constrained
    std::fill(out.begin(), out.end(), ~uint64_t{0});
    return;
  }
  std::fill(out.begin(), out.end(), 0);
  int64_t allowed = 0;
  if (strip_ > 0) {
    // The output has not begun: tokens count without the spaces the detokenizer drops
    // (rare, one position; the trie holds the unstripped bytes, so every token is tried).
    for (int32_t t = 0; t < vocab.size(); ++t) {
      if (!vocab.usable(t) || vocab.bytes(t).empty()) continue;
      const std::string b = stripped(t);
      if (matcher_.accept(b)) {
        matcher_.rollback(1);
        out[t >> 6] |= uint64_t{1} << (t & 63);
        ++allowed;
      }
    }
  } else {
    // One token of the budget is kept for the stop token that ends a whole output.
    const int32_t room = budget - (stop_ids_.empty() ? 0 : 1);
    const uint32_t rest = matcher_.min_remaining();
    if (room > 0 && static_cast<int64_t>(room) <= static_cast<int64_t>(rest) + kBudgetSlack)
      allowed = request_.compiled->mask(matcher_, out.data(), static_cast<uint32_t>(room));
    // Nothing fits the budget: a whole output ends (stop tokens below); else the budget is
    // lost anyway (max_tokens below the fewest bytes that complete it), the mask unbounded.
    if (allowed == 0 && !matcher_.complete()) allowed = request_.compiled->mask(matcher_, out.data());
  }
  if (matcher_.complete()) {
    for (int32_t t : stop_ids_) {
      if (t >= 0 && t < vocab.size()) {
        out[t >> 6] |= uint64_t{1} << (t & 63);
        ++allowed;
      }
    }
  }
  if (steps_.empty() && request_.open_token >= 0 && request_.open_token < vocab.size()) {
    out[request_.open_token >> 6] |= uint64_t{1} << (request_.open_token & 63);
    ++allowed;
  }
  if (allowed == 0) {
    // Nothing in this vocabulary continues the constraint: better unconstrained than stuck.
    LOG_WARN("constraint: no token of the vocabulary continues the output; this position is unconstrained");
    std::fill(out.begin(), out.end(), ~uint64_t{0});
  }
}

void ConstraintState::start_next() {
  if (!overlap_ || last_budget_ <= 1 || !needs_mask()) return;
  const int32_t budget = last_budget_ - 1;  // apply() follows accept() one token further on
  next_mask_.resize(mask_.size());
  next_budget_ = budget;
  pending_ = std::make_shared<Pending>();
  pending_->fn = [this, budget] { compute(budget, next_mask_); };
  MaskPool::instance().submit(pending_);
}

void ConstraintState::cancel_next() {
  if (pending_) pending_->cancel();
  pending_.reset();
  next_budget_ = -1;
}

const std::vector<uint64_t>& ConstraintState::mask(int32_t budget) {
  last_budget_ = budget;
  if (pending_ && next_budget_ == budget) {
    pending_->settle();
    pending_.reset();
    next_budget_ = -1;
    mask_.swap(next_mask_);
    return mask_;
  }
  cancel_next();
  compute(budget, mask_);
  return mask_;
}

void ConstraintState::apply(float* logits, int32_t vocab_size, int32_t budget) {
  if (!needs_mask()) {
    last_budget_ = budget;
    return;
  }
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
  if (phase_ != Phase::kActive) return;  // a partly written start_text: special tokens stay as they are
  for (int32_t t = covered; t < vocab_size; ++t) logits[t] = -INFINITY;  // padding rows
}

void ConstraintState::accept(int32_t token) {
  cancel_next();
  Step s{phase_, 0, strip_, tag_};
  if (phase_ == Phase::kWaiting) {
    const auto& vocab = request_.compiled->vocab();
    std::string_view rest;
    bool start = request_.start_token >= 0 && token == request_.start_token;
    if (!start && !request_.start_text.empty() && token >= 0 && token < vocab.size()) {
      const std::string& bytes = vocab.bytes(token);
      for (size_t i = 0; i < bytes.size(); ++i) {
        tag_ = tag_step(tag_, static_cast<uint8_t>(bytes[i]));
        if (tag_ == static_cast<int32_t>(request_.start_text.size())) {
          start = true;
          rest = std::string_view(bytes).substr(i + 1);
          break;
        }
      }
    }
    if (start) {
      phase_ = Phase::kActive;
      tag_ = 0;
      matcher_.restart();
      s.fed = 1;
      if (!rest.empty()) {
        if (matcher_.accept(rest))
          s.fed = 2;
        else
          LOG_DEBUG("constraint: the bytes after the opening text in token {} are outside the constraint", token);
      }
    }
  } else if (steps_.empty() && token == request_.open_token && request_.open_token >= 0) {
    phase_ = Phase::kWaiting;
  } else if (!is_stop(token)) {
    const std::string bytes = stripped(token);
    const size_t dropped = strip_ > 0 ? leading_spaces(request_.compiled->vocab().bytes(token)) : 0;
    if (matcher_.accept(bytes)) {
      s.fed = 1;
      // As the detokenizer: the spaces it dropped count, and any other byte begins the output.
      strip_ = bytes.empty() ? strip_ - static_cast<int32_t>(dropped) : 0;
    } else {
      LOG_DEBUG("constraint: token {} is outside the constraint (an unconstrained position)", token);
    }
  }
  if (phase_ == Phase::kActive && request_.rearm && s.fed > 0 && matcher_.complete() && !matcher_.can_continue()) {
    phase_ = Phase::kWaiting;
    tag_ = 0;
  }
  steps_.push_back(s);
  update_finished();
  start_next();
}

void ConstraintState::rollback(size_t n) {
  cancel_next();
  n = std::min(n, steps_.size());
  for (size_t i = 0; i < n; ++i) {
    const Step s = steps_.back();
    steps_.pop_back();
    if (s.fed > 0) matcher_.rollback(static_cast<size_t>(s.fed));
    phase_ = s.before;
    strip_ = s.strip_before;
    tag_ = s.tag_before;
  }
  update_finished();
}

}  // namespace infera
