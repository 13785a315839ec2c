// Builds a Tokenizer::Impl from tokenizer.json / tokenizer_config.json /
// special_tokens_map.json. Every configuration this file does not understand is
// rejected with the file, the field and the value, rather than silently tokenizing
// differently from the reference implementation.
#include <algorithm>
#include <cctype>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/log.h"
#include "infera/base/text_file.h"
#include "infera/io/gguf.h"
#include "infera/tokenizer/tokenizer_impl.h"
#include "infera/tokenizer/unicode.h"

namespace infera {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // "▁" U+2581
constexpr int kMaxSequenceDepth = 16;  // Sequence inside Sequence ... (real files: 1 or 2)
constexpr int64_t kMaxIdGap = 65536;  // largest id allowed past twice the number of tokens

// GPT-2's pattern, used by a ByteLevel pre-tokenizer with use_regex.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// The Split regexes of the tokenizers llama.cpp names "qwen2" and "llama-bpe".
constexpr std::string_view kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Reads and parses a JSON file; returns null json when the file is absent and optional.
json read_json_file(const fs::path& path, bool required) {
  const TextFile file = load_text_file(path.string());
  if (file.absent && !required) return json();
  if (!file.ok()) {
    fail("cannot read {}: {} (a tokenizer directory needs tokenizer.json and tokenizer_config.json)", path.string(),
         file.absent ? "file not found" : file.error);
  }
  json parsed = parse_json_file_text(file.text, path.string());
  if (!parsed.is_object()) fail("{}: expected a JSON object at the top level", path.string());
  return parsed;
}

// A field that is present and not null, or nullptr.
const json* find_field(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

bool get_bool(const json& object, const char* key, bool fallback) {
  const json* value = find_field(object, key);
  return value && value->is_boolean() ? value->get<bool>() : fallback;
}

std::string get_string(const json& object, const char* key) {
  const json* value = find_field(object, key);
  return value && value->is_string() ? value->get<std::string>() : std::string();
}

// A token named in tokenizer_config.json / special_tokens_map.json: a plain string or an
// AddedToken object {"content": ...}.
std::string token_content(const json* value) {
  if (value == nullptr) return {};
  if (value->is_string()) return value->get<std::string>();
  if (value->is_object()) return get_string(*value, "content");
  return {};
}

class Loader {
 public:
  Loader(const std::string& dir, Tokenizer::Impl& impl) : dir_(dir), impl_(impl) {}

  void load() {
    const fs::path tokenizer_path = dir_ / "tokenizer.json";
    const fs::path config_path = dir_ / "tokenizer_config.json";
    const fs::path special_map_path = dir_ / "special_tokens_map.json";
    if (!fs::is_directory(dir_)) fail("tokenizer directory {} does not exist", dir_.string());
    const json tokenizer = read_json_file(tokenizer_path, true);
    const json config = read_json_file(config_path, false);
    const json special_map = read_json_file(special_map_path, false);
    if (config.is_null())
      LOG_DEBUG("{} not found: no chat template, BOS/EOS from tokenizer.json", config_path.string());

    file_ = tokenizer_path.string();
    try {
      load_model(tokenizer);
      load_added_tokens(tokenizer, config);
      load_normalizer(tokenizer);
      load_pre_tokenizer(tokenizer);
      load_decoder(tokenizer);
      load_post_processor(tokenizer);
      file_ = config_path.string();
      load_config(config, special_map);
    } catch (const json::exception& e) {
      fail("{}: unexpected content: {}", file_, e.what());
    }
    finish();
  }

 private:
  [[noreturn]] void unsupported(std::string_view what, const json& value) const {
    fail("{}: unsupported {} {} (Infera supports byte-level and SentencePiece-style BPE tokenizers)", file_, what,
         json_excerpt(value));
  }

  void load_model(const json& tokenizer) {
    const json* model = find_field(tokenizer, "model");
    if (model == nullptr || !model->is_object()) fail("{}: missing the \"model\" object", file_);
    const std::string type = get_string(*model, "type");
    if (!(type == "BPE" || (type.empty() && model->contains("merges")))) {
      fail("{}: unsupported model type '{}' (only BPE is supported)", file_, type);
    }
    if (!get_string(*model, "continuing_subword_prefix").empty() || !get_string(*model, "end_of_word_suffix").empty()) {
      unsupported("BPE option continuing_subword_prefix/end_of_word_suffix in", *model);
    }
    const json* vocab = find_field(*model, "vocab");
    if (vocab == nullptr || !vocab->is_object()) fail("{}: model.vocab must be an object of piece -> id", file_);
    int32_t max_id = -1;
    impl_.model_vocab.reserve(vocab->size());
    for (const auto& [piece, id_value] : vocab->items()) {
      if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 || id_value.get<int64_t>() >= (1 << 30)) {
        fail("{}: model.vocab[\"{}\"] is not a valid token id: {}", file_, piece, json_excerpt(id_value));
      }
      const auto id = id_value.get<int32_t>();
      impl_.model_vocab.emplace(piece, id);
      max_id = std::max(max_id, id);
    }
    if (max_id >= 2 * static_cast<int64_t>(vocab->size()) + kMaxIdGap) {
      fail("{}: token id {} is far past the {} tokens of model.vocab (ids must be numbered densely from 0)", file_,
           max_id, vocab->size());
    }
    impl_.id_to_piece.resize(static_cast<size_t>(max_id + 1));
    for (const auto& [piece, id] : impl_.model_vocab) impl_.id_to_piece[id] = piece;

    impl_.byte_fallback = get_bool(*model, "byte_fallback", false);
    impl_.ignore_merges = get_bool(*model, "ignore_merges", false);
    impl_.fuse_unk = get_bool(*model, "fuse_unk", false);
    if (const std::string unk = get_string(*model, "unk_token"); !unk.empty()) {
      auto it = impl_.model_vocab.find(unk);
      if (it == impl_.model_vocab.end()) fail("{}: model.unk_token '{}' is not in the vocabulary", file_, unk);
      impl_.unk_id = it->second;
    }

    const json* merges = find_field(*model, "merges");
    if (merges == nullptr || !merges->is_array()) fail("{}: model.merges must be an array", file_);
    impl_.merges.reserve(merges->size());
    impl_.merge_table.reserve(merges->size());
    for (const json& merge : *merges) {
      std::string left, right;
      if (merge.is_string()) {  // "left right"
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ', 1);
        if (space == std::string::npos) fail("{}: merge \"{}\" is not two pieces separated by a space", file_, text);
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        fail("{}: merge {} is neither \"left right\" nor [\"left\", \"right\"]", file_, json_excerpt(merge));
      }
      const auto left_it = impl_.model_vocab.find(left);
      const auto right_it = impl_.model_vocab.find(right);
      const auto merged_it = impl_.model_vocab.find(left + right);
      if (left_it == impl_.model_vocab.end() || right_it == impl_.model_vocab.end() ||
          merged_it == impl_.model_vocab.end()) {
        fail("{}: merge \"{} {}\" uses a piece that is not in model.vocab", file_, left, right);
      }
      const auto rank = static_cast<int32_t>(impl_.merges.size());
      impl_.merge_table.emplace(merge_key(left_it->second, right_it->second), MergeTarget{rank, merged_it->second});
      impl_.merges.emplace_back(std::move(left), std::move(right));
    }
  }

  void add_token(const json& entry, int32_t id) {
    AddedToken token;
    token.id = id;
    token.content = get_string(entry, "content");
    if (token.content.empty()) fail("{}: added token {} has no content", file_, id);
    token.special = get_bool(entry, "special", false);
    token.lstrip = get_bool(entry, "lstrip", false);
    token.rstrip = get_bool(entry, "rstrip", false);
    token.single_word = get_bool(entry, "single_word", false);
    if (impl_.added_token_index.count(token.content)) return;
    impl_.added_token_index.emplace(token.content, static_cast<int32_t>(impl_.added_tokens.size()));
    impl_.added_tokens.push_back(std::move(token));
  }

  void load_added_tokens(const json& tokenizer, const json& config) {
    if (const json* added = find_field(tokenizer, "added_tokens")) {
      for (const json& entry : *added) {
        const json* id = find_field(entry, "id");
        if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= (1 << 30)) {
          fail("{}: added token {} has no valid id", file_, json_excerpt(entry));
        }
        add_token(entry, id->get<int32_t>());
      }
    }
    // tokenizer_config.json may declare more (added_tokens_decoder: "id" -> AddedToken).
    if (const json* decoder = find_field(config, "added_tokens_decoder"); decoder && decoder->is_object()) {
      for (const auto& [id_text, entry] : decoder->items()) {
        char* end = nullptr;
        const long id = std::strtol(id_text.c_str(), &end, 10);
        if (*end != '\0' || id < 0 || id >= (1 << 30)) continue;
        add_token(entry, static_cast<int32_t>(id));
      }
    }
    int32_t max_id = impl_.vocab_size() - 1;
    for (const AddedToken& token : impl_.added_tokens) max_id = std::max(max_id, token.id);
    // Tables are sized by the largest id: a few tokens with ids near 2^30 (a 60-byte file)
    // must not allocate gigabytes. Real vocabularies number their tokens (nearly) densely.
    const int64_t ids = static_cast<int64_t>(impl_.model_vocab.size() + impl_.added_tokens.size());
    if (max_id >= 2 * ids + kMaxIdGap) {
      fail("{}: token id {} is far past the {} tokens defined (ids must be numbered densely from 0)", file_, max_id,
           ids);
    }
    impl_.id_to_piece.resize(static_cast<size_t>(max_id + 1));
    impl_.special.assign(static_cast<size_t>(max_id + 1), 0);
    for (const AddedToken& token : impl_.added_tokens) {
      impl_.id_to_piece[token.id] = token.content;
      impl_.special[token.id] = token.special ? 1 : 0;
    }
  }

  void load_normalizer(const json& tokenizer) {
    if (const json* normalizer = find_field(tokenizer, "normalizer")) add_normalizer(*normalizer);
  }

  void add_normalizer(const json& node, int depth = 0) {
    const std::string type = get_string(node, "type");
    if (type == "Sequence" && depth >= kMaxSequenceDepth)
      fail("{}: normalizer Sequences nested deeper than {}", file_, kMaxSequenceDepth);
    if (type == "Sequence") {
      for (const json& child : node.at("normalizers")) add_normalizer(child, depth + 1);
    } else if (type == "NFC") {
      impl_.normalizer.push_back({NormalizerStep::Type::kNfc, {}, {}});
    } else if (type == "Prepend") {
      impl_.normalizer.push_back({NormalizerStep::Type::kPrepend, {}, get_string(node, "prepend")});
    } else if (type == "Replace") {
      const json* pattern = find_field(node, "pattern");
      if (pattern == nullptr || !find_field(*pattern, "String")) unsupported("normalizer", node);
      std::string from = pattern->at("String").get<std::string>();
      if (from.empty()) unsupported("normalizer", node);
      impl_.normalizer.push_back({NormalizerStep::Type::kReplace, std::move(from), get_string(node, "content")});
    } else {
      unsupported("normalizer", node);
    }
  }

  void load_pre_tokenizer(const json& tokenizer) {
    if (const json* pre = find_field(tokenizer, "pre_tokenizer")) add_pre_tokenizer(*pre);
    for (size_t i = 0; i < impl_.pre_tokenizer.size(); ++i) {
      // The ByteLevel mapping happens in the model stage, so nothing may split after it.
      if (impl_.pre_tokenizer[i].type == PreTokenizerStep::Type::kByteLevel && i + 1 != impl_.pre_tokenizer.size()) {
        fail("{}: a ByteLevel pre-tokenizer must come last in the sequence", file_);
      }
    }
  }

  void add_pre_tokenizer(const json& node, int depth = 0) {
    const std::string type = get_string(node, "type");
    if (type == "Sequence" && depth >= kMaxSequenceDepth)
      fail("{}: pre_tokenizer Sequences nested deeper than {}", file_, kMaxSequenceDepth);
    PreTokenizerStep step;
    if (type == "Sequence") {
      for (const json& child : node.at("pretokenizers")) add_pre_tokenizer(child, depth + 1);
      return;
    } else if (type == "Split") {
      step.type = PreTokenizerStep::Type::kSplit;
      const json& pattern = node.at("pattern");
      if (get_bool(node, "invert", false)) unsupported("pre-tokenizer", node);
      const std::string behavior = get_string(node, "behavior");
      if (behavior == "Isolated") {
        step.keep_matches = true;
      } else if (behavior == "Removed") {
        step.keep_matches = false;
      } else {
        unsupported("pre-tokenizer Split behavior in", node);
      }
      if (const json* regex = find_field(pattern, "Regex")) {
        step.regex = std::make_unique<Regex>(regex->get<std::string>());
      } else if (const json* literal = find_field(pattern, "String")) {
        step.regex = std::make_unique<Regex>(literal->get<std::string>(), /*literal=*/true);
      } else {
        unsupported("pre-tokenizer", node);
      }
    } else if (type == "ByteLevel") {
      step.type = PreTokenizerStep::Type::kByteLevel;
      step.add_prefix_space = get_bool(node, "add_prefix_space", false);
      if (get_bool(node, "use_regex", true)) step.regex = std::make_unique<Regex>(kGpt2Pattern);
    } else if (type == "Metaspace") {
      step.type = PreTokenizerStep::Type::kMetaspace;
      step.replacement = get_string(node, "replacement");
      if (step.replacement.empty()) step.replacement = kMetaspace;
      step.split = get_bool(node, "split", true);
      const std::string scheme = get_string(node, "prepend_scheme");
      if (scheme == "first") {
        step.prepend = PreTokenizerStep::Prepend::kFirst;
      } else if (scheme == "never" || (scheme.empty() && !get_bool(node, "add_prefix_space", true))) {
        step.prepend = PreTokenizerStep::Prepend::kNever;
      } else {
        step.prepend = PreTokenizerStep::Prepend::kAlways;
      }
    } else {
      unsupported("pre-tokenizer", node);
    }
    impl_.pre_tokenizer.push_back(std::move(step));
  }

  // The decoders of byte-level and SentencePiece BPE reduce to: map each piece to its
  // bytes (GPT-2 mapping, or "▁" -> space and <0xNN> -> byte), concatenate, and strip
  // leading spaces of the whole output.
  void load_decoder(const json& tokenizer) {
    if (const json* decoder = find_field(tokenizer, "decoder")) add_decoder(*decoder);
  }

  void add_decoder(const json& node, int depth = 0) {
    const std::string type = get_string(node, "type");
    if (type == "Sequence" && depth >= kMaxSequenceDepth)
      fail("{}: decoder Sequences nested deeper than {}", file_, kMaxSequenceDepth);
    if (type == "Sequence") {
      for (const json& child : node.at("decoders")) add_decoder(child, depth + 1);
    } else if (type == "ByteLevel") {
      decode_byte_level_ = true;
    } else if (type == "ByteFallback") {
      decode_byte_fallback_ = true;
    } else if (type == "Fuse") {
      // Concatenation is what decode does anyway.
    } else if (type == "Replace") {
      const json* pattern = find_field(node, "pattern");
      if (pattern == nullptr || get_string(*pattern, "String") != kMetaspace || get_string(node, "content") != " ") {
        unsupported("decoder", node);
      }
      decode_metaspace_ = true;
    } else if (type == "Strip") {
      if (get_string(node, "content") != " " || node.value("stop", 0) != 0) unsupported("decoder", node);
      impl_.strip_leading_spaces = node.value("start", 0);
    } else if (type == "Metaspace") {
      decode_metaspace_ = true;
      const std::string scheme = get_string(node, "prepend_scheme");
      const bool prepends = scheme.empty() ? get_bool(node, "add_prefix_space", true) : scheme != "never";
      if (prepends) impl_.strip_leading_spaces = 1;
    } else {
      unsupported("decoder", node);
    }
  }

  void load_post_processor(const json& tokenizer) {
    if (const json* post = find_field(tokenizer, "post_processor")) add_post_processor(*post);
  }

  // A special-token id the post_processor names: one the vocabulary defines.
  int32_t checked_id(const json& value, const std::string& name) const {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(impl_.id_to_piece.size())) {
      fail("{}: post_processor gives special token '{}' the id {}, which is not in the vocabulary", file_, name,
           json_excerpt(value));
    }
    return value.get<int32_t>();
  }

  int32_t special_token_id(const std::string& content, const json& template_node) const {
    // TemplateProcessing lists its special tokens with their ids; fall back to the vocab.
    if (const json* specials = find_field(template_node, "special_tokens")) {
      if (const json* entry = find_field(*specials, content.c_str())) {
        const json& ids = entry->at("ids");
        if (ids.size() == 1) return checked_id(ids[0], content);
      }
    }
    if (auto it = impl_.added_token_index.find(content); it != impl_.added_token_index.end()) {
      return impl_.added_tokens[it->second].id;
    }
    if (auto it = impl_.model_vocab.find(content); it != impl_.model_vocab.end()) return it->second;
    fail("{}: post_processor names special token '{}' which is not in the vocabulary", file_, content);
  }

  void add_post_processor(const json& node, int depth = 0) {
    const std::string type = get_string(node, "type");
    if (type == "Sequence" && depth >= kMaxSequenceDepth)
      fail("{}: post_processor Sequences nested deeper than {}", file_, kMaxSequenceDepth);
    if (type == "Sequence") {
      for (const json& child : node.at("processors")) add_post_processor(child, depth + 1);
    } else if (type == "ByteLevel") {
      // Only adjusts offsets.
    } else if (type == "TemplateProcessing") {
      bool after_sequence = false;
      for (const json& item : node.at("single")) {
        if (find_field(item, "Sequence")) {
          after_sequence = true;
        } else if (const json* special = find_field(item, "SpecialToken")) {
          const int32_t id = special_token_id(special->at("id").get<std::string>(), node);
          (after_sequence ? impl_.suffix_ids : impl_.prefix_ids).push_back(id);
        } else {
          unsupported("post_processor template item", item);
        }
      }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      impl_.prefix_ids.push_back(checked_id(node.at("cls").at(1), "cls"));
      impl_.suffix_ids.push_back(checked_id(node.at("sep").at(1), "sep"));
    } else {
      unsupported("post_processor", node);
    }
  }

  int32_t named_token_id(const json& config, const json& special_map, const char* key) const {
    std::string content = token_content(find_field(config, key));
    if (content.empty()) content = token_content(find_field(special_map, key));
    if (content.empty()) return -1;
    if (auto it = impl_.added_token_index.find(content); it != impl_.added_token_index.end()) {
      return impl_.added_tokens[it->second].id;
    }
    if (auto it = impl_.model_vocab.find(content); it != impl_.model_vocab.end()) return it->second;
    LOG_WARN("{}: {} '{}' is not in the vocabulary; ignoring it", file_, key, content);
    return -1;
  }

  void load_config(const json& config, const json& special_map) {
    impl_.bos_id = named_token_id(config, special_map, "bos_token");
    impl_.eos_id = named_token_id(config, special_map, "eos_token");
    // add_bos_token / add_eos_token in tokenizer_config.json override the post_processor
    // template (as transformers' Llama tokenizers do).
    const auto apply = [](const json* flag, int32_t id, std::vector<int32_t>& ids, bool at_front) {
      if (flag == nullptr || !flag->is_boolean() || id < 0) return;
      const bool present = std::find(ids.begin(), ids.end(), id) != ids.end();
      if (flag->get<bool>() && !present) ids.insert(at_front ? ids.begin() : ids.end(), id);
      if (!flag->get<bool>()) ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    };
    apply(find_field(config, "add_bos_token"), impl_.bos_id, impl_.prefix_ids, true);
    apply(find_field(config, "add_eos_token"), impl_.eos_id, impl_.suffix_ids, false);

    if (const json* chat_template = find_field(config, "chat_template")) {
      if (chat_template->is_string()) {
        impl_.chat_template = chat_template->get<std::string>();
      } else if (chat_template->is_array()) {
        for (const json& entry : *chat_template) {
          if (get_string(entry, "name") == "default") impl_.chat_template = get_string(entry, "template");
        }
        if (impl_.chat_template.empty()) LOG_WARN("{}: chat_template has no template named \"default\"", file_);
      } else {
        fail("{}: chat_template must be a string or a list of {{\"name\", \"template\"}}", file_);
      }
    }
    // Newer transformers versions save the template beside the config instead.
    if (impl_.chat_template.empty()) {
      if (auto jinja = read_text_file_if_present((dir_ / "chat_template.jinja").string(), "the chat template")) {
        impl_.chat_template = std::move(*jinja);
      } else if (const json file = read_json_file(dir_ / "chat_template.json", false); !file.is_null()) {
        file_ = (dir_ / "chat_template.json").string();
        impl_.chat_template = get_string(file, "chat_template");
      }
    }
  }

  void finish() {
    auto& impl = impl_;
    impl.byte_level =
        decode_byte_level_ || std::any_of(impl.pre_tokenizer.begin(), impl.pre_tokenizer.end(),
                                          [](const auto& s) { return s.type == PreTokenizerStep::Type::kByteLevel; });
    impl.kind = impl.byte_level ? Tokenizer::Kind::kByteLevelBpe : Tokenizer::Kind::kSentencePieceBpe;

    if (!find_byte_token_ids(impl) && impl.byte_fallback) {
      fail("{}: model.byte_fallback is set but the vocabulary lacks some <0xNN> byte tokens", file_);
    }

    // What each id decodes to.
    impl.decoded_bytes.resize(impl.id_to_piece.size());
    for (size_t id = 0; id < impl.id_to_piece.size(); ++id) {
      const std::string& piece = impl.id_to_piece[id];
      std::string& bytes = impl.decoded_bytes[id];
      if (impl.added_token_index.count(piece) &&
          impl.added_tokens[impl.added_token_index.at(piece)].id == static_cast<int32_t>(id)) {
        bytes = piece;  // added tokens are emitted verbatim
      } else if (decode_byte_level_) {
        size_t pos = 0;
        char32_t cp;
        while (pos < piece.size()) {
          const int b = unicode::next_code_point(piece, pos, cp) ? unicode::unicode_to_byte(cp) : -1;
          if (b < 0) {  // not a byte-mapped piece: keep it as is (what HF's ByteLevel decoder does)
            bytes = piece;
            break;
          }
          bytes += static_cast<char>(b);
        }
      } else if (decode_byte_fallback_ && piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">") &&
                 std::isxdigit(static_cast<unsigned char>(piece[3])) &&
                 std::isxdigit(static_cast<unsigned char>(piece[4]))) {
        bytes = static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16));
      } else if (decode_metaspace_) {
        for (size_t pos = 0; pos < piece.size();) {
          if (piece.compare(pos, kMetaspace.size(), kMetaspace) == 0) {
            bytes += ' ';
            pos += kMetaspace.size();
          } else {
            bytes += piece[pos++];
          }
        }
      } else {
        bytes = piece;
      }
    }

    build_added_token_trie(impl);

    // llama.cpp's name for the pre-tokenizer, from the Split regex.
    if (impl.kind == Tokenizer::Kind::kSentencePieceBpe) {
      impl.pretokenizer_name = "default";
    } else {
      for (const auto& step : impl.pre_tokenizer) {
        if (!step.regex) continue;
        if (step.regex->pattern() == kQwen2Pattern)
          impl.pretokenizer_name = "qwen2";
        else if (step.regex->pattern() == kLlama3Pattern)
          impl.pretokenizer_name = "llama-bpe";
        else if (step.regex->pattern() == kGpt2Pattern)
          impl.pretokenizer_name = "gpt-2";
        break;
      }
    }
  }

  fs::path dir_;
  Tokenizer::Impl& impl_;
  std::string file_;  // the file being interpreted, for error messages
  bool decode_byte_level_ = false;
  bool decode_byte_fallback_ = false;
  bool decode_metaspace_ = false;
};

}  // namespace

bool find_byte_token_ids(Tokenizer::Impl& impl) {
  const auto& byte_chars = unicode::byte_to_unicode();
  bool all_fallback = true;
  for (int b = 0; b < 256; ++b) {
    std::string mapped;
    unicode::append_utf8(mapped, byte_chars[b]);
    auto it = impl.model_vocab.find(mapped);
    impl.byte_level_ids[b] = it == impl.model_vocab.end() ? -1 : it->second;
    auto fallback = impl.model_vocab.find(fmt::format("<0x{:02X}>", b));
    impl.byte_fallback_ids[b] = fallback == impl.model_vocab.end() ? -1 : fallback->second;
    all_fallback = all_fallback && impl.byte_fallback_ids[b] >= 0;
  }
  return all_fallback;
}

void build_added_token_trie(Tokenizer::Impl& impl) {
  impl.trie.assign(1, {});
  for (size_t i = 0; i < impl.added_tokens.size(); ++i) {
    int32_t node = 0;
    for (char c : impl.added_tokens[i].content) {
      const auto byte = static_cast<uint8_t>(c);
      auto& children = impl.trie[node].children;
      auto it = std::find_if(children.begin(), children.end(), [&](const auto& e) { return e.first == byte; });
      if (it != children.end()) {
        node = it->second;
      } else {
        const auto next = static_cast<int32_t>(impl.trie.size());
        children.emplace_back(byte, next);
        impl.trie.emplace_back();
        node = next;
      }
    }
    impl.trie[node].added_token = static_cast<int32_t>(i);
    impl.trie_first_byte[static_cast<uint8_t>(impl.added_tokens[i].content[0])] = true;
  }
}

bool Tokenizer::is_gguf(const std::string& path) { return gguf::is_gguf_file(path); }

std::shared_ptr<Tokenizer::Impl> load_tokenizer_impl(const std::string& dir) {
  if (gguf::is_gguf_file(dir)) return load_gguf_tokenizer_impl(dir);
  auto impl = std::make_shared<Tokenizer::Impl>();
  Loader(dir, *impl).load();
  return impl;
}

}  // namespace infera
