#include "infera/server/limits.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace infera::server {

TokenBucket::TokenBucket(double per_minute) : capacity_(per_minute), level_(per_minute), last_(Clock::now()) {}

void TokenBucket::refill(Clock::time_point now) {
  if (now <= last_) return;
  const double minutes = std::chrono::duration<double>(now - last_).count() / 60.0;
  level_ = std::min(capacity_, level_ + minutes * capacity_);
  last_ = now;
}

bool TokenBucket::try_take(double amount, bool require_full, double* retry_after_s, Clock::time_point now) {
  if (unlimited()) return true;
  refill(now);
  const double needed = require_full ? amount : 1e-9;
  if (level_ >= needed) {
    level_ -= amount;
    return true;
  }
  if (retry_after_s) *retry_after_s = (needed - level_) / capacity_ * 60.0;
  return false;
}

bool TokenBucket::can_take(double amount, double* retry_after_s, Clock::time_point now) {
  if (unlimited()) return true;
  refill(now);
  if (level_ >= amount) return true;
  if (retry_after_s) *retry_after_s = (amount - level_) / capacity_ * 60.0;
  return false;
}

void TokenBucket::charge(double amount, Clock::time_point now) {
  if (unlimited()) return;
  refill(now);
  level_ -= amount;
}

void TokenBucket::refund(double amount, Clock::time_point now) {
  if (unlimited()) return;
  refill(now);
  level_ = std::min(capacity_, level_ + amount);
}

double TokenBucket::level(Clock::time_point now) {
  refill(now);
  return level_;
}

KeyLimiter::KeyLimiter(KeyLimits limits)
    : limits_(limits), requests_(limits.requests_per_minute), tokens_(limits.tokens_per_minute) {}

namespace {

LimitDenial denial(LimitDenial::Kind kind, double retry_s, std::string message) {
  LimitDenial d;
  d.kind = kind;
  d.retry_after_s = std::max(1.0, std::ceil(retry_s));
  d.message = std::move(message);
  return d;
}

// What a bucket must hold to admit `amount`: all of it, or all of the bucket when the
// amount is larger (such a request waits for a full bucket and drives it negative).
double needed(const TokenBucket& b, double amount) { return std::min(amount, b.capacity()); }

// A key at its limit of requests in flight (0: unlimited) admits none until one finishes.
std::optional<LimitDenial> concurrency_denial(int32_t max_concurrent, int32_t in_flight) {
  if (max_concurrent <= 0 || in_flight < max_concurrent) return std::nullopt;
  return denial(LimitDenial::Kind::kConcurrency, 1,
                fmt::format("the API key has {} requests in flight, its limit; retry when one has finished",
                            in_flight));
}

}  // namespace

std::optional<LimitDenial> KeyLimiter::precheck(Clock::time_point now) {
  std::lock_guard lock(mutex_);
  double retry = 0;
  if (auto d = concurrency_denial(limits_.max_concurrent, in_flight_)) return d;
  if (!requests_.can_take(needed(requests_, 1), &retry, now)) {
    return denial(LimitDenial::Kind::kRequests, retry,
                  fmt::format("the API key's limit of {:g} requests per minute is reached; retry in {:.0f} s",
                              limits_.requests_per_minute, std::ceil(retry)));
  }
  if (!tokens_.can_take(1e-9, &retry, now)) {
    return denial(LimitDenial::Kind::kTokens, retry,
                  fmt::format("the API key's limit of {:g} tokens per minute is reached; retry in {:.0f} s",
                              limits_.tokens_per_minute, std::ceil(retry)));
  }
  return std::nullopt;
}

std::optional<LimitDenial> KeyLimiter::admit(double requests, double tokens, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  double retry = 0;
  if (auto d = concurrency_denial(limits_.max_concurrent, in_flight_)) return d;
  if (!requests_.can_take(needed(requests_, requests), &retry, now)) {
    return denial(LimitDenial::Kind::kRequests, retry,
                  fmt::format("the request counts {:g} against the API key's limit of {:g} requests per minute "
                              "(one per choice), more than is left; retry in {:.0f} s",
                              requests, limits_.requests_per_minute, std::ceil(retry)));
  }
  if (!tokens_.can_take(needed(tokens_, tokens), &retry, now)) {
    return denial(
        LimitDenial::Kind::kTokens, retry,
        fmt::format("the request may use up to {:g} tokens (prompt + max_tokens x choices), more than is left "
                    "of the API key's limit of {:g} tokens per minute; lower max_tokens or retry in {:.0f} s",
                    tokens, limits_.tokens_per_minute, std::ceil(retry)));
  }
  requests_.charge(requests, now);
  tokens_.charge(tokens, now);
  ++in_flight_;
  return std::nullopt;
}

void KeyLimiter::settle(double reserved, double used, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  if (used < reserved)
    tokens_.refund(reserved - used, now);
  else if (used > reserved)
    tokens_.charge(used - reserved, now);
  if (in_flight_ > 0) --in_flight_;
}

int32_t KeyLimiter::in_flight() const {
  std::lock_guard lock(mutex_);
  return in_flight_;
}

double KeyLimiter::tokens_level(Clock::time_point now) {
  std::lock_guard lock(mutex_);
  return tokens_.level(now);
}

double KeyLimiter::requests_level(Clock::time_point now) {
  std::lock_guard lock(mutex_);
  return requests_.level(now);
}

Admission::Admission(Admission&& other) noexcept
    : limiter_(other.limiter_), reserved_(other.reserved_), used_(other.used_) {
  other.limiter_ = nullptr;
}

Admission& Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    settle();
    limiter_ = other.limiter_;
    reserved_ = other.reserved_;
    used_ = other.used_;
    other.limiter_ = nullptr;
  }
  return *this;
}

void Admission::settle() {
  if (!limiter_) return;
  KeyLimiter* l = limiter_;
  limiter_ = nullptr;
  l->settle(reserved_, used_ < 0 ? reserved_ : used_);
}

}  // namespace infera::server
