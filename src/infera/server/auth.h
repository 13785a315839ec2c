// API keys (compared in constant time, never logged: callers see a key id), each with its
// admission limits (limits.h: requests and tokens per minute, requests in flight).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "infera/server/deploy_config.h"
#include "infera/server/limits.h"

namespace infera::server {

// Equal length and bytes, in time that depends only on the lengths.
bool constant_time_equals(std::string_view a, std::string_view b);

class ApiKeyStore {
 public:
  struct Key {
    Key(ApiKeyConfig c, KeyLimits l) : config(std::move(c)), limiter(l) {}
    ApiKeyConfig config;
    KeyLimiter limiter;
  };
  // `default_max_concurrent` applies to keys without their own max_concurrent_requests
  // (0: unlimited).
  explicit ApiKeyStore(std::vector<ApiKeyConfig> keys, int32_t default_max_concurrent = 0);
  bool enabled() const { return !keys_.empty(); }
  // The key matching `presented` (checks every key, whatever matches), or nullptr.
  Key* find(std::string_view presented);
  static bool allows_model(const Key& key, const std::string& model);

 private:
  std::vector<std::unique_ptr<Key>> keys_;
};

}  // namespace infera::server
