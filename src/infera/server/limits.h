// Per-key admission limits: requests per minute (one per choice), tokens per minute
// reserved at admission from an estimate of the request's whole cost (prompt tokens +
// max_tokens x choices) and settled when it ends (the unused rest refunded), and a cap on
// the requests a key has in flight. A burst of concurrent requests is therefore held to
// the budget when it is admitted, not only after its tokens are counted.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace infera::server {

// A bucket of `capacity` units refilled at capacity per minute. The level may go negative
// (a request larger than the whole bucket, or one that used more than it reserved).
class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;
  explicit TokenBucket(double per_minute);
  // Takes `amount` if the level is positive (>= amount when require_full); otherwise
  // returns false and the seconds until it would succeed.
  bool try_take(double amount, bool require_full, double* retry_after_s, Clock::time_point now = Clock::now());
  // Would try_take(amount, true) succeed now? Takes nothing.
  bool can_take(double amount, double* retry_after_s, Clock::time_point now = Clock::now());
  void charge(double amount, Clock::time_point now = Clock::now());
  // Gives back `amount` (never above the capacity).
  void refund(double amount, Clock::time_point now = Clock::now());
  double level(Clock::time_point now = Clock::now());
  double capacity() const { return capacity_; }
  bool unlimited() const { return capacity_ <= 0; }

 private:
  void refill(Clock::time_point now);
  double capacity_;
  double level_;
  Clock::time_point last_;
};

struct KeyLimits {
  double requests_per_minute = 0;  // 0: unlimited
  double tokens_per_minute = 0;  // 0: unlimited
  int32_t max_concurrent = 0;  // requests in flight at once; 0: unlimited
};

// Why a request was not admitted: always 429 with Retry-After.
struct LimitDenial {
  enum class Kind { kRequests, kTokens, kConcurrency };
  Kind kind = Kind::kRequests;
  double retry_after_s = 1;
  std::string message;  // names the limit, without the key's id
};

class KeyLimiter {
 public:
  using Clock = TokenBucket::Clock;
  explicit KeyLimiter(KeyLimits limits);
  KeyLimiter(const KeyLimiter&) = delete;
  KeyLimiter& operator=(const KeyLimiter&) = delete;

  // Cheap check before any work is spent on a request: denied when the key is at its
  // concurrency cap or a bucket is empty. Takes nothing.
  std::optional<LimitDenial> precheck(Clock::time_point now = Clock::now());
  // Admission, all or nothing: `requests` from the request bucket, `tokens` reserved from
  // the token bucket and one concurrency slot. A bucket must hold the whole amount (or be
  // full when the amount exceeds its capacity, so no request is refused for ever).
  std::optional<LimitDenial> admit(double requests, double tokens, Clock::time_point now = Clock::now());
  // The end of an admitted request that reserved `reserved` tokens and used `used`: the
  // difference goes back to the bucket (or is charged when it used more), the slot is freed.
  void settle(double reserved, double used, Clock::time_point now = Clock::now());

  int32_t in_flight() const;
  double tokens_level(Clock::time_point now = Clock::now());
  double requests_level(Clock::time_point now = Clock::now());
  const KeyLimits& limits() const { return limits_; }

 private:
  const KeyLimits limits_;
  mutable std::mutex mutex_;
  TokenBucket requests_;
  TokenBucket tokens_;
  int32_t in_flight_ = 0;
};

// An admitted request's hold on its key's limits: settles exactly once, with the tokens
// reported by set_used() (the whole reservation when nothing was reported), at settle()
// or on destruction. Empty (no limiter) for requests without a key.
class Admission {
 public:
  Admission() = default;
  Admission(KeyLimiter* limiter, double reserved) : limiter_(limiter), reserved_(reserved) {}
  Admission(Admission&& other) noexcept;
  Admission& operator=(Admission&& other) noexcept;
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;
  ~Admission() { settle(); }

  void set_used(double tokens) { used_ = tokens; }
  void settle();
  bool active() const { return limiter_ != nullptr; }
  double reserved() const { return reserved_; }

 private:
  KeyLimiter* limiter_ = nullptr;
  double reserved_ = 0;
  double used_ = -1;  // < 0: not reported
};

}  // namespace infera::server
