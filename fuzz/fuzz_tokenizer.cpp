// The tokenizer: encode (NFC, added tokens, Qwen2's split regex, byte-level BPE), decode,
// the incremental decoder, and the Unicode helpers, over any bytes. The tokenizer is a
// small byte-level one written at start-up; FUZZ_TOKENIZER_DIR picks a real one instead.
#include <cstdlib>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "infera/base/error.h"
#include "infera/tokenizer/tokenizer.h"
#include "infera/tokenizer/unicode.h"

namespace {

using nlohmann::json;

const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

std::string write_small_tokenizer() {
  json vocab = json::object();
  std::vector<std::string> byte_pieces;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    infera::unicode::append_utf8(s, infera::unicode::byte_to_unicode()[b]);
    vocab[s] = b;
    byte_pieces.push_back(s);
  }
  json merges = json::array();
  int next = 256;
  for (const auto& [l, r] : std::vector<std::pair<std::string, std::string>>{
           {"\u0120", "t"}, {"h", "e"}, {"\u0120t", "he"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\u00c3", "\u00a9"}}) {
    vocab[l + r] = next++;
    merges.push_back(json::array({l, r}));
  }
  auto added = [](int id, const char* content, bool special, bool strip) {
    return json{{"id", id}, {"content", content}, {"special", special}, {"lstrip", strip}, {"rstrip", strip}};
  };
  json tok = {
      {"added_tokens", json::array({added(300, "<|im_start|>", true, false), added(301, "<|im_end|>", true, false),
                                    added(302, "[SEP]", false, true)})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"}},
                                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  const std::filesystem::path dir = infera::fuzz::scratch_dir() / "tokenizer";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  std::ofstream(dir / "tokenizer_config.json") << json{{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}}.dump();
  return dir.string();
}

std::unique_ptr<infera::Tokenizer> g_tok;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("FUZZ_TOKENIZER_DIR");
  g_tok = std::make_unique<infera::Tokenizer>(infera::Tokenizer::load(dir ? dir : write_small_tokenizer()));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = infera::fuzz::as_text(data, size);
  (void)infera::unicode::nfc(text);
  (void)infera::unicode::to_upper(text);
  (void)infera::unicode::to_lower(text);
  if (infera::unicode::find_invalid_utf8(text) != std::string_view::npos) {
    try {
      (void)g_tok->encode(text);
    } catch (const infera::Error&) {
    }
    return 0;
  }
  const std::vector<int32_t> ids = g_tok->encode(text, size % 2 == 0);
  const std::string back = g_tok->decode(ids, false);
  infera::IncrementalDecoder dec(*g_tok, false);
  std::string streamed;
  for (int32_t id : ids) streamed += dec.push(id);
  streamed += dec.flush();
  if (streamed != back) __builtin_trap();  // the decoder's promise (tokenizer.h)
  // Any ids: those outside the vocabulary are an error, never a crash.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < size; i += 2) raw.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)) % 400 - 20);
  try {
    (void)g_tok->decode(raw, size % 3 == 0);
  } catch (const infera::Error&) {
  }
  return 0;
}
