// One JSON line per request: time, key id (never the key), model, endpoint, status,
// prompt and completion tokens, latency and time to first token; the prompt text only
// when explicitly enabled.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

namespace infera::server {

struct AuditRecord {
  std::string key_id;  // "" without authentication
  std::string model;
  std::string endpoint;
  int status = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double latency_ms = 0;
  double ttft_ms = -1;  // -1: no token was generated
  std::string finish_reason;
  std::optional<std::string> prompt;  // only with audit_log_prompts
};

class AuditLog {
 public:
  // Opens `path` for appending. Throws infera::Error naming the path.
  AuditLog(const std::string& path, bool include_prompts);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;
  bool include_prompts() const { return include_prompts_; }
  void write(const AuditRecord& record);

 private:
  std::FILE* file_ = nullptr;
  bool include_prompts_;
  std::mutex mutex_;
};

}  // namespace infera::server
