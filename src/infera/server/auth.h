// API keys (compared in constant time, never logged: callers see a key id) and per-key
// token-bucket rate limits on requests per minute and tokens per minute.
#pragma once

#include <chrono>
#include <memory>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "infera/server/deploy_config.h"

namespace infera::server {

// Equal length and bytes, in time that depends only on the lengths.
bool constant_time_equals(std::string_view a, std::string_view b);

// A bucket of `capacity` units refilled at capacity per minute. take() may drive the
// level negative (tokens are charged after the fact); requests wait until it is positive.
class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;
  explicit TokenBucket(double per_minute);
  // Takes `amount` if the level is positive (>= amount when require_full); otherwise
  // returns false and the seconds until it would succeed.
  bool try_take(double amount, bool require_full, double* retry_after_s, Clock::time_point now = Clock::now());
  void charge(double amount, Clock::time_point now = Clock::now());
  double level(Clock::time_point now = Clock::now());

 private:
  void refill(Clock::time_point now);
  double capacity_;
  double level_;
  Clock::time_point last_;
};

class ApiKeyStore {
 public:
  struct Key {
    ApiKeyConfig config;
    TokenBucket requests;
    TokenBucket tokens;
  };
  explicit ApiKeyStore(std::vector<ApiKeyConfig> keys);
  bool enabled() const { return !keys_.empty(); }
  // The key matching `presented` (checks every key, whatever matches), or nullptr.
  Key* find(std::string_view presented);
  static bool allows_model(const Key& key, const std::string& model);

  // Admission: one request, and a positive token budget. False with retry seconds.
  bool admit(Key& key, double* retry_after_s);
  // After the fact: prompt + completion tokens of a finished request.
  void charge_tokens(Key& key, int64_t tokens);

 private:
  std::vector<std::unique_ptr<Key>> keys_;
  std::mutex mutex_;  // guards the buckets
};

}  // namespace infera::server
