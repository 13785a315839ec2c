// Command-line flags generated from the declared options (base/options.h): names, help,
// defaults, validation and environment variables come from the table; a command only says
// which of its fields each option fills.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "infera/base/options.h"

namespace infera::cli {

// The help line of an option: its help, values and default, and its environment variable.
std::string option_help(const OptionSpec& spec, uint32_t command);
// A validator for the option's values (range, choices, memory sizes); with zero_ok, "0"
// is also accepted (`infera serve`: not given).
CLI::Validator option_validator(const OptionSpec& spec, bool zero_ok);

// Adds option `name` to `cmd` (command kUseRun or kUseServe) bound to `target`: the
// command's declared default is applied (`infera run`) or shown (`infera serve`, whose
// defaults live in the deployment config), values are validated as declared.
template <typename T>
CLI::Option* add_declared(CLI::App* cmd, std::string_view name, T& target, uint32_t command) {
  const OptionSpec& spec = option_spec(name);
  CLI::Option* opt = nullptr;
  if constexpr (std::is_same_v<T, bool>) {
    std::string names(spec.flags);
    if (spec.flag_turns_off) names += "{false}";
    opt = cmd->add_flag(names, target, option_help(spec, command));
  } else {
    opt = cmd->add_option(std::string(spec.flags), target, option_help(spec, command));
    const std::string_view d = command == kUseRun ? spec.default_for_run() : std::string_view();
    if (!d.empty()) opt->default_val(std::string(d));
    if (spec.type != OptionType::kText && spec.type != OptionType::kTextList) {
      opt->check(option_validator(spec, command == kUseServe && spec.zero_means_default));
    }
  }
  return opt;
}

// `infera serve`: the option as the text the user gave (every occurrence), to be applied
// through the deployment config's reader at the option's deploy.yaml path.
CLI::Option* add_declared_text(CLI::App* cmd, std::string_view name, std::vector<std::string>& target);

// Names of the options declared for `command` that `cmd` lacks (empty when every
// declared option has its flag).
std::vector<std::string> missing_declared_flags(const CLI::App& cmd, uint32_t command);

}  // namespace infera::cli
