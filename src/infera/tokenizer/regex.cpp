#include "infera/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "infera/base/error.h"

namespace infera {

namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}
}  // namespace

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error_code,
                        &error_offset, nullptr);
  if (code_ == nullptr) {
    fail("cannot compile pre-tokenizer regex '{}': {} at offset {}", pattern, pcre2_message(error_code), error_offset);
  }
  // JIT makes matching several times faster; without it (e.g. unsupported CPU) the
  // interpreter still gives the same results.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  context_ = pcre2_match_context_create(nullptr);
  if (context_ == nullptr) fail("cannot allocate a PCRE2 match context");
  pcre2_set_match_limit(context_, kMatchLimit);
  pcre2_set_depth_limit(context_, kDepthLimit);
  pcre2_set_heap_limit(context_, kHeapLimitKib);
}

Regex::~Regex() {
  pcre2_match_context_free(context_);
  pcre2_code_free(code_);
}

void Regex::split(std::string_view text, bool keep_matches, std::vector<std::string_view>& out) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0;
  size_t search_from = 0;
  while (search_from <= text.size()) {
    int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, match.get(), context_)
                  : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
      rc = pcre2_match(code_, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match.get(),
                       context_);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("pre-tokenizer regex '{}' failed on the input: {}", pattern_, pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {
      // An empty match splits nothing; step over one whole UTF-8 character.
      search_from = begin + 1;
      while (search_from < text.size() && (static_cast<uint8_t>(text[search_from]) & 0xC0) == 0x80) ++search_from;
      continue;
    }
    if (begin > gap_start) out.push_back(text.substr(gap_start, begin - gap_start));
    if (keep_matches) out.push_back(text.substr(begin, end - begin));
    gap_start = search_from = end;
  }
  if (gap_start < text.size()) out.push_back(text.substr(gap_start));
}

}  // namespace infera
