// infera check MODEL_DIR [--write-manifest | --verify] [--json]: verify a model directory
// before loading it. Exit codes: 0 = no problem, 1 = warnings only, 2 = errors
// (a usage error exits 1 through main, like every command).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/tools/model_check.h"

namespace infera::cli {
namespace {

struct CheckCmdOptions {
  std::string model_dir;
  bool write_manifest = false;
  bool verify = false;
  bool json = false;
};

int run(const CheckCmdOptions& o) {
  CheckOptions opt;
  opt.write_manifest = o.write_manifest;
  opt.verify_manifest = o.verify;
  const CheckReport report = check_model_dir(o.model_dir, opt);
  if (o.json) {
    std::printf("%s\n", report.to_json().dump(2).c_str());
  } else {
    std::fputs(report.to_text().c_str(), stdout);
  }
  return report.exit_code();
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "check",
      "Check a model directory before loading it (files, shards, tensor shapes, chat template, checksums); "
      "exit 0 ok, 1 warnings, 2 errors");
  auto o = std::make_shared<CheckCmdOptions>();
  cmd->add_option("model_dir", o->model_dir,
                  "Model: a directory (Hugging Face layout), a GGUF file, ollama:NAME or hf:ORG/NAME")
      ->required()
      ->transform(infera::cli::model_ref_transform());
  auto* w =
      cmd->add_flag("--write-manifest", o->write_manifest, "Write MANIFEST.sha256 (sha256sum -c format) of every file");
  auto* v = cmd->add_flag("--verify", o->verify, "Check every file against MANIFEST.sha256 and name those that differ");
  w->excludes(v);
  cmd->add_flag("--json", o->json, "Print the report as one JSON object");
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(check, setup);

}  // namespace infera::cli
