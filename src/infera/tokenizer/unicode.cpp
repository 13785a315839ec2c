#include "infera/tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include <utf8proc.h>

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
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---------------------------------------------------------------------------------------
// NFC (UAX #15): full canonical decomposition, canonical ordering, then composition. The
// decomposition and composition are utf8proc's; the ordering is a stable sort of each run
// of non-starters by combining class (O(n log n)), because utf8proc orders with a gnome
// sort whose cost grows with the square of a run's length (a 4 MB run of alternating
// combining classes would take hours).

namespace {

uint8_t combining_class(char32_t cp) {
  return cp < 0x300 ? 0
                    : static_cast<uint8_t>(utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class);
}

}  // namespace

std::string nfc(std::string_view text) {
  // Below U+0300 there is nothing to reorder or compose onto, and every precomposed
  // character there is already in NFC: most text takes this exit.
  std::vector<utf8proc_int32_t> cps;
  cps.reserve(text.size());
  bool all_below_0300 = true;
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp;
    if (!next_code_point(text, pos, cp)) cp = kReplacementChar;
    if (cp >= 0x300) all_below_0300 = false;
    cps.push_back(static_cast<utf8proc_int32_t>(cp));
  }
  if (all_below_0300) return std::string(text);

  std::vector<utf8proc_int32_t> decomposed;
  decomposed.reserve(cps.size() + cps.size() / 4);
  for (utf8proc_int32_t cp : cps) {
    utf8proc_int32_t buf[32];  // canonical decompositions are at most 4 code points long
    int boundclass = 0;
    const utf8proc_ssize_t n = utf8proc_decompose_char(cp, buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
    if (n < 0 || n > 32) {
      decomposed.push_back(cp);  // not reached for valid code points
    } else {
      decomposed.insert(decomposed.end(), buf, buf + n);
    }
  }

  // Canonical ordering: stable-sort each run of non-starters by combining class.
  std::vector<std::pair<uint8_t, utf8proc_int32_t>> run;
  for (size_t i = 0; i < decomposed.size();) {
    if (combining_class(static_cast<char32_t>(decomposed[i])) == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    run.clear();
    for (; end < decomposed.size(); ++end) {
      const uint8_t ccc = combining_class(static_cast<char32_t>(decomposed[end]));
      if (ccc == 0) break;
      run.emplace_back(ccc, decomposed[end]);
    }
    if (run.size() > 1) {
      std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t k = 0; k < run.size(); ++k) decomposed[i + k] = run[k].second;
    }
    i = end;
  }

  // Canonical composition (linear: each character looks back at the last starter only).
  const utf8proc_ssize_t length =
      utf8proc_normalize_utf32(decomposed.data(), static_cast<utf8proc_ssize_t>(decomposed.size()),
                               static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
  std::string out;
  out.reserve(text.size());
  for (utf8proc_ssize_t i = 0; i < length; ++i) append_utf8(out, static_cast<char32_t>(decomposed[i]));
  return out;
}

namespace {

std::string map_case(std::string_view text, bool upper) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    char32_t cp = 0;
    if (!next_code_point(text, pos, cp)) {
      out.append(text.substr(start, pos - start));
    } else if (upper && cp == 0xDF) {
      // utf8proc maps "ß" to "ẞ" (U+1E9E); Python and JavaScript (the chat templates'
      // reference) give "SS", the one multi-character mapping templates meet in practice.
      out += "SS";
    } else {
      const auto c = static_cast<utf8proc_int32_t>(cp);
      append_utf8(out, static_cast<char32_t>(upper ? utf8proc_toupper(c) : utf8proc_tolower(c)));
    }
  }
  return out;
}

}  // namespace

std::string to_upper(std::string_view text) { return map_case(text, true); }
std::string to_lower(std::string_view text) { return map_case(text, false); }
const char* unicode_version() { return utf8proc_unicode_version(); }

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
