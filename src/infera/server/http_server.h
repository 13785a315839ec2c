// The OpenAI-compatible HTTP server: listeners on the HTTP transport (http_transport.h,
// Boost.Beast on Boost.Asio), the routes (routes.h: authentication, rate limits, the
// model router, handlers, metrics, audit log), generation jobs (generation_job.h: the
// per-choice text pipeline) and the response writer (openai_response.h), and graceful
// drain. JSON is parsed at the edge into typed requests (openai_api.h) and never travels
// further; detokenization, stop strings and tool-call parsing run on the HTTP layer's
// threads, never on an engine loop.
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
// GET /ready, GET /metrics, POST /tokenize, POST /detokenize. A model with a port of its
// own is also served there (and only it).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "infera/server/deploy_config.h"
#include "infera/server/model_instance.h"

namespace infera::server {

class HttpServer {
 public:
  HttpServer(ServerConfig config, std::vector<std::shared_ptr<ModelInstance>> models);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the main port and every model's own port. Port 0 picks a free port (tests).
  // Throws infera::Error naming the address when a port cannot be bound.
  void bind();
  // Serves on every bound port until stop(); blocks. On its way out every generation
  // still running is cancelled.
  void run();
  // run() on a background thread (tests).
  void start();
  // Stops at once: no more connections, every open one closed, running generations
  // cancelled (by run()). Safe to call from any thread, also during drain_and_stop().
  void stop();

  // Drain: new generation requests get 503, in-flight ones may finish within
  // `grace_s`; then stop() (what is still running is cancelled). Safe to call from any
  // thread; a stop() meanwhile ends the wait.
  void drain_and_stop(double grace_s);
  bool draining() const;
  int64_t in_flight() const;

  int port() const;  // the main port (after bind)
  int model_port(const std::string& name) const;  // a model's own port, 0 if none

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace infera::server
