#include "infera/constrain/grammar.h"

#include <algorithm>
#include <functional>

#include "infera/tokenizer/unicode.h"

namespace infera::constrain {

uint32_t GrammarBuilder::new_rule(std::string name) {
  names_.push_back(std::move(name));
  alts_.emplace_back();
  return static_cast<uint32_t>(alts_.size() - 1);
}

void GrammarBuilder::add_alt(uint32_t rule, Seq alt) {
  num_symbols_ += alt.size() + 1;
  if (num_symbols_ > kMaxElements)
    constraint_fail("the constraint is too large (over {} grammar symbols)", kMaxElements);
  alts_[rule].push_back(std::move(alt));
}

uint32_t GrammarBuilder::rule(std::string name, std::vector<Seq> alts) {
  const uint32_t r = new_rule(std::move(name));
  for (auto& a : alts) add_alt(r, std::move(a));
  return r;
}

Sym GrammarBuilder::cls(const ByteSet& set) {
  auto [it, inserted] = class_ids_.try_emplace(set, static_cast<uint32_t>(classes_.size()));
  if (inserted) classes_.push_back(set);
  return Sym{Sym::kClass, it->second};
}

Seq GrammarBuilder::lit(std::string_view bytes) {
  Seq s;
  for (char c : bytes) s.push_back(byte(static_cast<uint8_t>(c)));
  return s;
}

Sym GrammarBuilder::alt(std::vector<Seq> alts, const char* name) { return ref(rule(name, std::move(alts))); }

Sym GrammarBuilder::opt(Seq s) { return alt({std::move(s), Seq{}}, "opt"); }

Sym GrammarBuilder::star(Seq s) {
  // r ::= s r | "" (the tail reference costs the matcher no stack depth).
  const uint32_t r = new_rule("star");
  s.push_back(ref(r));
  add_alt(r, std::move(s));
  add_alt(r, Seq{});
  return ref(r);
}

Seq GrammarBuilder::repeat(const Seq& s, int64_t min, int64_t max) {
  if (min < 0 || (max >= 0 && max < min)) constraint_fail("invalid repetition {{{},{}}}", min, max);
  if (min > kMaxRepeat || (max >= 0 && max - min > kMaxRepeat))
    constraint_fail("a repetition count above {} is not supported", kMaxRepeat);
  if (static_cast<size_t>(min + 1) * (s.size() + 1) > kMaxElements)
    constraint_fail("the constraint is too large (over {} grammar symbols)", kMaxElements);
  Seq out;
  for (int64_t i = 0; i < min; ++i) append(out, s);
  if (max < 0) {
    out.push_back(star(s));
  } else if (max > min) {
    // tail_k ::= s tail_{k-1} | "" , nested (max - min) deep.
    uint32_t tail = rule("rep", {s, Seq{}});
    for (int64_t k = 1; k < max - min; ++k) {
      Seq a = s;
      a.push_back(ref(tail));
      tail = rule("rep", {std::move(a), Seq{}});
    }
    out.push_back(ref(tail));
  }
  return out;
}

Grammar GrammarBuilder::build(uint32_t root) {
  const size_t n = alts_.size();
  if (root >= n) constraint_fail("the grammar has no root rule");
  // Reachable rules must be defined.
  std::vector<char> reachable(n, 0);
  std::vector<uint32_t> work{root};
  reachable[root] = 1;
  while (!work.empty()) {
    const uint32_t r = work.back();
    work.pop_back();
    if (alts_[r].empty()) constraint_fail("rule '{}' is used but not defined", names_[r]);
    for (const Seq& a : alts_[r]) {
      for (const Sym& s : a) {
        if (s.kind == Sym::kRule && !reachable[s.id]) {
          reachable[s.id] = 1;
          work.push_back(s.id);
        }
      }
    }
  }
  // Fewest bytes of each rule (a fixed point; kInfinite: no finite derivation).
  constexpr uint32_t kInf = Grammar::kInfinite;
  std::vector<uint32_t> rule_min(n, kInf);
  auto seq_min = [&](const Seq& a, size_t from) {
    uint64_t total = 0;
    for (size_t i = from; i < a.size(); ++i) total += a[i].kind == Sym::kClass ? 1 : rule_min[a[i].id];
    return static_cast<uint32_t>(std::min<uint64_t>(total, kInf));
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (!reachable[r]) continue;
      for (const Seq& a : alts_[r]) {
        const uint32_t m = seq_min(a, 0);
        if (m < rule_min[r]) {
          rule_min[r] = m;
          changed = true;
        }
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    if (reachable[r] && rule_min[r] >= kInf)
      constraint_fail("rule '{}' never ends (it has no finite derivation)", names_[r]);
  }
  // Left recursion: an edge r -> s when s can come first in an alternative of r (only
  // empty-matching symbols before it). A cycle of such edges loops the matcher's expansion
  // unless every edge on it is a tail reference (which pushes nothing).
  std::vector<char> nullable(n, 0);
  for (size_t r = 0; r < n; ++r) nullable[r] = reachable[r] && rule_min[r] == 0;
  struct Edge {
    uint32_t to;
    bool tail;
  };
  std::vector<std::vector<Edge>> edges(n);
  for (size_t r = 0; r < n; ++r) {
    if (!reachable[r]) continue;
    for (const Seq& a : alts_[r]) {
      for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].kind == Sym::kClass) break;
        edges[r].push_back({a[i].id, i + 1 == a.size()});
        if (!nullable[a[i].id]) break;
      }
    }
  }
  // Strongly connected components (Tarjan, iterative).
  std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1);
  std::vector<char> on_stack(n, 0);
  std::vector<uint32_t> stack;
  int32_t counter = 0, num_comps = 0;
  for (uint32_t start = 0; start < n; ++start) {
    if (!reachable[start] || index[start] >= 0) continue;
    std::vector<std::pair<uint32_t, size_t>> call{{start, 0}};
    index[start] = low[start] = counter++;
    stack.push_back(start);
    on_stack[start] = 1;
    while (!call.empty()) {
      auto& [v, ei] = call.back();
      if (ei < edges[v].size()) {
        const uint32_t w = edges[v][ei++].to;
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on_stack[w] = 1;
          call.emplace_back(w, 0);
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        for (;;) {
          const uint32_t w = stack.back();
          stack.pop_back();
          on_stack[w] = 0;
          comp[w] = num_comps;
          if (w == v) break;
        }
        ++num_comps;
      }
      const uint32_t done = v;
      call.pop_back();
      if (!call.empty()) low[call.back().first] = std::min(low[call.back().first], low[done]);
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const Edge& e : edges[r]) {
      if (!e.tail && comp[e.to] == comp[r])
        constraint_fail("rule '{}' is left-recursive (through '{}'); rewrite it with repetition", names_[r],
                        names_[e.to]);
    }
  }
  // Flatten.
  Grammar g;
  g.classes = classes_;
  g.rule_names = names_;
  g.rule_alts.resize(n);
  g.root = root;
  for (size_t r = 0; r < n; ++r) {
    if (!reachable[r]) continue;
    for (const Seq& a : alts_[r]) {
      g.rule_alts[r].push_back(static_cast<uint32_t>(g.elements.size()));
      for (size_t i = 0; i < a.size(); ++i) {
        g.elements.push_back({a[i].kind == Sym::kClass ? Grammar::Element::kClass : Grammar::Element::kRule, a[i].id});
        g.min_rest.push_back(seq_min(a, i));
      }
      g.elements.push_back({Grammar::Element::kEnd, 0});
      g.min_rest.push_back(0);
    }
  }
  return g;
}

namespace {

std::string class_text(const ByteSet& s) {
  auto esc = [](int b) -> std::string {
    if (b == '\\' || b == ']' || b == '[' || b == '-' || b == '^' || b == '"') return fmt::format("\\{}", char(b));
    if (b >= 0x20 && b < 0x7f) return std::string(1, char(b));
    return fmt::format("\\x{:02X}", b);
  };
  int count = 0;
  int only = -1;
  for (int b = 0; b < 256; ++b) {
    if (s.test(static_cast<uint8_t>(b))) {
      ++count;
      only = b;
    }
  }
  if (count == 1) {
    if (only >= 0x20 && only < 0x7f && only != '"' && only != '\\') return fmt::format("\"{}\"", char(only));
    return fmt::format("[{}]", esc(only));
  }
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s.test(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.test(static_cast<uint8_t>(e + 1))) ++e;
    out += esc(b);
    if (e > b) {
      out += '-';
      out += esc(e);
    }
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::to_gbnf() const {
  std::string out;
  auto name = [&](uint32_t r) { return fmt::format("{}-{}", rule_names[r], r); };
  for (size_t r = 0; r < rule_alts.size(); ++r) {
    if (rule_alts[r].empty()) continue;
    out += r == root ? std::string("root") : name(static_cast<uint32_t>(r));
    out += " ::=";
    for (size_t a = 0; a < rule_alts[r].size(); ++a) {
      if (a > 0) out += " |";
      bool empty = true;
      for (uint32_t p = rule_alts[r][a]; elements[p].kind != Element::kEnd; ++p) {
        empty = false;
        const Element& e = elements[p];
        out += ' ';
        out +=
            e.kind == Element::kClass ? class_text(classes[e.id]) : (e.id == root ? std::string("root") : name(e.id));
      }
      if (empty) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

std::string Grammar::local_signature(std::span<const uint32_t> chain, size_t max_elements) const {
  std::string out;
  std::map<uint32_t, uint32_t> ids;  // rule -> canonical number
  std::vector<uint32_t> order;
  size_t seen = 0;
  auto put32 = [&out](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  // One alternative's elements from `p` to its end.
  auto seq = [&](uint32_t p) {
    for (;; ++p) {
      const Element& e = elements[p];
      if (++seen > max_elements) return false;
      if (e.kind == Element::kEnd) {
        out += 'E';
        return true;
      }
      if (e.kind == Element::kClass) {
        out += 'C';
        out.append(reinterpret_cast<const char*>(classes[e.id].bits.data()), sizeof(classes[e.id].bits));
      } else {
        auto [it, inserted] = ids.try_emplace(e.id, static_cast<uint32_t>(ids.size()));
        if (inserted) order.push_back(e.id);
        out += 'R';
        put32(it->second);
      }
    }
  };
  for (size_t i = 0; i < chain.size(); ++i) {
    out += 'F';
    if (!seq(i == 0 ? chain[0] : chain[i] + 1)) return {};
  }
  for (size_t k = 0; k < order.size(); ++k) {
    out += 'A';
    put32(static_cast<uint32_t>(rule_alts[order[k]].size()));
    for (uint32_t a : rule_alts[order[k]])
      if (!seq(a)) return {};
  }
  return out;
}

// --- Unicode ---

CodeRanges normalize_ranges(CodeRanges r) {
  std::sort(r.begin(), r.end());
  CodeRanges out;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodeRanges complement_ranges(const CodeRanges& in) {
  const CodeRanges r = normalize_ranges(in);
  CodeRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  // Without surrogates (never valid in UTF-8).
  CodeRanges clean;
  for (auto [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      clean.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) clean.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) clean.emplace_back(0xE000, hi);
  }
  return clean;
}

bool decode_utf8(std::string_view s, size_t& i, uint32_t& cp) {
  size_t next = i;
  char32_t c;
  if (!unicode::next_code_point(s, next, c)) return false;
  i = next;
  cp = c;
  return true;
}

namespace {

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// Splits [lo, hi] (same encoded length) until each piece is a product of byte ranges.
void utf8_split(GrammarBuilder& b, uint32_t lo, uint32_t hi, std::vector<Seq>& out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(b, lo, lo | m, out);
        utf8_split(b, (lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(b, lo, (hi & ~m) - 1, out);
        utf8_split(b, hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, z;
  unicode::append_utf8(a, lo);
  unicode::append_utf8(z, hi);
  Seq s;
  for (size_t k = 0; k < a.size(); ++k)
    s.push_back(b.cls(ByteSet::range(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(z[k]))));
  out.push_back(std::move(s));
}

}  // namespace

std::vector<Seq> utf8_sequences(GrammarBuilder& b, const CodeRanges& ranges) {
  std::vector<Seq> out;
  static const uint32_t kBounds[][2] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
  for (auto [lo, hi] : normalize_ranges(ranges)) {
    for (const auto& bound : kBounds) {
      const uint32_t a = std::max(lo, bound[0]), z = std::min(hi, bound[1]);
      if (a <= z) utf8_split(b, a, z, out);
    }
  }
  return out;
}

}  // namespace infera::constrain
