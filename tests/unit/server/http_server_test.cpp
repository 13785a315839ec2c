// Black-box tests of the HTTP layer over loopback with a scripted backend (so stop
// strings, cancellation and concurrency are deterministic) and the real stories260K
// tokenizer and a ChatML template. Tests with the real engine are in
// tests/conformance/server_*.mjs.
#include "infera/server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "fake_backend.h"
#include "infera/chat/chat_template.h"
#include "infera/runtime/sequence_runner.h"
#include "infera/server/logprobs_json.h"
#include "server_fixture.h"

namespace infera::server {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using namespace std::chrono_literals;
using test::wait_for;

const std::string kStories = test::stories_dir();
const std::string kText = "Once upon a time, there was a little girl. The end is near.";

struct ServerOptions {
  std::vector<ApiKeyConfig> keys;
  int64_t body_limit = 1 << 20;
  std::string audit_log;
  bool audit_prompts = false;
  std::string script_text = kText;
  std::chrono::milliseconds delay = 1ms;
  double timeout_s = 30;
  bool load = true;
  bool two_models = false;
  bool real_engine = false;  // the first model runs the real engine on stories260K instead of the script
};

class TestServer {
 public:
  explicit TestServer(const ServerOptions& o = {}) {
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(kStories));
    script = tokenizer_->encode(o.script_text, false);
    backend = std::make_shared<FakeBackend>(script, o.delay);
    std::vector<std::shared_ptr<ModelInstance>> models;
    for (const char* name : {"stories", "other"}) {
      if (std::string(name) == "other" && !o.two_models) break;
      auto m = testing::stories_instance(name);
      if (o.load && o.real_engine && models.empty()) {
        EngineConfig ec;
        ec.kv_cache_bytes = 16 << 20;
        ec.max_batch_tokens = 256;
        ec.max_num_seqs = 8;
        ec.threads = 1;  // a tiny model: more threads would only spin
        LoadOptions lo;
        lo.max_batch_tokens = 256;
        m->set_backend(std::make_shared<EngineBackend>(std::make_unique<Engine>(load_model(kStories, lo), ec)));
      } else if (o.load) {
        m->set_backend(backend);
      }
      models.push_back(m);
    }
    model = models[0];
    ServerConfig c;
    c.api_keys = o.keys;
    c.body_limit_bytes = o.body_limit;
    c.audit_log_path = o.audit_log;
    c.audit_log_prompts = o.audit_prompts;
    c.request_timeout_s = o.timeout_s;
    server = testing::start_server(c, models);
  }
  ~TestServer() { server->stop(); }

  httplib::Client client() const { return testing::local_client(server->port()); }
  httplib::Result post(const std::string& path, const json& body, const httplib::Headers& headers = {}) const {
    return client().Post(path.c_str(), headers, body.dump(), "application/json");
  }
  std::string decode(std::span<const int32_t> ids) const { return tokenizer_->decode(ids); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  std::vector<int32_t> script;
  std::shared_ptr<FakeBackend> backend;
  std::shared_ptr<ModelInstance> model;
  std::unique_ptr<HttpServer> server;

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
};

const json kChat = {{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};

json with(json base, const json& extra) {
  for (auto& [k, v] : extra.items()) base[k] = v;
  return base;
}

// Splits an SSE body into its data payloads, checking the framing on the way.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event: " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (event.starts_with(":")) continue;  // comment (keep-alive)
    EXPECT_TRUE(event.starts_with("data: ")) << event;
    EXPECT_EQ(event.find('\n'), std::string::npos) << "one line per event: " << event;
    out.push_back(event.substr(6));
  }
  return out;
}

// Text of a streamed chat completion, after checking it ends with [DONE].
std::string streamed_text(const std::string& body, std::string* finish_reason = nullptr) {
  auto payloads = sse_payloads(body);
  EXPECT_FALSE(payloads.empty());
  if (payloads.empty()) return "";
  EXPECT_EQ(payloads.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < payloads.size(); ++i) {
    const json j = json::parse(payloads[i]);
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (c.contains("text")) text += c["text"].get<std::string>();
    if (finish_reason && !c["finish_reason"].is_null()) *finish_reason = c["finish_reason"];
  }
  return text;
}

void expect_error(const httplib::Result& r, int status, const char* code = nullptr) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  ASSERT_TRUE(j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("param"));
  EXPECT_TRUE(j["error"].contains("code"));
  if (code) {
    EXPECT_EQ(j["error"]["code"], code) << r->body;
  }
}

TEST(HttpServer, CompletionReturnsTheGeneratedText) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  auto r = s.post("/v1/completions", {{"model", "stories"}, {"prompt", "Once"}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "stories");
  EXPECT_EQ(j["choices"][0]["text"], s.decode(s.script));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], s.script.size());
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + s.script.size());
}

TEST(HttpServer, ChatAndModelsAndHealth) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  auto r = s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 5}}));
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["message"]["content"], s.decode(std::span(s.script).subspan(0, 5)));
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);

  auto models = s.client().Get("/v1/models");
  ASSERT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "stories");
  EXPECT_EQ(m["data"][0]["state"], "ready");
  EXPECT_EQ(s.client().Get("/health")->status, 200);
  EXPECT_EQ(s.client().Get("/ready")->status, 200);
}

TEST(HttpServer, StreamingFramingAndUsage) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  auto r =
      s.post("/v1/chat/completions", with(kChat, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::string finish;
  EXPECT_EQ(streamed_text(r->body, &finish), s.decode(s.script));
  EXPECT_EQ(finish, "stop");
  auto payloads = sse_payloads(r->body);
  const json first = json::parse(payloads.front());
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const json usage = json::parse(payloads[payloads.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], s.script.size());

  auto c = s.post("/v1/completions", {{"prompt", "x"}, {"stream", true}, {"max_tokens", 4}});
  ASSERT_EQ(c->status, 200);
  EXPECT_EQ(streamed_text(c->body, &finish), s.decode(std::span(s.script).subspan(0, 4)));
  EXPECT_EQ(finish, "length");
}

TEST(HttpServer, StopStringsSplitAcrossTokensAreNeverEmitted) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  // Pick stop strings that straddle token boundaries of the script.
  std::vector<std::string> pieces;
  for (int32_t id : s.script) pieces.push_back(s.decode(std::span(&id, 1)));
  const std::string full = s.decode(s.script);
  int checked = 0;
  for (size_t t = 2; t + 1 < s.script.size(); t += 3) {
    const std::string prefix = s.decode(std::span(s.script).subspan(0, t));
    // The last 2 characters of token t-1's text + the first 2 of token t's.
    const std::string after = full.substr(prefix.size());
    if (prefix.size() < 2 || after.size() < 2) continue;
    const std::string stop = prefix.substr(prefix.size() - 2) + after.substr(0, 2);
    const size_t first = full.find(stop);
    for (bool stream : {false, true}) {
      auto r = s.post("/v1/completions", {{"prompt", "x"}, {"stop", stop}, {"stream", stream}});
      ASSERT_EQ(r->status, 200);
      std::string text, finish;
      if (stream) {
        text = streamed_text(r->body, &finish);
      } else {
        const json j = json::parse(r->body);
        text = j["choices"][0]["text"];
        finish = j["choices"][0]["finish_reason"];
      }
      EXPECT_EQ(text, full.substr(0, first)) << "stop '" << stop << "'";
      EXPECT_EQ(finish, "stop");
      ++checked;
    }
  }
  EXPECT_GE(checked, 6);
  EXPECT_TRUE(wait_for([&] { return s.backend->live() == 0; }));
  EXPECT_GE(s.backend->cancels(), checked / 2);  // generation stopped early, not run to the end
}

TEST(HttpServer, SeveralChoicesWithDistinctSeeds) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  auto r = s.post("/v1/chat/completions", with(kChat, {{"n", 3}, {"seed", 7}, {"max_tokens", 3}}));
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);
  const auto seeds = s.backend->seeds();
  ASSERT_EQ(seeds.size(), 3u);
  EXPECT_EQ(std::set<uint64_t>(seeds.begin(), seeds.end()), (std::set<uint64_t>{7, 8, 9}));
}

// Opens a raw connection, sends a streaming request, reads the first bytes, and closes.
void start_stream_and_hang_up(int port, const std::string& body) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  char buf[512];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);  // headers / first chunk arrived
  ::close(fd);
}

TEST(HttpServer, ClientHangingUpCancelsItsGeneration) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.delay = 30ms;  // the script takes ~1 s per request
  TestServer s(o);
  start_stream_and_hang_up(s.server->port(), with(kChat, {{"stream", true}}).dump());
  EXPECT_TRUE(wait_for([&] { return s.backend->cancels() >= 1; })) << "no cancel after the client left";
  EXPECT_TRUE(wait_for([&] { return s.backend->live() == 0; }));
  EXPECT_TRUE(wait_for([&] { return s.server->in_flight() == 0; }));
  // And the server still serves.
  EXPECT_EQ(s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 2}}))->status, 200);
}

TEST(HttpServer, ThirtyTwoConcurrentStreams) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.delay = 2ms;
  TestServer s(o);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  const std::string expected = s.decode(s.script);
  for (int i = 0; i < 32; ++i) {
    clients.emplace_back([&] {
      auto r = s.post("/v1/chat/completions", with(kChat, {{"stream", true}}));
      if (r && r->status == 200 && streamed_text(r->body) == expected)
        ++ok;
      else if (!r)
        ADD_FAILURE() << "no response: " << httplib::to_string(r.error());
      else
        ADD_FAILURE() << r->status << " " << r->body.substr(0, 300);
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 32);
  EXPECT_EQ(s.backend->submitted(), 32);
  EXPECT_TRUE(wait_for([&] { return s.backend->live() == 0; }));
  // The handler leaves in_flight just after the client has read the last byte.
  EXPECT_TRUE(wait_for([&] { return s.server->in_flight() == 0; }));
}

TEST(HttpServer, ErrorsHaveTheOpenAiShape) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.body_limit = 4096;
  TestServer s(o);
  expect_error(s.post("/v1/chat/completions", with(kChat, {{"model", "nope"}})), 404, "model_not_found");
  expect_error(s.client().Post("/v1/chat/completions", "{oops", "application/json"), 400);
  expect_error(s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 100000}})), 400);
  expect_error(s.post("/v1/chat/completions",
                      with(kChat, {{"max_tokens", 400},
                                   {"messages", {{{"role", "user"}, {"content", std::string(1500, 'a')}}}}})),
               400);
  expect_error(s.post("/v1/completions", {{"prompt", std::vector<int>{1, 100000}}}), 400);
  expect_error(s.client().Post("/v1/chat/completions", std::string(8000, ' '), "application/json"), 413);
  expect_error(s.client().Get("/v1/nothing"), 404);
  // Overlong input names both numbers.
  auto r = s.post("/v1/completions", {{"prompt", std::string(3000, 'x') + " " + std::string(900, 'y')}});
  expect_error(r, 400, "context_length_exceeded");
  EXPECT_NE(r->body.find("512"), std::string::npos) << r->body;
  EXPECT_EQ(s.post("/v1/chat/completions", kChat)->status, 200);
}

TEST(HttpServer, ApiKeysPermissionsAndRateLimits) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.two_models = true;
  o.keys = {{"all", "all-models-key", {}, 0, 0, std::nullopt},
            {"only-other", "only-other-key", {"other"}, 0, 0, std::nullopt},
            {"slow", "slow-key-123", {}, 2, 0, std::nullopt}};
  o.audit_log =
      (std::filesystem::temp_directory_path() / ("infera_audit_" + std::to_string(::getpid()) + ".jsonl")).string();
  std::filesystem::remove(o.audit_log);
  {
    TestServer s(o);
    auto bearer = [](const std::string& k) { return httplib::Headers{{"Authorization", "Bearer " + k}}; };
    expect_error(s.post("/v1/chat/completions", kChat), 401, "missing_api_key");
    expect_error(s.post("/v1/chat/completions", kChat, bearer("wrong-key-000")), 401, "invalid_api_key");
    // A model the key may not use is answered as one that does not exist.
    expect_error(s.post("/v1/chat/completions", kChat, bearer("only-other-key")), 404, "model_not_found");
    EXPECT_EQ(s.post("/v1/chat/completions", with(kChat, {{"model", "other"}}), bearer("only-other-key"))->status, 200);
    EXPECT_EQ(s.post("/v1/chat/completions", kChat, bearer("all-models-key"))->status, 200);
    auto models = s.client().Get("/v1/models", bearer("only-other-key"));
    ASSERT_EQ(models->status, 200);
    EXPECT_EQ(json::parse(models->body)["data"].size(), 1u);
    EXPECT_EQ(s.post("/v1/chat/completions", kChat, bearer("slow-key-123"))->status, 200);
    EXPECT_EQ(s.post("/v1/chat/completions", kChat, bearer("slow-key-123"))->status, 200);
    auto limited = s.post("/v1/chat/completions", kChat, bearer("slow-key-123"));
    expect_error(limited, 429, "rate_limit_exceeded");
    EXPECT_GE(std::stoi(limited->get_header_value("Retry-After")), 1);
    EXPECT_EQ(s.client().Get("/health")->status, 200);  // no key needed
  }
  const std::string audit = test::slurp(o.audit_log);
  std::filesystem::remove(o.audit_log);
  EXPECT_EQ(audit.find("all-models-key"), std::string::npos) << "a key leaked into the audit log";
  EXPECT_EQ(audit.find("Hi"), std::string::npos) << "prompt text logged without audit_log_prompts";
  std::istringstream lines(audit);
  int n = 0, ok = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const json j = json::parse(line);
    if (j["status"] == 200) {
      ++ok;
      EXPECT_GT(j["prompt_tokens"].get<int>(), 0);
      EXPECT_GT(j["completion_tokens"].get<int>(), 0);
      EXPECT_FALSE(j["key_id"].get<std::string>().empty());
      EXPECT_TRUE(j["ttft_ms"].is_number());
    }
  }
  EXPECT_EQ(ok, 4);
  EXPECT_GE(n, 8);
}

TEST(HttpServer, AuditLogHasPromptsOnlyWhenEnabled) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.audit_prompts = true;
  o.audit_log =
      (std::filesystem::temp_directory_path() / ("infera_audit_p_" + std::to_string(::getpid()) + ".jsonl")).string();
  std::filesystem::remove(o.audit_log);
  {
    TestServer s(o);
    EXPECT_EQ(s.post("/v1/completions", {{"prompt", "A secret prompt"}, {"max_tokens", 2}})->status, 200);
  }
  const json line = json::parse(test::slurp(o.audit_log));
  std::filesystem::remove(o.audit_log);
  EXPECT_EQ(line["prompt"], "A secret prompt");
  EXPECT_EQ(line["endpoint"], "/v1/completions");
  EXPECT_EQ(line["completion_tokens"], 2);
  EXPECT_EQ(line["finish_reason"], "length");
}

TEST(HttpServer, NotReadyModelsAnswer503) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.load = false;
  TestServer s(o);
  auto ready = s.client().Get("/ready");
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(json::parse(ready->body)["models"][0]["state"], "loading");
  expect_error(s.post("/v1/chat/completions", kChat), 503, "model_not_ready");
  s.model->set_backend(s.backend);
  EXPECT_EQ(s.client().Get("/ready")->status, 200);
  EXPECT_EQ(s.post("/v1/chat/completions", kChat)->status, 200);
  s.model->set_failed("test");
  EXPECT_EQ(json::parse(s.client().Get("/v1/models")->body)["data"][0]["state"], "failed");
}

TEST(HttpServer, QueueFullIs429) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  s.backend->set_waiting(1000);
  auto r = s.post("/v1/chat/completions", kChat);
  expect_error(r, 429, "queue_full");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
}

TEST(HttpServer, RequestTimeoutIs504) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.timeout_s = 0.3;
  TestServer s(o);
  s.backend->set_paused(true);
  expect_error(s.post("/v1/chat/completions", kChat), 504, "request_timeout");
  EXPECT_TRUE(wait_for([&] { return s.backend->cancels() >= 1; }));
  s.backend->set_paused(false);
  EXPECT_TRUE(wait_for([&] { return s.backend->live() == 0; }));
}

TEST(HttpServer, DrainFinishesInFlightAndRefusesNew) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.delay = 20ms;
  TestServer s(o);
  std::string streamed;
  std::thread client([&] {
    auto r = s.post("/v1/chat/completions", with(kChat, {{"stream", true}}));
    if (r) streamed = r->body;
  });
  ASSERT_TRUE(wait_for([&] { return s.server->in_flight() == 1; }));
  std::thread drainer([&] { s.server->drain_and_stop(10); });
  ASSERT_TRUE(wait_for([&] { return s.server->draining(); }));
  expect_error(s.post("/v1/chat/completions", kChat), 503, "draining");
  EXPECT_EQ(s.client().Get("/ready")->status, 503);
  client.join();
  drainer.join();
  EXPECT_EQ(streamed_text(streamed), s.decode(s.script));  // the in-flight stream completed
}

TEST(HttpServer, ToolCallsAndMetrics) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.script_text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  TestServer s(o);
  ASSERT_EQ(s.decode(s.script), o.script_text) << "the tokenizer must round-trip the script";
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  auto r = s.post("/v1/chat/completions", with(kChat, {{"tools", tools}}));
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null());
  const json call = j["choices"][0]["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>())["city"], "Paris");

  auto st = s.post("/v1/chat/completions", with(kChat, {{"tools", tools}, {"stream", true}}));
  std::string finish;
  EXPECT_EQ(streamed_text(st->body, &finish), "");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_NE(st->body.find("\"tool_calls\":[{"), std::string::npos);

  // Without tools the block is plain text.
  auto plain = s.post("/v1/chat/completions", kChat);
  EXPECT_EQ(json::parse(plain->body)["choices"][0]["message"]["content"], o.script_text);

  // A request is counted, and its blocks freed, just after the client has its response.
  EXPECT_TRUE(wait_for([&] {
    auto r = s.client().Get("/metrics");
    return r && r->body.find("infera_requests_total{model=\"stories\",status=\"200\"} 3") != std::string::npos &&
           r->body.find("infera_kv_blocks_used{model=\"stories\"} 0") != std::string::npos;
  }));
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  for (const char* needle :
       {"infera_requests_total{model=\"stories\",status=\"200\"} 3", "infera_time_to_first_token_seconds_bucket",
        "infera_time_per_output_token_seconds_count", "infera_request_latency_seconds_sum",
        "infera_prompt_tokens_total", "infera_generation_tokens_total", "infera_kv_blocks_used{model=\"stories\"} 0",
        "infera_kv_blocks_total", "infera_requests_running", "infera_requests_waiting", "infera_prefix_cache_hit_rate",
        "infera_preemptions_total", "infera_model_state{model=\"stories\",state=\"ready\"} 1"}) {
    EXPECT_NE(m->body.find(needle), std::string::npos) << needle;
  }
}

TEST(HttpServer, TokenizeAndDetokenize) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  auto t = s.post("/tokenize", {{"prompt", "Once upon a time"}});
  ASSERT_EQ(t->status, 200) << t->body;
  const json tokens = json::parse(t->body)["tokens"];
  auto d = s.post("/detokenize", {{"tokens", tokens}});
  ASSERT_EQ(d->status, 200);
  EXPECT_NE(json::parse(d->body)["prompt"].get<std::string>().find("Once upon a time"), std::string::npos);
  expect_error(s.post("/detokenize", {{"tokens", {1, 99999}}}), 400);
}

// ---- log-probabilities -----------------------------------------------------------------

// What a token looks like in a response: its text and its bytes.
json expected_bytes(std::string_view bytes) {
  json out = json::array();
  for (char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

// Every chunk's "logprobs" of one streamed response, concatenated (chat: the content
// arrays; completions: each of the four lists).
json streamed_logprobs(const std::string& body, bool chat) {
  json all = chat ? json::array()
                  : json{{"tokens", json::array()},
                         {"token_logprobs", json::array()},
                         {"top_logprobs", json::array()},
                         {"text_offset", json::array()}};
  for (const std::string& p : sse_payloads(body)) {
    if (p == "[DONE]") continue;
    const json j = json::parse(p);
    if (j["choices"].empty()) continue;
    const json& lp = j["choices"][0]["logprobs"];
    if (lp.is_null()) continue;
    if (chat) {
      EXPECT_TRUE(lp["refusal"].is_null());
      for (const auto& e : lp["content"]) all.push_back(e);
    } else {
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (const auto& e : lp[k]) all[k].push_back(e);
      }
    }
  }
  return all;
}

TEST(HttpServer, ChatLogprobsHaveOpenAisShape) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  const Tokenizer& tok = s.tokenizer();
  const int n = 6;
  auto r = s.post("/v1/chat/completions", with(kChat, {{"max_tokens", n}, {"logprobs", true}, {"top_logprobs", 3}}));
  ASSERT_EQ(r->status, 200) << r->body;
  const json lp = json::parse(r->body)["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r->body;
  EXPECT_EQ(lp.size(), 2u);
  EXPECT_TRUE(lp["refusal"].is_null());
  const json& content = lp["content"];
  ASSERT_EQ(content.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const json& e = content[i];
    const int32_t id = s.script[i];
    const TokenLogprobs want = testing::fake_logprobs(id, i, 3);
    EXPECT_EQ(e.size(), 4u) << e;  // token, logprob, bytes, top_logprobs
    EXPECT_EQ(e["token"], std::string(tok.token_bytes(id)));
    EXPECT_EQ(e["bytes"], expected_bytes(tok.token_bytes(id)));
    EXPECT_FLOAT_EQ(e["logprob"].get<float>(), want.sampled.logprob);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    for (int k = 0; k < 3; ++k) {
      const json& t = e["top_logprobs"][k];
      EXPECT_EQ(t.size(), 3u) << t;  // token, logprob, bytes
      EXPECT_EQ(t["token"], std::string(tok.token_bytes(want.top[k].token)));
      EXPECT_EQ(t["bytes"], expected_bytes(tok.token_bytes(want.top[k].token)));
      EXPECT_FLOAT_EQ(t["logprob"].get<float>(), want.top[k].logprob);
    }
  }
  // Streaming: the chunks' logprobs together are the same list.
  auto st = s.post("/v1/chat/completions",
                   with(kChat, {{"max_tokens", n}, {"logprobs", true}, {"top_logprobs", 3}, {"stream", true}}));
  ASSERT_EQ(st->status, 200);
  EXPECT_EQ(streamed_logprobs(st->body, true), content);
  // top_logprobs 0: the sampled tokens only, with empty alternatives.
  auto zero = s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 2}, {"logprobs", true}}));
  const json z = json::parse(zero->body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(z.size(), 2u);
  EXPECT_EQ(z[0]["top_logprobs"], json::array());
  // Not asked: null, and the engine is not asked either.
  auto none = s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 2}}));
  EXPECT_TRUE(json::parse(none->body)["choices"][0]["logprobs"].is_null());
  auto none_stream = s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 2}, {"stream", true}}));
  EXPECT_EQ(streamed_logprobs(none_stream->body, true), json::array());
}

TEST(HttpServer, CompletionLogprobsHaveTheLegacyShape) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  const Tokenizer& tok = s.tokenizer();
  const int n = 7;
  auto r = s.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", n}, {"logprobs", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json choice = json::parse(r->body)["choices"][0];
  const json& lp = choice["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r->body;
  EXPECT_EQ(lp.size(), 4u);
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    ASSERT_EQ(lp[k].size(), static_cast<size_t>(n)) << k;
  std::string joined;
  for (int i = 0; i < n; ++i) {
    const int32_t id = s.script[i];
    const TokenLogprobs want = testing::fake_logprobs(id, i, 2);
    const std::string text(tok.token_bytes(id));
    EXPECT_EQ(lp["tokens"][i], text);
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), want.sampled.logprob);
    // The two alternatives (the first is the sampled token itself here).
    const json& top = lp["top_logprobs"][i];
    EXPECT_EQ(top.size(), 2u) << top;
    for (const auto& t : want.top) EXPECT_FLOAT_EQ(top[std::string(tok.token_bytes(t.token))].get<float>(), t.logprob);
    EXPECT_EQ(lp["text_offset"][i], static_cast<int64_t>(joined.size()));  // ASCII script: bytes = code points
    joined += text;
  }
  // The tokens spell the text (the decoder drops SentencePiece's leading space).
  const std::string text = choice["text"];
  EXPECT_EQ(joined.substr(joined.size() - text.size()), text);
  EXPECT_LE(joined.size() - text.size(), 1u);

  auto st = s.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", n}, {"logprobs", 2}, {"stream", true}});
  ASSERT_EQ(st->status, 200);
  EXPECT_EQ(streamed_logprobs(st->body, false), lp);

  // logprobs 0: each top_logprobs entry holds the sampled token alone (OpenAI: N + the sampled one).
  auto zero = s.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}, {"logprobs", 0}});
  const json z = json::parse(zero->body)["choices"][0]["logprobs"];
  ASSERT_EQ(z["top_logprobs"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(z["top_logprobs"][i].size(), 1u);
    EXPECT_EQ(z["top_logprobs"][i][z["tokens"][i].get<std::string>()], z["token_logprobs"][i]);
  }
  auto none = s.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_TRUE(json::parse(none->body)["choices"][0]["logprobs"].is_null());
}

TEST(HttpServer, LogprobsEndWithTheTokenThatCompletedAStopString) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  const std::string full = s.decode(s.script);
  const std::string stop = "little";
  ASSERT_NE(full.find(stop), std::string::npos);
  // The first token whose text completes the stop string.
  size_t completing = 0;
  while (s.decode(std::span(s.script).subspan(0, completing + 1)).find(stop) == std::string::npos) ++completing;
  for (bool stream : {false, true}) {
    auto r = s.post("/v1/chat/completions", with(kChat, {{"stop", stop}, {"logprobs", true}, {"stream", stream}}));
    ASSERT_EQ(r->status, 200);
    const json content =
        stream ? streamed_logprobs(r->body, true) : json::parse(r->body)["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), completing + 1) << (stream ? "stream" : "non-stream");
    for (size_t i = 0; i <= completing; ++i)
      EXPECT_EQ(content[i]["token"], std::string(s.tokenizer().token_bytes(s.script[i])));
  }
}

TEST(HttpServer, BadLogprobsRequestsNameTheParameter) {
  INFERA_REQUIRE_FIXTURE(kStories);
  TestServer s;
  struct Case {
    const char* path;
    json extra;
    const char* param;
  };
  const Case cases[] = {
      {"/v1/chat/completions", {{"top_logprobs", 2}}, "top_logprobs"},
      {"/v1/chat/completions", {{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {"/v1/chat/completions", {{"logprobs", true}, {"top_logprobs", -1}}, "top_logprobs"},
      {"/v1/chat/completions", {{"logprobs", 3}}, "logprobs"},
      {"/v1/completions", {{"logprobs", 21}}, "logprobs"},
      {"/v1/completions", {{"logprobs", -2}}, "logprobs"},
      {"/v1/completions", {{"logprobs", true}}, "logprobs"},
      {"/v1/completions", {{"max_tokens", 0}}, "max_tokens"},  // 0 only with echo
      {"/v1/chat/completions", {{"max_tokens", 0}}, "max_tokens"},
      {"/v1/completions", {{"prompt_logprobs", 21}}, "prompt_logprobs"},
      {"/v1/chat/completions", {{"prompt_logprobs", -1}}, "prompt_logprobs"},
  };
  for (const Case& c : cases) {
    const json base = std::string(c.path) == "/v1/completions" ? json{{"prompt", "x"}} : kChat;
    auto r = s.post(c.path, with(base, c.extra));
    expect_error(r, 400);
    EXPECT_EQ(json::parse(r->body)["error"]["param"], c.param) << c.extra;
  }
  EXPECT_EQ(s.post("/v1/chat/completions", with(kChat, {{"logprobs", true}, {"top_logprobs", 20}}))->status, 200);
}

// stories260K run alone (SequenceRunner: one sequence, no scheduler, no server): the
// independent side of the real-engine log-probability tests.
struct LoneStories {
  std::unique_ptr<Model> model;
  std::unique_ptr<KvPool> kv;
  BlockAllocator blocks{16};
  std::unique_ptr<SequenceRunner> runner;
  int32_t vocab = 0;
  LoneStories() {
    LoadOptions lo;
    lo.max_batch_tokens = 256;
    model = load_model(kStories, lo);
    KvPoolShape shape = model->kv_shape(16);
    shape.num_blocks = 16;
    kv = std::make_unique<KvPool>(shape);
    runner = std::make_unique<SequenceRunner>(*model, *kv, blocks, 256);
    vocab = model->config().vocab_size;
  }
};

// log_softmax(logits)[token], in double.
double log_softmax_at(const float* logits, int32_t vocab, int32_t token) {
  double max_l = logits[0], sum = 0;
  for (int32_t v = 1; v < vocab; ++v) max_l = std::max<double>(max_l, logits[v]);
  for (int32_t v = 0; v < vocab; ++v) sum += std::exp(logits[v] - max_l);
  return logits[token] - max_l - std::log(sum);
}

// The real engine behind HTTP: the numbers are the model's log_softmax, computed here
// from an independent single-sequence run, and the streamed tokens spell the text.
TEST(HttpServer, LogprobsFromTheRealEngineAreTheModels) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.real_engine = true;
  TestServer s(o);
  const Tokenizer& tok = s.tokenizer();
  const std::vector<int32_t> prompt = tok.encode("Once upon a time", true);
  const int n = 8, top_n = 5;
  auto r = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"logprobs", top_n}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json lp = json::parse(r->body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(n));

  LoneStories lone;
  const int32_t vocab = lone.vocab;
  const float* logits = lone.runner->feed(prompt);
  for (int i = 0; i < n; ++i) {
    auto ref = [&](int32_t v) { return log_softmax_at(logits, vocab, v); };
    const int32_t next = argmax(logits, vocab);  // greedy
    EXPECT_EQ(lp["tokens"][i], std::string(tok.token_bytes(next))) << i;
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), ref(next), 2e-4) << i;
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_n, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const json& top = lp["top_logprobs"][i];
    for (int k = 0; k < top_n; ++k) {
      const std::string key(tok.token_bytes(order[k]));
      ASSERT_TRUE(top.contains(key)) << key << " in " << top;
      // Two ids may share a text; the entry holds the likelier one's value.
      EXPECT_GE(top[key].get<double>(), ref(order[k]) - 2e-4) << key;
    }
    logits = lone.runner->feed(std::span<const int32_t>(&next, 1));
  }

  // Chat, streamed: the chunks' tokens, joined, are the streamed text.
  auto st =
      s.post("/v1/chat/completions",
             with(kChat,
                  {{"max_tokens", 12}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}, {"stream", true}}));
  ASSERT_EQ(st->status, 200);
  const std::string text = streamed_text(st->body);
  const json content = streamed_logprobs(st->body, true);
  ASSERT_EQ(content.size(), 12u);
  std::string joined;
  for (const auto& e : content) {
    joined += e["token"].get<std::string>();
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);  // greedy
  }
  EXPECT_EQ(joined.substr(joined.size() - text.size()), text);
}

// `timings` beside `usage`: the engine's clock, whole and streamed. The rate is the
// tokens after the first over the time from the first token to the last, so a short
// answer that reaches the client within a millisecond still has one.
TEST(HttpServer, TimingsAreTheEnginesOwn) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.real_engine = true;
  TestServer s(o);
  const int n = 12;
  // choices: how many generated; each counts its tokens after its first.
  auto check = [&](const json& usage, const json& t, int choices) {
    ASSERT_TRUE(t.is_object()) << t;
    EXPECT_EQ(t["predicted_n"], usage["completion_tokens"]);
    EXPECT_EQ(t["predicted_n"], n * choices);
    EXPECT_EQ(t["cache_n"], usage["prompt_tokens_details"]["cached_tokens"]);
    EXPECT_EQ(t["prompt_n"].get<int64_t>() + t["cache_n"].get<int64_t>(), usage["prompt_tokens"].get<int64_t>());
    EXPECT_GE(t["queue_ms"].get<double>(), 0.0);
    EXPECT_GE(t["prompt_ms"].get<double>(), 0.0);
    // predicted_ms is rounded to 1 us and the rate computed from the unrounded time (and
    // then rounded to 1e-3): the rate lies between those over ms + 0.0005 and ms - 0.0005.
    const double ms = t["predicted_ms"].get<double>();
    ASSERT_GT(ms, 0.0005) << t;
    ASSERT_TRUE(t.contains("predicted_per_second")) << t;
    const double tokens = (n - 1) * choices * 1000.0, rate = t["predicted_per_second"].get<double>();
    EXPECT_GE(rate, tokens / (ms + 0.0005) - 0.001) << t;
    EXPECT_LE(rate, tokens / (ms - 0.0005) + 0.001) << t;
  };
  const json req = with(kChat, {{"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}});
  auto whole = s.post("/v1/chat/completions", req);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json j = json::parse(whole->body);
  check(j["usage"], j["timings"], 1);

  json streamed = req;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  auto st = s.post("/v1/chat/completions", streamed);
  ASSERT_EQ(st->status, 200);
  const auto payloads = sse_payloads(st->body);
  ASSERT_GE(payloads.size(), 3u) << st->body;
  const json tail = json::parse(payloads[payloads.size() - 2]);
  check(tail["usage"], tail["timings"], 1);
  // Only the usage chunk carries them.
  EXPECT_FALSE(json::parse(payloads.front()).contains("timings"));

  // Two choices: the windows and the counts cover both.
  json two = req;
  two["n"] = 2;
  auto both = s.post("/v1/chat/completions", two);
  ASSERT_EQ(both->status, 200) << both->body;
  const json b = json::parse(both->body);
  ASSERT_EQ(b["choices"].size(), 2u);
  check(b["usage"], b["timings"], 2);
}

// echo with logprobs: the prompt's tokens (the first unscored), each scored by the row of
// an independent all-rows run at the position before it, then the completion's; the same
// whether streamed or not, with a completion or max_tokens 0.
TEST(HttpServer, EchoedPromptLogprobsAreTheModels) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.real_engine = true;
  TestServer s(o);
  const Tokenizer& tok = s.tokenizer();
  const std::vector<int32_t> prompt = tok.encode("Once upon a time there was a little", true);
  const int32_t n = static_cast<int32_t>(prompt.size());

  LoneStories lone;
  const int32_t vocab = lone.vocab;
  const float* rows = lone.runner->feed(prompt, /*all_logits=*/true);
  auto ref = [&](int32_t p, int32_t token) {
    return log_softmax_at(rows + static_cast<size_t>(p) * vocab, vocab, token);
  };

  for (const auto& [gen, stream] : {std::pair{0, false}, std::pair{4, false}, std::pair{4, true}}) {
    const std::string what = "max_tokens " + std::to_string(gen) + (stream ? " stream" : "");
    auto r = s.post("/v1/completions", {{"prompt", prompt},
                                        {"max_tokens", gen},
                                        {"temperature", 0},
                                        {"logprobs", 2},
                                        {"echo", true},
                                        {"stream", stream}});
    ASSERT_EQ(r->status, 200) << what << ": " << r->body;
    const json lp = stream ? streamed_logprobs(r->body, false) : json::parse(r->body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(n + gen)) << what;
    EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << what;
    EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << what;
    EXPECT_EQ(lp["text_offset"][0], 0) << what;
    for (int32_t p = 1; p < n; ++p) {
      EXPECT_EQ(lp["tokens"][p], std::string(tok.token_bytes(prompt[p]))) << what << " " << p;
      EXPECT_NEAR(lp["token_logprobs"][p].get<double>(), ref(p - 1, prompt[p]), 2e-4) << what << " " << p;
      const json& top = lp["top_logprobs"][p];  // 2 alternatives and the prompt token
      EXPECT_TRUE(top.size() >= 1 && top.size() <= 3) << top;
      EXPECT_EQ(top[lp["tokens"][p].get<std::string>()], lp["token_logprobs"][p]) << what << " " << p;
    }
    for (int32_t i = 1; i < n + gen; ++i) {
      const int64_t before = code_point_count(lp["tokens"][i - 1].get<std::string>());
      EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), lp["text_offset"][i - 1].get<int64_t>() + before)
          << what << " " << i;
    }
    if (gen > 0) {  // greedy: the first completion token is the last prompt row's argmax
      EXPECT_EQ(lp["tokens"][n], std::string(tok.token_bytes(argmax(rows + static_cast<size_t>(n - 1) * vocab, vocab))))
          << what;
    }
    if (!stream) {
      const json body = json::parse(r->body);
      EXPECT_FALSE(body["choices"][0].contains("prompt_logprobs")) << "not asked";
      EXPECT_EQ(body["usage"]["completion_tokens"], gen) << what;
      EXPECT_TRUE(body["choices"][0]["text"].get<std::string>().starts_with(tok.decode(prompt, false))) << what << body;
    }
  }
}

// vLLM's prompt_logprobs: per prompt token after the first, an object keyed by token id
// with the prompt token's and its alternatives' logprob, rank and text; on each completion
// choice (also streamed, with the first chunk), beside the choices for chat.
TEST(HttpServer, VllmPromptLogprobsAreTheModels) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ServerOptions o;
  o.real_engine = true;
  TestServer s(o);
  const Tokenizer& tok = s.tokenizer();
  const std::vector<int32_t> prompt = tok.encode("Once upon a time there was", true);
  const int32_t n = static_cast<int32_t>(prompt.size());
  LoneStories lone;
  const int32_t vocab = lone.vocab;
  const float* rows = lone.runner->feed(prompt, /*all_logits=*/true);
  auto check = [&](const json& pl, int32_t top_n, const std::string& what) {
    ASSERT_TRUE(pl.is_array()) << what << ": " << pl;
    ASSERT_EQ(pl.size(), static_cast<size_t>(n)) << what;
    EXPECT_TRUE(pl[0].is_null()) << what;
    for (int32_t p = 1; p < n; ++p) {
      const float* row = rows + static_cast<size_t>(p - 1) * vocab;
      const json& e = pl[p];
      const std::string key = std::to_string(prompt[p]);
      ASSERT_TRUE(e.contains(key)) << what << " " << p << ": " << e;
      EXPECT_NEAR(e[key]["logprob"].get<double>(), log_softmax_at(row, vocab, prompt[p]), 2e-4) << what << " " << p;
      int32_t above = 0;
      for (int32_t v = 0; v < vocab; ++v) above += row[v] > row[prompt[p]] ? 1 : 0;
      EXPECT_EQ(e[key]["rank"], 1 + above) << what << " " << p;
      EXPECT_EQ(e[key]["decoded_token"], std::string(tok.token_bytes(prompt[p]))) << what;
      EXPECT_TRUE(e.size() == static_cast<size_t>(top_n) || e.size() == static_cast<size_t>(top_n) + 1) << e;
      const std::string best = std::to_string(argmax(row, vocab));
      if (top_n > 0) {
        ASSERT_TRUE(e.contains(best)) << what << " " << p;
        EXPECT_EQ(e[best]["rank"], 1);
      }
    }
  };
  auto r =
      s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}, {"prompt_logprobs", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = json::parse(r->body);
  check(body["choices"][0]["prompt_logprobs"], 2, "completion");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null()) << "no legacy logprobs asked";
  // Together with echo + logprobs (fewer alternatives there): each keeps its own count.
  r = s.post("/v1/completions",
             {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}, {"prompt_logprobs", 3}});
  ASSERT_EQ(r->status, 200) << r->body;
  body = json::parse(r->body);
  check(body["choices"][0]["prompt_logprobs"], 3, "completion with echo");
  for (int32_t p = 1; p < n; ++p) EXPECT_LE(body["choices"][0]["logprobs"]["top_logprobs"][p].size(), 2u);
  // Streamed: with the first chunk only.
  r = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 3}, {"prompt_logprobs", 0}, {"stream", true}});
  ASSERT_EQ(r->status, 200);
  int chunks_with = 0;
  for (const std::string& payload : sse_payloads(r->body)) {
    if (payload == "[DONE]") continue;
    const json j = json::parse(payload);
    if (!j["choices"].empty() && j["choices"][0].contains("prompt_logprobs")) {
      ++chunks_with;
      check(j["choices"][0]["prompt_logprobs"], 0, "stream");
    }
  }
  EXPECT_EQ(chunks_with, 1);
  // Chat: beside the choices, for the rendered prompt.
  r = s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 2}, {"prompt_logprobs", 1}, {"n", 2}}));
  ASSERT_EQ(r->status, 200) << r->body;
  body = json::parse(r->body);
  ASSERT_TRUE(body["prompt_logprobs"].is_array());
  EXPECT_EQ(body["prompt_logprobs"].size(), static_cast<size_t>(body["usage"]["prompt_tokens"].get<int>()));
  EXPECT_TRUE(body["prompt_logprobs"][0].is_null());
  EXPECT_FALSE(body["choices"][0].contains("prompt_logprobs"));
}

}  // namespace
}  // namespace infera::server
