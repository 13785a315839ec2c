#include "infera/server/generation_job.h"

#include "infera/base/log.h"
#include "infera/server/openai_response.h"

namespace infera::server {

using nlohmann::json;

void JobInbox::push(int choice, const Event& e) {
  std::function<void()> post;
  {
    std::lock_guard lock(mutex);
    if (!started && !schedule && scheduled) return;  // the job has finished: dropped
    events.emplace_back(choice, e);
    if (started && !scheduled) {
      scheduled = true;
      post = schedule;
    }
  }
  if (post) post();
}

void JobInbox::start() {
  std::function<void()> post;
  {
    std::lock_guard lock(mutex);
    started = true;
    if (!events.empty() && !scheduled) {
      scheduled = true;
      post = schedule;
    }
  }
  if (post) post();
}

void Job::finish() {
  if (finished) return;
  finished = true;
  cancel_all();
  HttpTransport::cancel(deadline_timer_);
  HttpTransport::cancel(heartbeat_timer_);
  {
    std::lock_guard lock(inbox->mutex);
    inbox->schedule = nullptr;  // late events are dropped
    inbox->started = false;
    inbox->scheduled = true;
    inbox->events.clear();
  }
  if (on_finish) on_finish();
  exchange_.reset();
  // Last: may destroy this job.
  auto self = std::move(self_);
}

void Job::cancel_all() {
  for (auto& c : choices) {
    if (c->submitted && !c->done) backend->cancel(c->id);
  }
}

bool Job::all_done() const {
  for (const auto& c : choices) {
    if (!c->done) return false;
  }
  return true;
}

int64_t Job::completion_tokens() const {
  int64_t n = 0;
  for (const auto& c : choices) n += c->completion_tokens;
  return n;
}

int64_t Job::cached_tokens() const {
  int64_t n = 0;
  for (const auto& c : choices) n = std::max<int64_t>(n, c->cached_tokens);
  return n;
}

EventCallback Job::callback(int index) const {
  return [inbox = inbox, index](const Event& e) { inbox->push(index, e); };
}

void Job::run(HttpTransport& transport, std::function<void(std::function<void()>)> serial,
              std::shared_ptr<HttpExchange> exchange) {
  transport_ = &transport;
  serial_ = std::move(serial);
  exchange_ = std::move(exchange);
  self_ = shared_from_this();
  std::weak_ptr<Job> weak = self_;
  auto on_serial = [serial = serial_, weak](void (Job::*method)()) {
    return [serial, weak, method] {
      serial([weak, method] {
        if (auto j = weak.lock(); j && !j->finished) ((*j).*method)();
      });
    };
  };
  serial_([this, self = self_, on_serial] {
    if (finished) return;
    if (options.stream) {
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
      exchange_->begin_stream(std::move(head));
      last_write_ = SteadyClock::now();
      heartbeat_timer_ = transport_->schedule(std::chrono::seconds(2), on_serial(&Job::heartbeat));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    deadline_timer_ = transport_->schedule(std::max(left, std::chrono::milliseconds(0)), on_serial(&Job::on_deadline));
    exchange_->on_disconnect(on_serial(&Job::client_gone));
    {
      std::lock_guard lock(inbox->mutex);
      inbox->schedule = on_serial(&Job::drain);
    }
    inbox->start();
  });
}

bool Job::abort() {
  if (finished) return false;
  const bool unfinished = !responded_;
  if (status == 200 && unfinished) status = 503;  // a response already written keeps its status
  finish();
  return unfinished;
}

void Job::drain() {
  std::deque<std::pair<int, Event>> batch;
  {
    std::lock_guard lock(inbox->mutex);
    batch.swap(inbox->events);
    inbox->scheduled = false;
  }
  for (auto& [index, e] : batch) {
    if (responded_ || finished) return;
    try {
      apply(index, e);
    } catch (const std::exception& ex) {
      // Whatever goes wrong in one request's pipeline ends that request, never the server.
      LOG_ERROR("model '{}': request failed: {}", model->name(), ex.what());
      fail(500);
      return;
    }
  }
}

void Job::apply(int index, const Event& e) {
  Choice& c = *choices.at(static_cast<size_t>(index));
  OutputDelta d = apply_event(*this, c, e);
  const bool failed = c.done && c.engine_finish == FinishReason::kError;
  if (failed) LOG_ERROR("model '{}': generation failed: {}", model->name(), c.engine_error);
  if (!options.stream) {
    c.reasoning += d.reasoning;
    c.content += d.content;
    if (failed) status = 500;
    if (all_done()) complete();
    return;
  }
  if (failed) {
    fail(500);
    return;
  }
  if (c.awaits_scoring()) {
    c.held.reasoning += d.reasoning;
    c.held.content += d.content;
    c.holding = true;
    return;
  }
  std::string out;
  stream_chunks(*this, c, d, c.done, out);
  // The choices that read this one's scoring and waited for it go out now.
  for (auto& other : choices) {
    if (other->prompt_scorer != &c || !other->holding || other->awaits_scoring()) continue;
    other->holding = false;
    const OutputDelta held = std::move(other->held);
    other->held = {};
    stream_chunks(*this, *other, held, other->done, out);
  }
  if (!out.empty()) {
    exchange_->write(std::move(out));
    last_write_ = SteadyClock::now();
  }
  if (all_done()) complete();
}

void Job::complete() {
  if (!options.stream) {
    respond(status == 200 ? json_response(final_response(*this)) : error_response(internal_error()));
    return;
  }
  std::string tail;
  if (options.include_usage) {
    json u = chunk(*this, json::array());
    u["usage"] = usage_json(*this);
    u["timings"] = timings_json(*this);
    tail += sse(u);
  }
  tail += kSseDone;
  exchange_->write(std::move(tail));
  end_stream();
}

void Job::fail(int code) {
  status = code;
  cancel_all();
  const ApiError e = code == 504 ? timeout_error(timeout_s) : internal_error();
  if (!options.stream) {
    respond(error_response(e));
    return;
  }
  exchange_->write(sse(error_to_json(e)) + kSseDone);
  end_stream();
}

void Job::on_deadline() {
  if (responded_) return;
  fail(504);
}

void Job::client_gone() {
  if (responded_) return;
  status = 499;  // client closed the connection (nginx's convention)
  finish();  // cancels every choice: frees their KV blocks
}

// Streams: an SSE comment when nothing went out for a while (proxies keep the connection,
// and a client that left is noticed).
void Job::heartbeat() {
  if (responded_) return;
  if (SteadyClock::now() - last_write_ >= std::chrono::milliseconds(1900)) {
    exchange_->write(": keep-alive\n\n");
    last_write_ = SteadyClock::now();
  }
  std::weak_ptr<Job> weak = self_;
  auto serial = serial_;
  heartbeat_timer_ = transport_->schedule(std::chrono::seconds(2), [serial, weak] {
    serial([weak] {
      if (auto j = weak.lock(); j && !j->finished) j->heartbeat();
    });
  });
}

// The job is finished once its last byte is written (or the client is gone), so the
// in-flight count and the metrics follow what the client has. The key's slot and token
// reservation are given back before the last bytes go out: a client that sends its next
// request as soon as it has this answer finds its slot free.
void Job::settle_admission() {
  admission.set_used(static_cast<double>(prompt_tokens_total + completion_tokens()));
  admission.settle();
}

void Job::respond(HttpResponse r) {
  responded_ = true;
  settle_admission();
  exchange_->respond(std::move(r), [serial = serial_, self = self_] { serial([self] { self->finish(); }); });
}

void Job::end_stream() {
  responded_ = true;
  settle_admission();
  exchange_->end([serial = serial_, self = self_] { serial([self] { self->finish(); }); });
}

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
  c.timings = e.timings;
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

}  // namespace infera::server
