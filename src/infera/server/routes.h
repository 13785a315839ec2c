// The server's routes: authentication, rate limits and queue limits, the model router,
// and the endpoint handlers, over the HTTP transport (http_transport.h). Liveness and
// readiness (/health, /ready), /metrics, /v1/models and the web console (console.h: its
// pages and /v1/stats) are answered on the I/O thread at once; requests that parse JSON,
// render templates or tokenize run on a bounded worker pool, and a generation then
// proceeds as a GenerationJob (generation_job.h) without a thread of its own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "infera/server/audit_log.h"
#include "infera/server/auth.h"
#include "infera/server/console.h"
#include "infera/server/deploy_config.h"
#include "infera/server/generation_job.h"
#include "infera/server/http_transport.h"
#include "infera/server/limits.h"
#include "infera/server/metrics.h"
#include "infera/server/model_instance.h"
#include "infera/server/openai_api.h"
#include "infera/server/request_guard.h"

namespace infera::server {

class Routes {
 public:
  Routes(ServerConfig config, std::vector<std::shared_ptr<ModelInstance>> models);
  ~Routes();
  Routes(const Routes&) = delete;
  Routes& operator=(const Routes&) = delete;

  // What one listener serves: every model, or only one (a model's own port).
  struct Scope {
    std::shared_ptr<ModelInstance> only_model;
  };

  void set_transport(HttpTransport* transport) { transport_ = transport; }
  // Before the body is read: unknown endpoints (404), encoded bodies (415), without keys a
  // browser's Host, Origin or Content-Type (request_guard.h: 403, 415), a missing or wrong
  // key on an endpoint that needs one (401).
  std::optional<HttpResponse> check_head(const Scope& scope, const HttpRequest& head);
  void handle(const Scope& scope, std::shared_ptr<HttpExchange> exchange);
  // Responses for what the transport rejects itself (413, 400, 431, 408, ...).
  HttpResponse transport_error(int status, const std::string& message);

  // Drain: new generation requests get 503 and /ready turns 503.
  void begin_drain() { draining_ = true; }
  bool draining() const { return draining_; }
  int64_t in_flight() const { return in_flight_; }
  // Waits until nothing is in flight, `grace_s` passed or wake_drain() was called.
  void wait_idle(double grace_s);
  void wake_drain();
  // Server stop: waits for the workers' current requests, then ends every job still
  // running (its generation is cancelled).
  void stop_workers();
  void abort_jobs();

  const ServerConfig& config() const { return config_; }
  const std::vector<std::shared_ptr<ModelInstance>>& models() const { return models_; }

 private:
  ApiKeyStore::Key* authenticate(const HttpRequest& req);
  std::shared_ptr<ModelInstance> find_model(const std::optional<std::string>& name, const Scope& scope);
  void check_model_access(ApiKeyStore::Key* key, const ModelInstance& model);
  // Reserves `requests` and `tokens` against the key's limits (limits.h); 429 otherwise.
  Admission admit(ApiKeyStore::Key* key, double requests, double tokens);
  std::shared_ptr<GenerationBackend> ready_backend(ModelInstance& model);
  void check_not_draining();
  void record(const std::string& model, const std::string& endpoint, int status, ApiKeyStore::Key* key,
              SteadyClock::time_point start, int64_t prompt_tokens = 0, int64_t completion_tokens = 0,
              double ttft_s = -1, double tpot_s = -1, const std::string& finish_reason = {},
              const std::string* prompt = nullptr);
  void leave_in_flight();

  void handle_generate(Endpoint endpoint, const HttpRequest& req, std::shared_ptr<HttpExchange> exchange,
                       const Scope& scope);
  HttpResponse handle_models(const HttpRequest& req, const Scope& scope);
  HttpResponse handle_tokenize(bool detokenize, const HttpRequest& req, const Scope& scope);
  HttpResponse handle_ready(const Scope& scope);
  HttpResponse handle_metrics(const HttpRequest& req);
  HttpResponse handle_stats(const HttpRequest& req, const Scope& scope);

  ServerConfig config_;
  std::vector<std::shared_ptr<ModelInstance>> models_;
  ApiKeyStore keys_;
  RequestGuard guard_;
  ConsoleStats console_stats_;
  Metrics metrics_;
  std::unique_ptr<AuditLog> audit_;
  ParseLimits parse_limits_;
  HttpTransport* transport_ = nullptr;

  std::atomic<bool> draining_{false};
  std::atomic<bool> drain_woken_{false};
  std::atomic<int64_t> in_flight_{0};
  std::mutex drain_mutex_;
  std::condition_variable drain_cv_;

  std::mutex jobs_mutex_;
  std::unordered_map<Job*, std::weak_ptr<Job>> jobs_;  // running generations, for abort_jobs()

  struct Workers;
  std::unique_ptr<Workers> workers_;
};

}  // namespace infera::server
