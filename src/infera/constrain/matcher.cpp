#include "infera/constrain/matcher.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace infera::constrain {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t kBottomHash = 0x51afd7ed558ccd01ULL;
constexpr uint64_t kCompleteHash = 0xc4ceb9fe1a85ec53ULL;
constexpr size_t kMaxExpandWork = 1 << 18;  // items one advance may expand (a pathological grammar stops there)

uint32_t add_sat(uint32_t a, uint32_t b) { return std::min<uint64_t>(uint64_t{a} + b, Grammar::kInfinite); }

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<char> usable)
    : bytes_(std::move(token_bytes)), usable_(std::move(usable)) {
  usable_.resize(bytes_.size(), 0);
  uint64_t fp = mix(bytes_.size());
  std::vector<int32_t> order;
  for (int32_t id = 0; id < static_cast<int32_t>(bytes_.size()); ++id) {
    fp = mix(fp ^ std::hash<std::string>{}(bytes_[id]) ^ (usable_[id] ? 1 : 0));
    if (usable_[id] && !bytes_[id].empty() && bytes_[id].size() < 65535) order.push_back(id);
  }
  fingerprint_ = fp;
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b] || (bytes_[a] == bytes_[b] && a < b); });
  std::vector<uint32_t> path;  // node index at each depth - 1
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[id];
    size_t common = 0;
    if (prev) {
      const size_t limit = std::min({prev->size(), s.size(), path.size()});
      while (common < limit && (*prev)[common] == s[common]) ++common;
    }
    while (path.size() > common) {
      trie_[path.back()].end = static_cast<uint32_t>(trie_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      TrieNode n{static_cast<uint8_t>(s[d]), static_cast<uint16_t>(d + 1), 0, 0, 0, 0};
      n.tokens_begin = n.tokens_end = static_cast<uint32_t>(trie_tokens_.size());
      path.push_back(static_cast<uint32_t>(trie_.size()));
      trie_.push_back(n);
    }
    trie_tokens_.push_back(id);
    trie_[path.back()].tokens_end = static_cast<uint32_t>(trie_tokens_.size());
    for (uint32_t node : path)
      trie_[node].max_depth = std::max<uint16_t>(trie_[node].max_depth, static_cast<uint16_t>(s.size()));
    max_depth_ = std::max<int32_t>(max_depth_, static_cast<int32_t>(s.size()));
    prev = &s;
  }
  while (!path.empty()) {
    trie_[path.back()].end = static_cast<uint32_t>(trie_.size());
    path.pop_back();
  }
}

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) { restart(); }

int32_t Matcher::make_node(uint32_t pos, int32_t parent) {
  Node n;
  n.pos = pos;
  n.parent = parent;
  if (parent < 0) {
    n.below = 0;
    n.hash = mix(pos ^ kBottomHash);
  } else {
    const Node& p = nodes_[parent];
    n.below = add_sat(grammar_->min_rest[p.pos + 1], p.below);
    n.hash = mix(pos ^ (p.hash * 0x100000001b3ULL));
  }
  nodes_.push_back(n);
  return static_cast<int32_t>(nodes_.size() - 1);
}

void Matcher::expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out) {
  const Grammar& g = *grammar_;
  work_.clear();
  work_.emplace_back(pos, parent);
  size_t done = 0;
  while (!work_.empty()) {
    if (done++ >= kMaxExpandWork) {
      truncated_ = true;
      break;
    }
    ++work_done_;
    auto [p, par] = work_.back();
    work_.pop_back();
    const uint64_t key = mix(p ^ ((par < 0 ? kBottomHash : nodes_[par].hash) * 0x100000001b3ULL));
    if (std::find(seen_.begin(), seen_.end(), key) != seen_.end()) continue;
    seen_.push_back(key);
    const Grammar::Element& e = g.elements[p];
    switch (e.kind) {
      case Grammar::Element::kClass:
        if (out.size() < kMaxStacks)
          out.push_back(make_node(p, par));
        else
          truncated_ = true;
        break;
      case Grammar::Element::kEnd:
        if (par < 0) {
          if (std::find(out.begin(), out.end(), -1) == out.end()) out.push_back(-1);
        } else {
          work_.emplace_back(nodes_[par].pos + 1, nodes_[par].parent);
        }
        break;
      case Grammar::Element::kRule: {
        const int32_t ret = g.elements[p + 1].kind == Grammar::Element::kEnd ? par : make_node(p, par);
        const auto& alts = g.rule_alts[e.id];
        for (auto it = alts.rbegin(); it != alts.rend(); ++it) work_.emplace_back(*it, ret);
        break;
      }
    }
  }
}

void Matcher::advance(std::span<const int32_t> in, uint8_t byte, std::vector<int32_t>& out) {
  out.clear();
  seen_.clear();
  const Grammar& g = *grammar_;
  for (int32_t top : in) {
    if (top < 0) continue;
    const Node& n = nodes_[top];
    if (!g.classes[g.elements[n.pos].id].test(byte)) continue;
    const uint32_t next = n.pos + 1;
    const int32_t parent = n.parent;
    expand(next, parent, out);
  }
}

void Matcher::restart() {
  std::vector<int32_t> out;
  seen_.clear();
  for (uint32_t a : grammar_->rule_alts[grammar_->root]) expand(a, -1, out);
  Frame f;
  f.begin = static_cast<uint32_t>(stacks_.size());
  stacks_.insert(stacks_.end(), out.begin(), out.end());
  f.end = static_cast<uint32_t>(stacks_.size());
  f.nodes = static_cast<uint32_t>(nodes_.size());
  frames_.push_back(f);
}

bool Matcher::accept(std::string_view bytes) {
  const size_t nodes_before = nodes_.size();
  auto cur = current();
  a_.assign(cur.begin(), cur.end());
  for (char c : bytes) {
    advance(a_, static_cast<uint8_t>(c), b_);
    if (b_.empty()) {
      nodes_.resize(nodes_before);
      return false;
    }
    a_.swap(b_);
  }
  Frame f;
  f.begin = static_cast<uint32_t>(stacks_.size());
  stacks_.insert(stacks_.end(), a_.begin(), a_.end());
  f.end = static_cast<uint32_t>(stacks_.size());
  f.nodes = static_cast<uint32_t>(nodes_.size());
  frames_.push_back(f);
  return true;
}

void Matcher::rollback(size_t n) {
  n = std::min(n, depth());
  if (n == 0) return;
  frames_.resize(frames_.size() - n);
  stacks_.resize(frames_.back().end);
  nodes_.resize(frames_.back().nodes);
}

bool Matcher::complete() const {
  for (int32_t t : current())
    if (t < 0) return true;
  return false;
}

bool Matcher::can_continue() const {
  for (int32_t t : current())
    if (t >= 0) return true;
  return false;
}

uint32_t Matcher::stack_cost(int32_t top) const {
  if (top < 0) return 0;
  const Node& n = nodes_[top];
  return add_sat(grammar_->min_rest[n.pos], n.below);
}

uint32_t Matcher::min_remaining() const {
  uint32_t best = Grammar::kInfinite;
  for (int32_t t : current()) best = std::min(best, stack_cost(t));
  return best;
}

uint64_t Matcher::set_hash(const Node* nodes, std::span<const int32_t> tops) {
  uint64_t h = 0;
  for (int32_t t : tops) h += mix(t < 0 ? kCompleteHash : nodes[t].hash);
  return mix(h ^ tops.size());
}

uint64_t Matcher::state_hash() const { return set_hash(nodes_.data(), current()); }

int32_t Matcher::intern(std::span<const int32_t> tops) {
  const uint64_t h = set_hash(nodes_.data(), tops);
  auto [it, inserted] = state_ids_.try_emplace(h, static_cast<int32_t>(states_.size()));
  if (!inserted) return it->second;
  if (states_.size() < kDenseStates) dense_.resize((states_.size() + 1) * 256, kUnknown);
  State s;
  s.begin = static_cast<uint32_t>(state_tops_.size());
  state_tops_.insert(state_tops_.end(), tops.begin(), tops.end());
  s.end = static_cast<uint32_t>(state_tops_.size());
  s.cost = Grammar::kInfinite;
  s.complete = false;
  for (int32_t t : tops) {
    s.cost = std::min(s.cost, stack_cost(t));
    s.complete |= t < 0;
  }
  states_.push_back(s);
  return it->second;
}

int32_t Matcher::walk_begin(std::span<const int32_t> tops) {
  states_.clear();
  state_tops_.clear();
  state_ids_.clear();
  transitions_.clear();
  dense_.clear();
  work_done_ = 0;
  return intern(tops);
}

int32_t Matcher::transition(int32_t from, uint8_t byte) {
  // A table lookup for the first kDenseStates states (most walks never leave them), a hash
  // map beyond.
  const bool dense = static_cast<size_t>(from) < kDenseStates;
  const uint64_t key = (static_cast<uint64_t>(from) << 8) | byte;
  if (dense) {
    const int32_t to = dense_[static_cast<size_t>(from) * 256 + byte];
    if (to != kUnknown) return to;
  } else if (auto it = transitions_.find(key); it != transitions_.end()) {
    return it->second;
  }
  const State s = states_[from];
  a_.assign(state_tops_.begin() + s.begin, state_tops_.begin() + s.end);
  advance(a_, byte, b_);
  const int32_t to = b_.empty() ? -1 : intern(b_);
  if (dense)
    dense_[static_cast<size_t>(from) * 256 + byte] = to;
  else
    transitions_.emplace(key, to);
  return to;
}

int64_t Matcher::fill_mask(const Vocabulary& vocab, uint64_t* mask, uint32_t budget, uint32_t* max_cost) {
  std::memset(mask, 0, vocab.mask_words() * sizeof(uint64_t));
  const size_t base_nodes = nodes_.size();
  std::vector<int32_t> level(static_cast<size_t>(vocab.max_depth()) + 1, 0);
  level[0] = walk_begin(current());
  const auto& trie = vocab.trie();
  const auto& tokens = vocab.trie_tokens();
  int64_t allowed = 0;
  uint32_t most = 0;
  for (size_t i = 0; i < trie.size();) {
    if (work_done_ > kMaxMaskWork) {
      // A grammar this ambiguous would stall every sequence of the batch: the tokens not
      // reached yet stay disallowed (the mask is never wrong, only smaller).
      break;
    }
    const Vocabulary::TrieNode& node = trie[i];
    const int32_t to = transition(level[node.depth - 1], node.byte);
    // A byte lowers the fewest bytes to completion by at most one: with a budget, a subtree
    // whose longest token cannot bring the cost within it is skipped whole.
    if (to < 0 || (budget<Grammar::kInfinite&& static_cast<int64_t>(states_[to].cost)> static_cast<int64_t>(budget) -
                   1 + (node.max_depth - node.depth))) {
      i = node.end;
      continue;
    }
    level[node.depth] = to;
    if (node.tokens_begin != node.tokens_end &&
        (budget >= Grammar::kInfinite || (budget > 0 && states_[to].cost <= budget - 1))) {
      for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
        const int32_t t = tokens[k];
        mask[t >> 6] |= uint64_t{1} << (t & 63);
        ++allowed;
      }
      most = std::max(most, states_[to].cost);
    }
    ++i;
  }
  nodes_.resize(base_nodes);
  if (max_cost) *max_cost = most;
  return allowed;
}

std::vector<Matcher::TopChain> Matcher::top_chains() const {
  std::vector<TopChain> out;
  for (int32_t t : current()) {
    if (t < 0) continue;
    TopChain c;
    int32_t n = t;
    for (size_t k = 0; k < kChainFrames && n >= 0; ++k) {
      c.positions.push_back(nodes_[n].pos);
      c.below = nodes_[n].below;
      n = nodes_[n].parent;
    }
    out.push_back(std::move(c));
  }
  return out;
}

TopTokens Matcher::top_tokens(const Vocabulary& vocab, std::span<const uint32_t> positions) {
  TopTokens r;
  const size_t base_nodes = nodes_.size();
  truncated_ = false;
  // A lone stack of the chain's frames: an empty stack after a byte means the path returned
  // below them.
  int32_t top = -1;
  for (size_t k = positions.size(); k-- > 0;) top = make_node(positions[k], top);
  std::vector<int32_t> level(static_cast<size_t>(vocab.max_depth()) + 1, 0);
  // dep[d]: a path returned below the frame within the first d bytes of the current prefix.
  std::vector<char> dep(level.size(), 0);
  level[0] = walk_begin(std::span<const int32_t>(&top, 1));
  const auto& trie = vocab.trie();
  const auto& tokens = vocab.trie_tokens();
  std::vector<uint64_t> bits(vocab.mask_words(), 0);
  std::vector<int32_t> ids;
  bool complete_walk = true;
  for (size_t i = 0; i < trie.size();) {
    if (work_done_ > kMaxMaskWork) {
      complete_walk = false;
      break;
    }
    const Vocabulary::TrieNode& node = trie[i];
    const int32_t from = level[node.depth - 1];
    const bool dependent = dep[node.depth - 1] || states_[from].complete;
    const int32_t to = transition(from, node.byte);
    if (to < 0) {
      if (dependent) r.dependent.push_back(static_cast<uint32_t>(i));
      i = node.end;
      continue;
    }
    level[node.depth] = to;
    dep[node.depth] = dependent;
    if (node.tokens_begin != node.tokens_end) {
      for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
        const int32_t t = tokens[k];
        bits[t >> 6] |= uint64_t{1} << (t & 63);
        ids.push_back(t);
      }
      r.max_cost = std::max(r.max_cost, states_[to].cost);
    }
    ++i;
  }
  nodes_.resize(base_nodes);
  r.valid = complete_walk && !truncated_;
  r.accepted_count = static_cast<int64_t>(ids.size());
  // A short list where it is smaller than the mask.
  if (ids.size() * sizeof(int32_t) < bits.size() * sizeof(uint64_t))
    r.accepted_ids = std::move(ids);
  else
    r.accepted_bits = std::move(bits);
  return r;
}

bool Matcher::fill_mask_subtrees(const Vocabulary& vocab, uint64_t* mask, std::span<const uint32_t> roots,
                                 uint32_t* max_cost) {
  if (roots.empty()) return true;
  const size_t base_nodes = nodes_.size();
  std::vector<int32_t> level(static_cast<size_t>(vocab.max_depth()) + 1, 0);
  level[0] = walk_begin(current());
  const auto& trie = vocab.trie();
  const auto& tokens = vocab.trie_tokens();
  uint32_t covered = 0;  // end of the last subtree walked
  bool whole = true;
  for (uint32_t root : roots) {
    if (root < covered) continue;
    const Vocabulary::TrieNode& r = trie[root];
    covered = r.end;
    // The state after the root's prefix (its subtree's first token starts with it).
    const std::string& first = vocab.bytes(tokens[r.tokens_begin]);
    int32_t s = level[0];
    for (size_t d = 0; d + 1 < r.depth && s >= 0; ++d) s = transition(s, static_cast<uint8_t>(first[d]));
    if (s < 0) continue;
    level[r.depth - 1] = s;
    for (uint32_t i = root; i < r.end;) {
      if (work_done_ > kMaxMaskWork) {
        whole = false;
        break;
      }
      const Vocabulary::TrieNode& node = trie[i];
      const int32_t to = transition(level[node.depth - 1], node.byte);
      if (to < 0) {
        i = node.end;
        continue;
      }
      level[node.depth] = to;
      if (node.tokens_begin != node.tokens_end) {
        for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
          const int32_t t = tokens[k];
          mask[t >> 6] |= uint64_t{1} << (t & 63);
        }
        *max_cost = std::max(*max_cost, states_[to].cost);
      }
      ++i;
    }
    if (!whole) break;
  }
  nodes_.resize(base_nodes);
  return whole;
}

}  // namespace infera::constrain
