#include "infera/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>

#include "infera/tokenizer/unicode.h"

namespace infera::jinja {

const Value* Object::find(std::string_view key) const {
  // The index covers entries[0, indexed_); the rest (appended directly) is scanned.
  size_t from = 0;
  if (indexed_ > 0) {
    auto it = index_.find(key);
    if (it != index_.end()) return &entries[it->second].second;
    from = indexed_;
  }
  for (size_t i = from; i < entries.size(); ++i) {
    if (entries[i].first == key) return &entries[i].second;
  }
  return nullptr;
}

Value* Object::find(std::string_view key) {
  sync_index();
  return const_cast<Value*>(std::as_const(*this).find(key));
}

void Object::sync_index() {
  if (indexed_ > entries.size()) {  // entries were replaced or shrunk: start over
    index_.clear();
    indexed_ = 0;
  }
  if (entries.size() < kIndexFrom) return;
  for (; indexed_ < entries.size(); ++indexed_) index_.emplace(entries[indexed_].first, indexed_);  // first one wins
}

void Object::set(std::string key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);
  } else {
    entries.emplace_back(std::move(key), std::move(value));
  }
}

const Value* Args::keyword_arg(std::string_view name) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

const Value* Args::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return keyword_arg(name);
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::array(ValueList items, bool tuple) {
  Value v;
  v.kind_ = Kind::kArray;
  v.tuple_ = tuple;
  v.data_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::object(Object object) {
  Value v;
  v.kind_ = Kind::kObject;
  v.data_ = std::make_shared<Object>(std::move(object));
  return v;
}

Value Value::namespace_(Object object) {
  Value v = Value::object(std::move(object));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::function(Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.data_ = std::make_shared<Function>(std::move(fn));
  return v;
}

double Value::as_number() const {
  switch (kind_) {
    case Kind::kInt: return static_cast<double>(as_int());
    case Kind::kFloat: return as_float();
    case Kind::kBool: return as_bool() ? 1.0 : 0.0;
    default: return std::nan("");
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_float() != 0.0 && !std::isnan(as_float());
    case Kind::kString: return !as_string().empty();
    case Kind::kArray: return !as_array().empty();
    case Kind::kObject: return !as_object().entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction: return true;
  }
  return false;
}

const void* Value::identity() const {
  if (auto* p = std::get_if<std::shared_ptr<ValueList>>(&data_)) return p->get();
  if (auto* p = std::get_if<std::shared_ptr<Object>>(&data_)) return p->get();
  if (auto* p = std::get_if<std::shared_ptr<Function>>(&data_)) return p->get();
  return nullptr;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "none";
    case Kind::kBool: return "boolean";
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kArray: return tuple_ ? "tuple" : "list";
    case Kind::kObject: return "dict";
    case Kind::kNamespace: return "namespace";
    case Kind::kFunction: return "function";
  }
  return "?";
}

std::string js_number_to_string(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return "0";  // also -0, as in JavaScript
  char buf[64];
  // Shortest round-trip digits, as ECMAScript's Number::toString requires.
  const auto result = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(result.ptr - buf));  // "-d.ddde+XX"
  std::string out = value < 0 ? "-" : "";
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c >= '0' && c <= '9') digits += c;
  }
  int exponent = 0;
  std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+'), sci.data() + sci.size(), exponent);
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;  // the decimal point sits after n digits
  if (k <= n && n <= 21) {
    out += digits + std::string(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(static_cast<size_t>(-n), '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{}", n - 1 >= 0 ? "+" : "-", std::abs(n - 1));
  }
  return out;
}

namespace {

std::string float_output_string(double value) {
  if (value == 0 && std::signbit(value)) return "-0.0";
  // Number#toFixed(1) for whole numbers below 1e21, the plain form otherwise.
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e21) {
    return fmt::format("{:.1f}", value);
  }
  return js_number_to_string(value);
}

void append_json_escaped_code_unit(std::string& out, unsigned unit) { out += fmt::format("\\u{:04x}", unit); }

}  // namespace

std::string to_output_string(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return "";
    case Value::Kind::kBool: return value.as_bool() ? "true" : "false";
    case Value::Kind::kInt: return std::to_string(value.as_int());
    case Value::Kind::kFloat: return float_output_string(value.as_float());
    case Value::Kind::kString: return value.as_string();
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: return to_json(value, {}, /*undefined_as_null=*/false);
    case Value::Kind::kFunction: throw std::runtime_error("cannot print a function or macro; call it with ()");
  }
  return "";
}

std::string to_js_string(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "null";
    case Value::Kind::kBool: return value.as_bool() ? "true" : "false";
    case Value::Kind::kInt: return std::to_string(value.as_int());
    case Value::Kind::kFloat: return js_number_to_string(value.as_float());
    case Value::Kind::kString: return value.as_string();
    case Value::Kind::kArray: {
      // Array#toString joins the elements' own toString(), i.e. their printed form.
      std::string out;
      bool first = true;
      for (const Value& item : value.as_array()) {
        if (!first) out += ',';
        first = false;
        out += item.is_none() ? "null" : item.is_undefined() ? "undefined" : to_output_string(item);
      }
      return out;
    }
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: return "[object Map]";
    case Value::Kind::kFunction: return "[function]";
  }
  return "";
}

std::string json_quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          append_json_escaped_code_unit(out, c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

namespace {

// ensure_ascii as @huggingface/jinja does it: every UTF-16 code unit from U+007F up
// becomes \uXXXX (so a character outside the BMP becomes a surrogate pair).
std::string make_ascii_safe(std::string_view json) {
  std::string out;
  size_t pos = 0;
  while (pos < json.size()) {
    char32_t cp = 0;
    const size_t start = pos;
    if (!unicode::next_code_point(json, pos, cp)) cp = unicode::kReplacementChar;
    if (cp < 0x7F) {
      out.append(json.substr(start, pos - start));
    } else if (cp <= 0xFFFF) {
      append_json_escaped_code_unit(out, cp);
    } else {
      const char32_t v = cp - 0x10000;
      append_json_escaped_code_unit(out, 0xD800 + (v >> 10));
      append_json_escaped_code_unit(out, 0xDC00 + (v & 0x3FF));
    }
  }
  return out;
}

void write_json(std::string& out, const Value& value, const JsonOptions& options, int depth, bool undefined_as_null) {
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  if (options.has_separators) {
    item_separator = options.item_separator;
    key_separator = options.key_separator;
  } else if (options.indent > 0) {
    item_separator = ",";  // as Python's json.dumps with indent
  }
  switch (value.kind()) {
    case Value::Kind::kUndefined: out += undefined_as_null ? "null" : "undefined"; return;
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += value.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(value.as_int()); return;
    case Value::Kind::kFloat:
      out += std::isfinite(value.as_float()) ? js_number_to_string(value.as_float()) : "null";
      return;
    case Value::Kind::kString:
      out += options.ensure_ascii ? make_ascii_safe(json_quote(value.as_string())) : json_quote(value.as_string());
      return;
    case Value::Kind::kFunction: throw std::runtime_error("cannot convert a function or macro to JSON");
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace: break;
  }
  const std::string indent_unit(static_cast<size_t>(std::max(options.indent, 0)), ' ');
  std::string base_padding = "\n";
  for (int i = 0; i < depth; ++i) base_padding += indent_unit;
  const std::string child_padding = base_padding + indent_unit;
  const bool pretty = options.indent > 0;
  if (value.is_array()) {
    const ValueList& items = value.as_array();
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      out += i == 0 ? (pretty ? child_padding : "") : (pretty ? item_separator + child_padding : item_separator);
      write_json(out, items[i], options, depth + 1, undefined_as_null);
    }
    if (pretty && !items.empty()) out += base_padding;
    out += ']';
    return;
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& entry : value.as_object().entries) entries.push_back(&entry);
  if (options.sort_keys) {
    // The reference sorts with localeCompare; code-point order agrees on ASCII keys.
    std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
  }
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) out += item_separator;
    if (pretty) out += child_padding;
    const std::string key = json_quote(entries[i]->first);
    out += options.ensure_ascii ? make_ascii_safe(key) : key;
    out += key_separator;
    write_json(out, entries[i]->second, options, depth + 1, undefined_as_null);
  }
  if (pretty && !entries.empty()) out += base_padding;
  out += '}';
}

}  // namespace

std::string to_json(const Value& value, const JsonOptions& options, bool undefined_as_null) {
  std::string out;
  write_json(out, value, options, 0, undefined_as_null);
  return out;
}

size_t js_string_length(std::string_view utf8) {
  size_t length = 0;
  size_t pos = 0;
  while (pos < utf8.size()) {
    char32_t cp = 0;
    unicode::next_code_point(utf8, pos, cp);
    length += cp > 0xFFFF ? 2 : 1;
  }
  return length;
}

namespace {

bool is_js_space(char32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return true;
  if (cp < 0xA0) return false;
  return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

}  // namespace

size_t js_space_at(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 0;
  const auto first = static_cast<unsigned char>(text[pos]);
  if (first < 0x80) return is_js_space(first) ? 1 : 0;
  size_t next = pos;
  char32_t cp = 0;
  if (!unicode::next_code_point(text, next, cp)) return 0;
  return is_js_space(cp) ? next - pos : 0;
}

size_t js_space_before(std::string_view text, size_t end) {
  if (end == 0) return 0;
  if (static_cast<unsigned char>(text[end - 1]) < 0x80)
    return is_js_space(static_cast<unsigned char>(text[end - 1])) ? 1 : 0;
  // Step back over continuation bytes to the lead byte (at most 4 bytes per character).
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return js_space_at(text, start) == end - start ? end - start : 0;
}

std::string_view js_trim_start(std::string_view text) {
  size_t pos = 0;
  while (size_t n = js_space_at(text, pos)) pos += n;
  return text.substr(pos);
}

std::string_view js_trim_end(std::string_view text) {
  size_t end = text.size();
  while (size_t n = js_space_before(text, end)) end -= n;
  return text.substr(0, end);
}

}  // namespace infera::jinja
