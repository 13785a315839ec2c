// One JSON line per request: time, key id (never the key), model, endpoint, status,
// prompt and completion tokens, latency and time to first token; the prompt text only
// when explicitly enabled. The file is created mode 0600 (it names keys and may hold
// prompts); past max_bytes it is renamed to "<path>.1" (replacing the previous one) and a
// new file started, so it takes at most twice max_bytes. Requests refused with 401 (no
// key, a wrong key: a flood costs the attacker nothing) are logged up to
// kMaxUnauthorizedPerSecond a second; the rest are counted and written as one summary line
// {"time", "status": 401, "suppressed": N} when the second is over.
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
  static constexpr int64_t kDefaultMaxBytes = int64_t{256} << 20;
  static constexpr int kMaxUnauthorizedPerSecond = 10;

  // Opens `path` for appending. Throws infera::Error naming the path.
  AuditLog(const std::string& path, bool include_prompts, int64_t max_bytes = kDefaultMaxBytes);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;
  bool include_prompts() const { return include_prompts_; }
  void write(const AuditRecord& record);

 private:
  void open_file();
  void append(const std::string& line);  // under mutex_
  void write_summary();  // under mutex_

  std::string path_;
  std::FILE* file_ = nullptr;
  bool include_prompts_;
  int64_t max_bytes_;
  int64_t size_ = 0;
  std::mutex mutex_;
  int64_t window_second_ = -1;  // the second the 401 counts are for
  int unauthorized_in_window_ = 0;
  int64_t suppressed_ = 0;
};

}  // namespace infera::server
