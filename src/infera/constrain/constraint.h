// A constraint compiled for one vocabulary, and the process-wide cache of them (LRU keyed
// by the constraint's kind, options and text and by the vocabulary's fingerprint).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "infera/constrain/compile.h"
#include "infera/constrain/matcher.h"

namespace infera {
class Tokenizer;
}

namespace infera::constrain {

// What a request asks for, in canonical text form (the cache key).
struct ConstraintSpec {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar, kToolCalls };
  Kind kind = Kind::kJsonObject;
  // kJsonSchema: the schema; kToolCalls: [{"name", "parameters"}...]; kChoice: the list.
  // Keys in the client's order (a schema's properties are written in declared order).
  nlohmann::ordered_json json;
  std::string text;  // kRegex, kGrammar
  JsonSchemaOptions schema_options;
  ToolCallOptions tool_options;
  std::string key() const;
};

// Compiles a spec (no vocabulary needed). Throws ConstraintError.
Grammar compile_spec(const ConstraintSpec& spec);

class CompiledConstraint {
 public:
  CompiledConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab)
      : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {}
  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }

  // The mask of the matcher's state (cached by its structural hash; an unbounded budget
  // only). Returns the number of allowed tokens.
  int64_t mask(Matcher& m, uint64_t* out, uint32_t budget = Grammar::kInfinite) const;

  static constexpr size_t kMaskCacheEntries = 64;

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  struct Entry {
    std::vector<uint64_t> mask;
    int64_t count;
  };
  mutable std::mutex mutex_;
  mutable std::list<std::pair<uint64_t, Entry>> lru_;  // most recent first
  mutable std::unordered_map<uint64_t, std::list<std::pair<uint64_t, Entry>>::iterator> index_;
};

// The vocabulary of a tokenizer (its decoded token bytes; special tokens unusable), built
// once per tokenizer and shared.
std::shared_ptr<const Vocabulary> vocabulary_for(const Tokenizer& tokenizer);

// Compiles (or finds in the cache) `spec` for `vocab`. Throws ConstraintError.
std::shared_ptr<const CompiledConstraint> compile_cached(const ConstraintSpec& spec,
                                                         std::shared_ptr<const Vocabulary> vocab);

struct ConstraintCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  size_t entries = 0;
};
ConstraintCacheStats constraint_cache_stats();
inline constexpr size_t kConstraintCacheEntries = 64;

}  // namespace infera::constrain
