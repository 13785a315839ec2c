#include "infera/server/http_server.h"

#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <variant>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/log.h"
#include "infera/server/audit_log.h"
#include "infera/server/auth.h"
#include "infera/server/logprobs_json.h"
#include "infera/server/metrics.h"
#include "infera/server/openai_api.h"
#include "infera/chat/text_stream.h"

namespace infera::server {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

namespace {

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

ApiError make_error(int status, std::string type, std::string message, std::optional<std::string> code = std::nullopt,
                    std::optional<std::string> param = std::nullopt) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

ApiError internal_error() {
  return make_error(500, "server_error", "the server hit an internal error while handling the request; it has been logged");
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  res.set_content(error_to_json(e).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// Events of all choices of one HTTP request, from the engine thread to the HTTP worker.
class EventQueue {
 public:
  void push(int choice, const Event& e) {
    {
      std::lock_guard lock(mutex_);
      events_.emplace_back(choice, e);
    }
    cv_.notify_one();
  }
  // False when `deadline` passed first.
  bool pop(std::pair<int, Event>& out, SteadyClock::time_point deadline) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_until(lock, deadline, [&] { return !events_.empty(); })) return false;
    out = std::move(events_.front());
    events_.pop_front();
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<int, Event>> events_;
};

enum class Endpoint { kChat, kCompletion };

}  // namespace

// One choice's text pipeline: tokens -> UTF-8 text -> stop strings -> reasoning / tool calls.
struct Choice {
  Choice(const Tokenizer& tok, std::vector<std::string> stops, OutputRouter::Options router_options)
      : decoder(tok), stop(std::move(stops)), router(router_options) {}
  int index = 0;
  RequestId id = 0;
  bool submitted = false;
  bool done = false;
  FinishReason engine_finish = FinishReason::kNone;
  std::string finish_reason;  // as sent to the client
  std::string engine_error;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  IncrementalDecoder decoder;
  StopMatcher stop;
  OutputRouter router;
  std::string prefix_text;  // echo: the prompt text, sent before the completion
  // Prompt scoring (echo with logprobs, or `prompt_logprobs`): the prompt's first token
  // (nothing scores it) and the engine's log-probabilities of the others (Event::prompt_logprobs).
  bool echo_scored = false;  // completions with echo and logprobs: the legacy object starts with the prompt
  int32_t first_prompt_token = -1;
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  // Log-probabilities of the tokens taken so far (requests with logprobs): every token
  // up to the one that completed a stop string.
  std::vector<TokenLogprobs> logprobs;
  size_t logprobs_sent = 0;  // streaming: how many went out in earlier chunks
  int64_t text_offset = 0;   // completions: code points of the choice's text before the next chunk's tokens
  // Accumulated output (non-streaming responses).
  std::string content;
  std::string reasoning;
  bool role_sent = false;
};

// A generation in progress (all choices of one HTTP request). Shared by the handler and,
// for streams, the chunked content provider that outlives the handler.
struct Job {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;
  int64_t created = 0;
  std::shared_ptr<ModelInstance> model;
  std::shared_ptr<GenerationBackend> backend;
  std::shared_ptr<EventQueue> queue = std::make_shared<EventQueue>();
  std::vector<std::unique_ptr<Choice>> choices;
  GenerationOptions options;
  bool tools = false;
  int32_t prompt_tokens = 0;  // of one prompt (all choices of a chat share it)
  int64_t prompt_tokens_total = 0;
  std::string prompt_text;  // for the audit log
  ApiKeyStore::Key* key = nullptr;
  SteadyClock::time_point start;
  SteadyClock::time_point deadline;
  std::optional<SteadyClock::time_point> first_token;
  SteadyClock::time_point last_token;
  int64_t tokens_seen = 0;
  std::function<void()> on_finish;  // metrics, audit, in-flight count; run once
  int status = 200;
  bool finished = false;

  ~Job() { finish(); }

  void finish() {
    if (finished) return;
    finished = true;
    cancel_all();
    if (on_finish) on_finish();
  }

  void cancel_all() {
    for (auto& c : choices) {
      if (c->submitted && !c->done) backend->cancel(c->id);
    }
  }

  bool all_done() const {
    for (const auto& c : choices) {
      if (!c->done) return false;
    }
    return true;
  }

  int64_t completion_tokens() const {
    int64_t n = 0;
    for (const auto& c : choices) n += c->completion_tokens;
    return n;
  }

  int64_t cached_tokens() const {
    int64_t n = 0;
    for (const auto& c : choices) n = std::max<int64_t>(n, c->cached_tokens);
    return n;
  }
};

namespace {

// Applies one engine event to its choice; returns the text that became visible.
OutputDelta apply_event(Job& job, Choice& c, const Event& e) {
  OutputDelta out;
  if (c.done) return out;
  if (e.prompt_logprobs) c.prompt_logprobs = *e.prompt_logprobs;
  auto route = [&](const std::string& text) {
    if (text.empty()) return;
    OutputDelta d = c.router.feed(text);
    out.reasoning += d.reasoning;
    out.content += d.content;
  };
  if (!e.is_final()) {
    ++c.completion_tokens;
    const auto now = SteadyClock::now();
    if (!job.first_token) job.first_token = now;
    job.last_token = now;
    ++job.tokens_seen;
    if (c.stop.stopped()) return out;  // tokens in flight after a stop string was seen
    if (e.logprobs) c.logprobs.push_back(*e.logprobs);
    route(c.stop.feed(c.decoder.push(e.token)));
    if (c.stop.stopped()) job.backend->cancel(c.id);
    return out;
  }
  c.done = true;
  c.engine_finish = e.finish;
  c.engine_error = e.error;
  if (e.usage.completion_tokens > 0 || e.usage.prompt_tokens > 0) c.completion_tokens = e.usage.completion_tokens;
  c.cached_tokens = e.usage.cached_tokens;
  if (c.stop.stopped()) {
    c.finish_reason = "stop";
  } else {
    if (e.finish != FinishReason::kError) {
      std::string rest = c.stop.feed(c.decoder.flush());
      rest += c.stop.flush();
      route(rest);
    }
    c.finish_reason = e.finish == FinishReason::kLength ? "length" : "stop";
  }
  OutputDelta tail = c.router.finish();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  if (!c.router.tool_calls().empty()) c.finish_reason = "tool_calls";
  return out;
}

json usage_json(const Job& job) {
  const int64_t completion = job.completion_tokens();
  json u = {{"prompt_tokens", job.prompt_tokens_total},
            {"completion_tokens", completion},
            {"total_tokens", job.prompt_tokens_total + completion}};
  u["prompt_tokens_details"] = {{"cached_tokens", job.cached_tokens()}};
  return u;
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json arr = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id}, {"type", "function"}, {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    arr.push_back(std::move(c));
  }
  return arr;
}

// The echoed prompt's entries of the legacy completions object, with the request's
// `logprobs` alternatives (the engine may have kept more for `prompt_logprobs`).
json echoed_prompt_logprobs(const Job& job, const Choice& c, int64_t& offset) {
  if (!c.prompt_logprobs) return nullptr;
  std::vector<TokenLogprobs> entries = *c.prompt_logprobs;
  for (TokenLogprobs& e : entries) {
    if (static_cast<int32_t>(e.top.size()) > job.options.top_logprobs) e.top.resize(job.options.top_logprobs);
  }
  return completion_prompt_logprobs(job.model->tokenizer(), c.first_prompt_token, entries, offset);
}

// vLLM's `prompt_logprobs` of a choice (null when the engine sent none: a failed request).
json vllm_prompt_json(const Job& job, const Choice& c) {
  if (!c.prompt_logprobs) return nullptr;
  return vllm_prompt_logprobs(job.model->tokenizer(), *c.prompt_logprobs, job.options.prompt_logprobs);
}

json final_response(const Job& job) {
  json choices = json::array();
  for (const auto& c : job.choices) {
    if (job.endpoint == Endpoint::kChat) {
      json message = {{"role", "assistant"}};
      const auto& calls = c->router.tool_calls();
      message["content"] = (c->content.empty() && !calls.empty()) ? json(nullptr) : json(c->content);
      if (!c->reasoning.empty()) message["reasoning_content"] = c->reasoning;
      if (!calls.empty()) message["tool_calls"] = tool_calls_json(calls, false);
      const json logprobs = job.options.logprobs ? chat_logprobs(job.model->tokenizer(), c->logprobs) : json(nullptr);
      choices.push_back({{"index", c->index}, {"message", message}, {"logprobs", logprobs}, {"finish_reason", c->finish_reason}});
    } else {
      json logprobs = nullptr;
      if (job.options.logprobs) {
        // One running text offset over the token strings: the prompt's (echo), then the completion's.
        int64_t offset = 0;
        if (c->echo_scored) logprobs = echoed_prompt_logprobs(job, *c, offset);
        append_completion_logprobs(logprobs, completion_logprobs(job.model->tokenizer(), c->logprobs, offset));
      }
      json choice = {{"index", c->index},
                     {"text", c->prefix_text + c->content},
                     {"logprobs", logprobs},
                     {"finish_reason", c->finish_reason}};
      if (job.options.prompt_logprobs >= 0) choice["prompt_logprobs"] = vllm_prompt_json(job, *c);
      choices.push_back(std::move(choice));
    }
  }
  json out = {{"id", job.id},
              {"object", job.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
              {"created", job.created},
              {"model", job.model->name()},
              {"choices", std::move(choices)},
              {"usage", usage_json(job)}};
  // Chat: one prompt for every choice, so one list beside them (as vLLM).
  if (job.endpoint == Endpoint::kChat && job.options.prompt_logprobs >= 0) out["prompt_logprobs"] = vllm_prompt_json(job, *job.choices[0]);
  return out;
}

json chunk(const Job& job, json choices) {
  json j = {{"id", job.id},
            {"object", job.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", job.created},
            {"model", job.model->name()},
            {"choices", std::move(choices)}};
  if (job.options.include_usage) j["usage"] = nullptr;
  return j;
}

// Streaming: the log-probabilities of the choice's tokens not yet sent (null when the
// request did not ask), marked sent. They ride on the next chunk that goes out, so a
// token whose text is held back (a possible stop string) comes with the text it released.
json unsent_logprobs(const Job& job, Choice& c) {
  if (!job.options.logprobs) return nullptr;
  const std::span<const TokenLogprobs> tokens(c.logprobs.data() + c.logprobs_sent, c.logprobs.size() - c.logprobs_sent);
  c.logprobs_sent = c.logprobs.size();
  if (job.endpoint == Endpoint::kChat) return chat_logprobs(job.model->tokenizer(), tokens);
  return completion_logprobs(job.model->tokenizer(), tokens, c.text_offset);
}

// The SSE chunks one event produces for its choice.
void stream_chunks(const Job& job, Choice& c, const OutputDelta& d, bool finished, std::string& out) {
  if (job.endpoint == Endpoint::kChat) {
    if (!c.role_sent) {
      c.role_sent = true;
      json first = chunk(job, json::array({{{"index", c.index},
                                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                                            {"logprobs", nullptr},
                                            {"finish_reason", nullptr}}}));
      if (job.options.prompt_logprobs >= 0) first["prompt_logprobs"] = vllm_prompt_json(job, c);
      out += sse(first);
    }
    if (!d.empty()) {
      json delta = json::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      if (!d.content.empty()) delta["content"] = d.content;
      out += sse(chunk(job, json::array({{{"index", c.index}, {"delta", delta}, {"logprobs", unsent_logprobs(job, c)}, {"finish_reason", nullptr}}})));
    }
    if (finished) {
      if (!c.router.tool_calls().empty()) {
        out += sse(chunk(job, json::array({{{"index", c.index},
                                            {"delta", {{"tool_calls", tool_calls_json(c.router.tool_calls(), true)}}},
                                            {"logprobs", unsent_logprobs(job, c)},
                                            {"finish_reason", nullptr}}})));
      }
      // Tokens whose text never showed (held back, then dropped at a stop string) still
      // have their log-probabilities reported, with the last chunk.
      const bool pending = c.logprobs_sent < c.logprobs.size();
      out += sse(chunk(job, json::array({{{"index", c.index},
                                          {"delta", json::object()},
                                          {"logprobs", pending ? unsent_logprobs(job, c) : json(nullptr)},
                                          {"finish_reason", c.finish_reason}}})));
    }
  } else {
    const bool first = !c.role_sent;
    const std::string text = first ? c.prefix_text + d.content : d.content;  // echo goes first
    if (!text.empty() || finished) {
      json logprobs = nullptr;
      if (first) {  // the first chunk written carries the echoed prompt's log-probabilities
        c.role_sent = true;
        if (c.echo_scored) logprobs = echoed_prompt_logprobs(job, c, c.text_offset);
      }
      if (job.options.logprobs) append_completion_logprobs(logprobs, unsent_logprobs(job, c));
      json choice = {{"index", c.index},
                     {"text", text},
                     {"logprobs", logprobs},
                     {"finish_reason", finished ? json(c.finish_reason) : json(nullptr)}};
      if (first && job.options.prompt_logprobs >= 0) choice["prompt_logprobs"] = vllm_prompt_json(job, c);
      out += sse(chunk(job, json::array({std::move(choice)})));
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
struct HttpServer::Impl {
  ServerConfig config;
  std::vector<std::shared_ptr<ModelInstance>> models;
  ApiKeyStore keys;
  Metrics metrics;
  std::unique_ptr<AuditLog> audit;
  ParseLimits parse_limits;

  struct Listener {
    std::unique_ptr<httplib::Server> server;
    std::shared_ptr<ModelInstance> only_model;  // a model's own port serves only that model
    int port = 0;
  };
  std::vector<Listener> listeners;
  std::vector<std::thread> threads;
  std::thread background;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};
  std::mutex drain_mutex;
  std::condition_variable drain_cv;

  Impl(ServerConfig c, std::vector<std::shared_ptr<ModelInstance>> m)
      : config(std::move(c)), models(std::move(m)), keys(config.api_keys) {
    if (!config.audit_log_path.empty()) audit = std::make_unique<AuditLog>(config.audit_log_path, config.audit_log_prompts);
  }

  // --- helpers ---------------------------------------------------------------------------
  ApiKeyStore::Key* authenticate(const httplib::Request& req) {
    if (!keys.enabled()) return nullptr;
    std::string presented;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) presented = auth.substr(7);
    else if (req.has_header("x-api-key")) presented = req.get_header_value("x-api-key");
    if (presented.empty()) {
      throw_api(make_error(401, "invalid_request_error",
                           "no API key given; send it as 'Authorization: Bearer <key>'", "missing_api_key"));
    }
    ApiKeyStore::Key* key = keys.find(presented);
    if (!key) throw_api(make_error(401, "invalid_request_error", "the API key is not valid", "invalid_api_key"));
    return key;
  }

  std::shared_ptr<ModelInstance> find_model(const std::optional<std::string>& name, const Listener& listener) {
    if (listener.only_model) {
      if (!name || *name == listener.only_model->name()) return listener.only_model;
    } else if (!name) {
      if (models.size() == 1) return models[0];
      throw_api(bad_request("'model' is required: this server serves several models (see GET /v1/models)", "model"));
    } else {
      for (const auto& m : models) {
        if (m->name() == *name) return m;
      }
    }
    throw_api(make_error(404, "invalid_request_error",
                         fmt::format("the model '{}' does not exist here; GET /v1/models lists the served models", name.value_or("")),
                         "model_not_found", "model"));
  }

  void check_model_access(ApiKeyStore::Key* key, const ModelInstance& model) {
    if (key && !ApiKeyStore::allows_model(*key, model.name())) {
      throw_api(make_error(403, "permission_error",
                           fmt::format("this API key may not use the model '{}'", model.name()), "model_not_allowed", "model"));
    }
  }

  std::shared_ptr<GenerationBackend> ready_backend(ModelInstance& model) {
    auto backend = model.backend();
    if (!backend) {
      ApiError e = make_error(503, "server_error",
                              fmt::format("the model '{}' is {}; try again later", model.name(), model_state_name(model.state())),
                              "model_not_ready");
      e.retry_after_s = model.state() == ModelState::kLoading ? 5 : 30;
      throw_api(e);
    }
    return backend;
  }

  void check_not_draining() {
    if (draining) {
      ApiError e = make_error(503, "server_error", "the server is shutting down and accepts no new requests", "draining");
      e.retry_after_s = 5;
      throw_api(e);
    }
  }

  void record(const std::string& model, const std::string& endpoint, int status, ApiKeyStore::Key* key,
              SteadyClock::time_point start, int64_t prompt_tokens = 0, int64_t completion_tokens = 0, double ttft_s = -1,
              double tpot_s = -1, const std::string& finish_reason = {}, const std::string* prompt = nullptr) {
    const double e2e = seconds_between(start, SteadyClock::now());
    const std::string model_label = model.empty() ? "none" : model;
    metrics.count_request(model_label, status);
    if (status == 200 && !model.empty()) {
      metrics.observe_latency(model, e2e, ttft_s, tpot_s);
      metrics.add_tokens(model, prompt_tokens, completion_tokens);
    }
    if (key && (prompt_tokens + completion_tokens) > 0) keys.charge_tokens(*key, prompt_tokens + completion_tokens);
    if (audit) {
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
      if (prompt && audit->include_prompts()) r.prompt = *prompt;
      audit->write(r);
    }
  }

  // --- generation ------------------------------------------------------------------------
  void handle_generate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res, const Listener& listener) {
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
      if (endpoint == Endpoint::kChat) chat = parse_chat_request(body, parse_limits);
      else completion = parse_completion_request(body, parse_limits);
      const GenerationOptions& options = chat ? chat->options : completion->options;
      auto model = find_model(options.model, listener);
      model_name = model->name();
      check_model_access(key, *model);
      if (key) {
        double retry = 0;
        if (!keys.admit(*key, &retry)) {
          ApiError e = make_error(429, "rate_limit_error",
                                  fmt::format("rate limit of API key '{}' reached; retry in {:.0f} s", key->config.id, std::ceil(retry)),
                                  "rate_limit_exceeded");
          e.retry_after_s = std::max(1, static_cast<int>(std::ceil(retry)));
          throw_api(e);
        }
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
      job->deadline = start + std::chrono::milliseconds(static_cast<int64_t>(config.request_timeout_s * 1000));

      // Prompts -> token ids, limits checked.
      const Tokenizer& tok = model->tokenizer();
      const ResolvedLimits& limits = model->limits();
      std::vector<std::vector<int32_t>> prompt_ids;
      std::vector<std::string> prompt_texts;
      bool opens_think = false;
      if (chat) {
        std::string text = model->render_chat(*chat);
        std::string_view trimmed = text;
        while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.remove_suffix(1);
        opens_think = trimmed.ends_with("<think>");
        prompt_ids.push_back(tok.encode(text, /*add_special_tokens=*/false));
        prompt_texts.push_back(std::move(text));
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
                throw_api(bad_request(fmt::format("token id {} is outside the vocabulary (size {})", id, tok.vocab_size()), "prompt"));
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
          throw_api(bad_request(fmt::format("the input has {} tokens, more than max_input_len {} of model '{}'; shorten it",
                                            n, limits.max_input_len, model->name()),
                                chat ? "messages" : "prompt", "context_length_exceeded"));
        }
        if (options.max_tokens) {
          if (*options.max_tokens > limits.max_output_len) {
            throw_api(bad_request(fmt::format("max_tokens {} is more than max_output_len {} of model '{}'", *options.max_tokens,
                                              limits.max_output_len, model->name()),
                                  "max_tokens"));
          }
          if (n + *options.max_tokens > limits.max_context) {
            throw_api(bad_request(fmt::format("the input ({} tokens) plus max_tokens ({}) is more than the context length {} of "
                                              "model '{}'; lower max_tokens or shorten the input",
                                              n, *options.max_tokens, limits.max_context, model->name()),
                                  "max_tokens", "context_length_exceeded"));
          }
        } else if (n >= limits.max_context) {
          throw_api(bad_request(fmt::format("the input has {} tokens and leaves no room for output in the context length {} of "
                                            "model '{}'",
                                            n, limits.max_context, model->name()),
                                chat ? "messages" : "prompt", "context_length_exceeded"));
        }
        job->prompt_tokens_total += n;  // once per prompt, whatever n (as OpenAI counts)
        requested_max = std::max(requested_max, n);
      }
      job->prompt_tokens = static_cast<int32_t>(requested_max);
      job->prompt_text = prompt_texts.size() == 1 ? prompt_texts[0] : json(prompt_texts).dump();

      const EngineStats stats = backend->stats();
      if (stats.waiting >= limits.max_queue) {
        ApiError e = make_error(429, "rate_limit_error",
                                fmt::format("model '{}' has {} requests waiting, its queue limit; retry shortly", model->name(), stats.waiting),
                                "queue_full");
        e.retry_after_s = 1;
        throw_api(e);
      }

      // Choices: each prompt n times, in prompt order (OpenAI's index order).
      OutputRouter::Options router_options;
      router_options.parse_reasoning = chat && model->emits_reasoning();
      router_options.start_in_reasoning = router_options.parse_reasoning && opens_think;
      router_options.parse_tool_calls = job->tools;
      const uint64_t base_seed = options.seed ? static_cast<uint64_t>(*options.seed) : 0;
      std::vector<Request> requests;
      for (size_t p = 0; p < prompt_ids.size(); ++p) {
        for (int k = 0; k < options.n; ++k) {
          auto c = std::make_unique<Choice>(tok, options.stop, router_options);
          c->index = static_cast<int>(job->choices.size());
          if (completion && completion->echo) c->prefix_text = prompt_texts[p];
          c->first_prompt_token = prompt_ids[p][0];
          c->echo_scored = completion && completion->echo && options.logprobs;
          Request r;
          r.prompt_ids = prompt_ids[p];
          r.sampling.temperature = options.temperature;
          r.sampling.top_p = options.top_p;
          r.sampling.top_k = options.top_k;
          r.sampling.min_p = options.min_p;
          r.sampling.presence_penalty = options.presence_penalty;
          r.sampling.frequency_penalty = options.frequency_penalty;
          r.sampling.repetition_penalty = options.repetition_penalty;
          r.sampling.seed = options.seed ? base_seed + static_cast<uint64_t>(c->index) : random_seed();
          const int64_t room = limits.max_context - static_cast<int64_t>(r.prompt_ids.size());
          r.max_tokens = static_cast<int32_t>(options.max_tokens ? *options.max_tokens : std::min<int64_t>(limits.max_output_len, room));
          r.ignore_eos = options.ignore_eos;
          r.logprobs = options.logprobs;
          r.top_logprobs = options.top_logprobs;
          r.prompt_logprobs = std::max(options.prompt_logprobs, c->echo_scored ? options.top_logprobs : -1);
          if (!options.ignore_eos) r.stop_token_ids = model->extra_stop_ids();
          requests.push_back(std::move(r));
          job->choices.push_back(std::move(c));
        }
      }

      in_flight.fetch_add(1);
      const bool stream = options.stream;
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
        record(model_name, endpoint_name, j.status, key, start, j.prompt_tokens_total, j.completion_tokens(), ttft, tpot,
               finish, &j.prompt_text);
        if (in_flight.fetch_sub(1) == 1) drain_cv.notify_all();
      };

      for (size_t i = 0; i < requests.size(); ++i) {
        Choice& c = *job->choices[i];
        auto queue = job->queue;  // the callback may outlive the job (a cancelled stream)
        const int index = c.index;
        try {
          c.id = backend->submit(std::move(requests[i]), [queue, index](const Event& e) { queue->push(index, e); });
          c.submitted = true;
        } catch (const Error& e) {
          // Recorded once, by the caller's error path: the job only gives back its slot.
          job->on_finish = [this] {
            if (in_flight.fetch_sub(1) == 1) drain_cv.notify_all();
          };
          job->finish();
          throw_api(bad_request(e.what()));
        }
      }

      if (stream) {
        start_stream(job, res);
        return;
      }
      run_to_completion(*job);
      if (job->status != 200) {
        send_error(res, job->status == 504 ? make_error(504, "timeout_error",
                                                        fmt::format("the request did not finish within {} s", config.request_timeout_s),
                                                        "request_timeout")
                                           : internal_error());
      } else {
        res.status = 200;
        res.set_content(final_response(*job).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
      }
      job->finish();
    } catch (const ApiException& e) {
      send_error(res, e.error);
      record(model_name, endpoint_name, e.error.status, key, start);
    } catch (const std::exception& e) {
      LOG_ERROR("{}: internal error: {}", endpoint_name, e.what());
      send_error(res, internal_error());
      record(model_name, endpoint_name, 500, key, start);
    }
  }

  // Non-streaming: waits for every choice (or the deadline).
  void run_to_completion(Job& job) {
    std::pair<int, Event> item;
    while (!job.all_done()) {
      if (!job.queue->pop(item, job.deadline)) {
        job.status = 504;
        return;
      }
      Choice& c = *job.choices[item.first];
      OutputDelta d = apply_event(job, c, item.second);
      c.reasoning += d.reasoning;
      c.content += d.content;
      if (c.done && c.engine_finish == FinishReason::kError) {
        LOG_ERROR("model '{}': generation failed: {}", job.model->name(), c.engine_error);
        job.status = 500;
      }
    }
  }

  void start_stream(std::shared_ptr<Job> job, httplib::Response& res) {
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job](size_t /*offset*/, httplib::DataSink& sink) {
          stream_all(*job, sink);
          return false;  // everything is written (or the client is gone)
        },
        [job](bool /*success*/) { job->finish(); });
  }

  void stream_all(Job& job, httplib::DataSink& sink) {
    auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
    std::pair<int, Event> item;
    // Wake up now and then even without tokens, to notice a client that went away
    // during a long prefill (writing an SSE comment fails once the peer is gone).
    const auto heartbeat = std::chrono::seconds(2);
    while (!job.all_done()) {
      const auto wake = std::min(job.deadline, SteadyClock::now() + heartbeat);
      if (!job.queue->pop(item, wake)) {
        if (SteadyClock::now() >= job.deadline) {
          job.status = 504;
          ApiError e = make_error(504, "timeout_error", fmt::format("the request did not finish within {} s", config.request_timeout_s),
                                  "request_timeout");
          write(sse(error_to_json(e)));
          write("data: [DONE]\n\n");
          job.cancel_all();
          sink.done();
          return;
        }
        if (!write(": keep-alive\n\n")) {
          job.status = 499;  // client closed the connection (nginx's convention)
          job.cancel_all();
          return;
        }
        continue;
      }
      Choice& c = *job.choices[item.first];
      OutputDelta d = apply_event(job, c, item.second);
      if (c.done && c.engine_finish == FinishReason::kError) {
        LOG_ERROR("model '{}': generation failed: {}", job.model->name(), c.engine_error);
        job.status = 500;
        write(sse(error_to_json(internal_error())));
        write("data: [DONE]\n\n");
        job.cancel_all();
        sink.done();
        return;
      }
      std::string out;
      stream_chunks(job, c, d, c.done, out);
      if (!write(out)) {
        job.status = 499;
        job.cancel_all();  // frees the KV blocks of every choice
        return;
      }
    }
    if (job.options.include_usage) {
      json u = chunk(job, json::array());
      u["usage"] = usage_json(job);
      write(sse(u));
    }
    write("data: [DONE]\n\n");
    sink.done();
  }

  // --- other endpoints -------------------------------------------------------------------
  void handle_models(const httplib::Request& req, httplib::Response& res, const Listener& listener) {
    const auto start = SteadyClock::now();
    try {
      ApiKeyStore::Key* key = authenticate(req);
      json data = json::array();
      for (const auto& m : models) {
        if (listener.only_model && listener.only_model != m) continue;
        if (key && !ApiKeyStore::allows_model(*key, m->name())) continue;
        data.push_back({{"id", m->name()},
                        {"object", "model"},
                        {"created", m->created_unix()},
                        {"owned_by", "infera"},
                        {"state", model_state_name(m->state())},
                        {"max_model_len", m->limits().max_context}});
      }
      res.set_content(json{{"object", "list"}, {"data", std::move(data)}}.dump(), "application/json");
    } catch (const ApiException& e) {
      send_error(res, e.error);
      record("", "/v1/models", e.error.status, nullptr, start);
    }
  }

  void handle_tokenize(bool detokenize, const httplib::Request& req, httplib::Response& res, const Listener& listener) {
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
        for (int32_t id : r.tokens) {
          if (id >= model->tokenizer().vocab_size())
            throw_api(bad_request(fmt::format("token id {} is outside the vocabulary (size {})", id, model->tokenizer().vocab_size()), "tokens"));
        }
        res.set_content(json{{"prompt", model->tokenizer().decode(r.tokens, false)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                        "application/json");
      } else {
        const TokenizeRequest r = parse_tokenize_request(body);
        auto model = find_model(r.model, listener);
        check_model_access(key, *model);
        const auto ids = model->tokenizer().encode(r.text, r.add_special_tokens);
        res.set_content(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model->limits().max_context}}.dump(),
                        "application/json");
      }
    } catch (const ApiException& e) {
      send_error(res, e.error);
      record("", endpoint, e.error.status, key, start);
    } catch (const Error& e) {  // e.g. invalid UTF-8 handed to the tokenizer
      send_error(res, bad_request(e.what()));
      record("", endpoint, 400, key, start);
    }
  }

  void handle_ready(httplib::Response& res, const Listener& listener) {
    json list = json::array();
    bool all_ready = true;
    for (const auto& m : models) {
      if (listener.only_model && listener.only_model != m) continue;
      m->backend();  // notices an engine that died
      const ModelState s = m->state();
      all_ready &= s == ModelState::kReady;
      list.push_back({{"name", m->name()}, {"state", model_state_name(s)}});
    }
    const bool ok = all_ready && !draining;
    res.status = ok ? 200 : 503;
    res.set_content(json{{"status", draining ? "draining" : (ok ? "ready" : "not_ready")}, {"models", std::move(list)}}.dump(),
                    "application/json");
  }

  void handle_metrics(httplib::Response& res) {
    std::vector<ModelGauges> gauges;
    for (const auto& m : models) {
      ModelGauges g;
      g.name = m->name();
      auto backend = m->backend();
      g.state = model_state_name(m->state());
      if (backend) {
        g.has_stats = true;
        g.stats = backend->stats();
      }
      gauges.push_back(std::move(g));
    }
    res.set_content(metrics.render(gauges), "text/plain; version=0.0.4; charset=utf-8");
  }

  void install_routes(Listener& l) {
    httplib::Server& s = *l.server;
    const Listener* lp = &l;
    s.Post("/v1/chat/completions", [this, lp](const httplib::Request& q, httplib::Response& r) { handle_generate(Endpoint::kChat, q, r, *lp); });
    s.Post("/v1/completions", [this, lp](const httplib::Request& q, httplib::Response& r) { handle_generate(Endpoint::kCompletion, q, r, *lp); });
    s.Get("/v1/models", [this, lp](const httplib::Request& q, httplib::Response& r) { handle_models(q, r, *lp); });
    s.Post("/tokenize", [this, lp](const httplib::Request& q, httplib::Response& r) { handle_tokenize(false, q, r, *lp); });
    s.Post("/detokenize", [this, lp](const httplib::Request& q, httplib::Response& r) { handle_tokenize(true, q, r, *lp); });
    s.Get("/health", [](const httplib::Request&, httplib::Response& r) { r.set_content(R"({"status":"ok"})", "application/json"); });
    s.Get("/ready", [this, lp](const httplib::Request&, httplib::Response& r) { handle_ready(r, *lp); });
    if (config.metrics) s.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) { handle_metrics(r); });
    // Errors httplib produces itself (unknown route, body over the limit) get the OpenAI shape too.
    s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      ApiError e;
      if (res.status == 413) {
        e = make_error(413, "invalid_request_error",
                       fmt::format("the request body is larger than the limit of {} bytes", config.body_limit_bytes), "body_too_large");
      } else if (res.status == 404) {
        e = make_error(404, "invalid_request_error", fmt::format("no endpoint {} {}", req.method, req.path), "unknown_endpoint");
      } else {
        e = make_error(res.status, res.status >= 500 ? "server_error" : "invalid_request_error", fmt::format("the request failed with HTTP status {}", res.status));
      }
      send_error(res, e);
      if (res.status == 413) record("", req.path, 413, nullptr, SteadyClock::now());
      return httplib::Server::HandlerResponse::Handled;
    }));
    s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        LOG_ERROR("{} {}: unhandled error: {}", req.method, req.path, e.what());
      } catch (...) {
        LOG_ERROR("{} {}: unhandled error", req.method, req.path);
      }
      send_error(res, internal_error());
    });
    s.set_payload_max_length(static_cast<size_t>(config.body_limit_bytes));
    s.set_read_timeout(30, 0);
    s.set_write_timeout(30, 0);
    const int threads = config.http_threads;
    s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  }

  void bind_listener(Listener& l, const std::string& what) {
    // The packaged cpp-httplib listens with a backlog of 5: a burst of clients connecting
    // at once would see dropped SYNs and one-second retries. Remember the socket so its
    // backlog can be raised after httplib's listen() (a second listen() on Linux does that).
    int fd = -1;
    l.server->set_socket_options([&fd](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      fd = sock;
    });
    if (l.port == 0) {
      l.port = l.server->bind_to_any_port(config.host);
      if (l.port < 0) fail("{}: cannot listen on {} (any port)", what, config.host);
    } else if (!l.server->bind_to_port(config.host, l.port)) {
      fail("{}: cannot listen on {}:{}; the port is in use or the address is not local; pick another port", what, config.host, l.port);
    }
    if (fd >= 0) ::listen(fd, 1024);
    l.server->set_socket_options([](socket_t) {});  // `fd` above is gone
  }
};

// ---------------------------------------------------------------------------------------
HttpServer::HttpServer(ServerConfig config, std::vector<std::shared_ptr<ModelInstance>> models)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(models))) {}

HttpServer::~HttpServer() {
  stop();
  if (impl_->background.joinable()) impl_->background.join();
}

void HttpServer::bind() {
  Impl& s = *impl_;
  s.listeners.reserve(1 + s.models.size());  // routes keep pointers to their listener
  Impl::Listener& main = s.listeners.emplace_back();
  main.server = std::make_unique<httplib::Server>();
  main.port = s.config.port;
  s.install_routes(main);
  s.bind_listener(main, "server.port");
  for (const auto& m : s.models) {
    if (m->deploy().port == 0) continue;
    Impl::Listener& l = s.listeners.emplace_back();
    l.server = std::make_unique<httplib::Server>();
    l.only_model = m;
    l.port = m->deploy().port;
    s.install_routes(l);
    s.bind_listener(l, fmt::format("model '{}' port", m->name()));
  }
}

void HttpServer::run() {
  Impl& s = *impl_;
  for (size_t i = 1; i < s.listeners.size(); ++i) {
    s.threads.emplace_back([srv = s.listeners[i].server.get()] { srv->listen_after_bind(); });
  }
  if (!s.listeners.empty()) s.listeners[0].server->listen_after_bind();
  for (auto& t : s.threads) {
    if (t.joinable()) t.join();
  }
  s.threads.clear();
}

void HttpServer::start() {
  impl_->background = std::thread([this] { run(); });
  for (auto& l : impl_->listeners) {
    while (!l.server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void HttpServer::stop() {
  for (auto& l : impl_->listeners) l.server->stop();
}

void HttpServer::drain_and_stop(double grace_s) {
  Impl& s = *impl_;
  s.draining = true;
  LOG_INFO("draining: {} request(s) in flight, waiting up to {} s", s.in_flight.load(), grace_s);
  {
    std::unique_lock lock(s.drain_mutex);
    s.drain_cv.wait_for(lock, std::chrono::duration<double>(grace_s), [&] { return s.in_flight.load() == 0; });
  }
  if (s.in_flight.load() > 0) LOG_WARN("drain grace period over; stopping with {} request(s) unfinished", s.in_flight.load());
  stop();
}

bool HttpServer::draining() const { return impl_->draining; }
int64_t HttpServer::in_flight() const { return impl_->in_flight; }
int HttpServer::port() const { return impl_->listeners.empty() ? 0 : impl_->listeners[0].port; }

int HttpServer::model_port(const std::string& name) const {
  for (const auto& l : impl_->listeners) {
    if (l.only_model && l.only_model->name() == name) return l.port;
  }
  return 0;
}

}  // namespace infera::server
