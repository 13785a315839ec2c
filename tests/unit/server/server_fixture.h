// What the HTTP server tests share: a stories260K model instance with the ChatML template,
// a server started on a free loopback port, and a client for it.
#pragma once

#include <httplib.h>
#include <signal.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../test_support.h"
#include "infera/chat/chat_template.h"
#include "infera/model/config.h"
#include "infera/server/http_server.h"
#include "infera/server/model_instance.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera::server::testing {

inline const std::string& stories_path() {
  static const std::string dir = test::stories_dir();
  return dir;
}

inline const std::string& chatml_path() {
  static const std::string path = std::string(INFERA_SOURCE_DIR) + "/tests/conformance/data/chatml.jinja";
  return path;
}

// Writing to a socket the client closed must not end the test process.
inline void ignore_sigpipe() {
  static const bool ignored = [] {
    ::signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)ignored;
}

// The stories260K model as `d` deploys it (d.path is set here), with the ChatML template and
// the limits a 512-token context resolves to; no backend yet.
inline std::shared_ptr<ModelInstance> stories_instance(ModelDeployConfig d) {
  d.path = stories_path();
  return std::make_shared<ModelInstance>(d, load_model_config(stories_path()), Tokenizer::load(stories_path()),
                                         std::make_unique<ChatTemplate>(test::slurp(chatml_path())),
                                         resolve_limits(d, 512));
}
inline std::shared_ptr<ModelInstance> stories_instance(const std::string& name) {
  ModelDeployConfig d;
  d.name = name;
  return stories_instance(std::move(d));
}

// A server for `models` on a free loopback port (c.port is set here), bound and started.
inline std::unique_ptr<HttpServer> start_server(ServerConfig c, std::vector<std::shared_ptr<ModelInstance>> models) {
  ignore_sigpipe();
  c.port = 0;
  auto server = std::make_unique<HttpServer>(c, std::move(models));
  server->bind();
  server->start();
  return server;
}

inline httplib::Client local_client(int port, int read_timeout_s = 30) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(read_timeout_s, 0);
  return c;
}

}  // namespace infera::server::testing
