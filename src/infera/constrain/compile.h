// Compilers from the constraint languages clients send to a Grammar (grammar.h). Each
// throws ConstraintError naming the unsupported keyword, the position in a pattern or
// the rule of a grammar; nothing is silently ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "infera/constrain/grammar.h"

namespace infera::constrain {

// Parenthesised groups a regex or GBNF grammar may nest (their parsers recurse once per
// group, so the client's text must not choose the stack depth).
inline constexpr int kMaxGroupDepth = 256;

// --- regular expressions (the ECMAScript subset: literals, escapes \d \w \s \D \W \S \xHH
// \uHHHH \u{H..}, classes, '.', groups (capturing, (?:...), (?<name>...)), alternation,
// greedy and lazy quantifiers; ^ and $ only at the ends). Lookaround, backreferences and
// word boundaries are refused with their position. ---

// The whole output must match `pattern` (vLLM's structured_outputs.regex).
Grammar compile_regex(std::string_view pattern);

// Appends to `b` the symbols of a regex. json_string: the characters as they appear inside
// a JSON string (quote, backslash and control characters escaped); search: JSON Schema's
// `pattern` semantics (a match anywhere unless anchored by ^ / $).
Seq regex_symbols(GrammarBuilder& b, std::string_view pattern, bool json_string, bool search);

// --- JSON Schema (docs/structured.md lists the keywords). Taken as ordered_json: objects'
// properties are written in the order the schema declares them (a json argument converts,
// in its sorted key order). ---
struct JsonSchemaOptions {
  // false: compact JSON (no whitespace between tokens). true: up to a few spaces or
  // newlines allowed between tokens (pretty-printed output).
  bool any_whitespace = false;
};
Grammar compile_json_schema(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
// Any JSON object (response_format json_object).
Grammar compile_json_object(const JsonSchemaOptions& options = {});
// The value grammar of `schema` as one symbol of `b` (tool calls embed it).
Sym json_schema_symbol(GrammarBuilder& b, const nlohmann::ordered_json& schema, const JsonSchemaOptions& options);

// --- the output is exactly one of `choices` ---
Grammar compile_choice(const std::vector<std::string>& choices);

// --- GBNF (llama.cpp's grammar format): rules `name ::= ...`, "literals", [classes],
// ranges, negation, '.', groups, | , * + ? {m} {m,} {m,n}, # comments; the start rule is
// `root`. ---
Grammar compile_gbnf(std::string_view text);

// --- tool calls in the Qwen3 / Hermes format:
//   <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
// ARGS valid against the tool's `parameters` schema. ---
struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;  // JSON Schema of the arguments object
};
struct ToolCallOptions {
  bool with_open_tag = true;  // false: the grammar starts after "<tool_call>" (tool_choice auto)
  bool parallel = true;  // one or more calls (each in its own block), else exactly one
};
Grammar compile_tool_calls(const std::vector<ToolSchema>& tools, const ToolCallOptions& options);

}  // namespace infera::constrain
