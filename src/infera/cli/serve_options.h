// `infera serve`'s options. The flags come from the declared options (base/options.cpp);
// each one that has a deploy.yaml key is applied through the deployment config's reader at
// that key, so a flag and its key take the same values, defaults and checks.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "infera/server/deploy_config.h"

namespace infera::cli {

struct ServeOptions {
  std::string config_file;
  std::string model_dir;
  std::string name;
  std::vector<std::string> api_keys;
  double tp_timeout = 300;
  // The flags that have a deploy.yaml key, by option name: the option and the text given.
  std::map<std::string, CLI::Option*> flags;
  std::map<std::string, std::vector<std::string>> text;

  bool given(const std::string& name) const;
};

// Adds every option declared for `infera serve` to `cmd`, bound to `o`.
void add_serve_flags(CLI::App* cmd, ServeOptions& o);

// The deployment the flags describe: --config's file (with --host / --port applied), or the
// one model of -m and the other flags. Throws infera::Error listing every problem.
server::DeployConfig serve_deploy_config(const ServeOptions& o);

}  // namespace infera::cli
