#include "infera/cli/serve_options.h"

#include <sstream>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/base/options.h"
#include "infera/cli/model_paths.h"
#include "infera/cli/option_flags.h"

namespace infera::cli {

bool ServeOptions::given(const std::string& name) const {
  const auto it = flags.find(name);
  return it != flags.end() && it->second->count() > 0;
}

void add_serve_flags(CLI::App* cmd, ServeOptions& o) {
  for (const OptionSpec& spec : option_specs()) {
    if (!spec.used_by(kUseServe)) continue;
    const std::string name(spec.name);
    if (name == "config")
      add_declared(cmd, name, o.config_file, kUseServe);
    else if (name == "model")
      add_declared(cmd, name, o.model_dir, kUseServe);
    else if (name == "name")
      add_declared(cmd, name, o.name, kUseServe);
    else if (name == "api_keys")
      add_declared(cmd, name, o.api_keys, kUseServe);
    else if (name == "tp_timeout")
      add_declared(cmd, name, o.tp_timeout, kUseServe);
    else
      o.flags[name] = add_declared_text(cmd, name, o.text[name]);
  }
}

server::DeployConfig serve_deploy_config(const ServeOptions& o) {
  using server::DeployConfig;
  if (!o.config_file.empty()) {
    if (!o.model_dir.empty()) fail("give either --config or -m, not both (put the model into the config file)");
    if (o.given("tp") || o.given("ep")) {
      fail("give --tp / --ep with -m; with --config put tp / ep into the model's entry of the config file");
    }
    DeployConfig config = server::load_deploy_config(o.config_file);
    if (o.given("host")) config.server.host = o.text.at("host").back();
    if (o.given("port")) config.server.port = std::stoi(o.text.at("port").back());  // checked by the flag
    // The lists of allowed hosts and origins take the flags' entries besides the file's.
    for (const std::string& h : o.text.at("allowed_hosts")) config.server.allowed_hosts.push_back(h);
    for (const std::string& origin : o.text.at("allowed_origins")) config.server.allowed_origins.push_back(origin);
    if (o.given("console")) config.server.console = false;  // --no-console turns the file's console off too
    std::string ignored;
    for (const auto& [name, flag] : o.flags) {
      if (flag->count() > 0 && name != "host" && name != "port" && name != "allowed_hosts" &&
          name != "allowed_origins" && name != "console") {
        ignored += " " + flag->get_name();
      }
    }
    if (!ignored.empty()) LOG_WARN("with --config these flags do not apply (set them in the file):{}", ignored);
    return config;
  }
  std::vector<server::DeploySetting> settings;
  settings.push_back({"models[].path", {o.model_dir.empty() ? default_model_ref() : o.model_dir}});
  const std::string name = o.name.empty() && o.model_dir.empty() ? "infera-default" : o.name;
  if (!name.empty()) settings.push_back({"models[].name", {name}});
  std::vector<std::string> keys = o.api_keys;
  if (keys.empty()) {
    // Keys from the environment keep them out of the process list.
    std::stringstream list(option_env("api_keys"));
    for (std::string k; std::getline(list, k, ',');) {
      if (!k.empty()) keys.push_back(k);
    }
  }
  if (!keys.empty()) settings.push_back({"server.api_keys", keys});
  for (const auto& [option, flag] : o.flags) {
    if (flag->count() == 0) continue;
    const OptionSpec& spec = option_spec(option);
    if (spec.type == OptionType::kFlag) {
      settings.push_back({std::string(spec.yaml), {spec.flag_turns_off ? "false" : "true"}});
      continue;
    }
    const std::vector<std::string>& values = o.text.at(option);
    if (spec.zero_means_default && values.back() == "0") continue;
    settings.push_back({std::string(spec.yaml), values});
  }
  return server::deploy_config_from_settings(settings, "the command line");
}

}  // namespace infera::cli
