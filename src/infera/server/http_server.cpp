#include "infera/server/http_server.h"

#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "infera/base/log.h"
#include "infera/server/http_transport.h"
#include "infera/server/routes.h"

namespace infera::server {

namespace {

// Raises the soft limit on open files to the hard one (each connection is a descriptor)
// and returns it.
size_t raise_open_files_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(rl.rlim_cur, 65536) : rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return rl.rlim_cur == RLIM_INFINITY ? 65536 : static_cast<size_t>(rl.rlim_cur);
}

// Hands the allocator's free pages back to the system. glibc keeps what a thread's arena
// freed (the HTTP workers and I/O threads each allocate from one of up to 8 x cores
// arenas), so without this the resident set creeps up as every arena reaches its own
// high-water mark, although the live heap stays flat (docs/server.md, the soak).
void release_free_memory() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

constexpr std::chrono::seconds kTrimInterval{10};

}  // namespace

struct HttpServer::Impl {
  struct Listener {
    Routes::Scope scope;
    int port = 0;
  };

  Routes routes;  // outlives the transport (jobs and handlers refer to it)
  HttpTransport transport;
  std::vector<Listener> listeners;
  std::thread background;
  std::shared_ptr<HttpTransport::Timer> trim_timer;  // set before run(), then only on its own I/O-thread callback

  // Every kTrimInterval while serving: free memory back to the system.
  void schedule_trim() {
    trim_timer = transport.schedule(kTrimInterval, [this] {
      release_free_memory();
      schedule_trim();
    });
  }

  static HttpLimits limits_for(const ServerConfig& c) {
    HttpLimits l;
    l.body_bytes = static_cast<uint64_t>(std::max<int64_t>(c.body_limit_bytes, 0));
    // At least a millisecond, at most a day (a timer's range).
    l.head_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::clamp(c.head_timeout_s, 0.001, 86400.0) * 1000));
    const size_t files = raise_open_files_limit();
    l.max_connections = std::clamp<size_t>(files > 256 ? files - 128 : files / 2, 16, 16384);
    return l;
  }

  static int io_threads() {
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    return std::clamp(hw / 4, 2, 4);
  }

  Impl(ServerConfig config, std::vector<std::shared_ptr<ModelInstance>> models)
      : routes(config, std::move(models)),
        transport(limits_for(config), io_threads(),
                  [this](int status, const std::string& message) { return routes.transport_error(status, message); }) {
    routes.set_transport(&transport);
  }

  void add_listener(std::shared_ptr<ModelInstance> only, int port, const std::string& what) {
    Listener l;
    l.scope.only_model = std::move(only);
    const Routes::Scope scope = l.scope;
    l.port = transport.listen(
        routes.config().host, port, [this, scope](const HttpRequest& head) { return routes.check_head(scope, head); },
        [this, scope](std::shared_ptr<HttpExchange> exchange) { routes.handle(scope, std::move(exchange)); }, what);
    listeners.push_back(std::move(l));
  }
};

// ---------------------------------------------------------------------------------------
HttpServer::HttpServer(ServerConfig config, std::vector<std::shared_ptr<ModelInstance>> models)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(models))) {}

HttpServer::~HttpServer() {
  stop();
  if (impl_->background.joinable()) impl_->background.join();
  impl_->routes.stop_workers();
  impl_->routes.abort_jobs();
  impl_->transport.release();
}

void HttpServer::bind() {
  Impl& s = *impl_;
  s.add_listener(nullptr, s.routes.config().port, "server.port");
  for (const auto& m : s.routes.models()) {
    if (m->deploy().port == 0) continue;
    s.add_listener(m, m->deploy().port, fmt::format("model '{}' port", m->name()));
  }
}

void HttpServer::run() {
  Impl& s = *impl_;
  s.schedule_trim();
  s.transport.run();
  // Stopped: requests being parsed finish, then every generation still running is cancelled.
  s.routes.stop_workers();
  s.routes.abort_jobs();
  // Then what connections and queued handlers still hold (a finished job's last callbacks)
  // ends here, while the transport exists.
  s.transport.release();
}

void HttpServer::start() {
  impl_->background = std::thread([this] { run(); });
  while (!impl_->transport.running() && !impl_->transport.stopped())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void HttpServer::stop() {
  impl_->routes.wake_drain();
  impl_->transport.stop();
}

void HttpServer::drain_and_stop(double grace_s) {
  Impl& s = *impl_;
  s.routes.begin_drain();
  LOG_INFO("draining: {} request(s) in flight, waiting up to {} s", s.routes.in_flight(), grace_s);
  s.routes.wait_idle(grace_s);
  if (s.routes.in_flight() > 0) LOG_WARN("drain over; cancelling {} request(s) unfinished", s.routes.in_flight());
  stop();
}

bool HttpServer::draining() const { return impl_->routes.draining(); }
int64_t HttpServer::in_flight() const { return impl_->routes.in_flight(); }
int HttpServer::port() const { return impl_->listeners.empty() ? 0 : impl_->listeners[0].port; }

int HttpServer::model_port(const std::string& name) const {
  for (const auto& l : impl_->listeners) {
    if (l.scope.only_model && l.scope.only_model->name() == name) return l.port;
  }
  return 0;
}

}  // namespace infera::server
