// A model's own sampling defaults (server/generation_defaults.h): read from
// generation_config.json (as vLLM does) or an Ollama model's params, applied only to what a
// request leaves out, and reaching the sampler through the server.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "fake_backend.h"
#include "infera/server/generation_defaults.h"
#include "infera/server/http_server.h"
#include "server_fixture.h"

namespace infera::server {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

TEST(GenerationDefaults, ReadFromGenerationConfigAndOllamaParams) {
  // Qwen3's generation_config.json.
  GenerationDefaults d =
      parse_generation_defaults(json::parse(
                                    R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
                      "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95})"),
                                "generation_config.json");
  EXPECT_EQ(d.temperature, 0.6f);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_EQ(d.top_p, 0.95f);
  EXPECT_FALSE(d.min_p);
  EXPECT_FALSE(d.repetition_penalty);
  EXPECT_EQ(d.describe(), "temperature 0.6, top_p 0.95, top_k 20");
  // An Ollama params layer: repeat_penalty and stop are its names.
  d = parse_generation_defaults(
      json::parse(R"({"repeat_penalty": 1.1, "stop": ["<|im_start|>", "<|im_end|>"], "temperature": 0.7})"), "params",
      nullptr, DefaultsKind::kOllamaParams);
  EXPECT_EQ(d.repetition_penalty, 1.1f);
  EXPECT_EQ(d.stop, (std::vector<std::string>{"<|im_start|>", "<|im_end|>"}));
  EXPECT_EQ(d.temperature, 0.7f);
  // Values a request could not send are left out and named, as are settings not applied.
  std::vector<std::string> ignored;
  d = parse_generation_defaults(
      json::parse(R"({"temperature": 5, "top_p": 0, "top_k": "20", "min_p": 0.05, "stop": [1, 2], "num_ctx": 8192})"),
      "g.json", &ignored, DefaultsKind::kOllamaParams);
  EXPECT_FALSE(d.temperature);
  EXPECT_FALSE(d.top_p);
  EXPECT_FALSE(d.top_k);
  EXPECT_EQ(d.min_p, 0.05f);
  EXPECT_TRUE(d.stop.empty());
  ASSERT_EQ(ignored.size(), 5u);
  EXPECT_NE(ignored[0].find("g.json: temperature 5 is not a number in [0, 2]"), std::string::npos) << ignored[0];
  EXPECT_NE(ignored[4].find("g.json: num_ctx is not applied"), std::string::npos) << ignored[4];
  EXPECT_TRUE(parse_generation_defaults(json::array(), "x").empty());
  // transformers' own defaults in a generation_config.json say nothing of the model (vLLM
  // drops them too); an Ollama model's params say what they say.
  const json plain = json::parse(R"({"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0})");
  EXPECT_TRUE(parse_generation_defaults(plain, "g").empty());
  d = parse_generation_defaults(json::parse(R"({"temperature": 1.0, "top_k": 50})"), "p", nullptr,
                                DefaultsKind::kOllamaParams);
  EXPECT_EQ(d.temperature, 1.0f);
  EXPECT_EQ(d.top_k, 50);
  ignored.clear();
  d = parse_generation_defaults(json::parse(R"({"top_k": 20.5, "max_new_tokens": 2048, "presence_penalty": 1.5})"), "g",
                                &ignored);
  EXPECT_FALSE(d.top_k) << "a request could not send it";
  EXPECT_EQ(d.presence_penalty, 1.5f);
  ASSERT_EQ(ignored.size(), 2u);
  EXPECT_NE(ignored[0].find("top_k 20.5 is not a whole number"), std::string::npos) << ignored[0];
  EXPECT_NE(ignored[1].find("max_new_tokens is not applied"), std::string::npos) << ignored[1];
}

TEST(GenerationDefaults, FillOnlyWhatTheRequestLeftOut) {
  GenerationDefaults d;
  d.temperature = 0.6f;
  d.top_k = 20;
  d.stop = {"###"};
  ChatRequest r = parse_chat_request(
      json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "stop": []})"));
  d.apply(r.options);
  EXPECT_EQ(r.options.temperature, 1.0f) << "given, so kept";
  EXPECT_EQ(r.options.top_k, 20);
  EXPECT_TRUE(r.options.stop.empty()) << "an explicit empty stop list is the request's";
  CompletionRequest c = parse_completion_request(json::parse(R"({"prompt": "x", "temperature": null})"));
  d.apply(c.options);
  EXPECT_EQ(c.options.temperature, 0.6f) << "null is left out";
  EXPECT_EQ(c.options.stop, std::vector<std::string>{"###"});
}

TEST(GenerationDefaults, LoadedAsTheDeployConfigSays) {
  test::TempDir dir("infera_gen_defaults");
  std::ofstream(dir.file("generation_config.json")) << R"({"temperature": 0.6, "top_p": 0.95})";
  std::ofstream(dir.file("other.json")) << R"({"top_k": 5})";
  std::ofstream(dir.file("params")) << R"({"temperature": 0.2, "stop": ["</s>"]})";
  std::ofstream(dir.file("list.json")) << "[1, 2]";
  ModelDeployConfig m;
  m.path = dir.path().string();
  GenerationDefaults d = load_generation_defaults(m);
  EXPECT_EQ(d.temperature, 0.6f) << "auto: the directory's generation_config.json";
  EXPECT_EQ(d.source, dir.file("generation_config.json"));
  m.generation_config = "none";
  EXPECT_TRUE(load_generation_defaults(m).empty());
  m.generation_config = dir.file("other.json");
  EXPECT_EQ(load_generation_defaults(m).top_k, 5);
  m.generation_config = dir.path().string();
  EXPECT_EQ(load_generation_defaults(m).top_p, 0.95f) << "a folder holding generation_config.json";
  m.generation_config = "auto";
  m.ollama_params = dir.file("params");
  d = load_generation_defaults(m);
  EXPECT_EQ(d.temperature, 0.2f) << "an Ollama model's params layer";
  EXPECT_EQ(d.stop, std::vector<std::string>{"</s>"});
  m.ollama_params.clear();
  std::ofstream(dir.file("model.gguf")) << "GGUF";
  m.path = dir.file("model.gguf");
  EXPECT_TRUE(load_generation_defaults(m).empty()) << "a GGUF file carries none";
  m.path = dir.path().string();
  m.generation_config = "vllm";
  EXPECT_TRUE(load_generation_defaults(m).empty()) << "vLLM's name for none";
  m.generation_config = dir.file("missing.json");
  EXPECT_NE(test::error_of([&] { load_generation_defaults(m); }).find("is neither auto, none nor"), std::string::npos);
  m.generation_config = dir.file("list.json");
  EXPECT_NE(test::error_of([&] { load_generation_defaults(m); }).find("expected a JSON object"), std::string::npos);
  // An Ollama model's system layer: its system prompt, with params or without; an empty one
  // is none (as in Ollama); one past kMaxSystemBytes is named and left out; none takes none.
  m.generation_config = "auto";
  std::ofstream(dir.file("system")) << "You are a pirate.";
  m.ollama_system = dir.file("system");
  m.ollama_params = dir.file("params");
  d = load_generation_defaults(m);
  EXPECT_EQ(d.system, "You are a pirate.");
  EXPECT_EQ(d.temperature, 0.2f);
  EXPECT_NE(d.describe().find("a system prompt of 17 bytes"), std::string::npos) << d.describe();
  EXPECT_EQ(d.source, dir.file("params") + ", " + dir.file("system")) << "every file that gave something";
  m.ollama_params.clear();
  m.path = dir.file("model.gguf");
  d = load_generation_defaults(m);
  EXPECT_EQ(d.system, "You are a pirate.") << "a system prompt alone";
  EXPECT_FALSE(d.empty());
  EXPECT_EQ(d.source, dir.file("system"));
  m.generation_config = "none";
  EXPECT_TRUE(load_generation_defaults(m).empty());
  m.generation_config = "auto";
  std::ofstream(dir.file("system"), std::ios::trunc).flush();
  EXPECT_TRUE(load_generation_defaults(m).empty()) << "an empty system layer";
  std::ofstream(dir.file("system")) << std::string(static_cast<size_t>(kMaxSystemBytes) + 1, 'x');
  d = load_generation_defaults(m);
  EXPECT_FALSE(d.system.has_value());
  ASSERT_EQ(d.ignored.size(), 1u);
  EXPECT_NE(d.ignored[0].find("more than the"), std::string::npos) << d.ignored[0];
  std::filesystem::remove(dir.file("system"));
  std::filesystem::create_directory(dir.file("system"));
  d = load_generation_defaults(m);
  EXPECT_FALSE(d.system.has_value()) << "a system layer that cannot be read";
  ASSERT_EQ(d.ignored.size(), 1u);
  EXPECT_NE(d.ignored[0].find("cannot read the system prompt"), std::string::npos) << d.ignored[0];
  m.ollama_system.clear();
  // Its messages layer: preset messages, alone or with the rest; one that is not such a list
  // is named and left out, the other defaults kept.
  std::ofstream(dir.file("messages")) << R"([{"role":"user","content":"Ahoy?"},{"role":"assistant","content":"Arr."},)"
                                      << R"({"role":"user","content":null,"images":["x"]}])";
  m.ollama_messages = dir.file("messages");
  d = load_generation_defaults(m);
  ASSERT_EQ(d.messages.size(), 3u);
  EXPECT_EQ(d.messages[0].role, "user");
  EXPECT_EQ(d.messages[0].content, "Ahoy?");
  EXPECT_EQ(d.messages[1].role, "assistant");
  EXPECT_EQ(d.messages[2].content, "") << "a null content is empty; images are not taken";
  EXPECT_EQ(d.source, dir.file("messages"));
  EXPECT_TRUE(d.ignored.empty());
  EXPECT_NE(d.describe().find("3 preset messages"), std::string::npos) << d.describe();
  m.generation_config = "none";
  EXPECT_TRUE(load_generation_defaults(m).empty());
  m.generation_config = "auto";
  m.ollama_params = dir.file("params");
  const std::pair<std::string, std::string> bad[] = {
      {R"({"role":"user","content":"Hi"})", "expected a JSON array of messages"},
      {R"([{"role":"tool","content":"x"}])", R"(message 0 ({"content":"x","role":"tool"}) is not an object)"},
      {R"([{"role":"user","content":"a"},{"content":"b"}])", "message 1"},
      {R"([{"role":"user","content":7}])", "message 0's content 7 is not a string"},
      {R"([{"role":"user","content":"a"})", "are not JSON"},
      {std::string(200, '[') + std::string(200, ']'), "are not JSON (or nest too deep)"},
      {"[" + std::string(kMaxPresetMessages, ' ') + "]", ""},  // (an empty list: none, and no problem)
  };
  for (const auto& [text, why] : bad) {
    std::ofstream(dir.file("messages"), std::ios::trunc) << text;
    d = load_generation_defaults(m);
    EXPECT_TRUE(d.messages.empty()) << text;
    EXPECT_EQ(d.temperature, 0.2f) << "the params are kept: " << text;
    if (why.empty()) {
      EXPECT_TRUE(d.ignored.empty()) << text;
      continue;
    }
    ASSERT_EQ(d.ignored.size(), 1u) << text;
    EXPECT_NE(d.ignored[0].find(dir.file("messages") + ": "), std::string::npos) << d.ignored[0];
    EXPECT_NE(d.ignored[0].find(why), std::string::npos) << d.ignored[0];
    EXPECT_NE(d.ignored[0].find("(no preset messages taken)"), std::string::npos) << d.ignored[0];
  }
  nlohmann::json many = nlohmann::json::array();
  for (size_t i = 0; i <= kMaxPresetMessages; ++i) many.push_back({{"role", "user"}, {"content", "x"}});
  EXPECT_NE(test::error_of([&] { parse_preset_messages(many, "m"); }).find("257 messages, more than the 256 taken"),
            std::string::npos);
  many.erase(many.begin());
  EXPECT_EQ(parse_preset_messages(many, "m").size(), kMaxPresetMessages);
  std::ofstream(dir.file("messages"), std::ios::trunc) << std::string(static_cast<size_t>(kMaxSystemBytes) + 1, ' ');
  d = load_generation_defaults(m);
  ASSERT_EQ(d.ignored.size(), 1u);
  EXPECT_NE(d.ignored[0].find("more than the"), std::string::npos) << d.ignored[0];
  m.ollama_messages.clear();
  m.ollama_params.clear();
  m.path = dir.path().string();
  // The model's own file is advisory: one that is not JSON leaves the model without defaults.
  std::ofstream(dir.file("generation_config.json")) << R"({"temperature": 0.7,})";
  m.generation_config = "auto";
  d = load_generation_defaults(m);
  EXPECT_TRUE(d.empty());
  ASSERT_EQ(d.ignored.size(), 1u);
  EXPECT_NE(d.ignored[0].find("malformed JSON"), std::string::npos) << d.ignored[0];
}

// A chat that does not open with a system (or developer) message gets the model's system
// prompt in front, as Ollama's chat does; one that does keeps its own.
TEST(GenerationDefaults, SystemPromptOnlyWhereTheChatHasNone) {
  GenerationDefaults d;
  std::vector<ChatMessage> msgs(1);
  msgs[0].role = "user";
  msgs[0].content = "Hi";
  d.apply_chat(msgs);
  EXPECT_EQ(msgs.size(), 1u) << "no system prompt: nothing added";
  d.system = "Be brief.";
  d.apply_chat(msgs);
  ASSERT_EQ(msgs.size(), 2u);
  EXPECT_EQ(msgs[0].role, "system");
  EXPECT_EQ(msgs[0].content, "Be brief.");
  EXPECT_EQ(msgs[1].content, "Hi");
  d.apply_chat(msgs);
  EXPECT_EQ(msgs.size(), 2u) << "a chat that opens with a system message keeps it";
  msgs[0].role = "developer";
  d.apply_chat(msgs);
  EXPECT_EQ(msgs.size(), 2u) << "developer is the system role of newer OpenAI clients";
  std::vector<ChatMessage> none;
  d.apply_chat(none);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].role, "system");
}

std::string roles_and_contents(const std::vector<ChatMessage>& chat) {
  std::string out;
  for (const ChatMessage& m : chat) out += m.role + ":" + m.content.value_or("") + " ";
  return out;
}

// Messages of (role, content) pairs.
std::vector<ChatMessage> turns(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<ChatMessage> out;
  for (const auto& [role, content] : pairs) {
    out.emplace_back();
    out.back().role = role;
    out.back().content = content;
  }
  return out;
}

// Preset messages come before the chat's own, after its leading system messages; the model's
// system prompt goes in front only where the chat brought none (Ollama's order, but for a
// chat's own system message, which stays first and replaces the model's system turns).
TEST(GenerationDefaults, PresetMessagesBeforeTheChatsOwn) {
  GenerationDefaults d;
  d.messages = turns({{"user", "Ahoy?"}, {"assistant", "Arr."}});
  const auto chat = turns;
  std::vector<ChatMessage> c = chat({{"user", "Hi"}});
  EXPECT_EQ(d.apply_chat(c), 2u) << "the turns every such chat starts with";
  EXPECT_EQ(roles_and_contents(c), "user:Ahoy? assistant:Arr. user:Hi ");
  c = chat({{"system", "S"}, {"developer", "D"}, {"user", "Hi"}});
  EXPECT_EQ(d.apply_chat(c), 4u);
  EXPECT_EQ(roles_and_contents(c), "system:S developer:D user:Ahoy? assistant:Arr. user:Hi ");
  d.system = "Be brief.";
  c = chat({{"user", "Hi"}, {"assistant", "Hello"}, {"user", "More"}});
  EXPECT_EQ(d.apply_chat(c), 3u);
  EXPECT_EQ(roles_and_contents(c), "system:Be brief. user:Ahoy? assistant:Arr. user:Hi assistant:Hello user:More ");
  c = chat({{"system", "S"}, {"user", "Hi"}});
  d.apply_chat(c);
  EXPECT_EQ(roles_and_contents(c), "system:S user:Ahoy? assistant:Arr. user:Hi ");
  c.clear();
  d.apply_chat(c);
  EXPECT_EQ(roles_and_contents(c), "system:Be brief. user:Ahoy? assistant:Arr. ");

  // Presets that open with a system message (a Modelfile's MESSAGE system): joined with the
  // system prompt into one system message; a chat's own replaces both (a second system
  // message after the first is what many templates refuse).
  d.messages.insert(d.messages.begin(), ChatMessage{"system", "Talk like a pirate.", {}, {}, {}, {}});
  c = chat({{"user", "Hi"}});
  d.apply_chat(c);
  EXPECT_EQ(roles_and_contents(c), "system:Be brief.\n\nTalk like a pirate. user:Ahoy? assistant:Arr. user:Hi ");
  c = chat({{"developer", "D"}, {"user", "Hi"}});
  d.apply_chat(c);
  EXPECT_EQ(roles_and_contents(c), "developer:D user:Ahoy? assistant:Arr. user:Hi ");
  d.system.reset();
  c = chat({{"user", "Hi"}});
  d.apply_chat(c);
  EXPECT_EQ(roles_and_contents(c), "system:Talk like a pirate. user:Ahoy? assistant:Arr. user:Hi ");

  // Presets that end on the role of the chat's first turn: the two are one turn, as Ollama
  // merges same-role neighbours; not a turn that carries more than text.
  d.messages.pop_back();
  c = chat({{"user", "Hi"}, {"assistant", "Hello"}});
  EXPECT_EQ(d.apply_chat(c), 1u) << "the joined turn is the chat's own";
  EXPECT_EQ(roles_and_contents(c), "system:Talk like a pirate. user:Ahoy?\n\nHi assistant:Hello ");
  d.messages.back().role = "assistant";
  c = chat({{"assistant", "Calling"}});
  c[0].tool_calls.emplace_back();
  d.apply_chat(c);
  EXPECT_EQ(roles_and_contents(c), "system:Talk like a pirate. assistant:Ahoy? assistant:Calling ");
  EXPECT_EQ(c[2].tool_calls.size(), 1u);
  // Without the model's turns: the chat's leading system messages.
  c = chat({{"system", "S"}, {"user", "Hi"}});
  EXPECT_EQ(GenerationDefaults().apply_chat(c), 1u);
  EXPECT_EQ(roles_and_contents(c), "system:S user:Hi ");
}

// The end of the model's turns is a prefix-cache boundary (a state checkpoint on hybrid
// models): the token count of the conversation rendered up to there, beside the others.
TEST(GenerationDefaults, TheModelsTurnsEndAtAPrefixBoundary) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  ModelDeployConfig md;
  md.name = "stories";
  auto model = testing::stories_instance(md);
  GenerationDefaults d;
  d.system = "You are a pirate.";
  d.messages = turns({{"user", "Ahoy?"}, {"assistant", "Arr."}});
  ChatRequest r;
  r.messages = turns({{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Where is the gold?"}});
  const size_t shared = d.apply_chat(r.messages);
  ASSERT_EQ(shared, 3u);
  const Tokenizer& tok = model->tokenizer();
  const std::vector<int32_t> ids = tok.encode(model->render_chat(r), false);
  const std::vector<int32_t> at = model->message_boundaries(r, ids, shared);
  ASSERT_EQ(at.size(), 3u);
  const std::vector<int32_t> before = model->message_boundaries(r, ids);
  ASSERT_EQ(before.size(), 2u) << "without it: after the system message, before the last";
  EXPECT_EQ(at[0], before[0]);
  EXPECT_EQ(at[2], before[1]);
  EXPECT_LT(at[0], at[1]);
  EXPECT_LT(at[1], at[2]);
  const std::string head = tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + at[1]));
  EXPECT_TRUE(head.ends_with("Arr.<|im_end|>\n")) << head;
  EXPECT_EQ(head.find("Hi"), std::string::npos) << head;
}

// Through the server: the sampler gets the model's defaults for what the request left out.
TEST(GenerationDefaults, ReachTheSampler) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  const Tokenizer tok = Tokenizer::load(test::stories_dir());
  auto backend = std::make_shared<testing::FakeBackend>(tok.encode("Once upon a time.", false), 1ms);
  ModelDeployConfig d;
  d.name = "stories";
  auto model = testing::stories_instance(d);
  GenerationDefaults defaults;
  defaults.temperature = 0.6f;
  defaults.top_k = 20;
  defaults.repetition_penalty = 1.1f;
  model->set_generation_defaults(defaults);
  model->set_backend(backend);
  auto server = testing::start_server({}, {model});
  httplib::Client c = testing::local_client(server->port());
  const json chat = {{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}};
  ASSERT_EQ(c.Post("/v1/chat/completions", chat.dump(), "application/json")->status, 200);
  SamplingParams p = backend->last_sampling();
  EXPECT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.repetition_penalty, 1.1f);
  json given = chat;
  given["temperature"] = 0.0;
  given["top_k"] = 3;
  ASSERT_EQ(c.Post("/v1/chat/completions", given.dump(), "application/json")->status, 200);
  p = backend->last_sampling();
  EXPECT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_k, 3);
  EXPECT_EQ(p.repetition_penalty, 1.1f);
  // An Ollama model's system prompt reaches the prompt of a chat without one, and only there.
  defaults.system = "You are a pirate.";
  model->set_generation_defaults(defaults);
  ASSERT_EQ(c.Post("/v1/chat/completions", chat.dump(), "application/json")->status, 200);
  EXPECT_NE(tok.decode(backend->last_prompt_ids()).find("You are a pirate."), std::string::npos)
      << tok.decode(backend->last_prompt_ids());
  json own = chat;
  own["messages"] = {{{"role", "system"}, {"content", "You are a poet."}}, {{"role", "user"}, {"content", "Hi"}}};
  ASSERT_EQ(c.Post("/v1/chat/completions", own.dump(), "application/json")->status, 200);
  const std::string text = tok.decode(backend->last_prompt_ids());
  EXPECT_EQ(text.find("pirate"), std::string::npos) << text;
  EXPECT_NE(text.find("You are a poet."), std::string::npos) << text;
  // Its preset messages reach every chat's prompt, after the system prompt, before the
  // chat's own; a completion's prompt is left as sent.
  defaults.messages.resize(1);
  defaults.messages[0].role = "assistant";
  defaults.messages[0].content = "Arr, matey.";
  model->set_generation_defaults(defaults);
  ASSERT_EQ(c.Post("/v1/chat/completions", chat.dump(), "application/json")->status, 200);
  const std::string with = tok.decode(backend->last_prompt_ids());
  const size_t pirate = with.find("You are a pirate."), preset = with.find("Arr, matey."), hi = with.rfind("Hi");
  ASSERT_NE(preset, std::string::npos) << with;
  EXPECT_LT(pirate, preset) << with;
  EXPECT_LT(preset, hi) << with;
  const json completion = {{"model", "stories"}, {"prompt", "Once"}, {"max_tokens", 2}};
  ASSERT_EQ(c.Post("/v1/completions", completion.dump(), "application/json")->status, 200);
  EXPECT_EQ(tok.decode(backend->last_prompt_ids()).find("matey"), std::string::npos);
  server->stop();
}

}  // namespace
}  // namespace infera::server
