// The generation job: all choices of one /v1/chat/completions or /v1/completions request.
// Each choice has its text pipeline (token ids -> UTF-8 text -> stop strings -> reasoning
// and tool calls, chat/text_stream.h), fed by the engine's events. The job runs on a
// serial executor of the HTTP layer's I/O threads: the engine's callback only queues an
// event and posts the job, which applies it and writes what became visible (an SSE chunk,
// or, once every choice is done, the whole response) to the client's exchange. No thread
// waits for a generation; a deadline and, for streams, a keep-alive timer run beside it.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "infera/server/auth.h"
#include "infera/server/http_transport.h"
#include "infera/server/limits.h"
#include "infera/server/model_instance.h"
#include "infera/server/openai_api.h"

namespace infera::server {

using SteadyClock = std::chrono::steady_clock;

enum class Endpoint { kChat, kCompletion };

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
  Timings timings;  // the engine's, from the final event
  IncrementalDecoder decoder;
  StopMatcher stop;
  OutputRouter router;
  std::string prefix_text;  // echo: the prompt text, sent before the completion
  // Prompt scoring (echo with logprobs, or `prompt_logprobs`): the prompt's first token
  // (nothing scores it) and the engine's log-probabilities of the others (Event::prompt_logprobs).
  bool echo_scored = false;  // completions with echo and logprobs: the legacy object starts with the prompt
  int32_t first_prompt_token = -1;
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  // Choices after the first of their prompt read its scoring instead of asking the engine
  // to score the same prompt again.
  const Choice* prompt_scorer = nullptr;
  const std::optional<std::vector<TokenLogprobs>>& scored_prompt() const {
    return prompt_scorer ? prompt_scorer->prompt_logprobs : prompt_logprobs;
  }
  // Streaming: the scoring this choice's first chunk carries has not come yet (its scorer
  // has neither reported it nor finished). Until it has, the choice's text waits in `held`.
  bool awaits_scoring() const { return prompt_scorer && !prompt_scorer->prompt_logprobs && !prompt_scorer->done; }
  OutputDelta held;
  bool holding = false;
  // Log-probabilities of the tokens taken so far (requests with logprobs): every token
  // up to the one that completed a stop string.
  std::vector<TokenLogprobs> logprobs;
  size_t logprobs_sent = 0;  // streaming: how many went out in earlier chunks
  int64_t text_offset = 0;  // completions: code points of the choice's text before the next chunk's tokens
  // Accumulated output (non-streaming responses).
  std::string content;
  std::string reasoning;
  bool role_sent = false;
};

// Engine events waiting for their job; the engine's callbacks hold it, so it may outlive
// the job (a cancelled request's last events).
struct JobInbox {
  std::mutex mutex;
  std::deque<std::pair<int, Event>> events;
  bool started = false;  // the job is set up; events may be applied
  bool scheduled = false;  // a drain is posted
  std::function<void()> schedule;  // posts the job's drain
  void push(int choice, const Event& e);
  void start();
};

// A generation in progress (all choices of one HTTP request).
struct Job : std::enable_shared_from_this<Job> {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;
  int64_t created = 0;
  std::shared_ptr<ModelInstance> model;
  std::shared_ptr<GenerationBackend> backend;
  std::shared_ptr<JobInbox> inbox = std::make_shared<JobInbox>();
  std::vector<std::unique_ptr<Choice>> choices;
  GenerationOptions options;
  bool tools = false;
  int32_t prompt_tokens = 0;  // of one prompt (all choices of a chat share it)
  int64_t prompt_tokens_total = 0;
  std::string prompt_text;  // for the audit log
  ApiKeyStore::Key* key = nullptr;
  Admission admission;  // the key's reservation (limits.h), settled as the answer goes out
  SteadyClock::time_point start;
  SteadyClock::time_point deadline;
  double timeout_s = 0;  // request_timeout_s, for the 504 message
  std::optional<SteadyClock::time_point> first_token;
  SteadyClock::time_point last_token;
  int64_t tokens_seen = 0;
  std::function<void()> on_finish;  // metrics, audit, in-flight count; run once
  int status = 200;
  bool finished = false;

  ~Job() { finish(); }

  // Ends the job: cancels what still runs, runs on_finish. Once.
  void finish();
  void cancel_all();
  bool all_done() const;
  int64_t completion_tokens() const;
  int64_t cached_tokens() const;

  // The engine callback of choice `index`: it only queues the event.
  EventCallback callback(int index) const;

  // --- driving (after every choice is submitted) ---
  // Starts answering `exchange` on `serial` (an I/O-thread serial executor of `transport`):
  // the stream's head, the deadline, the disconnect watch, then the events as they come.
  // The job keeps itself alive until it has finished.
  void run(HttpTransport& transport, std::function<void(std::function<void()>)> serial,
           std::shared_ptr<HttpExchange> exchange);
  // Server stop: ends the job now (status 503 unless it already has another or its
  // response was written). True when its response was not complete.
  bool abort();

 private:
  void drain();
  void apply(int index, const Event& e);
  void complete();  // every choice done: the response, or the stream's tail
  void fail(int status);  // 500 / 504: an error response or SSE error event + [DONE]
  void client_gone();
  void heartbeat();
  void on_deadline();
  void respond(HttpResponse r);
  void end_stream();
  void settle_admission();  // the key's slot and tokens, before the last bytes go out

  HttpTransport* transport_ = nullptr;
  std::function<void(std::function<void()>)> serial_;
  std::shared_ptr<HttpExchange> exchange_;
  std::shared_ptr<HttpTransport::Timer> deadline_timer_;
  std::shared_ptr<HttpTransport::Timer> heartbeat_timer_;
  std::shared_ptr<Job> self_;  // alive until finished
  bool responded_ = false;  // the response (or the stream's end) is on its way
  SteadyClock::time_point last_write_;
};

// Applies one engine event to its choice; returns the text that became visible.
OutputDelta apply_event(Job& job, Choice& c, const Event& e);

}  // namespace infera::server
