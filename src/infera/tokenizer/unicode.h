// UTF-8 helpers for the tokenizer: decoding/encoding code points, NFC normalization and
// case mapping (utf8proc),
// GPT-2's byte <-> printable-character mapping, and a streaming UTF-8 decoder that
// replaces invalid sequences with U+FFFD the way String::from_utf8_lossy and the WHATWG
// TextDecoder do (one U+FFFD per maximal invalid subpart).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace infera::unicode {

constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point starting at text[pos] and advances pos. Returns false (and
// advances pos by one byte) on an invalid or truncated sequence.
bool next_code_point(std::string_view text, size_t& pos, char32_t& cp);

void append_utf8(std::string& out, char32_t cp);

// Byte offset of the first invalid UTF-8 sequence, or npos when the text is valid.
size_t find_invalid_utf8(std::string_view text);

// Canonical composition (Unicode Normalization Form C), from utf8proc's Unicode data.
// Linear in the text up to a log factor, however long its runs of combining marks
// (utf8proc's own canonical ordering is quadratic in the run length). Invalid UTF-8 becomes
// U+FFFD.
std::string nfc(std::string_view text);

// Unicode's simple (one code point to one) case mapping, except that upper-casing "ß" gives
// "SS" as in Python and JavaScript; invalid UTF-8 passes through as is.
std::string to_upper(std::string_view text);
std::string to_lower(std::string_view text);

// The Unicode version of the normalization and case data.
const char* unicode_version();

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(char32_t cp);

// GPT-2's reversible mapping of the 256 byte values to printable characters, used by
// byte-level BPE vocabularies ("Ġ" is the space byte 0x20).
const std::array<char32_t, 256>& byte_to_unicode();
// The byte a mapped character stands for, or -1 when cp is not one of the 256.
int unicode_to_byte(char32_t cp);

// Turns a byte stream into valid UTF-8 text, holding back an incomplete sequence at the
// end until more bytes arrive.
class Utf8Stream {
 public:
  // Appends the text completed by these bytes to out.
  void push(std::string_view bytes, std::string& out);
  // Appends U+FFFD for a held-back incomplete sequence, if any.
  void flush(std::string& out);
  bool has_pending() const { return pending_size_ > 0; }

 private:
  void push_byte(uint8_t byte, std::string& out);
  std::array<uint8_t, 4> pending_{};
  int pending_size_ = 0;
  int expected_size_ = 0;
};

}  // namespace infera::unicode
