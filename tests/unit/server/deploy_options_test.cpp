// deploy.yaml keys and request defaults against the declared options (base/options.h):
// every key of before is still known and sets its field, the declared defaults are the
// defaults, and the request defaults are those the API parser starts from.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

#include "infera/base/error.h"
#include "infera/base/options.h"
#include "infera/server/deploy_config.h"
#include "infera/server/openai_api.h"

namespace infera::server {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_deploy_config(yaml, "t.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The known settings an unknown key at `where` lists.
std::set<std::string> known_at(const std::string& yaml, const std::string& where) {
  const std::string msg = error_of(yaml);
  const std::string marker = where + ".bogus: unknown setting; known settings are: ";
  const size_t at = msg.find(marker);
  EXPECT_NE(at, std::string::npos) << msg;
  if (at == std::string::npos) return {};
  std::stringstream list(msg.substr(at + marker.size(), msg.find('\n', at) - at - marker.size()));
  std::set<std::string> keys;
  for (std::string k; std::getline(list, k, ',');) keys.insert(k.substr(k.find_first_not_of(' ')));
  return keys;
}

TEST(DeployOptions, TheKeysOfBeforeAreExactlyTheKnownKeys) {
  EXPECT_EQ(known_at("server: {bogus: 1}\nmodels: [{path: /m}]\n", "server"),
            (std::set<std::string>{"host", "port", "body_limit", "request_timeout_s", "head_timeout_s", "drain_grace_s",
                                   "audit_log", "audit_log_prompts", "metrics", "console", "http_threads", "api_keys",
                                   "max_concurrent_requests_per_key", "allowed_hosts", "allowed_origins",
                                   "shared_prefix_cache"}));
  EXPECT_EQ(known_at("models: [{path: /m, bogus: 1}]\n", "models[0]"),
            (std::set<std::string>{"name",
                                   "path",
                                   "quantized",
                                   "scheme",
                                   "profile",
                                   "chat_template",
                                   "generation_config",
                                   "threads",
                                   "max_input_len",
                                   "max_output_len",
                                   "max_batch_tokens",
                                   "max_num_seqs",
                                   "prefill_chunk",
                                   "kv_cache_memory",
                                   "kv_dtype",
                                   "max_queue",
                                   "enable_prefix_cache",
                                   "prefix_checkpoint_interval",
                                   "cache_dir",
                                   "cache_disk_size",
                                   "load_into_memory",
                                   "port",
                                   "speculative",
                                   "tp",
                                   "ep"}));
  EXPECT_EQ(known_at("models: [{path: /m, speculative: {bogus: 1}}]\n", "models[0].speculative"),
            (std::set<std::string>{"method", "num_draft_tokens"}));
  EXPECT_EQ(known_at("server: {api_keys: [{key: long-enough-key, bogus: 1}]}\nmodels: [{path: /m}]\n",
                     "server.api_keys[0]"),
            (std::set<std::string>{"id", "key", "key_env", "models", "requests_per_minute", "tokens_per_minute",
                                   "max_concurrent_requests"}));
}

TEST(DeployOptions, EveryKeyOfBeforeSetsItsField) {
  const DeployConfig c = parse_deploy_config(R"(
server:
  host: 0.0.0.0
  port: 9000
  body_limit: 2MiB
  request_timeout_s: 31
  head_timeout_s: 4
  drain_grace_s: 7
  audit_log: /tmp/audit.jsonl
  audit_log_prompts: true
  metrics: false
  http_threads: 8
  max_concurrent_requests_per_key: 4
  allowed_hosts: [infera.local]
  allowed_origins: ["http://localhost:3000"]
  api_keys:
    - {id: a, key: long-enough-key, models: [m], requests_per_minute: 5, tokens_per_minute: 600,
       max_concurrent_requests: 2}
models:
  - name: m
    path: /m
    quantized: /q
    scheme: w8a8
    profile: long-context
    chat_template: /t.jinja
    threads: 3
    max_input_len: 100
    max_output_len: 50
    max_batch_tokens: 256
    max_num_seqs: 8
    prefill_chunk: 128
    kv_cache_memory: 256MiB
    kv_dtype: int8
    max_queue: 9
    enable_prefix_cache: false
    load_into_memory: true
    port: 9001
    speculative: {method: mtp, num_draft_tokens: 2}
    tp: 2
    ep: 2
)",
                                             "t.yaml");
  EXPECT_EQ(c.server.host, "0.0.0.0");
  EXPECT_EQ(c.server.port, 9000);
  EXPECT_EQ(c.server.body_limit_bytes, 2 << 20);
  EXPECT_DOUBLE_EQ(c.server.request_timeout_s, 31);
  EXPECT_DOUBLE_EQ(c.server.head_timeout_s, 4);
  EXPECT_DOUBLE_EQ(c.server.drain_grace_s, 7);
  EXPECT_EQ(c.server.audit_log_path, "/tmp/audit.jsonl");
  EXPECT_TRUE(c.server.audit_log_prompts);
  EXPECT_FALSE(c.server.metrics);
  EXPECT_EQ(c.server.http_threads, 8);
  ASSERT_EQ(c.server.api_keys.size(), 1u);
  EXPECT_EQ(c.server.api_keys[0], (ApiKeyConfig{"a", "long-enough-key", {"m"}, 5, 600, 2}));
  EXPECT_EQ(c.server.max_concurrent_requests_per_key, 4);
  EXPECT_EQ(c.server.allowed_hosts, std::vector<std::string>{"infera.local"});
  EXPECT_EQ(c.server.allowed_origins, std::vector<std::string>{"http://localhost:3000"});
  ASSERT_EQ(c.models.size(), 1u);
  const ModelDeployConfig& m = c.models[0];
  EXPECT_EQ(m.name, "m");
  EXPECT_EQ(m.path, "/m");
  EXPECT_EQ(m.quantized_path, "/q");
  EXPECT_EQ(m.scheme, "w8a8");
  EXPECT_EQ(m.profile, "long-context");
  EXPECT_EQ(m.chat_template_file, "/t.jinja");
  EXPECT_EQ(m.threads, 3);
  EXPECT_EQ(m.max_input_len, 100);
  EXPECT_EQ(m.max_output_len, 50);
  EXPECT_EQ(m.max_batch_tokens, 256);
  EXPECT_EQ(m.max_num_seqs, 8);
  EXPECT_EQ(m.prefill_chunk, 128);
  EXPECT_EQ(m.kv_cache_bytes, int64_t{256} << 20);
  EXPECT_EQ(m.kv_dtype, DType::kI8);
  EXPECT_EQ(m.max_queue, 9);
  EXPECT_FALSE(m.enable_prefix_cache);
  EXPECT_TRUE(m.load_into_memory);
  EXPECT_EQ(m.port, 9001);
  EXPECT_EQ(m.speculative.method, "mtp");
  EXPECT_EQ(m.speculative.num_draft_tokens, 2);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.ep, 2);
}

// Limits left out resolve to their defaults: compare them resolved.
DeployConfig resolved(DeployConfig c) {
  for (ModelDeployConfig& m : c.models) {
    const ResolvedLimits l = resolve_limits(m, 4096);
    m.max_input_len = l.max_input_len;
    m.max_output_len = l.max_output_len;
    m.max_batch_tokens = l.max_batch_tokens;
    m.max_num_seqs = l.max_num_seqs;
    m.prefill_chunk = l.prefill_chunk;
    m.kv_cache_bytes = l.kv_cache_bytes;
    m.max_queue = l.max_queue;
  }
  return c;
}

// A key set to its declared default reads as the key left out.
TEST(DeployOptions, DeclaredDefaultsAreTheDefaults) {
  const std::string base_yaml = "models:\n  - path: /m\n";
  const DeployConfig base = resolved(parse_deploy_config(base_yaml, "t.yaml"));
  int checked = 0;
  for (const OptionSpec& spec : option_specs()) {
    const std::string_view d = spec.default_for_serve();
    if (!spec.used_by(kUseDeploy) || d.empty()) continue;
    const std::string yaml(spec.yaml);
    std::string text;
    if (yaml.rfind("models[].speculative.", 0) == 0) {
      text = base_yaml + "    speculative: {" + yaml.substr(21) + ": " + std::string(d) + "}\n";
    } else if (yaml.rfind("models[].", 0) == 0) {
      text = base_yaml + "    " + yaml.substr(9) + ": " + std::string(d) + "\n";
    } else if (yaml.rfind("server.api_keys[].", 0) == 0) {
      const std::string with = "server:\n  api_keys:\n    - {id: k, key: long-enough-key";
      const DeployConfig without = parse_deploy_config(with + "}\n" + base_yaml, "t.yaml");
      EXPECT_EQ(parse_deploy_config(with + ", " + yaml.substr(18) + ": " + std::string(d) + "}\n" + base_yaml,
                                    "t.yaml"),
                without)
          << yaml;
      ++checked;
      continue;
    } else if (yaml.rfind("server.", 0) == 0 && yaml.find('.', 7) == std::string::npos) {
      text = "server:\n  " + yaml.substr(7) + ": " + std::string(d) + "\n" + base_yaml;
    } else {
      ADD_FAILURE() << "no check for " << yaml;
      continue;
    }
    EXPECT_EQ(resolved(parse_deploy_config(text, "t.yaml")), base) << yaml << ": " << d;
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

float request_default(std::string_view name) { return std::stof(std::string(option_spec(name).request_default)); }

TEST(DeployOptions, RequestDefaultsAreThoseTheParserStartsFrom) {
  const GenerationOptions o;
  EXPECT_FLOAT_EQ(o.temperature, request_default("temperature"));
  EXPECT_EQ(o.top_k, request_default("top_k"));
  EXPECT_FLOAT_EQ(o.top_p, request_default("top_p"));
  EXPECT_FLOAT_EQ(o.min_p, request_default("min_p"));
  EXPECT_FLOAT_EQ(o.repetition_penalty, request_default("repetition_penalty"));
  EXPECT_FLOAT_EQ(o.presence_penalty, request_default("presence_penalty"));
  EXPECT_FLOAT_EQ(o.frequency_penalty, request_default("frequency_penalty"));
  EXPECT_FALSE(o.seed.has_value());
  EXPECT_EQ(option_spec("ignore_eos").request_default, o.ignore_eos ? "true" : "false");
  EXPECT_FALSE(o.cache_salt.has_value());  // "(none: the API key's own cache)"
  int request_options = 0;
  for (const OptionSpec& s : option_specs()) request_options += s.used_by(kUseRequest);
  EXPECT_EQ(request_options, 10) << "a new request option needs its check here";
  // And a request that sets nothing parses to them.
  const CompletionRequest r = parse_completion_request(nlohmann::json{{"prompt", "x"}});
  EXPECT_FLOAT_EQ(r.options.temperature, request_default("temperature"));
  EXPECT_FLOAT_EQ(r.options.top_p, request_default("top_p"));
}

TEST(DeployOptions, FlagSettingsReadAsTheirKeys) {
  const DeployConfig from_flags =
      deploy_config_from_settings({{"models[].path", {"/m"}},
                                   {"models[].speculative.method", {"ngram"}},
                                   {"server.port", {"9000", "9001"}},
                                   {"models[].enable_prefix_cache", {"false"}},
                                   {"server.api_keys", {"key-number-one", "key-number-two"}},
                                   {"server.allowed_hosts", {"a.local", "b.local"}}},
                                  "flags");
  const DeployConfig from_file = parse_deploy_config(R"(
server:
  port: 9001
  allowed_hosts: [a.local, b.local]
  api_keys: [{id: key-0, key: key-number-one}, {id: key-1, key: key-number-two}]
models:
  - {path: /m, speculative: {method: ngram}, enable_prefix_cache: false}
)",
                                                     "t.yaml");
  EXPECT_EQ(from_flags, from_file);
  EXPECT_THROW(deploy_config_from_settings({{"models[].path", {"/m"}}, {"models[].threads", {"many"}}}, "flags"),
               Error);
}

}  // namespace
}  // namespace infera::server
