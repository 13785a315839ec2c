// Template text -> tokens, mirroring @huggingface/jinja's lexer (src/lexer.ts) rule by
// rule: its preprocessing decides every whitespace byte of a chat template's output.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "infera/chat/jinja_parser.h"
#include "infera/chat/jinja_value.h"
#include "infera/tokenizer/unicode.h"

namespace infera::jinja {
namespace {

// Template text after a preprocessing step, with the original offset of every byte so
// errors can name the line the user wrote.
struct MappedText {
  std::string text;
  std::vector<size_t> origin;

  void push(char c, size_t from) {
    text += c;
    origin.push_back(from);
  }
  void append(const MappedText& src, size_t begin, size_t end) {
    text.append(src.text, begin, end - begin);
    origin.insert(origin.end(), src.origin.begin() + static_cast<std::ptrdiff_t>(begin),
                  src.origin.begin() + static_cast<std::ptrdiff_t>(end));
  }
};

bool is_line_terminator_before(std::string_view text, size_t pos) {
  // JavaScript's multiline ^ matches after \n, \r, U+2028 and U+2029.
  if (pos == 0) return true;
  const char prev = text[pos - 1];
  if (prev == '\n' || prev == '\r') return true;
  return pos >= 3 && text.substr(pos - 3, 2) == "\xE2\x80" && (text[pos - 1] == '\xA8' || text[pos - 1] == '\xA9');
}

// /^[ \t]*({[#%-])/gm -> "$1": blanks before a block tag at the start of a line go.
MappedText lstrip_blocks(const MappedText& in) {
  MappedText out;
  const std::string& t = in.text;
  size_t pos = 0;
  while (pos < t.size()) {
    if (is_line_terminator_before(t, pos)) {
      size_t end = pos;
      while (end < t.size() && (t[end] == ' ' || t[end] == '\t')) ++end;
      if (end + 1 < t.size() && t[end] == '{' && (t[end + 1] == '#' || t[end + 1] == '%' || t[end + 1] == '-')) {
        pos = end;  // drop the blanks
      }
    }
    out.push(t[pos], in.origin[pos]);
    ++pos;
  }
  return out;
}

// /([#%-]})\n/g -> "$1": the first newline after a block tag goes.
MappedText trim_blocks(const MappedText& in) {
  MappedText out;
  const std::string& t = in.text;
  for (size_t pos = 0; pos < t.size(); ++pos) {
    out.push(t[pos], in.origin[pos]);
    if ((t[pos] == '#' || t[pos] == '%' || t[pos] == '-') && pos + 2 < t.size() && t[pos + 1] == '}' &&
        t[pos + 2] == '\n') {
      out.push('}', in.origin[pos + 1]);
      pos += 2;  // skip the newline
    }
  }
  return out;
}

// Length of a `{%-? (end)?generation -?%}` tag at pos (transformers' assistant-mask
// marker), or 0; sets the whitespace-control flags.
size_t match_generation_tag(std::string_view t, size_t pos, bool& strip_before, bool& strip_after) {
  if (t.substr(pos, 2) != "{%") return 0;
  size_t p = pos + 2;
  strip_before = p < t.size() && t[p] == '-';
  if (strip_before) ++p;
  while (size_t n = js_space_at(t, p)) p += n;
  if (t.substr(p, 3) == "end") p += 3;
  if (t.substr(p, 10) != "generation") return 0;
  p += 10;
  while (size_t n = js_space_at(t, p)) p += n;
  strip_after = p < t.size() && t[p] == '-';
  if (strip_after) ++p;
  if (t.substr(p, 2) != "%}") return 0;
  return p + 2 - pos;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> the tag goes, the whitespace
// around it stays unless the tag strips it.
MappedText remove_generation_tags(const MappedText& in) {
  MappedText out;
  std::string_view t = in.text;
  size_t copied = 0;  // everything before this is in out (or consumed by a match)
  for (size_t pos = t.find("{%"); pos != std::string_view::npos; pos = t.find("{%", pos + 1)) {
    if (pos < copied) continue;
    bool strip_before = false, strip_after = false;
    const size_t length = match_generation_tag(t, pos, strip_before, strip_after);
    if (length == 0) continue;
    size_t before = pos;
    while (before > copied) {
      const size_t n = js_space_before(t, before);
      if (n == 0 || before - n < copied) break;
      before -= n;
    }
    size_t after = pos + length;
    while (size_t n = js_space_at(t, after)) after += n;
    out.append(in, copied, before);
    if (!strip_before) out.append(in, before, pos);
    if (!strip_after) out.append(in, pos + length, after);
    copied = after;
    pos = after == 0 ? 0 : after - 1;
  }
  out.append(in, copied, t.size());
  return out;
}

MappedText preprocess(std::string_view source) {
  MappedText text;
  text.text.assign(source);
  text.origin.resize(source.size());
  for (size_t i = 0; i < source.size(); ++i) text.origin[i] = i;
  if (!text.text.empty() && text.text.back() == '\n') {
    text.text.pop_back();
    text.origin.pop_back();
  }
  return remove_generation_tags(trim_blocks(lstrip_blocks(text)));
}

struct Rule {
  std::string_view sequence;
  TokenType type;
};

// Order matters: longer operators before their prefixes.
constexpr std::array<Rule, 29> kRules = {{
    {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenBrace},       {"}", TokenType::kCloseBrace},
    {"[", TokenType::kOpenBracket},     {"]", TokenType::kCloseBracket},
    {",", TokenType::kComma},           {".", TokenType::kDot},
    {":", TokenType::kColon},           {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},     {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},     {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},      {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},        {"**", TokenType::kPower},
    {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
}};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : mapped_(preprocess(source)), src_(mapped_.text) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) step();
    return std::move(tokens_);
  }

 private:
  char at(size_t p) const { return p < src_.size() ? src_[p] : '\0'; }
  size_t origin(size_t p) const {
    if (mapped_.origin.empty()) return 0;
    return p < mapped_.origin.size() ? mapped_.origin[p] : mapped_.origin.back() + 1;
  }
  [[noreturn]] void error(const std::string& message, size_t p) const { throw SourceError(message, origin(p)); }
  void push(TokenType type, std::string value, size_t start) {
    tokens_.push_back({type, std::move(value), origin(start)});
  }
  const Token* last() const { return tokens_.empty() ? nullptr : &tokens_.back(); }

  // {%- / {{- / {#-: drop whitespace at the end of the preceding text.
  void strip_trailing_whitespace() {
    if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
    std::string& text = tokens_.back().value;
    text.resize(js_trim_end(text).size());
    if (text.empty()) tokens_.pop_back();
  }
  void skip_leading_whitespace() {
    while (size_t n = js_space_at(src_, pos_)) pos_ += n;
  }

  // A string literal's body, with the reference's escapes (\n \t \r \b \f \v \' \" \\ \xHH \uHHHH).
  std::string consume_string(char quote) {
    const size_t start = pos_;
    std::string out;
    char32_t pending_high_surrogate = 0;
    auto flush_surrogate = [&] {
      if (pending_high_surrogate) unicode::append_utf8(out, unicode::kReplacementChar);
      pending_high_surrogate = 0;
    };
    while (true) {
      if (pos_ >= src_.size()) error("unterminated string literal", start - 1);
      const char c = src_[pos_];
      if (c == quote) break;
      if (c != '\\') {
        flush_surrogate();
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= src_.size()) error("unterminated string literal", start - 1);
      const char escaped = src_[pos_++];
      if (escaped == 'x' || escaped == 'u') {
        const size_t length = escaped == 'x' ? 2 : 4;
        char32_t unit = 0;
        for (size_t i = 0; i < length; ++i) {
          const int digit = hex_value(at(pos_ + i));
          if (digit < 0) error(std::string("invalid escape sequence \\") + escaped, pos_ - 2);
          unit = unit * 16 + static_cast<char32_t>(digit);
        }
        pos_ += length;
        if (unit >= 0xDC00 && unit <= 0xDFFF && pending_high_surrogate) {
          unicode::append_utf8(out, 0x10000 + ((pending_high_surrogate - 0xD800) << 10) + (unit - 0xDC00));
          pending_high_surrogate = 0;
        } else {
          flush_surrogate();
          if (unit >= 0xD800 && unit <= 0xDBFF) {
            pending_high_surrogate = unit;
          } else if (unit >= 0xDC00 && unit <= 0xDFFF) {
            unicode::append_utf8(out, unicode::kReplacementChar);
          } else {
            unicode::append_utf8(out, unit);
          }
        }
        continue;
      }
      flush_surrogate();
      switch (escaped) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        default: error(std::string("unknown escape sequence \\") + escaped, pos_ - 2);
      }
    }
    flush_surrogate();
    ++pos_;  // closing quote
    return out;
  }

  std::string consume_digits() {
    const size_t start = pos_;
    while (is_digit(at(pos_))) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }

  void step() {
    const Token* previous = last();
    // Outside a tag: text up to the next {%, {{ or {#.
    if (!previous || previous->type == TokenType::kCloseStatement || previous->type == TokenType::kCloseExpression ||
        previous->type == TokenType::kComment) {
      const size_t start = pos_;
      while (pos_ < src_.size() &&
             !(src_[pos_] == '{' && (at(pos_ + 1) == '%' || at(pos_ + 1) == '{' || at(pos_ + 1) == '#'))) {
        ++pos_;
      }
      if (pos_ > start) {
        push(TokenType::kText, std::string(src_.substr(start, pos_ - start)), start);
        return;
      }
    }

    if (src_[pos_] == '{' && at(pos_ + 1) == '#') {
      const size_t start = pos_;
      pos_ += 2;
      const bool strip_before = at(pos_) == '-';
      if (strip_before) ++pos_;
      const size_t end = src_.find("#}", pos_);
      if (end == std::string_view::npos) error("comment is not closed with #}", start);
      std::string comment(src_.substr(pos_, end - pos_));
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing_whitespace();
      push(TokenType::kComment, std::move(comment), start);
      pos_ = end + 2;
      if (strip_after) skip_leading_whitespace();
      return;
    }
    if (src_.substr(pos_, 3) == "{%-") {
      strip_trailing_whitespace();
      push(TokenType::kOpenStatement, "{%", pos_);
      pos_ += 3;
      return;
    }
    if (src_.substr(pos_, 3) == "{{-") {
      strip_trailing_whitespace();
      push(TokenType::kOpenExpression, "{{", pos_);
      brace_depth_ = 0;
      pos_ += 3;
      return;
    }

    // Inside a tag whitespace separates tokens and is dropped.
    while (pos_ < src_.size()) {
      const size_t n = js_space_at(src_, pos_);
      if (n == 0) break;
      pos_ += n;
    }
    if (pos_ >= src_.size()) error("unexpected end of template inside a tag", pos_);

    if (src_.substr(pos_, 3) == "-%}") {
      push(TokenType::kCloseStatement, "%}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      return;
    }
    if (src_.substr(pos_, 3) == "-}}") {
      push(TokenType::kCloseExpression, "}}", pos_);
      pos_ += 3;
      skip_leading_whitespace();
      return;
    }

    const char c = src_[pos_];
    if (c == '-' || c == '+') {
      const TokenType prev = last() ? last()->type : TokenType::kText;
      if (!last() || prev == TokenType::kText) error(std::string("unexpected character '") + c + "'", pos_);
      const bool binary = prev == TokenType::kIdentifier || prev == TokenType::kNumber || prev == TokenType::kString ||
                          prev == TokenType::kCloseParen || prev == TokenType::kCloseBracket;
      if (!binary) {
        // A sign: folded into a number literal when digits follow at once.
        const size_t start = pos_++;
        std::string number = consume_digits();
        if (!number.empty() && at(pos_) == '.' && is_digit(at(pos_ + 1))) {
          ++pos_;
          number += "." + consume_digits();
        }
        push(number.empty() ? TokenType::kUnary : TokenType::kNumber, std::string(1, c) + number, start);
        return;
      }
    }

    for (const Rule& rule : kRules) {
      if (rule.sequence == "}}" && brace_depth_ > 0) continue;  // closes a dict literal, not the tag
      if (src_.substr(pos_, rule.sequence.size()) != rule.sequence) continue;
      push(rule.type, std::string(rule.sequence), pos_);
      if (rule.type == TokenType::kOpenExpression) brace_depth_ = 0;
      if (rule.type == TokenType::kOpenBrace) ++brace_depth_;
      if (rule.type == TokenType::kCloseBrace) --brace_depth_;
      pos_ += rule.sequence.size();
      return;
    }

    if (c == '\'' || c == '"') {
      const size_t start = pos_++;
      push(TokenType::kString, consume_string(c), start);
      return;
    }
    if (is_digit(c)) {
      const size_t start = pos_;
      std::string number = consume_digits();
      const bool after_dot = last() && last()->type == TokenType::kDot;  // x.0.1 is two indexes
      if (!after_dot && at(pos_) == '.' && is_digit(at(pos_ + 1))) {
        ++pos_;
        number += "." + consume_digits();
      }
      push(TokenType::kNumber, std::move(number), start);
      return;
    }
    if (is_word(c)) {
      const size_t start = pos_;
      while (is_word(at(pos_))) ++pos_;
      push(TokenType::kIdentifier, std::string(src_.substr(start, pos_ - start)), start);
      return;
    }
    error(std::string("unexpected character '") + c + "'", pos_);
  }

  MappedText mapped_;
  std::string_view src_;
  size_t pos_ = 0;
  int brace_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

std::pair<size_t, size_t> line_and_column(std::string_view source, size_t offset) {
  offset = std::min(offset, source.size());
  size_t line = 1, column = 1;
  size_t pos = 0;
  while (pos < offset) {
    if (source[pos] == '\n') {
      ++line;
      column = 1;
      ++pos;
      continue;
    }
    char32_t cp = 0;
    unicode::next_code_point(source, pos, cp);
    ++column;
  }
  return {line, column};
}

}  // namespace infera::jinja
