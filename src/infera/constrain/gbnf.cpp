// GBNF (llama.cpp's grammar format) to a Grammar.
#include <unordered_map>

#include "infera/constrain/compile.h"
#include "infera/tokenizer/unicode.h"

namespace infera::constrain {

namespace {

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {}

  Grammar parse() {
    skip_ws();
    if (at_end()) error("the grammar is empty");
    while (!at_end()) {
      const size_t at = pos_;
      const std::string name = parse_name();
      if (name.empty()) error("expected a rule name");
      skip_ws();
      if (s_.substr(pos_, 3) != "::=") error(fmt::format("expected '::=' after the rule name '{}'", name));
      pos_ += 3;
      const uint32_t r = rule_id(name);
      if (defined_.contains(name)) {
        pos_ = at;
        error(fmt::format("rule '{}' is defined twice", name));
      }
      defined_[name] = true;
      for (Seq& a : alternatives(/*nested=*/false)) b_.add_alt(r, std::move(a));
      skip_ws();
    }
    auto root = ids_.find("root");
    if (root == ids_.end() || !defined_.contains("root")) constraint_fail("grammar: no 'root' rule (the start rule)");
    for (const auto& [name, id] : ids_) {
      if (!defined_.contains(name)) constraint_fail("grammar: rule '{}' is used but not defined", name);
    }
    try {
      return b_.build(root->second);
    } catch (const ConstraintError& e) {
      constraint_fail("grammar: {}", e.what());
    }
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    constraint_fail("grammar: {} at line {} column {}", what, line, col);
  }
  bool at_end() const { return pos_ >= s_.size(); }

  void skip_ws() {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c == '#') {
        while (!at_end() && s_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && name_char(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t r = b_.new_rule(name);
    ids_.emplace(name, r);
    return r;
  }

  // True when a new rule definition starts here (name ::=).
  bool at_rule_start() {
    const size_t save = pos_;
    const std::string name = parse_name();
    bool yes = false;
    if (!name.empty()) {
      skip_ws();
      yes = s_.substr(pos_, 3) == "::=";
    }
    pos_ = save;
    return yes;
  }

  std::vector<Seq> alternatives(bool nested) {
    std::vector<Seq> alts;
    alts.push_back(sequence(nested));
    skip_ws();
    while (!at_end() && s_[pos_] == '|') {
      ++pos_;
      alts.push_back(sequence(nested));
      skip_ws();
    }
    return alts;
  }

  Seq sequence(bool nested) {
    Seq seq;
    for (;;) {
      skip_ws();
      if (at_end()) break;
      const char c = s_[pos_];
      if (c == '|' || c == ')') break;
      if (!nested && at_rule_start()) break;
      Seq item = element();
      append(seq, postfix(std::move(item)));
    }
    return seq;
  }

  Seq postfix(Seq item) {
    if (at_end()) return item;
    const size_t at = pos_;
    const char c = s_[pos_];
    int64_t min, max;
    if (c == '*') {
      min = 0, max = -1;
    } else if (c == '+') {
      min = 1, max = -1;
    } else if (c == '?') {
      min = 0, max = 1;
    } else if (c == '{') {
      ++pos_;
      skip_ws();
      min = number();
      skip_ws();
      max = min;
      if (!at_end() && s_[pos_] == ',') {
        ++pos_;
        skip_ws();
        max = (!at_end() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ? number() : -1;
        skip_ws();
      }
      if (at_end() || s_[pos_] != '}') error("expected '}' to close the repetition");
    } else {
      return item;
    }
    ++pos_;
    try {
      return b_.repeat(item, min, max);
    } catch (const ConstraintError& e) {
      pos_ = at;
      error(e.what());
    }
  }

  int64_t number() {
    const size_t start = pos_;
    int64_t v = 0;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(s_[pos_])) && pos_ - start < 9)
      v = v * 10 + (s_[pos_++] - '0');
    if (pos_ == start) error("expected a number");
    return v;
  }

  uint32_t escaped_char() {
    // After a backslash.
    if (at_end()) error("a trailing backslash");
    const char c = s_[pos_++];
    auto hex = [&](int digits) {
      uint32_t v = 0;
      for (int k = 0; k < digits; ++k) {
        if (at_end() || !std::isxdigit(static_cast<unsigned char>(s_[pos_]))) error("invalid hexadecimal escape");
        const char h = s_[pos_++];
        v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return v;
    };
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': return '\\';
      case '"': return '"';
      case '[': return '[';
      case ']': return ']';
      case '-': return '-';
      case '^': return '^';
      case '/': return '/';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      default: --pos_; error(fmt::format("unknown escape '\\{}'", c));
    }
  }

  uint32_t code_point() {
    if (s_[pos_] == '\\') {
      ++pos_;
      return escaped_char();
    }
    uint32_t cp;
    if (!decode_utf8(s_, pos_, cp)) error("invalid UTF-8");
    return cp;
  }

  Seq element() {
    const size_t at = pos_;
    const char c = s_[pos_];
    if (c == '"') {
      ++pos_;
      std::string bytes;
      while (true) {
        if (at_end()) {
          pos_ = at;
          error("unterminated string literal");
        }
        if (s_[pos_] == '"') break;
        const uint32_t cp = code_point();
        if (cp > 0x10FFFF) error("a code point above U+10FFFF");
        if (cp >= 0xD800 && cp <= 0xDFFF) error("a surrogate code point");
        unicode::append_utf8(bytes, cp);  // as llama.cpp: escapes are code points
      }
      ++pos_;
      return b_.lit(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (!at_end() && s_[pos_] == '^') {
        negate = true;
        ++pos_;
      }
      CodeRanges set;
      while (true) {
        if (at_end()) {
          pos_ = at;
          error("unterminated character class '['");
        }
        if (s_[pos_] == ']') break;
        const uint32_t lo = code_point();
        uint32_t hi = lo;
        if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          hi = code_point();
          if (hi < lo) error("a character range out of order");
        }
        set.emplace_back(lo, std::min<uint32_t>(hi, 0x10FFFF));
      }
      ++pos_;
      set = normalize_ranges(set);
      if (negate) set = complement_ranges(set);
      std::vector<Seq> alts = utf8_sequences(b_, set);
      if (alts.empty()) {
        pos_ = at;
        error("a character class that matches nothing");
      }
      return alts.size() == 1 ? std::move(alts[0]) : Seq{b_.alt(std::move(alts), "class")};
    }
    if (c == '.') {
      ++pos_;
      return Seq{b_.alt(utf8_sequences(b_, complement_ranges({})), "any")};
    }
    if (c == '(') {
      ++pos_;
      if (++depth_ > kMaxGroupDepth) {
        pos_ = at;
        error(fmt::format("groups nested more than {} deep", kMaxGroupDepth));
      }
      std::vector<Seq> alts = alternatives(/*nested=*/true);
      --depth_;
      if (at_end() || s_[pos_] != ')') {
        pos_ = at;
        error("unterminated group '('");
      }
      ++pos_;
      return Seq{b_.alt(std::move(alts), "group")};
    }
    if (name_char(c)) return Seq{GrammarBuilder::ref(rule_id(parse_name()))};
    error(fmt::format("unexpected '{}'", c));
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open at pos_ (the parser recurses once per group)
  GrammarBuilder b_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<std::string, bool> defined_;
};

}  // namespace

Grammar compile_gbnf(std::string_view text) { return GbnfParser(text).parse(); }

}  // namespace infera::constrain
