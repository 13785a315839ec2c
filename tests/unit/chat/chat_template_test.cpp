// ChatTemplate API: error reporting, context conversion, tokenizer_config.json loading,
// and golden renders of the in-repo Qwen3.5 / DeepSeek-R1 templates (expected text
// produced by @huggingface/jinja 0.5.11 from the same template and context).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/chat/chat_template.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

fs::path template_dir() { return fs::path(INFERA_SOURCE_DIR) / "tests/conformance/data/templates"; }

using test::error_of;

TEST(ChatTemplateTest, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of([] { ChatTemplate("line one\n{% if x %}\n  {{ x + }}\n{% endif %}"); }),
            "chat template: line 3, column 10: expected an expression, found '}}'");
  EXPECT_EQ(error_of([] { ChatTemplate("{% for m in messages %}{{ m }}"); }),
            "chat template: line 1, column 31: unexpected end of template: {% for %} is not closed");
  EXPECT_EQ(error_of([] { ChatTemplate("a\n{% frobnicate %}"); }),
            "chat template: line 2, column 4: unknown statement 'frobnicate'");
  EXPECT_EQ(error_of([] { ChatTemplate("{{ 'unterminated }}"); }),
            "chat template: line 1, column 4: unterminated string literal");
  EXPECT_EQ(error_of([] { ChatTemplate("{# open comment"); }),
            "chat template: line 1, column 1: comment is not closed with #}");
  EXPECT_EQ(error_of([] { ChatTemplate("{{ a ! b }}"); }), "chat template: line 1, column 6: unexpected character '!'");
  // Hostile nesting is an error, not a stack overflow.
  const std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  EXPECT_NE(error_of([&] { ChatTemplate{deep}; }).find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate{"{{ " + std::string(100000, '-') + "1 }}"}; }).find("nested too deeply"),
            std::string::npos);
  std::string deep_ifs;
  for (int i = 0; i < 5000; ++i) deep_ifs += "{% if x %}";
  EXPECT_NE(error_of([&] { ChatTemplate{deep_ifs}; }).find("nested too deeply"), std::string::npos);
}

TEST(ChatTemplateTest, RenderErrorsNameTheExpression) {
  const ChatTemplate t("ok\n{{ messages[0].content + 1 }}");
  EXPECT_EQ(error_of([&] {
              t.render(nlohmann::json{{"messages", {{{"content", nullptr}}}}});
            }),
            "chat template: line 2, column 24: '+' on a none value");
  EXPECT_EQ(error_of([&] { t.render(nlohmann::json::array()); }),
            "chat template: the context must be a JSON object, got array");
  const ChatTemplate raises("{% if messages|length == 0 %}{{ raise_exception('Conversation is empty.') }}{% endif %}");
  EXPECT_EQ(error_of([&] {
              raises.render(nlohmann::json{{"messages", nlohmann::json::array()}});
            }),
            "chat template: Conversation is empty.");
}

TEST(ChatTemplateTest, ContextKeyOrderAndNumbers) {
  const ChatTemplate t("{{ tools|tojson }}");
  const auto ordered = nlohmann::ordered_json::parse(R"({"tools": {"z": 1, "a": 2.0, "m": 2.5}})");
  EXPECT_EQ(t.render(ordered), R"({"z": 1, "a": 2, "m": 2.5})");  // 2.0 is the integer 2, as in JavaScript
  const auto sorted = nlohmann::json::parse(R"({"tools": {"z": 1, "a": 2.0, "m": 2.5}})");
  EXPECT_EQ(t.render(sorted), R"({"a": 2, "m": 2.5, "z": 1})");
  EXPECT_EQ(ChatTemplate("{{ x }}|{{ y }}|{{ z }}").render(nlohmann::json{{"x", -0.0}, {"y", 0.1}, {"z", 1e300}}),
            "0|0.1|1e+300");
}

TEST(ChatTemplateTest, RendersConcurrentlyFromOneParse) {
  const ChatTemplate t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.render(nlohmann::json{{"messages", {1, 2, 3}}}), "3");  // no state carried between renders
  }
}

TEST(ChatTemplateTest, Qwen35GoldenWithToolCall) {
  const ChatTemplate t(read_file(template_dir() / "qwen3_5.jinja"));
  const auto context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be nice."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather",
        "arguments": {"city": "Paris", "days": 2, "metric": true}}}]},
      {"role": "tool", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true})");
  const std::string prompt = t.render(context);
  const std::string head =
      "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
      R"({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})"
      "\n</tools>\n\nIf you choose to call a function";
  const std::string tail =
      "</IMPORTANT>\n\nBe nice.<|im_end|>\n<|im_start|>user\nWeather in "
      "Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
      "<parameter=metric>\ntrue\n</parameter>\n</function>\n</"
      "tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n"
      "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n";
  ASSERT_GE(prompt.size(), head.size() + tail.size());
  EXPECT_EQ(prompt.substr(0, head.size()), head);
  EXPECT_EQ(prompt.substr(prompt.size() - tail.size()), tail);
  EXPECT_EQ(prompt.size(), 1420u);  // the middle (the format instructions) matches too
}

TEST(ChatTemplateTest, DeepSeekR1GoldenDropsReasoningFromHistory) {
  const ChatTemplate t(read_file(template_dir() / "deepseek_r1.jinja"));
  const auto context = nlohmann::ordered_json::parse(R"({
    "bos_token": "<｜begin▁of▁sentence｜>",
    "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"},
                 {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}, {"role": "user", "content": "3+3?"}],
    "add_generation_prompt": true})");
  EXPECT_EQ(t.render(context),
            "<｜begin▁of▁sentence｜>S<｜User｜>2+2?<｜Assistant｜>\n\n4<｜end▁of▁sentence｜><｜User｜>3+3?<"
            "｜Assistant｜><think>\n");
}

class TokenizerConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("infera_chat_template_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name, std::ios::binary) << text; }
  fs::path dir_;
};

TEST_F(TokenizerConfigTest, ReadsTemplateAndTokensInBothForms) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": "{{ bos_token }}hi", "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"})");
  const ChatTemplateConfig config = load_chat_template_config(dir_.string());
  EXPECT_EQ(config.chat_template, "{{ bos_token }}hi");
  EXPECT_EQ(config.bos_token.value_or("?"), "<s>");
  EXPECT_EQ(config.eos_token.value_or("?"), "</s>");
}

TEST_F(TokenizerConfigTest, NamedTemplateListAndJinjaFile) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}], "bos_token": null})");
  const ChatTemplateConfig config = load_chat_template_config(dir_.string());
  EXPECT_EQ(config.chat_template, "D");
  EXPECT_FALSE(config.bos_token.has_value());
  write("tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  write("chat_template.jinja", "{{ messages|length }}");
  EXPECT_EQ(load_chat_template_config(dir_.string()).chat_template, "{{ messages|length }}");
  fs::remove(dir_ / "chat_template.jinja");
  write("chat_template.json", R"({"chat_template": "J"})");
  EXPECT_EQ(load_chat_template_config(dir_.string()).chat_template, "J");
}

TEST_F(TokenizerConfigTest, BadInputsNameTheFile) {
  EXPECT_NE(error_of([&] {
              load_chat_template_config((dir_ / "nope").string());
            }).find("tokenizer_config.json: no such file"),
            std::string::npos);
  write("tokenizer_config.json", "{not json");
  EXPECT_NE(error_of([&] { load_chat_template_config(dir_.string()); }).find("tokenizer_config.json: malformed JSON"),
            std::string::npos);
  write("tokenizer_config.json", R"({"bos_token": 5})");
  EXPECT_NE(error_of([&] { load_chat_template_config(dir_.string()); }).find("bos_token must be a string"),
            std::string::npos);
}

}  // namespace
}  // namespace infera
