#include "infera/chat/chat_template.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string_view>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/text_file.h"
#include "infera/chat/jinja_eval.h"
#include "infera/chat/jinja_parser.h"
#include "infera/chat/jinja_value.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera {
namespace {

constexpr int kMaxContextDepth = 256;  // nesting of the context JSON

// JavaScript's Object.entries order, which the reference gets from JSON.parse: keys that
// are array indexes ("0", "17") first in numeric order, then the rest in insertion order.
bool is_array_index_key(std::string_view key) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return false;
  uint64_t value = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value < 4294967295ull;
}

template <typename Json>
jinja::Value to_value(const Json& json, int depth) {
  if (depth > kMaxContextDepth) fail("chat template: context JSON nested deeper than {} levels", kMaxContextDepth);
  switch (json.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded: return jinja::Value::none();
    case nlohmann::json::value_t::boolean: return jinja::Value(json.template get<bool>());
    case nlohmann::json::value_t::number_integer: return jinja::Value(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = json.template get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? jinja::Value(static_cast<int64_t>(u))
                                                   : jinja::Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: {
      // JavaScript has one number type: 2.0 from JSON is the integer 2.
      const double f = json.template get<double>();
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9.2e18) return jinja::Value(static_cast<int64_t>(f));
      return jinja::Value(f);
    }
    case nlohmann::json::value_t::string: return jinja::Value(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      jinja::ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(to_value(item, depth + 1));
      return jinja::Value::array(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      jinja::Object object;
      std::vector<std::pair<uint64_t, std::string>> index_keys;
      for (auto it = json.begin(); it != json.end(); ++it) {
        if (is_array_index_key(it.key())) index_keys.emplace_back(std::stoull(it.key()), it.key());
      }
      std::sort(index_keys.begin(), index_keys.end());
      for (const auto& [unused, key] : index_keys) object.set(key, to_value(json.at(key), depth + 1));
      for (auto it = json.begin(); it != json.end(); ++it) {
        if (!is_array_index_key(it.key())) object.set(it.key(), to_value(it.value(), depth + 1));
      }
      return jinja::Value::object(std::move(object));
    }
    case nlohmann::json::value_t::binary: fail("chat template: binary values are not supported in the context");
  }
  return jinja::Value();
}

std::string located(const std::string& source, const jinja::SourceError& e) {
  const auto [line, column] = jinja::line_and_column(source, e.offset);
  return fmt::format("chat template: line {}, column {}: {}", line, column, e.what());
}

template <typename Json>
std::string render_with(const std::string& source, const jinja::Program& program, const Json& context) {
  if (!context.is_object()) fail("chat template: the context must be a JSON object, got {}", context.type_name());
  const jinja::Value globals = to_value(context, 0);
  try {
    return jinja::render(program, globals.as_object());
  } catch (const jinja::RaiseError& e) {
    throw Error(std::string("chat template: ") + e.what());
  } catch (const jinja::SourceError& e) {
    throw Error(located(source, e));
  }
}

std::optional<std::string> token_text(const nlohmann::json& config, const char* field) {
  const auto it = config.find(field);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  fail("tokenizer_config.json: {} must be a string or an object with a \"content\" string", field);
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source) : source_(std::move(source)) {
  try {
    program_ = std::make_shared<const jinja::Program>(jinja::parse(source_));
  } catch (const jinja::SourceError& e) {
    throw Error(located(source_, e));
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render_with(source_, *program_, context);
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render_with(source_, *program_, context);
}

ChatTemplateConfig load_chat_template_config(const std::string& tokenizer_dir) {
  namespace fs = std::filesystem;
  if (Tokenizer::is_gguf(tokenizer_dir)) {
    // A GGUF file: tokenizer.chat_template and the BOS/EOS pieces of its vocabulary.
    const Tokenizer tok = Tokenizer::load(tokenizer_dir);
    ChatTemplateConfig result;
    result.chat_template = tok.chat_template();
    if (tok.bos_id() >= 0) result.bos_token = std::string(tok.token_text(tok.bos_id()));
    if (tok.eos_id() >= 0) result.eos_token = std::string(tok.token_text(tok.eos_id()));
    return result;
  }
  const fs::path config_path = fs::path(tokenizer_dir) / "tokenizer_config.json";
  if (!fs::exists(config_path))
    fail("cannot read {}: no such file (expected a Hugging Face tokenizer directory)", config_path.string());
  const nlohmann::json config = read_json_file(config_path.string(), "cannot read the tokenizer config");
  if (!config.is_object()) fail("{}: expected a JSON object", config_path.string());
  ChatTemplateConfig result;
  result.bos_token = token_text(config, "bos_token");
  result.eos_token = token_text(config, "eos_token");
  const auto it = config.find("chat_template");
  if (it != config.end() && it->is_string()) {
    result.chat_template = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        result.chat_template = entry["template"].get<std::string>();
      }
    }
    if (result.chat_template.empty())
      fail("{}: chat_template is a list without a \"default\" entry", config_path.string());
  } else if (it != config.end() && !it->is_null()) {
    fail("{}: chat_template must be a string or a list of {{name, template}}", config_path.string());
  }
  // Newer transformers save the template beside the config instead.
  const fs::path jinja_path = fs::path(tokenizer_dir) / "chat_template.jinja";
  const fs::path json_path = fs::path(tokenizer_dir) / "chat_template.json";
  if (result.chat_template.empty() && fs::exists(jinja_path)) {
    result.chat_template = read_text_file(jinja_path.string(), "the chat template");
  } else if (result.chat_template.empty() && fs::exists(json_path)) {
    const nlohmann::json saved = read_json_file(json_path.string(), "cannot read the chat template");
    if (!saved.is_object() || !saved.contains("chat_template") || !saved["chat_template"].is_string()) {
      fail("{}: expected {{\"chat_template\": \"...\"}}", json_path.string());
    }
    result.chat_template = saved["chat_template"].get<std::string>();
  }
  return result;
}

}  // namespace infera
