#include "infera/tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>

#include "infera/base/error.h"
#include "infera/tokenizer/tokenizer_impl.h"
#include "infera/tokenizer/unicode.h"

namespace infera {

namespace {

// Words longer than this are rare (long runs of one character) and not worth caching.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCachedWords = 1 << 16;

bool is_word_byte(char c) {
  const auto b = static_cast<uint8_t>(c);
  return b >= 0x80 || (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_';
}

// Length of the whitespace prefix of text (Unicode White_Space).
size_t leading_whitespace(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    char32_t cp;
    if (!unicode::next_code_point(text, next, cp) || !unicode::is_whitespace(cp)) break;
    pos = next;
  }
  return pos;
}

// Start of the whitespace suffix of text.
size_t trailing_whitespace_start(std::string_view text) {
  size_t pos = 0, start = 0;
  while (pos < text.size()) {
    char32_t cp;
    if (!unicode::next_code_point(text, pos, cp) || !unicode::is_whitespace(cp)) start = pos;
  }
  return start;
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(text, pos, hit - pos);
    out.append(to);
  }
  if (pos == 0) return;
  out.append(text, pos);
  text = std::move(out);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Encoding

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  // Added tokens are found first, leftmost-longest, and never reach the model; the text
  // between them is encoded separately.
  size_t gap_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie_first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t node = 0, found = -1;
    size_t found_end = 0;
    for (size_t j = pos; j < text.size(); ++j) {
      const auto byte = static_cast<uint8_t>(text[j]);
      const auto& children = trie[node].children;
      auto it = std::find_if(children.begin(), children.end(), [&](const auto& e) { return e.first == byte; });
      if (it == children.end()) break;
      node = it->second;
      if (trie[node].added_token >= 0) found = trie[node].added_token, found_end = j + 1;
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = added_tokens[found];
    if (token.single_word &&
        ((pos > 0 && is_word_byte(text[pos - 1])) || (found_end < text.size() && is_word_byte(text[found_end])))) {
      ++pos;
      continue;
    }
    size_t match_start = pos, match_end = found_end;
    if (token.lstrip) match_start = gap_start + trailing_whitespace_start(text.substr(gap_start, pos - gap_start));
    if (token.rstrip) match_end += leading_whitespace(text.substr(found_end));
    encode_segment(text.substr(gap_start, match_start - gap_start), gap_start == 0, out);
    out.push_back(token.id);
    gap_start = pos = match_end;
  }
  encode_segment(text.substr(gap_start), gap_start == 0, out);
}

void Tokenizer::Impl::encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const {
  if (segment.empty()) return;
  std::string text(segment);
  for (const NormalizerStep& step : normalizer) {
    switch (step.type) {
      case NormalizerStep::Type::kNfc: text = unicode::nfc(text); break;
      case NormalizerStep::Type::kPrepend:
        if (!text.empty()) text.insert(0, step.to);
        break;
      case NormalizerStep::Type::kReplace: replace_all(text, step.from, step.to); break;
    }
  }

  std::vector<std::string> words{std::move(text)};
  std::vector<std::string> next_words;
  std::vector<std::string_view> pieces;
  for (const PreTokenizerStep& step : pre_tokenizer) {
    next_words.clear();
    for (size_t w = 0; w < words.size(); ++w) {
      std::string& word = words[w];
      if (step.type == PreTokenizerStep::Type::kByteLevel && step.add_prefix_space && !word.starts_with(' ')) {
        word = " " + word;  // (not insert(0, ...): GCC 12 warns falsely there)
      }
      if (step.type == PreTokenizerStep::Type::kMetaspace) {
        replace_all(word, " ", step.replacement);
        const bool prepend = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                             (step.prepend == PreTokenizerStep::Prepend::kFirst && at_start && w == 0);
        if (prepend && !word.starts_with(step.replacement)) word.insert(0, step.replacement);
        if (!step.split) {
          next_words.push_back(std::move(word));
          continue;
        }
        // Split before each replacement character, which stays with the word after it.
        size_t start = 0;
        for (size_t hit = word.find(step.replacement, 1); hit != std::string::npos;
             hit = word.find(step.replacement, hit + step.replacement.size())) {
          if (hit > start) next_words.push_back(word.substr(start, hit - start));
          start = hit;
        }
        if (start < word.size()) next_words.push_back(word.substr(start));
        continue;
      }
      if (!step.regex) {
        next_words.push_back(std::move(word));
        continue;
      }
      pieces.clear();
      step.regex->split(word, step.keep_matches, pieces);
      for (std::string_view piece : pieces) next_words.emplace_back(piece);
    }
    words.swap(next_words);
  }
  for (const std::string& word : words) encode_word(word, out);
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (auto it = word_cache.find(word); it != word_cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }

  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  const auto push_unknown = [&] {
    if (unk_id < 0) return;  // no unk token: the character is dropped, as in HF
    if (fuse_unk && !symbols.empty() && symbols.back() == unk_id) return;
    symbols.push_back(unk_id);
  };
  if (byte_level) {
    if (ignore_merges) {
      std::string mapped;
      for (char c : word) unicode::append_utf8(mapped, unicode::byte_to_unicode()[static_cast<uint8_t>(c)]);
      if (auto it = model_vocab.find(mapped); it != model_vocab.end()) symbols.push_back(it->second);
    }
    if (symbols.empty()) {
      for (char c : word) {
        const int32_t id = byte_level_ids[static_cast<uint8_t>(c)];
        if (id >= 0)
          symbols.push_back(id);
        else
          push_unknown();
      }
    }
  } else {
    if (ignore_merges) {
      if (auto it = model_vocab.find(word); it != model_vocab.end()) symbols.push_back(it->second);
    }
    if (symbols.empty()) {
      for (size_t pos = 0; pos < word.size();) {
        const size_t start = pos;
        char32_t cp;
        unicode::next_code_point(word, pos, cp);
        const std::string_view character = word.substr(start, pos - start);
        if (auto it = model_vocab.find(character); it != model_vocab.end()) {
          symbols.push_back(it->second);
        } else if (byte_fallback) {
          for (char c : character) symbols.push_back(byte_fallback_ids[static_cast<uint8_t>(c)]);
        } else {
          push_unknown();
        }
      }
    }
  }
  bpe(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());

  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (word_cache.size() >= kMaxCachedWords) word_cache.clear();
    word_cache.emplace(std::string(word), std::move(symbols));
  }
}

// Applies merges to a word's symbols: always the lowest-ranked adjacent pair, leftmost on
// ties, the order Hugging Face tokenizers (and llama2.c's score order) use. A priority
// queue of candidate pairs with lazy invalidation keeps long words O(n log n).
void Tokenizer::Impl::bpe(std::vector<int32_t>& symbols) const {
  if (symbols.size() < 2 || merge_table.empty()) return;
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
  };
  struct Candidate {
    int32_t rank, left, right, left_id, right_id, merged_id;
    bool operator>(const Candidate& other) const { return rank != other.rank ? rank > other.rank : left > other.left; }
  };
  const auto n = static_cast<int32_t>(symbols.size());
  std::vector<Symbol> list(n);
  for (int32_t i = 0; i < n; ++i) list[i] = {symbols[i], i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    auto it = merge_table.find(merge_key(list[left].id, list[right].id));
    if (it != merge_table.end()) {
      queue.push({it->second.rank, left, right, list[left].id, list[right].id, it->second.merged_id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = list[c.left];
    // Stale: one side has merged since this pair was queued.
    if (left.id != c.left_id || left.next != c.right || list[c.right].id != c.right_id) continue;
    Symbol& right = list[c.right];
    left.id = c.merged_id;
    left.next = right.next;
    if (right.next >= 0) list[right.next].prev = c.left;
    right.id = -1;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
  symbols.clear();
  for (int32_t i = 0; i >= 0; i = list[i].next) symbols.push_back(list[i].id);
}

// ---------------------------------------------------------------------------------------
// Public API

Tokenizer Tokenizer::load(const std::string& dir) { return Tokenizer(load_tokenizer_impl(dir)); }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (size_t bad = unicode::find_invalid_utf8(text); bad != std::string_view::npos) {
    fail("cannot tokenize: the text is not valid UTF-8 (invalid byte 0x{:02X} at offset {})",
         static_cast<uint8_t>(text[bad]), bad);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), impl_->prefix_ids.begin(), impl_->prefix_ids.end());
  impl_->encode_text(text, ids);
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  IncrementalDecoder decoder(*this, skip_special_tokens);
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  text += decoder.flush();
  return text;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }
int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size()) return {};
  return impl_->id_to_piece[id];
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size()) return {};
  return impl_->decoded_bytes[id];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view piece) const {
  if (auto it = impl_->added_token_index.find(piece); it != impl_->added_token_index.end()) {
    return impl_->added_tokens[it->second].id;
  }
  if (auto it = impl_->model_vocab.find(piece); it != impl_->model_vocab.end()) return it->second;
  return std::nullopt;
}

int32_t Tokenizer::strip_leading_spaces() const { return impl_->strip_leading_spaces; }

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < impl_->vocab_size() && impl_->special[id] != 0; }

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
Tokenizer::Kind Tokenizer::kind() const { return impl_->kind; }
const std::vector<std::pair<std::string, std::string>>& Tokenizer::merges() const { return impl_->merges; }
std::string Tokenizer::pretokenizer_name() const { return impl_->pretokenizer_name; }

bool Tokenizer::add_bos() const {
  const auto& prefix = impl_->prefix_ids;
  return impl_->bos_id >= 0 && std::find(prefix.begin(), prefix.end(), impl_->bos_id) != prefix.end();
}

bool Tokenizer::add_eos() const {
  const auto& suffix = impl_->suffix_ids;
  return impl_->eos_id >= 0 && std::find(suffix.begin(), suffix.end(), impl_->eos_id) != suffix.end();
}

// ---------------------------------------------------------------------------------------
// Decoding

struct IncrementalDecoder::State {
  unicode::Utf8Stream utf8;
  bool skip_special_tokens;
  int spaces_to_strip;  // leading spaces of the whole output still to drop
};

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : impl_(tok.impl_),
      state_(std::make_unique<State>(State{{}, skip_special_tokens, tok.impl_->strip_leading_spaces})) {}
IncrementalDecoder::~IncrementalDecoder() = default;
IncrementalDecoder::IncrementalDecoder(IncrementalDecoder&&) noexcept = default;
IncrementalDecoder& IncrementalDecoder::operator=(IncrementalDecoder&&) noexcept = default;

std::string IncrementalDecoder::push(int32_t id) {
  if (id < 0 || id >= impl_->vocab_size()) {
    fail("cannot decode token id {}: the vocabulary has ids 0..{}", id, impl_->vocab_size() - 1);
  }
  if (state_->skip_special_tokens && impl_->special[id]) return {};
  std::string_view bytes = impl_->decoded_bytes[id];
  if (state_->spaces_to_strip > 0) {
    while (state_->spaces_to_strip > 0 && !bytes.empty() && bytes.front() == ' ') {
      bytes.remove_prefix(1);
      --state_->spaces_to_strip;
    }
    if (!bytes.empty()) state_->spaces_to_strip = 0;  // the output has begun
  }
  std::string text;
  state_->utf8.push(bytes, text);
  return text;
}

std::string IncrementalDecoder::flush() {
  std::string text;
  state_->utf8.flush(text);
  return text;
}

}  // namespace infera
