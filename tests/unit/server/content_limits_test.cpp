// What a request or a model's output may cost the server: errors inside a stream, response
// size (n x prompt scoring x alternatives), deep JSON. Over loopback with a scripted backend
// and the stories260K tokenizer.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "fake_backend.h"
#include "infera/chat/chat_template.h"
#include "infera/server/audit_log.h"
#include "infera/server/http_server.h"
#include "infera/server/logprobs_json.h"
#include "server_fixture.h"

namespace infera::server {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using namespace std::chrono_literals;

const std::string kStories = test::stories_dir();

// One model served by a FakeBackend that "generates" `script`.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<int32_t> script) {
    backend = std::make_shared<FakeBackend>(std::move(script), 1ms);
    auto m = testing::stories_instance("stories");
    m->set_backend(backend);
    server = testing::start_server({}, {m});
  }
  ~ScriptedServer() { server->stop(); }

  httplib::Result post(const std::string& path, const json& body) const {
    return testing::local_client(server->port()).Post(path.c_str(), body.dump(), "application/json");
  }
  bool healthy() const {
    auto r = testing::local_client(server->port()).Get("/health");
    return r && r->status == 200;
  }

  std::shared_ptr<FakeBackend> backend;
  std::unique_ptr<HttpServer> server;
};

const json kChat = {{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};

// A token id the tokenizer cannot decode (stories260K has 512) makes the incremental decoder
// throw inside the stream: the client gets an error event and [DONE], the server lives on.
TEST(ContentLimits, AnErrorInsideAStreamEndsItWithAnErrorEvent) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ScriptedServer s({10, 20, 9999, 30});
  json body = kChat;
  body["stream"] = true;
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find(R"("error")"), std::string::npos) << r->body;
  EXPECT_TRUE(r->body.ends_with("data: [DONE]\n\n")) << r->body;
  EXPECT_TRUE(s.healthy());
  // Not streamed: a 500 with the error shape.
  body.erase("stream");
  auto plain = s.post("/v1/chat/completions", body);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 500) << plain->body;
  EXPECT_TRUE(s.healthy());
}

// The server asks the engine never to sample past the tokenizer's vocabulary.
TEST(ContentLimits, RequestsCarryTheTokenizersVocabLimit) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ScriptedServer s({10, 20});
  auto r = s.post("/v1/chat/completions", kChat);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(s.backend->last_vocab_limit(), 512);
}

// n choices of one prompt: the engine scores the prompt once, every choice reports it.
TEST(ContentLimits, APromptIsScoredOncePerRequest) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ScriptedServer s({10, 20});
  auto r = s.post(
      "/v1/completions",
      {{"model", "stories"}, {"prompt", {"Once upon", "a time"}}, {"n", 3}, {"prompt_logprobs", 1}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(s.backend->prompt_logprobs_asked(), (std::vector<int32_t>{1, -1, -1, 1, -1, -1}));
  EXPECT_EQ(json::parse(r->body)["choices"].size(), 6u);
}

// The data chunks of an SSE body, [DONE] left out.
std::vector<json> sse_chunks(const std::string& body) {
  std::vector<json> out;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("data: ") && line != "data: [DONE]") out.push_back(json::parse(line.substr(6)));
  }
  return out;
}

// Streamed, too: the engine scores each prompt once, and every choice's first chunk carries
// that scoring, also when the other choices' tokens come before it (they wait for it).
TEST(ContentLimits, AStreamedPromptIsScoredOncePerRequest) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ScriptedServer s({10, 20, 30});
  s.backend->set_scoring_ticks(3);
  auto r = s.post("/v1/completions", {{"model", "stories"},
                                      {"prompt", {"Once upon", "a time there"}},
                                      {"n", 3},
                                      {"prompt_logprobs", 1},
                                      {"max_tokens", 2},
                                      {"stream", true}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(s.backend->prompt_logprobs_asked(), (std::vector<int32_t>{1, -1, -1, 1, -1, -1}));
  std::map<int, json> first;  // choice index -> its first chunk's choice
  std::map<int, std::string> text;
  for (const json& c : sse_chunks(r->body)) {
    ASSERT_EQ(c["choices"].size(), 1u) << c;
    const json& ch = c["choices"][0];
    const int i = ch["index"];
    if (!first.contains(i)) first[i] = ch;
    text[i] += ch["text"].get<std::string>();
  }
  ASSERT_EQ(first.size(), 6u) << r->body;
  for (int i = 0; i < 6; ++i) {
    const json& scored = first[i]["prompt_logprobs"];
    ASSERT_TRUE(scored.is_array()) << "choice " << i << ": " << first[i];
    EXPECT_GT(scored.size(), 1u);
    EXPECT_EQ(scored, first[i / 3 * 3]["prompt_logprobs"]) << "choice " << i << " reports its prompt's scoring";
    EXPECT_EQ(text[i], text[0]) << "choice " << i << " lost no text while it waited";
  }
  EXPECT_NE(first[0]["prompt_logprobs"], first[3]["prompt_logprobs"]);

  // Chat, n = 2: one scoring, on both choices' first chunks.
  json body = kChat;
  body.update({{"n", 2}, {"prompt_logprobs", 0}, {"max_tokens", 2}, {"stream", true}});
  r = s.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const auto asked = s.backend->prompt_logprobs_asked();
  EXPECT_EQ(std::vector<int32_t>(asked.end() - 2, asked.end()), (std::vector<int32_t>{0, -1}));
  std::map<int, json> chat_first;
  for (const json& c : sse_chunks(r->body)) {
    const int i = c["choices"][0]["index"];
    if (!chat_first.contains(i)) chat_first[i] = c;
  }
  ASSERT_EQ(chat_first.size(), 2u) << r->body;
  ASSERT_TRUE(chat_first[1]["prompt_logprobs"].is_array()) << chat_first[1];
  EXPECT_EQ(chat_first[1]["prompt_logprobs"], chat_first[0]["prompt_logprobs"]);

  // Echo with logprobs: every choice's first chunk starts with the prompt's tokens, scored once.
  r = s.post("/v1/completions", {{"model", "stories"},
                                 {"prompt", "Once upon a time"},
                                 {"n", 2},
                                 {"echo", true},
                                 {"logprobs", 1},
                                 {"max_tokens", 2},
                                 {"stream", true}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const auto echo_asked = s.backend->prompt_logprobs_asked();
  EXPECT_EQ(std::vector<int32_t>(echo_asked.end() - 2, echo_asked.end()), (std::vector<int32_t>{1, -1}));
  std::map<int, json> echo_first;
  std::map<int, json> echo_logprobs;  // choice index -> token_logprobs of all its chunks
  for (const json& c : sse_chunks(r->body)) {
    const json& ch = c["choices"][0];
    const int i = ch["index"];
    if (!echo_first.contains(i)) echo_first[i] = ch;
    if (!echo_logprobs.contains(i)) echo_logprobs[i] = json::array();
    if (ch["logprobs"].is_object())
      for (const json& v : ch["logprobs"]["token_logprobs"]) echo_logprobs[i].push_back(v);
  }
  ASSERT_EQ(echo_first.size(), 2u) << r->body;
  EXPECT_TRUE(echo_first[1]["text"].get<std::string>().starts_with("Once upon a time")) << echo_first[1];
  ASSERT_TRUE(echo_first[1]["logprobs"].is_object()) << echo_first[1];
  EXPECT_TRUE(echo_first[1]["logprobs"]["token_logprobs"][0].is_null()) << "the prompt's first token, unscored";
  EXPECT_GT(echo_logprobs[1].size(), 3u);
  EXPECT_EQ(echo_logprobs[1], echo_logprobs[0]);
  EXPECT_TRUE(s.healthy());
}

// The 2 MB request of the report: tool-call arguments of a million nested brackets.
TEST(ContentLimits, NestedArgumentsAreA400NamingTheField) {
  INFERA_REQUIRE_FIXTURE(kStories);
  ScriptedServer s({10, 20});
  json body = kChat;
  body["messages"].push_back({{"role", "assistant"},
                              {"content", nullptr},
                              {"tool_calls",
                               {{{"id", "c"},
                                 {"type", "function"},
                                 {"function", {{"name", "f"}, {"arguments", std::string(1'000'000, '[')}}}}}}});
  auto r = s.post("/v1/chat/completions", body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "messages[1].tool_calls[0].function.arguments");
  EXPECT_TRUE(s.healthy());
}

// n x echo x logprobs x prompt_logprobs: past the documented bound, a 400 naming the
// parameter, before any work is queued.
TEST(ContentLimits, PromptScoringIsBoundedInSize) {
  const std::vector<int64_t> prompt = {10'000};  // a 40 KB prompt
  PromptScoringAsk ask{16, 20, 20};
  EXPECT_EQ(prompt_scoring_entries(ask, prompt), int64_t{16} * 10'000 * 42);
  try {
    check_prompt_scoring_size(ask, prompt);
    ADD_FAILURE() << "accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error.status, 400);
    EXPECT_EQ(e.error.param, "prompt_logprobs");
  }
  EXPECT_NO_THROW(check_prompt_scoring_size({1, 5, -1}, prompt));
  EXPECT_NO_THROW(check_prompt_scoring_size({16, -1, -1}, prompt));
}

// The audit log: mode 0600, rotated past its size cap, 401 floods summarised.
TEST(AuditLogLimits, ModeRotationAndUnauthorizedFloods) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("infera_audit_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "audit.log").string();
  auto count_lines = [](const std::string& p, int64_t* suppressed = nullptr, int* unauthorized = nullptr) {
    std::ifstream in(p);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      const json j = json::parse(line);
      if (suppressed && j.contains("suppressed"))
        *suppressed += j["suppressed"].get<int64_t>();
      else if (unauthorized && j["status"] == 401)
        ++*unauthorized;
    }
    return n;
  };
  {
    AuditLog log(path, false, /*max_bytes=*/4096);
    AuditRecord r;
    r.endpoint = "/v1/chat/completions";
    r.status = 200;
    for (int i = 0; i < 100; ++i) log.write(r);
  }
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_LE(std::filesystem::file_size(path), 4096u);
  ASSERT_TRUE(std::filesystem::exists(path + ".1"));
  EXPECT_LE(std::filesystem::file_size(path + ".1"), 4096u);
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".1");

  {
    AuditLog log(path, false);
    AuditRecord r;
    r.endpoint = "/v1/chat/completions";
    r.status = 401;
    for (int i = 0; i < 1000; ++i) log.write(r);
  }
  int64_t suppressed = 0;
  int unauthorized = 0;
  const int lines = count_lines(path, &suppressed, &unauthorized);
  EXPECT_LT(lines, 100);  // not one line per refused request
  EXPECT_EQ(unauthorized + suppressed, 1000);  // but every one is counted
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace infera::server
