#include "infera/server/auth.h"

#include <algorithm>
#include <memory>

namespace infera::server {

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Walk the longer length so the time does not reveal where the first difference is.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

TokenBucket::TokenBucket(double per_minute) : capacity_(per_minute), level_(per_minute), last_(Clock::now()) {}

void TokenBucket::refill(Clock::time_point now) {
  if (now <= last_) return;
  const double minutes = std::chrono::duration<double>(now - last_).count() / 60.0;
  level_ = std::min(capacity_, level_ + minutes * capacity_);
  last_ = now;
}

bool TokenBucket::try_take(double amount, bool require_full, double* retry_after_s, Clock::time_point now) {
  if (capacity_ <= 0) return true;  // unlimited
  refill(now);
  const double needed = require_full ? amount : 1e-9;
  if (level_ >= needed) {
    level_ -= amount;
    return true;
  }
  if (retry_after_s) *retry_after_s = (needed - level_) / capacity_ * 60.0;
  return false;
}

void TokenBucket::charge(double amount, Clock::time_point now) {
  if (capacity_ <= 0) return;
  refill(now);
  level_ -= amount;
}

double TokenBucket::level(Clock::time_point now) {
  refill(now);
  return level_;
}

ApiKeyStore::ApiKeyStore(std::vector<ApiKeyConfig> keys) {
  for (auto& k : keys) {
    const double rpm = k.requests_per_minute;
    const double tpm = k.tokens_per_minute;
    keys_.push_back(std::make_unique<Key>(Key{std::move(k), TokenBucket(rpm), TokenBucket(tpm)}));
  }
}

ApiKeyStore::Key* ApiKeyStore::find(std::string_view presented) {
  Key* match = nullptr;
  for (auto& k : keys_) {
    if (constant_time_equals(presented, k->config.key) && !match) match = k.get();
  }
  return match;
}

bool ApiKeyStore::allows_model(const Key& key, const std::string& model) {
  return key.config.models.empty() ||
         std::find(key.config.models.begin(), key.config.models.end(), model) != key.config.models.end();
}

bool ApiKeyStore::admit(Key& key, double* retry_after_s) {
  std::lock_guard lock(mutex_);
  double wait_tokens = 0;
  if (!key.tokens.try_take(0, /*require_full=*/false, &wait_tokens)) {
    *retry_after_s = wait_tokens;
    return false;
  }
  return key.requests.try_take(1, /*require_full=*/true, retry_after_s);
}

void ApiKeyStore::charge_tokens(Key& key, int64_t tokens) {
  std::lock_guard lock(mutex_);
  key.tokens.charge(static_cast<double>(tokens));
}

}  // namespace infera::server
