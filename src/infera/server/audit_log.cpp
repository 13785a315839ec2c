#include "infera/server/audit_log.h"

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

AuditLog::AuditLog(const std::string& path, bool include_prompts) : include_prompts_(include_prompts) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) fail("cannot open the audit log {} for appending: {}; fix server.audit_log", path, std::strerror(errno));
}

AuditLog::~AuditLog() {
  if (file_) std::fclose(file_);
}

void AuditLog::write(const AuditRecord& r) {
  nlohmann::json j = {{"time", utc_now_iso8601()},
                      {"key_id", r.key_id},
                      {"model", r.model},
                      {"endpoint", r.endpoint},
                      {"status", r.status},
                      {"prompt_tokens", r.prompt_tokens},
                      {"completion_tokens", r.completion_tokens},
                      {"latency_ms", std::round(r.latency_ms * 1000) / 1000},
                      {"ttft_ms", r.ttft_ms < 0 ? nlohmann::json(nullptr) : nlohmann::json(std::round(r.ttft_ms * 1000) / 1000)}};
  if (!r.finish_reason.empty()) j["finish_reason"] = r.finish_reason;
  if (include_prompts_ && r.prompt) j["prompt"] = *r.prompt;
  // Prompts may hold invalid UTF-8 only if they never passed JSON parsing; replace to be safe.
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard lock(mutex_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace infera::server
