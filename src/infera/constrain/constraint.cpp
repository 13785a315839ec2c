#include "infera/constrain/constraint.h"

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
  const bool cacheable = budget >= Grammar::kInfinite;
  const uint64_t h = m.state_hash();
  if (cacheable) {
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(h); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      std::memcpy(out, it->second->second.mask.data(), words * sizeof(uint64_t));
      return it->second->second.count;
    }
  }
  const int64_t n = m.fill_mask(*vocab_, out, budget);
  if (cacheable) {
    std::lock_guard lock(mutex_);
    if (!index_.contains(h)) {
      lru_.emplace_front(h, Entry{std::vector<uint64_t>(out, out + words), n});
      index_[h] = lru_.begin();
      if (lru_.size() > kMaskCacheEntries) {
        index_.erase(lru_.back().first);
        lru_.pop_back();
      }
    }
  }
  return n;
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
