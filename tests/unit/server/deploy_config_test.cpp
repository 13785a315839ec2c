#include "infera/server/deploy_config.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/io/safetensors.h"
#include "infera/model/model.h"
#include "infera/server/model_instance.h"

namespace infera::server {
namespace {

const std::string kStories = test::stories_dir();
const std::string kChatml = std::string(INFERA_SOURCE_DIR) + "/tests/conformance/data/chatml.jinja";

using test::error_of;

using test::free_port;

TEST(DeployConfig, ParsesEverySetting) {
  ::setenv("INFERA_TEST_KEY", "from-the-environment", 1);
  const DeployConfig c = parse_deploy_config(R"(
server:
  host: 0.0.0.0
  port: 9000
  body_limit: 1MiB
  request_timeout_s: 30
  audit_log: /tmp/audit.jsonl
  metrics: false
  api_keys:
    - id: team-a
      key: literal-key-123
      models: [small]
      requests_per_minute: 60
      tokens_per_minute: 10000
    - id: team-b
      key_env: INFERA_TEST_KEY
models:
  - name: small
    path: /models/small
    profile: long-context
    threads: 2
    max_input_len: 1000
    max_output_len: 200
    kv_cache_memory: 256MiB
    port: 9001
    speculative: {method: none}
  - path: /models/other
)",
                                             "test.yaml");
  EXPECT_EQ(c.server.host, "0.0.0.0");
  EXPECT_EQ(c.server.port, 9000);
  EXPECT_EQ(c.server.body_limit_bytes, 1 << 20);
  EXPECT_FALSE(c.server.metrics);
  ASSERT_EQ(c.server.api_keys.size(), 2u);
  EXPECT_EQ(c.server.api_keys[0].models, std::vector<std::string>{"small"});
  EXPECT_EQ(c.server.api_keys[1].key, "from-the-environment");
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].profile, "long-context");
  EXPECT_EQ(c.models[0].max_input_len, 1000);
  EXPECT_EQ(c.models[0].kv_cache_bytes, 256 << 20);
  EXPECT_EQ(c.models[0].port, 9001);
  EXPECT_FALSE(c.models[1].max_input_len.has_value());
}

TEST(DeployConfig, TheExampleFileParses) {
  ::setenv("INFERA_KEY_TEAM_CHAT", "example-key-1", 1);
  ::setenv("INFERA_KEY_BATCH", "example-key-2", 1);
  const DeployConfig c = load_deploy_config(std::string(INFERA_SOURCE_DIR) + "/examples/deploy.yaml");
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].name, "chat");
  EXPECT_EQ(c.models[1].port, 8001);
  ASSERT_EQ(c.server.api_keys.size(), 2u);
  EXPECT_EQ(c.server.api_keys[0].key, "example-key-1");
  EXPECT_EQ(c.server.api_keys[0].models, std::vector<std::string>{"chat"});
}

TEST(DeployConfig, ReportsEveryProblemAtOnce) {
  ::unsetenv("INFERA_TEST_MISSING");
  const std::string msg = error_of([] {
    parse_deploy_config(R"(
server:
  port: eighty
  colour: blue
  api_keys:
    - id: x
      key_env: INFERA_TEST_MISSING
models:
  - name: a
    path: /x
    max_input_len: lots
    kv_cache_memory: 12 parsecs
)",
                        "bad.yaml");
  });
  EXPECT_NE(msg.find("bad.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("server.port"), std::string::npos) << msg;
  EXPECT_NE(msg.find("server.colour"), std::string::npos) << msg;
  EXPECT_NE(msg.find("INFERA_TEST_MISSING"), std::string::npos) << msg;
  EXPECT_NE(msg.find("models[0].max_input_len"), std::string::npos) << msg;
  EXPECT_NE(msg.find("models[0].kv_cache_memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5 problems"), std::string::npos) << msg;
}

TEST(DeployConfig, RejectsBrokenYamlWithLine) {
  const std::string msg = error_of([] { parse_deploy_config("models:\n  - name: [unclosed\n", "x.yaml"); });
  EXPECT_NE(msg.find("line"), std::string::npos) << msg;
}

TEST(DeployConfig, ProfilesResolveWithinTheModelContext) {
  ModelDeployConfig m;
  ResolvedLimits chat = resolve_limits(m, 512);
  EXPECT_EQ(chat.max_context, 512);
  EXPECT_LE(chat.max_input_len, 512);
  EXPECT_LE(chat.max_output_len, 512);
  m.profile = "long-context";
  m.max_output_len = 100;
  ResolvedLimits lc = resolve_limits(m, 32768);
  EXPECT_EQ(lc.max_input_len, 32768);
  EXPECT_EQ(lc.max_output_len, 100);
  EXPECT_GE(lc.max_batch_tokens, lc.prefill_chunk);
}

TEST(PrepareModels, LoadsTokenizerAndTemplateWithoutWeights) {
  INFERA_REQUIRE_FIXTURE(kStories);
  DeployConfig c;
  ModelDeployConfig m;
  m.path = kStories;
  m.chat_template_file = kChatml;
  c.models.push_back(m);
  c.server.port = free_port();  // the probe must succeed
  auto models = prepare_models(c);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]->name(), "stories260K");
  EXPECT_TRUE(models[0]->has_chat_template());
  EXPECT_EQ(models[0]->state(), ModelState::kLoading);
  EXPECT_EQ(models[0]->limits().max_context, 512);
}

// The model directory's generation_config.json becomes the instance's sampling defaults;
// a file the deployment names that is not one is a configuration error.
TEST(PrepareModels, TakesTheModelsSamplingDefaults) {
  INFERA_REQUIRE_FIXTURE(kStories);
  test::TempDir dir("infera_prepare_gen");
  for (const auto& e : std::filesystem::directory_iterator(kStories)) {
    if (e.path().filename() != "generation_config.json")
      std::filesystem::create_symlink(e.path(), dir.path() / e.path().filename());
  }
  std::ofstream(dir.file("generation_config.json")) << R"({"eos_token_id": 2, "temperature": 0.6, "top_k": 20})";
  DeployConfig c;
  ModelDeployConfig m;
  m.path = dir.path().string();
  m.chat_template_file = kChatml;
  c.models.push_back(m);
  c.server.port = free_port();
  auto models = prepare_models(c);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]->generation_defaults().temperature, 0.6f);
  EXPECT_EQ(models[0]->generation_defaults().top_k, 20);
  c.models[0].generation_config = "none";
  EXPECT_TRUE(prepare_models(c).at(0)->generation_defaults().empty());
  c.models[0].generation_config = dir.file("nope.json");
  const std::string e = error_of([&] { prepare_models(c); });
  EXPECT_NE(e.find(".generation_config: '" + dir.file("nope.json") + "' is neither auto, none nor"), std::string::npos)
      << e;
}

// An Ollama model's system prompt is kept where the chat template renders it, and left out
// (not a failure of every chat) where the template takes no system role.
TEST(PrepareModels, AnOllamaSystemPromptTheTemplateRefusesIsLeftOut) {
  INFERA_REQUIRE_FIXTURE(kStories);
  test::TempDir dir("infera_prepare_system");
  std::ofstream(dir.file("system")) << "You are a pirate.";
  std::ofstream(dir.file("no_system.jinja"))
      << "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{{ m.content }}{% endfor %}";
  DeployConfig c;
  ModelDeployConfig m;
  m.path = kStories;
  m.chat_template_file = kChatml;
  m.ollama_system = dir.file("system");
  c.models.push_back(m);
  c.server.port = free_port();
  EXPECT_EQ(prepare_models(c).at(0)->generation_defaults().system, "You are a pirate.");
  c.models[0].chat_template_file = dir.file("no_system.jinja");
  const auto refused = prepare_models(c).at(0);
  EXPECT_FALSE(refused->generation_defaults().system.has_value());
  ChatRequest chat;
  chat.messages.resize(1);
  chat.messages[0].role = "user";
  chat.messages[0].content = "Hi";
  refused->generation_defaults().apply_chat(chat.messages);
  EXPECT_EQ(refused->render_chat(chat), "Hi") << "a chat without a system message still renders";
}

// Preset messages (an Ollama messages layer) likewise: kept where the template renders them in
// front of a user's message (one that ends on a user turn joins it), left out where it
// refuses them, or where with a user's turn they fill max_input_len.
TEST(PrepareModels, OllamaPresetMessagesTheTemplateRefusesAreLeftOut) {
  INFERA_REQUIRE_FIXTURE(kStories);
  test::TempDir dir("infera_prepare_messages");
  std::ofstream(dir.file("alternate.jinja"))
      << "{% for m in messages %}{% if loop.index0 > 0 and m.role == messages[loop.index0 - 1].role %}"
         "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
         "{% if m.role == 'assistant' and (loop.first or messages[loop.index0 - 1].role == 'system') %}"
         "{{ raise_exception('The first turn must be the user\\'s') }}{% endif %}{{ m.role }}={{ m.content }};"
         "{% endfor %}";
  DeployConfig c;
  ModelDeployConfig m;
  m.path = kStories;
  m.chat_template_file = dir.file("alternate.jinja");
  m.ollama_messages = dir.file("messages");
  c.models.push_back(m);
  c.server.port = free_port();
  std::ofstream(dir.file("messages")) << R"([{"role":"user","content":"Ahoy?"},{"role":"assistant","content":"Arr."}])";
  const auto kept = prepare_models(c).at(0);
  ASSERT_EQ(kept->generation_defaults().messages.size(), 2u);
  ChatRequest chat;
  chat.messages.resize(1);
  chat.messages[0].role = "user";
  chat.messages[0].content = "Hi";
  ChatRequest with = chat;
  kept->generation_defaults().apply_chat(with.messages);
  EXPECT_EQ(kept->render_chat(with), "user=Ahoy?;assistant=Arr.;user=Hi;");
  // With a chat's own system message the presets follow it.
  with = chat;
  with.messages.insert(with.messages.begin(), ChatMessage{"system", "Be brief.", {}, {}, {}, {}});
  kept->generation_defaults().apply_chat(with.messages);
  EXPECT_EQ(kept->render_chat(with), "system=Be brief.;user=Ahoy?;assistant=Arr.;user=Hi;");
  // Presets that end on a user turn: joined with the chat's first one, so they alternate.
  std::ofstream(dir.file("messages"), std::ios::trunc) << R"([{"role":"user","content":"Ahoy?"}])";
  const auto joined = prepare_models(c).at(0);
  ASSERT_EQ(joined->generation_defaults().messages.size(), 1u);
  with = chat;
  joined->generation_defaults().apply_chat(with.messages);
  EXPECT_EQ(joined->render_chat(with), "user=Ahoy?\n\nHi;");
  // Presets that open on an assistant turn: this template refuses them.
  std::ofstream(dir.file("messages"), std::ios::trunc) << R"([{"role":"assistant","content":"Arr."}])";
  const auto refused = prepare_models(c).at(0);
  EXPECT_TRUE(refused->generation_defaults().messages.empty());
  EXPECT_EQ(refused->generation_defaults().source, "") << "the dropped layer is no longer named as a source";
  with = chat;
  refused->generation_defaults().apply_chat(with.messages);
  EXPECT_EQ(refused->render_chat(with), "user=Hi;") << "chats still render, without them";
  // Presets (or a system prompt) that fill max_input_len with a user's turn.
  std::ofstream(dir.file("messages"), std::ios::trunc)
      << R"([{"role":"user","content":")" << std::string(100, 'a') << R"("},{"role":"assistant","content":"b"}])";
  std::ofstream(dir.file("system")) << std::string(100, 'a');
  c.models[0].ollama_system = dir.file("system");
  c.models[0].max_input_len = 64;
  c.models[0].max_output_len = 64;
  const auto full = prepare_models(c).at(0);
  EXPECT_TRUE(full->generation_defaults().messages.empty());
  EXPECT_FALSE(full->generation_defaults().system.has_value());
  c.models[0].max_input_len.reset();
  c.models[0].max_output_len.reset();
  EXPECT_EQ(prepare_models(c).at(0)->generation_defaults().messages.size(), 2u) << "room enough";
}

TEST(PrepareModels, EveryConfigurationErrorIsNamed) {
  INFERA_REQUIRE_FIXTURE(kStories);
  const auto dir = std::filesystem::temp_directory_path() / ("infera_server_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "no_tokenizer");
  std::ofstream(dir / "no_tokenizer" / "config.json") << "{}";
  std::ofstream(dir / "bad.jinja") << "{% for x in %}";
  // Occupy a port so the probe fails.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int busy_port = ntohs(addr.sin_port);

  DeployConfig c;
  c.server.port = busy_port;
  ModelDeployConfig missing;
  missing.name = "missing";
  missing.path = (dir / "does_not_exist").string();
  ModelDeployConfig no_tok;
  no_tok.name = "no_tok";
  no_tok.path = (dir / "no_tokenizer").string();
  ModelDeployConfig dup1;
  dup1.name = "dup";
  dup1.path = kStories;
  dup1.port = 40001;
  dup1.chat_template_file = (dir / "bad.jinja").string();
  ModelDeployConfig dup2;
  dup2.name = "dup";
  dup2.path = kStories;
  dup2.port = 40001;
  dup2.kv_cache_bytes = 1000;  // far too small for 512 tokens
  dup2.profile = "huge";
  c.models = {missing, no_tok, dup1, dup2};
  c.server.api_keys.push_back({"k", "short", {"nobody"}, 0, 0, std::nullopt});
  const std::string msg = error_of([&] { prepare_models(c); });
  ::close(fd);
  std::filesystem::remove_all(dir);
  EXPECT_NE(msg.find("models[0] ('missing').path"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has no tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'dup' is used by two models"), std::string::npos) << msg;
  EXPECT_NE(msg.find("40001 is also used by models[2].port"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not parse"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kv_cache_memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("profile"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at least 8 characters"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no model is named 'nobody'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("server.port: cannot listen"), std::string::npos) << msg;
}

// Qwen3-Next's config.json does not declare its MTP head (the mtp.* tensors do), so
// `speculative.method: mtp` is checked against the checkpoint, not only config.json.
TEST(PrepareModels, MtpOnQwen3NextIsFoundInTheCheckpoint) {
  const auto dir = std::filesystem::temp_directory_path() / ("infera_server_q3n_" + std::to_string(::getpid()));
  const std::string cmd =
      "/usr/bin/python3 " + std::string(INFERA_SOURCE_DIR) + "/tools/gen_model.py " + dir.string() +
      " --arch qwen3_next --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2"
      " --lin-v-heads 4 --lin-dk 16 --lin-dv 8 --experts 6 --experts-per-tok 2 --moe-ffn 32"
      " --shared-ffn 48 --vocab 300 --seed 5 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  DeployConfig c;
  c.server.port = free_port();
  ModelDeployConfig m;
  m.name = "next";
  m.path = dir.string();
  m.chat_template_file = kChatml;
  m.speculative.method = "mtp";
  c.models.push_back(m);
  const std::string with_head = error_of([&] { prepare_models(c); });
  // The same checkpoint without its MTP tensors is refused, naming the fix.
  {
    WeightStore store = WeightStore::open(dir.string());
    std::vector<TensorToWrite> keep;
    for (const std::string& name : store.names()) {
      if (name.rfind("mtp.", 0) == 0) continue;
      const TensorInfo& t = store.get(name);
      keep.push_back({name, t.dtype, t.shape, t.data, t.nbytes});
    }
    write_safetensors((dir / "model.stripped").string(), keep);
  }
  std::filesystem::rename(dir / "model.stripped", dir / "model.safetensors");
  const std::string without_head = error_of([&] { prepare_models(c); });
  std::filesystem::remove_all(dir);
  EXPECT_EQ(with_head, "");
  EXPECT_NE(without_head.find("speculative.method: mtp needs a model with a multi-token-prediction head"),
            std::string::npos)
      << without_head;
}

// The KV budget check counts the layers that keep a KV cache, as the loaded model's
// kv_shape() does: a hybrid's linear-attention layers keep a fixed recurrent state, not K/V.
TEST(PrepareModels, HybridKvBudgetCountsOnlyFullAttentionLayers) {
  const auto dir = std::filesystem::temp_directory_path() / ("infera_server_q35_" + std::to_string(::getpid()));
  test::generate_model(dir,
                       "--arch qwen3_5 --hidden 64 --layers 8 --heads 4 --kv-heads 2 --head-dim 32 --lin-k-heads 2"
                       " --lin-v-heads 4 --lin-dk 16 --lin-dv 16 --ffn 96 --vocab 300 --max-pos 512 --seed 7");
  ASSERT_TRUE(std::filesystem::exists(dir / "config.json"));
  // Layers 3 and 7 are full attention, plus the MTP layer: 3 KV layers of 2 heads x 32, f32.
  const int64_t per_token = 3 * 2 * 2 * 32 * 4;
  {
    std::unique_ptr<Model> model = load_model(dir.string());
    ASSERT_EQ(model->kv_shape(16).bytes_per_token(), per_token);
  }
  DeployConfig c;
  c.server.port = free_port();
  ModelDeployConfig m;
  m.name = "hybrid";
  m.path = dir.string();
  m.chat_template_file = kChatml;
  m.max_input_len = 256;
  m.max_output_len = 256;
  m.kv_cache_bytes = 512 * per_token;  // exactly the longest sequence
  c.models.push_back(m);
  const std::string enough = error_of([&] { prepare_models(c); });
  c.models[0].kv_cache_bytes = 512 * per_token - 1;
  const std::string short_by_one = error_of([&] { prepare_models(c); });
  std::filesystem::remove_all(dir);
  EXPECT_EQ(enough, "");
  EXPECT_NE(short_by_one.find("kv_cache_memory"), std::string::npos) << short_by_one;
  EXPECT_NE(short_by_one.find("at least " + std::to_string(512 * per_token) + " bytes"), std::string::npos)
      << short_by_one;
}

}  // namespace
}  // namespace infera::server
