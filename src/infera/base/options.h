// Options declared once. Every setting a user gives Infera (an `infera run` or `infera
// serve` flag, a deploy.yaml key, an HTTP request field's default, an environment
// variable) is one row of the table in options.cpp: its name, where it is accepted, its
// defaults, its help, its environment variable and how its value is checked. From the
// table come the `run` and `serve` flags (cli/option_flags.h), the deploy.yaml keys the
// reader knows (server/deploy_config.cpp), the environment switches of the kernels and
// loaders (option_env below), and the option tables of README.md and docs/server.md
// (options_markdown; tests/unit/base/options_test.cpp checks that the docs match).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace infera {

enum class OptionType : uint8_t {
  kFlag,  // on when present (a deploy.yaml true / false)
  kInteger,
  kNumber,
  kText,
  kChoice,  // one of `choices`
  kMemory,  // a memory size: 2GiB, 512MB, 30% (runtime/engine_config.h parse_memory_size)
  kTextList,  // a repeatable flag / a YAML list
};

// Where an option is accepted (bits of OptionSpec::use).
enum OptionUse : uint32_t {
  kUseRun = 1u << 0,  // an `infera run` flag
  kUseServe = 1u << 1,  // an `infera serve` flag
  kUseDeploy = 1u << 2,  // a deploy.yaml key (OptionSpec::yaml)
  kUseRequest = 1u << 3,  // an HTTP request field (/v1/completions, /v1/chat/completions)
  kUseProcess = 1u << 4,  // a process-wide switch, read from its environment variable only
  kUseLauncher = 1u << 5,  // set by mpirun / the MPI launcher, read to find the group (parallel/)
};

struct OptionSpec {
  std::string_view name{};  // snake_case; a request option's name is its request field
  OptionType type = OptionType::kText;
  uint32_t use = 0;  // OptionUse bits
  std::string_view flags{};  // CLI11 names, e.g. "-t,--threads"; empty: no flag
  std::string_view yaml{};  // deploy.yaml path, e.g. "models[].kv_dtype", "server.port"
  std::string_view env{};  // environment variable; empty: none
  // Defaults as a user writes them. One in parentheses describes instead of giving a
  // value ("(from the profile)"): nothing is applied, the consumer decides.
  std::string_view default_value{};  // serve flag, deploy key, environment switch
  std::string_view run_default{};  // `infera run` flag (empty: default_value)
  std::string_view request_default{};  // the request field's default when the client omits it
  std::string_view help{};
  std::string_view choices{};  // kChoice (and checked environment values): "f32|bf16|int8"
  double min = -std::numeric_limits<double>::infinity();  // numbers: the accepted range
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;  // (min, max] instead of [min, max]
  bool flag_turns_off = false;  // kFlag: the flag sets the option to false (--no-prefix-cache)
  bool zero_means_default = false;  // `infera serve`: 0 means "not given" (the profile decides)

  bool used_by(uint32_t u) const { return (use & u) != 0; }
  std::vector<std::string_view> choice_list() const;
  // The default a command applies, empty when it has none (a description in parentheses
  // counts as none).
  std::string_view default_for_run() const;
  std::string_view default_for_serve() const;
};

// Every declared option, in documentation order.
std::span<const OptionSpec> option_specs();
// The row named `name`; an undeclared name is a programming error (INFERA_ASSERT).
const OptionSpec& option_spec(std::string_view name);

// A request option's default (OptionSpec::request_default) as a number or a flag: what a
// request that leaves the field out gets (server/openai_api.h GenerationOptions starts from
// these). An option without a numeric / true-false request default is a programming error.
double request_default_number(std::string_view name);
bool request_default_flag(std::string_view name);

// Checks `text` against the row's type, choices and range. Returns "" when it is valid,
// else what is wrong ("must be in [0, 16]", "must be one of: f32, bf16, int8").
std::string check_option_value(const OptionSpec& spec, std::string_view text);
// "[0, 16]", "> 0", ">= 1", "f32, bf16, int8", or "" when anything goes.
std::string option_range_text(const OptionSpec& spec);

enum class BadEnvValue { kFail, kWarnAndIgnore };
// The value of the option's environment variable ("" when unset or empty), checked against
// its choices and range: a bad value throws infera::Error naming the variable, the values
// it takes and what it does (kFail), or is logged once and read as unset (kWarnAndIgnore,
// for switches read where an exception cannot go).
std::string option_env(std::string_view name, BadEnvValue on_bad = BadEnvValue::kFail);
// An on / off switch's environment variable (choices 1|0|on|off|true|false, checked as
// option_env does): false for 0, off or false, true otherwise (unset too: on by default).
bool option_env_on(std::string_view name);
// A launcher variable (kUseLauncher) by its variable name: its value, "" when unset.
std::string launcher_env(std::string_view variable);
// True when the launcher variable is set (even to "").
bool launcher_env_set(std::string_view variable);

// The Markdown table of the options used by `use` (one of kUseRun, kUseServe |
// kUseDeploy, kUseRequest, kUseProcess | kUseLauncher), as README.md and docs/server.md
// carry it between <!-- options:NAME --> and <!-- /options --> lines.
std::string options_markdown(uint32_t use);
// The documented tables by name ("run", "serve", "request", "environment") and their use bits.
struct OptionTable {
  std::string_view name{};
  uint32_t use;
};
std::span<const OptionTable> option_tables();

}  // namespace infera
