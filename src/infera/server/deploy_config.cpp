#include "infera/server/deploy_config.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/base/text_file.h"
#include "infera/io/model_ref.h"
#include "infera/model/kv_pool.h"
#include "infera/runtime/engine_config.h"

namespace infera::server {

namespace {

// Collects problems instead of stopping at the first, so a user fixes a file in one go.
class Reader {
 public:
  std::vector<std::string> problems;

  void problem(std::string message) { problems.push_back(std::move(message)); }

  // Flags keys not in `known` (typos would otherwise be silently ignored).
  void check_keys(const YAML::Node& node, const std::string& where, const std::vector<std::string>& known) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>("");
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        std::string list;
        for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
        problem(fmt::format("{}.{}: unknown setting; known settings are: {}", where, key, list));
      }
    }
  }

  template <typename T>
  void read(const YAML::Node& node, const char* key, const std::string& where, T& out, const char* expected) {
    const YAML::Node v = node[key];
    if (!v || v.IsNull()) return;
    try {
      if (!v.IsScalar()) throw YAML::Exception(YAML::Mark::null_mark(), "");
      out = v.as<T>();
    } catch (const YAML::Exception&) {
      problem(fmt::format("{}.{}: expected {}", where, key, expected));
    }
  }

  template <typename T>
  void read_opt(const YAML::Node& node, const char* key, const std::string& where, std::optional<T>& out,
                const char* expected) {
    if (!node[key] || node[key].IsNull()) return;
    T value{};
    const size_t before = problems.size();
    read(node, key, where, value, expected);
    if (problems.size() == before) out = value;
  }

  void read_memory(const YAML::Node& node, const char* key, const std::string& where, std::optional<int64_t>& out) {
    if (!node[key] || node[key].IsNull()) return;
    std::string text;
    read(node, key, where, text, "a memory size such as 2GiB or 512MB");
    if (text.empty()) return;
    try {
      out = parse_memory_size(text, where + "." + key);
    } catch (const Error& e) {
      problem(e.what());
    }
  }

  std::vector<std::string> read_string_list(const YAML::Node& node, const char* key, const std::string& where) {
    std::vector<std::string> out;
    const YAML::Node v = node[key];
    if (!v || v.IsNull()) return out;
    if (v.IsScalar()) return {v.as<std::string>()};
    if (!v.IsSequence()) {
      problem(fmt::format("{}.{}: expected a list of names", where, key));
      return out;
    }
    for (const auto& item : v) {
      if (item.IsScalar())
        out.push_back(item.as<std::string>());
      else
        problem(fmt::format("{}.{}: every entry must be a name", where, key));
    }
    return out;
  }
};

// The keys a mapping of the deployment file takes, from the declared options
// (base/options.cpp): `mapping` is "server", "models[]", "models[].speculative", ...
std::vector<std::string> known_keys(std::string_view mapping) {
  std::vector<std::string> keys;
  for (const OptionSpec& spec : option_specs()) {
    if (!spec.used_by(kUseDeploy) || spec.yaml.size() <= mapping.size() + 1) continue;
    if (spec.yaml.substr(0, mapping.size()) != mapping || spec.yaml[mapping.size()] != '.') continue;
    std::string_view rest = spec.yaml.substr(mapping.size() + 1);
    rest = rest.substr(0, rest.find('.'));
    if (rest.size() > 2 && rest.substr(rest.size() - 2) == "[]") rest.remove_suffix(2);
    if (std::find(keys.begin(), keys.end(), rest) == keys.end()) keys.emplace_back(rest);
  }
  return keys;
}

void read_server(Reader& r, const YAML::Node& node, ServerConfig& s) {
  const std::string w = "server";
  if (!node.IsMap()) {
    r.problem("server: expected a mapping of settings");
    return;
  }
  r.check_keys(node, w, known_keys("server"));
  r.read(node, "host", w, s.host, "a host name or address");
  r.read(node, "port", w, s.port, "a port number");
  std::optional<int64_t> body_limit;
  r.read_memory(node, "body_limit", w, body_limit);
  if (body_limit) s.body_limit_bytes = *body_limit;
  r.read(node, "request_timeout_s", w, s.request_timeout_s, "a number of seconds");
  r.read(node, "head_timeout_s", w, s.head_timeout_s, "a number of seconds");
  r.read(node, "drain_grace_s", w, s.drain_grace_s, "a number of seconds");
  r.read(node, "audit_log", w, s.audit_log_path, "a file path");
  r.read(node, "audit_log_prompts", w, s.audit_log_prompts, "true or false");
  r.read(node, "metrics", w, s.metrics, "true or false");
  r.read(node, "console", w, s.console, "true or false");
  r.read(node, "shared_prefix_cache", w, s.shared_prefix_cache, "true or false");
  r.read(node, "http_threads", w, s.http_threads, "an integer");
  r.read(node, "max_concurrent_requests_per_key", w, s.max_concurrent_requests_per_key, "an integer (0: unlimited)");
  if (s.max_concurrent_requests_per_key < 0)
    r.problem("server.max_concurrent_requests_per_key: must be 0 (unlimited) or more");
  s.allowed_hosts = r.read_string_list(node, "allowed_hosts", w);
  s.allowed_origins = r.read_string_list(node, "allowed_origins", w);
  const YAML::Node keys = node["api_keys"];
  if (!keys || keys.IsNull()) return;
  if (!keys.IsSequence()) {
    r.problem("server.api_keys: expected a list of keys (each with id and key or key_env)");
    return;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string kw = fmt::format("server.api_keys[{}]", i);
    const YAML::Node k = keys[i];
    if (!k.IsMap()) {
      r.problem(kw + ": expected a mapping with id and key or key_env");
      continue;
    }
    r.check_keys(k, kw, known_keys("server.api_keys[]"));
    ApiKeyConfig key;
    r.read(k, "id", kw, key.id, "a name");
    if (key.id.empty()) key.id = fmt::format("key-{}", i);
    r.read(k, "key", kw, key.key, "a string");
    std::string env;
    r.read(k, "key_env", kw, env, "an environment variable name");
    if (!env.empty()) {
      const char* value = std::getenv(env.c_str());
      if (!value || !*value)
        r.problem(fmt::format("{}.key_env: environment variable {} is not set; export it or give key:", kw, env));
      else
        key.key = value;
    } else if (key.key.empty()) {
      r.problem(kw + ": needs key: or key_env:");
    }
    key.models = r.read_string_list(k, "models", kw);
    r.read(k, "requests_per_minute", kw, key.requests_per_minute, "a number");
    r.read(k, "tokens_per_minute", kw, key.tokens_per_minute, "a number");
    r.read_opt(k, "max_concurrent_requests", kw, key.max_concurrent_requests, "an integer (0: unlimited)");
    if (key.max_concurrent_requests && *key.max_concurrent_requests < 0)
      r.problem(kw + ".max_concurrent_requests: must be 0 (unlimited) or more");
    s.api_keys.push_back(std::move(key));
  }
}

void read_model(Reader& r, const YAML::Node& node, size_t index, ModelDeployConfig& m) {
  const std::string w = fmt::format("models[{}]", index);
  if (!node.IsMap()) {
    r.problem(w + ": expected a mapping with at least name and path");
    return;
  }
  r.check_keys(node, w, known_keys("models[]"));
  r.read(node, "name", w, m.name, "a name");
  r.read(node, "path", w, m.path, "a model directory");
  r.read(node, "quantized", w, m.quantized_path, "a quantized model directory");
  r.read(node, "scheme", w, m.scheme, "a quantization scheme name");
  r.read(node, "profile", w, m.profile, "chat or long-context");
  r.read(node, "chat_template", w, m.chat_template_file, "a template file path");
  r.read(node, "generation_config", w, m.generation_config, "auto, none or a path");
  r.read(node, "threads", w, m.threads, "an integer");
  r.read_opt(node, "max_input_len", w, m.max_input_len, "an integer");
  r.read_opt(node, "max_output_len", w, m.max_output_len, "an integer");
  r.read_opt(node, "max_batch_tokens", w, m.max_batch_tokens, "an integer");
  r.read_opt(node, "max_num_seqs", w, m.max_num_seqs, "an integer");
  r.read_opt(node, "prefill_chunk", w, m.prefill_chunk, "an integer");
  r.read_memory(node, "kv_cache_memory", w, m.kv_cache_bytes);
  std::string kv_dtype = kv_cache_dtype_name(m.kv_dtype);
  r.read(node, "kv_dtype", w, kv_dtype, "f32, bf16 or int8");
  try {
    m.kv_dtype = parse_kv_cache_dtype(kv_dtype, "kv_dtype");
  } catch (const Error& e) {
    r.problem(fmt::format("{}.{}", w, e.what()));
  }
  r.read_opt(node, "max_queue", w, m.max_queue, "an integer");
  r.read(node, "enable_prefix_cache", w, m.enable_prefix_cache, "true or false");
  r.read(node, "prefix_checkpoint_interval", w, m.prefix_checkpoint_interval, "an integer (tokens; 0: none)");
  r.read(node, "cache_dir", w, m.cache_dir, "a directory");
  std::optional<int64_t> disk_bytes;
  r.read_memory(node, "cache_disk_size", w, disk_bytes);
  if (disk_bytes) m.cache_disk_bytes = *disk_bytes;
  if (m.prefix_checkpoint_interval < 0) r.problem(w + ".prefix_checkpoint_interval: must be 0 (none) or more");
  r.read(node, "load_into_memory", w, m.load_into_memory, "true or false");
  r.read(node, "port", w, m.port, "a port number");
  r.read(node, "tp", w, m.tp, "an integer (ranks)");
  r.read(node, "ep", w, m.ep, "an integer (ranks)");
  if (const YAML::Node spec = node["speculative"]; spec && !spec.IsNull()) {
    if (!spec.IsMap()) {
      r.problem(w + ".speculative: expected a mapping with method and num_draft_tokens");
    } else {
      r.check_keys(spec, w + ".speculative", known_keys("models[].speculative"));
      r.read(spec, "method", w + ".speculative", m.speculative.method, "none, ngram or mtp");
      r.read(spec, "num_draft_tokens", w + ".speculative", m.speculative.num_draft_tokens, "an integer");
    }
  }
}

DeployConfig read_deploy_config(const YAML::Node& root, const std::string& source) {
  DeployConfig config;
  Reader r;
  if (!root.IsMap()) fail("{}: expected a mapping with 'server' and 'models'", source);
  r.check_keys(root, "(top level)", {"server", "models"});
  if (root["server"]) read_server(r, root["server"], config.server);
  const YAML::Node models = root["models"];
  if (!models || !models.IsSequence() || models.size() == 0) {
    r.problem("models: expected a list with at least one model (name and path)");
  } else {
    for (size_t i = 0; i < models.size(); ++i) {
      ModelDeployConfig m;
      read_model(r, models[i], i, m);
      // A model in Ollama's store or the Hugging Face cache (ollama:NAME, hf:ORG/NAME): its
      // file or directory, served under the name the reference gives unless one is set.
      if (is_store_ref(m.path)) {
        try {
          const ResolvedModelRef ref = resolve_store_ref(m.path);
          if (m.name.empty()) m.name = ref.name;
          m.path = ref.path;
          m.ollama_params = ref.params;
          m.ollama_system = ref.system;
          m.ollama_messages = ref.messages;
        } catch (const Error& e) {
          r.problem(fmt::format("models[{}].path: {}", i, e.what()));
        }
      }
      if (is_store_ref(m.quantized_path)) {  // (hf:ORG/NAME of a quantized checkpoint)
        try {
          m.quantized_path = resolve_store_ref(m.quantized_path).path;
        } catch (const Error& e) {
          r.problem(fmt::format("models[{}].quantized: {}", i, e.what()));
        }
      }
      config.models.push_back(std::move(m));
    }
  }
  if (!r.problems.empty()) {
    std::string all;
    for (const auto& p : r.problems) all += "\n  " + p;
    fail("{}: {} problem{} in the deployment config:{}", source, r.problems.size(), r.problems.size() == 1 ? "" : "s",
         all);
  }
  return config;
}

}  // namespace

DeployConfig parse_deploy_config(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail("{}: not valid YAML at line {}, column {}: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  return read_deploy_config(root, source);
}

DeployConfig deploy_config_from_settings(const std::vector<DeploySetting>& settings, const std::string& source) {
  YAML::Node root(YAML::NodeType::Map);
  YAML::Node model(YAML::NodeType::Map);
  for (const DeploySetting& setting : settings) {
    if (setting.values.empty()) continue;
    std::vector<std::string> path;
    std::stringstream parts(setting.yaml);
    for (std::string part; std::getline(parts, part, '.');) path.push_back(part);
    if (path.size() < 2 || (path[0] != "server" && path[0] != "models[]")) {
      fail("{}: '{}' is not a deploy.yaml setting of the server or the model", source, setting.yaml);
    }
    if (setting.yaml == "server.api_keys") {
      // Plain keys (--api-key, INFERA_API_KEYS): key-0, key-1, ... as their ids.
      YAML::Node keys(YAML::NodeType::Sequence);
      for (size_t i = 0; i < setting.values.size(); ++i) {
        YAML::Node key(YAML::NodeType::Map);
        key["id"] = fmt::format("key-{}", i);
        key["key"] = setting.values[i];
        keys.push_back(key);
      }
      root["server"]["api_keys"] = keys;
      continue;
    }
    // yaml-cpp nodes are handles and assignment copies content: descend with reset().
    YAML::Node at = path[0] == "server" ? root["server"] : model;
    for (size_t i = 1; i + 1 < path.size(); ++i) at.reset(at[path[i]]);
    const auto spec = std::find_if(option_specs().begin(), option_specs().end(),
                                   [&](const OptionSpec& o) { return o.yaml == setting.yaml; });
    if (spec != option_specs().end() && spec->type == OptionType::kTextList) {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const std::string& v : setting.values) list.push_back(v);
      at[path.back()] = list;
    } else {
      at[path.back()] = setting.values.back();  // a flag given twice: the last one wins
    }
  }
  YAML::Node models(YAML::NodeType::Sequence);
  models.push_back(model);
  root["models"] = models;
  return read_deploy_config(root, source);
}

DeployConfig load_deploy_config(const std::string& path) {
  return parse_deploy_config(read_text_file(path, "the deployment config (check the path given to --config)"), path);
}

ResolvedLimits resolve_limits(const ModelDeployConfig& m, int32_t model_max_position) {
  const bool long_context = m.profile == "long-context";
  const int32_t context = model_max_position > 0 ? model_max_position : 4096;
  ResolvedLimits l;
  l.max_context = context;
  l.max_input_len = m.max_input_len.value_or(std::min(context, long_context ? context : 8192));
  l.max_output_len = m.max_output_len.value_or(std::min(context, long_context ? 8192 : 2048));
  l.max_num_seqs = m.max_num_seqs.value_or(long_context ? 8 : 32);
  l.prefill_chunk = m.prefill_chunk.value_or(long_context ? 2048 : 512);
  l.max_batch_tokens = m.max_batch_tokens.value_or(std::max(l.prefill_chunk, l.max_num_seqs));
  l.kv_cache_bytes = m.kv_cache_bytes.value_or(int64_t{1} << 30);
  l.max_queue = m.max_queue.value_or(4 * l.max_num_seqs + 64);
  return l;
}

EngineConfig engine_config(const ModelDeployConfig& m, const ResolvedLimits& limits) {
  EngineConfig c;
  c.kv_cache_bytes = limits.kv_cache_bytes;
  c.kv_dtype = m.kv_dtype;
  c.max_batch_tokens = limits.max_batch_tokens;
  c.max_num_seqs = limits.max_num_seqs;
  c.prefill_chunk = limits.prefill_chunk;
  c.enable_prefix_cache = m.enable_prefix_cache;
  c.prefix_checkpoint_interval = m.prefix_checkpoint_interval;
  c.max_context = limits.max_context;
  c.speculative.method = parse_speculative_method(m.speculative.method, "speculative.method");
  c.speculative.num_draft_tokens = m.speculative.num_draft_tokens;
  c.threads = m.threads;
  return c;
}

}  // namespace infera::server
