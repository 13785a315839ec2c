// A constraint compiled for one vocabulary, and the process-wide cache of them (LRU keyed
// by the constraint's kind, options and text and by the vocabulary's fingerprint).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
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
  // How masks are computed (both on by default; benchmarks turn them off to compare).
  struct MaskOptions {
    bool token_sets = true;  // off: every mask is the whole-trie walk (Matcher::fill_mask)
    bool budget_from_cache = true;  // off: a mask with a budget is never taken from the cache
  };
  CompiledConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab)
      : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {}
  CompiledConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab,
                     MaskOptions options)
      : grammar_(std::move(grammar)), vocab_(std::move(vocab)), options_(options) {}
  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }

  // The mask of the matcher's state. Masks are cached by the state's structural hash
  // (computed without a budget; one serves a budget when every token it allows leaves a
  // completion that fits). Returns the number of allowed tokens.
  int64_t mask(Matcher& m, uint64_t* out, uint32_t budget = Grammar::kInfinite) const;
  // The mask without a budget, bypassing the mask cache: the union of the context-independent
  // token sets of the state's tops (computed once per grammar position and kept) and the
  // context-dependent tokens checked against the whole state; a position whose sets could
  // not be computed (limits) falls back to the whole-trie walk. `max_cost` (optional): the
  // most bytes that complete the output after an allowed token, or an upper bound of it.
  int64_t compute_mask(Matcher& m, uint64_t* out, uint32_t* max_cost = nullptr) const;

  struct TopTokenStats {
    size_t chains = 0;  // stack top chains whose sets are kept
    size_t bytes = 0;
  };
  TopTokenStats top_token_stats() const;

  static constexpr size_t kMaskCacheEntries = 64;
  // Grammar elements a chain's canonical text (Grammar::local_signature) may span for its
  // token sets to be shared with other constraints (kept process-wide, per vocabulary).
  static constexpr size_t kSharedSignatureElements = 4096;
  // Chains remembered as met once (past it, every chain's sets are computed when first met).
  static constexpr size_t kMaxSeenChains = size_t{1} << 16;
  // States with more stacks are masked by the whole-trie walk.
  static constexpr size_t kMaxTokenSetTops = 64;
  // Memory for the kept context-independent token sets of one constraint; past it, sets are
  // computed for one mask and dropped.
  static constexpr size_t kTopTokenBytes = size_t{8} << 20;

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  MaskOptions options_;
  std::shared_ptr<const TopTokens> top_tokens(Matcher& m, std::span<const uint32_t> positions) const;

  struct Entry {
    std::vector<uint64_t> mask;
    int64_t count;
    uint32_t max_cost;
  };
  mutable std::mutex mutex_;
  mutable std::list<std::pair<uint64_t, Entry>> lru_;  // most recent first
  mutable std::unordered_map<uint64_t, std::list<std::pair<uint64_t, Entry>>::iterator> index_;
  mutable std::mutex top_mutex_;
  // By the chain's positions (their bytes).
  mutable std::unordered_map<std::string, std::shared_ptr<const TopTokens>> top_tokens_;
  mutable size_t top_bytes_ = 0;
  mutable std::unordered_set<std::string> seen_chains_;  // met once, sets not computed yet
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

// Context-independent token sets shared between constraints: grammar positions whose
// canonical text (Grammar::local_signature) is the same for the same vocabulary have the
// same sets (JSON strings, numbers, literals of every schema), so they are computed once
// per process. LRU bounded by bytes.
inline constexpr size_t kSharedTopTokenBytes = size_t{64} << 20;
struct TopTokenCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  size_t entries = 0;
  size_t bytes = 0;
};
TopTokenCacheStats top_token_cache_stats();
inline constexpr size_t kConstraintCacheEntries = 64;

}  // namespace infera::constrain
