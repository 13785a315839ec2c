// Leveled logging to stderr (spdlog). Use the LOG_* macros; never log secrets.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

namespace infera::log {

// level: "trace", "debug", "info", "warn", "error", "off".
void init(std::string_view level = "info");
bool stderr_is_terminal();

}  // namespace infera::log

#define LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
