#include <algorithm>
#include <cstdio>
#include <exception>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/cli/command.h"

int main(int argc, char** argv) {
  CLI::App app{"Infera: LLM inference engine and OpenAI-compatible server"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->default_val("info");
  app.set_version_flag("--version", "infera 0.1.0");
  auto& registry = infera::cli::command_registry();
  std::sort(registry.begin(), registry.end());
  for (auto& [name, setup] : registry) setup(app);
  app.parse_complete_callback([&] { infera::log::init(log_level); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const infera::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return infera::cli::exit_code();
}
