#include "infera/constrain/constraint.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "infera/tokenizer/tokenizer.h"

namespace infera::constrain {

std::string ConstraintSpec::key() const {
  std::string k = fmt::format("{}|{}|{}{}|", static_cast<int>(kind), schema_options.any_whitespace ? 1 : 0,
                              tool_options.with_open_tag ? 1 : 0, tool_options.parallel ? 1 : 0);
  k += json.is_null() ? text : json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return k;
}

Grammar compile_spec(const ConstraintSpec& spec) {
  switch (spec.kind) {
    case ConstraintSpec::Kind::kJsonSchema: return compile_json_schema(spec.json, spec.schema_options);
    case ConstraintSpec::Kind::kJsonObject: return compile_json_object(spec.schema_options);
    case ConstraintSpec::Kind::kRegex: return compile_regex(spec.text);
    case ConstraintSpec::Kind::kGrammar: return compile_gbnf(spec.text);
    case ConstraintSpec::Kind::kChoice: {
      std::vector<std::string> choices;
      for (const auto& c : spec.json) choices.push_back(c.get<std::string>());
      return compile_choice(choices);
    }
    case ConstraintSpec::Kind::kToolCalls: {
      std::vector<ToolSchema> tools;
      for (const auto& t : spec.json)
        tools.push_back({t.at("name").get<std::string>(), t.value("parameters", nlohmann::ordered_json())});
      return compile_tool_calls(tools, spec.tool_options);
    }
  }
  constraint_fail("unknown constraint kind");
}

int64_t CompiledConstraint::mask(Matcher& m, uint64_t* out, uint32_t budget) const {
  const size_t words = vocab_->mask_words();
  // A cached mask serves a budget when every token it allows leaves a completion that fits
  // (the budget steering of Matcher::fill_mask then removes nothing).
  const bool reuse = options_.budget_from_cache;
  auto serves = [budget, reuse](uint32_t max_cost) {
    return budget >= Grammar::kInfinite ||
           (reuse && static_cast<int64_t>(max_cost) <= static_cast<int64_t>(budget) - 1);
  };
  if (budget < Grammar::kInfinite && !reuse) return m.fill_mask(*vocab_, out, budget);
  const uint64_t h = m.state_hash();
  bool found = false;
  {
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(h); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      const Entry& e = it->second->second;
      if (serves(e.max_cost)) {
        std::memcpy(out, e.mask.data(), words * sizeof(uint64_t));
        return e.count;
      }
      found = true;
    }
  }
  // Near the end of the budget: the walk that keeps only tokens whose completion fits.
  if (found) return m.fill_mask(*vocab_, out, budget);
  uint32_t max_cost = 0;
  const int64_t n = compute_mask(m, out, &max_cost);
  {
    std::lock_guard lock(mutex_);
    if (!index_.contains(h)) {
      lru_.emplace_front(h, Entry{std::vector<uint64_t>(out, out + words), n, max_cost});
      index_[h] = lru_.begin();
      if (lru_.size() > kMaskCacheEntries) {
        index_.erase(lru_.back().first);
        lru_.pop_back();
      }
    }
  }
  return serves(max_cost) ? n : m.fill_mask(*vocab_, out, budget);
}

namespace {

struct SharedTopTokens {
  std::mutex mutex;
  std::list<std::pair<std::string, std::shared_ptr<const TopTokens>>> lru;  // most recent first
  std::unordered_map<std::string, decltype(lru)::iterator> index;
  size_t bytes = 0;
  int64_t hits = 0, misses = 0;

  std::shared_ptr<const TopTokens> find(const std::string& key) {
    std::lock_guard lock(mutex);
    auto it = index.find(key);
    if (it == index.end()) {
      ++misses;
      return nullptr;
    }
    ++hits;
    lru.splice(lru.begin(), lru, it->second);
    return it->second->second;
  }
  void put(const std::string& key, std::shared_ptr<const TopTokens> t) {
    const size_t size = t->bytes() + key.size();
    if (size > kSharedTopTokenBytes / 4) return;
    std::lock_guard lock(mutex);
    if (index.contains(key)) return;
    lru.emplace_front(key, std::move(t));
    index[key] = lru.begin();
    bytes += size;
    while (bytes > kSharedTopTokenBytes) {
      bytes -= lru.back().second->bytes() + lru.back().first.size();
      index.erase(lru.back().first);
      lru.pop_back();
    }
  }
};

SharedTopTokens& shared_top_tokens() {
  static SharedTopTokens c;
  return c;
}

}  // namespace

TopTokenCacheStats top_token_cache_stats() {
  SharedTopTokens& c = shared_top_tokens();
  std::lock_guard lock(c.mutex);
  return {c.hits, c.misses, c.lru.size(), c.bytes};
}

std::shared_ptr<const TopTokens> CompiledConstraint::top_tokens(Matcher& m, std::span<const uint32_t> positions) const {
  const std::string chain(reinterpret_cast<const char*>(positions.data()), positions.size_bytes());
  bool first = false;
  {
    std::lock_guard lock(top_mutex_);
    if (auto it = top_tokens_.find(chain); it != top_tokens_.end()) return it->second;
    if (seen_chains_.size() < kMaxSeenChains) first = seen_chains_.insert(chain).second;
  }
  // Computed outside the lock (two threads may both compute a chain; one copy is kept).
  std::string key = grammar_->local_signature(positions, kSharedSignatureElements);
  if (!key.empty()) key = fmt::format("{:016x}|", vocab_->fingerprint()) + key;
  std::shared_ptr<const TopTokens> t = key.empty() ? nullptr : shared_top_tokens().find(key);
  // A chain met for the first time may never come back (a position inside a bounded
  // repetition): its sets cost a walk of their own, so the first time the whole-trie walk
  // serves the mask, and the sets are computed when the chain comes back.
  if (!t && first) return nullptr;
  if (!t) {
    t = std::make_shared<const TopTokens>(m.top_tokens(*vocab_, positions));
    if (!key.empty()) shared_top_tokens().put(key, t);
  }
  std::lock_guard lock(top_mutex_);
  if (auto it = top_tokens_.find(chain); it != top_tokens_.end()) return it->second;
  if (top_bytes_ + t->bytes() <= kTopTokenBytes) {
    top_bytes_ += t->bytes();
    top_tokens_.emplace(chain, t);
  }
  return t;
}

int64_t CompiledConstraint::compute_mask(Matcher& m, uint64_t* out, uint32_t* max_cost) const {
  const size_t words = vocab_->mask_words();
  if (!options_.token_sets) return m.fill_mask(*vocab_, out, Grammar::kInfinite, max_cost);
  const auto chains = m.top_chains();
  // A state this ambiguous could drop stacks within a token (Matcher::kMaxStacks), which the
  // chains' own sets do not see: the whole-trie walk keeps the mask exact.
  if (chains.size() > kMaxTokenSetTops) return m.fill_mask(*vocab_, out, Grammar::kInfinite, max_cost);
  std::memset(out, 0, words * sizeof(uint64_t));
  uint32_t most = 0;
  std::vector<uint32_t> roots;
  std::vector<const TopTokens*> merged;
  std::vector<std::shared_ptr<const TopTokens>> held;
  for (const Matcher::TopChain& c : chains) {
    std::shared_ptr<const TopTokens> t = top_tokens(m, c.positions);
    if (!t || !t->valid) return m.fill_mask(*vocab_, out, Grammar::kInfinite, max_cost);
    if (t->accepted_count > 0)
      most = std::max<uint32_t>(most, static_cast<uint32_t>(
                                          std::min<uint64_t>(uint64_t{t->max_cost} + c.below, Grammar::kInfinite)));
    if (std::find(merged.begin(), merged.end(), t.get()) != merged.end()) continue;
    merged.push_back(t.get());
    if (!t->accepted_bits.empty()) {
      for (size_t w = 0; w < words; ++w) out[w] |= t->accepted_bits[w];
    } else {
      for (int32_t id : t->accepted_ids) out[id >> 6] |= uint64_t{1} << (id & 63);
    }
    roots.insert(roots.end(), t->dependent.begin(), t->dependent.end());
    held.push_back(std::move(t));
  }
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  if (!m.fill_mask_subtrees(*vocab_, out, roots, &most)) {
    // The walk of the context-dependent tokens hit its work limit: the whole-trie walk (which
    // stops at the same limit, the mask smaller but never wrong).
    return m.fill_mask(*vocab_, out, Grammar::kInfinite, max_cost);
  }
  int64_t n = 0;
  for (size_t w = 0; w < words; ++w) n += std::popcount(out[w]);
  if (max_cost) *max_cost = most;
  return n;
}

CompiledConstraint::TopTokenStats CompiledConstraint::top_token_stats() const {
  std::lock_guard lock(top_mutex_);
  return {top_tokens_.size(), top_bytes_};
}

namespace {

struct ConstraintCache {
  std::mutex mutex;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledConstraint>>> lru;
  std::unordered_map<std::string, decltype(lru)::iterator> index;
  int64_t hits = 0, misses = 0;
};

ConstraintCache& constraint_cache() {
  static ConstraintCache c;
  return c;
}

}  // namespace

std::shared_ptr<const Vocabulary> vocabulary_for(const Tokenizer& tok) {
  std::vector<std::string> bytes(tok.vocab_size());
  std::vector<char> usable(tok.vocab_size(), 0);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    bytes[id] = std::string(tok.token_bytes(id));
    usable[id] = tok.is_special(id) ? 0 : 1;
  }
  return std::make_shared<const Vocabulary>(std::move(bytes), std::move(usable));
}

std::shared_ptr<const CompiledConstraint> compile_cached(const ConstraintSpec& spec,
                                                         std::shared_ptr<const Vocabulary> vocab) {
  const std::string key = fmt::format("{:016x}|", vocab->fingerprint()) + spec.key();
  ConstraintCache& c = constraint_cache();
  {
    std::lock_guard lock(c.mutex);
    if (auto it = c.index.find(key); it != c.index.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      ++c.hits;
      return it->second->second;
    }
    ++c.misses;
  }
  auto compiled =
      std::make_shared<const CompiledConstraint>(std::make_shared<const Grammar>(compile_spec(spec)), std::move(vocab));
  std::lock_guard lock(c.mutex);
  if (!c.index.contains(key)) {
    c.lru.emplace_front(key, compiled);
    c.index[key] = c.lru.begin();
    if (c.lru.size() > kConstraintCacheEntries) {
      c.index.erase(c.lru.back().first);
      c.lru.pop_back();
    }
  }
  return compiled;
}

ConstraintCacheStats constraint_cache_stats() {
  ConstraintCache& c = constraint_cache();
  std::lock_guard lock(c.mutex);
  return {c.hits, c.misses, c.lru.size()};
}

}  // namespace infera::constrain
