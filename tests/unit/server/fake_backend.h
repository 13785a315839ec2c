// A scripted GenerationBackend for server tests: every request "generates" the same
// token script, one token per `delay`, on the backend's own thread, honouring max_tokens,
// stop token ids and cancel() like the real engine (the final event carries usage; a stop
// token ends the request without a token event). kv_blocks_used counts live requests.
// Requests with logprobs get fake_logprobs() on each token event; requests with
// prompt_logprobs get those of prompt tokens 1.. on their first event (as the engine), after
// set_scoring_ticks() silent ticks (a prompt being scored takes longer to its first token).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "infera/base/error.h"
#include "infera/server/backend.h"

namespace infera::server::testing {

// The log-probabilities FakeBackend reports for the token at `pos` (made up, but distinct
// per position and sorted as the real ones are): the token itself first, then ids
// tok+1, tok+2, ... (mod 512) at decreasing values.
inline TokenLogprobs fake_logprobs(int32_t tok, size_t pos, int32_t top_n) {
  TokenLogprobs lp;
  lp.sampled = {tok, -0.125f * static_cast<float>(pos % 8 + 1)};
  for (int32_t k = 0; k < top_n; ++k)
    lp.top.push_back({(tok + k) % 512, lp.sampled.logprob - 0.5f * static_cast<float>(k)});
  return lp;
}

class FakeBackend final : public GenerationBackend {
 public:
  FakeBackend(std::vector<int32_t> script, std::chrono::milliseconds delay)
      : script_(std::move(script)), delay_(delay) {
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeBackend() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  RequestId submit(Request request, EventCallback on_event) override {
    if (request.prompt_ids.empty()) fail("empty prompt");
    std::lock_guard lock(mutex_);
    const RequestId id = next_id_++;
    Live live;
    live.request = std::move(request);
    live.on_event = std::move(on_event);
    live_.emplace(id, std::move(live));
    ++submitted_;
    last_seeds_.push_back(live_.at(id).request.sampling.seed);
    last_sampling_ = live_.at(id).request.sampling;
    last_prompt_ids_ = live_.at(id).request.prompt_ids;
    last_vocab_limit_ = live_.at(id).request.sampling.vocab_limit;
    prompt_logprobs_asked_.push_back(live_.at(id).request.prompt_logprobs);
    cv_.notify_all();
    return id;
  }

  void cancel(RequestId id) override {
    std::lock_guard lock(mutex_);
    auto it = live_.find(id);
    if (it != live_.end()) {
      it->second.cancelled = true;
      ++cancels_;
    }
    cv_.notify_all();
  }

  EngineStats stats() const override {
    std::lock_guard lock(mutex_);
    EngineStats s;
    s.running = static_cast<int32_t>(live_.size());
    s.kv_blocks_used = static_cast<int32_t>(live_.size());
    s.kv_blocks_total = 1000;
    s.waiting = waiting_override_;
    return s;
  }

  int64_t live() const { return stats().running; }
  int64_t cancels() const {
    std::lock_guard lock(mutex_);
    return cancels_;
  }
  int64_t submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  std::vector<uint64_t> seeds() const {
    std::lock_guard lock(mutex_);
    return last_seeds_;
  }
  // Request::prompt_logprobs of every request submitted, in order.
  std::vector<int32_t> prompt_logprobs_asked() const {
    std::lock_guard lock(mutex_);
    return prompt_logprobs_asked_;
  }
  // The sampling parameters of the last request submitted.
  SamplingParams last_sampling() const {
    std::lock_guard lock(mutex_);
    return last_sampling_;
  }
  int32_t last_vocab_limit() const {
    std::lock_guard lock(mutex_);
    return last_vocab_limit_;
  }
  // The prompt of the last request submitted.
  std::vector<int32_t> last_prompt_ids() const {
    std::lock_guard lock(mutex_);
    return last_prompt_ids_;
  }
  void set_waiting(int32_t n) {
    std::lock_guard lock(mutex_);
    waiting_override_ = n;
  }
  // Requests that score their prompt stay silent for `ticks` ticks first.
  void set_scoring_ticks(int ticks) {
    std::lock_guard lock(mutex_);
    scoring_ticks_ = ticks;
  }
  // Every later request's events go through this gate: when closed, nothing advances.
  void set_paused(bool paused) {
    {
      std::lock_guard lock(mutex_);
      paused_ = paused;
    }
    cv_.notify_all();
  }

 private:
  struct Live {
    Request request;
    EventCallback on_event;
    size_t pos = 0;
    bool cancelled = false;
    int ticks = 0;
    bool prompt_scored = false;
  };

  void loop() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, delay_, [&] { return stop_; });
      if (stop_) break;
      if (paused_) continue;
      std::vector<std::pair<EventCallback*, Event>> out;
      std::vector<RequestId> finished;
      for (auto& [id, live] : live_) {
        const bool scores = live.request.prompt_logprobs >= 0;
        if (scores && !live.cancelled && live.ticks++ < scoring_ticks_) continue;
        Event e;
        e.id = id;
        e.usage.prompt_tokens = static_cast<int32_t>(live.request.prompt_ids.size());
        e.usage.completion_tokens = static_cast<int32_t>(live.pos);
        if (live.cancelled) {
          e.finish = FinishReason::kCancelled;
        } else if (live.pos >= script_.size()) {
          e.finish = FinishReason::kStop;
        } else if (live.request.max_tokens >= 0 && static_cast<int32_t>(live.pos) >= live.request.max_tokens) {
          e.finish = FinishReason::kLength;
        } else {
          const int32_t tok = script_[live.pos++];
          const auto& stops = live.request.stop_token_ids;
          if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
            e.finish = FinishReason::kStop;
            e.stop_token = tok;
            e.usage.completion_tokens = static_cast<int32_t>(live.pos);
          } else {
            e.token = tok;
            if (live.request.logprobs) e.logprobs = fake_logprobs(tok, live.pos - 1, live.request.top_logprobs);
          }
        }
        if (scores && !live.prompt_scored) {
          live.prompt_scored = true;
          e.prompt_logprobs.emplace();
          const auto& ids = live.request.prompt_ids;
          for (size_t i = 1; i < ids.size(); ++i)
            e.prompt_logprobs->push_back(fake_logprobs(ids[i], i, live.request.prompt_logprobs));
        }
        out.emplace_back(&live.on_event, e);
        if (e.is_final()) finished.push_back(id);
      }
      // Deliver outside the lock, as the engine does; the callbacks only queue.
      std::vector<EventCallback> keep;
      for (RequestId id : finished) keep.push_back(live_.at(id).on_event);
      lock.unlock();
      size_t k = 0;
      for (auto& [cb, e] : out) {
        if (e.is_final())
          keep[k++](e);
        else
          (*cb)(e);
      }
      lock.lock();
      for (RequestId id : finished) live_.erase(id);
    }
    // Shutting down: every unfinished request ends cancelled.
    for (auto& [id, live] : live_) {
      Event e;
      e.id = id;
      e.finish = FinishReason::kCancelled;
      live.on_event(e);
    }
    live_.clear();
  }

  std::vector<int32_t> script_;
  std::chrono::milliseconds delay_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<RequestId, Live> live_;
  RequestId next_id_ = 1;
  int64_t cancels_ = 0;
  int64_t submitted_ = 0;
  int32_t waiting_override_ = 0;
  int scoring_ticks_ = 0;
  bool paused_ = false;
  std::vector<uint64_t> last_seeds_;
  int32_t last_vocab_limit_ = 0;
  SamplingParams last_sampling_;
  std::vector<int32_t> last_prompt_ids_;
  std::vector<int32_t> prompt_logprobs_asked_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace infera::server::testing
