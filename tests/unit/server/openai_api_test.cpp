#include "infera/server/openai_api.h"

#include <gtest/gtest.h>

namespace infera::server {
namespace {

using nlohmann::json;

ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(parse_json_body(body));
  } catch (const ApiException& e) {
    return e.error;
  }
  ADD_FAILURE() << "accepted: " << body;
  return {};
}

TEST(OpenAiApi, ParsesAFullChatRequest) {
  const ChatRequest r = parse_chat_request(parse_json_body(R"({
    "model": "m", "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
    "min_p": 0.05, "seed": 42, "stop": ["a", "b"], "presence_penalty": 0.5, "frequency_penalty": -0.5,
    "repetition_penalty": 1.1, "n": 2, "stream": true, "stream_options": {"include_usage": true},
    "messages": [{"role": "system", "content": "s"},
                 {"role": "user", "content": [{"type": "text", "text": "he"}, {"type": "text", "text": "llo"}]},
                 {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})"));
  EXPECT_EQ(r.options.model, "m");
  EXPECT_EQ(r.options.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.options.temperature, 0.5f);
  EXPECT_EQ(r.options.top_k, 40);
  EXPECT_EQ(r.options.seed, 42);
  EXPECT_EQ(r.options.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.options.n, 2);
  EXPECT_TRUE(r.options.stream);
  EXPECT_TRUE(r.options.include_usage);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, "hello");
  EXPECT_FALSE(r.messages[2].content.has_value());
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"x\":1}");
  EXPECT_TRUE(r.tools_enabled);
  const json templ = messages_to_template_json(r.messages);
  EXPECT_EQ(templ[2]["tool_calls"][0]["function"]["arguments"]["x"], 1);  // a mapping for the template
}

TEST(OpenAiApi, StopAsAString) {
  const ChatRequest r =
      parse_chat_request(parse_json_body(R"({"messages":[{"role":"user","content":"x"}],"stop":"\n"})"));
  EXPECT_EQ(r.options.stop, std::vector<std::string>{"\n"});
}

TEST(OpenAiApi, BadChatRequestsNameTheParameter) {
  struct Case {
    const char* body;
    const char* param;  // nullptr: no param
  };
  const Case cases[] = {
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({})", "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":0})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":1000})", "n"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":5})", "stop"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":["a",1]})", "stop[1]"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":7})", "model"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools[0].function"},
      {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":"yes"})", "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":5})", "presence_penalty"},
      {R"([1,2,3])", nullptr},
  };
  for (const auto& c : cases) {
    const ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_FALSE(e.message.empty()) << c.body;
    if (c.param) {
      EXPECT_EQ(e.param.value_or("<none>"), c.param) << c.body;
    }
  }
}

TEST(OpenAiApi, MalformedBodies) {
  for (const std::string& body :
       {std::string(""), std::string("{"), std::string("{\"a\": tru}"), std::string("{\"a\": \"\xff\"}"),
        std::string("{\"a\": \"\xC0\x80\"}"), std::string("{\"a\": \"\xED\xA0\x80\"}"),
        std::string(200, '[') + std::string(200, ']')}) {
    try {
      parse_json_body(body);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiException& e) {
      EXPECT_EQ(e.error.status, 400);
      EXPECT_EQ(e.error.message.find("json.exception"), std::string::npos) << e.error.message;
    }
  }
  EXPECT_NO_THROW(parse_json_body(std::string(60, '[') + std::string(60, ']')));
}

TEST(OpenAiApi, CompletionPromptForms) {
  auto parse = [](const char* body) { return parse_completion_request(parse_json_body(body)); };
  EXPECT_EQ(parse(R"({"prompt":"hi"})").prompts.size(), 1u);
  EXPECT_EQ(parse(R"({"prompt":[1,2,3]})").prompts.size(), 1u);
  EXPECT_EQ(parse(R"({"prompt":["a","b"],"n":2})").prompts.size(), 2u);
  EXPECT_EQ(parse(R"({"prompt":[[1,2],[3]]})").prompts.size(), 2u);
  EXPECT_EQ(parse(R"({"prompt":"x","logprobs":2})").options.top_logprobs, 2);
  EXPECT_TRUE(parse(R"({"prompt":"x","logprobs":0})").options.logprobs);
  EXPECT_EQ(parse(R"({"prompt":"x","logprobs":20})").options.top_logprobs, 20);
  EXPECT_FALSE(parse(R"({"prompt":"x"})").options.logprobs);
  for (const char* bad :
       {R"({})", R"({"prompt":5})", R"({"prompt":[]})", R"({"prompt":[1,"a"]})", R"({"prompt":[-1]})",
        R"({"prompt":"x","echo":1})", R"({"prompt":"x","suffix":"y"})", R"({"prompt":["a","b"],"n":16})",
        R"({"prompt":"x","logprobs":21})", R"({"prompt":"x","logprobs":-1})", R"({"prompt":"x","logprobs":true})"}) {
    EXPECT_THROW(parse(bad), ApiException) << bad;
  }
}

TEST(OpenAiApi, ErrorJsonShape) {
  const json j = error_to_json(bad_request("m", "p"));
  EXPECT_EQ(j["error"]["message"], "m");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "p");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

// A tool call's arguments string is JSON the server parses again for the chat template: a
// million nested brackets inside it must be refused with the field named, not parsed and
// copied recursively until the stack overflows.
TEST(OpenAiApi, DeeplyNestedToolCallArgumentsAreRefused) {
  const std::string deep(1'000'000, '[');
  json body = {
      {"messages",
       {{{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls", {{{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", deep}}}}}}}}}};
  try {
    parse_chat_request(parse_json_body(body.dump()));
    ADD_FAILURE() << "accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error.status, 400);
    EXPECT_EQ(e.error.param, "messages[0].tool_calls[0].function.arguments");
  }
  // 64 levels are fine.
  body["messages"][0]["tool_calls"][0]["function"]["arguments"] = std::string(64, '[') + std::string(64, ']');
  EXPECT_EQ(parse_chat_request(parse_json_body(body.dump())).messages[0].tool_calls.size(), 1u);
}

// Messages built in code (not through the parser) with deep arguments still render: the
// text that nests too deeply is handed to the template as a string.
TEST(OpenAiApi, TemplateJsonKeepsDeepArgumentsAsText) {
  ChatMessage m;
  m.role = "assistant";
  m.tool_calls.push_back({"c", "f", std::string(1'000'000, '[') + std::string(1'000'000, ']')});
  m.tool_calls.push_back({"d", "g", R"({"x": [1, {"y": 2}]})"});
  const json j = messages_to_template_json({m});
  ASSERT_EQ(j[0]["tool_calls"].size(), 2u);
  EXPECT_TRUE(j[0]["tool_calls"][0]["function"]["arguments"].is_string());
  EXPECT_EQ(j[0]["tool_calls"][1]["function"]["arguments"]["x"][1]["y"], 2);
}

TEST(OpenAiApi, DeepBodiesAreRefusedWithoutParsing) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  try {
    parse_json_body(deep);
    ADD_FAILURE() << "accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error.status, 400);
  }
}

}  // namespace
}  // namespace infera::server

namespace infera::server {
namespace {

using constrain::ConstraintSpec;

ChatRequest chat_with(const std::string& extra) {
  return parse_chat_request(parse_json_body(R"({"messages": [{"role": "user", "content": "hi"}])" + extra + "}"));
}

TEST(OpenAiApiStructured, ConstraintFieldsParse) {
  auto r = chat_with(
      R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": true}})");
  ASSERT_TRUE(r.options.constraint);
  EXPECT_EQ(r.options.constraint->kind, ConstraintSpec::Kind::kJsonSchema);
  EXPECT_EQ(r.options.constraint->json, json({{"type", "integer"}}));
  EXPECT_EQ(r.options.constraint_param, "response_format.json_schema.schema");
  EXPECT_EQ(chat_with(R"(, "response_format": {"type": "json_object"})").options.constraint->kind,
            ConstraintSpec::Kind::kJsonObject);
  EXPECT_FALSE(chat_with(R"(, "response_format": {"type": "text"})").options.constraint);
  EXPECT_EQ(chat_with(R"(, "structured_outputs": {"regex": "a+"})").options.constraint->text, "a+");
  EXPECT_EQ(chat_with(R"(, "guided_choice": ["a", "b"])").options.constraint->kind, ConstraintSpec::Kind::kChoice);
  EXPECT_EQ(chat_with(R"(, "guided_grammar": "root ::= \"a\"")").options.constraint->kind,
            ConstraintSpec::Kind::kGrammar);
  EXPECT_EQ(chat_with(R"(, "structured_outputs": {"json": "{\"type\": \"string\"}"})").options.constraint->json,
            json({{"type", "string"}}));
  EXPECT_EQ(chat_with(R"(, "grammar": "root ::= \"a\"")").options.constraint_param, "grammar");
  EXPECT_EQ(chat_with(R"(, "json_schema": {"type": "null"})").options.constraint->kind,
            ConstraintSpec::Kind::kJsonSchema);
  auto w = chat_with(R"(, "structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": false})");
  EXPECT_TRUE(w.options.constraint->schema_options.any_whitespace);
  auto lb = chat_with(R"(, "logit_bias": {"5": -100, "7": 2.5})");
  ASSERT_EQ(lb.options.logit_bias.size(), 2u);
  EXPECT_EQ(lb.options.logit_bias[0], (std::pair<int32_t, float>{5, -100.0f}));
  auto t = chat_with(
      R"(, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required", "parallel_tool_calls": false)");
  EXPECT_TRUE(t.tool_required);
  EXPECT_FALSE(t.parallel_tool_calls);
}

// The body's json sorts keys; keep_declared_order gives the constraint and the tools their
// schemas with keys in the order the client wrote them (properties are written in that order).
TEST(OpenAiApiStructured, SchemasKeepDeclaredOrder) {
  auto keys = [](const nlohmann::ordered_json& props) {
    std::vector<std::string> out;
    for (auto it = props.begin(); it != props.end(); ++it) out.push_back(it.key());
    return out;
  };
  const std::vector<std::string> declared = {"zeta", "alpha", "mid"};
  const std::string props = R"({"type": "object", "properties": {"zeta": {}, "alpha": {}, "mid": {}}})";
  for (const std::string& field :
       {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )" + props + "}}",
        R"("structured_outputs": {"json": )" + props + "}", R"("guided_json": )" + props, R"("json_schema": )" + props,
        R"("structured_outputs": {"json": )" + json(props).dump() + "}"}) {
    const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], )" + field + "}";
    ChatRequest r = parse_chat_request(parse_json_body(body));
    ASSERT_TRUE(r.options.constraint) << field;
    EXPECT_NE(keys(r.options.constraint->json["properties"]), declared) << "sorted before: " << field;
    keep_declared_order(parse_json_body(body), body, r.options, &r.tools);
    EXPECT_EQ(keys(r.options.constraint->json["properties"]), declared) << field;
  }
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [
    {"type": "function", "function": {"name": "a", "parameters": )" +
                           props + R"(}}, {"type": "function", "function": {"name": "b"}}]})";
  ChatRequest r = parse_chat_request(parse_json_body(body));
  keep_declared_order(parse_json_body(body), body, r.options, &r.tools);
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(keys(r.tools[0].ordered_parameters["properties"]), declared);
  EXPECT_TRUE(r.tools[1].ordered_parameters.is_null());  // no parameters: the sorted {} serves
  EXPECT_EQ(json(r.tools[0].ordered_parameters), r.tools[0].parameters);
  // A body holding an object of more than kMaxOrderedKeys keys keeps sorted order (bounded work).
  std::string big = R"({"type": "object", "properties": {)";
  for (size_t i = 0; i <= kMaxOrderedKeys; ++i) big += (i ? ", \"k" : "\"k") + std::to_string(999 - i) + "\": {}";
  big += "}}";
  const std::string big_body = R"({"messages": [{"role": "user", "content": "hi"}], "json_schema": )" + big + "}";
  ChatRequest b = parse_chat_request(parse_json_body(big_body));
  ASSERT_TRUE(b.options.constraint);
  const std::vector<std::string> sorted = keys(b.options.constraint->json["properties"]);
  ASSERT_EQ(sorted.size(), kMaxOrderedKeys + 1);
  EXPECT_EQ(sorted.front(), "k743");
  keep_declared_order(parse_json_body(big_body), big_body, b.options, &b.tools);
  EXPECT_EQ(keys(b.options.constraint->json["properties"]), sorted);
}

TEST(OpenAiApiStructured, UnhonourableParametersAre400s) {
  const std::string m = R"({"messages": [{"role": "user", "content": "hi"}], )";
  EXPECT_EQ(chat_error(m + R"("best_of": 3})").param, "best_of");
  EXPECT_EQ(chat_error(m + R"("response_format": {"type": "yaml"}})").param, "response_format.type");
  EXPECT_EQ(chat_error(m + R"("response_format": {"type": "json_schema"}})").param, "response_format.json_schema");
  EXPECT_EQ(chat_error(m + R"("structured_outputs": {"structural_tag": {}}})").param,
            "structured_outputs.structural_tag");
  EXPECT_EQ(chat_error(m + R"("guided_regex": "a", "grammar": "root ::= \"a\""})").param, "grammar");
  EXPECT_EQ(chat_error(m + R"("logit_bias": {"x": 1}})").param, "logit_bias");
  EXPECT_EQ(chat_error(m + R"("logit_bias": {"1": 200}})").param, "logit_bias.1");
  EXPECT_EQ(chat_error(m + R"("functions": []})").param, "functions");
  EXPECT_EQ(chat_error(m + R"("tool_choice": "required"})").param, "tool_choice");
  EXPECT_EQ(chat_error(m + R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
                              "response_format": {"type": "json_object"}})")
                .param,
            "response_format");
  EXPECT_NO_THROW(chat_with(R"(, "best_of": 1)"));
}

}  // namespace
}  // namespace infera::server
