// The web console: the files of web/ compiled in (content types, CSP and caching headers,
// 304 revalidation, no inline script or style), the routes GET /, /status, /console/NAME
// and /v1/stats (its JSON against /metrics, keys, the browser guard, a failed model's
// reason, expert load, a loading model's progress), and --no-console / server.console
// turning all of it off.
// tests/browser/console.mjs drives the pages in a real browser.
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>
#include <filesystem>
#include <fstream>

#include <condition_variable>
#include <mutex>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "fake_backend.h"
#include "infera/base/load_progress.h"
#include "infera/chat/chat_template.h"
#include "infera/model/model.h"
#include "infera/server/console.h"
#include "infera/server/http_server.h"
#include "server_fixture.h"

namespace infera::server {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using namespace std::chrono_literals;
using test::slurp;
using test::wait_for;

const std::string kStories = test::stories_dir();
const std::string kChatml = std::string(INFERA_SOURCE_DIR) + "/tests/conformance/data/chatml.jinja";

TEST(WebAssets, EveryPageAndScriptIsCompiledInWithItsType) {
  for (const char* name : {"index.html", "status.html", "chat.js", "status.js", "common.js", "markdown.js",
                           "console.css", "favicon.svg"}) {
    const WebAsset* a = find_web_asset(std::string("/console/") + name);
    ASSERT_NE(a, nullptr) << name;
    EXPECT_FALSE(a->body.empty()) << name;
    EXPECT_TRUE(a->etag.starts_with('"') && a->etag.ends_with('"') && a->etag.size() == 18) << a->etag;
  }
  EXPECT_EQ(find_web_asset("/")->name, "index.html");
  EXPECT_EQ(find_web_asset("/status")->name, "status.html");
  EXPECT_EQ(find_web_asset("/console/chat.js")->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(find_web_asset("/console/console.css")->content_type, "text/css; charset=utf-8");
  EXPECT_EQ(find_web_asset("/")->content_type, "text/html; charset=utf-8");
  EXPECT_EQ(find_web_asset("/console/favicon.svg")->content_type, "image/svg+xml");
  for (const char* path : {"/console/", "/console", "/console/../status.html", "/console/nope.js", "/index.html",
                           "/status/", "//", "/v1/chat/completions"}) {
    EXPECT_EQ(find_web_asset(path), nullptr) << path;
  }
}

TEST(WebAssets, PagesHaveNoInlineScriptStyleOrHandlers) {
  // The CSP forbids them; a page that used them would break, so none may be there.
  const std::regex inline_script(R"(<script(?![^>]*\bsrc=)[^>]*>)", std::regex::icase);
  const std::regex style_attr(R"(<[^>]+\sstyle\s*=)", std::regex::icase);
  const std::regex handler_attr(R"(<[^>]+\son[a-z]+\s*=)", std::regex::icase);
  for (const WebAsset& a : web_assets()) {
    if (!a.name.ends_with(".html")) continue;
    const std::string body(a.body);
    EXPECT_FALSE(std::regex_search(body, inline_script)) << a.name;
    EXPECT_FALSE(std::regex_search(body, style_attr)) << a.name;
    EXPECT_FALSE(std::regex_search(body, handler_attr)) << a.name;
    EXPECT_EQ(body.find("<style"), std::string::npos) << a.name;
    EXPECT_EQ(body.find("http://"), std::string::npos) << a.name << ": nothing from elsewhere";
    EXPECT_EQ(body.find("https://"), std::string::npos) << a.name << ": nothing from elsewhere";
  }
  for (const WebAsset& a : web_assets()) {  // scripts never parse model text as HTML
    if (!a.name.ends_with(".js")) continue;
    const std::string body(a.body);
    EXPECT_EQ(body.find("innerHTML"), std::string::npos) << a.name;
    EXPECT_EQ(body.find("insertAdjacentHTML"), std::string::npos) << a.name;
    EXPECT_EQ(body.find("document.write"), std::string::npos) << a.name;
    EXPECT_EQ(body.find("eval("), std::string::npos) << a.name;
  }
}

std::string header(const HttpResponse& r, const std::string& name) {
  for (const auto& h : r.headers) {
    if (h.name == name) return h.value;
  }
  return "";
}

TEST(WebAssets, HeadersAndRevalidation) {
  const WebAsset& a = *find_web_asset("/");
  HttpRequest req;
  req.method = "GET";
  req.path = "/";
  HttpResponse r = web_asset_response(a, req);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, a.body);
  EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
  const std::string csp = header(r, "Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'self'"), std::string::npos);
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos);
  EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos);
  EXPECT_EQ(csp.find("unsafe-eval"), std::string::npos);
  EXPECT_EQ(header(r, "X-Content-Type-Options"), "nosniff");
  EXPECT_EQ(header(r, "ETag"), a.etag);
  EXPECT_EQ(header(r, "Cache-Control"), "no-cache");

  req.headers.push_back({"If-None-Match", std::string(a.etag)});
  r = web_asset_response(a, req);
  EXPECT_EQ(r.status, 304);
  EXPECT_TRUE(r.body.empty());
  EXPECT_EQ(header(r, "ETag"), a.etag);
  req.headers[0].value = "\"other\", W/" + std::string(a.etag);
  EXPECT_EQ(web_asset_response(a, req).status, 304);
  req.headers[0].value = "\"other\"";
  EXPECT_EQ(web_asset_response(a, req).status, 200);
}

// /v1/stats' weights_bytes: a GGUF model is a file, not a directory (every part of a split
// one counted), and a blob without the .gguf name is one by its magic.
TEST(ConsoleStatsFacts, WeightBytesOfDirectoriesAndGgufFiles) {
  test::TempDir d("infera_console_weights");
  const auto write = [&](const std::string& name, size_t bytes) {
    std::ofstream(d.file(name), std::ios::binary) << "GGUF" << std::string(bytes - 4, 'x');
  };
  write("model-00001-of-00002.gguf", 100);
  write("model-00002-of-00002.gguf", 50);
  write("sha256-0123", 70);
  write("model.safetensors", 30);
  write("README.md", 1000);
  EXPECT_EQ(weight_file_bytes(d.file("model-00002-of-00002.gguf")), 150);
  EXPECT_EQ(weight_file_bytes(d.file("sha256-0123")), 70);
  EXPECT_EQ(weight_file_bytes(d.path().string()), 100 + 50 + 30) << "a directory's *.gguf and *.safetensors";
  std::filesystem::remove(d.file("model-00001-of-00002.gguf"));
  EXPECT_EQ(weight_file_bytes(d.file("model-00002-of-00002.gguf")), 0) << "a part missing: it does not load";
}

TEST(ConsoleOption, DeployKeyAndFlagTurnItOff) {
  EXPECT_TRUE(parse_deploy_config("models:\n  - path: /m\n", "t").server.console);
  EXPECT_FALSE(parse_deploy_config("server:\n  console: false\nmodels:\n  - path: /m\n", "t").server.console);
  EXPECT_FALSE(
      deploy_config_from_settings({{"models[].path", {"/m"}}, {"server.console", {"false"}}}, "flags").server.console);
}

// A backend that reports expert load (the fake engine routes nothing).
class ExpertBackend final : public GenerationBackend {
 public:
  ExpertBackend(std::shared_ptr<FakeBackend> inner, std::vector<uint64_t> counts)
      : inner_(std::move(inner)), counts_(std::move(counts)) {}
  RequestId submit(Request r, EventCallback cb) override { return inner_->submit(std::move(r), std::move(cb)); }
  void cancel(RequestId id) override { inner_->cancel(id); }
  EngineStats stats() const override { return inner_->stats(); }
  std::vector<uint64_t> expert_counts() const override { return counts_; }

 private:
  std::shared_ptr<FakeBackend> inner_;
  std::vector<uint64_t> counts_;
};

struct Server {
  Server(bool console, std::vector<ApiKeyConfig> keys = {}) {
    static bool sigpipe_ignored = [] {
      ::signal(SIGPIPE, SIG_IGN);
      return true;
    }();
    (void)sigpipe_ignored;
    Tokenizer tok = Tokenizer::load(kStories);
    fake = std::make_shared<FakeBackend>(tok.encode("Once upon a time.", false), 1ms);
    std::vector<std::shared_ptr<ModelInstance>> models;
    for (const char* name : {"stories", "moe", "broken"}) {
      ModelDeployConfig d;
      d.name = name;
      d.path = kStories;
      ModelConfig mc = load_model_config(kStories);
      if (std::string(name) == "moe") {
        mc.num_experts = 4;
        mc.num_experts_per_tok = 2;
      }
      auto m = std::make_shared<ModelInstance>(d, mc, Tokenizer::load(kStories),
                                               std::make_unique<ChatTemplate>(slurp(kChatml)), resolve_limits(d, 512));
      if (std::string(name) == "stories") m->set_backend(fake);
      if (std::string(name) == "moe") {
        std::vector<uint64_t> counts(static_cast<size_t>(mc.num_layers) * 4, 0);
        counts[0] = 30;  // layer 0: expert 0 takes most
        counts[1] = 10;
        counts[4 + 2] = 5;  // layer 1
        m->set_backend(std::make_shared<ExpertBackend>(fake, counts));
      }
      if (std::string(name) == "broken") m->set_failed("model.safetensors: truncated file");
      models.push_back(m);
    }
    ServerConfig c;
    c.port = 0;
    c.console = console;
    c.api_keys = std::move(keys);
    server = std::make_unique<HttpServer>(c, models);
    server->bind();
    server->start();
  }
  ~Server() { server->stop(); }
  httplib::Result get(const std::string& path, httplib::Headers h = {}) const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(10, 0);
    return c.Get(path.c_str(), h);
  }
  std::shared_ptr<FakeBackend> fake;
  std::unique_ptr<HttpServer> server;
};

TEST(ConsoleRoutes, PagesAndStats) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s(true);
  for (const char* path : {"/", "/status", "/console/chat.js", "/console/console.css"}) {
    auto r = s.get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_EQ(r->body, find_web_asset(path)->body) << path;
    EXPECT_EQ(r->get_header_value("Content-Type"), find_web_asset(path)->content_type);
    EXPECT_NE(r->get_header_value("Content-Security-Policy").find("default-src 'self'"), std::string::npos);
    EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff");
  }
  httplib::Client head_client("127.0.0.1", s.server->port());
  auto h = head_client.Head("/status");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_TRUE(h->body.empty());
  EXPECT_EQ(h->get_header_value("Content-Length"), std::to_string(find_web_asset("/status")->body.size()));
  auto r = s.get("/console/chat.js", {{"If-None-Match", std::string(find_web_asset("/console/chat.js")->etag)}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 304);
  EXPECT_EQ(s.get("/console/missing.js")->status, 404);
  // Pages are static and public: any Host may fetch them; the JSON keeps the guard.
  EXPECT_EQ(s.get("/", {{"Host", "rebound.example"}})->status, 200);
  EXPECT_EQ(s.get("/v1/stats", {{"Host", "rebound.example"}})->status, 403);
  EXPECT_EQ(s.get("/v1/stats", {{"Origin", "http://attacker.example"}})->status, 403);

  // Two requests, then /v1/stats shows the same counters as /metrics.
  httplib::Client c("127.0.0.1", s.server->port());
  const json chat = {{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}};
  for (int i = 0; i < 2; ++i) ASSERT_EQ(c.Post("/v1/chat/completions", chat.dump(), "application/json")->status, 200);
  // A request is counted just after its client has the response.
  EXPECT_TRUE(wait_for([&] {
    r = s.get("/v1/stats");
    return r && r->status == 200 && json::parse(r->body)["models"][0]["counters"]["ttft"]["count"] == 2;
  }));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Cache-Control"), "no-store");
  const json j = json::parse(r->body);
  ASSERT_EQ(j["models"].size(), 3u);
  const json& m = j["models"][0];
  EXPECT_EQ(m["name"], "stories");
  EXPECT_EQ(m["state"], "ready");
  EXPECT_EQ(m["architecture"], "llama");
  EXPECT_EQ(m["counters"]["requests"]["200"], 2);
  const std::string metrics = s.get("/metrics")->body;
  EXPECT_NE(metrics.find(fmt::format("infera_generation_tokens_total{{model=\"stories\"}} {}",
                                     m["counters"]["generation_tokens"].get<int64_t>())),
            std::string::npos);
  EXPECT_EQ(m["counters"]["ttft"]["count"], 2);
  EXPECT_EQ(m["counters"]["ttft"]["buckets"].back(), 2);
  EXPECT_EQ(m["counters"]["ttft"]["bounds"].size() + 1, m["counters"]["ttft"]["buckets"].size());
  EXPECT_TRUE(m.contains("engine"));
  EXPECT_EQ(m["limits"]["max_context"], 512);
  EXPECT_FALSE(m.contains("expert_load"));  // dense
  const json& moe = j["models"][1];
  ASSERT_TRUE(moe.contains("expert_load")) << moe.dump();
  EXPECT_EQ(moe["expert_load"][0]["layer"], 0);
  EXPECT_EQ(moe["expert_load"][0]["tokens"], json({30, 10, 0, 0}));
  EXPECT_EQ(moe["expert_load"][1]["tokens"], json({0, 0, 5, 0}));
  const json& broken = j["models"][2];
  EXPECT_EQ(broken["state"], "failed");
  EXPECT_EQ(broken["failure"], "model.safetensors: truncated file");
  EXPECT_FALSE(broken.contains("engine"));
  const json& server = j["server"];
  EXPECT_FALSE(server["version"].get<std::string>().empty());
  EXPECT_GE(server["uptime_s"].get<double>(), 0.0);
  EXPECT_TRUE(server["kernel_path"] == "avx512" || server["kernel_path"] == "avx2" ||
              server["kernel_path"] == "scalar");
  EXPECT_GT(server["memory"]["rss_bytes"].get<int64_t>(), 0);
  EXPECT_GT(server["memory"]["planned_bytes"].get<int64_t>(), 0);
  EXPECT_FALSE(server["api_keys"].get<bool>());
}

TEST(ConsoleRoutes, StatsShowALoadingModelsProgress) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // A loader that reports a quarter of its one step, then waits until the test lets it go.
  std::mutex mutex;
  std::condition_variable cv;
  bool release = false;
  auto instance = testing::stories_instance("slow");
  instance->set_model_loader([&](const std::string& dir, const LoadOptions& options) {
    options.progress->plan(1);
    options.progress->begin("binding", 1000);
    options.progress->advance(250);
    {
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return release; });
    }
    options.progress->advance(750);
    options.progress->end();
    LoadOptions plain = options;
    plain.progress.reset();
    return load_model(dir, plain);
  });
  ServerConfig c;
  c.console = true;
  auto server = testing::start_server(c, {instance});
  httplib::Client client = testing::local_client(server->port());
  std::thread loader([&] { instance->load(); });
  struct Release {  // lets the loader go however the test ends
    std::mutex& m;
    std::condition_variable& cv;
    bool& release;
    std::thread& loader;
    ~Release() {
      {
        std::lock_guard lock(m);
        release = true;
      }
      cv.notify_all();
      loader.join();
    }
  } releaser{mutex, cv, release, loader};

  json model;
  auto stats = [&] {
    auto r = client.Get("/v1/stats");
    if (!r || r->status != 200) return false;
    model = json::parse(r->body)["models"][0];
    return true;
  };
  // Loader step 1 of 2 (then the engine starts) a quarter done: an eighth of the whole.
  EXPECT_TRUE(wait_for([&] { return stats() && model["load_progress"]["step_done"] == 250; })) << model.dump();
  EXPECT_EQ(model["state"], "loading");
  EXPECT_EQ(model["load_progress"]["step"], "binding");
  EXPECT_EQ(model["load_progress"]["step_total"], 1000);
  EXPECT_EQ(model["load_progress"]["steps_done"], 0);
  EXPECT_EQ(model["load_progress"]["steps"], 2);
  EXPECT_DOUBLE_EQ(model["load_progress"]["fraction"].get<double>(), 0.125);
  EXPECT_NE(client.Get("/metrics")->body.find("infera_model_load_progress{model=\"slow\"} 0.125\n"), std::string::npos);
  EXPECT_EQ(client.Get("/ready")->status, 503);  // unchanged: not ready while loading

  {
    std::lock_guard lock(mutex);
    release = true;
  }
  cv.notify_all();
  EXPECT_TRUE(wait_for([&] { return stats() && model["state"] == "ready"; }, 60s)) << model.dump();
  EXPECT_EQ(model["load_progress"]["fraction"], 1.0);
  EXPECT_EQ(model["load_progress"]["step"], "starting");
  EXPECT_EQ(model["load_progress"]["steps_done"], 2);
  EXPECT_NE(client.Get("/metrics")->body.find("infera_model_load_progress{model=\"slow\"} 1\n"), std::string::npos);
  EXPECT_EQ(client.Get("/ready")->status, 200);
}

TEST(ConsoleRoutes, NoConsoleServesNoneOfIt) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s(false);
  for (const char* path : {"/", "/status", "/console/chat.js", "/v1/stats"}) {
    auto r = s.get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
  }
  EXPECT_EQ(s.get("/v1/models")->status, 200);  // the API is unchanged
}

TEST(ConsoleRoutes, StatsNeedAKeyAndShowOnlyItsModels) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s(true, {ApiKeyConfig{"all", "console-key-all-0001", {}, 0, 0, std::nullopt},
                  ApiKeyConfig{"scoped", "console-key-scoped-01", {"moe"}, 0, 0, std::nullopt}});
  EXPECT_EQ(s.get("/")->status, 200);  // the page asks for the key itself
  EXPECT_EQ(s.get("/v1/stats")->status, 401);
  EXPECT_EQ(s.get("/v1/stats", {{"Authorization", "Bearer wrong-key-000000"}})->status, 401);
  auto r = s.get("/v1/stats", {{"Authorization", "Bearer console-key-all-0001"}});
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["models"].size(), 3u);
  EXPECT_TRUE(json::parse(r->body)["server"]["api_keys"].get<bool>());
  r = s.get("/v1/stats", {{"Authorization", "Bearer console-key-scoped-01"}});
  ASSERT_EQ(r->status, 200);
  const json j = json::parse(r->body);
  ASSERT_EQ(j["models"].size(), 1u);
  EXPECT_EQ(j["models"][0]["name"], "moe");
  // With keys the guard is off: the page answers any Host as before.
  EXPECT_EQ(s.get("/status", {{"Host", "console.example.com"}})->status, 200);
}

}  // namespace
}  // namespace infera::server
