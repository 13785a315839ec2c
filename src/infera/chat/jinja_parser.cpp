// Tokens -> AST, a recursive-descent parser with the precedence ladder of
// @huggingface/jinja (src/parser.ts), lowest first:
//   a if c else b  <  or  <  and  <  not  <  comparisons and (not) in  <  + - ~
//   <  * / // %  <  **  <  is tests  <  | filters  <  unary sign  <  calls, .attr, [index]
#include <string>
#include <utility>

#include "infera/chat/jinja_parser.h"

namespace infera::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens, size_t source_size)
      : tokens_(std::move(tokens)), end_offset_(source_size) {}

  Program run() {
    Program program;
    while (pos_ < tokens_.size()) program.body.push_back(parse_any());
    return program;
  }

 private:
  // ---- token helpers ----
  const Token* peek(size_t ahead = 0) const { return pos_ + ahead < tokens_.size() ? &tokens_[pos_ + ahead] : nullptr; }
  size_t offset_here() const { return pos_ < tokens_.size() ? tokens_[pos_].offset : end_offset_; }
  [[noreturn]] void error(const std::string& message) const { throw SourceError(message, offset_here()); }
  bool is(TokenType type) const { return peek() && peek()->type == type; }
  bool is_identifier(std::string_view name, size_t ahead = 0) const {
    const Token* t = peek(ahead);
    return t && t->type == TokenType::kIdentifier && t->value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!is(TokenType::kOpenStatement)) return false;
    const Token* t = peek(1);
    if (!t || t->type != TokenType::kIdentifier) return false;
    for (std::string_view n : names) {
      if (t->value == n) return true;
    }
    return false;
  }
  const Token& expect(TokenType type, const char* what) {
    if (!is(type)) {
      if (pos_ >= tokens_.size()) error(std::string("unexpected end of template, expected ") + what);
      error(std::string("expected ") + what + ", found '" + describe(tokens_[pos_]) + "'");
    }
    return tokens_[pos_++];
  }
  void expect_identifier(std::string_view name) {
    if (!is_identifier(name)) error("expected '" + std::string(name) + "'");
    ++pos_;
  }
  static std::string describe(const Token& t) {
    if (t.type == TokenType::kText) return "text";
    if (t.type == TokenType::kString) return "string literal";
    return t.value;
  }
  NodePtr make(NodeKind kind, size_t offset) { return std::make_unique<Node>(kind, offset); }
  // Statements between here and one of the closing tags (not consumed).
  std::vector<NodePtr> parse_until(std::initializer_list<std::string_view> names, const char* block) {
    std::vector<NodePtr> body;
    while (!is_statement(names)) {
      if (pos_ >= tokens_.size()) {
        error(std::string("unexpected end of template: {% ") + block + " %} is not closed");
      }
      body.push_back(parse_any());
    }
    return body;
  }
  void expect_end_tag(std::string_view name) {
    expect(TokenType::kOpenStatement, "{%");
    expect_identifier(name);
    expect(TokenType::kCloseStatement, "%}");
  }

  // ---- statements ----
  NodePtr parse_any() {
    const Token& t = tokens_[pos_];
    switch (t.type) {
      case TokenType::kComment: {
        ++pos_;
        return make(NodeKind::kComment, t.offset);
      }
      case TokenType::kText: {
        auto node = make(NodeKind::kText, t.offset);
        node->text = t.value;
        ++pos_;
        return node;
      }
      case TokenType::kOpenStatement: return parse_statement();
      case TokenType::kOpenExpression: {
        ++pos_;
        NodePtr expression = parse_expression();
        expect(TokenType::kCloseExpression, "}}");
        return expression;
      }
      default: error("unexpected '" + describe(t) + "'");
    }
  }

  NodePtr parse_statement() {
    DepthGuard guard(*this);
    expect(TokenType::kOpenStatement, "{%");
    if (!is(TokenType::kIdentifier)) error("expected a statement name after {%");
    const Token& name_token = tokens_[pos_++];
    const std::string& name = name_token.value;
    const size_t offset = name_token.offset;
    if (name == "set") return parse_set(offset);
    if (name == "if") {
      NodePtr node = parse_if(offset);
      expect_end_tag("endif");
      return node;
    }
    if (name == "for") {
      NodePtr node = parse_for(offset);
      expect_end_tag("endfor");
      return node;
    }
    if (name == "macro") {
      NodePtr node = parse_macro(offset);
      expect_end_tag("endmacro");
      return node;
    }
    if (name == "break" || name == "continue") {
      expect(TokenType::kCloseStatement, "%}");
      return make(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, offset);
    }
    if (name == "filter") {
      auto node = make(NodeKind::kFilterBlock, offset);
      if (!is(TokenType::kIdentifier)) error("expected a filter name after {% filter");
      node->text = tokens_[pos_++].value;
      if (is(TokenType::kOpenParen)) parse_call_arguments(*node);
      expect(TokenType::kCloseStatement, "%}");
      node->body = parse_until({"endfilter"}, "filter");
      expect_end_tag("endfilter");
      return node;
    }
    if (name == "call") throw SourceError("{% call %} blocks are not supported in chat templates", offset);
    throw SourceError("unknown statement '" + name + "'", offset);
  }

  NodePtr parse_set(size_t offset) {
    auto node = make(NodeKind::kSet, offset);
    node->a = parse_expression_sequence(false);
    const NodeKind target = node->a->kind;
    if (target != NodeKind::kIdentifier && target != NodeKind::kTuple && target != NodeKind::kMember) {
      throw SourceError("can only assign to a name, a tuple of names or namespace.attribute", node->a->offset);
    }
    if (is(TokenType::kEquals)) {
      ++pos_;
      node->b = parse_expression_sequence(false);
    } else {
      expect(TokenType::kCloseStatement, "'=' or %}");
      node->body = parse_until({"endset"}, "set");
      expect(TokenType::kOpenStatement, "{%");
      expect_identifier("endset");
    }
    expect(TokenType::kCloseStatement, "%}");
    return node;
  }

  NodePtr parse_if(size_t offset) {
    auto node = make(NodeKind::kIf, offset);
    node->a = parse_expression();
    expect(TokenType::kCloseStatement, "%}");
    node->body = parse_until({"elif", "else", "endif"}, "if");
    if (is_statement({"elif"})) {
      const size_t elif_offset = tokens_[pos_ + 1].offset;
      pos_ += 2;
      node->alternate.push_back(parse_if(elif_offset));
    } else if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "%}");
      node->alternate = parse_until({"endif"}, "if");
    }
    return node;
  }

  NodePtr parse_for(size_t offset) {
    auto node = make(NodeKind::kFor, offset);
    NodePtr target = parse_expression_sequence(true);
    if (target->kind == NodeKind::kIdentifier) {
      node->names.push_back(target->text);
    } else if (target->kind == NodeKind::kTuple) {
      node->flag = true;
      for (const NodePtr& item : target->items) {
        if (item->kind != NodeKind::kIdentifier) throw SourceError("loop variables must be names", item->offset);
        node->names.push_back(item->text);
      }
    } else {
      throw SourceError("expected a loop variable name", target->offset);
    }
    if (!is_identifier("in")) error("expected 'in' after the loop variable");
    ++pos_;
    NodePtr iterable = parse_expression();
    if (iterable->kind == NodeKind::kSelect) {  // for x in xs if cond
      node->a = std::move(iterable->a);
      node->b = std::move(iterable->b);
    } else {
      node->a = std::move(iterable);
    }
    expect(TokenType::kCloseStatement, "%}");
    node->body = parse_until({"endfor", "else"}, "for");
    if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "%}");
      node->alternate = parse_until({"endfor"}, "for");
    }
    return node;
  }

  NodePtr parse_macro(size_t offset) {
    auto node = make(NodeKind::kMacro, offset);
    if (!is(TokenType::kIdentifier)) error("expected a macro name");
    node->text = tokens_[pos_++].value;
    expect(TokenType::kOpenParen, "'(' after the macro name");
    bool saw_default = false;
    while (!is(TokenType::kCloseParen)) {
      if (!is(TokenType::kIdentifier)) error("expected a parameter name");
      const Token& param = tokens_[pos_++];
      for (const auto& [existing, unused] : node->kwargs) {
        if (existing == param.value) throw SourceError("duplicate parameter '" + param.value + "'", param.offset);
      }
      NodePtr default_value;
      if (is(TokenType::kEquals)) {
        ++pos_;
        default_value = parse_expression();
        saw_default = true;
      } else if (saw_default) {
        throw SourceError("parameter '" + param.value + "' without a default follows one with a default", param.offset);
      }
      node->kwargs.emplace_back(param.value, std::move(default_value));
      if (is(TokenType::kComma)) {
        ++pos_;
      } else if (!is(TokenType::kCloseParen)) {
        error("expected ',' or ')' in the macro parameters");
      }
    }
    ++pos_;
    expect(TokenType::kCloseStatement, "%}");
    node->body = parse_until({"endmacro"}, "macro");
    return node;
  }

  // ---- expressions ----
  NodePtr parse_expression_sequence(bool primary) {
    const size_t offset = offset_here();
    NodePtr first = primary ? parse_primary() : parse_expression();
    if (!is(TokenType::kComma)) return first;
    auto tuple = make(NodeKind::kTuple, offset);
    tuple->items.push_back(std::move(first));
    while (is(TokenType::kComma)) {
      ++pos_;
      tuple->items.push_back(primary ? parse_primary() : parse_expression());
    }
    return tuple;
  }

  // Nesting is bounded so that a hostile template cannot overflow the stack.
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxNesting) parser.error("expressions or blocks nested too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };
  static constexpr int kMaxNesting = 200;

  NodePtr parse_expression() {
    DepthGuard guard(*this);
    return parse_if_expression();
  }

  NodePtr parse_if_expression() {
    NodePtr value = parse_or();
    if (!is_identifier("if")) return value;
    const size_t offset = tokens_[pos_++].offset;
    NodePtr test = parse_or();
    if (is_identifier("else")) {
      ++pos_;
      auto node = make(NodeKind::kTernary, offset);
      node->a = std::move(test);
      node->b = std::move(value);
      node->c = parse_if_expression();
      return node;
    }
    auto node = make(NodeKind::kSelect, offset);
    node->a = std::move(value);
    node->b = std::move(test);
    return node;
  }

  NodePtr binary(std::string op, NodePtr left, NodePtr right, size_t offset) {
    auto node = make(NodeKind::kBinary, offset);
    node->text = std::move(op);
    node->a = std::move(left);
    node->b = std::move(right);
    return node;
  }

  NodePtr parse_or() {
    NodePtr left = parse_and();
    while (is_identifier("or")) {
      const size_t offset = tokens_[pos_++].offset;
      left = binary("or", std::move(left), parse_and(), offset);
    }
    return left;
  }

  NodePtr parse_and() {
    NodePtr left = parse_not();
    while (is_identifier("and")) {
      const size_t offset = tokens_[pos_++].offset;
      left = binary("and", std::move(left), parse_not(), offset);
    }
    return left;
  }

  NodePtr parse_not() {
    if (is_identifier("not")) {
      DepthGuard guard(*this);
      auto node = make(NodeKind::kUnary, tokens_[pos_++].offset);
      node->text = "not";
      node->a = parse_not();
      return node;
    }
    return parse_comparison();
  }

  NodePtr parse_comparison() {
    NodePtr left = parse_additive();
    while (true) {
      std::string op;
      const size_t offset = offset_here();
      if (is_identifier("not") && is_identifier("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else if (is_identifier("in")) {
        op = "in";
        ++pos_;
      } else if (is(TokenType::kComparison)) {
        op = tokens_[pos_++].value;
      } else {
        return left;
      }
      left = binary(std::move(op), std::move(left), parse_additive(), offset);
    }
  }

  NodePtr parse_additive() {
    NodePtr left = parse_multiplicative();
    while (is(TokenType::kAdditive)) {
      const Token& op = tokens_[pos_++];
      left = binary(op.value, std::move(left), parse_multiplicative(), op.offset);
    }
    return left;
  }

  NodePtr parse_multiplicative() {
    NodePtr left = parse_power();
    while (is(TokenType::kMultiplicative)) {
      const Token& op = tokens_[pos_++];
      left = binary(op.value, std::move(left), parse_power(), op.offset);
    }
    return left;
  }

  NodePtr parse_power() {
    // Left-associative, as in Jinja (unlike Python): 2 ** 3 ** 2 == 64.
    NodePtr left = parse_test();
    while (is(TokenType::kPower)) {
      const Token& op = tokens_[pos_++];
      left = binary(op.value, std::move(left), parse_test(), op.offset);
    }
    return left;
  }

  NodePtr parse_test() {
    NodePtr operand = parse_filter();
    while (is_identifier("is")) {
      auto node = make(NodeKind::kTest, tokens_[pos_++].offset);
      if (is_identifier("not")) {
        node->flag = true;
        ++pos_;
      }
      if (!is(TokenType::kIdentifier)) error("expected a test name after 'is'");
      node->text = tokens_[pos_++].value;
      if (is(TokenType::kOpenParen)) {  // e.g. `is divisibleby(3)`
        parse_call_arguments(*node);
        if (!node->kwargs.empty()) error("tests take positional arguments only");
      }
      node->a = std::move(operand);
      operand = std::move(node);
    }
    return operand;
  }

  NodePtr parse_filter() {
    NodePtr operand = parse_unary_sign();
    while (is(TokenType::kPipe)) {
      auto node = make(NodeKind::kFilter, tokens_[pos_++].offset);
      if (!is(TokenType::kIdentifier)) error("expected a filter name after '|'");
      node->text = tokens_[pos_++].value;
      if (is(TokenType::kOpenParen)) {
        node->flag = true;
        parse_call_arguments(*node);
      }
      node->a = std::move(operand);
      operand = std::move(node);
    }
    return operand;
  }

  NodePtr parse_unary_sign() {
    const Token* t = peek();
    if (t && (t->type == TokenType::kUnary || t->type == TokenType::kAdditive) &&
        (t->value == "-" || t->value == "+")) {
      DepthGuard guard(*this);
      auto node = make(NodeKind::kUnary, t->offset);
      node->text = t->value;
      ++pos_;
      node->a = parse_unary_sign();
      return node;
    }
    return parse_call_member();
  }

  NodePtr parse_call_member() {
    NodePtr expression = parse_member(parse_primary());
    while (is(TokenType::kOpenParen)) {
      auto call = make(NodeKind::kCall, expression->offset);
      call->a = std::move(expression);
      parse_call_arguments(*call);
      expression = parse_member(std::move(call));
    }
    return expression;
  }

  // (positional..., name=value...) into node.items / node.kwargs.
  void parse_call_arguments(Node& node) {
    expect(TokenType::kOpenParen, "'('");
    while (!is(TokenType::kCloseParen)) {
      if (pos_ >= tokens_.size()) error("unexpected end of template in an argument list");
      if (is(TokenType::kIdentifier) && peek(1) && peek(1)->type == TokenType::kEquals) {
        std::string name = tokens_[pos_].value;
        for (const auto& [existing, unused] : node.kwargs) {
          if (existing == name) error("keyword argument '" + name + "' given twice");
        }
        pos_ += 2;
        node.kwargs.emplace_back(std::move(name), parse_expression());
      } else {
        if (!node.kwargs.empty()) error("positional arguments must come before keyword arguments");
        node.items.push_back(parse_expression());
      }
      if (is(TokenType::kComma)) {
        ++pos_;
      } else if (!is(TokenType::kCloseParen)) {
        error("expected ',' or ')' in an argument list");
      }
    }
    ++pos_;
  }

  NodePtr parse_member(NodePtr object) {
    while (is(TokenType::kDot) || is(TokenType::kOpenBracket)) {
      const Token& op = tokens_[pos_++];
      auto node = make(NodeKind::kMember, object->offset);
      node->a = std::move(object);
      if (op.type == TokenType::kOpenBracket) {
        node->flag = true;  // computed
        node->b = parse_subscript(op.offset);
        expect(TokenType::kCloseBracket, "']'");
      } else {
        const Token* t = peek();
        if (t && t->type == TokenType::kIdentifier) {
          node->b = make(NodeKind::kString, t->offset);
          node->b->text = t->value;
        } else if (t && t->type == TokenType::kNumber && t->value.find('.') == std::string::npos &&
                   t->value[0] != '-' && t->value[0] != '+') {
          node->b = make(NodeKind::kInt, t->offset);
          node->b->int_value = int_literal(*t);
        } else {
          error("expected a name or an integer after '.'");
        }
        ++pos_;
      }
      object = std::move(node);
    }
    return object;
  }

  // An integer literal's value; a SourceError where it does not fit 64 bits (std::stoll's
  // out_of_range is not the parser's error: templates come from model files).
  static int64_t int_literal(const Token& t) {
    try {
      return std::stoll(t.value);
    } catch (const std::exception&) {
      throw SourceError("integer literal " + t.value.substr(0, 40) + " is too large", t.offset);
    }
  }

  // [index] or a slice [start:stop:step] with any part omitted.
  NodePtr parse_subscript(size_t offset) {
    std::vector<NodePtr> parts;
    bool is_slice = false;
    while (!is(TokenType::kCloseBracket)) {
      if (pos_ >= tokens_.size()) error("unexpected end of template in '[...]'");
      if (is(TokenType::kColon)) {
        parts.push_back(nullptr);
        ++pos_;
        is_slice = true;
      } else {
        parts.push_back(parse_expression());
        if (is(TokenType::kColon)) {
          ++pos_;
          is_slice = true;
        }
      }
    }
    if (parts.empty()) error("expected an index or a slice inside '[]'");
    if (!is_slice) {
      if (parts.size() != 1) error("expected ']'");
      return std::move(parts[0]);
    }
    if (parts.size() > 3) error("a slice has at most three parts: [start:stop:step]");
    auto slice = make(NodeKind::kSlice, offset);
    parts.resize(3);
    slice->a = std::move(parts[0]);
    slice->b = std::move(parts[1]);
    slice->c = std::move(parts[2]);
    return slice;
  }

  NodePtr parse_primary() {
    if (pos_ >= tokens_.size()) error("unexpected end of template, expected an expression");
    const Token& t = tokens_[pos_++];
    switch (t.type) {
      case TokenType::kNumber: {
        if (t.value.find('.') != std::string::npos) {
          auto node = make(NodeKind::kFloat, t.offset);
          try {
            node->float_value = std::stod(t.value);
          } catch (const std::exception&) {  // (out_of_range: beyond a double)
            throw SourceError("number literal " + t.value.substr(0, 40) + " is out of range", t.offset);
          }
          return node;
        }
        auto node = make(NodeKind::kInt, t.offset);
        node->int_value = int_literal(t);
        return node;
      }
      case TokenType::kString: {
        auto node = make(NodeKind::kString, t.offset);
        node->text = t.value;
        while (is(TokenType::kString)) node->text += tokens_[pos_++].value;  // 'a' 'b' == 'ab'
        return node;
      }
      case TokenType::kIdentifier: {
        auto node = make(NodeKind::kIdentifier, t.offset);
        node->text = t.value;
        return node;
      }
      case TokenType::kOpenParen: {
        NodePtr expression = parse_expression_sequence(false);
        expect(TokenType::kCloseParen, "')'");
        return expression;
      }
      case TokenType::kOpenBracket: {
        auto node = make(NodeKind::kArray, t.offset);
        while (!is(TokenType::kCloseBracket)) {
          if (pos_ >= tokens_.size()) error("unexpected end of template in a list literal");
          node->items.push_back(parse_expression());
          if (is(TokenType::kComma)) {
            ++pos_;
          } else if (!is(TokenType::kCloseBracket)) {
            error("expected ',' or ']' in a list literal");
          }
        }
        ++pos_;
        return node;
      }
      case TokenType::kOpenBrace: {
        auto node = make(NodeKind::kDict, t.offset);
        while (!is(TokenType::kCloseBrace)) {
          if (pos_ >= tokens_.size()) error("unexpected end of template in a dict literal");
          node->items.push_back(parse_expression());
          expect(TokenType::kColon, "':' between a key and its value");
          node->values.push_back(parse_expression());
          if (is(TokenType::kComma)) {
            ++pos_;
          } else if (!is(TokenType::kCloseBrace)) {
            error("expected ',' or '}' in a dict literal");
          }
        }
        ++pos_;
        return node;
      }
      default: --pos_; error("expected an expression, found '" + describe(t) + "'");
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  size_t end_offset_;
  int depth_ = 0;
};

}  // namespace

Program parse(std::string_view source) { return Parser(tokenize(source), source.size()).run(); }

}  // namespace infera::jinja
