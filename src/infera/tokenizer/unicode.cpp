#include "infera/tokenizer/unicode.h"

#include <algorithm>
#include <vector>

namespace infera::unicode {

bool next_code_point(std::string_view text, size_t& pos, char32_t& cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) {
    cp = lead;
    ++pos;
    return true;
  }
  int size = 0;
  char32_t min_value = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    size = 2, cp = lead & 0x1F, min_value = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    size = 3, cp = lead & 0x0F, min_value = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    size = 4, cp = lead & 0x07, min_value = 0x10000;
  } else {
    ++pos;
    return false;
  }
  if (pos + size > text.size()) {
    ++pos;
    return false;
  }
  for (int i = 1; i < size; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return false;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not UTF-8.
  if (cp < min_value || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
    ++pos;
    return false;
  }
  pos += size;
  return true;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t find_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  char32_t cp;
  while (pos < text.size()) {
    const size_t start = pos;
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    if (!next_code_point(text, pos, cp)) return start;
  }
  return std::string_view::npos;
}

bool is_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// ---------------------------------------------------------------------------------------
// NFC (UAX #15): full canonical decomposition, canonical ordering, then composition.

namespace {

// Hangul syllables are composed from leading consonant (L), vowel (V) and optional
// trailing consonant (T) jamo arithmetically; the Unicode tables leave them out.
constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161,
                   kHangulTBase = 0x11A7;
constexpr int kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr int kHangulNCount = kHangulVCount * kHangulTCount;
constexpr int kHangulSCount = kHangulLCount * kHangulNCount;

uint32_t combining_class(char32_t cp) {
  using unicode_data::kCombiningClass;
  if (cp < 0x300) return 0;
  const auto* end = kCombiningClass + unicode_data::kCombiningClassSize;
  const auto* it = std::lower_bound(kCombiningClass, end, cp,
                                    [](const auto& e, char32_t c) { return e.code_point < c; });
  return it != end && it->code_point == cp ? it->combining_class : 0;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const int s = static_cast<int>(cp - kHangulSBase);
    out.push_back(kHangulLBase + s / kHangulNCount);
    out.push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  using unicode_data::kDecomposition;
  const auto* end = kDecomposition + unicode_data::kDecompositionSize;
  const auto* it = std::lower_bound(kDecomposition, end, cp,
                                    [](const auto& e, char32_t c) { return e.code_point < c; });
  if (it == end || it->code_point != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

// The primary composite of (first, second), or 0 when there is none.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount) {
    return kHangulSBase + ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) * kHangulTCount;
  }
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount &&
      (first - kHangulSBase) % kHangulTCount == 0 && second > kHangulTBase &&
      second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  using unicode_data::kComposition;
  const auto* end = kComposition + unicode_data::kCompositionSize;
  const auto* it = std::lower_bound(kComposition, end, std::pair{first, second},
                                    [](const auto& e, std::pair<char32_t, char32_t> key) {
                                      return e.first != key.first ? e.first < key.first : e.second < key.second;
                                    });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

}  // namespace

std::string nfc(std::string_view text) {
  // Below U+0300 there is nothing to reorder or compose onto, and every precomposed
  // character there is already in NFC: most text takes this exit.
  std::vector<char32_t> decomposed;
  decomposed.reserve(text.size());
  bool all_below_0300 = true;
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp;
    if (!next_code_point(text, pos, cp)) cp = kReplacementChar;
    if (cp >= 0x300) all_below_0300 = false;
    decompose(cp, decomposed);
  }
  if (all_below_0300) return std::string(text);

  // Canonical ordering: stable-sort each run of non-starters by combining class.
  for (size_t i = 1; i < decomposed.size(); ++i) {
    const uint32_t ccc = combining_class(decomposed[i]);
    if (ccc == 0) continue;
    size_t j = i;
    while (j > 0) {
      const uint32_t prev = combining_class(decomposed[j - 1]);
      if (prev == 0 || prev <= ccc) break;
      std::swap(decomposed[j - 1], decomposed[j]);
      --j;
    }
  }

  // Canonical composition: a character combines with the last starter unless a character
  // between them has a combining class of 0 or >= its own ("blocked").
  std::vector<char32_t> composed;
  composed.reserve(decomposed.size());
  long starter = -1;
  uint32_t last_class = 0;
  for (char32_t cp : decomposed) {
    const uint32_t ccc = combining_class(cp);
    if (starter >= 0) {
      const bool adjacent = static_cast<size_t>(starter) + 1 == composed.size();
      if (adjacent || (last_class != 0 && last_class < ccc)) {
        if (char32_t c = compose(composed[starter], cp)) {
          composed[starter] = c;
          continue;
        }
      }
    }
    if (ccc == 0) starter = static_cast<long>(composed.size());
    last_class = ccc;
    composed.push_back(cp);
  }
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : composed) append_utf8(out, cp);
  return out;
}

// ---------------------------------------------------------------------------------------

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    int next_unprintable = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_unprintable++);
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    const auto& forward = byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[forward[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// ---------------------------------------------------------------------------------------

void Utf8Stream::push(std::string_view bytes, std::string& out) {
  for (char c : bytes) push_byte(static_cast<uint8_t>(c), out);
}

void Utf8Stream::flush(std::string& out) {
  if (pending_size_ > 0) append_utf8(out, kReplacementChar);
  pending_size_ = 0;
}

void Utf8Stream::push_byte(uint8_t byte, std::string& out) {
  if (pending_size_ == 0) {
    if (byte < 0x80) {
      out += static_cast<char>(byte);
    } else if (byte >= 0xC2 && byte <= 0xF4) {
      pending_[0] = byte;
      pending_size_ = 1;
      expected_size_ = byte <= 0xDF ? 2 : byte <= 0xEF ? 3 : 4;
    } else {
      append_utf8(out, kReplacementChar);  // a stray continuation byte or an invalid lead
    }
    return;
  }
  // The second byte's range depends on the lead: it rules out overlong forms (E0, F0),
  // surrogates (ED) and code points past U+10FFFF (F4).
  uint8_t low = 0x80, high = 0xBF;
  if (pending_size_ == 1) {
    const uint8_t lead = pending_[0];
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  }
  if (byte < low || byte > high) {
    // The held-back bytes are a maximal invalid subpart: one U+FFFD, then this byte
    // starts afresh.
    append_utf8(out, kReplacementChar);
    pending_size_ = 0;
    push_byte(byte, out);
    return;
  }
  pending_[pending_size_++] = byte;
  if (pending_size_ == expected_size_) {
    out.append(reinterpret_cast<const char*>(pending_.data()), pending_size_);
    pending_size_ = 0;
  }
}

}  // namespace infera::unicode
