// Run-time values of the Jinja subset used by chat templates (see chat_template.h).
//
// The reference for every observable behaviour is @huggingface/jinja (the renderer that
// transformers.js and the Hugging Face Hub use), so values follow its JavaScript-flavoured
// model: integers and floats are distinct kinds, `none` and undefined are distinct, a
// dict keeps insertion order, and lists / dicts / namespaces are shared by reference
// (`==` on two lists compares identity, as JavaScript does).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace infera::jinja {

class Value;
using ValueList = std::vector<Value>;

// Insertion-ordered string -> value map. Chat-template dicts are mostly small (message
// fields, a JSON schema level) and a linear scan serves them; past kIndexFrom entries a
// hash index of the key positions keeps find / set O(1), so a request's tool-call arguments
// with hundreds of thousands of keys cost linear time, not quadratic.
struct Object {
  // Appending here directly is allowed (keys must stay unique); the index catches up on the
  // next set() or non-const find().
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);  // replaces in place, or appends

 private:
  static constexpr size_t kIndexFrom = 16;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Positions in `entries` of the keys of entries[0, indexed_); empty below kIndexFrom.
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> index_;
  size_t indexed_ = 0;
  void sync_index();
};

// Arguments of a call: positional values, then keyword arguments in call order.
struct Args {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  const Value* keyword_arg(std::string_view name) const;
  // positional[index] if given, else the keyword argument `name`, else nullptr.
  const Value* get(size_t index, std::string_view name) const;
};

class Scope;
using Function = std::function<Value(const Args& args, Scope& caller)>;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,  // a missing variable / key; prints as nothing, is falsey
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,  // list or tuple
    kObject,  // dict
    kNamespace,  // namespace(): mutable by `set ns.x = ...`, no dict methods
    kFunction,  // macro, builtin, or a bound method such as "abc".upper
  };

  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::kBool), data_(b) {}
  Value(int64_t i) : kind_(Kind::kInt), data_(i) {}
  Value(int i) : kind_(Kind::kInt), data_(int64_t{i}) {}
  Value(double f) : kind_(Kind::kFloat), data_(f) {}
  Value(std::string s) : kind_(Kind::kString), data_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::kString), data_(std::string(s)) {}

  static Value none();
  static Value array(ValueList items = {}, bool tuple = false);
  static Value object(Object object = {});
  static Value namespace_(Object object = {});
  static Value function(Function fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_tuple() const { return kind_ == Kind::kArray && tuple_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  double as_number() const;  // int, float or bool as a double
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const ValueList& as_array() const { return *std::get<std::shared_ptr<ValueList>>(data_); }
  // Objects and namespaces share one representation.
  const Object& as_object() const { return *std::get<std::shared_ptr<Object>>(data_); }
  Object& mutable_object() const { return *std::get<std::shared_ptr<Object>>(data_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<Function>>(data_); }

  // Python truthiness as @huggingface/jinja computes it: empty string / list / dict,
  // 0, none and undefined are false; a namespace or function is always true.
  bool truthy() const;

  // Identity of the shared payload (lists, dicts, functions), for JavaScript-style `==`.
  const void* identity() const;

  const char* type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<ValueList>, std::shared_ptr<Object>,
               std::shared_ptr<Function>>
      data_;
};

// ---- conversions that must match JavaScript / @huggingface/jinja byte for byte ----

// Number#toString: shortest round-trip digits, exponent form below 1e-6 and from 1e21.
std::string js_number_to_string(double value);

// What `{{ value }}` prints: floats always show a fraction ("2.0"), booleans are
// "true"/"false", lists and dicts print as JSON. none / undefined print as nothing
// (the caller skips them).
std::string to_output_string(const Value& value);

// JavaScript's String(value.value), used by `+` / `~` with a string operand and by `join`:
// floats print without a forced fraction ("2"), a dict prints as "[object Map]".
std::string to_js_string(const Value& value);

struct JsonOptions {
  int indent = 0;  // 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_separator;
  std::string key_separator;
};
// The tojson filter. undefined_as_null=false is the list/dict printing form, where an
// undefined element prints as "undefined". Throws std::runtime_error for a function.
std::string to_json(const Value& value, const JsonOptions& options = {}, bool undefined_as_null = true);

// JSON.stringify of one string: escapes quote, backslash and control characters only.
std::string json_quote(std::string_view text);

// UTF-16 length (JavaScript's String#length), which `length` reports for strings.
size_t js_string_length(std::string_view utf8);

// JavaScript's \s: ASCII whitespace plus the Unicode space separators, U+2028/2029, U+FEFF.
// Returns the byte length of the whitespace character at text[pos], or 0.
size_t js_space_at(std::string_view text, size_t pos);
// Byte length of the whitespace character ending at text[end], or 0.
size_t js_space_before(std::string_view text, size_t end);
std::string_view js_trim_start(std::string_view text);
std::string_view js_trim_end(std::string_view text);

}  // namespace infera::jinja
