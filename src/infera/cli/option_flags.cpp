#include "infera/cli/option_flags.h"

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/runtime/engine_config.h"

namespace infera::cli {

namespace {

// "-t,--threads" -> "--threads" (the name CLI11 looks an option up by).
std::string long_name(std::string_view flags) {
  std::string_view rest = flags;
  std::string last;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view n = rest.substr(0, comma);
    if (n.rfind("--", 0) == 0) return std::string(n);
    last = std::string(n);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return last;
}

}  // namespace

std::string option_help(const OptionSpec& spec, uint32_t command) {
  std::string help(spec.help);
  const std::string_view d = command == kUseRun && !spec.run_default.empty() ? spec.run_default : spec.default_value;
  // Values CLI11 shows itself (applied defaults) are not repeated.
  const bool applied = command == kUseRun && !spec.default_for_run().empty();
  if (!d.empty() && !applied && spec.type != OptionType::kFlag) help += fmt::format("; default {}", d);
  if (command == kUseServe && spec.zero_means_default) help += " (0: not given)";
  if (command == kUseServe && spec.used_by(kUseDeploy) && !spec.yaml.empty())
    help += fmt::format("; deploy.yaml {}", spec.yaml);
  if (!spec.env.empty()) help += fmt::format("; environment {}", spec.env);
  return help;
}

CLI::Validator option_validator(const OptionSpec& spec, bool zero_ok) {
  const std::string flag = long_name(spec.flags);
  if (spec.type == OptionType::kMemory) {
    return CLI::Validator(
        [flag](std::string& input) -> std::string {
          try {
            parse_memory_size(input, flag);
          } catch (const Error& e) {
            return e.what();
          }
          return "";
        },
        "");
  }
  std::string desc = option_range_text(spec);
  if (zero_ok) desc = "0 or " + desc;
  return CLI::Validator(
      [&spec, zero_ok](std::string& input) -> std::string {
        if (zero_ok && input == "0") return "";
        const std::string problem = check_option_value(spec, input);
        return problem.empty() ? "" : fmt::format("'{}' {}", input, problem);
      },
      desc);
}

CLI::Option* add_declared_text(CLI::App* cmd, std::string_view name, std::vector<std::string>& target) {
  const OptionSpec& spec = option_spec(name);
  if (spec.type == OptionType::kFlag) {
    return cmd->add_flag(std::string(spec.flags))->description(option_help(spec, kUseServe));
  }
  CLI::Option* opt = cmd->add_option(std::string(spec.flags), target, option_help(spec, kUseServe));
  if (spec.type != OptionType::kTextList) opt->expected(1);  // given twice: the last wins, as a scalar flag
  switch (spec.type) {
    case OptionType::kInteger: opt->type_name("INT"); break;
    case OptionType::kNumber: opt->type_name("FLOAT"); break;
    case OptionType::kMemory: opt->type_name("SIZE"); break;
    default: break;
  }
  if (spec.type != OptionType::kText && spec.type != OptionType::kTextList) {
    opt->check(option_validator(spec, spec.zero_means_default));
  }
  return opt;
}

std::vector<std::string> missing_declared_flags(const CLI::App& cmd, uint32_t command) {
  std::vector<std::string> missing;
  for (const OptionSpec& spec : option_specs()) {
    if (!spec.used_by(command) || spec.flags.empty()) continue;
    if (cmd.get_option_no_throw(long_name(spec.flags)) == nullptr) missing.emplace_back(spec.name);
  }
  return missing;
}

}  // namespace infera::cli
