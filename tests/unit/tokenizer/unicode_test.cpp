#include "infera/tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace infera::unicode {
namespace {

std::string stream_all(std::string_view bytes) {
  Utf8Stream stream;
  std::string out;
  stream.push(bytes, out);
  stream.flush(out);
  return out;
}

TEST(Nfc, ComposesBaseAndCombiningMark) {
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfc("cafe\u0301 ok"), "caf\u00e9 ok");
  EXPECT_EQ(nfc("A\u030a"), "\u00c5");
}

TEST(Nfc, LeavesComposedAndAsciiTextAlone) {
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("\u00e9\u00e8 \u4f60\u597d \U0001F600"), "\u00e9\u00e8 \u4f60\u597d \U0001F600");
  EXPECT_EQ(nfc(""), "");
}

TEST(Nfc, SingletonsMapToTheirCanonicalCharacter) {
  EXPECT_EQ(nfc("\u212b"), "\u00c5");  // ANGSTROM SIGN
  EXPECT_EQ(nfc("\u2126"), "\u03a9");  // OHM SIGN
}

TEST(Nfc, ReordersMarksByCombiningClassBeforeComposing) {
  // a + diaeresis (ccc 230) + dot below (ccc 220): dot below sorts first and composes.
  EXPECT_EQ(nfc("a\u0308\u0323"), "\u1ea1\u0308");
  // o + diaeresis + acute: the diaeresis composes, the acute is blocked by nothing but has
  // no composite with o-diaeresis.
  EXPECT_EQ(nfc("o\u0308\u0301"), "\u00f6\u0301");
}

TEST(Nfc, CompositionExclusionsStayDecomposed) {
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093c");  // DEVANAGARI LETTER QA
}

TEST(Nfc, ComposesHangulJamo) {
  EXPECT_EQ(nfc("\u1100\u1161"), "\uac00");  // L + V
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");  // L + V + T
  EXPECT_EQ(nfc("\uac00\u11a8"), "\uac01");  // LV + T
}

TEST(Utf8, FindsInvalidSequences) {
  EXPECT_EQ(find_invalid_utf8("ok \u00e9 \U0001F600"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("a\xe4\xbd"), 1u);  // truncated
  EXPECT_EQ(find_invalid_utf8("\xc0\xaf"), 0u);  // overlong
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0u);  // surrogate
}

TEST(Utf8Stream, HoldsBackIncompleteSequences) {
  Utf8Stream stream;
  std::string out;
  stream.push("a\xe4", out);
  EXPECT_EQ(out, "a");
  EXPECT_TRUE(stream.has_pending());
  stream.push("\xbd", out);
  EXPECT_EQ(out, "a");
  stream.push("\xa0", out);
  EXPECT_EQ(out, "a\u4f60");
  EXPECT_FALSE(stream.has_pending());
}

TEST(Utf8Stream, ReplacesEachMaximalInvalidSubpartOnce) {
  EXPECT_EQ(stream_all("\xff"), "\ufffd");
  EXPECT_EQ(stream_all("\xe4\xbd"), "\ufffd");  // truncated at the end
  EXPECT_EQ(stream_all("\xe4\xbdx"), "\ufffdx");  // broken by an ASCII byte
  EXPECT_EQ(stream_all("\xe4\xe4\xbd\xa0"), "\ufffd\u4f60");  // a lead restarts
  EXPECT_EQ(stream_all("\x80\x80"), "\ufffd\ufffd");  // stray continuation bytes
  EXPECT_EQ(stream_all("\xed\xa0\x80"), "\ufffd\ufffd\ufffd");  // surrogate: each byte
}

TEST(ByteToUnicode, IsAReversibleMappingOntoPrintableCharacters) {
  const auto& table = byte_to_unicode();
  EXPECT_EQ(table[' '], U'\u0120');  // "Ġ"
  EXPECT_EQ(table['\n'], U'\u010a');  // "Ċ"
  EXPECT_EQ(table['A'], U'A');
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(table[b]), b);
  EXPECT_EQ(unicode_to_byte(U' '), -1);
}

// A long run of combining marks of alternating classes: the insertion sort over the run
// was quadratic (a 4 MB prompt cost hours); the stable sort is not, and the result is NFC.
TEST(Nfc, LongRunsOfCombiningMarksAreReorderedInLinearithmicTime) {
  const size_t n = 500'000;
  std::string text = "a";
  for (size_t i = 0; i < n; ++i) text += (i % 2 == 0) ? "\u0301" : "\u0316";  // classes 230, 220
  std::string expected = "\u00e1";  // a + the first acute compose (the 220s before it do not block it)
  for (size_t i = 0; i < n / 2; ++i) expected += "\u0316";
  for (size_t i = 1; i < n / 2; ++i) expected += "\u0301";
  EXPECT_EQ(nfc(text), expected);
}

TEST(CaseMapping, CoversAllOfUnicodesSimpleMappings) {
  EXPECT_EQ(to_upper("abc \u00e9\u00ff \u03b1\u03c9 \u0434 \u0561"), "ABC \u00c9\u0178 \u0391\u03a9 \u0414 \u0531");
  EXPECT_EQ(to_lower("ABC \u00c9\u0178 \u0391\u03a9 \u0414 \u0531 \u10a0"),
            "abc \u00e9\u00ff \u03b1\u03c9 \u0434 \u0561 \u2d00");
  EXPECT_EQ(to_upper("stra\u00dfe \u1e9e"), "STRASSE \u1e9e");  // as Python and JavaScript
  EXPECT_EQ(to_lower("\u1e9e"), "\u00df");
  EXPECT_EQ(to_upper(std::string("a\xff") + "b"), std::string("A\xff") + "B");  // invalid bytes pass through
}

}  // namespace
}  // namespace infera::unicode
