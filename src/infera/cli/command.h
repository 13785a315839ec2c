// Subcommands register themselves here; main() builds the CLI11 app from the registry.
// Each subcommand lives in its own file cmd_<name>.cpp:
//
//   static void setup(CLI::App& app) {
//     auto* cmd = app.add_subcommand("tokenize", "...");
//     auto opts = std::make_shared<Options>();
//     cmd->add_option(...);
//     cmd->callback([opts] { infera::cli::set_exit_code(run(*opts)); });
//   }
//   INFERA_REGISTER_COMMAND(tokenize, setup);
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace infera::cli {

using SetupFn = void (*)(CLI::App& app);

std::vector<std::pair<std::string, SetupFn>>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(const char* name, SetupFn fn) { command_registry().emplace_back(name, fn); }
};

// The process exit code chosen by the command that ran (default 0).
void set_exit_code(int code);
int exit_code();

}  // namespace infera::cli

#define INFERA_REGISTER_COMMAND(name, fn) \
  static ::infera::cli::CommandRegistrar infera_command_registrar_##name(#name, fn)
