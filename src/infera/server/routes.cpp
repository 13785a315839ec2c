#include "infera/server/routes.h"

#include <chrono>
#include <cmath>
#include <random>
#include <utility>  // before Boost 1.74's asio (its awaitable.hpp uses std::exchange)
#include <variant>

#include <fmt/format.h>
#include <xxhash.h>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/server/logprobs_json.h"
#include "infera/server/openai_response.h"

namespace infera::server {

using nlohmann::json;

namespace {

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The prefix-cache salt of a request (Request::cache_salt): its cache_salt when given (the
// clients that share a secret salt share cached prefixes), else its API key's own unless
// the deployment shares the cache; 0 (unsalted) without keys.
uint64_t prefix_cache_salt(const GenerationOptions& options, const ApiKeyStore::Key* key, bool shared) {
  uint64_t salt = 0;
  if (options.cache_salt) {
    salt = XXH3_64bits_withSeed(options.cache_salt->data(), options.cache_salt->size(), 0x73616c74);
  } else if (key && !shared) {
    salt = XXH3_64bits_withSeed(key->config.id.data(), key->config.id.size(), 0x6b6579);
  }
  return salt;
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// The endpoints. Those that read a body (and need a key when keys are set) are POSTs.
// kPage: the console's static files (console.h); kStats: its JSON.
enum class Route {
  kNone,
  kChat,
  kCompletion,
  kModels,
  kTokenize,
  kDetokenize,
  kHealth,
  kReady,
  kMetrics,
  kPage,
  kStats
};

Route route_of(const HttpRequest& r, bool metrics, bool console) {
  const std::string& p = r.path;
  if (r.method == "POST") {
    if (p == "/v1/chat/completions") return Route::kChat;
    if (p == "/v1/completions") return Route::kCompletion;
    if (p == "/tokenize") return Route::kTokenize;
    if (p == "/detokenize") return Route::kDetokenize;
  } else if (r.method == "GET" || r.method == "HEAD") {  // HEAD: the head of the GET response
    if (p == "/v1/models") return Route::kModels;
    if (p == "/health") return Route::kHealth;
    if (p == "/ready") return Route::kReady;
    if (p == "/metrics" && metrics) return Route::kMetrics;
    if (console && p == "/v1/stats") return Route::kStats;
    if (console && find_web_asset(p)) return Route::kPage;
  }
  return Route::kNone;
}

const char* endpoint_name(Route r) {
  switch (r) {
    case Route::kChat: return "/v1/chat/completions";
    case Route::kCompletion: return "/v1/completions";
    case Route::kTokenize: return "/tokenize";
    case Route::kDetokenize: return "/detokenize";
    default: return "";
  }
}

ApiError model_not_found(const std::string& name) {
  return make_error(404, "invalid_request_error",
                    fmt::format("the model '{}' does not exist here; GET /v1/models lists the served models", name),
                    "model_not_found", "model");
}

// 429 for a key over one of its limits (limits.h).
[[noreturn]] void throw_limited(const LimitDenial& d) {
  ApiError e = make_error(429, "rate_limit_error", d.message, "rate_limit_exceeded");
  e.retry_after_s = static_cast<int>(d.retry_after_s);
  throw_api(e);
}

// The constraint of a request (docs/structured.md): response_format / structured_outputs /
// grammar / json_schema, or a forced tool call; with tool_choice "auto", a tool call's
// arguments from its opening tag on. Reasoning models are constrained after </think>.
// Compiled here, on the worker thread (cached); a constraint that does not compile is a 400.
ConstraintRequest constraint_for(const ModelInstance& model, const ChatRequest* chat, const GenerationOptions& options,
                                 bool opens_think) {
  ConstraintRequest c;
  std::optional<constrain::ConstraintSpec> spec = options.constraint;
  std::string param = options.constraint_param;
  const Tokenizer& tok = model.tokenizer();
  bool tool_auto = false;
  if (chat && chat->tools_enabled && !spec) {
    const bool forced = chat->tool_required || chat->forced_tool;
    constrain::ConstraintSpec tools;
    tools.kind = constrain::ConstraintSpec::Kind::kToolCalls;
    tools.json = json::array();
    for (const ToolDefinition& t : chat->tools) {
      if (chat->forced_tool && t.name != *chat->forced_tool) continue;
      tools.json.push_back({{"name", t.name},
                            {"parameters", t.ordered_parameters.is_null() ? nlohmann::ordered_json(t.parameters)
                                                                          : t.ordered_parameters}});
    }
    tools.tool_options.parallel = chat->parallel_tool_calls && !chat->forced_tool;
    tools.tool_options.with_open_tag = forced;
    tool_auto = !forced;
    spec = std::move(tools);
    param = "tools";
  }
  if (!spec) return c;
  try {
    c.compiled = constrain::compile_cached(*spec, model.vocabulary());
  } catch (const constrain::ConstraintError& e) {
    throw_api(bad_request(e.what(), param));
  }
  if (tool_auto) {
    // The opening tag as bytes (one token or several); its token too where it is one.
    c.start_text = "<tool_call>";
    c.start_token = tok.token_to_id("<tool_call>").value_or(-1);
    c.rearm = true;
    return c;
  }
  if (chat && model.emits_reasoning()) {
    const auto open = tok.token_to_id("<think>");
    const auto close = tok.token_to_id("</think>");
    if (open && close) {
      c.start_token = *close;
      if (!opens_think) c.open_token = *open;
    }
  }
  if (c.start_token < 0 || c.open_token >= 0) c.strip_leading_spaces = tok.strip_leading_spaces();
  return c;
}

bool needs_key(Route r) {
  return r == Route::kChat || r == Route::kCompletion || r == Route::kTokenize || r == Route::kDetokenize;
}

}  // namespace

// Requests that parse JSON, render a chat template or tokenize run here, never on an
// I/O thread. Bounded: each connection has at most one request in it at a time, and the
// connections are capped.
struct Routes::Workers {
  explicit Workers(size_t n) : pool(n) {}
  boost::asio::thread_pool pool;
};

Routes::Routes(ServerConfig c, std::vector<std::shared_ptr<ModelInstance>> m)
    : config_(std::move(c)),
      models_(std::move(m)),
      keys_(config_.api_keys, config_.max_concurrent_requests_per_key),
      guard_(GuardConfig{!config_.api_keys.empty(), config_.host, config_.allowed_hosts, config_.allowed_origins}),
      console_stats_(config_, models_) {
  if (!config_.audit_log_path.empty())
    audit_ = std::make_unique<AuditLog>(config_.audit_log_path, config_.audit_log_prompts);
  workers_ = std::make_unique<Workers>(static_cast<size_t>(std::clamp(config_.http_threads, 1, 64)));
}

Routes::~Routes() {
  stop_workers();
  abort_jobs();
}

void Routes::stop_workers() {
  if (!workers_) return;
  workers_->pool.join();  // the requests being handled finish; none is queued (no I/O thread runs)
}

void Routes::abort_jobs() {
  std::vector<std::shared_ptr<Job>> running;
  {
    std::lock_guard lock(jobs_mutex_);
    for (auto& [raw, weak] : jobs_) {
      if (auto j = weak.lock()) running.push_back(std::move(j));
    }
  }
  size_t unfinished = 0;
  for (auto& j : running) unfinished += j->abort() ? 1 : 0;
  if (unfinished > 0) LOG_WARN("stopped with {} request(s) unfinished; their generations are cancelled", unfinished);
}

void Routes::leave_in_flight() {
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard lock(drain_mutex_);
    drain_cv_.notify_all();
  }
}

void Routes::wait_idle(double grace_s) {
  std::unique_lock lock(drain_mutex_);
  drain_cv_.wait_for(lock, std::chrono::duration<double>(grace_s),
                     [&] { return in_flight_.load() == 0 || drain_woken_.load(); });
}

void Routes::wake_drain() {
  std::lock_guard lock(drain_mutex_);
  drain_woken_ = true;
  drain_cv_.notify_all();
}

HttpResponse Routes::transport_error(int status, const std::string& message) {
  ApiError e;
  if (status == 413) {
    e = make_error(413, "invalid_request_error", message, "body_too_large");
    record("", "", 413, nullptr, SteadyClock::now());
  } else if (status == 431) {
    e = make_error(431, "invalid_request_error", message, "headers_too_large");
  } else if (status == 408) {
    e = make_error(408, "invalid_request_error", message, "request_timeout");
  } else if (status >= 500) {
    e = make_error(status, "server_error", message);
  } else {
    e = make_error(status, "invalid_request_error", message, "bad_request");
  }
  return error_response(e);
}

std::optional<HttpResponse> Routes::check_head(const Scope& scope, const HttpRequest& head) {
  const Route route = route_of(head, config_.metrics, config_.console);
  if (route == Route::kNone) {
    return error_response(make_error(404, "invalid_request_error",
                                     fmt::format("no endpoint {} {}", head.method, head.path), "unknown_endpoint"));
  }
  if (const std::string* enc = head.find("Content-Encoding"); enc && !enc->empty() && *enc != "identity") {
    return error_response(make_error(415, "invalid_request_error",
                                     "request bodies must not be compressed (Content-Encoding); send plain JSON",
                                     "unsupported_content_encoding"));
  }
  // The console's pages are the same static files for everyone, hold no data and need no
  // key: a browser may GET them by any name. What they then call is guarded as usual.
  if (route == Route::kPage) return std::nullopt;
  // Browsers are kept out of a server without keys (request_guard.h).
  GuardRequest g;
  g.method = head.method;
  g.path = head.path;
  g.host = head.find("Host");
  g.origin = head.find("Origin");
  g.content_type = head.find("Content-Type");
  if (const auto denial = guard_.check(g)) {
    record("", head.path, denial->status, nullptr, SteadyClock::now());
    return error_response(make_error(denial->status,
                                     denial->status == 415 ? "invalid_request_error" : "permission_error",
                                     denial->message, denial->code));
  }
  if (needs_key(route) || route == Route::kMetrics || route == Route::kStats) {  // any valid key, when keys are set
    try {
      authenticate(head);
    } catch (const ApiException& e) {
      record("", endpoint_name(route), e.error.status, nullptr, SteadyClock::now());
      return error_response(e.error);
    }
  }
  return std::nullopt;
}

void Routes::handle(const Scope& scope, std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& req = exchange->request();
  const Route route = route_of(req, config_.metrics, config_.console);
  switch (route) {
    case Route::kHealth: {
      HttpResponse r;
      r.body = R"({"status":"ok"})";
      exchange->respond(std::move(r));
      return;
    }
    case Route::kReady: exchange->respond(handle_ready(scope)); return;
    case Route::kMetrics: exchange->respond(handle_metrics(req)); return;
    case Route::kModels: exchange->respond(handle_models(req, scope)); return;
    case Route::kStats: exchange->respond(handle_stats(req, scope)); return;
    case Route::kPage: exchange->respond(web_asset_response(*find_web_asset(req.path), req)); return;
    case Route::kNone:
      exchange->respond(
          error_response(make_error(404, "invalid_request_error",
                                    fmt::format("no endpoint {} {}", req.method, req.path), "unknown_endpoint")));
      return;
    default: break;
  }
  boost::asio::post(workers_->pool, [this, route, scope, exchange = std::move(exchange)]() mutable {
    const HttpRequest& r = exchange->request();
    try {
      if (route == Route::kChat || route == Route::kCompletion) {
        handle_generate(route == Route::kChat ? Endpoint::kChat : Endpoint::kCompletion, r, exchange, scope);
      } else {
        exchange->respond(handle_tokenize(route == Route::kDetokenize, r, scope));
      }
    } catch (const std::exception& e) {
      LOG_ERROR("{} {}: unhandled error: {}", r.method, r.path, e.what());
      exchange->respond(error_response(internal_error()));
    }
  });
}

ApiKeyStore::Key* Routes::authenticate(const HttpRequest& req) {
  if (!keys_.enabled()) return nullptr;
  std::string presented;
  const std::string auth = req.header("Authorization");
  if (auth.rfind("Bearer ", 0) == 0)
    presented = auth.substr(7);
  else if (req.has("x-api-key"))
    presented = req.header("x-api-key");
  if (presented.empty()) {
    throw_api(make_error(401, "invalid_request_error", "no API key given; send it as 'Authorization: Bearer <key>'",
                         "missing_api_key"));
  }
  ApiKeyStore::Key* key = keys_.find(presented);
  if (!key) throw_api(make_error(401, "invalid_request_error", "the API key is not valid", "invalid_api_key"));
  return key;
}

std::shared_ptr<ModelInstance> Routes::find_model(const std::optional<std::string>& name, const Scope& listener) {
  if (listener.only_model) {
    if (!name || *name == listener.only_model->name()) return listener.only_model;
  } else if (!name) {
    if (models_.size() == 1) return models_[0];
    throw_api(bad_request("'model' is required: this server serves several models (see GET /v1/models)", "model"));
  } else {
    for (const auto& m : models_) {
      if (m->name() == *name) return m;
    }
  }
  throw_api(model_not_found(name.value_or("")));
}

void Routes::check_model_access(ApiKeyStore::Key* key, const ModelInstance& model) {
  // The same answer as for a model that does not exist: a key learns no other names.
  if (key && !ApiKeyStore::allows_model(*key, model.name())) throw_api(model_not_found(model.name()));
}

Admission Routes::admit(ApiKeyStore::Key* key, double requests, double tokens) {
  if (!key) return {};
  if (auto d = key->limiter.admit(requests, tokens)) throw_limited(*d);
  return Admission(&key->limiter, tokens);
}

std::shared_ptr<GenerationBackend> Routes::ready_backend(ModelInstance& model) {
  auto backend = model.backend();
  if (!backend) {
    ApiError e =
        make_error(503, "server_error",
                   fmt::format("the model '{}' is {}; try again later", model.name(), model_state_name(model.state())),
                   "model_not_ready");
    e.retry_after_s = model.state() == ModelState::kLoading ? 5 : 30;
    throw_api(e);
  }
  return backend;
}

void Routes::check_not_draining() {
  if (draining_) {
    ApiError e = make_error(503, "server_error", "the server is shutting down and accepts no new requests", "draining");
    e.retry_after_s = 5;
    throw_api(e);
  }
}

void Routes::record(const std::string& model, const std::string& endpoint, int status, ApiKeyStore::Key* key,
                    SteadyClock::time_point start, int64_t prompt_tokens, int64_t completion_tokens, double ttft_s,
                    double tpot_s, const std::string& finish_reason, const std::string* prompt) {
  const double e2e = seconds_between(start, SteadyClock::now());
  const std::string model_label = model.empty() ? "none" : model;
  metrics_.count_request(model_label, status);
  if (status == 200 && !model.empty()) {
    metrics_.observe_latency(model, e2e, ttft_s, tpot_s);
    metrics_.add_tokens(model, prompt_tokens, completion_tokens);
  }
  if (audit_) {
    AuditRecord r;
    r.key_id = key ? key->config.id : "";
    r.model = model;
    r.endpoint = endpoint;
    r.status = status;
    r.prompt_tokens = prompt_tokens;
    r.completion_tokens = completion_tokens;
    r.latency_ms = e2e * 1e3;
    r.ttft_ms = ttft_s < 0 ? -1 : ttft_s * 1e3;
    r.finish_reason = finish_reason;
    if (prompt && audit_->include_prompts()) r.prompt = *prompt;
    audit_->write(r);
  }
}

void Routes::handle_generate(Endpoint endpoint, const HttpRequest& req, std::shared_ptr<HttpExchange> exchange,
                             const Scope& listener) {
  const auto start = SteadyClock::now();
  const std::string endpoint_name = endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
  std::string model_name;
  ApiKeyStore::Key* key = nullptr;
  try {
    key = authenticate(req);
    check_not_draining();
    const json body = parse_json_body(req.body);
    std::optional<ChatRequest> chat;
    std::optional<CompletionRequest> completion;
    if (endpoint == Endpoint::kChat)
      chat = parse_chat_request(body, parse_limits_);
    else
      completion = parse_completion_request(body, parse_limits_);
    keep_declared_order(body, req.body, chat ? chat->options : completion->options, chat ? &chat->tools : nullptr);
    GenerationOptions& request_options = chat ? chat->options : completion->options;
    auto model = find_model(request_options.model, listener);
    model->generation_defaults().apply(request_options);  // the model's own, for what the request left out
    // An Ollama model's SYSTEM and MESSAGE turns (`shared_turns`: those every chat starts with)
    const size_t shared_turns = chat ? model->generation_defaults().apply_chat(chat->messages) : 0;
    const GenerationOptions& options = request_options;
    model_name = model->name();
    check_model_access(key, *model);
    if (key) {  // a cheap check first; the reservation follows once the cost is known
      if (auto d = key->limiter.precheck()) throw_limited(*d);
    }
    auto backend = ready_backend(*model);

    auto job = std::make_shared<Job>();
    job->endpoint = endpoint;
    job->id = random_id(endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl");
    job->created = unix_now();
    job->model = model;
    job->backend = backend;
    job->options = options;
    job->key = key;
    job->start = start;
    job->deadline = start + std::chrono::milliseconds(static_cast<int64_t>(config_.request_timeout_s * 1000));
    job->timeout_s = config_.request_timeout_s;

    // Prompts -> token ids, limits checked.
    const Tokenizer& tok = model->tokenizer();
    const ResolvedLimits& limits = model->limits();
    std::vector<std::vector<int32_t>> prompt_ids;
    std::vector<std::string> prompt_texts;
    std::vector<int32_t> boundaries;  // chat message ends (prefix-cache checkpoint hints)
    bool opens_think = false;
    if (chat) {
      std::string text = model->render_chat(*chat);
      std::string_view trimmed = text;
      while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.remove_suffix(1);
      opens_think = trimmed.ends_with("<think>");
      prompt_ids.push_back(tok.encode(text, /*add_special_tokens=*/false));
      prompt_texts.push_back(std::move(text));
      if (model->caches_state()) boundaries = model->message_boundaries(*chat, prompt_ids.back(), shared_turns);
      job->tools = chat->tools_enabled;
    } else {
      for (size_t i = 0; i < completion->prompts.size(); ++i) {
        const auto& p = completion->prompts[i];
        if (const auto* text = std::get_if<std::string>(&p)) {
          prompt_ids.push_back(tok.encode(*text, /*add_special_tokens=*/true));
          prompt_texts.push_back(*text);
        } else {
          const auto& ids = std::get<std::vector<int32_t>>(p);
          for (int32_t id : ids) {
            if (id >= tok.vocab_size()) {
              throw_api(
                  bad_request(fmt::format("token id {} is outside the vocabulary (size {})", id, tok.vocab_size()),
                              "prompt"));
            }
          }
          prompt_ids.push_back(ids);
          prompt_texts.push_back(tok.decode(ids, false));
        }
      }
    }
    int64_t requested_max = 0;
    for (size_t i = 0; i < prompt_ids.size(); ++i) {
      const int64_t n = static_cast<int64_t>(prompt_ids[i].size());
      if (n == 0) throw_api(bad_request("the prompt is empty", "prompt"));
      if (n > limits.max_input_len) {
        throw_api(
            bad_request(fmt::format("the input has {} tokens, more than max_input_len {} of model '{}'; shorten it", n,
                                    limits.max_input_len, model->name()),
                        chat ? "messages" : "prompt", "context_length_exceeded"));
      }
      if (options.max_tokens) {
        if (*options.max_tokens > limits.max_output_len) {
          throw_api(bad_request(fmt::format("max_tokens {} is more than max_output_len {} of model '{}'",
                                            *options.max_tokens, limits.max_output_len, model->name()),
                                "max_tokens"));
        }
        if (n + *options.max_tokens > limits.max_context) {
          throw_api(bad_request(
              fmt::format("the input ({} tokens) plus max_tokens ({}) is more than the context length {} of "
                          "model '{}'; lower max_tokens or shorten the input",
                          n, *options.max_tokens, limits.max_context, model->name()),
              "max_tokens", "context_length_exceeded"));
        }
      } else if (n >= limits.max_context) {
        throw_api(
            bad_request(fmt::format("the input has {} tokens and leaves no room for output in the context length {} of "
                                    "model '{}'",
                                    n, limits.max_context, model->name()),
                        chat ? "messages" : "prompt", "context_length_exceeded"));
      }
      job->prompt_tokens_total += n;  // once per prompt, whatever n (as OpenAI counts)
      requested_max = std::max(requested_max, n);
    }
    std::vector<int64_t> prompt_lengths;
    for (const auto& ids : prompt_ids) prompt_lengths.push_back(static_cast<int64_t>(ids.size()));
    check_prompt_scoring_size({options.n, options.prompt_logprobs,
                               completion && completion->echo && options.logprobs ? options.top_logprobs : -1},
                              prompt_lengths);
    job->prompt_tokens = static_cast<int32_t>(requested_max);
    job->prompt_text = prompt_texts.size() == 1 ? prompt_texts[0] : json(prompt_texts).dump();

    const EngineStats stats = backend->stats();
    if (stats.waiting >= limits.max_queue) {
      ApiError e = make_error(429, "rate_limit_error",
                              fmt::format("model '{}' has {} requests waiting, its queue limit; retry shortly",
                                          model->name(), stats.waiting),
                              "queue_full");
      e.retry_after_s = 1;
      throw_api(e);
    }

    // Choices: each prompt n times, in prompt order (OpenAI's index order).
    OutputRouter::Options router_options;
    router_options.parse_reasoning = chat && model->emits_reasoning();
    router_options.start_in_reasoning = router_options.parse_reasoning && opens_think;
    router_options.parse_tool_calls = job->tools;
    const ConstraintRequest constraint = constraint_for(*model, chat ? &*chat : nullptr, options, opens_think);
    const uint64_t base_seed = options.seed ? static_cast<uint64_t>(*options.seed) : 0;
    std::vector<Request> requests;
    for (size_t p = 0; p < prompt_ids.size(); ++p) {
      const size_t first_of_prompt = job->choices.size();
      for (int k = 0; k < options.n; ++k) {
        auto c = std::make_unique<Choice>(tok, options.stop, router_options);
        c->index = static_cast<int>(job->choices.size());
        if (completion && completion->echo) c->prefix_text = prompt_texts[p];
        c->first_prompt_token = prompt_ids[p][0];
        c->echo_scored = completion && completion->echo && options.logprobs;
        Request r;
        r.prompt_ids = prompt_ids[p];
        r.sampling = sampling_of(options);
        r.sampling.seed = options.seed ? base_seed + static_cast<uint64_t>(c->index) : random_seed();
        r.sampling.vocab_limit = tok.vocab_size();  // never an id the decoder cannot turn into text
        r.sampling.logit_bias = options.logit_bias;
        r.constraint = constraint;
        const int64_t room = limits.max_context - static_cast<int64_t>(r.prompt_ids.size());
        r.max_tokens = static_cast<int32_t>(options.max_tokens ? *options.max_tokens
                                                               : std::min<int64_t>(limits.max_output_len, room));
        r.ignore_eos = options.ignore_eos;
        r.cache_salt = prefix_cache_salt(options, key, config_.shared_prefix_cache);
        r.checkpoint_positions = boundaries;
        r.logprobs = options.logprobs;
        r.top_logprobs = options.top_logprobs;
        r.prompt_logprobs = std::max(options.prompt_logprobs, c->echo_scored ? options.top_logprobs : -1);
        if (k > 0 && r.prompt_logprobs >= 0) {  // scored once per prompt
          c->prompt_scorer = job->choices[first_of_prompt].get();
          r.prompt_logprobs = -1;
        }
        if (!options.ignore_eos) r.stop_token_ids = model->extra_stop_ids();
        requests.push_back(std::move(r));
        job->choices.push_back(std::move(c));
      }
    }

    // One request per choice; tokens: every prompt plus each choice's max_tokens.
    double reserve = static_cast<double>(job->prompt_tokens_total);
    for (const Request& r : requests) reserve += r.max_tokens;
    job->admission = admit(key, static_cast<double>(requests.size()), reserve);

    in_flight_.fetch_add(1);
    job->on_finish = [this, job_raw = job.get(), model_name, endpoint_name, key, start] {
      Job& j = *job_raw;
      std::string finish;
      for (const auto& c : j.choices) {
        if (!c->finish_reason.empty()) finish = c->finish_reason;
      }
      const double ttft = j.first_token ? seconds_between(start, *j.first_token) : -1;
      const double tpot = (j.first_token && j.tokens_seen > 1)
                              ? seconds_between(*j.first_token, j.last_token) / static_cast<double>(j.tokens_seen - 1)
                              : -1;
      j.admission.set_used(static_cast<double>(j.prompt_tokens_total + j.completion_tokens()));
      j.admission.settle();  // refunds the unused reservation, frees the key's slot
      record(model_name, endpoint_name, j.status, key, start, j.prompt_tokens_total, j.completion_tokens(), ttft, tpot,
             finish, &j.prompt_text);
      {
        std::lock_guard lock(jobs_mutex_);
        jobs_.erase(job_raw);
      }
      leave_in_flight();
    };

    for (size_t i = 0; i < requests.size(); ++i) {
      Choice& c = *job->choices[i];
      try {
        c.id = backend->submit(std::move(requests[i]), job->callback(c.index));
        c.submitted = true;
      } catch (const Error& e) {
        // Recorded once, by the caller's error path: the job only gives back its slot.
        job->on_finish = [this] { leave_in_flight(); };
        job->admission.set_used(0);
        job->finish();
        throw_api(bad_request(e.what()));
      }
    }
    {
      std::lock_guard lock(jobs_mutex_);
      jobs_[job.get()] = job;
    }
    job->run(*transport_, transport_->make_serial(), std::move(exchange));
  } catch (const ApiException& e) {
    exchange->respond(error_response(e.error));
    record(model_name, endpoint_name, e.error.status, key, start);
  } catch (const std::exception& e) {
    LOG_ERROR("{}: internal error: {}", endpoint_name, e.what());
    exchange->respond(error_response(internal_error()));
    record(model_name, endpoint_name, 500, key, start);
  }
}

HttpResponse Routes::handle_models(const HttpRequest& req, const Scope& listener) {
  const auto start = SteadyClock::now();
  try {
    ApiKeyStore::Key* key = authenticate(req);
    json data = json::array();
    for (const auto& m : models_) {
      if (listener.only_model && listener.only_model != m) continue;
      if (key && !ApiKeyStore::allows_model(*key, m->name())) continue;
      data.push_back({{"id", m->name()},
                      {"object", "model"},
                      {"created", m->created_unix()},
                      {"owned_by", "infera"},
                      {"state", model_state_name(m->state())},
                      {"max_model_len", m->limits().max_context}});
    }
    return json_response(json{{"object", "list"}, {"data", std::move(data)}});
  } catch (const ApiException& e) {
    record("", "/v1/models", e.error.status, nullptr, start);
    return error_response(e.error);
  }
}

HttpResponse Routes::handle_tokenize(bool detokenize, const HttpRequest& req, const Scope& listener) {
  const auto start = SteadyClock::now();
  const std::string endpoint = detokenize ? "/detokenize" : "/tokenize";
  ApiKeyStore::Key* key = nullptr;
  try {
    key = authenticate(req);
    const json body = parse_json_body(req.body);
    if (detokenize) {
      const DetokenizeRequest r = parse_detokenize_request(body);
      auto model = find_model(r.model, listener);
      check_model_access(key, *model);
      Admission admission = admit(key, 1, static_cast<double>(r.tokens.size()));
      for (int32_t id : r.tokens) {
        if (id >= model->tokenizer().vocab_size())
          throw_api(bad_request(fmt::format("token id {} is outside the vocabulary (size {})", id,
                                            model->tokenizer().vocab_size()),
                                "tokens"));
      }
      return json_response(json{{"prompt", model->tokenizer().decode(r.tokens, false)}});
    }
    const TokenizeRequest r = parse_tokenize_request(body);
    auto model = find_model(r.model, listener);
    check_model_access(key, *model);
    // At most one token per byte, plus the special tokens; the count is charged.
    Admission admission = admit(key, 1, static_cast<double>(r.text.size() + 8));
    const auto ids = model->tokenizer().encode(r.text, r.add_special_tokens);
    admission.set_used(static_cast<double>(ids.size()));
    return json_response(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model->limits().max_context}});
  } catch (const ApiException& e) {
    record("", endpoint, e.error.status, key, start);
    return error_response(e.error);
  } catch (const Error& e) {  // e.g. invalid UTF-8 handed to the tokenizer
    record("", endpoint, 400, key, start);
    return error_response(bad_request(e.what()));
  }
}

HttpResponse Routes::handle_ready(const Scope& listener) {
  json list = json::array();
  bool all_ready = true;
  for (const auto& m : models_) {
    if (listener.only_model && listener.only_model != m) continue;
    m->backend();  // notices an engine that died
    const ModelState s = m->state();
    all_ready &= s == ModelState::kReady;
    list.push_back({{"name", m->name()}, {"state", model_state_name(s)}});
  }
  const bool draining = draining_;
  const bool ok = all_ready && !draining;
  return json_response(json{{"status", draining ? "draining" : (ok ? "ready" : "not_ready")},
                            {"models", std::move(list)}},
                       ok ? 200 : 503);
}

HttpResponse Routes::handle_stats(const HttpRequest& req, const Scope& listener) {
  ApiKeyStore::Key* key = nullptr;
  try {
    key = authenticate(req);  // any valid key, when keys are configured (also checked before the body)
  } catch (const ApiException& e) {
    return error_response(e.error);
  }
  // The models the caller may see, as /v1/models lists them.
  std::vector<std::shared_ptr<ModelInstance>> visible;
  for (const auto& m : models_) {
    if (listener.only_model && listener.only_model != m) continue;
    if (key && !ApiKeyStore::allows_model(*key, m->name())) continue;
    visible.push_back(m);
  }
  HttpResponse r = json_response(console_stats_.render(visible, metrics_, draining_, in_flight_));
  r.headers.push_back({"Cache-Control", "no-store"});
  return r;
}

HttpResponse Routes::handle_metrics(const HttpRequest& req) {
  try {
    authenticate(req);  // any valid key, when keys are configured (also checked before the body)
  } catch (const ApiException& e) {
    return error_response(e.error);
  }
  std::vector<ModelGauges> gauges;
  for (const auto& m : models_) {
    ModelGauges g;
    g.name = m->name();
    auto backend = m->backend();
    g.state = model_state_name(m->state());
    g.load_fraction = m->load_progress().fraction;
    if (backend) {
      g.has_stats = true;
      g.stats = backend->stats();
    }
    gauges.push_back(std::move(g));
  }
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_.render(gauges);
  return r;
}

}  // namespace infera::server
