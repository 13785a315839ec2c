// Regular expressions (an ECMAScript subset) to grammar symbols.
#include <map>

#include "infera/constrain/compile.h"

namespace infera::constrain {

namespace {

const CodeRanges kDigit = {{'0', '9'}};
const CodeRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodeRanges kSpace = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                           {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

class RegexCompiler {
 public:
  RegexCompiler(GrammarBuilder& b, std::string_view pattern, bool json_string)
      : b_(b), p_(pattern), json_(json_string) {}

  Seq compile(bool search) {
    if (!p_.empty() && p_[0] == '^') {
      anchored_start_ = true;
      pos_ = 1;
    }
    Seq body = alternation();
    if (pos_ < p_.size()) error("unbalanced ')'");
    Seq out;
    if (search && !anchored_start_) out.push_back(b_.star({set_symbol(any_char())}));
    append(out, body);
    if (search && !anchored_end_) out.push_back(b_.star({set_symbol(any_char())}));
    return out;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    constraint_fail("regex: {} at position {} of '{}'", what, pos_, std::string(p_.substr(0, 200)));
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek() const { return p_[pos_]; }

  static CodeRanges any_char() { return complement_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); }

  Seq alternation() {
    std::vector<Seq> alts{sequence()};
    while (!at_end() && peek() == '|') {
      ++pos_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return std::move(alts[0]);
    return Seq{b_.alt(std::move(alts), "regex-alt")};
  }

  Seq sequence() {
    Seq s;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        if (pos_ + 1 != p_.size()) error("'$' is only supported at the end of the pattern");
        anchored_end_ = true;
        ++pos_;
        continue;
      }
      Seq a = atom();
      append(s, quantified(std::move(a)));
    }
    return s;
  }

  Seq quantified(Seq a) {
    if (at_end()) return a;
    int64_t min = -1, max = -1;
    const size_t start = pos_;
    switch (peek()) {
      case '*': min = 0, max = -1, ++pos_; break;
      case '+': min = 1, max = -1, ++pos_; break;
      case '?': min = 0, max = 1, ++pos_; break;
      case '{': {
        size_t q = pos_ + 1;
        auto number = [&](int64_t& out) {
          const size_t s = q;
          out = 0;
          while (q < p_.size() && p_[q] >= '0' && p_[q] <= '9' && q - s < 9) out = out * 10 + (p_[q++] - '0');
          return q > s;
        };
        if (!number(min)) error("'{' that is not a quantifier (escape it as \\{)");
        max = min;
        if (q < p_.size() && p_[q] == ',') {
          ++q;
          if (!number(max)) max = -1;
        }
        if (q >= p_.size() || p_[q] != '}') error("unterminated quantifier '{'");
        pos_ = q + 1;
        break;
      }
      default: return a;
    }
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language
    if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
      pos_ = start;
      error("a quantifier after a quantifier");
    }
    try {
      return b_.repeat(a, min, max);
    } catch (const ConstraintError& e) {
      pos_ = start;
      error(e.what());
    }
  }

  uint32_t hex(size_t digits) {
    uint32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(peek()))) error("invalid hexadecimal escape");
      const char c = p_[pos_++];
      v = v * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // After a backslash: a set (\d ...) or one code point.
  CodeRanges escape(bool in_class) {
    if (at_end()) error("a trailing backslash");
    const size_t at = pos_;
    const char c = p_[pos_++];
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement_ranges(kDigit);
      case 'w': return kWord;
      case 'W': return complement_ranges(kWord);
      case 's': return kSpace;
      case 'S': return complement_ranges(kSpace);
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 't': return {{'\t', '\t'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': {
        const uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v;
        if (!at_end() && peek() == '{') {
          ++pos_;
          v = 0;
          size_t n = 0;
          while (!at_end() && peek() != '}' && n++ < 6) v = v * 16 + hex(1);
          if (at_end() || peek() != '}' || v > 0x10FFFF) error("invalid \\u{...} escape");
          ++pos_;
        } else {
          v = hex(4);
        }
        if (v >= 0xD800 && v <= 0xDFFF) error("a surrogate code point escape");
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{8, 8}};
        pos_ = at - 1;
        error("unsupported word boundary '\\b'");
      case 'B': pos_ = at - 1; error("unsupported word boundary '\\B'");
      case 'k': pos_ = at - 1; error("unsupported backreference '\\k'");
      case 'c': pos_ = at - 1; error("unsupported control escape '\\c'");
      case 'p':
      case 'P': pos_ = at - 1; error("unsupported Unicode property escape");
      default:
        if (c >= '1' && c <= '9') {
          pos_ = at - 1;
          error("unsupported backreference");
        }
        if (std::isalnum(static_cast<unsigned char>(c))) {
          pos_ = at - 1;
          error(fmt::format("unknown escape '\\{}'", c));
        }
        return {{static_cast<uint32_t>(static_cast<unsigned char>(c)),
                 static_cast<uint32_t>(static_cast<unsigned char>(c))}};
    }
  }

  uint32_t literal_code_point() {
    uint32_t cp;
    if (!decode_utf8(p_, pos_, cp)) error("invalid UTF-8");
    return cp;
  }

  CodeRanges char_class() {
    const size_t open = pos_;
    ++pos_;  // [
    bool negate = false;
    if (!at_end() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodeRanges set;
    bool first = true;
    while (true) {
      if (at_end()) {
        pos_ = open;
        error("unterminated character class '['");
      }
      if (peek() == ']' && !first) break;
      if (peek() == ']' && first) {
        ++pos_;
        if (negate) return complement_ranges({});
        pos_ = open;
        error("an empty character class '[]'");
      }
      first = false;
      CodeRanges item;
      bool single = true;
      if (peek() == '\\') {
        ++pos_;
        item = escape(true);
        single = item.size() == 1 && item[0].first == item[0].second;
      } else {
        const uint32_t cp = literal_code_point();
        item = {{cp, cp}};
      }
      if (single && pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        if (peek() == '\\') {
          ++pos_;
          CodeRanges h = escape(true);
          if (h.size() != 1 || h[0].first != h[0].second) error("a class escape as a range end");
          hi = h[0].first;
        } else {
          hi = literal_code_point();
        }
        if (hi < item[0].first) error("a character range out of order");
        item[0].second = hi;
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    ++pos_;  // ]
    set = normalize_ranges(set);
    return negate ? complement_ranges(set) : set;
  }

  Seq atom() {
    const size_t at = pos_;
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (p_.substr(pos_, 2) == "?:") {
        pos_ += 2;
      } else if (p_.substr(pos_, 2) == "?=" || p_.substr(pos_, 2) == "?!" || p_.substr(pos_, 3) == "?<=" ||
                 p_.substr(pos_, 3) == "?<!") {
        pos_ = at;
        error("unsupported lookaround");
      } else if (p_.substr(pos_, 2) == "?<") {
        const size_t close = p_.find('>', pos_);
        if (close == std::string_view::npos) error("unterminated group name");
        pos_ = close + 1;
      } else if (!at_end() && peek() == '?') {
        pos_ = at;
        error("unsupported group modifier");
      }
      if (++depth_ > kMaxGroupDepth) {
        pos_ = at;
        error(fmt::format("groups nested more than {} deep", kMaxGroupDepth));
      }
      Seq inner = alternation();
      --depth_;
      if (at_end() || peek() != ')') {
        pos_ = at;
        error("unterminated group '('");
      }
      ++pos_;
      // A group is one symbol, so a quantifier repeats all of it.
      return inner.size() == 1 ? inner : Seq{b_.alt({std::move(inner)}, "group")};
    }
    if (c == '[') return Seq{set_symbol(char_class())};
    if (c == '.') {
      ++pos_;
      return Seq{set_symbol(any_char())};
    }
    if (c == '\\') {
      ++pos_;
      return Seq{set_symbol(escape(false))};
    }
    if (c == '^') error("'^' is only supported at the start of the pattern");
    if (c == '*' || c == '+' || c == '?' || c == '{') error(fmt::format("nothing to repeat before '{}'", c));
    if (c == ')') error("unbalanced ')'");
    const uint32_t cp = literal_code_point();
    return Seq{set_symbol({{cp, cp}})};
  }

  // One character of the set, as it is written in the output.
  Sym set_symbol(const CodeRanges& set) {
    if (auto it = memo_.find(set); it != memo_.end()) return it->second;
    std::vector<Seq> alts;
    if (!json_) {
      alts = utf8_sequences(b_, set);
    } else {
      CodeRanges plain;
      for (auto [lo, hi] : set) {
        for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
          if (cp < 0x20 || cp == '"' || cp == '\\') {
            static const char* kShort[] = {"\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005",
                                           "\\u0006", "\\u0007", "\\b",     "\\t",     "\\n",     "\\u000b",
                                           "\\f",     "\\r",     "\\u000e", "\\u000f"};
            std::string esc = cp == '"'    ? "\\\""
                              : cp == '\\' ? "\\\\"
                              : cp < 16    ? kShort[cp]
                                           : fmt::format("\\u{:04x}", cp);
            alts.push_back(b_.lit(esc));
          } else {
            plain.emplace_back(cp, cp);
          }
        }
        if (hi > 0x5C) plain.emplace_back(std::max<uint32_t>(lo, 0x5D), hi);
      }
      for (Seq& s : utf8_sequences(b_, normalize_ranges(plain))) alts.push_back(std::move(s));
    }
    if (alts.empty()) error("a character set that matches nothing");
    const Sym s = alts.size() == 1 && alts[0].size() == 1 ? alts[0][0] : b_.alt(std::move(alts), "char");
    memo_.emplace(set, s);
    return s;
  }

  GrammarBuilder& b_;
  std::string_view p_;
  bool json_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open at pos_ (the parser recurses once per group)
  bool anchored_start_ = false;
  bool anchored_end_ = false;
  std::map<CodeRanges, Sym> memo_;
};

}  // namespace

Seq regex_symbols(GrammarBuilder& b, std::string_view pattern, bool json_string, bool search) {
  return RegexCompiler(b, pattern, json_string).compile(search);
}

Grammar compile_regex(std::string_view pattern) {
  GrammarBuilder b;
  Seq s = regex_symbols(b, pattern, /*json_string=*/false, /*search=*/false);
  const uint32_t root = b.rule("root", {std::move(s)});
  return b.build(root);
}

Grammar compile_choice(const std::vector<std::string>& choices) {
  if (choices.empty()) constraint_fail("choice: the list of choices is empty");
  GrammarBuilder b;
  std::vector<Seq> alts;
  for (const auto& c : choices) alts.push_back(b.lit(c));
  const uint32_t root = b.rule("root", std::move(alts));
  return b.build(root);
}

}  // namespace infera::constrain
