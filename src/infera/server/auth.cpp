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

ApiKeyStore::ApiKeyStore(std::vector<ApiKeyConfig> keys, int32_t default_max_concurrent) {
  for (auto& k : keys) {
    KeyLimits l;
    l.requests_per_minute = k.requests_per_minute;
    l.tokens_per_minute = k.tokens_per_minute;
    l.max_concurrent = k.max_concurrent_requests.value_or(default_max_concurrent);
    keys_.push_back(std::make_unique<Key>(std::move(k), l));
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

}  // namespace infera::server
