// The web console (docs/server.md, "Web console"): the chat page (GET /), the status page
// (GET /status) and their scripts and styles (GET /console/NAME), compiled into the binary
// from web/ at build time (cmake/embed_web.cmake; nothing is read from disk or fetched
// from elsewhere at run time), and the JSON the status page polls (GET /v1/stats).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/server/deploy_config.h"
#include "infera/server/http_transport.h"
#include "infera/server/metrics.h"
#include "infera/server/model_instance.h"

namespace infera::server {

// One file of web/, as generated into the build (web_assets.cpp).
struct WebAsset {
  std::string_view name;  // file name under web/
  std::string_view content_type;
  std::string_view etag;  // "\"<first 16 hex digits of the SHA-256>\""
  std::string_view body;
};
// Every file of web/, sorted by name.
std::span<const WebAsset> web_assets();

// The asset a GET path names: "/" index.html, "/status" status.html, "/console/NAME" the
// file NAME; null for anything else.
const WebAsset* find_web_asset(std::string_view path);

// The Content-Security-Policy every console page is served with: only the server's own
// scripts, styles and JSON; no inline script or style, no frames, no plugins.
extern const char* const kConsoleCsp;

// The asset with its headers (CSP, nosniff, frame denial, ETag, Cache-Control: no-cache),
// or 304 without a body when the request's If-None-Match names its ETag.
HttpResponse web_asset_response(const WebAsset& asset, const HttpRequest& request);

// Bytes of the weight files a model path names: a GGUF file's (every part of a split one), or
// the *.safetensors and *.gguf files of a directory.
int64_t weight_file_bytes(const std::string& path);

// The JSON of GET /v1/stats: per model its state (with the failure's reason), layout,
// limits, engine gauges, expert load and the request counters of /metrics, and a server
// section (uptime, version, build, kernel path, memory against the plan).
class ConsoleStats {
 public:
  // Reads what does not change while serving (weight file sizes, quantization) once.
  ConsoleStats(const ServerConfig& config, const std::vector<std::shared_ptr<ModelInstance>>& models);
  // `visible`: the models this caller may see (the listener's, the key's).
  nlohmann::json render(const std::vector<std::shared_ptr<ModelInstance>>& visible, const Metrics& metrics,
                        bool draining, int64_t in_flight) const;

 private:
  struct Facts {
    int64_t weights_bytes = 0;  // the weight files of the directory it loads
    std::string quantization;  // "w4a8 g32", "bf16 (unquantized)", ...
  };
  std::chrono::steady_clock::time_point start_;
  bool keys_ = false;
  std::map<std::string, Facts> facts_;  // by model name
  int64_t planned_bytes_ = 0;  // weights + KV budgets of every model
};

}  // namespace infera::server
