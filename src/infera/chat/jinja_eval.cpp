#include "infera/chat/jinja_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include "infera/tokenizer/unicode.h"

namespace infera::jinja {

const Value* Scope::lookup(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent_) {
    for (const auto& [k, v] : s->variables_) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Scope::set(std::string_view name, Value value) {
  for (auto& [k, v] : variables_) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  variables_.emplace_back(std::string(name), std::move(value));
}

namespace {

// A problem without a position yet; eval() attaches the offset of the node it was in.
struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void eval_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw EvalError(fmt::format(f, std::forward<Args>(args)...));
}

struct BreakSignal {};
struct ContinueSignal {};

constexpr int kMaxCallDepth = 256;  // macro recursion
constexpr int64_t kMaxRangeLength = 1 << 20;  // range(): a template must not exhaust memory
// One render's budget (a template runs on every request, so it must end, and soon): every
// statement and expression evaluated and every loop iteration is a step, and every 64
// bytes of string a step produces (8 list items) cost one more. Real chat templates take
// about 50 steps per message: a 4 MB conversation of 40,000 short messages, 2 million.
constexpr int64_t kMaxRenderSteps = 10'000'000;
constexpr size_t kMaxStringBytes = size_t{64} << 20;  // any one string, the output included
constexpr size_t kMaxListItems = size_t{1} << 22;  // a list built by '+'

// ---------------------------------------------------------------- strings

std::vector<std::string> code_points(std::string_view text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    char32_t cp = 0;
    unicode::next_code_point(text, pos, cp);
    out.emplace_back(text.substr(start, pos - start));
  }
  return out;
}

// Unicode case mapping (utf8proc; chat_template.h says where it differs from the reference).
std::string to_upper(std::string_view s) { return unicode::to_upper(s); }
std::string to_lower(std::string_view s) { return unicode::to_lower(s); }

bool is_ascii_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// The reference's title(): /\b\w/g upper-cased (ASCII word characters; the rest of each
// word is left as is, unlike Python).
std::string title_case(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    if (is_ascii_word(out[i]) && (i == 0 || !is_ascii_word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z') {
      out[i] = static_cast<char>(out[i] - 32);
    }
  }
  return out;
}

std::string capitalize(std::string_view s) {
  if (s.empty()) return "";
  size_t pos = 0;
  char32_t cp = 0;
  unicode::next_code_point(s, pos, cp);
  return to_upper(s.substr(0, pos)) + std::string(s.substr(pos));
}

std::string js_trim(std::string_view s) { return std::string(js_trim_end(js_trim_start(s))); }

// Python's str.strip(chars): removes any of the given characters (code points).
std::string strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  const std::vector<std::string> set = code_points(chars);
  auto starts_with_one = [&](std::string_view t) -> size_t {
    for (const std::string& c : set) {
      if (t.substr(0, c.size()) == c) return c.size();
    }
    return 0;
  };
  auto ends_with_one = [&](std::string_view t) -> size_t {
    for (const std::string& c : set) {
      if (t.size() >= c.size() && t.substr(t.size() - c.size()) == c) return c.size();
    }
    return 0;
  };
  if (left) {
    while (size_t n = starts_with_one(s)) s.remove_prefix(n);
  }
  if (right) {
    while (size_t n = ends_with_one(s)) s.remove_suffix(n);
  }
  return std::string(s);
}

std::vector<std::string> split_all(std::string_view s, std::string_view sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t found = s.find(sep, start);
    if (found == std::string_view::npos) break;
    parts.emplace_back(s.substr(start, found - start));
    start = found + sep.size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

std::string join_strings(const std::vector<std::string>& parts, std::string_view sep, size_t begin = 0) {
  std::string out;
  for (size_t i = begin; i < parts.size(); ++i) {
    if (i > begin) out += sep;
    out += parts[i];
  }
  return out;
}

// Python's str.replace(old, new, count) (an empty `old` inserts between characters).
std::string replace_string(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  if (count == 0) return std::string(s);
  int64_t remaining = count < 0 ? INT64_MAX : count;
  std::string out;
  if (from.empty()) {
    const std::vector<std::string> chars = code_points(s);
    for (size_t i = 0; i <= chars.size(); ++i) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      if (i < chars.size()) out += chars[i];
    }
    return out;
  }
  size_t start = 0;
  while (remaining > 0) {
    const size_t found = s.find(from, start);
    if (found == std::string_view::npos) break;
    out.append(s.substr(start, found - start));
    out += to;
    start = found + from.size();
    --remaining;
  }
  out.append(s.substr(start));
  return out;
}

// JavaScript's ToNumber(string), for `==` between a number and a string.
double js_string_to_number(std::string_view text) {
  const std::string s = js_trim(text);
  if (s.empty()) return 0;
  if (s == "Infinity" || s == "+Infinity") return INFINITY;
  if (s == "-Infinity") return -INFINITY;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    char* end = nullptr;
    const double v = static_cast<double>(std::strtoull(s.c_str() + 2, &end, 16));
    return *end == '\0' ? v : NAN;
  }
  size_t i = 0;
  if (s[i] == '+' || s[i] == '-') ++i;
  bool digits = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, digits = true;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, digits = true;
  }
  if (!digits) return NAN;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    bool exp_digits = false;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, exp_digits = true;
    if (!exp_digits) return NAN;
  }
  if (i != s.size()) return NAN;
  return std::strtod(s.c_str(), nullptr);
}

// parseInt(s, 10) / parseFloat(s): the longest numeric prefix after leading blanks.
std::optional<int64_t> js_parse_int(std::string_view text) {
  const std::string s(js_trim_start(text));
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t digits_start = i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == digits_start) return std::nullopt;
  return static_cast<int64_t>(std::strtod(s.substr(0, i).c_str(), nullptr));
}
std::optional<double> js_parse_float(std::string_view text) {
  const std::string s(js_trim_start(text));
  for (std::string_view inf : {"Infinity", "+Infinity", "-Infinity"}) {
    if (s.substr(0, inf.size()) == inf) return inf[0] == '-' ? -INFINITY : INFINITY;
  }
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  bool digits = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, digits = true;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, digits = true;
  }
  if (!digits) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exp_start = j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j > exp_start) i = j;
  }
  return std::strtod(s.substr(0, i).c_str(), nullptr);
}

// ---------------------------------------------------------------- equality and order

enum class JsType { kUndefined, kNull, kBoolean, kNumber, kString, kObject };

JsType js_type(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return JsType::kUndefined;
    case Value::Kind::kNone: return JsType::kNull;
    case Value::Kind::kBool: return JsType::kBoolean;
    case Value::Kind::kInt:
    case Value::Kind::kFloat: return JsType::kNumber;
    case Value::Kind::kString: return JsType::kString;
    default: return JsType::kObject;
  }
}

// JavaScript ===, which the reference uses for `in`, `unique` and the equalto test.
bool strict_equal(const Value& a, const Value& b) {
  const JsType ta = js_type(a);
  if (ta != js_type(b)) return false;
  switch (ta) {
    case JsType::kUndefined:
    case JsType::kNull: return true;
    case JsType::kBoolean: return a.as_bool() == b.as_bool();
    case JsType::kNumber:
      if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
      return a.as_number() == b.as_number();
    case JsType::kString: return a.as_string() == b.as_string();
    case JsType::kObject: return a.identity() == b.identity();
  }
  return false;
}

// JavaScript ==, which the reference uses for Jinja's == and != (so none == undefined,
// 1 == "1", and two lists are equal only if they are the same list).
bool loose_equal(const Value& a, const Value& b) {
  const JsType ta = js_type(a), tb = js_type(b);
  if (ta == tb) return strict_equal(a, b);
  const bool a_nullish = ta == JsType::kUndefined || ta == JsType::kNull;
  const bool b_nullish = tb == JsType::kUndefined || tb == JsType::kNull;
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  if (ta == JsType::kBoolean) return loose_equal(Value(a.as_bool() ? int64_t{1} : int64_t{0}), b);
  if (tb == JsType::kBoolean) return loose_equal(a, Value(b.as_bool() ? int64_t{1} : int64_t{0}));
  if (ta == JsType::kNumber && tb == JsType::kString) return a.as_number() == js_string_to_number(b.as_string());
  if (ta == JsType::kString && tb == JsType::kNumber) return js_string_to_number(a.as_string()) == b.as_number();
  if (ta == JsType::kObject && (tb == JsType::kString || tb == JsType::kNumber))
    return loose_equal(Value(to_js_string(a)), b);
  if (tb == JsType::kObject && (ta == JsType::kString || ta == JsType::kNumber))
    return loose_equal(a, Value(to_js_string(b)));
  return false;
}

// Ordering for sort / dictsort: numbers (and booleans) with numbers, strings with strings.
int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_none() && b.is_none()) return 0;
  if (a.is_undefined() && b.is_undefined()) return 0;
  const bool a_num = a.is_number() || a.is_bool(), b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    const double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const std::string x = case_sensitive ? a.as_string() : to_lower(a.as_string());
    const std::string y = case_sensitive ? b.as_string() : to_lower(b.as_string());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  eval_fail("cannot compare a {} with a {}", a.type_name(), b.type_name());
}

// `attribute="a.b.0"` paths of sort / map.
Value attribute_path(const Value& item, std::string_view path) {
  Value value = item;
  for (const std::string& part : split_all(path, ".")) {
    if (value.is_object() || value.is_namespace()) {
      const Value* found = value.as_object().find(part);
      if (!found) return Value();
      value = *found;
    } else if (value.is_array()) {
      char* end = nullptr;
      const long index = std::strtol(part.c_str(), &end, 10);
      if (part.empty() || end == part.c_str() || index < 0 || static_cast<size_t>(index) >= value.as_array().size()) {
        return Value();
      }
      value = value.as_array()[static_cast<size_t>(index)];
    } else {
      return Value();
    }
  }
  return value;
}

// The reference's Python-style slice (utils.ts slice()), on any indexable sequence.
std::vector<size_t> slice_indexes(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop,
                                  int64_t step) {
  std::vector<size_t> out;
  const int direction = step > 0 ? 1 : step < 0 ? -1 : 0;
  int64_t begin = 0, end = 0;
  if (direction >= 0) {
    begin = start.value_or(0);
    begin = begin < 0 ? std::max<int64_t>(length + begin, 0) : std::min(begin, length);
    end = stop.value_or(length);
    end = end < 0 ? std::max<int64_t>(length + end, 0) : std::min(end, length);
  } else {
    begin = start.value_or(length - 1);
    begin = begin < 0 ? std::max<int64_t>(length + begin, -1) : std::min(begin, length - 1);
    end = stop.value_or(-1);
    end = end < -1 ? std::max<int64_t>(length + end, -1) : std::min(end, length - 1);
  }
  if (direction == 0) return out;
  for (int64_t i = begin; direction * i < direction * end; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

// ---------------------------------------------------------------- tests (`x is name`)

bool run_test(const std::string& name, const Value& v, const ValueList& args) {
  auto arg = [&](size_t i) -> const Value& {
    static const Value undefined;
    return i < args.size() ? args[i] : undefined;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "callable") return v.is_function();
  // As in the reference: a dict is a mapping and a sequence but not "iterable".
  if (name == "iterable") return v.is_array() || v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (name == "lower") return v.is_string() && to_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && to_upper(v.as_string()) == v.as_string();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) eval_fail("test '{}' needs an integer, got a {}", name, v.type_name());
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return strict_equal(v, arg(0));
  if (name == "ne" || name == "!=") return !strict_equal(v, arg(0));
  if (name == "in") {
    const Value& container = arg(0);
    if (container.is_array()) {
      return std::any_of(container.as_array().begin(), container.as_array().end(),
                         [&](const Value& x) { return strict_equal(x, v); });
    }
    if (container.is_string() && v.is_string()) return container.as_string().find(v.as_string()) != std::string::npos;
    if (container.is_object() && v.is_string()) return container.as_object().find(v.as_string()) != nullptr;
    eval_fail("test 'in' needs a list, string or dict argument, got a {}", container.type_name());
  }
  if (name == "gt" || name == "ge" || name == "lt" || name == "le" || name == "greaterthan" || name == "lessthan") {
    const int c = compare_values(v, arg(0), true);
    if (name == "gt" || name == "greaterthan") return c > 0;
    if (name == "ge") return c >= 0;
    if (name == "lt" || name == "lessthan") return c < 0;
    return c <= 0;
  }
  if (name == "divisibleby") {
    if (!v.is_int() || !arg(0).is_int() || arg(0).as_int() == 0) eval_fail("test 'divisibleby' needs integers");
    return v.as_int() % arg(0).as_int() == 0;
  }
  eval_fail("unknown test '{}'", name);
}

// ---------------------------------------------------------------- built-in methods

Value bound(Function fn) { return Value::function(std::move(fn)); }

const Value& positional_or_undefined(const Args& args, size_t i) {
  static const Value undefined;
  return i < args.positional.size() ? args.positional[i] : undefined;
}

std::string expect_string_arg(const Args& args, size_t i, const char* method) {
  const Value& v = positional_or_undefined(args, i);
  if (!v.is_string()) eval_fail("{}() argument {} must be a string, got a {}", method, i + 1, v.type_name());
  return v.as_string();
}

Value string_split(const std::string& s, const Args& args, bool from_right) {
  const char* name = from_right ? "rsplit" : "split";
  const Value* sep = args.get(0, "sep");
  const Value* maxsplit_v = args.get(1, "maxsplit");
  int64_t maxsplit = -1;
  if (maxsplit_v) {
    if (!maxsplit_v->is_int()) eval_fail("{}() maxsplit must be an integer", name);
    maxsplit = maxsplit_v->as_int();
  }
  ValueList out;
  if (!sep || sep->is_none() || sep->is_undefined()) {
    // Runs of whitespace separate; no empty strings at either end.
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end)
    size_t pos = 0;
    while (pos < s.size()) {
      while (size_t n = js_space_at(s, pos)) pos += n;
      if (pos >= s.size()) break;
      const size_t begin = pos;
      while (pos < s.size() && js_space_at(s, pos) == 0) ++pos;
      words.emplace_back(begin, pos);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit) {
      const size_t keep = static_cast<size_t>(maxsplit);
      if (!from_right) {
        for (size_t i = 0; i < keep; ++i) out.emplace_back(s.substr(words[i].first, words[i].second - words[i].first));
        out.emplace_back(s.substr(words[keep].first));  // the rest, trailing blanks included
      } else {
        const size_t split_from = words.size() - keep;
        out.emplace_back(s.substr(0, words[split_from - 1].second));
        for (size_t i = split_from; i < words.size(); ++i) {
          out.emplace_back(s.substr(words[i].first, words[i].second - words[i].first));
        }
        out.front() = Value(std::string(js_trim_start(out.front().as_string())));
      }
      return Value::array(std::move(out));
    }
    for (const auto& [b, e] : words) out.emplace_back(s.substr(b, e - b));
    return Value::array(std::move(out));
  }
  if (!sep->is_string()) eval_fail("{}() separator must be a string or none", name);
  if (sep->as_string().empty()) eval_fail("{}(): empty separator", name);
  std::vector<std::string> parts = split_all(s, sep->as_string());
  if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) > maxsplit + 1) {
    const size_t keep = static_cast<size_t>(maxsplit);
    std::vector<std::string> merged;
    if (!from_right) {
      merged.assign(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(keep));
      merged.push_back(join_strings(parts, sep->as_string(), keep));
    } else {
      const size_t head = parts.size() - keep;
      std::vector<std::string> first(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(head));
      merged.push_back(join_strings(first, sep->as_string()));
      merged.insert(merged.end(), parts.begin() + static_cast<std::ptrdiff_t>(head), parts.end());
    }
    parts = std::move(merged);
  }
  for (std::string& p : parts) out.emplace_back(std::move(p));
  return Value::array(std::move(out));
}

Value string_replace(const std::string& s, const Args& args) {
  if (args.positional.size() < 2) eval_fail("replace() needs two arguments: old and new");
  const std::string from = expect_string_arg(args, 0, "replace");
  const std::string to = expect_string_arg(args, 1, "replace");
  int64_t count = -1;
  if (const Value* c = args.get(2, "count"); c && !c->is_none()) {
    if (!c->is_int()) eval_fail("replace() count must be an integer");
    count = c->as_int();
  }
  return Value(replace_string(s, from, to, count));
}

bool string_affix_test(const std::string& s, const Args& args, bool prefix) {
  const char* name = prefix ? "startswith" : "endswith";
  if (args.positional.empty()) eval_fail("{}() needs an argument", name);
  auto test = [&](const std::string& affix) {
    if (affix.size() > s.size()) return false;
    return prefix ? s.compare(0, affix.size(), affix) == 0
                  : s.compare(s.size() - affix.size(), affix.size(), affix) == 0;
  };
  const Value& pattern = args.positional[0];
  if (pattern.is_string()) return test(pattern.as_string());
  if (pattern.is_array()) {
    for (const Value& item : pattern.as_array()) {
      if (!item.is_string()) eval_fail("{}() tuple elements must be strings", name);
      if (test(item.as_string())) return true;
    }
    return false;
  }
  eval_fail("{}() argument must be a string or a tuple of strings", name);
}

// Python's strip family: whitespace by default, else the characters given. (The reference
// ignores the argument and always strips whitespace; with templates' usual '\n' the two
// agree unless spaces border the newlines.)
Value string_strip(const std::string& s, const Args& args, bool left, bool right) {
  const Value* chars = args.get(0, "chars");
  if (chars && chars->is_string()) return Value(strip_chars(s, chars->as_string(), left, right));
  if (chars && !chars->is_none() && !chars->is_undefined()) eval_fail("strip() argument must be a string or none");
  std::string_view view = s;
  if (left) view = js_trim_start(view);
  if (right) view = js_trim_end(view);
  return Value(std::string(view));
}

Value string_method(const std::string& s, const std::string& name) {
  if (name == "length") return Value(static_cast<int64_t>(js_string_length(s)));
  if (name == "upper") return bound([s](const Args&, Scope&) { return Value(to_upper(s)); });
  if (name == "lower") return bound([s](const Args&, Scope&) { return Value(to_lower(s)); });
  if (name == "title") return bound([s](const Args&, Scope&) { return Value(title_case(s)); });
  if (name == "capitalize") return bound([s](const Args&, Scope&) { return Value(capitalize(s)); });
  if (name == "strip") return bound([s](const Args& a, Scope&) { return string_strip(s, a, true, true); });
  if (name == "lstrip") return bound([s](const Args& a, Scope&) { return string_strip(s, a, true, false); });
  if (name == "rstrip") return bound([s](const Args& a, Scope&) { return string_strip(s, a, false, true); });
  if (name == "startswith") return bound([s](const Args& a, Scope&) { return Value(string_affix_test(s, a, true)); });
  if (name == "endswith") return bound([s](const Args& a, Scope&) { return Value(string_affix_test(s, a, false)); });
  if (name == "split") return bound([s](const Args& a, Scope&) { return string_split(s, a, false); });
  if (name == "rsplit") return bound([s](const Args& a, Scope&) { return string_split(s, a, true); });
  if (name == "replace") return bound([s](const Args& a, Scope&) { return string_replace(s, a); });
  // Beyond the reference: Python's find / count / join on strings.
  if (name == "find") {
    return bound([s](const Args& a, Scope&) {
      const size_t found = s.find(expect_string_arg(a, 0, "find"));
      return Value(found == std::string::npos
                       ? int64_t{-1}
                       : static_cast<int64_t>(js_string_length(std::string_view(s).substr(0, found))));
    });
  }
  if (name == "count") {
    return bound([s](const Args& a, Scope&) {
      const std::string needle = expect_string_arg(a, 0, "count");
      if (needle.empty()) return Value(static_cast<int64_t>(code_points(s).size() + 1));
      int64_t n = 0;
      for (size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + needle.size())) ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return bound([s](const Args& a, Scope&) {
      const Value& items = positional_or_undefined(a, 0);
      if (!items.is_array()) eval_fail("join() needs a list");
      std::string out;
      for (size_t i = 0; i < items.as_array().size(); ++i) {
        if (i) out += s;
        const Value& item = items.as_array()[i];
        if (!item.is_string()) eval_fail("join() items must be strings, got a {}", item.type_name());
        out += item.as_string();
      }
      return Value(out);
    });
  }
  return Value();
}

Value object_items(const Value& object) {
  ValueList items;
  for (const auto& [k, v] : object.as_object().entries) items.push_back(Value::array({Value(k), v}));
  return Value::array(std::move(items));
}
Value object_keys(const Value& object) {
  ValueList keys;
  for (const auto& [k, v] : object.as_object().entries) keys.emplace_back(k);
  return Value::array(std::move(keys));
}
Value object_values(const Value& object) {
  ValueList values;
  for (const auto& [k, v] : object.as_object().entries) values.push_back(v);
  return Value::array(std::move(values));
}

Value object_dictsort(const Value& object, const Args& args) {
  const Value* case_sensitive = args.get(0, "case_sensitive");
  const Value* by = args.get(1, "by");
  const Value* reverse = args.get(2, "reverse");
  if (case_sensitive && !case_sensitive->is_bool()) eval_fail("dictsort(): case_sensitive must be a boolean");
  if (by && !(by->is_string() && (by->as_string() == "key" || by->as_string() == "value"))) {
    eval_fail("dictsort(): by must be 'key' or 'value'");
  }
  if (reverse && !reverse->is_bool()) eval_fail("dictsort(): reverse must be a boolean");
  const bool cs = case_sensitive && case_sensitive->as_bool();
  const size_t index = by && by->as_string() == "value" ? 1 : 0;
  const bool rev = reverse && reverse->as_bool();
  ValueList items = object_items(object).as_array();
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c = compare_values(a.as_array()[index], b.as_array()[index], cs);
    return rev ? c > 0 : c < 0;
  });
  return Value::array(std::move(items));
}

Value object_method(const Value& object, const std::string& name) {
  if (name == "get") {
    return bound([object](const Args& a, Scope&) {
      const Value& key = positional_or_undefined(a, 0);
      if (!key.is_string()) eval_fail("get() key must be a string, got a {}", key.type_name());
      if (const Value* found = object.as_object().find(key.as_string())) return *found;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    });
  }
  if (name == "items") return bound([object](const Args&, Scope&) { return object_items(object); });
  if (name == "keys") return bound([object](const Args&, Scope&) { return object_keys(object); });
  if (name == "values") return bound([object](const Args&, Scope&) { return object_values(object); });
  if (name == "dictsort") return bound([object](const Args& a, Scope&) { return object_dictsort(object, a); });
  return Value();
}

// ---------------------------------------------------------------- global functions

Value fn_namespace(const Args& args, Scope&) {
  if (args.positional.size() > 1) eval_fail("namespace() takes at most one positional argument");
  Object entries;
  if (args.positional.size() == 1) {
    const Value& source = args.positional[0];
    if (source.is_object()) {
      entries = source.as_object();
    } else if (source.is_array()) {
      for (const Value& pair : source.as_array()) {
        if (!pair.is_array() || pair.as_array().size() != 2 || !pair.as_array()[0].is_string()) {
          eval_fail("namespace() expects a dict or a list of [key, value] pairs");
        }
        entries.set(pair.as_array()[0].as_string(), pair.as_array()[1]);
      }
    } else {
      eval_fail("namespace() expects a dict or a list of [key, value] pairs, got a {}", source.type_name());
    }
  }
  for (const auto& [k, v] : args.keyword) entries.set(k, v);
  return Value::namespace_(std::move(entries));
}

Value fn_raise_exception(const Args& args, Scope&) {
  throw RaiseError(args.positional.empty() ? "" : to_js_string(args.positional[0]));
}

Value fn_range(const Args& args, Scope&) {
  if (args.positional.empty() || args.positional.size() > 3) eval_fail("range() takes 1 to 3 integer arguments");
  for (const Value& v : args.positional) {
    if (!v.is_int()) eval_fail("range() arguments must be integers, got a {}", v.type_name());
  }
  int64_t start = 0, stop = 0, step = 1;
  if (args.positional.size() == 1) {
    stop = args.positional[0].as_int();
  } else {
    start = args.positional[0].as_int();
    stop = args.positional[1].as_int();
    if (args.positional.size() == 3) step = args.positional[2].as_int();
  }
  if (step == 0) eval_fail("range() step must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRangeLength) eval_fail("range() longer than {} items", kMaxRangeLength);
    out.emplace_back(i);
  }
  return Value::array(std::move(out));
}

// strftime with the directives the reference knows (%Y %m %d %b %B %H %M %%), local time.
Value fn_strftime_now(const Args& args, Scope&) {
  const std::string format = expect_string_arg(args, 0, "strftime_now");
  static const char* kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                                  "July",    "August",   "September", "October", "November", "December"};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    const char d = format[++i];
    switch (d) {
      case 'Y': out += std::to_string(tm.tm_year + 1900); break;
      case 'm': out += fmt::format("{:02d}", tm.tm_mon + 1); break;
      case 'd': out += fmt::format("{:02d}", tm.tm_mday); break;
      case 'b': out += std::string(kMonths[tm.tm_mon]).substr(0, 3); break;
      case 'B': out += kMonths[tm.tm_mon]; break;
      case 'H': out += fmt::format("{:02d}", tm.tm_hour); break;
      case 'M': out += fmt::format("{:02d}", tm.tm_min); break;
      case '%': out += '%'; break;
      default: out += '%'; out += d;
    }
  }
  return Value(out);
}

// ---------------------------------------------------------------- the evaluator

class Evaluator {
 public:
  std::string render(const Program& program, const Object& globals) {
    Scope root;
    root.set("namespace", Value::function(fn_namespace));
    root.set("raise_exception", Value::function(fn_raise_exception));
    root.set("range", Value::function(fn_range));
    root.set("strftime_now", Value::function(fn_strftime_now));
    for (const char* name : {"true", "True"}) root.set(name, Value(true));
    for (const char* name : {"false", "False"}) root.set(name, Value(false));
    for (const char* name : {"none", "None"}) root.set(name, Value::none());
    Scope context(&root);  // the caller's variables shadow the built-ins
    for (const auto& [k, v] : globals.entries) context.set(k, v);
    std::string out;
    try {
      exec_block(program.body, context, out);
    } catch (const BreakSignal&) {
      throw SourceError("{% break %} outside a for loop", 0);
    } catch (const ContinueSignal&) {
      throw SourceError("{% continue %} outside a for loop", 0);
    }
    return out;
  }

 private:
  void exec_block(const std::vector<NodePtr>& body, Scope& scope, std::string& out) {
    for (const NodePtr& node : body) exec(*node, scope, out);
  }

  void charge(int64_t steps) {
    steps_ += steps;
    if (steps_ > kMaxRenderSteps) {
      eval_fail("the template ran past its budget of {} evaluation steps (an endless or runaway loop?)",
                kMaxRenderSteps);
    }
  }

  void exec(const Node& node, Scope& scope, std::string& out) {
    try {
      const size_t before = out.size();
      charge(1);
      exec_inner(node, scope, out);
      if (out.size() > kMaxStringBytes) eval_fail("the template output grew past {} bytes", kMaxStringBytes);
      if (out.size() > before) charge(static_cast<int64_t>((out.size() - before) / 64));
    } catch (const EvalError& e) {
      throw SourceError(e.what(), node.offset);
    }
  }

  void exec_inner(const Node& node, Scope& scope, std::string& out) {
    switch (node.kind) {
      case NodeKind::kText: out += node.text; return;
      case NodeKind::kComment: return;
      case NodeKind::kMacro: define_macro(node, scope); return;
      case NodeKind::kIf: exec_block(eval(*node.a, scope).truthy() ? node.body : node.alternate, scope, out); return;
      case NodeKind::kFor: exec_for(node, scope, out); return;
      case NodeKind::kSet: exec_set(node, scope); return;
      case NodeKind::kBreak: throw BreakSignal{};
      case NodeKind::kContinue: throw ContinueSignal{};
      case NodeKind::kFilterBlock: {
        std::string inner;
        exec_block(node.body, scope, inner);
        out += to_output_string(apply_filter(node, Value(std::move(inner)), scope));
        return;
      }
      default: {
        const Value v = eval(node, scope);
        if (!v.is_none() && !v.is_undefined()) out += to_output_string(v);
      }
    }
  }

  void exec_for(const Node& node, Scope& scope, std::string& out) {
    Scope loop_scope(&scope);
    const Value iterable = eval(*node.a, loop_scope);
    ValueList source;
    if (iterable.is_array()) {
      source = iterable.as_array();
    } else if (iterable.is_object()) {
      source = object_keys(iterable).as_array();
    } else if (iterable.is_string()) {  // beyond the reference, as in Python: characters
      for (std::string& c : code_points(iterable.as_string())) source.emplace_back(std::move(c));
    } else if (!iterable.is_undefined()) {  // undefined iterates as empty, as in Jinja
      eval_fail("cannot loop over a {}", iterable.type_name());
    }
    auto bind = [&](Scope& target, const Value& item) {
      if (!node.flag) {
        target.set(node.names[0], item);
        return;
      }
      if (!item.is_array()) eval_fail("cannot unpack a {} into {} loop variables", item.type_name(), node.names.size());
      if (item.as_array().size() != node.names.size()) {
        eval_fail("cannot unpack {} values into {} loop variables", item.as_array().size(), node.names.size());
      }
      for (size_t j = 0; j < node.names.size(); ++j) target.set(node.names[j], item.as_array()[j]);
    };
    ValueList items;
    if (node.b) {  // for x in xs if cond: filter first, so loop.* count the kept items
      for (const Value& item : source) {
        charge(1);
        Scope test_scope(&loop_scope);
        bind(test_scope, item);
        if (eval(*node.b, test_scope).truthy()) items.push_back(item);
      }
    } else {
      items = std::move(source);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      charge(1);  // an iteration is a step even when its body is empty
      Object loop;
      loop.entries.reserve(9);
      loop.entries.emplace_back("index", Value(i + 1));
      loop.entries.emplace_back("index0", Value(i));
      loop.entries.emplace_back("revindex", Value(n - i));
      loop.entries.emplace_back("revindex0", Value(n - i - 1));
      loop.entries.emplace_back("first", Value(i == 0));
      loop.entries.emplace_back("last", Value(i == n - 1));
      loop.entries.emplace_back("length", Value(n));
      loop.entries.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
      loop.entries.emplace_back("nextitem", i < n - 1 ? items[static_cast<size_t>(i + 1)] : Value());
      loop_scope.set("loop", Value::object(std::move(loop)));
      bind(loop_scope, items[static_cast<size_t>(i)]);
      // Output before a break/continue is kept, as in Jinja (the reference drops it).
      try {
        exec_block(node.body, loop_scope, out);
      } catch (const ContinueSignal&) {
        continue;
      } catch (const BreakSignal&) {
        break;
      }
    }
    if (items.empty()) exec_block(node.alternate, loop_scope, out);
  }

  void exec_set(const Node& node, Scope& scope) {
    Value value;
    if (node.b) {
      value = eval(*node.b, scope);
    } else {
      std::string rendered;
      exec_block(node.body, scope, rendered);
      value = Value(std::move(rendered));
    }
    const Node& target = *node.a;
    if (target.kind == NodeKind::kIdentifier) {
      scope.set(target.text, std::move(value));
    } else if (target.kind == NodeKind::kTuple) {
      if (!value.is_array()) eval_fail("cannot unpack a {} in set", value.type_name());
      if (value.as_array().size() != target.items.size()) {
        eval_fail("cannot unpack {} values into {} names", value.as_array().size(), target.items.size());
      }
      for (size_t i = 0; i < target.items.size(); ++i) {
        if (target.items[i]->kind != NodeKind::kIdentifier) eval_fail("can only unpack into names");
        scope.set(target.items[i]->text, value.as_array()[i]);
      }
    } else {  // kMember
      const Value object = eval(*target.a, scope);
      if (!object.is_namespace()) {
        eval_fail("cannot set an attribute of a {}; only namespace() objects can be changed", object.type_name());
      }
      if (target.flag || target.b->kind != NodeKind::kString) eval_fail("set namespace attributes as ns.name");
      object.mutable_object().set(target.b->text, std::move(value));
    }
  }

  void define_macro(const Node& node, Scope& scope) {
    const Node* macro = &node;
    // Called with the caller's scope as parent (dynamic scoping, as in the reference).
    scope.set(node.text, Value::function([this, macro](const Args& args, Scope& caller) {
                if (++call_depth_ > kMaxCallDepth) {
                  call_depth_ = 0;
                  eval_fail("macro calls nested deeper than {} (runaway recursion?)", kMaxCallDepth);
                }
                Scope local(&caller);
                std::vector<std::pair<std::string, bool>> keyword_used;
                for (const auto& [k, v] : args.keyword) keyword_used.emplace_back(k, false);
                std::vector<const std::pair<std::string, NodePtr>*> pending_defaults;
                for (size_t i = 0; i < macro->kwargs.size(); ++i) {
                  const auto& param = macro->kwargs[i];
                  std::optional<Value> value;
                  if (i < args.positional.size()) {
                    value = args.positional[i];
                  } else {
                    for (size_t k = 0; k < args.keyword.size(); ++k) {
                      if (args.keyword[k].first == param.first) {
                        value = args.keyword[k].second;
                        keyword_used[k].second = true;
                      }
                    }
                  }
                  if (!value && param.second) pending_defaults.push_back(&param);
                  local.set(param.first, value.value_or(Value()));
                }
                for (const auto& [k, used] : keyword_used) {
                  if (!used) eval_fail("macro '{}' has no parameter named '{}'", macro->text, k);
                }
                if (args.positional.size() > macro->kwargs.size()) {
                  eval_fail("macro '{}' takes at most {} arguments, got {}", macro->text, macro->kwargs.size(),
                            args.positional.size());
                }
                for (const auto* param : pending_defaults) local.set(param->first, eval(*param->second, local));
                std::string out;
                exec_block(macro->body, local, out);
                --call_depth_;
                return Value(std::move(out));
              }));
  }

  Value eval(const Node& node, Scope& scope) {
    try {
      charge(1);
      Value v = eval_inner(node, scope);
      if (v.is_string()) {
        if (v.as_string().size() > kMaxStringBytes) eval_fail("a string grew past {} bytes", kMaxStringBytes);
        charge(static_cast<int64_t>(v.as_string().size() / 64));
      } else if (v.is_array() && (node.kind == NodeKind::kCall || node.kind == NodeKind::kFilter)) {
        charge(static_cast<int64_t>(v.as_array().size() / 8));  // a new list (range(), split(), map, ...)
      }
      return v;
    } catch (const EvalError& e) {
      throw SourceError(e.what(), node.offset);
    } catch (const std::runtime_error& e) {
      if (dynamic_cast<const SourceError*>(&e) || dynamic_cast<const RaiseError*>(&e)) throw;
      throw SourceError(e.what(), node.offset);
    }
  }

  Args eval_args(const Node& node, Scope& scope) {
    Args args;
    for (const NodePtr& item : node.items) args.positional.push_back(eval(*item, scope));
    for (const auto& [name, expr] : node.kwargs) args.keyword.emplace_back(name, eval(*expr, scope));
    return args;
  }

  Value eval_inner(const Node& node, Scope& scope) {
    switch (node.kind) {
      case NodeKind::kText:
      case NodeKind::kString: return Value(node.text);
      case NodeKind::kInt: return Value(node.int_value);
      case NodeKind::kFloat: return Value(node.float_value);
      case NodeKind::kArray:
      case NodeKind::kTuple: {
        ValueList items;
        for (const NodePtr& item : node.items) items.push_back(eval(*item, scope));
        return Value::array(std::move(items), node.kind == NodeKind::kTuple);
      }
      case NodeKind::kDict: {
        Object object;
        for (size_t i = 0; i < node.items.size(); ++i) {
          const Value key = eval(*node.items[i], scope);
          if (!key.is_string()) eval_fail("dict keys must be strings, got a {}", key.type_name());
          object.set(key.as_string(), eval(*node.values[i], scope));
        }
        return Value::object(std::move(object));
      }
      case NodeKind::kIdentifier: {
        const Value* v = scope.lookup(node.text);
        return v ? *v : Value();
      }
      case NodeKind::kMember: return eval_member(node, scope);
      case NodeKind::kCall: {
        Args args = eval_args(node, scope);
        const Value callee = eval(*node.a, scope);
        if (!callee.is_function()) {
          if (node.a->kind == NodeKind::kIdentifier) {
            eval_fail("'{}' is {}, not a function", node.a->text,
                      callee.is_undefined() ? "undefined" : callee.type_name());
          }
          eval_fail("a {} is not callable", callee.type_name());
        }
        return callee.as_function()(args, scope);
      }
      case NodeKind::kUnary: {
        const Value v = eval(*node.a, scope);
        if (node.text == "not") return Value(!v.truthy());
        if (!v.is_number() && !v.is_bool()) eval_fail("unary '{}' needs a number, got a {}", node.text, v.type_name());
        const bool negate = node.text == "-";
        if (v.is_float()) return Value(negate ? -v.as_float() : v.as_float());
        const int64_t i = v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int();
        return Value(negate ? -i : i);
      }
      case NodeKind::kBinary: return eval_binary(node, scope);
      case NodeKind::kFilter: return apply_filter(node, eval(*node.a, scope), scope);
      case NodeKind::kTest: {
        const Value operand = eval(*node.a, scope);
        ValueList args;
        for (const NodePtr& item : node.items) args.push_back(eval(*item, scope));
        return Value(run_test(node.text, operand, args) != node.flag);
      }
      case NodeKind::kTernary: return eval(*node.a, scope).truthy() ? eval(*node.b, scope) : eval(*node.c, scope);
      case NodeKind::kSelect: return eval(*node.b, scope).truthy() ? eval(*node.a, scope) : Value();
      case NodeKind::kSlice: eval_fail("a slice is only allowed inside [...]");
      default: eval_fail("statement used as an expression");
    }
  }

  Value eval_member(const Node& node, Scope& scope) {
    const Value object = eval(*node.a, scope);
    if (node.flag && node.b->kind == NodeKind::kSlice) return eval_slice(object, *node.b, scope);
    const Value property = eval(*node.b, scope);
    if (object.is_object() || object.is_namespace()) {
      if (!property.is_string())
        eval_fail("dict keys are strings; cannot index a {} with a {}", object.type_name(), property.type_name());
      if (const Value* found = object.as_object().find(property.as_string())) return *found;
      return object.is_object() ? object_method(object, property.as_string()) : Value();
    }
    if (object.is_array() || object.is_string()) {
      if (property.is_int()) {
        int64_t index = property.as_int();
        if (object.is_array()) {
          const auto size = static_cast<int64_t>(object.as_array().size());
          if (index < 0) index += size;
          return index >= 0 && index < size ? object.as_array()[static_cast<size_t>(index)] : Value();
        }
        const std::vector<std::string> chars = code_points(object.as_string());
        const auto size = static_cast<int64_t>(chars.size());
        if (index < 0) index += size;
        return index >= 0 && index < size ? Value(chars[static_cast<size_t>(index)]) : Value();
      }
      if (property.is_string()) {
        if (object.is_string()) return string_method(object.as_string(), property.as_string());
        if (property.as_string() == "length") return Value(static_cast<int64_t>(object.as_array().size()));
        return Value();
      }
      eval_fail("cannot index a {} with a {}", object.type_name(), property.type_name());
    }
    if (!property.is_string()) eval_fail("cannot index a {} with a {}", object.type_name(), property.type_name());
    return Value();  // attribute of undefined / none / a number: undefined
  }

  Value eval_slice(const Value& object, const Node& slice, Scope& scope) {
    if (!object.is_array() && !object.is_string()) eval_fail("cannot slice a {}", object.type_name());
    auto part = [&](const NodePtr& expr, const char* what) -> std::optional<int64_t> {
      if (!expr) return std::nullopt;
      const Value v = eval(*expr, scope);
      if (v.is_undefined()) return std::nullopt;
      if (!v.is_int()) eval_fail("slice {} must be an integer, got a {}", what, v.type_name());
      return v.as_int();
    };
    const auto start = part(slice.a, "start");
    const auto stop = part(slice.b, "stop");
    const int64_t step = part(slice.c, "step").value_or(1);
    if (object.is_array()) {
      const ValueList& items = object.as_array();
      ValueList out;
      for (size_t i : slice_indexes(static_cast<int64_t>(items.size()), start, stop, step)) out.push_back(items[i]);
      return Value::array(std::move(out));
    }
    const std::vector<std::string> chars = code_points(object.as_string());
    std::string out;
    for (size_t i : slice_indexes(static_cast<int64_t>(chars.size()), start, stop, step)) out += chars[i];
    return Value(out);
  }

  Value eval_binary(const Node& node, Scope& scope) {
    const std::string& op = node.text;
    const Value left = eval(*node.a, scope);
    if (op == "and") return left.truthy() ? eval(*node.b, scope) : left;
    if (op == "or") return left.truthy() ? left : eval(*node.b, scope);
    const Value right = eval(*node.b, scope);
    if (op == "==") return Value(loose_equal(left, right));
    if (op == "!=") return Value(!loose_equal(left, right));
    const bool membership = op == "in" || op == "not in";
    if (left.is_undefined() || right.is_undefined()) {
      if (right.is_undefined() && membership) return Value(op == "not in");
      eval_fail("'{}' on an undefined value", op);
    }
    if (left.is_none() || right.is_none()) eval_fail("'{}' on a none value", op);
    if (op == "~") return Value(to_js_string(left) + to_js_string(right));
    const bool left_numeric = left.is_number() || left.is_bool(), right_numeric = right.is_number() || right.is_bool();
    if (op == "**" && left_numeric && right_numeric) {
      const double a = left.as_number(), b = right.as_number();
      if (a == 0 && b < 0) eval_fail("0 cannot be raised to a negative power");
      const double result = std::pow(a, b);
      if (!std::isfinite(result)) eval_fail("'**' result is not a finite real number");
      if (left.is_float() || right.is_float() || b < 0) return Value(result);
      return Value(static_cast<int64_t>(result));
    }
    if (left.is_number() && right.is_number()) {
      const bool is_float = left.is_float() || right.is_float();
      const double a = left.as_number(), b = right.as_number();
      if (op == "+" || op == "-" || op == "*") {
        if (!is_float) {
          // Two's-complement wrap instead of signed-overflow UB.
          const auto x = static_cast<uint64_t>(left.as_int()), y = static_cast<uint64_t>(right.as_int());
          const uint64_t r = op == "+" ? x + y : op == "-" ? x - y : x * y;
          return Value(static_cast<int64_t>(r));
        }
        return Value(op == "+" ? a + b : op == "-" ? a - b : a * b);
      }
      if (op == "/") return Value(a / b);
      if (op == "//") {
        if (b == 0) eval_fail("integer division by zero");
        const double r = std::floor(a / b);
        return is_float ? Value(r) : Value(static_cast<int64_t>(r));
      }
      if (op == "%") {
        if (b == 0) eval_fail("modulo by zero");
        // JavaScript's remainder: the sign follows the dividend (the reference's choice).
        return is_float ? Value(std::fmod(a, b)) : Value(left.as_int() % right.as_int());
      }
      if (op == "<") return Value(a < b);
      if (op == ">") return Value(a > b);
      if (op == "<=") return Value(a <= b);
      if (op == ">=") return Value(a >= b);
    } else if (left.is_array() && right.is_array()) {
      if (op == "+") {
        if (left.as_array().size() + right.as_array().size() > kMaxListItems)
          eval_fail("a list grew past {} items", kMaxListItems);
        charge(static_cast<int64_t>((left.as_array().size() + right.as_array().size()) / 8));
        ValueList joined = left.as_array();
        joined.insert(joined.end(), right.as_array().begin(), right.as_array().end());
        return Value::array(std::move(joined));
      }
    } else if (right.is_array() && membership) {
      const bool found = std::any_of(right.as_array().begin(), right.as_array().end(),
                                     [&](const Value& x) { return strict_equal(x, left); });
      return Value(found == (op == "in"));
    }
    if ((left.is_string() || right.is_string()) && op == "+") return Value(to_js_string(left) + to_js_string(right));
    if (left.is_string() && right.is_string()) {
      if (membership) return Value((right.as_string().find(left.as_string()) != std::string::npos) == (op == "in"));
      // Beyond the reference: string ordering, as in Python.
      const int c = left.as_string().compare(right.as_string());
      if (op == "<") return Value(c < 0);
      if (op == ">") return Value(c > 0);
      if (op == "<=") return Value(c <= 0);
      if (op == ">=") return Value(c >= 0);
    }
    if (left.is_string() && right.is_object() && membership) {
      return Value((right.as_object().find(left.as_string()) != nullptr) == (op == "in"));
    }
    // Beyond the reference: Python's string repetition ('-' * 3).
    if (op == "*" && left.is_string() && right.is_int()) {
      std::string out;
      for (int64_t i = 0; i < right.as_int() && out.size() < (1u << 24); ++i) out += left.as_string();
      return Value(out);
    }
    eval_fail("unsupported operator '{}' between a {} and a {}", op, left.type_name(), right.type_name());
  }

  // ------------------------------------------------------------ filters

  Value apply_filter(const Node& node, const Value& operand, Scope& scope) {
    const std::string& name = node.text;
    if (name == "safe") return operand;
    if (name == "default" || name == "d") {
      Args args = eval_args(node, scope);
      const Value* fallback = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      if (boolean && !boolean->is_bool()) eval_fail("default(): boolean must be true or false");
      const bool use_fallback = operand.is_undefined() || (boolean && boolean->as_bool() && !operand.truthy());
      return use_fallback ? (fallback ? *fallback : Value("")) : operand;
    }
    if (name == "tojson") {
      Args args = eval_args(node, scope);
      JsonOptions options;
      if (const Value* indent = args.get(0, "indent"); indent && !indent->is_none()) {
        if (!indent->is_int()) eval_fail("tojson(): indent must be an integer");
        options.indent = static_cast<int>(indent->as_int());
      }
      if (const Value* v = args.keyword_arg("ensure_ascii")) {
        if (!v->is_bool()) eval_fail("tojson(): ensure_ascii must be a boolean");
        options.ensure_ascii = v->as_bool();
      }
      if (const Value* v = args.keyword_arg("sort_keys")) {
        if (!v->is_bool()) eval_fail("tojson(): sort_keys must be a boolean");
        options.sort_keys = v->as_bool();
      }
      if (const Value* v = args.keyword_arg("separators"); v && !v->is_none()) {
        if (!v->is_array() || v->as_array().size() != 2 || !v->as_array()[0].is_string() ||
            !v->as_array()[1].is_string()) {
          eval_fail("tojson(): separators must be a pair of strings");
        }
        options.has_separators = true;
        options.item_separator = v->as_array()[0].as_string();
        options.key_separator = v->as_array()[1].as_string();
      }
      return Value(to_json(operand, options));
    }
    Args args = eval_args(node, scope);
    if (operand.is_array()) return array_filter(name, operand, args, scope);
    if (operand.is_string()) return string_filter(name, operand, args, scope);
    if (operand.is_number()) return number_filter(name, operand, args);
    if (operand.is_object()) return object_filter(name, operand, args);
    if (operand.is_bool()) {
      const bool b = operand.as_bool();
      if (name == "bool") return operand;
      if (name == "int") return Value(int64_t{b ? 1 : 0});
      if (name == "float") return Value(b ? 1.0 : 0.0);
      if (name == "string") return Value(b ? "true" : "false");
    }
    eval_fail("filter '{}' cannot be applied to a {}", name, operand.type_name());
  }

  Value array_filter(const std::string& name, const Value& operand, const Args& args, Scope& scope) {
    const ValueList& items = operand.as_array();
    if (name == "list") return operand;
    if (name == "first") return items.empty() ? Value() : items.front();
    if (name == "last") return items.empty() ? Value() : items.back();
    if (name == "length" || name == "count") return Value(static_cast<int64_t>(items.size()));
    if (name == "reverse") return Value::array(ValueList(items.rbegin(), items.rend()));
    if (name == "string") return Value(to_json(operand, {}, false));
    if (name == "join") {
      const Value* sep = args.get(0, "d");
      if (!sep) sep = args.keyword_arg("separator");
      if (sep && !sep->is_string()) eval_fail("join(): separator must be a string");
      const Value* attribute = args.get(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i && sep) out += sep->as_string();
        const Value item = attribute ? attribute_path(items[i], to_js_string(*attribute)) : items[i];
        // Array#join: null and undefined join as empty strings.
        if (!item.is_none() && !item.is_undefined()) out += to_js_string(item);
      }
      return Value(out);
    }
    if (name == "unique") {
      ValueList out;
      for (const Value& item : items) {
        if (std::none_of(out.begin(), out.end(), [&](const Value& x) { return strict_equal(x, item); }))
          out.push_back(item);
      }
      return Value::array(std::move(out));
    }
    if (name == "sort") {
      const Value* reverse = args.get(0, "reverse");
      const Value* case_sensitive = args.get(1, "case_sensitive");
      const Value* attribute = args.get(2, "attribute");
      if (reverse && !reverse->is_bool()) eval_fail("sort(): reverse must be a boolean");
      if (case_sensitive && !case_sensitive->is_bool()) eval_fail("sort(): case_sensitive must be a boolean");
      const bool rev = reverse && reverse->as_bool();
      const bool cs = case_sensitive && case_sensitive->as_bool();
      const std::string path = attribute && !attribute->is_none() ? to_js_string(*attribute) : "";
      ValueList sorted = items;
      std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& a, const Value& b) {
        const int c = path.empty() ? compare_values(a, b, cs)
                                   : compare_values(attribute_path(a, path), attribute_path(b, path), cs);
        return rev ? c > 0 : c < 0;
      });
      return Value::array(std::move(sorted));
    }
    if (name == "selectattr" || name == "rejectattr") {
      const bool select = name == "selectattr";
      const Value& attr = positional_or_undefined(args, 0);
      if (!attr.is_string()) eval_fail("{}(): the attribute name must be a string", name);
      const Value& test_name = positional_or_undefined(args, 1);
      if (!test_name.is_undefined() && !test_name.is_string()) eval_fail("{}(): the test name must be a string", name);
      const ValueList test_args(args.positional.begin() +
                                    std::min<std::ptrdiff_t>(2, static_cast<std::ptrdiff_t>(args.positional.size())),
                                args.positional.end());
      ValueList out;
      for (const Value& item : items) {
        if (!item.is_object() && !item.is_namespace())
          eval_fail("{}() needs a list of dicts, found a {}", name, item.type_name());
        const Value* field = item.as_object().find(attr.as_string());
        const bool result =
            field && (test_name.is_undefined() ? field->truthy() : run_test(test_name.as_string(), *field, test_args));
        if (result == select) out.push_back(item);
      }
      return Value::array(std::move(out));
    }
    if (name == "select" || name == "reject") {  // beyond the reference
      const bool select = name == "select";
      const Value& test_name = positional_or_undefined(args, 0);
      const ValueList test_args(args.positional.begin() +
                                    std::min<std::ptrdiff_t>(1, static_cast<std::ptrdiff_t>(args.positional.size())),
                                args.positional.end());
      ValueList out;
      for (const Value& item : items) {
        const bool result = test_name.is_string() ? run_test(test_name.as_string(), item, test_args) : item.truthy();
        if (result == select) out.push_back(item);
      }
      return Value::array(std::move(out));
    }
    if (name == "map") {
      if (const Value* attr = args.keyword_arg("attribute")) {
        if (!attr->is_string() && !attr->is_int()) eval_fail("map(): attribute must be a string");
        const Value* fallback = args.keyword_arg("default");
        ValueList out;
        for (const Value& item : items) {
          if (!item.is_object() && !item.is_namespace())
            eval_fail("map(attribute=...) needs a list of dicts, found a {}", item.type_name());
          Value v = attribute_path(item, to_js_string(*attr));
          out.push_back(v.is_undefined() && fallback ? *fallback : v);
        }
        return Value::array(std::move(out));
      }
      // Beyond the reference: map('filter', args...) applies a filter to each item.
      const Value& filter_name = positional_or_undefined(args, 0);
      if (!filter_name.is_string()) eval_fail("map() needs attribute=... or a filter name");
      Node call(NodeKind::kFilter, 0);
      call.text = filter_name.as_string();
      Scope arg_scope(&scope);
      for (size_t i = 1; i < args.positional.size(); ++i) {
        const std::string var = "__map_arg" + std::to_string(i);
        arg_scope.set(var, args.positional[i]);
        auto ref = std::make_unique<Node>(NodeKind::kIdentifier, 0);
        ref->text = var;
        call.items.push_back(std::move(ref));
      }
      ValueList out;
      for (const Value& item : items) out.push_back(apply_filter(call, item, arg_scope));
      return Value::array(std::move(out));
    }
    if (name == "sum") {  // beyond the reference
      int64_t int_sum = 0;
      double float_sum = 0;
      bool is_float = false;
      for (const Value& item : items) {
        if (!item.is_number()) eval_fail("sum(): items must be numbers, found a {}", item.type_name());
        is_float |= item.is_float();
        float_sum += item.as_number();
        if (item.is_int()) int_sum += item.as_int();
      }
      return is_float ? Value(float_sum) : Value(int_sum);
    }
    eval_fail("filter '{}' cannot be applied to a list", name);
  }

  Value string_filter(const std::string& name, const Value& operand, const Args& args, Scope& scope) {
    const std::string& s = operand.as_string();
    if (name == "length" || name == "count") return Value(static_cast<int64_t>(js_string_length(s)));
    if (name == "upper") return Value(to_upper(s));
    if (name == "lower") return Value(to_lower(s));
    if (name == "title") return Value(title_case(s));
    if (name == "capitalize") return Value(capitalize(s));
    if (name == "trim") {
      const Value* chars = args.get(0, "chars");
      return chars && chars->is_string() ? Value(strip_chars(s, chars->as_string(), true, true)) : Value(js_trim(s));
    }
    if (name == "string") return operand;
    if (name == "join") {
      const Value* sep = args.get(0, "d");
      if (!sep) sep = args.keyword_arg("separator");
      return Value(join_strings(code_points(s), sep && sep->is_string() ? sep->as_string() : ""));
    }
    if (name == "int") {
      const auto v = js_parse_int(s);
      if (v) return Value(*v);
      const Value* fallback = args.get(0, "default");
      return fallback ? *fallback : Value(int64_t{0});
    }
    if (name == "float") {
      const auto v = js_parse_float(s);
      if (v) return Value(*v);
      const Value* fallback = args.get(0, "default");
      return fallback ? *fallback : Value(0.0);
    }
    if (name == "indent") {
      const Value* width = args.get(0, "width");
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      std::string prefix = "    ";
      if (width && width->is_int()) {
        prefix.assign(static_cast<size_t>(std::max<int64_t>(0, width->as_int())), ' ');
      } else if (width && width->is_string()) {
        prefix = width->as_string();
      } else if (width) {
        eval_fail("indent(): width must be a number or a string");
      }
      const bool indent_first = first && first->truthy();
      const bool indent_blank = blank && blank->truthy();
      const std::vector<std::string> lines = split_all(s, "\n");
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i) out += '\n';
        if (!((!indent_first && i == 0) || (!indent_blank && lines[i].empty()))) out += prefix;
        out += lines[i];
      }
      return Value(out);
    }
    if (name == "replace") return string_replace(s, args);
    // Beyond the reference.
    if (name == "list") {
      ValueList out;
      for (std::string& c : code_points(s)) out.emplace_back(std::move(c));
      return Value::array(std::move(out));
    }
    if (name == "first" || name == "last") {
      const std::vector<std::string> chars = code_points(s);
      if (chars.empty()) return Value();
      return Value(name == "first" ? chars.front() : chars.back());
    }
    if (name == "reverse") {
      std::vector<std::string> chars = code_points(s);
      std::reverse(chars.begin(), chars.end());
      return Value(join_strings(chars, ""));
    }
    if (name == "escape" || name == "e") {
      std::string out;
      for (char c : s) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return Value(out);
    }
    if (name == "wordcount") {
      Args none;
      return Value(static_cast<int64_t>(string_split(s, none, false).as_array().size()));
    }
    (void)scope;
    eval_fail("filter '{}' cannot be applied to a string", name);
  }

  Value number_filter(const std::string& name, const Value& operand, const Args& args) {
    if (name == "abs")
      return operand.is_int() ? Value(operand.as_int() < 0 ? -operand.as_int() : operand.as_int())
                              : Value(std::fabs(operand.as_float()));
    if (name == "int") return operand.is_int() ? operand : Value(static_cast<int64_t>(std::floor(operand.as_float())));
    if (name == "float") return Value(operand.as_number());
    if (name == "string") return Value(to_output_string(operand));
    if (name == "round") {  // beyond the reference: Jinja's round(precision=0, method='common')
      const Value* precision = args.get(0, "precision");
      const Value* method = args.get(1, "method");
      const double scale =
          std::pow(10.0, precision && precision->is_int() ? static_cast<double>(precision->as_int()) : 0.0);
      const std::string how = method && method->is_string() ? method->as_string() : "common";
      const double x = operand.as_number() * scale;
      double r = how == "ceil" ? std::ceil(x) : how == "floor" ? std::floor(x) : std::round(x);
      if (how != "common" && how != "ceil" && how != "floor")
        eval_fail("round(): method must be common, ceil or floor");
      return Value(r / scale);
    }
    eval_fail("filter '{}' cannot be applied to a number", name);
  }

  Value object_filter(const std::string& name, const Value& operand, const Args& args) {
    if (name == "items") return object_items(operand);
    if (name == "length" || name == "count") return Value(static_cast<int64_t>(operand.as_object().entries.size()));
    if (name == "list") return object_keys(operand);  // beyond the reference
    if (name == "string") return Value(to_json(operand, {}, false));  // beyond the reference
    const Value method = object_method(operand, name);
    if (method.is_function()) {
      Scope unused;
      return method.as_function()(args, unused);
    }
    eval_fail("filter '{}' cannot be applied to a dict", name);
  }

  int call_depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

std::string render(const Program& program, const Object& globals) { return Evaluator().render(program, globals); }

}  // namespace infera::jinja
