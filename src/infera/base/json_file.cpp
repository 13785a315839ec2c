#include "infera/base/json_file.h"

#include "infera/base/error.h"
#include "infera/base/text_file.h"

namespace infera {

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string msg = e.what();
  if (!msg.empty() && msg[0] == '[') {
    auto close = msg.find("] ");
    if (close != std::string::npos) msg = msg.substr(close + 2);
  }
  return msg;
}

nlohmann::json read_json_file(const std::string& path, const std::string& if_missing) {
  const TextFile file = load_text_file(path);
  if (!file.ok()) fail("{}: {}: {}", path, if_missing, file.error);
  return parse_json_file_text(file.text, path);
}

std::optional<nlohmann::json> read_json_file_if_present(const std::string& path, const std::string& if_unreadable) {
  const TextFile file = load_text_file(path);
  if (file.absent) return std::nullopt;
  if (!file.ok()) fail("{}: {}: {}", path, if_unreadable, file.error);
  return parse_json_file_text(file.text, path);
}

nlohmann::json parse_json_file_text(std::string_view text, const std::string& path) {
  if (json_nesting_depth(text, kMaxJsonFileDepth) > kMaxJsonFileDepth) {
    fail("{}: malformed JSON: nested deeper than {} levels", path, kMaxJsonFileDepth);
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed JSON: {}", path, json_error_text(e));
  }
}

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return limit + 1;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::optional<nlohmann::json> parse_json_within(std::string_view text, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

namespace {
// dump() with a budget: stops writing once `out` is full and never recurses deeper than 32.
void excerpt(const nlohmann::json& v, std::string& out, size_t max_chars, int depth) {
  if (out.size() > max_chars) return;
  if (v.is_structured() && depth >= 32) {
    out += v.is_array() ? "[...]" : "{...}";
    return;
  }
  if (v.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& e : v) {
      if (out.size() > max_chars) return;
      if (!first) out += ',';
      first = false;
      excerpt(e, out, max_chars, depth + 1);
    }
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, e] : v.items()) {
      if (out.size() > max_chars) return;
      if (!first) out += ',';
      first = false;
      out += nlohmann::json(k).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      out += ':';
      excerpt(e, out, max_chars, depth + 1);
    }
    out += '}';
  } else {
    out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}
}  // namespace

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string out;
  excerpt(value, out, max_chars, 0);
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out += "...";
  }
  return out;
}

}  // namespace infera
