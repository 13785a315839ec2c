// A compiled PCRE2 pattern (UTF + Unicode properties) for pre-tokenizer splits.
// tokenizer.json regexes are Oniguruma syntax; the ones BPE tokenizers use ((?i:...),
// \p{L}, \p{N}, lookahead (?!\S)) mean the same in PCRE2.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_context_8;

namespace infera {

class Regex {
 public:
  // literal: match the pattern text as is (a Split{String} pattern). Throws infera::Error
  // with PCRE2's message and the offset of the problem.
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends to out the matches of the pattern in text and the non-empty gaps between
  // them, in order (HF Split behaviour "Isolated"); with keep_matches false only the gaps
  // (behaviour "Removed"). text must be valid UTF-8.
  void split(std::string_view text, bool keep_matches, std::vector<std::string_view>& out) const;

  const std::string& pattern() const { return pattern_; }

  // A pattern from a model file can backtrack without end on some inputs: a match stops at
  // kMatchLimit steps, kDepthLimit nested backtracking points or kHeapLimitKib of
  // backtracking memory, and split() throws infera::Error instead of hanging.
  static constexpr uint32_t kMatchLimit = 10'000'000;
  static constexpr uint32_t kDepthLimit = 1'000'000;
  static constexpr uint32_t kHeapLimitKib = 64 * 1024;

 private:
  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;  // the limits
  bool jit_ = false;
};

}  // namespace infera
