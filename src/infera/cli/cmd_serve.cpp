// infera serve: the OpenAI-compatible server for one model (-m) or a deployment file
// (--config deploy.yaml). The whole configuration is validated (paths, tokenizer, chat
// template, limits, ports) before any weights load; every problem is reported at once.
// SIGTERM / SIGINT drain: new requests get 503, in-flight ones finish within the grace
// period, then the process exits 0.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <sstream>
#include <thread>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/cli/command.h"
#include "infera/cli/model_paths.h"
#include "infera/model/kv_pool.h"
#include "infera/runtime/engine_config.h"
#include "infera/server/deploy_config.h"
#include "infera/server/http_server.h"
#include "infera/server/model_instance.h"

namespace {

using namespace infera;
using namespace infera::server;

struct ServeOptions {
  std::string config_file;
  std::string model_dir;
  std::string name;
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads = 0;
  std::vector<std::string> api_keys;
  std::string kv_cache_memory;
  std::string kv_dtype = "f32";
  int max_input_len = 0;
  int max_output_len = 0;
  int max_batch_tokens = 0;
  int max_num_seqs = 0;
  int prefill_chunk = 0;
  std::string profile = "chat";
  std::string chat_template;
  std::string audit_log;
  bool audit_log_prompts = false;
  std::string body_limit;
  double request_timeout_s = 600;
  double drain_grace_s = 30;
  bool load_into_memory = false;
  bool no_prefix_cache = false;
  std::string speculative = "none";
  int draft_tokens = 0;
  bool host_given = false, port_given = false;
};

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

DeployConfig build_config(const ServeOptions& o) {
  DeployConfig config;
  if (!o.config_file.empty()) {
    if (!o.model_dir.empty()) fail("give either --config or -m, not both (put the model into the config file)");
    config = load_deploy_config(o.config_file);
    if (o.host_given) config.server.host = o.host;
    if (o.port_given) config.server.port = o.port;
    return config;
  }
  ServerConfig& s = config.server;
  s.host = o.host;
  s.port = o.port;
  s.audit_log_path = o.audit_log;
  s.audit_log_prompts = o.audit_log_prompts;
  s.request_timeout_s = o.request_timeout_s;
  s.drain_grace_s = o.drain_grace_s;
  if (!o.body_limit.empty()) s.body_limit_bytes = parse_memory_size(o.body_limit, "--body-limit");
  std::vector<std::string> keys = o.api_keys;
  if (keys.empty()) {
    // Keys from the environment keep them out of the process list.
    if (const char* env = std::getenv("INFERA_API_KEYS"); env && *env) {
      std::stringstream list(env);
      for (std::string k; std::getline(list, k, ',');) {
        if (!k.empty()) keys.push_back(k);
      }
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    ApiKeyConfig k;
    k.id = "key-" + std::to_string(i);
    k.key = keys[i];
    s.api_keys.push_back(std::move(k));
  }
  ModelDeployConfig m;
  m.path = o.model_dir.empty() ? cli::default_model_dir() : o.model_dir;
  m.name = o.name.empty() && o.model_dir.empty() ? "infera-default" : o.name;
  m.profile = o.profile;
  m.chat_template_file = o.chat_template;
  m.threads = o.threads;
  if (o.max_input_len > 0) m.max_input_len = o.max_input_len;
  if (o.max_output_len > 0) m.max_output_len = o.max_output_len;
  if (o.max_batch_tokens > 0) m.max_batch_tokens = o.max_batch_tokens;
  if (o.max_num_seqs > 0) m.max_num_seqs = o.max_num_seqs;
  if (o.prefill_chunk > 0) m.prefill_chunk = o.prefill_chunk;
  if (!o.kv_cache_memory.empty()) m.kv_cache_bytes = parse_memory_size(o.kv_cache_memory, "--kv-cache-memory");
  m.kv_dtype = parse_kv_cache_dtype(o.kv_dtype);
  m.load_into_memory = o.load_into_memory;
  m.enable_prefix_cache = !o.no_prefix_cache;
  m.speculative.method = o.speculative;
  m.speculative.num_draft_tokens = o.draft_tokens;
  config.models.push_back(std::move(m));
  return config;
}

int serve(const ServeOptions& options) {
  const DeployConfig config = build_config(options);
  auto models = prepare_models(config);  // throws with every problem listed

  if (!is_loopback(config.server.host) && config.server.api_keys.empty()) {
    LOG_WARN("**********************************************************************");
    LOG_WARN("listening on {} WITHOUT API KEYS: anyone who can reach this address can", config.server.host);
    LOG_WARN("use the models. Add --api-key (or server.api_keys) or bind 127.0.0.1.");
    LOG_WARN("**********************************************************************");
  }
  for (const auto& m : models) {
    const auto& l = m->limits();
    LOG_INFO("model '{}' ({}): profile {}, context {}, max_input_len {}, max_output_len {}, max_num_seqs {}, "
             "max_batch_tokens {}, prefill_chunk {}, kv cache {} MiB {}{}",
             m->name(), m->deploy().path, m->deploy().profile, l.max_context, l.max_input_len, l.max_output_len, l.max_num_seqs,
             l.max_batch_tokens, l.prefill_chunk, l.kv_cache_bytes >> 20, kv_cache_dtype_name(m->deploy().kv_dtype),
             m->deploy().port ? ", own port " + std::to_string(m->deploy().port) : std::string());
    if (!m->has_chat_template()) LOG_WARN("model '{}' has no chat template: /v1/chat/completions will answer 400", m->name());
  }

  // Signals go to one thread that waits for them; every thread started below inherits
  // the blocked mask. SIGPIPE (a client gone mid-write) must never kill the server.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  HttpServer server(config.server, models);
  server.bind();
  LOG_INFO("listening on http://{}:{}", config.server.host, server.port());

  std::atomic<bool> done{false};
  std::atomic<int> exit_code{0};
  std::thread loader([&] {
    size_t failed = 0;
    for (auto& m : models) {
      if (done) return;
      LOG_INFO("loading model '{}'", m->name());
      m->load();
      failed += m->state() == ModelState::kFailed;
    }
    if (failed == models.size()) {
      LOG_ERROR("no model could be loaded; stopping");
      exit_code = 1;
      server.stop();
    }
  });
  std::thread drainer;
  std::thread signal_waiter([&] {
    int received = 0;
    while (!done) {
      timespec timeout{0, 200 * 1000 * 1000};
      const int sig = sigtimedwait(&signals, nullptr, &timeout);
      if (sig < 0) continue;
      if (++received == 1) {
        LOG_INFO("received {}; draining (grace {} s, send again to stop at once)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 config.server.drain_grace_s);
        drainer = std::thread([&] { server.drain_and_stop(config.server.drain_grace_s); });
      } else {
        LOG_WARN("second signal: stopping now");
        server.stop();
      }
    }
  });

  server.run();
  done = true;
  loader.join();
  signal_waiter.join();
  if (drainer.joinable()) drainer.join();
  LOG_INFO("server stopped");
  return exit_code;
}

void setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve models over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<ServeOptions>();
  cmd->add_option("--config", o->config_file, "Deployment file (YAML) with server settings and several models");
  cmd->add_option("-m,--model", o->model_dir, "Model directory (default: the built-in default model)");
  cmd->add_option("--name", o->name, "Name clients send as \"model\" (default: the directory's name)");
  auto* host = cmd->add_option("--host", o->host, "Address to bind (default 127.0.0.1)");
  auto* port = cmd->add_option("--port", o->port, "Port (default 8000)");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (0: all cores)");
  cmd->add_option("--api-key", o->api_keys, "Accepted API key (repeatable; or INFERA_API_KEYS=k1,k2)");
  cmd->add_option("--kv-cache-memory", o->kv_cache_memory, "KV cache budget, e.g. 2GiB (default 1GiB)");
  cmd->add_option("--kv-dtype", o->kv_dtype, "KV cache storage: f32, bf16 (2x the tokens per byte) or int8 (~4x; an f32 "
                                             "scale per token and KV head)")
      ->default_val("f32")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  cmd->add_option("--max-input-len", o->max_input_len, "Longest prompt in tokens");
  cmd->add_option("--max-output-len", o->max_output_len, "Most tokens one request may generate");
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens, "Tokens per forward pass");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences running at once");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Most prompt tokens one sequence feeds per step");
  cmd->add_option("--profile", o->profile, "Default limits: chat or long-context");
  cmd->add_option("--chat-template", o->chat_template, "Jinja chat template file overriding the model's");
  cmd->add_option("--audit-log", o->audit_log, "Append one JSON line per request to this file");
  cmd->add_flag("--audit-log-prompts", o->audit_log_prompts, "Include prompt text in the audit log");
  cmd->add_option("--body-limit", o->body_limit, "Largest request body (default 4MiB)");
  cmd->add_option("--request-timeout", o->request_timeout_s, "Seconds before a request gets 504 (default 600)");
  cmd->add_option("--drain-grace", o->drain_grace_s, "Seconds in-flight requests may take after SIGTERM (default 30)");
  cmd->add_flag("--load-into-memory", o->load_into_memory, "Read weights into memory instead of mmap");
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache, "Disable prefix caching");
  cmd->add_option("--speculative", o->speculative, "Speculative decoding: none, ngram (prompt lookup) or mtp (the model's MTP head)");
  cmd->add_option("--draft-tokens", o->draft_tokens, "Draft tokens per step (0: the method's default, mtp 1, ngram 4)")
      ->check(CLI::Range(0, 16));
  cmd->callback([o, host, port] {
    o->host_given = host->count() > 0;
    o->port_given = port->count() > 0;
    cli::set_exit_code(serve(*o));
  });
}

INFERA_REGISTER_COMMAND(serve, setup);

}  // namespace
