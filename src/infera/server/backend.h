// The narrow seam between the HTTP layer and a generation engine: typed requests in
// (token ids, sampling parameters; runtime/sequence.h), token events out through a
// callback. The server never hands JSON to the engine, and the engine never detokenizes:
// text, stop strings and tool-call parsing happen on the HTTP worker threads.
// EngineBackend adapts runtime/engine.h; unit tests use a scripted fake.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "infera/runtime/engine.h"
#include "infera/runtime/sequence.h"

namespace infera::server {

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Queues the request. The callback runs on the backend's thread, once per token and
  // once with the final event; it must only queue the event. Throws infera::Error when
  // the request can never be served (the message is safe to show the client).
  virtual RequestId submit(Request request, EventCallback on_event) = 0;
  // Ends a request and frees its KV blocks; its final event (kCancelled) follows.
  virtual void cancel(RequestId id) = 0;
  virtual EngineStats stats() const = 0;
  // Tokens routed per expert, [layers * experts] layer-major; empty for dense models.
  virtual std::vector<uint64_t> expert_counts() const { return {}; }
  // False once the engine has failed for good (the model then reports "failed").
  virtual bool healthy() const { return true; }
};

class EngineBackend final : public GenerationBackend {
 public:
  explicit EngineBackend(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}
  RequestId submit(Request request, EventCallback on_event) override {
    return engine_->submit(std::move(request), std::move(on_event));
  }
  void cancel(RequestId id) override { engine_->cancel(id); }
  EngineStats stats() const override { return engine_->stats(); }
  std::vector<uint64_t> expert_counts() const override { return engine_->expert_counts(); }

 private:
  std::unique_ptr<Engine> engine_;
};

}  // namespace infera::server
