// Lexer and parser of the Jinja subset used by chat templates: template text -> tokens
// -> an AST of Node. The grammar, operator precedence and whitespace handling follow
// @huggingface/jinja (which renders with trim_blocks and lstrip_blocks on, the way
// transformers does), so that both produce the same output from the same template.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace infera::jinja {

// A syntax or render problem at a byte offset of the original template text.
struct SourceError : std::runtime_error {
  SourceError(const std::string& message, size_t offset) : std::runtime_error(message), offset(offset) {}
  size_t offset;
};

enum class TokenType {
  kText,
  kNumber,
  kString,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,  // {%
  kCloseStatement,  // %}
  kOpenExpression,  // {{
  kCloseExpression,  // }}
  kOpenBracket,
  kCloseBracket,
  kOpenBrace,
  kCloseBrace,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,  // + - ~
  kMultiplicative,  // * / // %
  kPower,  // **
  kComparison,  // < > <= >= == !=
  kUnary,  // a sign not followed by digits
  kComment,
};

struct Token {
  TokenType type;
  std::string value;
  size_t offset;  // in the original template text
};

// Applies the reference's preprocessing (drop one trailing newline, lstrip_blocks,
// trim_blocks, remove {% generation %} tags) and splits into tokens.
std::vector<Token> tokenize(std::string_view source);

enum class NodeKind {
  // statements
  kIf,  // a: test; body; alternate (an elif is a nested kIf)
  kFor,  // names (+ flag: tuple target); a: iterable; b: inline `if` filter or null; body; alternate: else
  kSet,  // a: target (kIdentifier, kTuple or kMember); b: value, or null and body (block set)
  kMacro,  // text: name; params (default or null); body
  kBreak,
  kContinue,
  kFilterBlock,  // text: filter name; args / kwargs; body
  kComment,
  // expressions
  kText,  // text: literal template text (also string literals)
  kInt,  // int_value
  kFloat,  // float_value
  kString,  // text
  kArray,  // items
  kTuple,  // items
  kDict,  // items: keys; values
  kIdentifier,  // text
  kMember,  // a: object; b: property (a kString / kInt for `.name` / `.0`, any expression or kSlice for [..])
  kSlice,  // a, b, c: start, stop, step (each may be null)
  kCall,  // a: callee; items: positional args; kwargs
  kUnary,  // text: "not", "-", "+"; a
  kBinary,  // text: operator; a, b
  kFilter,  // text: filter name; a: operand; flag: called with (); items / kwargs: arguments
  kTest,  // text: test name; a: operand; flag: negated (`is not`); items: arguments
  kTernary,  // a: condition; b: if true; c: if false
  kSelect,  // `x if cond` without else: a: value; b: condition (undefined when false)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind;
  size_t offset = 0;  // start in the original template text, for error messages
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  bool flag = false;
  NodePtr a, b, c;
  std::vector<NodePtr> items;
  std::vector<NodePtr> values;
  std::vector<std::pair<std::string, NodePtr>> kwargs;  // keyword args, or macro parameters with defaults
  std::vector<std::string> names;  // for-loop targets
  std::vector<NodePtr> body;
  std::vector<NodePtr> alternate;

  Node(NodeKind kind, size_t offset) : kind(kind), offset(offset) {}
};

struct Program {
  std::vector<NodePtr> body;
};

// Throws SourceError at the offending token.
Program parse(std::string_view source);

// 1-based line and column (in characters) of a byte offset.
std::pair<size_t, size_t> line_and_column(std::string_view source, size_t offset);

}  // namespace infera::jinja
