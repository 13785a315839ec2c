// The byte-level BPE path on a small tokenizer.json written by the test (GPT-2 byte
// mapping, Qwen2's split regex, NFC, added tokens, a BOS/EOS template), and the errors
// that bad tokenizer directories give.
#include <atomic>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "infera/base/error.h"
#include "infera/tokenizer/regex.h"
#include "infera/tokenizer/tokenizer.h"
#include "infera/tokenizer/unicode.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<int32_t>;

const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// A scratch directory removed at the end of the test.
class TempDir : public test::TempDir {
 public:
  TempDir() : test::TempDir("infera_tokenizer_test") {}
  std::string str() const { return path().string(); }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(path() / name, std::ios::binary) << content;
  }
};

std::string byte_char(uint8_t b) {
  std::string s;
  unicode::append_utf8(s, unicode::byte_to_unicode()[b]);
  return s;
}

// Ids 0..255 are the byte characters (id == byte value), then the merged pieces.
json byte_level_tokenizer(bool ignore_merges, bool nfc) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<uint8_t>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {{"\u0120", "t"},     {"h", "e"},   {"\u0120t", "he"},
                                                                   {"l", "l"},          {"he", "ll"}, {"hell", "o"},
                                                                   {"\u00c3", "\u00a9"}};
  json merge_list = json::array();
  int next_id = 256;
  for (const auto& [left, right] : merges) {
    vocab[left + right] = next_id++;  // 256 Ġt, 257 he, 258 Ġthe, 259 ll, 260 hell, 261 hello, 262 é
    merge_list.push_back(json::array({left, right}));
  }
  vocab["xyz"] = next_id++;  // 263: a piece no merge produces
  const auto added = [](int id, const char* content, bool special, bool strip) {
    return json{{"id", id},        {"content", content},   {"special", special}, {"lstrip", strip},
                {"rstrip", strip}, {"single_word", false}, {"normalized", false}};
  };
  json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", json::array({added(300, "<|start|>", true, false), added(301, "<|end|>", true, false),
                                    added(302, "[SEP]", false, true)})},
      {"normalizer", nfc ? json{{"type", "NFC"}} : json()},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|start|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}}})},
        {"special_tokens",
         {{"<|start|>", {{"id", "<|start|>"}, {"ids", {300}}, {"tokens", {"<|start|>"}}}},
          {"<|end|>", {{"id", "<|end|>"}, {"ids", {301}}, {"tokens", {"<|end|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"ignore_merges", ignore_merges},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
  return tokenizer;
}

json byte_level_config() {
  return {{"bos_token", "<|start|>"},
          {"eos_token", {{"content", "<|end|>"}, {"special", true}}},
          {"chat_template",
           json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}})}};
}

Tokenizer load_fixture(const TempDir& dir, bool ignore_merges = false, bool nfc = true) {
  dir.write("tokenizer.json", byte_level_tokenizer(ignore_merges, nfc).dump());
  dir.write("tokenizer_config.json", byte_level_config().dump());
  return Tokenizer::load(dir.str());
}

TEST(ByteLevelTokenizer, Metadata) {
  TempDir dir;
  const Tokenizer tok = load_fixture(dir);
  EXPECT_EQ(tok.kind(), Tokenizer::Kind::kByteLevelBpe);
  EXPECT_EQ(tok.vocab_size(), 303);
  EXPECT_EQ(tok.bos_id(), 300);
  EXPECT_EQ(tok.eos_id(), 301);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.add_eos());
  EXPECT_EQ(tok.chat_template(), "D");
  EXPECT_EQ(tok.pretokenizer_name(), "qwen2");
  ASSERT_EQ(tok.merges().size(), 7u);
  EXPECT_EQ(tok.merges()[2], (std::pair<std::string, std::string>{"\u0120t", "he"}));
  EXPECT_EQ(tok.token_to_id("\u0120the"), 258);
  EXPECT_EQ(tok.token_text(258), "\u0120the");
  EXPECT_EQ(tok.token_text(280), "");  // an unused id
  EXPECT_TRUE(tok.is_special(300));
  EXPECT_FALSE(tok.is_special(302));
  EXPECT_FALSE(tok.is_special(5));
}

TEST(ByteLevelTokenizer, AppliesMergesByRankWithinRegexSplits) {
  TempDir dir;
  const Tokenizer tok = load_fixture(dir);
  // "the" and " hello" are separate pre-tokens; " the" merges Ġt first, then Ġt+he.
  EXPECT_EQ(tok.encode("the hello", false), (Ids{'t', 257, ' ', 261}));
  EXPECT_EQ(tok.encode(" the", false), (Ids{258}));
  EXPECT_EQ(tok.encode("the hello"), (Ids{300, 't', 257, ' ', 261, 301}));
  EXPECT_EQ(tok.encode("", true), (Ids{300, 301}));
  EXPECT_EQ(tok.encode("\n\n  x", false), (Ids{'\n', '\n', ' ', ' ', 'x'}));
}

TEST(ByteLevelTokenizer, NormalizesToNfcWhenAsked) {
  TempDir with_nfc, without_nfc;
  EXPECT_EQ(load_fixture(with_nfc, false, true).encode("e\u0301", false), (Ids{262}));
  EXPECT_EQ(load_fixture(without_nfc, false, false).encode("e\u0301", false), (Ids{'e', 0xCC, 0x81}));
}

TEST(ByteLevelTokenizer, IgnoreMergesEmitsWholeVocabularyWords) {
  TempDir with, without;
  EXPECT_EQ(load_fixture(with, true).encode("xyz", false), (Ids{263}));
  EXPECT_EQ(load_fixture(without, false).encode("xyz", false), (Ids{'x', 'y', 'z'}));
}

TEST(ByteLevelTokenizer, SplitsOutAddedTokensHonouringStrip) {
  TempDir dir;
  const Tokenizer tok = load_fixture(dir);
  EXPECT_EQ(tok.encode("<|start|>x<|end|>", false), (Ids{300, 'x', 301}));
  // [SEP] has lstrip and rstrip: the spaces around it belong to it.
  EXPECT_EQ(tok.encode("a  [SEP]  b", false), (Ids{'a', 302, 'b'}));
  // Near misses stay text.
  EXPECT_EQ(tok.encode("<|sta", false), (Ids{'<', '|', 's', 't', 'a'}));
}

TEST(ByteLevelTokenizer, DecodesBytesAndAddedTokens) {
  TempDir dir;
  const Tokenizer tok = load_fixture(dir);
  const Ids ids{300, 't', 257, ' ', 261, 302, 262, 301};
  EXPECT_EQ(tok.decode(ids), "the hello[SEP]\u00e9");
  EXPECT_EQ(tok.decode(ids, false), "<|start|>the hello[SEP]\u00e9<|end|>");
  // A character split over two byte tokens comes out whole, and only once complete.
  IncrementalDecoder decoder(tok);
  EXPECT_EQ(decoder.push(0xC3), "");
  EXPECT_EQ(decoder.push(0xA9), "\u00e9");
  EXPECT_EQ(decoder.push(0xC3), "");
  EXPECT_EQ(decoder.flush(), "\ufffd");
}

TEST(ByteLevelTokenizer, RoundTripsText) {
  TempDir dir;
  const Tokenizer tok = load_fixture(dir);
  for (const std::string text :
       {"the hello world", "  spaces\t\ttabs\n\nnewlines  ", "caf\u00e9 \u4f60\u597d \U0001F600",
        "<|start|>chat<|end|>", "x = f(1, 2); // done", ""}) {
    EXPECT_EQ(tok.decode(tok.encode(text, false), false), text) << text;
  }
}

// ---------------------------------------------------------------------------------------
// Errors

std::string load_error(const std::string& dir) {
  try {
    Tokenizer::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerErrors, MissingDirectoryOrFile) {
  EXPECT_NE(load_error("/nonexistent/tokenizer/dir").find("does not exist"), std::string::npos);
  TempDir dir;
  const std::string message = load_error(dir.str());
  EXPECT_NE(message.find("tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find("not found"), std::string::npos) << message;
}

TEST(TokenizerErrors, MalformedJson) {
  TempDir dir;
  dir.write("tokenizer.json", "{\"model\": {\"type\": \"BPE\",");
  const std::string message = load_error(dir.str());
  EXPECT_NE(message.find("tokenizer.json: malformed JSON"), std::string::npos) << message;
  dir.write("tokenizer.json", byte_level_tokenizer(false, true).dump());
  dir.write("tokenizer_config.json", "not json");
  const std::string config_message = load_error(dir.str());
  EXPECT_NE(config_message.find("tokenizer_config.json: malformed JSON"), std::string::npos) << config_message;
}

TEST(TokenizerErrors, UnsupportedModelAndComponents) {
  TempDir dir;
  json tokenizer = byte_level_tokenizer(false, true);
  tokenizer["model"]["type"] = "Unigram";
  dir.write("tokenizer.json", tokenizer.dump());
  std::string message = load_error(dir.str());
  EXPECT_NE(message.find("unsupported model type 'Unigram'"), std::string::npos) << message;

  tokenizer = byte_level_tokenizer(false, true);
  tokenizer["normalizer"] = {{"type", "NFKC"}};
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("unsupported normalizer"), std::string::npos) << message;
  EXPECT_NE(message.find("NFKC"), std::string::npos) << message;

  tokenizer = byte_level_tokenizer(false, true);
  tokenizer["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("regex"), std::string::npos) << message;
}

TEST(TokenizerErrors, InconsistentVocabulary) {
  TempDir dir;
  json tokenizer = byte_level_tokenizer(false, true);
  tokenizer["model"]["merges"].push_back(json::array({"q", "nope"}));
  dir.write("tokenizer.json", tokenizer.dump());
  std::string message = load_error(dir.str());
  EXPECT_NE(message.find("merge \"q nope\""), std::string::npos) << message;

  tokenizer = byte_level_tokenizer(false, true);
  tokenizer["model"]["vocab"]["bad"] = "seven";
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("model.vocab[\"bad\"]"), std::string::npos) << message;

  tokenizer = byte_level_tokenizer(false, true);
  tokenizer.erase("model");
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("missing the \"model\""), std::string::npos) << message;
}

TEST(ByteLevelTokenizer, ReadsChatTemplateFileWhenConfigHasNone) {
  TempDir dir;
  dir.write("tokenizer.json", byte_level_tokenizer(false, true).dump());
  dir.write("tokenizer_config.json", json{{"bos_token", "<|start|>"}}.dump());
  dir.write("chat_template.jinja", "{{ messages }}\n");
  EXPECT_EQ(Tokenizer::load(dir.str()).chat_template(), "{{ messages }}\n");
}

TEST(TokenizerErrors, ConfigIsOptional) {
  TempDir dir;
  dir.write("tokenizer.json", byte_level_tokenizer(false, true).dump());
  const Tokenizer tok = Tokenizer::load(dir.str());
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.chat_template(), "");
  EXPECT_EQ(tok.encode("x"), (Ids{300, 'x', 301}));  // the post_processor template still applies
}

// Model files are checked like requests: what a malformed or hostile tokenizer.json holds
// is an infera::Error naming the file, never a crash, a hang or gigabytes of tables.
TEST(TokenizerErrors, HostileFilesAreBounded) {
  TempDir dir;
  dir.write("tokenizer_config.json", byte_level_config().dump());
  // A few ids near 2^30 would size every per-id table at gigabytes.
  json tokenizer = byte_level_tokenizer(false, true);
  tokenizer["model"]["vocab"]["far"] = (1 << 30) - 1;
  dir.write("tokenizer.json", tokenizer.dump());
  std::string message = load_error(dir.str());
  EXPECT_NE(message.find("is far past"), std::string::npos) << message;
  tokenizer = byte_level_tokenizer(false, true);
  tokenizer["added_tokens"].push_back({{"id", (1 << 30) - 1}, {"content", "<far>"}, {"special", true}});
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("is far past"), std::string::npos) << message;

  // Sequences nested without end.
  tokenizer = byte_level_tokenizer(false, true);
  json seq = {{"type", "NFC"}};
  for (int i = 0; i < 100; ++i) seq = {{"type", "Sequence"}, {"normalizers", json::array({seq})}};
  tokenizer["normalizer"] = seq;
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("nested deeper"), std::string::npos) << message;

  // JSON nested a million levels deep (the parser would build it, then dump() and the
  // destructor would recurse through it).
  dir.write("tokenizer.json", "{\"model\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}");
  message = load_error(dir.str());
  EXPECT_NE(message.find("nested deeper"), std::string::npos) << message;

  // A post_processor special token id outside the vocabulary.
  tokenizer = byte_level_tokenizer(false, true);
  tokenizer["post_processor"]["special_tokens"]["<|start|>"]["ids"] = {123456};
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("not in the vocabulary"), std::string::npos) << message;

  // A huge error value is shown as an excerpt.
  tokenizer = byte_level_tokenizer(false, true);
  tokenizer["decoder"] = {{"type", "Mystery"}, {"payload", std::string(10'000'000, 'x')}};
  dir.write("tokenizer.json", tokenizer.dump());
  message = load_error(dir.str());
  EXPECT_NE(message.find("unsupported decoder"), std::string::npos) << message.substr(0, 300);
  EXPECT_LT(message.size(), 1000u);
}

// "<0xZZ>" looks like a byte-fallback piece but is not hex: it decodes as the text it is
// (std::stoi threw std::invalid_argument out of Tokenizer::load).
TEST(TokenizerErrors, ByteFallbackLookalikePiecesAreText) {
  TempDir dir;
  dir.write("tokenizer_config.json", byte_level_config().dump());
  json tokenizer = byte_level_tokenizer(false, true);
  tokenizer["model"]["vocab"]["<0xZZ>"] = 264;
  tokenizer["decoder"] = {{"type", "Sequence"},
                          {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}};
  dir.write("tokenizer.json", tokenizer.dump());
  const Tokenizer tok = Tokenizer::load(dir.str());
  const std::vector<int32_t> ids = {264};
  EXPECT_EQ(tok.decode(ids), "<0xZZ>");
}

// A pre-tokenizer regex that backtracks exponentially stops at PCRE2's match limit with an
// error instead of hanging every request.
TEST(TokenizerErrors, CatastrophicRegexStopsAtTheMatchLimit) {
  Regex r("(a+)+$");
  std::vector<std::string_view> out;
  const std::string text = std::string(64, 'a') + "b";
  EXPECT_THROW(r.split(text, true, out), Error);
}

}  // namespace
}  // namespace infera
