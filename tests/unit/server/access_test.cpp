// Access control of the HTTP server over loopback with a scripted backend: per-key
// admission (tokens reserved up front and refunded, every choice a request, /tokenize and
// /detokenize limited, requests in flight capped), /metrics behind the keys, no model
// names revealed to keys that may not use them, a model's own port listing only it, and
// the browser guard of a server without keys (Host, Origin, Content-Type).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "fake_backend.h"
#include "infera/chat/chat_template.h"
#include "infera/server/http_server.h"
#include "server_fixture.h"

namespace infera::server {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using namespace std::chrono_literals;
using test::free_port;
using test::wait_for;

const std::string kStories = test::stories_dir();
const json kChat = {{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}};

struct Options {
  std::vector<ApiKeyConfig> keys;
  int32_t default_concurrency = 32;
  std::vector<std::string> allowed_hosts, allowed_origins;
  std::chrono::milliseconds delay = 1ms;
  bool second_model_port = false;
};

class Server {
 public:
  explicit Server(const Options& o) {
    Tokenizer tok = Tokenizer::load(kStories);
    backend = std::make_shared<FakeBackend>(tok.encode("Once upon a time there was a cat.", false), o.delay);
    std::vector<std::shared_ptr<ModelInstance>> models;
    for (const char* name : {"stories", "other"}) {
      ModelDeployConfig d;
      d.name = name;
      if (std::string(name) == "other" && o.second_model_port) d.port = free_port();
      auto m = testing::stories_instance(d);
      m->set_backend(backend);
      models.push_back(m);
    }
    ServerConfig c;
    c.api_keys = o.keys;
    c.max_concurrent_requests_per_key = o.default_concurrency;
    c.allowed_hosts = o.allowed_hosts;
    c.allowed_origins = o.allowed_origins;
    server = testing::start_server(c, models);
  }
  ~Server() { server->stop(); }

  httplib::Client client(int port = 0) const {
    httplib::Client c = testing::local_client(port ? port : server->port());
    return c;
  }
  httplib::Result post(const std::string& path, const json& body, const std::string& key = "") const {
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    return client().Post(path.c_str(), h, body.dump(), "application/json");
  }
  httplib::Result get(const std::string& path, const std::string& key = "", int port = 0) const {
    httplib::Headers h;
    if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
    return client(port).Get(path.c_str(), h);
  }

  std::shared_ptr<FakeBackend> backend;
  std::unique_ptr<HttpServer> server;
};

ApiKeyConfig key(std::string id, std::string secret, double rpm, double tpm, std::optional<int32_t> conc = std::nullopt,
                 std::vector<std::string> models = {}) {
  return ApiKeyConfig{std::move(id), std::move(secret), std::move(models), rpm, tpm, conc};
}

json with(json base, const json& extra) {
  for (auto& [k, v] : extra.items()) base[k] = v;
  return base;
}

std::string code_of(const httplib::Result& r) {
  if (!r) return "no response";
  const json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"]["code"].is_string()) return "";
  return j["error"]["code"];
}

// Sends raw bytes and returns everything the server wrote until it closed (or 3 s passed).
std::string raw_exchange(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "";
  }
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (int i = 0; i < 1000; ++i) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST(Access, TokensAreReservedAtAdmissionSoABurstGetsItsBudget) {
  INFERA_REQUIRE_FIXTURE(kStories);
  // 500 tokens a minute; each request may use its prompt (~13 tokens) + 100.
  Options o;
  o.keys = {key("k", "burst-key-000", 0, 500)};
  o.delay = 5ms;
  Server s(o);
  const json body = with(kChat, {{"max_tokens", 100}});
  std::atomic<int> ok{0}, limited{0};
  std::vector<std::thread> clients;
  // The backend holds every admitted request until all 12 are answered or admitted, so none
  // finishes (and refunds its reservation) while the burst is still arriving.
  s.backend->set_paused(true);
  for (int i = 0; i < 12; ++i) {
    clients.emplace_back([&] {
      auto r = s.post("/v1/chat/completions", body, "burst-key-000");
      if (r && r->status == 200)
        ++ok;
      else if (r && r->status == 429 && code_of(r) == "rate_limit_exceeded")
        ++limited;
      else
        ADD_FAILURE() << (r ? r->body : "no response");
    });
  }
  EXPECT_TRUE(wait_for([&] { return limited.load() + static_cast<int>(s.backend->submitted()) == 12; }, 60000ms));
  s.backend->set_paused(false);
  for (auto& t : clients) t.join();
  EXPECT_GE(ok.load(), 1);
  EXPECT_LE(ok.load(), 4) << "admitted past the budget: charging only at the end lets a burst through";
  EXPECT_EQ(ok + limited, 12);
  // The script is 9 tokens: each admitted request used ~22 of its ~113. The rest came
  // back, so another request fits now (without the refund the bucket would be empty).
  auto r = s.post("/v1/chat/completions", body, "burst-key-000");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // A request that may use more than is left is refused with the numbers and Retry-After.
  auto big = s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 400}}), "burst-key-000");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 429);
  EXPECT_NE(big->body.find("tokens per minute"), std::string::npos) << big->body;
  EXPECT_GE(std::stoi(big->get_header_value("Retry-After")), 1);
}

TEST(Access, EveryChoiceCountsAsARequest) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {key("k", "choices-key-0", 4, 0)};
  Server s(o);
  EXPECT_EQ(s.post("/v1/chat/completions", with(kChat, {{"n", 3}}), "choices-key-0")->status, 200);
  auto r = s.post("/v1/chat/completions", with(kChat, {{"n", 2}}), "choices-key-0");
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(code_of(r), "rate_limit_exceeded");
  EXPECT_EQ(s.post("/v1/chat/completions", kChat, "choices-key-0")->status, 200);
  // Completions: every prompt times n.
  Options o2;
  o2.keys = {key("k", "choices-key-1", 5, 0)};
  Server s2(o2);
  const json two_prompts = {{"model", "stories"}, {"prompt", {"Once", "Upon"}}, {"n", 2}, {"max_tokens", 2}};
  EXPECT_EQ(s2.post("/v1/completions", two_prompts, "choices-key-1")->status, 200);
  EXPECT_EQ(s2.post("/v1/completions", two_prompts, "choices-key-1")->status, 429);
}

TEST(Access, TokenizeAndDetokenizeAreLimited) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {key("k", "tokenize-key-0", 3, 0)};
  Server s(o);
  EXPECT_EQ(s.post("/tokenize", {{"model", "stories"}, {"prompt", "Once upon a time"}}, "tokenize-key-0")->status, 200);
  EXPECT_EQ(s.post("/detokenize", {{"model", "stories"}, {"tokens", {1, 2, 3}}}, "tokenize-key-0")->status, 200);
  EXPECT_EQ(s.post("/tokenize", {{"model", "stories"}, {"prompt", "x"}}, "tokenize-key-0")->status, 200);
  auto r = s.post("/tokenize", {{"model", "stories"}, {"prompt", "x"}}, "tokenize-key-0");
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(code_of(r), "rate_limit_exceeded");
  EXPECT_EQ(s.post("/detokenize", {{"model", "stories"}, {"tokens", {1}}}, "tokenize-key-0")->status, 429);

  // Tokens: /tokenize charges the tokens it produced (reserving a byte each first).
  Options t;
  t.keys = {key("k", "tokenize-key-1", 0, 100)};
  Server st(t);
  EXPECT_EQ(st.post("/tokenize", {{"model", "stories"}, {"prompt", std::string(80, 'a')}}, "tokenize-key-1")->status,
            200);
  EXPECT_EQ(st.post("/tokenize", {{"model", "stories"}, {"prompt", std::string(500, 'a')}}, "tokenize-key-1")->status,
            429);
}

TEST(Access, RequestsInFlightPerKeyAreCapped) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {key("capped", "capped-key-00", 0, 0, 2), key("free", "free-key-0000", 0, 0, 0),
            key("dflt", "default-key-0", 0, 0)};
  o.default_concurrency = 1;
  o.delay = 2ms;
  Server s(o);
  s.backend->set_paused(true);
  std::vector<std::thread> held;
  std::atomic<int> done_ok{0};
  for (const char* k : {"capped-key-00", "capped-key-00", "default-key-0"}) {
    held.emplace_back([&, k] {
      auto r = s.post("/v1/chat/completions", kChat, k);
      if (r && r->status == 200) ++done_ok;
    });
  }
  ASSERT_TRUE(wait_for([&] { return s.backend->submitted() == 3; }));
  auto r = s.post("/v1/chat/completions", kChat, "capped-key-00");
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(code_of(r), "rate_limit_exceeded");
  EXPECT_NE(r->body.find("in flight"), std::string::npos) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(s.post("/v1/chat/completions", kChat, "default-key-0")->status, 429) << "the server's default cap (1)";
  EXPECT_EQ(s.post("/tokenize", {{"model", "stories"}, {"prompt", "x"}}, "capped-key-00")->status, 429);
  // Another key is not affected; 0 is unlimited.
  std::vector<std::thread> more;
  for (int i = 0; i < 4; ++i) {
    more.emplace_back([&] {
      auto r2 = s.post("/v1/chat/completions", kChat, "free-key-0000");
      if (r2 && r2->status == 200) ++done_ok;
    });
  }
  ASSERT_TRUE(wait_for([&] { return s.backend->submitted() == 7; }));
  s.backend->set_paused(false);
  for (auto& t : held) t.join();
  for (auto& t : more) t.join();
  EXPECT_EQ(done_ok.load(), 7);
  EXPECT_EQ(s.post("/v1/chat/completions", kChat, "capped-key-00")->status, 200) << "slots are given back";
}

TEST(Access, StreamsHoldTheirSlotUntilTheyEnd) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {key("k", "stream-key-00", 0, 0, 1)};
  Server s(o);
  s.backend->set_paused(true);
  std::thread stream([&] { (void)s.post("/v1/chat/completions", with(kChat, {{"stream", true}}), "stream-key-00"); });
  ASSERT_TRUE(wait_for([&] { return s.backend->submitted() == 1; }));
  EXPECT_EQ(s.post("/v1/chat/completions", kChat, "stream-key-00")->status, 429);
  s.backend->set_paused(false);
  stream.join();
  EXPECT_TRUE(wait_for([&] { return s.server->in_flight() == 0; }));
  EXPECT_EQ(s.post("/v1/chat/completions", kChat, "stream-key-00")->status, 200);
}

TEST(Access, ModelsAKeyMayNotUseLookLikeModelsThatDoNotExist) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {key("k", "only-other-key", 0, 0, std::nullopt, {"other"})};
  Server s(o);
  auto hidden = s.post("/v1/chat/completions", kChat, "only-other-key");
  auto missing = s.post("/v1/chat/completions", with(kChat, {{"model", "nope"}}), "only-other-key");
  ASSERT_TRUE(hidden && missing);
  EXPECT_EQ(hidden->status, 404);
  EXPECT_EQ(missing->status, 404);
  json h = json::parse(hidden->body), m = json::parse(missing->body);
  EXPECT_EQ(h["error"]["code"], "model_not_found");
  // Same answer but for the name the client itself sent.
  std::string hm = h["error"]["message"], mm = m["error"]["message"];
  hm.replace(hm.find("stories"), 7, "NAME");
  mm.replace(mm.find("nope"), 4, "NAME");
  EXPECT_EQ(hm, mm);
  h["error"].erase("message");
  m["error"].erase("message");
  EXPECT_EQ(h, m);
  EXPECT_EQ(s.post("/tokenize", {{"model", "stories"}, {"prompt", "x"}}, "only-other-key")->status, 404);
  EXPECT_EQ(s.post("/v1/chat/completions", with(kChat, {{"model", "other"}}), "only-other-key")->status, 200);
}

TEST(Access, MetricsNeedAKeyWhenKeysAreConfigured) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {key("k", "metrics-key-0", 0, 0)};
  Server s(o);
  auto none = s.get("/metrics");
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(code_of(none), "missing_api_key");
  EXPECT_EQ(s.get("/metrics", "wrong-key-0000")->status, 401);
  auto ok = s.get("/metrics", "metrics-key-0");
  EXPECT_EQ(ok->status, 200);
  EXPECT_NE(ok->body.find("infera_requests_total"), std::string::npos);
  EXPECT_EQ(s.get("/health")->status, 200);
  EXPECT_EQ(s.get("/ready")->status, 200);
  // Without keys /metrics stays open.
  Server open_server(Options{});
  EXPECT_EQ(open_server.get("/metrics")->status, 200);
}

TEST(Access, AModelsOwnPortListsOnlyThatModel) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.second_model_port = true;
  Server s(o);
  const int port = s.server->model_port("other");
  ASSERT_GT(port, 0);
  auto all = json::parse(s.get("/v1/models")->body);
  EXPECT_EQ(all["data"].size(), 2u);
  auto own = json::parse(s.get("/v1/models", "", port)->body);
  ASSERT_EQ(own["data"].size(), 1u);
  EXPECT_EQ(own["data"][0]["id"], "other");
  auto ready = json::parse(s.get("/ready", "", port)->body);
  EXPECT_EQ(ready["models"].size(), 1u);
  httplib::Client c("127.0.0.1", port);
  auto r = c.Post("/v1/chat/completions", kChat.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << "another model's name on a model's own port";
}

TEST(Access, KeylessServerRefusesBrowserRequests) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s(Options{});
  httplib::Client c = s.client();
  // A text/plain "simple request" a web page can send without a preflight.
  auto plain = c.Post("/v1/chat/completions", kChat.dump(), "text/plain");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 415);
  EXPECT_EQ(code_of(plain), "unsupported_media_type");
  EXPECT_EQ(c.Post("/tokenize", R"({"prompt":"x"})", "application/x-www-form-urlencoded")->status, 415);
  // DNS rebinding: the page's own name in Host.
  auto rebound = c.Get("/v1/models", {{"Host", "attacker.example:8000"}});
  EXPECT_EQ(rebound->status, 403);
  EXPECT_EQ(code_of(rebound), "host_not_allowed");
  // A cross-origin page.
  auto cross =
      c.Post("/v1/chat/completions", {{"Origin", "http://attacker.example"}}, kChat.dump(), "application/json");
  EXPECT_EQ(cross->status, 403);
  EXPECT_EQ(code_of(cross), "origin_not_allowed");
  // Probes stay open; ordinary clients work.
  EXPECT_EQ(c.Get("/health", {{"Host", "pod.cluster.local"}})->status, 200);
  EXPECT_EQ(c.Get("/ready", {{"Host", "pod.cluster.local"}})->status, 200);
  EXPECT_EQ(c.Post("/v1/chat/completions", kChat.dump(), "application/json; charset=utf-8")->status, 200);
  const std::string own = "http://127.0.0.1:" + std::to_string(s.server->port());
  EXPECT_EQ(c.Post("/v1/chat/completions", {{"Origin", own}}, kChat.dump(), "application/json")->status, 200);
  // The refused body is never read: its bytes are not taken as a second request.
  const std::string inner = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const std::string smuggle =
      "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: " +
      std::to_string(inner.size()) + "\r\n\r\n" + inner;
  const std::string answer = raw_exchange(s.server->port(), smuggle);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 415")) << answer;
  EXPECT_EQ(answer.find("\"status\":\"ok\""), std::string::npos) << answer;
}

TEST(Access, ConfiguredHostsAndOrigins) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.allowed_hosts = {"infera.internal"};
  o.allowed_origins = {"http://localhost:3000"};
  Server s(o);
  httplib::Client c = s.client();
  EXPECT_EQ(c.Get("/v1/models", {{"Host", "infera.internal:8000"}})->status, 200);
  EXPECT_EQ(c.Get("/v1/models", {{"Host", "other.internal:8000"}})->status, 403);
  EXPECT_EQ(
      c.Post("/v1/chat/completions", {{"Origin", "http://localhost:3000"}}, kChat.dump(), "application/json")->status,
      200);
  EXPECT_EQ(
      c.Post("/v1/chat/completions", {{"Origin", "http://localhost:3001"}}, kChat.dump(), "application/json")->status,
      403);
}

TEST(Access, KeysTurnTheBrowserGuardOff) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {key("k", "guard-key-000", 0, 0)};
  Server s(o);
  httplib::Client c = s.client();
  auto r = c.Post("/v1/chat/completions", {{"Authorization", "Bearer guard-key-000"}, {"Host", "api.example.com"}},
                  kChat.dump(), "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

}  // namespace
}  // namespace infera::server
