// infera options: every declared option (base/options.cpp) as the Markdown tables README.md
// and docs/server.md carry: `run` flags, `serve` flags with their deploy.yaml keys, request
// defaults, environment variables.
#include <cstdio>
#include <string>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/cli/command.h"

namespace infera::cli {
namespace {

struct OptionsOptions {
  std::string table;  // empty: every table
};

int run(const OptionsOptions& o) {
  bool found = false;
  for (const OptionTable& t : option_tables()) {
    if (!o.table.empty() && o.table != t.name) continue;
    found = true;
    if (o.table.empty()) std::printf("## %.*s\n\n", static_cast<int>(t.name.size()), t.name.data());
    std::printf("%s", options_markdown(t.use).c_str());
    if (o.table.empty()) std::printf("\n");
  }
  if (!found) fail("--table {}: no such table; use run, serve, request or environment", o.table);
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("options", "List every option: flags, deploy.yaml keys, request defaults, environment");
  auto o = std::make_shared<OptionsOptions>();
  cmd->add_option("--table", o->table, "Only this table: run, serve, request or environment");
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(options, setup);

}  // namespace infera::cli
