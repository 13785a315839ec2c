#include "infera/chat/text_stream.h"

#include <gtest/gtest.h>

namespace infera::chat {
namespace {

// Feeds `text` cut at every pair of positions (three pieces) and checks the output.
void expect_all_splits(const std::vector<std::string>& stops, const std::string& text, const std::string& expected,
                       bool expect_stopped) {
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      StopMatcher m(stops);
      std::string out = m.feed(text.substr(0, a));
      out += m.feed(text.substr(a, b - a));
      out += m.feed(text.substr(b));
      out += m.flush();
      ASSERT_EQ(out, expected) << "split at " << a << ", " << b;
      ASSERT_EQ(m.stopped(), expect_stopped);
    }
  }
}

TEST(PartialMarkerSuffix, FindsLongestProperPrefix) {
  EXPECT_EQ(partial_marker_suffix("abc<thi", "<think>"), 4u);
  EXPECT_EQ(partial_marker_suffix("abc", "<think>"), 0u);
  EXPECT_EQ(partial_marker_suffix("<think>", "<think>"), 0u);  // a whole marker is not partial
  EXPECT_EQ(partial_marker_suffix("aa", "aab"), 2u);
  EXPECT_EQ(partial_marker_suffix("", "x"), 0u);
}

TEST(StopMatcher, StopStringNeverEmittedWhateverTheSplit) {
  expect_all_splits({"STOP"}, "hello STOP world", "hello ", true);
  expect_all_splits({"\n\n", "END"}, "line one\nline two\n\nrest", "line one\nline two", true);
  expect_all_splits({"xyz"}, "no stop here xy", "no stop here xy", false);
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.feed("hello world"), "hel");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.feed("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, HoldsBackOnlyAPossiblePrefix) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("abcST"), "abc");
  EXPECT_EQ(m.feed("x"), "STx");  // it was not the stop string after all
  EXPECT_EQ(m.feed("S"), "");
  EXPECT_EQ(m.flush(), "S");
}

TEST(StopMatcher, MultiByteUtf8StopString) { expect_all_splits({"é!"}, "caf\xC3\xA9! next", "caf", true); }

TEST(OutputRouter, PlainContentPassesThrough) {
  OutputRouter r({});
  EXPECT_EQ(r.feed("<think>x</think>").content, "<think>x</think>");
  EXPECT_TRUE(r.finish().empty());
}

TEST(OutputRouter, ReasoningSplitAcrossPieces) {
  const std::string text = "<think>\nI should greet.\n</think>\n\nHello!";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    OutputRouter r({.parse_reasoning = true});
    OutputDelta a = r.feed(text.substr(0, cut));
    OutputDelta b = r.feed(text.substr(cut));
    OutputDelta c = r.finish();
    EXPECT_EQ(a.reasoning + b.reasoning + c.reasoning, "\nI should greet.\n") << cut;
    EXPECT_EQ(a.content + b.content + c.content, "Hello!") << cut;
  }
}

TEST(OutputRouter, ReasoningOpenedByThePrompt) {
  OutputRouter r({.parse_reasoning = true, .start_in_reasoning = true});
  OutputDelta a = r.feed("thinking...</think>answer");
  EXPECT_EQ(a.reasoning, "thinking...");
  EXPECT_EQ(a.content, "answer");
}

TEST(OutputRouter, NoThinkTagMeansContent) {
  OutputRouter r({.parse_reasoning = true});
  OutputDelta a = r.feed("<th");
  EXPECT_TRUE(a.empty());  // could still become <think>
  OutputDelta b = r.feed("e end");
  EXPECT_EQ(b.content, "<the end");
}

TEST(OutputRouter, ParsesHermesToolCalls) {
  const std::string text =
      "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}</tool_call>";
  for (size_t cut = 0; cut <= text.size(); cut += 3) {
    OutputRouter r({.parse_tool_calls = true});
    std::string content = r.feed(text.substr(0, cut)).content;
    content += r.feed(text.substr(cut)).content;
    content += r.finish().content;
    EXPECT_EQ(content, "Let me check.");
    ASSERT_EQ(r.tool_calls().size(), 2u);
    EXPECT_EQ(r.tool_calls()[0].name, "get_weather");
    EXPECT_EQ(r.tool_calls()[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(r.tool_calls()[1].name, "get_time");
    EXPECT_EQ(r.tool_calls()[1].arguments, R"({"tz": "CET"})");
    EXPECT_EQ(r.tool_calls()[0].id.rfind("call_", 0), 0u);
    EXPECT_NE(r.tool_calls()[0].id, r.tool_calls()[1].id);
  }
}

// The arguments keep the keys in the order the model wrote them (a constrained call writes a
// schema's properties in declared order), not sorted.
TEST(OutputRouter, ToolCallArgumentsKeepKeyOrder) {
  OutputRouter r({.parse_tool_calls = true});
  r.feed("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"zeta\": 1, \"alpha\": {\"y\": 2, \"b\": 3}}}\n</tool_call>");
  r.finish();
  ASSERT_EQ(r.tool_calls().size(), 1u);
  EXPECT_EQ(r.tool_calls()[0].arguments, R"({"zeta":1,"alpha":{"y":2,"b":3}})");
}

TEST(OutputRouter, BrokenToolCallComesBackAsContent) {
  OutputRouter r({.parse_tool_calls = true});
  std::string content = r.feed("<tool_call>{not json</tool_call>").content;
  content += r.finish().content;
  EXPECT_EQ(content, "<tool_call>{not json</tool_call>");
  EXPECT_TRUE(r.tool_calls().empty());
}

TEST(OutputRouter, ToolCallCutOffWithoutClosingTagStillParses) {
  OutputRouter r({.parse_tool_calls = true});
  r.feed("<tool_call>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_TRUE(r.finish().content.empty());
  ASSERT_EQ(r.tool_calls().size(), 1u);
  EXPECT_EQ(r.tool_calls()[0].arguments, "{}");
}

// Model output is untrusted too: a tool call whose arguments nest a million levels comes
// back as plain content (not parsed, copied and dumped recursively).
TEST(OutputRouter, DeeplyNestedToolCallIsText) {
  OutputRouter r({.parse_tool_calls = true});
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  const std::string text = R"(<tool_call>{"name": "f", "arguments": )" + deep + "}</tool_call>";
  OutputDelta d = r.feed(text);
  OutputDelta tail = r.finish();
  EXPECT_TRUE(r.tool_calls().empty());
  EXPECT_EQ(d.content + tail.content, text);
  // Shallow ones still parse.
  OutputRouter ok({.parse_tool_calls = true});
  ok.feed(R"(<tool_call>{"name": "f", "arguments": [[1]]}</tool_call>)");
  ok.finish();
  ASSERT_EQ(ok.tool_calls().size(), 1u);
  EXPECT_EQ(ok.tool_calls()[0].arguments, "[[1]]");
}

}  // namespace
}  // namespace infera::chat
