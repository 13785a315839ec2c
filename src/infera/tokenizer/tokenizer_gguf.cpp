// A Tokenizer::Impl from a GGUF file's tokenizer.* metadata, tokenizing as llama.cpp does:
//   tokenizer.ggml.model "gpt2":  byte-level BPE with tokenizer.ggml.merges, the
//     pre-tokenizer regexes named by tokenizer.ggml.pre;
//   tokenizer.ggml.model "llama": SentencePiece BPE, merges by piece score (the adjacent
//     pair whose concatenation is the highest-scoring piece merges first, leftmost on
//     ties), "▁" for spaces with one prepended to each stretch of text, <0xNN> byte fallback.
// Token types: CONTROL and USER_DEFINED tokens are matched in the input text as whole
// tokens (CONTROL and UNKNOWN ones are special: skipped when decoding with
// skip_special_tokens); BYTE tokens are the <0xNN> pieces.
#include <algorithm>
#include <map>
#include <optional>

#include "infera/base/error.h"
#include "infera/io/gguf.h"
#include "infera/tokenizer/tokenizer_impl.h"
#include "infera/tokenizer/unicode.h"

namespace infera {

namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // "▁" U+2581

// llama.cpp's token types (tokenizer.ggml.token_type).
enum TokenType : int64_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

// The pre-tokenizer regexes llama.cpp applies for a tokenizer.ggml.pre name, in order (each
// splits the pieces the previous one produced, keeping matches and gaps).
struct PreTokenizer {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a pre-token that is itself a piece is emitted whole
  bool add_bos = false;  // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
};

constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen35 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::optional<PreTokenizer> pre_tokenizer_for(const std::string& name) {
  if (name == "llama3" || name == "llama-v3" || name == "llama-bpe" || name == "falcon3" || name == "pixtral") {
    return PreTokenizer{{kLlama3}, true, true};
  }
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokenizer{{kQwen2}, false, false};
  if (name == "qwen35") return PreTokenizer{{kQwen35}, false, false};
  if (name == "gpt-2" || name == "phi-2") return PreTokenizer{{kGpt2}, false, false};
  if (name == "default") {
    return PreTokenizer{{"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false};
  }
  return std::nullopt;
}

class GgufTokenizerLoader {
 public:
  // A split GGUF keeps its metadata in the first part.
  GgufTokenizerLoader(const std::string& path, Tokenizer::Impl& impl)
      : path_(path), impl_(impl), reader_(gguf::split_paths(path).front()) {}

  void load() {
    const std::string model = string("tokenizer.ggml.model");
    if (model.empty()) fail("{}: GGUF has no tokenizer (tokenizer.ggml.model is missing)", path_);
    if (model != "gpt2" && model != "llama") {
      fail("{}: tokenizer.ggml.model '{}' is not supported (supported: gpt2, llama)", path_, model);
    }
    spm_ = model == "llama";
    const gguf::Value& tokens = get("tokenizer.ggml.tokens");
    const std::vector<std::string>& pieces = tokens.str_array();
    if (pieces.empty()) fail("{}: tokenizer.ggml.tokens is empty", path_);
    const auto n = static_cast<int64_t>(pieces.size());
    std::vector<int64_t> types(static_cast<size_t>(n), kNormal);
    if (const gguf::Value* t = reader_.find("tokenizer.ggml.token_type")) {
      types = t->i64_array();
      if (static_cast<int64_t>(types.size()) != n)
        fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", path_, types.size(), n);
    }
    impl_.id_to_piece = pieces;
    impl_.special.assign(static_cast<size_t>(n), 0);
    impl_.model_vocab.reserve(static_cast<size_t>(n));
    for (int64_t id = 0; id < n; ++id) {
      impl_.model_vocab.emplace(pieces[id], static_cast<int32_t>(id));  // the first id of a duplicated piece wins
      const int64_t type = types[id];
      if (type == kControl || type == kUserDefined || type == kUnknown) {
        if (pieces[id].empty()) continue;
        AddedToken a;
        a.id = static_cast<int32_t>(id);
        a.content = pieces[id];
        a.special = type != kUserDefined;
        impl_.special[id] = a.special ? 1 : 0;
        if (impl_.added_token_index.count(a.content)) continue;
        impl_.added_token_index.emplace(a.content, static_cast<int32_t>(impl_.added_tokens.size()));
        impl_.added_tokens.push_back(std::move(a));
      }
    }
    impl_.bos_id = id_key("tokenizer.ggml.bos_token_id", n);
    impl_.eos_id = id_key("tokenizer.ggml.eos_token_id", n);
    impl_.unk_id = id_key("tokenizer.ggml.unknown_token_id", n);
    bool add_bos = spm_;
    if (spm_) {
      load_spm(pieces, types);
    } else {
      add_bos = load_bpe(pieces);
    }
    if (const gguf::Value* v = reader_.find("tokenizer.ggml.add_bos_token")) add_bos = v->to_bool();
    bool add_eos = false;
    if (const gguf::Value* v = reader_.find("tokenizer.ggml.add_eos_token")) add_eos = v->to_bool();
    if (add_bos && impl_.bos_id >= 0) impl_.prefix_ids = {impl_.bos_id};
    if (add_eos && impl_.eos_id >= 0) impl_.suffix_ids = {impl_.eos_id};
    impl_.chat_template = string("tokenizer.chat_template");
    finish(types);
  }

 private:
  const gguf::Value& get(const char* key) const { return reader_.get(key); }
  std::string string(const char* key) const {
    const gguf::Value* v = reader_.find(key);
    if (!v) return {};
    if (v->type() != gguf::ValueType::kString) fail("{}: {} must be a string, is {}", path_, key, v->describe());
    return v->str();
  }
  int32_t id_key(const char* key, int64_t n) const {
    const gguf::Value* v = reader_.find(key);
    if (!v) return -1;
    const int64_t id = v->to_i64();
    if (id < 0 || id >= n) {
      // llama.cpp tolerates ids past the vocabulary (it drops them); so does Infera.
      return -1;
    }
    return static_cast<int32_t>(id);
  }

  // SentencePiece BPE: the merge table from the scores. Every piece that splits into two
  // pieces is a merge of them, ranked by its score (higher first; equal scores rank equal,
  // so the leftmost pair merges first, as in llama.cpp).
  void load_spm(const std::vector<std::string>& pieces, const std::vector<int64_t>& types) {
    const gguf::Value* s = reader_.find("tokenizer.ggml.scores");
    std::vector<double> scores = s ? s->f64_array() : std::vector<double>(pieces.size(), 0.0);
    if (scores.size() != pieces.size())
      fail("{}: tokenizer.ggml.scores has {} entries for {} tokens", path_, scores.size(), pieces.size());
    std::vector<double> distinct(scores);
    std::sort(distinct.begin(), distinct.end(), std::greater<>());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    const auto rank_of = [&](double score) {
      return static_cast<int32_t>(std::lower_bound(distinct.begin(), distinct.end(), score, std::greater<>()) -
                                  distinct.begin());
    };
    for (size_t id = 0; id < pieces.size(); ++id) {
      if (types[id] == kByte) continue;
      const std::string& p = pieces[id];
      for (size_t cut = 0; cut < p.size();) {
        char32_t cp;
        if (!unicode::next_code_point(p, cut, cp)) break;
        if (cut >= p.size()) break;
        const auto left = impl_.model_vocab.find(std::string_view(p).substr(0, cut));
        const auto right = impl_.model_vocab.find(std::string_view(p).substr(cut));
        if (left == impl_.model_vocab.end() || right == impl_.model_vocab.end()) continue;
        impl_.merge_table.emplace(merge_key(left->second, right->second),
                                  MergeTarget{rank_of(scores[id]), static_cast<int32_t>(id)});
      }
    }
    impl_.byte_fallback = true;
    bool space_prefix = true;
    if (const gguf::Value* v = reader_.find("tokenizer.ggml.add_space_prefix")) space_prefix = v->to_bool();
    if (space_prefix) impl_.normalizer.push_back({NormalizerStep::Type::kPrepend, "", std::string(kMetaspace)});
    impl_.normalizer.push_back({NormalizerStep::Type::kReplace, " ", std::string(kMetaspace)});
    impl_.strip_leading_spaces = space_prefix ? 1 : 0;
    impl_.pretokenizer_name = "default";
  }

  // Byte-level BPE; returns llama.cpp's add_bos default for the pre-tokenizer.
  bool load_bpe(const std::vector<std::string>& pieces) {
    const gguf::Value* merges = reader_.find("tokenizer.ggml.merges");
    if (!merges) fail("{}: tokenizer.ggml.model is gpt2 but tokenizer.ggml.merges is missing", path_);
    const std::vector<std::string>& list = merges->str_array();
    impl_.merges.reserve(list.size());
    impl_.merge_table.reserve(list.size());
    for (const std::string& m : list) {
      const size_t space = m.find(' ', 1);
      if (space == std::string::npos) fail("{}: merge \"{}\" is not two pieces separated by a space", path_, m);
      std::string left = m.substr(0, space), right = m.substr(space + 1);
      const auto l = impl_.model_vocab.find(left), r = impl_.model_vocab.find(right),
                 merged = impl_.model_vocab.find(left + right);
      if (l == impl_.model_vocab.end() || r == impl_.model_vocab.end() || merged == impl_.model_vocab.end()) {
        continue;  // llama.cpp ignores a merge whose result is not a token
      }
      const auto rank = static_cast<int32_t>(impl_.merges.size());
      impl_.merge_table.emplace(merge_key(l->second, r->second), MergeTarget{rank, merged->second});
      impl_.merges.emplace_back(std::move(left), std::move(right));
    }
    (void)pieces;
    std::string pre = string("tokenizer.ggml.pre");
    if (pre.empty()) pre = "default";
    const std::optional<PreTokenizer> pt = pre_tokenizer_for(pre);
    if (!pt) {
      fail(
          "{}: tokenizer.ggml.pre '{}' is not a pre-tokenizer Infera knows (supported: llama-bpe, qwen2, qwen35, "
          "gpt-2, default)",
          path_, pre);
    }
    for (const std::string& regex : pt->regexes) {
      PreTokenizerStep step;
      step.type = PreTokenizerStep::Type::kSplit;
      step.regex = std::make_unique<Regex>(regex);
      step.keep_matches = true;
      impl_.pre_tokenizer.push_back(std::move(step));
    }
    impl_.ignore_merges = pt->ignore_merges;
    impl_.byte_level = true;
    impl_.pretokenizer_name = pre;
    return pt->add_bos;
  }

  void finish(const std::vector<int64_t>& types) {
    Tokenizer::Impl& impl = impl_;
    impl.kind = impl.byte_level ? Tokenizer::Kind::kByteLevelBpe : Tokenizer::Kind::kSentencePieceBpe;
    if (!find_byte_token_ids(impl) && impl.byte_fallback) {
      fail("{}: the SentencePiece vocabulary lacks some of the 256 <0xNN> byte tokens", path_);
    }
    impl.decoded_bytes.resize(impl.id_to_piece.size());
    for (size_t id = 0; id < impl.id_to_piece.size(); ++id) {
      const std::string& piece = impl.id_to_piece[id];
      std::string& bytes = impl.decoded_bytes[id];
      const int64_t type = types[id];
      if (type == kControl || type == kUnknown || type == kUserDefined || type == kUnused) {
        bytes = piece;
      } else if (impl.byte_level) {
        size_t pos = 0;
        char32_t cp;
        while (pos < piece.size()) {
          const int b = unicode::next_code_point(piece, pos, cp) ? unicode::unicode_to_byte(cp) : -1;
          if (b < 0) {
            bytes = piece;
            break;
          }
          bytes += static_cast<char>(b);
        }
      } else if (type == kByte && piece.size() == 6 && piece.starts_with("<0x")) {
        bytes = static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16));
      } else {
        for (size_t pos = 0; pos < piece.size();) {
          if (piece.compare(pos, kMetaspace.size(), kMetaspace) == 0) {
            bytes += ' ';
            pos += kMetaspace.size();
          } else {
            bytes += piece[pos++];
          }
        }
      }
    }
    build_added_token_trie(impl);
  }

  std::string path_;
  Tokenizer::Impl& impl_;
  gguf::Reader reader_;
  bool spm_ = false;
};

}  // namespace

std::shared_ptr<Tokenizer::Impl> load_gguf_tokenizer_impl(const std::string& path) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  GgufTokenizerLoader(path, *impl).load();
  return impl;
}

}  // namespace infera
