#include "infera/runtime/engine_config.h"
#include "infera/base/ascii.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <string_view>

#include "infera/base/error.h"

namespace infera {

int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

int64_t parse_memory_size(const std::string& text, const std::string& what) {
  auto bad = [&]() -> int64_t {
    fail("{}: cannot read '{}' as a memory size; write e.g. 2GiB, 512MB, 1073741824 or 30%", what, text);
  };
  std::string_view s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return bad();
  const std::string number(s.substr(0, i));
  if (number.find('.') != number.rfind('.')) return bad();
  double value = 0;
  try {
    value = std::stod(number);
  } catch (...) {
    return bad();
  }
  std::string unit;
  for (char c : s.substr(i)) {
    if (!std::isspace(static_cast<unsigned char>(c))) unit += ascii_lower(c);
  }
  double bytes = 0;
  if (unit == "%") {
    if (value <= 0 || value > 100) fail("{}: '{}' must be a percentage in (0, 100]", what, text);
    const int64_t phys = physical_memory_bytes();
    if (phys <= 0)
      fail("{}: cannot read the physical memory size for '{}'; give bytes instead (e.g. 4GiB)", what, text);
    bytes = static_cast<double>(phys) * value / 100.0;
  } else {
    double mult = 0;
    if (unit.empty() || unit == "b")
      mult = 1;
    else if (unit == "kb")
      mult = 1e3;
    else if (unit == "mb")
      mult = 1e6;
    else if (unit == "gb")
      mult = 1e9;
    else if (unit == "tb")
      mult = 1e12;
    else if (unit == "k" || unit == "kib")
      mult = 1024.0;
    else if (unit == "m" || unit == "mib")
      mult = 1024.0 * 1024;
    else if (unit == "g" || unit == "gib")
      mult = 1024.0 * 1024 * 1024;
    else if (unit == "t" || unit == "tib")
      mult = 1024.0 * 1024 * 1024 * 1024;
    else
      return bad();
    bytes = value * mult;
  }
  if (!(bytes >= 1) || bytes > 9.0e18) fail("{}: '{}' is out of range (at least 1 byte)", what, text);
  return static_cast<int64_t>(std::llround(bytes));
}

const char* speculative_method_name(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNone: return "none";
    case SpeculativeMethod::kNgram: return "ngram";
    case SpeculativeMethod::kMtp: return "mtp";
    case SpeculativeMethod::kCustom: return "custom";
  }
  return "unknown";
}

SpeculativeMethod parse_speculative_method(const std::string& text, const std::string& what) {
  if (text == "none" || text.empty()) return SpeculativeMethod::kNone;
  if (text == "ngram") return SpeculativeMethod::kNgram;
  if (text == "mtp") return SpeculativeMethod::kMtp;
  fail("{}: '{}' is not a speculative decoding method; use none, ngram or mtp", what, text);
}

int32_t SpeculativeConfig::draft_tokens() const {
  if (method == SpeculativeMethod::kNone) return 0;
  if (num_draft_tokens > 0) return num_draft_tokens;
  return method == SpeculativeMethod::kMtp ? 1 : 4;
}

void validate_engine_config(const EngineConfig& c) {
  if (c.kv_cache_bytes <= 0) fail("engine config: kv_cache_bytes must be positive (set --kv-cache-memory)");
  if (c.block_size <= 0 || c.block_size > 1024) fail("engine config: block_size {} must be in [1, 1024]", c.block_size);
  if (c.max_batch_tokens <= 0) fail("engine config: max_batch_tokens must be positive");
  if (c.max_num_seqs <= 0) fail("engine config: max_num_seqs must be positive");
  if (c.max_num_seqs > c.max_batch_tokens) {
    fail(
        "engine config: max_num_seqs ({}) cannot exceed max_batch_tokens ({}): every running sequence needs a "
        "token slot per step",
        c.max_num_seqs, c.max_batch_tokens);
  }
  if (c.prefill_chunk <= 0) fail("engine config: prefill_chunk must be positive");
  if (c.prefix_checkpoint_interval < 0) {
    fail("engine config: prefix_checkpoint_interval {} must be >= 0 (0: none)", c.prefix_checkpoint_interval);
  }
  if (c.max_context < 0) fail("engine config: max_context must be >= 0 (0: the model's limit)");
  if (c.threads < 0 || c.threads > 1024)
    fail("engine config: threads {} must be in [0, 1024] (0: the process-wide count)", c.threads);
  const SpeculativeConfig& s = c.speculative;
  if (s.num_draft_tokens < 0 || s.num_draft_tokens > SpeculativeConfig::kMaxDraftTokens) {
    fail("engine config: speculative num_draft_tokens {} must be in [0, {}] (0: the method's default)",
         s.num_draft_tokens, SpeculativeConfig::kMaxDraftTokens);
  }
  if (s.ngram_min < 1 || s.ngram_max < s.ngram_min || s.ngram_max > 64) {
    fail("engine config: speculative n-gram lengths [{}, {}] must satisfy 1 <= ngram_min <= ngram_max <= 64",
         s.ngram_min, s.ngram_max);
  }
  if (s.method == SpeculativeMethod::kCustom && !s.drafter) {
    fail("engine config: speculative method custom needs a drafter function");
  }
  if (!(s.acceptance_threshold >= 0.0f && s.acceptance_threshold <= 1.0f)) {
    fail("engine config: speculative acceptance_threshold {} must be in [0, 1] (0: off, exact sampling)",
         s.acceptance_threshold);
  }
}

}  // namespace infera
