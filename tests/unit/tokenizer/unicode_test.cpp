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
  EXPECT_EQ(nfc("\u1100\u1161"), "\uac00");            // L + V
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");      // L + V + T
  EXPECT_EQ(nfc("\uac00\u11a8"), "\uac01");            // LV + T
}

TEST(Utf8, FindsInvalidSequences) {
  EXPECT_EQ(find_invalid_utf8("ok \u00e9 \U0001F600"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("a\xe4\xbd"), 1u);        // truncated
  EXPECT_EQ(find_invalid_utf8("\xc0\xaf"), 0u);         // overlong
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0u);     // surrogate
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
  EXPECT_EQ(stream_all("\xe4\xbd"), "\ufffd");              // truncated at the end
  EXPECT_EQ(stream_all("\xe4\xbdx"), "\ufffdx");            // broken by an ASCII byte
  EXPECT_EQ(stream_all("\xe4\xe4\xbd\xa0"), "\ufffd\u4f60");  // a lead restarts
  EXPECT_EQ(stream_all("\x80\x80"), "\ufffd\ufffd");        // stray continuation bytes
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

}  // namespace
}  // namespace infera::unicode
