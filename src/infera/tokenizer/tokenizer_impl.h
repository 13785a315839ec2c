// Internal representation of a loaded tokenizer (shared by tokenizer_load.cpp, which
// fills it from tokenizer.json, and tokenizer.cpp, which encodes and decodes with it).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "infera/tokenizer/regex.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera {

// Hash and equality that let unordered_map<std::string, ...> be queried with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringToId = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;  // absorb whitespace on the left into the token
  bool rstrip = false;  // absorb whitespace on the right
  bool single_word = false;  // match only when not inside a word
};

struct NormalizerStep {
  enum class Type { kNfc, kPrepend, kReplace };
  Type type;
  std::string from;  // kReplace: the literal to replace
  std::string to;  // kPrepend: the prefix; kReplace: the replacement
};

struct PreTokenizerStep {
  enum class Type { kSplit, kByteLevel, kMetaspace };
  enum class Prepend { kAlways, kFirst, kNever };
  Type type;
  std::unique_ptr<Regex> regex;  // kSplit; kByteLevel with use_regex (GPT-2's pattern)
  bool keep_matches = true;  // kSplit: behaviour Isolated (true) or Removed (false)
  bool add_prefix_space = false;  // kByteLevel
  std::string replacement;  // kMetaspace: "▁"
  Prepend prepend = Prepend::kAlways;  // kMetaspace
  bool split = false;  // kMetaspace: split before each replacement character
};

// The BPE merge (left id, right id) -> merged id with its priority (lower merges first).
struct MergeTarget {
  int32_t rank;
  int32_t merged_id;
};
inline uint64_t merge_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Tokenizer::Impl {
  Kind kind = Kind::kByteLevelBpe;

  // --- model (BPE) ---
  StringToId model_vocab;  // piece -> id, the BPE model's own vocabulary
  std::vector<std::string> id_to_piece;  // [vocab_size] raw pieces, added tokens included
  std::unordered_map<uint64_t, MergeTarget> merge_table;
  std::vector<std::pair<std::string, std::string>> merges;  // in priority order
  bool byte_level = false;  // pieces are GPT-2 byte-mapped strings
  bool byte_fallback = false;  // unknown characters become <0xNN> tokens
  bool ignore_merges = false;  // a word that is itself a piece is emitted whole
  bool fuse_unk = false;
  int32_t unk_id = -1;
  std::array<int32_t, 256> byte_level_ids{};  // byte -> id of its GPT-2 character (-1 if absent)
  std::array<int32_t, 256> byte_fallback_ids{};  // byte -> id of <0xNN> (-1 if absent)

  // --- pipeline before the model ---
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;

  // --- added tokens, matched in the raw text by a byte trie ---
  std::vector<AddedToken> added_tokens;
  StringToId added_token_index;  // content -> index into added_tokens
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node index
    int32_t added_token = -1;  // index into added_tokens ending here
  };
  std::vector<TrieNode> trie;  // node 0 is the root
  std::array<bool, 256> trie_first_byte{};

  // --- post-processing and special tokens ---
  std::vector<int32_t> prefix_ids;  // added before the text when add_special_tokens
  std::vector<int32_t> suffix_ids;  // added after it
  std::vector<uint8_t> special;  // [vocab_size] 1 for special added tokens
  int32_t bos_id = -1;
  int32_t eos_id = -1;

  // --- decoder ---
  std::vector<std::string> decoded_bytes;  // [vocab_size] what each id decodes to
  int strip_leading_spaces = 0;  // drop up to this many spaces at the start of the output

  std::string chat_template;
  std::string pretokenizer_name = "default";

  // Word cache: pre-token bytes -> ids. Guarded because encode() is const and may run on
  // several threads.
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> word_cache;

  int32_t vocab_size() const { return static_cast<int32_t>(id_to_piece.size()); }

  // tokenizer.cpp
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void bpe(std::vector<int32_t>& symbols) const;
};

// tokenizer_load.cpp: from a Hugging Face directory, or from a GGUF file's metadata
// (tokenizer_gguf.cpp) when `dir` names one.
std::shared_ptr<Tokenizer::Impl> load_tokenizer_impl(const std::string& dir);
std::shared_ptr<Tokenizer::Impl> load_gguf_tokenizer_impl(const std::string& path);
// The byte trie over impl.added_tokens (trie, trie_first_byte).
void build_added_token_trie(Tokenizer::Impl& impl);

// Fills impl.byte_level_ids (GPT-2 byte characters) and impl.byte_fallback_ids (<0xNN>
// pieces) from the vocabulary; false when some of the 256 <0xNN> tokens are missing.
bool find_byte_token_ids(Tokenizer::Impl& impl);

}  // namespace infera
