// A real engine emitting a tool call: a tiny Llama checkpoint written here whose weights
// make greedy decoding produce a fixed Hermes/Qwen-style block
//
//   <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>
//
// served through the whole path (deploy config -> prepare_models -> load -> Engine ->
// HTTP), so the tool-call parser sees what the engine's tokens detokenize to, not a
// script. The network is a bigram table run through the real Llama forward: one-hot
// token embeddings, attention and MLP outputs zeroed (the residual stream keeps the
// embedding), and an output head whose row for token b reads the embedding of the token a
// that b follows. The tokenizer is byte-level BPE (GPT-2 alphabet, no merges) whose added
// tokens are the block's pieces, so every token of the block has exactly one successor.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/io/safetensors.h"
#include "infera/server/http_server.h"
#include "infera/tokenizer/unicode.h"

namespace infera::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kArguments = R"({"city": "Paris"})";
// Added tokens after the 256 byte tokens, in id order.
const std::vector<std::pair<std::string, bool>> kAddedTokens = {
    {"<|endoftext|>", true},  // 256
    {"<|im_start|>", true},  // 257
    {"<|im_end|>", true},  // 258: EOS
    {"<tool_call>", false},  // 259 (not special, as in Qwen3: it must survive detokenization)
    {"</tool_call>", false},  // 260
    {"\n{\"name\": \"get_weather\", ", false},  // 261
    {"\"arguments\": " + kArguments + "}\n", false},  // 262
};
constexpr int32_t kVocab = 263;
constexpr int32_t kImEnd = 258, kToolCall = 259, kToolCallEnd = 260, kNamePiece = 261, kArgsPiece = 262;
constexpr int64_t kHidden = 320, kHeads = 5, kHeadDim = 64, kFfn = 64;

const std::string kChatml =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if "
    "message['content'] is string else '') + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- "
    "'<|im_start|>assistant\\n' }}{%- endif %}";

// The greedy successor of each token: the block in order, and the block's start after
// anything else (the generation prompt ends with the byte "\n").
int32_t successor(int32_t token) {
  switch (token) {
    case kToolCall: return kNamePiece;
    case kNamePiece: return kArgsPiece;
    case kArgsPiece: return kToolCallEnd;
    case kToolCallEnd: return kImEnd;
    default: return kToolCall;
  }
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2);
}

void write_model(const fs::path& dir) {
  fs::create_directories(dir);
  write_json(dir / "config.json", {{"architectures", {"LlamaForCausalLM"}},
                                   {"model_type", "llama"},
                                   {"hidden_size", kHidden},
                                   {"intermediate_size", kFfn},
                                   {"num_hidden_layers", 1},
                                   {"num_attention_heads", kHeads},
                                   {"num_key_value_heads", kHeads},
                                   {"head_dim", kHeadDim},
                                   {"hidden_act", "silu"},
                                   {"vocab_size", kVocab},
                                   {"max_position_embeddings", 512},
                                   {"rms_norm_eps", 1e-5},
                                   {"rope_theta", 10000.0},
                                   {"tie_word_embeddings", false},
                                   {"bos_token_id", 256},
                                   {"eos_token_id", kImEnd},
                                   {"torch_dtype", "float32"}});

  // Tokenizer: the 256 GPT-2 byte characters, no merges, the added tokens above.
  json vocab = json::object();
  const auto& b2u = unicode::byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string piece;
    unicode::append_utf8(piece, b2u[b]);
    vocab[piece] = b;
  }
  json added = json::array();
  for (size_t i = 0; i < kAddedTokens.size(); ++i) {
    added.push_back({{"id", 256 + static_cast<int>(i)},
                     {"content", kAddedTokens[i].first},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", kAddedTokens[i].second}});
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", true}};
  write_json(dir / "tokenizer.json", {{"version", "1.0"},
                                      {"truncation", nullptr},
                                      {"padding", nullptr},
                                      {"added_tokens", added},
                                      {"normalizer", nullptr},
                                      {"pre_tokenizer", byte_level},
                                      {"post_processor", byte_level},
                                      {"decoder", byte_level},
                                      {"model",
                                       {{"type", "BPE"},
                                        {"dropout", nullptr},
                                        {"unk_token", nullptr},
                                        {"continuing_subword_prefix", ""},
                                        {"end_of_word_suffix", ""},
                                        {"fuse_unk", false},
                                        {"byte_fallback", false},
                                        {"ignore_merges", false},
                                        {"vocab", vocab},
                                        {"merges", json::array()}}}});
  write_json(dir / "tokenizer_config.json", {{"add_bos_token", false},
                                             {"bos_token", nullptr},
                                             {"eos_token", "<|im_end|>"},
                                             {"chat_template", kChatml},
                                             {"tokenizer_class", "Qwen2Tokenizer"}});

  // Weights, all f32. [rows, cols] as Hugging Face stores them (out, in).
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> w;
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape, float fill) -> std::vector<float>& {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& t = w[name];
    t.first = std::move(shape);
    t.second.assign(static_cast<size_t>(n), fill);
    return t.second;
  };
  std::vector<float>& embed = tensor("model.embed_tokens.weight", {kVocab, kHidden}, 0.0f);
  for (int32_t t = 0; t < kVocab; ++t) embed[t * kHidden + t] = 1.0f;  // one-hot
  const std::string l = "model.layers.0.";
  tensor(l + "input_layernorm.weight", {kHidden}, 1.0f);
  tensor(l + "post_attention_layernorm.weight", {kHidden}, 1.0f);
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
    tensor(l + "self_attn." + p + ".weight", {kHidden, kHidden}, 0.0f);
  tensor(l + "mlp.gate_proj.weight", {kFfn, kHidden}, 0.0f);
  tensor(l + "mlp.up_proj.weight", {kFfn, kHidden}, 0.0f);
  tensor(l + "mlp.down_proj.weight", {kHidden, kFfn}, 0.0f);
  tensor("model.norm.weight", {kHidden}, 1.0f);
  std::vector<float>& head = tensor("lm_head.weight", {kVocab, kHidden}, 0.0f);
  for (int32_t a = 0; a < kVocab; ++a) head[successor(a) * kHidden + a] = 1.0f;
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : w) {
    out.push_back({name, DType::kF32, t.first, t.second.data(), t.second.size() * sizeof(float)});
  }
  write_safetensors((dir / "model.safetensors").string(), out);
}

using test::free_port;

class ToolCallModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("infera_tool_call_model_" + std::to_string(::getpid()));
    write_model(dir_);
    DeployConfig config;
    // Validation wants a real port number (and probes it); the server itself then binds any free one.
    config.server.port = free_port();
    ModelDeployConfig m;
    m.name = "toolbot";
    m.path = dir_.string();
    m.threads = 1;
    m.kv_cache_bytes = 8 << 20;
    m.max_num_seqs = 4;
    m.max_batch_tokens = 256;
    m.prefill_chunk = 256;
    config.models.push_back(m);
    models_ = prepare_models(config);
    for (auto& instance : models_) instance->load();
    config.server.port = 0;
    server_ = new HttpServer(config.server, models_);
    server_->bind();
    server_->start();
  }
  static void TearDownTestSuite() {
    server_->stop();
    delete server_;
    models_.clear();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static httplib::Result post(const json& body) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(30, 0);
    return c.Post("/v1/chat/completions", body.dump(), "application/json");
  }

  static json request(const json& extra) {
    json body = {{"model", "toolbot"},
                 {"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
                 {"temperature", 0},
                 {"max_tokens", 20}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  }

  static const json& tools() {
    static const json t =
        json::array({{{"type", "function"},
                      {"function",
                       {{"name", "get_weather"},
                        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
    return t;
  }

  static inline fs::path dir_;
  static inline std::vector<std::shared_ptr<ModelInstance>> models_;
  static inline HttpServer* server_ = nullptr;
};

TEST_F(ToolCallModel, ModelLoadedAndItsTokenizerSplitsTheBlockIntoItsPieces) {
  ASSERT_EQ(models_.size(), 1u);
  ASSERT_EQ(models_[0]->state(), ModelState::kReady);
  const std::string block = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + kArguments + "}\n</tool_call>";
  EXPECT_EQ(models_[0]->tokenizer().encode(block, false),
            (std::vector<int32_t>{kToolCall, kNamePiece, kArgsPiece, kToolCallEnd}));
}

TEST_F(ToolCallModel, EmittedBlockBecomesToolCalls) {
  auto r = post(request({{"tools", tools()}, {"logprobs", true}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null()) << choice;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice;
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json::parse(kArguments));
  // The engine generated the four pieces and then stopped on <|im_end|> (counted, not shown).
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  const json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  EXPECT_EQ(content[0]["token"], "<tool_call>");
  EXPECT_EQ(content[3]["token"], "</tool_call>");
  for (const auto& e : content) EXPECT_GT(e["logprob"].get<double>(), -1e-3);  // the bigram is certain
}

TEST_F(ToolCallModel, StreamedBlockBecomesAToolCallsDelta) {
  auto r = post(request({{"tools", tools()}, {"stream", true}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string content, finish;
  json calls;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") break;
    const json c = json::parse(payload)["choices"][0];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls")) calls = c["delta"]["tool_calls"];
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(content, "");  // the block never shows as text
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 1u) << r->body;
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json::parse(kArguments));
}

TEST_F(ToolCallModel, WithoutToolsTheBlockIsPlainText) {
  auto r = post(request({}));
  ASSERT_EQ(r->status, 200) << r->body;
  const json choice = json::parse(r->body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(choice["message"]["content"],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + kArguments + "}\n</tool_call>");
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace infera::server
