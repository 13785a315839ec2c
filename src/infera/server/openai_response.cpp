#include "infera/server/openai_response.h"

#include <algorithm>
#include <cmath>
#include <span>

#include <fmt/format.h>

#include "infera/server/logprobs_json.h"

namespace infera::server {

using nlohmann::json;

ApiError make_error(int status, std::string type, std::string message, std::optional<std::string> code,
                    std::optional<std::string> param) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

ApiError internal_error() {
  return make_error(500, "server_error",
                    "the server hit an internal error while handling the request; it has been logged");
}

ApiError timeout_error(double timeout_s) {
  return make_error(504, "timeout_error", fmt::format("the request did not finish within {} s", timeout_s),
                    "request_timeout");
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpResponse json_response(const json& j, int status) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(j);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(error_to_json(e), e.status);
  if (e.retry_after_s > 0) r.headers.push_back({"Retry-After", std::to_string(e.retry_after_s)});
  return r;
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json usage_json(const Job& job) {
  const int64_t completion = job.completion_tokens();
  json u = {{"prompt_tokens", job.prompt_tokens_total},
            {"completion_tokens", completion},
            {"total_tokens", job.prompt_tokens_total + completion}};
  u["prompt_tokens_details"] = {{"cached_tokens", job.cached_tokens()}};
  return u;
}

json timings_json(const Job& job) {
  // Per choice, from its submission (the job's choices are submitted together): queued until
  // first scheduled, its first token, its finish. The job's windows cover every choice: the
  // prompts from the earliest scheduling to the latest first token, the decoding from the
  // earliest first token to the latest finish.
  double queue_ms = 0, first_min = 0, first_max = 0, last_ms = 0;
  int generating = 0;  // choices with a first token
  for (const auto& c : job.choices) {
    if (c->completion_tokens == 0 || c->timings.ttft_ms <= 0) continue;
    const Timings& t = c->timings;
    queue_ms = generating ? std::min(queue_ms, t.queue_ms) : t.queue_ms;
    first_min = generating ? std::min(first_min, t.ttft_ms) : t.ttft_ms;
    first_max = generating ? std::max(first_max, t.ttft_ms) : t.ttft_ms;
    last_ms = generating ? std::max(last_ms, t.total_ms) : t.total_ms;
    ++generating;
  }
  const int64_t cached = job.cached_tokens();
  const int64_t prompt_n = std::max<int64_t>(0, job.prompt_tokens_total - cached);
  const int64_t predicted_n = job.completion_tokens();
  const double prompt_ms = std::max(0.0, first_max - queue_ms);
  const double predicted_ms = std::max(0.0, last_ms - first_min);
  const auto round3 = [](double v) { return std::round(v * 1000) / 1000; };
  json t = {{"queue_ms", round3(queue_ms)},   {"cache_n", cached},          {"prompt_n", prompt_n},
            {"prompt_ms", round3(prompt_ms)}, {"predicted_n", predicted_n}, {"predicted_ms", round3(predicted_ms)}};
  if (prompt_n > 0 && prompt_ms > 0) t["prompt_per_second"] = round3(prompt_n * 1000.0 / prompt_ms);
  if (predicted_n > generating && predicted_ms > 0)
    t["predicted_per_second"] = round3((predicted_n - generating) * 1000.0 / predicted_ms);
  return t;
}

namespace {

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json arr = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    arr.push_back(std::move(c));
  }
  return arr;
}

// The echoed prompt's entries of the legacy completions object, with the request's
// `logprobs` alternatives (the engine may have kept more for `prompt_logprobs`).
json echoed_prompt_logprobs(const Job& job, const Choice& c, int64_t& offset) {
  if (!c.scored_prompt()) return nullptr;
  std::vector<TokenLogprobs> entries = *c.scored_prompt();
  for (TokenLogprobs& e : entries) {
    if (static_cast<int32_t>(e.top.size()) > job.options.top_logprobs) e.top.resize(job.options.top_logprobs);
  }
  return completion_prompt_logprobs(job.model->tokenizer(), c.first_prompt_token, entries, offset);
}

// vLLM's `prompt_logprobs` of a choice (null when the engine sent none: a failed request).
json vllm_prompt_json(const Job& job, const Choice& c) {
  if (!c.scored_prompt()) return nullptr;
  return vllm_prompt_logprobs(job.model->tokenizer(), *c.scored_prompt(), job.options.prompt_logprobs);
}

}  // namespace

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
      choices.push_back(
          {{"index", c->index}, {"message", message}, {"logprobs", logprobs}, {"finish_reason", c->finish_reason}});
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
              {"usage", usage_json(job)},
              {"timings", timings_json(job)}};
  // Chat: one prompt for every choice, so one list beside them (as vLLM).
  if (job.endpoint == Endpoint::kChat && job.options.prompt_logprobs >= 0)
    out["prompt_logprobs"] = vllm_prompt_json(job, *job.choices[0]);
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

namespace {

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

}  // namespace

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
      out += sse(chunk(job, json::array({{{"index", c.index},
                                          {"delta", delta},
                                          {"logprobs", unsent_logprobs(job, c)},
                                          {"finish_reason", nullptr}}})));
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

}  // namespace infera::server
