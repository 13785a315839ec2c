// Deployment configuration: server-wide settings and one entry per served model, from
// `infera serve` options or a YAML file (`infera serve --config deploy.yaml`; see
// docs/server.md and examples/deploy.yaml). Parsing checks types and names; validation
// then checks everything against the disk and the machine and reports every problem at
// once, before any weights are loaded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "infera/tensor/dtype.h"

namespace infera {
struct EngineConfig;
}  // namespace infera

namespace infera::server {

struct ApiKeyConfig {
  std::string id;  // shown in logs and the audit log instead of the key
  std::string key;  // the secret (from `key:` or the variable `key_env:` names)
  std::vector<std::string> models;  // empty: every model
  double requests_per_minute = 0;  // 0: unlimited
  double tokens_per_minute = 0;  // prompt + completion tokens; 0: unlimited
  // Requests in flight at once (unset: the server's max_concurrent_requests_per_key; 0: unlimited).
  std::optional<int32_t> max_concurrent_requests;
  bool operator==(const ApiKeyConfig&) const = default;
};

struct SpeculativeConfig {
  std::string method = "none";  // none | ngram | mtp
  int32_t num_draft_tokens = 0;
  bool operator==(const SpeculativeConfig&) const = default;
};

// Every limit is optional: unset ones come from the profile, then the model's config.
struct ModelDeployConfig {
  std::string name;  // the "model" field clients send; default: the directory's name
  std::string path;  // Hugging Face model directory
  std::string quantized_path;  // optional quantized checkpoint dir (infera quantize)
  std::string scheme;  // informational: bf16, w8a8, w4a16, ...
  std::string profile = "chat";  // chat | long-context
  std::string chat_template_file;  // overrides tokenizer_config.json's chat_template
  // Sampling defaults for what a request leaves out (server/generation_defaults.h): auto
  // (the model's own), none, or a path.
  std::string generation_config = "auto";
  // An Ollama model's params layer (its sampling defaults), set when `path` was an
  // ollama: reference; not a deploy.yaml key.
  std::string ollama_params;
  // Its system layer (the system prompt a chat request without one gets), likewise.
  std::string ollama_system;
  // Its messages layer (the preset messages every chat request gets first), likewise.
  std::string ollama_messages;
  int32_t threads = 0;  // 0: all cores
  std::optional<int32_t> max_input_len;
  std::optional<int32_t> max_output_len;
  std::optional<int32_t> max_batch_tokens;
  std::optional<int32_t> max_num_seqs;
  std::optional<int32_t> prefill_chunk;
  std::optional<int64_t> kv_cache_bytes;
  DType kv_dtype = DType::kF32;  // kv_dtype: f32 | bf16 | int8 (KV cache storage)
  std::optional<int32_t> max_queue;  // waiting requests beyond which new ones get 429
  bool enable_prefix_cache = true;
  int32_t prefix_checkpoint_interval = 2048;  // hybrids: a state checkpoint every this many prompt tokens
  std::string cache_dir;  // the prefix cache's disk tier (empty: none)
  int64_t cache_disk_bytes = int64_t{8} << 30;  // its size limit
  bool load_into_memory = false;  // read weights into RAM instead of mmap
  int32_t port = 0;  // 0: none; else this model also answers on its own port
  SpeculativeConfig speculative;
  // Tensor / expert parallel ranks (docs/parallel.md): tp splits attention heads, MLP and
  // vocabulary, ep the experts of a MoE model. At most one model of a deployment may use
  // them; `infera serve` then runs as max(tp, ep) ranks under mpirun.
  int32_t tp = 1;
  int32_t ep = 1;
  bool operator==(const ModelDeployConfig&) const = default;
};

struct ServerConfig {
  std::string host = "127.0.0.1";
  int32_t port = 8000;
  int64_t body_limit_bytes = 4 << 20;
  double request_timeout_s = 600;
  double head_timeout_s = 10;  // request line + headers, from their first byte (408 after)
  double drain_grace_s = 30;
  std::string audit_log_path;  // empty: no audit log
  bool audit_log_prompts = false;  // write prompt text into the audit log
  bool metrics = true;
  bool console = true;  // the web console: GET /, /status, /console/*, /v1/stats
  // API keys share cached prompt prefixes (default: each key has its own).
  bool shared_prefix_cache = false;
  int32_t http_threads = 64;  // concurrent connections served
  std::vector<ApiKeyConfig> api_keys;  // empty: no authentication
  int32_t max_concurrent_requests_per_key = 32;  // default of api_keys[].max_concurrent_requests; 0: unlimited
  // Without API keys, browsers are kept out (DNS rebinding, cross-site posts): the Host
  // header must name a loopback address, the bound address or one of allowed_hosts, and
  // an Origin header must be the server's own or one of allowed_origins ("*": any).
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> allowed_origins;
  bool operator==(const ServerConfig&) const = default;
};

struct DeployConfig {
  ServerConfig server;
  std::vector<ModelDeployConfig> models;
  bool operator==(const DeployConfig&) const = default;
};

// Reads a deploy.yaml. Throws infera::Error listing every problem (unknown keys, wrong
// types, missing environment variables for keys), one per line, each naming the field.
DeployConfig load_deploy_config(const std::string& path);
DeployConfig parse_deploy_config(const std::string& yaml_text, const std::string& source);

// A setting given outside a deployment file (an `infera serve` flag): the option's
// deploy.yaml path from base/options.cpp ("server.port"; "models[].kv_dtype" is the one
// model's) and the text given (several for a list; for a scalar the last one counts).
// "server.api_keys" takes plain keys, named key-0, key-1, ...
struct DeploySetting {
  std::string yaml;
  std::vector<std::string> values;
};
// The deployment of one model that `settings` describe, read and checked as a file with
// those keys would be. Throws infera::Error as parse_deploy_config.
DeployConfig deploy_config_from_settings(const std::vector<DeploySetting>& settings, const std::string& source);

// Limits of one model after profile defaults and the model's own limits are applied.
struct ResolvedLimits {
  int32_t max_context = 0;  // prompt + completion tokens (the model's max_position_embeddings)
  int32_t max_input_len = 0;
  int32_t max_output_len = 0;
  int32_t max_batch_tokens = 0;
  int32_t max_num_seqs = 0;
  int32_t prefill_chunk = 0;
  int64_t kv_cache_bytes = 0;
  int32_t max_queue = 0;
};

ResolvedLimits resolve_limits(const ModelDeployConfig& model, int32_t model_max_position);

// A model's engine settings, from its options (deploy.yaml keys, `serve` or `run` flags)
// and resolved limits: the one conversion, used to validate a deployment, to start a served
// model's engine and `infera run`'s. Throws infera::Error for an unknown speculative method.
EngineConfig engine_config(const ModelDeployConfig& model, const ResolvedLimits& limits);

}  // namespace infera::server
