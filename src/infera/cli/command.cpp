#include "infera/cli/command.h"

namespace infera::cli {

std::vector<std::pair<std::string, SetupFn>>& command_registry() {
  static std::vector<std::pair<std::string, SetupFn>> registry;
  return registry;
}

namespace {
int g_exit_code = 0;
}
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

}  // namespace infera::cli
