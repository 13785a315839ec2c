// A context-free grammar over bytes: the one representation every constraint compiles to
// (JSON Schema, regular expressions, choice lists, GBNF; docs/structured.md). Terminals are
// byte classes (a set of the 256 byte values), so any tokenizer works: the matcher walks
// the bytes a token decodes to.
//
// Each rule is a list of alternatives, each alternative a sequence of symbols (a byte class
// or a reference to a rule). The built grammar stores every alternative flattened into one
// element array, each followed by an end marker; a matcher position is an index into it.
// Left recursion is refused when the grammar is built (the matcher expands rules top-down).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "infera/base/error.h"

namespace infera::constrain {

// Thrown for a constraint a client sent that cannot be compiled; the message names the
// keyword, position or rule (the server answers 400 with it).
class ConstraintError : public Error {
 public:
  explicit ConstraintError(const std::string& message) : Error(message) {}
};

template <typename... Args>
[[noreturn]] inline void constraint_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw ConstraintError(fmt::format(f, std::forward<Args>(args)...));
}

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  void reset(uint8_t b) { bits[b >> 6] &= ~(uint64_t{1} << (b & 63)); }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator<(const ByteSet& o) const { return bits < o.bits; }
  bool operator==(const ByteSet& o) const { return bits == o.bits; }
  static ByteSet of(uint8_t b) {
    ByteSet s;
    s.set(b);
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.set_range(lo, hi);
    return s;
  }
};

// A symbol of an alternative while building.
struct Sym {
  enum Kind : uint8_t { kClass, kRule };
  Kind kind = kClass;
  uint32_t id = 0;  // class id or rule id
};
using Seq = std::vector<Sym>;

inline void append(Seq& to, const Seq& from) { to.insert(to.end(), from.begin(), from.end()); }

class Grammar {
 public:
  struct Element {
    enum Kind : uint8_t { kClass, kRule, kEnd };
    Kind kind = kEnd;
    uint32_t id = 0;  // class id (kClass) or rule id (kRule)
  };
  static constexpr uint32_t kInfinite = 0x3fffffff;

  std::vector<Element> elements;  // every alternative's symbols, each alternative ended by kEnd
  std::vector<ByteSet> classes;
  std::vector<std::vector<uint32_t>> rule_alts;  // [rule] the element index where each alternative starts
  std::vector<std::string> rule_names;
  // [element] the fewest bytes that complete the alternative from this element on (the
  // matcher's cost of finishing; max_tokens steering and tests use it).
  std::vector<uint32_t> min_rest;
  uint32_t root = 0;

  size_t num_rules() const { return rule_alts.size(); }
  // GBNF text of the grammar (debugging, tests).
  std::string to_gbnf() const;
  // A canonical text of what a matcher stack whose top frames are `chain` (chain[0] the top,
  // a byte class; then the return points below it, a rule reference each) can match before
  // it returns below the last of them: the rest of the top's alternative, the rest of each
  // return point's, and every rule reachable from those, rules numbered in the order first
  // met (equal texts: equal context-independent token sets, whatever grammar they come
  // from). Empty when that exceeds `max_elements`.
  std::string local_signature(std::span<const uint32_t> chain, size_t max_elements) const;
};

// Builds a Grammar. Rules may be referenced before their alternatives are added.
class GrammarBuilder {
 public:
  uint32_t new_rule(std::string name);
  void add_alt(uint32_t rule, Seq alt);
  uint32_t rule(std::string name, std::vector<Seq> alts);
  size_t num_rules() const { return alts_.size(); }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }
  bool has_alts(uint32_t r) const { return !alts_[r].empty(); }

  Sym cls(const ByteSet& set);
  Sym byte(uint8_t b) { return cls(ByteSet::of(b)); }
  static Sym ref(uint32_t rule) { return Sym{Sym::kRule, rule}; }
  Seq lit(std::string_view bytes);
  // A rule with these alternatives, as one symbol.
  Sym alt(std::vector<Seq> alts, const char* name = "alt");
  Sym opt(Seq s);  // s | ""
  Sym star(Seq s);  // zero or more s
  // s repeated between min and max times (max -1: unbounded). Fails past kMaxRepeat copies.
  Seq repeat(const Seq& s, int64_t min, int64_t max);

  // Validates (every rule defined and productive, no left recursion, a size limit) and
  // flattens. Throws ConstraintError naming the rule.
  Grammar build(uint32_t root);

  static constexpr int64_t kMaxRepeat = 4096;  // bounded repetition copies
  static constexpr size_t kMaxElements = size_t{1} << 21;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<Seq>> alts_;
  std::vector<ByteSet> classes_;
  std::map<ByteSet, uint32_t> class_ids_;
  size_t num_symbols_ = 0;
};

// --- Unicode helpers shared by the compilers ---

// Code point ranges (inclusive, sorted, disjoint).
using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;
CodeRanges normalize_ranges(CodeRanges r);
CodeRanges complement_ranges(const CodeRanges& r);  // within [0, 0x10FFFF] minus surrogates
// The alternatives (byte sequences of byte classes) that encode exactly the code points of
// `ranges` in UTF-8.
std::vector<Seq> utf8_sequences(GrammarBuilder& b, const CodeRanges& ranges);
// Decodes one code point at s[i] (advancing i; unicode::next_code_point); false on invalid
// UTF-8, leaving i where the invalid sequence starts.
bool decode_utf8(std::string_view s, size_t& i, uint32_t& cp);

}  // namespace infera::constrain
