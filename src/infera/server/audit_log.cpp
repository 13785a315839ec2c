#include "infera/server/audit_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"

namespace infera::server {

namespace {
std::string utc_now_iso8601() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(ms));
}
}  // namespace

AuditLog::AuditLog(const std::string& path, bool include_prompts, int64_t max_bytes)
    : path_(path), include_prompts_(include_prompts), max_bytes_(max_bytes) {
  open_file();
}

void AuditLog::open_file() {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot open the audit log {} for appending: {}; fix server.audit_log", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    size_ = st.st_size;
    // An older file may be readable by others: it names keys and may hold prompts.
    if ((st.st_mode & 077) != 0) ::fchmod(fd, st.st_mode & 0700);
  }
  file_ = ::fdopen(fd, "a");
  if (!file_) {
    ::close(fd);
    fail("cannot open the audit log {} for appending: {}; fix server.audit_log", path_, std::strerror(errno));
  }
}

AuditLog::~AuditLog() {
  std::lock_guard lock(mutex_);
  if (suppressed_ > 0 && file_) write_summary();
  if (file_) std::fclose(file_);
}

void AuditLog::append(const std::string& line) {
  if (!file_) return;
  if (size_ > 0 && size_ + static_cast<int64_t>(line.size()) > max_bytes_) {
    // Rotate: the full file becomes <path>.1 (the one before goes), a new one starts.
    std::fclose(file_);
    file_ = nullptr;
    std::rename(path_.c_str(), (path_ + ".1").c_str());
    try {
      open_file();
    } catch (const Error&) {
      return;  // nothing to write to; the next record tries again
    }
    size_ = 0;
  }
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
  size_ += static_cast<int64_t>(line.size());
}

void AuditLog::write_summary() {
  const nlohmann::json j = {{"time", utc_now_iso8601()}, {"status", 401}, {"suppressed", suppressed_}};
  suppressed_ = 0;
  append(j.dump() + "\n");
}

void AuditLog::write(const AuditRecord& r) {
  const int64_t second =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  {
    std::lock_guard lock(mutex_);
    if (second != window_second_) {
      if (suppressed_ > 0) write_summary();
      window_second_ = second;
      unauthorized_in_window_ = 0;
    }
    if (r.status == 401 && ++unauthorized_in_window_ > kMaxUnauthorizedPerSecond) {
      ++suppressed_;
      return;
    }
  }
  nlohmann::json j = {{"time", utc_now_iso8601()},
                      {"key_id", r.key_id},
                      {"model", r.model},
                      {"endpoint", r.endpoint},
                      {"status", r.status},
                      {"prompt_tokens", r.prompt_tokens},
                      {"completion_tokens", r.completion_tokens},
                      {"latency_ms", std::round(r.latency_ms * 1000) / 1000},
                      {"ttft_ms",
                       r.ttft_ms < 0 ? nlohmann::json(nullptr) : nlohmann::json(std::round(r.ttft_ms * 1000) / 1000)}};
  if (!r.finish_reason.empty()) j["finish_reason"] = r.finish_reason;
  if (include_prompts_ && r.prompt) j["prompt"] = *r.prompt;
  // Prompts may hold invalid UTF-8 only if they never passed JSON parsing; replace to be safe.
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard lock(mutex_);
  append(line);
}

}  // namespace infera::server
