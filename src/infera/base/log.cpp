#include "infera/base/log.h"

#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace infera::log {

void init(std::string_view level) {
  static bool once = [] {
    auto logger = spdlog::stderr_color_mt("infera");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)once;
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

bool stderr_is_terminal() { return isatty(STDERR_FILENO) != 0; }

}  // namespace infera::log
