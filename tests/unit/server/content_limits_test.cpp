// What a request or a model's output may cost the server: errors inside a stream, response
// size (n x prompt scoring x alternatives), deep JSON. Over loopback with a scripted backend
// and the stories260K tokenizer.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
