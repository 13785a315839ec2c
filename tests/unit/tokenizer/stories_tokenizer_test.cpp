// The SentencePiece-style BPE path on the stories260K fixture (byte fallback, "▁"
// normalizer, Strip decoder), checked against llama2.c's encoder as documented in
// shared/models/README.md and GOLDEN.md.
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/tokenizer/tokenizer.h"
#include "infera/tokenizer/unicode.h"

namespace infera {
namespace {

const std::string kStoriesDir = test::stories_dir();

const Tokenizer& stories() {
  static const Tokenizer tok = Tokenizer::load(kStoriesDir);
  return tok;
}

using Ids = std::vector<int32_t>;

TEST(StoriesTokenizer, Metadata) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  const Tokenizer& tok = stories();
  EXPECT_EQ(tok.kind(), Tokenizer::Kind::kSentencePieceBpe);
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_FALSE(tok.add_eos());
  EXPECT_EQ(tok.merges().size(), 165u);
  EXPECT_EQ(tok.merges()[0], (std::pair<std::string, std::string>{"\u2581", "t"}));
  EXPECT_EQ(tok.pretokenizer_name(), "default");
  EXPECT_EQ(tok.token_text(13), "<0x0A>");
  EXPECT_EQ(tok.token_text(410), "\u2581");
  EXPECT_EQ(tok.token_to_id("<s>"), 1);
  EXPECT_EQ(tok.token_to_id("no such piece"), std::nullopt);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(13));
  EXPECT_EQ(tok.chat_template(), "");
}

TEST(StoriesTokenizer, EncodesLikeLlama2c) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  const Tokenizer& tok = stories();
  EXPECT_EQ(tok.encode("Once upon a time"), (Ids{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.encode(""), (Ids{1}));
  EXPECT_EQ(tok.encode("", false), (Ids{}));
  EXPECT_EQ(tok.encode("Once upon a time", false), (Ids{403, 407, 261, 378}));
  // Characters outside the vocabulary fall back to their UTF-8 bytes (id = byte + 3).
  EXPECT_EQ(tok.encode("\u4f60", false), (Ids{410, 0xE4 + 3, 0xBD + 3, 0xA0 + 3}));
  // Special-token text is the special token.
  EXPECT_EQ(tok.encode("<s>", false), (Ids{1}));
}

TEST(StoriesTokenizer, EncodesAndDecodesTheGoldenText) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  std::ifstream in(kStoriesDir + "/GOLDEN.md");
  ASSERT_TRUE(in) << kStoriesDir << "/GOLDEN.md";
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string golden = buffer.str();
  std::smatch ids_match, text_match;
  ASSERT_TRUE(std::regex_search(golden, ids_match, std::regex("```\n([0-9 ]+)\n```")));
  ASSERT_TRUE(std::regex_search(golden, text_match, std::regex("```text\n([^`]*)\n```")));
  Ids ids{1};
  std::istringstream id_stream(ids_match[1].str());
  for (int32_t id; id_stream >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 61u);
  const std::string text = text_match[1].str();

  EXPECT_EQ(stories().encode(text), ids);  // llama2.c's encode() gives exactly these ids
  EXPECT_EQ(stories().decode(ids), text);
}

TEST(StoriesTokenizer, DecodeStripsTheSpaceAfterBosAndSkipsSpecials) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  const Tokenizer& tok = stories();
  EXPECT_EQ(tok.decode(Ids{1, 403, 407}), "Once upon");
  EXPECT_EQ(tok.decode(Ids{1, 403, 407}, false), "<s> Once upon");
  EXPECT_EQ(tok.decode(Ids{403, 13, 407}), "Once\n upon");
  EXPECT_EQ(tok.decode(Ids{}), "");
}

const std::vector<std::string> kRoundTripTexts = {
    "Once upon a time, there was a little girl named Lily.",
    "  two leading spaces and two trailing  ",
    "tabs\tand\nnewlines\n\n",
    "caf\u00e9 na\u00efve \u00e9t\u00e9",
    "\u4f60\u597d\uff0c\u4e16\u754c",
    "\U0001F600 emoji \U0001F468\u200D\U0001F469\u200D\U0001F467",
    "curly \u201cquotes\u201d and \u2019apostrophes\u2019 \u2014 dash",
    "numbers 12345 and symbols #$%^&*()",
    "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd",
    "x",
    "",
};

TEST(StoriesTokenizer, RoundTripsAssortedText) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  for (const std::string& text : kRoundTripTexts) {
    EXPECT_EQ(stories().decode(stories().encode(text)), text) << text;
    EXPECT_EQ(stories().decode(stories().encode(text, false)), text) << text;
  }
}

// Feeds every prefix of ids through an IncrementalDecoder and checks that no output is a
// partial UTF-8 sequence and that the outputs concatenate to decode(prefix).
void expect_incremental_matches(const Tokenizer& tok, const Ids& ids, bool skip_special) {
  for (size_t length = 0; length <= ids.size(); ++length) {
    IncrementalDecoder decoder(tok, skip_special);
    std::string streamed;
    for (size_t i = 0; i < length; ++i) {
      const std::string piece = decoder.push(ids[i]);
      EXPECT_EQ(unicode::find_invalid_utf8(piece), std::string_view::npos) << "partial UTF-8 after id " << i;
      streamed += piece;
    }
    streamed += decoder.flush();
    const Ids prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_EQ(streamed, tok.decode(prefix, skip_special)) << "prefix of " << length << " ids";
  }
}

TEST(StoriesTokenizer, IncrementalDecoderEqualsFullDecodeOnEveryPrefix) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  for (const std::string& text : kRoundTripTexts) {
    const Ids ids = stories().encode(text);
    expect_incremental_matches(stories(), ids, true);
    expect_incremental_matches(stories(), ids, false);
  }
}

TEST(StoriesTokenizer, IncrementalDecoderHoldsBackSplitCharacters) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  // "你" is three byte tokens: nothing may come out until the last one arrives.
  IncrementalDecoder decoder(stories());
  EXPECT_EQ(decoder.push(1), "");
  EXPECT_EQ(decoder.push(0xE4 + 3), "");
  EXPECT_EQ(decoder.push(0xBD + 3), "");
  EXPECT_EQ(decoder.push(0xA0 + 3), "\u4f60");
  EXPECT_EQ(decoder.push(403), " Once");
  EXPECT_EQ(decoder.flush(), "");
}

TEST(StoriesTokenizer, InvalidByteSequencesDecodeToReplacementCharacters) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  const Tokenizer& tok = stories();
  const Ids truncated{0xE4 + 3, 0xBD + 3};
  EXPECT_EQ(tok.decode(truncated), "\ufffd");
  const Ids broken{0xE4 + 3, 403, 0xFF + 3, 0x80 + 3};
  EXPECT_EQ(tok.decode(broken), "\ufffd Once\ufffd\ufffd");
  expect_incremental_matches(tok, broken, true);
  IncrementalDecoder decoder(tok);
  EXPECT_EQ(decoder.push(0xE4 + 3), "");
  EXPECT_EQ(decoder.flush(), "\ufffd");
}

TEST(StoriesTokenizer, RejectsBadInput) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  EXPECT_THROW(stories().encode("bad \xff utf-8"), Error);
  EXPECT_THROW(stories().decode(Ids{512}), Error);
  EXPECT_THROW(stories().decode(Ids{-1}), Error);
  IncrementalDecoder decoder(stories());
  EXPECT_THROW(decoder.push(100000), Error);
}

TEST(StoriesTokenizer, EncodesLongRepetitiveTextQuickly) {
  INFERA_REQUIRE_FIXTURE(kStoriesDir);
  // One 40000-character word with 20000 merges exercises the merge queue (quadratic
  // rescans would take seconds); the result must still round-trip.
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "he";
  const Ids ids = stories().encode(text, false);
  EXPECT_LE(ids.size(), text.size() / 2 + 1);
  EXPECT_EQ(stories().decode(ids), text);
}

}  // namespace
}  // namespace infera
