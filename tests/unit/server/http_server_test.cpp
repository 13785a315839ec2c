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
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "infera/tokenizer/chat_template.h"

namespace infera::server {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using namespace std::chrono_literals;

const std::string kStories = std::string(INFERA_SOURCE_DIR) + "/../shared/models/stories260K";
const std::string kChatml = std::string(INFERA_SOURCE_DIR) + "/tests/conformance/data/chatml.jinja";
const std::string kText = "Once upon a time, there was a little girl. The end is near.";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

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
};

class TestServer {
 public:
  explicit TestServer(const ServerOptions& o = {}) {
    static bool sigpipe_ignored = [] {
      ::signal(SIGPIPE, SIG_IGN);
      return true;
    }();
    (void)sigpipe_ignored;
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(kStories));
    script = tokenizer_->encode(o.script_text, false);
    backend = std::make_shared<FakeBackend>(script, o.delay);
    std::vector<std::shared_ptr<ModelInstance>> models;
    for (const char* name : {"stories", "other"}) {
      if (std::string(name) == "other" && !o.two_models) break;
      ModelDeployConfig d;
      d.name = name;
      d.path = kStories;
      auto m = std::make_shared<ModelInstance>(d, load_model_config(kStories), Tokenizer::load(kStories),
                                               std::make_unique<ChatTemplate>(read_file(kChatml)), resolve_limits(d, 512));
      if (o.load) m->set_backend(backend);
      models.push_back(m);
    }
    model = models[0];
    ServerConfig c;
    c.port = 0;
    c.api_keys = o.keys;
    c.body_limit_bytes = o.body_limit;
    c.audit_log_path = o.audit_log;
    c.audit_log_prompts = o.audit_prompts;
    c.request_timeout_s = o.timeout_s;
    server = std::make_unique<HttpServer>(c, models);
    server->bind();
    server->start();
  }
  ~TestServer() { server->stop(); }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(30, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body, const httplib::Headers& headers = {}) const {
    return client().Post(path.c_str(), headers, body.dump(), "application/json");
  }
  std::string decode(std::span<const int32_t> ids) const { return tokenizer_->decode(ids); }

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

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds limit = 3000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
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
  TestServer s;
  auto r = s.post("/v1/chat/completions", with(kChat, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
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
  const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  char buf[512];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);  // headers / first chunk arrived
  ::close(fd);
}

TEST(HttpServer, ClientHangingUpCancelsItsGeneration) {
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
  ServerOptions o;
  o.delay = 2ms;
  TestServer s(o);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  const std::string expected = s.decode(s.script);
  for (int i = 0; i < 32; ++i) {
    clients.emplace_back([&] {
      auto r = s.post("/v1/chat/completions", with(kChat, {{"stream", true}}));
      if (r && r->status == 200 && streamed_text(r->body) == expected) ++ok;
      else if (!r) ADD_FAILURE() << "no response: " << httplib::to_string(r.error());
      else ADD_FAILURE() << r->status << " " << r->body.substr(0, 300);
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
  ServerOptions o;
  o.body_limit = 4096;
  TestServer s(o);
  expect_error(s.post("/v1/chat/completions", with(kChat, {{"model", "nope"}})), 404, "model_not_found");
  expect_error(s.client().Post("/v1/chat/completions", "{oops", "application/json"), 400);
  expect_error(s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 100000}})), 400);
  expect_error(s.post("/v1/chat/completions", with(kChat, {{"max_tokens", 400}, {"messages", {{{"role", "user"}, {"content", std::string(1500, 'a')}}}}})),
               400);
  expect_error(s.post("/v1/completions", {{"prompt", std::vector<int>{1, 100000}}}), 400);
  expect_error(s.client().Post("/v1/chat/completions", std::string(8000, ' '), "application/json"), 413);
  expect_error(s.client().Get("/v1/nothing"), 404);
  expect_error(s.post("/v1/chat/completions", with(kChat, {{"logprobs", true}})), 400);
  // Overlong input names both numbers.
  auto r = s.post("/v1/completions", {{"prompt", std::string(3000, 'x') + " " + std::string(900, 'y')}});
  expect_error(r, 400, "context_length_exceeded");
  EXPECT_NE(r->body.find("512"), std::string::npos) << r->body;
  EXPECT_EQ(s.post("/v1/chat/completions", kChat)->status, 200);
}

TEST(HttpServer, ApiKeysPermissionsAndRateLimits) {
  ServerOptions o;
  o.two_models = true;
  o.keys = {{"all", "all-models-key", {}, 0, 0}, {"only-other", "only-other-key", {"other"}, 0, 0}, {"slow", "slow-key-123", {}, 2, 0}};
  o.audit_log = (std::filesystem::temp_directory_path() / ("infera_audit_" + std::to_string(::getpid()) + ".jsonl")).string();
  std::filesystem::remove(o.audit_log);
  {
    TestServer s(o);
    auto bearer = [](const std::string& k) { return httplib::Headers{{"Authorization", "Bearer " + k}}; };
    expect_error(s.post("/v1/chat/completions", kChat), 401, "missing_api_key");
    expect_error(s.post("/v1/chat/completions", kChat, bearer("wrong-key-000")), 401, "invalid_api_key");
    expect_error(s.post("/v1/chat/completions", kChat, bearer("only-other-key")), 403, "model_not_allowed");
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
  const std::string audit = read_file(o.audit_log);
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
  ServerOptions o;
  o.audit_prompts = true;
  o.audit_log = (std::filesystem::temp_directory_path() / ("infera_audit_p_" + std::to_string(::getpid()) + ".jsonl")).string();
  std::filesystem::remove(o.audit_log);
  {
    TestServer s(o);
    EXPECT_EQ(s.post("/v1/completions", {{"prompt", "A secret prompt"}, {"max_tokens", 2}})->status, 200);
  }
  const json line = json::parse(read_file(o.audit_log));
  std::filesystem::remove(o.audit_log);
  EXPECT_EQ(line["prompt"], "A secret prompt");
  EXPECT_EQ(line["endpoint"], "/v1/completions");
  EXPECT_EQ(line["completion_tokens"], 2);
  EXPECT_EQ(line["finish_reason"], "length");
}

TEST(HttpServer, NotReadyModelsAnswer503) {
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
  TestServer s;
  s.backend->set_waiting(1000);
  auto r = s.post("/v1/chat/completions", kChat);
  expect_error(r, 429, "queue_full");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
}

TEST(HttpServer, RequestTimeoutIs504) {
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
  ServerOptions o;
  o.script_text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  TestServer s(o);
  ASSERT_EQ(s.decode(s.script), o.script_text) << "the tokenizer must round-trip the script";
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
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
        "infera_time_per_output_token_seconds_count", "infera_request_latency_seconds_sum", "infera_prompt_tokens_total",
        "infera_generation_tokens_total", "infera_kv_blocks_used{model=\"stories\"} 0", "infera_kv_blocks_total",
        "infera_requests_running", "infera_requests_waiting", "infera_prefix_cache_hit_rate", "infera_preemptions_total",
        "infera_model_state{model=\"stories\",state=\"ready\"} 1"}) {
    EXPECT_NE(m->body.find(needle), std::string::npos) << needle;
  }
}

TEST(HttpServer, TokenizeAndDetokenize) {
  TestServer s;
  auto t = s.post("/tokenize", {{"prompt", "Once upon a time"}});
  ASSERT_EQ(t->status, 200) << t->body;
  const json tokens = json::parse(t->body)["tokens"];
  auto d = s.post("/detokenize", {{"tokens", tokens}});
  ASSERT_EQ(d->status, 200);
  EXPECT_NE(json::parse(d->body)["prompt"].get<std::string>().find("Once upon a time"), std::string::npos);
  expect_error(s.post("/detokenize", {{"tokens", {1, 99999}}}), 400);
}

}  // namespace
}  // namespace infera::server
