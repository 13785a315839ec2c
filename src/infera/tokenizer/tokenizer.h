// Tokenizer loaded from a Hugging Face tokenizer directory (tokenizer.json plus
// tokenizer_config.json; special_tokens_map.json optional).
//
// Supported models: BPE only, in two flavours
//   - byte-level BPE (GPT-2 byte mapping; Qwen2/Qwen3, Llama 3): a regex pre-tokenizer
//     (Split{Regex} and/or ByteLevel{use_regex}) run with PCRE2, optional NFC normalizer,
//     ignore_merges;
//   - SentencePiece-style BPE (Llama 2 family): normalizer Prepend/Replace "▁" or a
//     Metaspace pre-tokenizer, byte_fallback to <0xNN> tokens.
// Added tokens (special or not) are matched in the raw text before normalization and
// never split. Encoding and decoding are const and safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace infera {

class Tokenizer {
 public:
  enum class Kind { kByteLevelBpe, kSentencePieceBpe };

  // Reads dir/tokenizer.json, dir/tokenizer_config.json and, when present,
  // dir/special_tokens_map.json. Throws infera::Error naming the file and the problem.
  static Tokenizer load(const std::string& dir);
  // Whether `path` is a GGUF file, whose tokenizer load() reads from its metadata
  // (gguf::is_gguf_file: a *.gguf file, or any file with the GGUF magic).
  static bool is_gguf(const std::string& path);

  // add_special_tokens adds BOS/EOS as tokenizer_config.json's add_bos_token /
  // add_eos_token say, or else as tokenizer.json's post_processor template says.
  // Special-token text in the input (e.g. "<|im_start|>") becomes that token.
  // Throws infera::Error when text is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Invalid UTF-8 produced by byte tokens comes out as U+FFFD. Throws infera::Error on an
  // id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when none
  int32_t eos_id() const;  // -1 when none
  std::string_view token_text(int32_t id) const;  // the raw vocab piece ("" for an unused id)
  // The bytes one token decodes to on its own (may be part of a UTF-8 sequence; "" for an
  // id outside the vocabulary). Log-probability responses report them per token.
  std::string_view token_bytes(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view piece) const;
  bool is_special(int32_t id) const;
  // Leading spaces decode() drops from the start of an output (SentencePiece "▁" prefixes).
  int32_t strip_leading_spaces() const;
  // tokenizer_config.json's chat_template (of a list of named templates, "default"), else
  // the content of chat_template.jinja or chat_template.json beside it; "" if none.
  const std::string& chat_template() const;

  // For GGUF export: the model kind and the raw vocabulary data.
  Kind kind() const;
  const std::vector<std::pair<std::string, std::string>>& merges() const;  // in priority order
  // Best guess of llama.cpp's tokenizer.ggml.pre: "qwen2", "llama-bpe", "gpt-2", "default".
  std::string pretokenizer_name() const;
  bool add_bos() const;
  bool add_eos() const;

  struct Impl;  // defined in tokenizer_impl.h

 private:
  friend class IncrementalDecoder;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after load (but for a locked word cache); copies share it
};

// Streaming detokenizer: push() returns only complete UTF-8 text, never a partial
// multi-byte sequence, and the concatenation of all push() results plus flush() equals
// tokenizer.decode(all ids, skip_special_tokens).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens = true);
  ~IncrementalDecoder();
  IncrementalDecoder(IncrementalDecoder&&) noexcept;
  IncrementalDecoder& operator=(IncrementalDecoder&&) noexcept;

  std::string push(int32_t id);  // the newly completed text (may be empty)
  std::string flush();  // whatever remains (an incomplete sequence as U+FFFD)

 private:
  struct State;
  std::shared_ptr<const Tokenizer::Impl> impl_;
  std::unique_ptr<State> state_;
};

}  // namespace infera
