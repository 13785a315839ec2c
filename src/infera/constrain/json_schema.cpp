// JSON Schema (the subset tool definitions use) to grammar symbols.
#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "infera/constrain/compile.h"

namespace infera::constrain {

// Schemas keep their keys in the order the client wrote them: properties are written in
// declared order.
using json = nlohmann::ordered_json;

namespace {

// Keywords that only annotate (no effect on which values are valid).
const std::set<std::string> kAnnotations = {"$schema",
                                            "$id",
                                            "id",
                                            "$anchor",
                                            "$comment",
                                            "title",
                                            "description",
                                            "default",
                                            "examples",
                                            "example",
                                            "deprecated",
                                            "readOnly",
                                            "writeOnly",
                                            "$defs",
                                            "definitions",
                                            "discriminator",
                                            "contentMediaType",
                                            "contentEncoding",
                                            "markdownDescription",
                                            "strict"};
const std::set<std::string> kSupported = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "enum",
                                          "const",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "minItems",
                                          "maxItems",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "nullable"};

// Formats as regular expressions over the string's characters.
const std::map<std::string, std::string> kFormats = {
    {"date",
     "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-"
     "9]|2[0-8]))"},
    {"time", "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"email",
     "[a-zA-Z0-9_+-]{1,32}(?:\\.[a-zA-Z0-9_+-]{1,32}){0,2}@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?(?:\\.[a-zA-Z0-"
     "9](?:[a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?){1,3}"},
    {"hostname", "[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?(?:\\.[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?){0,3}"},
    {"ipv4",
     "(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
    {"uri",
     "https?://[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?(?:\\.[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?){0,3}(?:/"
     "[a-zA-Z0-9._~-]{0,20}){0,4}"},
};

std::string format_regex(const std::string& name) {
  if (name == "date-time") return fmt::format("{}T{}", kFormats.at("date"), kFormats.at("time"));
  auto it = kFormats.find(name);
  return it == kFormats.end() ? std::string() : it->second;
}

constexpr int kMaxNumberDigits = 15;

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& b, const json& root, const JsonSchemaOptions& o) : b_(b), root_(root), opt_(o) {
    if (o.any_whitespace) {
      ByteSet ws;
      ws.set(' ');
      ws.set('\n');
      ws.set('\t');
      const Seq one{b_.cls(ws)};
      ws_ = b_.repeat(one, 0, 16);
      if (ws_.size() > 1) ws_ = Seq{b_.alt({ws_}, "ws")};
    }
  }

  Sym value(const json& s, const std::string& path) {
    if (++depth_ > 256) fail_at(path, "the schema nests too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      fail_at(path, "the schema 'false' allows no value");
    }
    if (!s.is_object()) fail_at(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kSupported.contains(k) || kAnnotations.contains(k) || k.starts_with("x-")) continue;
      constraint_fail("json_schema: unsupported keyword '{}' at {}", k, path);
    }
    if (s.contains("$ref")) {
      const json& ref = s["$ref"];
      if (!ref.is_string()) fail_at(path, "'$ref' must be a string");
      json rest = constraining(s);
      rest.erase("$ref");
      if (rest.empty()) return ref_rule(ref.get<std::string>(), path);
      json merged = merge(resolve(ref.get<std::string>(), path), rest, path);
      return value(merged, path);
    }
    if (s.contains("allOf")) {
      const json& all = s["allOf"];
      if (!all.is_array() || all.empty()) fail_at(path, "'allOf' must be a non-empty array");
      json merged = s;
      merged.erase("allOf");
      for (size_t i = 0; i < all.size(); ++i) {
        json sub = all[i];
        const std::string sub_path = fmt::format("{}/allOf/{}", path, i);
        for (int hops = 0; sub.is_object() && sub.contains("$ref"); ++hops) {
          if (hops > 32) fail_at(sub_path, "'$ref' chains deeper than 32 references");
          if (!sub["$ref"].is_string()) fail_at(sub_path, "'$ref' must be a string");
          json target = resolve(sub["$ref"].get<std::string>(), sub_path);
          sub.erase("$ref");
          sub = merge(target, sub, sub_path);
        }
        if (sub.is_boolean()) {
          if (!sub.get<bool>()) fail_at(sub_path, "the schema 'false' allows no value");
          continue;
        }
        merged = merge(merged, sub, sub_path);
      }
      return value(merged, path);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& list = s[key];
      if (!list.is_array() || list.empty()) fail_at(path, fmt::format("'{}' must be a non-empty array", key));
      json rest = constraining(s);
      rest.erase(key);
      std::vector<Seq> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string sub_path = fmt::format("{}/{}/{}", path, key, i);
        if (rest.empty()) {
          alts.push_back({value(list[i], sub_path)});
        } else {
          json sub = list[i];
          if (sub.is_object() && sub.contains("$ref") && sub["$ref"].is_string()) {
            json target = resolve(sub["$ref"].get<std::string>(), sub_path);
            sub.erase("$ref");
            sub = merge(target, sub, sub_path);
          }
          if (sub.is_boolean()) sub = json::object();
          alts.push_back({value(merge(rest, sub, sub_path), sub_path)});
        }
      }
      return b_.alt(std::move(alts), key);
    }
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) fail_at(path, "'nullable' must be a boolean");
      json rest = s;
      rest.erase("nullable");
      if (!s["nullable"].get<bool>()) return value(rest, path);
      return b_.alt({{value(rest, path)}, b_.lit("null")}, "nullable");
    }
    if (s.contains("const")) return literal(s["const"]);
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail_at(path, "'enum' must be a non-empty array");
      std::vector<Seq> alts;
      for (const json& v : e) {
        if (s.contains("type") && !type_allows(s["type"], v)) continue;
        alts.push_back({literal(v)});
      }
      if (alts.empty()) fail_at(path, "no value of 'enum' has the schema's 'type'");
      return b_.alt(std::move(alts), "enum");
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) fail_at(path, "'type' must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail_at(path, "'type' must be a string or an array of strings");
      }
    } else {
      types.push_back(infer_type(s));
    }
    std::vector<Seq> alts;
    for (const std::string& t : types) alts.push_back({typed(s, t, path)});
    return alts.size() == 1 ? alts[0][0] : b_.alt(std::move(alts), "types");
  }

  const Seq& ws() const { return ws_; }

 private:
  [[noreturn]] static void fail_at(const std::string& path, const std::string& what) {
    constraint_fail("json_schema: {} at {}", what, path);
  }

  // The keywords of s that constrain values (annotations dropped).
  static json constraining(const json& s) {
    json out = json::object();
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (!kAnnotations.contains(it.key()) && !it.key().starts_with("x-")) out[it.key()] = it.value();
    }
    return out;
  }

  static bool type_allows(const json& type, const json& v) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array()) {
      for (const json& t : type)
        if (t.is_string() && one(t.get<std::string>())) return true;
    }
    return false;
  }

  static std::string infer_type(const json& s) {
    for (const char* k : {"properties", "required", "additionalProperties"})
      if (s.contains(k)) return "object";
    for (const char* k : {"items", "prefixItems", "minItems", "maxItems", "additionalItems"})
      if (s.contains(k)) return "array";
    for (const char* k : {"minLength", "maxLength", "pattern", "format"})
      if (s.contains(k)) return "string";
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(k)) return "number";
    return "any";
  }

  json resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#')
      fail_at(path, fmt::format("'$ref' '{}' is not supported (only references inside the schema, '#...')", ref));
    try {
      std::string pointer = ref.substr(1);
      if (pointer.empty()) return root_;
      return root_.at(json::json_pointer(pointer));
    } catch (const json::exception&) {
      fail_at(path, fmt::format("'$ref' '{}' does not resolve", ref));
    }
  }

  Sym ref_rule(const std::string& ref, const std::string& path) {
    if (auto it = refs_.find(ref); it != refs_.end()) return GrammarBuilder::ref(it->second);
    const json target = resolve(ref, path);
    const uint32_t r = b_.new_rule("ref");
    refs_.emplace(ref, r);
    b_.add_alt(r, {value(target, ref)});
    return GrammarBuilder::ref(r);
  }

  json merge(json a, const json& b, const std::string& path) {
    if (!a.is_object() || !b.is_object()) fail_at(path, "'allOf' parts must be objects");
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (!a.contains(k)) {
        a[k] = v;
        continue;
      }
      if (k == "properties" && v.is_object() && a[k].is_object()) {
        for (auto p = v.begin(); p != v.end(); ++p) {
          if (a[k].contains(p.key()))
            a[k][p.key()] = json{{"allOf", json::array({a[k][p.key()], p.value()})}};
          else
            a[k][p.key()] = p.value();
        }
      } else if (k == "required" && v.is_array() && a[k].is_array()) {
        for (const json& r : v)
          if (std::find(a[k].begin(), a[k].end(), r) == a[k].end()) a[k].push_back(r);
      } else if (k == "type") {
        auto list = [](const json& t) {
          std::set<std::string> out;
          if (t.is_string()) out.insert(t.get<std::string>());
          if (t.is_array())
            for (const json& x : t)
              if (x.is_string()) out.insert(x.get<std::string>());
          return out;
        };
        std::set<std::string> x = list(a[k]), y = list(v), both;
        for (const auto& t : x) {
          if (y.contains(t) || (t == "integer" && y.contains("number")))
            both.insert(t);
          else if (t == "number" && y.contains("integer"))
            both.insert("integer");
        }
        if (both.empty()) fail_at(path, "'allOf' parts have no 'type' in common");
        a[k] = both.size() == 1 ? json(*both.begin()) : json(std::vector<std::string>(both.begin(), both.end()));
      } else if ((k == "minimum" || k == "minLength" || k == "minItems" || k == "exclusiveMinimum") && v.is_number() &&
                 a[k].is_number()) {
        if (v.get<double>() > a[k].get<double>()) a[k] = v;
      } else if ((k == "maximum" || k == "maxLength" || k == "maxItems" || k == "exclusiveMaximum") && v.is_number() &&
                 a[k].is_number()) {
        if (v.get<double>() < a[k].get<double>()) a[k] = v;
      } else if (a[k] != v) {
        if (kAnnotations.contains(k)) continue;
        fail_at(path, fmt::format("'allOf' parts disagree on '{}' (not supported)", k));
      }
    }
    return a;
  }

  Sym literal(const json& v) {
    return b_.alt({b_.lit(v.dump(-1, ' ', false, json::error_handler_t::replace))}, "literal");
  }

  Sym typed(const json& s, const std::string& t, const std::string& path) {
    if (t == "string") return string_value(s, path);
    if (t == "integer") return number_value(s, true, path);
    if (t == "number") return number_value(s, false, path);
    if (t == "boolean") return b_.alt({b_.lit("true"), b_.lit("false")}, "boolean");
    if (t == "null") return b_.alt({b_.lit("null")}, "null");
    if (t == "object") return object_value(s, path);
    if (t == "array") return array_value(s, path);
    if (t == "any") return any_value();
    fail_at(path, fmt::format("unknown type '{}'", t));
  }

  static std::optional<int64_t> get_count(const json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s[key];
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() != std::floor(v.get<double>()))
      fail_at(path, fmt::format("'{}' must be a non-negative integer", key));
    return std::min<int64_t>(static_cast<int64_t>(v.get<double>()), INT32_MAX);
  }

  // One character inside a JSON string (one code point, escapes allowed).
  Sym string_char() {
    if (string_char_) return *string_char_;
    ByteSet plain = ByteSet::range(0x20, 0x7F);
    plain.reset('"');
    plain.reset('\\');
    std::vector<Seq> alts{{b_.cls(plain)}};
    ByteSet esc;
    for (char c : std::string("\"\\/bfnrt")) esc.set(static_cast<uint8_t>(c));
    alts.push_back({b_.byte('\\'), b_.cls(esc)});
    // \uXXXX without surrogates.
    ByteSet hex;
    hex.set_range('0', '9');
    hex.set_range('a', 'f');
    hex.set_range('A', 'F');
    ByteSet first_no_d = hex;
    first_no_d.reset('d');
    first_no_d.reset('D');
    ByteSet d;
    d.set('d');
    d.set('D');
    const Sym h = b_.cls(hex);
    alts.push_back({b_.byte('\\'), b_.byte('u'), b_.cls(first_no_d), h, h, h});
    alts.push_back({b_.byte('\\'), b_.byte('u'), b_.cls(d), b_.cls(ByteSet::range('0', '7')), h, h});
    for (Seq& s : utf8_sequences(b_, {{0x80, 0x10FFFF}})) alts.push_back(std::move(s));
    string_char_ = b_.alt(std::move(alts), "char");
    return *string_char_;
  }

  Sym string_value(const json& s, const std::string& path) {
    const auto min_len = get_count(s, "minLength", path);
    const auto max_len = get_count(s, "maxLength", path);
    Seq body;
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail_at(path, "'format' must be a string");
      const std::string f = s["format"].get<std::string>();
      const std::string re = format_regex(f);
      if (re.empty())
        fail_at(path, fmt::format("unsupported format '{}' (supported: date, time, date-time, uuid, email, hostname, "
                                  "ipv4, uri)",
                                  f));
      if (s.contains("pattern") || min_len || max_len)
        fail_at(path, "'format' combined with 'pattern', 'minLength' or 'maxLength' is not supported");
      body = regex_symbols(b_, re, true, false);
    } else if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail_at(path, "'pattern' must be a string");
      if (min_len || max_len) fail_at(path, "'pattern' combined with 'minLength' or 'maxLength' is not supported");
      try {
        body = regex_symbols(b_, s["pattern"].get<std::string>(), true, true);
      } catch (const ConstraintError& e) {
        fail_at(path + "/pattern", e.what());
      }
    } else {
      const int64_t lo = min_len.value_or(0);
      const int64_t hi = max_len ? *max_len : -1;
      if (hi >= 0 && hi < lo) fail_at(path, "'maxLength' is below 'minLength'");
      try {
        body = b_.repeat({string_char()}, lo, hi);
      } catch (const ConstraintError& e) {
        fail_at(path, e.what());
      }
    }
    Seq out = b_.lit("\"");
    append(out, body);
    out.push_back(b_.byte('"'));
    return b_.alt({std::move(out)}, "string");
  }

  // --- numbers ---
  static constexpr int64_t kNoBound = INT64_MIN;

  // Decimal strings of [lo, hi], both >= 0 with the same number of digits.
  Seq same_length(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return {};
    if (lo.find_first_not_of('0') == std::string::npos && hi.find_first_not_of('9') == std::string::npos) {
      // Every digit string of this length: [0-9]{n} (recursing would branch twice per digit).
      return Seq(lo.size(), b_.cls(ByteSet::range('0', '9')));
    }
    if (lo.size() == 1) return {b_.cls(ByteSet::range(static_cast<uint8_t>(lo[0]), static_cast<uint8_t>(hi[0])))};
    if (lo[0] == hi[0]) {
      Seq s{b_.byte(static_cast<uint8_t>(lo[0]))};
      append(s, same_length(lo.substr(1), hi.substr(1)));
      return s;
    }
    const size_t n = lo.size() - 1;
    std::vector<Seq> alts;
    Seq first{b_.byte(static_cast<uint8_t>(lo[0]))};
    append(first, same_length(lo.substr(1), std::string(n, '9')));
    alts.push_back(std::move(first));
    if (hi[0] - lo[0] > 1) {
      Seq mid{b_.cls(ByteSet::range(static_cast<uint8_t>(lo[0] + 1), static_cast<uint8_t>(hi[0] - 1)))};
      for (size_t k = 0; k < n; ++k) mid.push_back(b_.cls(ByteSet::range('0', '9')));
      alts.push_back(std::move(mid));
    }
    Seq last{b_.byte(static_cast<uint8_t>(hi[0]))};
    append(last, same_length(std::string(n, '0'), hi.substr(1)));
    alts.push_back(std::move(last));
    return {b_.alt(std::move(alts), "digits")};
  }

  // Non-negative integers in [lo, hi] (hi kNoBound: up to kMaxNumberDigits digits).
  std::vector<Seq> nonneg_range(int64_t lo, int64_t hi) {
    std::vector<Seq> alts;
    const std::string a = std::to_string(lo);
    const size_t max_digits = hi == kNoBound ? kMaxNumberDigits : std::to_string(hi).size();
    for (size_t len = a.size(); len <= max_digits; ++len) {
      std::string lo_s = a;
      if (len != a.size()) {
        lo_s = std::string(len, '0');
        if (len > 1) lo_s[0] = '1';
      }
      std::string hi_s = std::string(len, '9');
      if (hi != kNoBound && len == std::to_string(hi).size()) hi_s = std::to_string(hi);
      if (lo_s > hi_s && lo_s.size() == hi_s.size()) continue;
      alts.push_back(same_length(lo_s, hi_s));
    }
    return alts;
  }

  // Integers in [lo, hi]; kNoBound on either side: unbounded there.
  std::vector<Seq> int_range(int64_t lo, int64_t hi) {
    std::vector<Seq> alts;
    if (lo == kNoBound || lo < 0) {
      // Negative part: -m for m in [max(1, -hi), -lo].
      const int64_t m_lo = (hi != kNoBound && hi < 0) ? -hi : 1;
      const int64_t m_hi = lo == kNoBound ? kNoBound : -lo;
      for (Seq& s : nonneg_range(m_lo, m_hi)) {
        Seq neg{b_.byte('-')};
        append(neg, s);
        alts.push_back(std::move(neg));
      }
    }
    if (hi == kNoBound || hi >= 0) {
      for (Seq& s : nonneg_range(lo == kNoBound ? 0 : std::max<int64_t>(lo, 0), hi)) alts.push_back(std::move(s));
    }
    return alts;
  }

  Sym number_value(const json& s, bool integer, const std::string& path) {
    auto num = [&](const char* k) -> std::optional<double> {
      if (!s.contains(k)) return std::nullopt;
      const json& v = s[k];
      if (v.is_boolean()) return std::nullopt;  // draft 4 exclusive flags, read below
      if (!v.is_number()) fail_at(path, fmt::format("'{}' must be a number", k));
      const double d = v.get<double>();
      if (std::fabs(d) > 1e15) fail_at(path, fmt::format("'{}' beyond 1e15 is not supported", k));
      return d;
    };
    std::optional<double> min = num("minimum"), max = num("maximum");
    std::optional<double> xmin = num("exclusiveMinimum"), xmax = num("exclusiveMaximum");
    // Draft 4: exclusiveMinimum / exclusiveMaximum are booleans qualifying minimum / maximum.
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean() && s["exclusiveMinimum"].get<bool>() &&
        min) {
      xmin = min;
      min.reset();
    }
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean() && s["exclusiveMaximum"].get<bool>() &&
        max) {
      xmax = max;
      max.reset();
    }
    int64_t lo = kNoBound, hi = kNoBound;
    if (min) lo = static_cast<int64_t>(std::ceil(*min));
    if (xmin) lo = std::max<int64_t>(lo, static_cast<int64_t>(std::floor(*xmin)) + 1);
    bool frac_at_top = false;
    if (max) hi = static_cast<int64_t>(std::floor(*max));
    if (xmax) {
      const int64_t h = static_cast<int64_t>(std::ceil(*xmax)) - 1;
      if (hi == kNoBound || h <= hi) {
        frac_at_top = std::floor(*xmax) == *xmax && (hi == kNoBound || h < hi);
        hi = h;
      }
    }
    if (lo != kNoBound && hi != kNoBound && lo > hi)
      fail_at(path, integer ? "no integer lies within the bounds" : "the bounds leave no value this grammar can write");
    const Seq frac = {b_.byte('.'),
                      b_.alt({b_.repeat({b_.cls(ByteSet::range('0', '9'))}, 1, kMaxNumberDigits)}, "frac")};
    std::vector<Seq> alts;
    if (integer) {
      alts = int_range(lo, hi);
    } else if (lo == kNoBound && hi == kNoBound) {
      for (Seq& a : int_range(lo, hi)) {
        Seq x = a;
        x.push_back(b_.opt(frac));
        alts.push_back(std::move(x));
      }
    } else {
      // Negative values: integers only; non-negative: a fraction below the top.
      if (lo == kNoBound || lo < 0) {
        for (Seq& a : int_range(lo, hi == kNoBound ? -1 : std::min<int64_t>(hi, -1))) alts.push_back(std::move(a));
      }
      const int64_t a0 = lo == kNoBound ? 0 : std::max<int64_t>(lo, 0);
      if (hi == kNoBound || hi >= a0) {
        const int64_t below_top = hi == kNoBound ? kNoBound : hi - 1;
        if (below_top == kNoBound || below_top >= a0) {
          for (Seq& a : int_range(a0, below_top)) {
            Seq x = a;
            x.push_back(b_.opt(frac));
            alts.push_back(std::move(x));
          }
        }
        if (hi != kNoBound) {
          Seq top = b_.lit(std::to_string(hi));
          if (frac_at_top) top.push_back(b_.opt(frac));
          alts.push_back(std::move(top));
        }
      }
    }
    if (alts.empty()) fail_at(path, "the bounds leave no value this grammar can write");
    return b_.alt(std::move(alts), integer ? "integer" : "number");
  }

  // --- objects ---
  Seq member(const std::string& key, Sym v) {
    Seq m = b_.lit(json(key).dump());
    append(m, ws_);
    m.push_back(b_.byte(':'));
    append(m, ws_);
    m.push_back(v);
    return m;
  }
  Seq comma() {
    Seq c = ws_;
    c.push_back(b_.byte(','));
    append(c, ws_);
    return c;
  }

  // A JSON string that is none of `keys` (plain ASCII keys).
  Sym key_not_in(const std::vector<std::string>& keys, const std::string& path) {
    for (const auto& k : keys) {
      for (char c : k) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u >= 0x7F || c == '"' || c == '\\')
          fail_at(path, "'additionalProperties' beside property names that are not plain ASCII is not supported");
      }
    }
    ByteSet plain = ByteSet::range(0x20, 0x7F);
    plain.reset('"');
    plain.reset('\\');
    const Seq rest = {b_.star({string_char()}), b_.byte('"')};
    std::vector<Seq> multibyte = utf8_sequences(b_, {{0x80, 0x10FFFF}});
    // Rules by key prefix.
    std::function<Sym(const std::string&)> node = [&](const std::string& prefix) -> Sym {
      std::set<char> next;
      bool terminal = false;
      for (const auto& k : keys) {
        if (k.size() >= prefix.size() && k.compare(0, prefix.size(), prefix) == 0) {
          if (k.size() == prefix.size())
            terminal = true;
          else
            next.insert(k[prefix.size()]);
        }
      }
      std::vector<Seq> alts;
      if (!terminal) alts.push_back({b_.byte('"')});
      ByteSet other = plain;
      for (char c : next) other.reset(static_cast<uint8_t>(c));
      if (!other.empty()) {
        Seq a{b_.cls(other)};
        append(a, rest);
        alts.push_back(std::move(a));
      }
      for (const Seq& mb : multibyte) {
        Seq a = mb;
        append(a, rest);
        alts.push_back(std::move(a));
      }
      for (char c : next) {
        alts.push_back({b_.byte(static_cast<uint8_t>(c)), node(prefix + c)});
      }
      return b_.alt(std::move(alts), "key");
    };
    Seq k{b_.byte('"'), node("")};
    return b_.alt({std::move(k)}, "other-key");
  }

  Sym object_value(const json& s, const std::string& path) {
    json props = json::object();
    if (s.contains("properties")) {
      props = s["properties"];
      if (!props.is_object()) fail_at(path, "'properties' must be an object");
    }
    std::set<std::string> required;
    std::vector<std::string> required_order;  // as listed (required keys not in 'properties' come in this order)
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail_at(path, "'required' must be an array");
      for (const json& r : s["required"]) {
        if (!r.is_string()) fail_at(path, "'required' must hold strings");
        if (required.insert(r.get<std::string>()).second) required_order.push_back(r.get<std::string>());
      }
    }
    // Extra properties: absent means none when 'properties' is given (the model writes the
    // declared ones), any value when the object has no declared properties.
    json additional =
        s.contains("additionalProperties") ? s["additionalProperties"] : json(props.empty() && required.empty());
    const bool extras = !(additional.is_boolean() && !additional.get<bool>());
    struct Prop {
      std::string key;
      Sym value;
      bool required;
    };
    std::vector<Prop> list;
    for (auto it = props.begin(); it != props.end(); ++it) {
      list.push_back({it.key(), value(it.value(), path + "/properties/" + it.key()), required.contains(it.key())});
    }
    for (const std::string& r : required_order) {
      if (props.contains(r)) continue;
      if (!extras)
        fail_at(path,
                fmt::format("required property '{}' is not in 'properties' and 'additionalProperties' is false", r));
      list.push_back({r, value(additional, path + "/additionalProperties"), true});
    }
    std::optional<Seq> extra;
    if (extras) {
      std::vector<std::string> known;
      for (const Prop& p : list) known.push_back(p.key);
      Seq e{key_not_in(known, path)};
      append(e, ws_);
      e.push_back(b_.byte(':'));
      append(e, ws_);
      e.push_back(value(additional, path + "/additionalProperties"));
      extra = std::move(e);
    }
    // after[i]: at least one member written, properties i.. may follow; first[i]: none yet.
    const size_t n = list.size();
    std::vector<Sym> after(n + 1), first(n + 1);
    {
      std::vector<Seq> a_tail{Seq{}}, f_tail{Seq{}};
      if (extra) {
        Seq more = comma();
        append(more, *extra);
        const Sym extras_tail = b_.star(more);
        a_tail = {{extras_tail}};
        Seq one = *extra;
        one.push_back(extras_tail);
        f_tail = {std::move(one), Seq{}};
      }
      after[n] = b_.alt(std::move(a_tail), "members");
      first[n] = b_.alt(std::move(f_tail), "members");
    }
    for (size_t i = n; i-- > 0;) {
      Seq m = member(list[i].key, list[i].value);
      Seq with_comma = comma();
      append(with_comma, m);
      with_comma.push_back(after[i + 1]);
      std::vector<Seq> a_alts{std::move(with_comma)};
      if (!list[i].required) a_alts.push_back({after[i + 1]});
      after[i] = b_.alt(std::move(a_alts), "members");
      Seq lead = m;
      lead.push_back(after[i + 1]);
      std::vector<Seq> f_alts{std::move(lead)};
      if (!list[i].required) f_alts.push_back({first[i + 1]});
      first[i] = b_.alt(std::move(f_alts), "members");
    }
    Seq out{b_.byte('{')};
    append(out, ws_);
    out.push_back(first[0]);
    append(out, ws_);
    out.push_back(b_.byte('}'));
    return b_.alt({std::move(out)}, "object");
  }

  // --- arrays ---
  Sym array_value(const json& s, const std::string& path) {
    if (s.contains("uniqueItems") || s.contains("contains"))
      fail_at(path, "'uniqueItems' and 'contains' are not supported");
    std::vector<json> prefix;
    json rest = true;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) fail_at(path, "'prefixItems' must be an array");
      for (const json& p : s["prefixItems"]) prefix.push_back(p);
      if (s.contains("items")) rest = s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {  // draft 4 tuples
      for (const json& p : s["items"]) prefix.push_back(p);
      if (s.contains("additionalItems")) rest = s["additionalItems"];
    } else if (s.contains("items")) {
      rest = s["items"];
    }
    const bool rest_allowed = !(rest.is_boolean() && !rest.get<bool>());
    const int64_t p = static_cast<int64_t>(prefix.size());
    const int64_t min = get_count(s, "minItems", path).value_or(0);
    std::optional<int64_t> max = get_count(s, "maxItems", path);
    if (!rest_allowed) max = std::min<int64_t>(max.value_or(p), p);
    if (max && *max < min) fail_at(path, "'maxItems' is below 'minItems' (or the items allowed)");
    std::map<int64_t, Sym> elems;
    std::optional<Sym> rest_sym;
    auto elem = [&](int64_t i) -> Sym {
      if (i < p) {
        auto it = elems.find(i);
        if (it != elems.end()) return it->second;
        const Sym v = value(prefix[i], fmt::format("{}/prefixItems/{}", path, i));
        elems.emplace(i, v);
        return v;
      }
      if (!rest_sym) rest_sym = value(rest, path + "/items");
      return *rest_sym;
    };
    const int64_t threshold = std::max(p, min);
    const int64_t limit = max ? *max : threshold;
    if (limit - std::min(threshold, limit) > GrammarBuilder::kMaxRepeat || threshold > GrammarBuilder::kMaxRepeat)
      fail_at(path, fmt::format("array bounds above {} items are not supported", GrammarBuilder::kMaxRepeat));
    // tail[i]: i elements written (i >= 1), the rest to come.
    std::vector<Sym> tail(static_cast<size_t>(limit) + 2);
    if (!max) {
      const uint32_t loop = b_.new_rule("items");
      if (threshold >= 1 || limit == 0) {
        Seq more = comma();
        more.push_back(elem(threshold));
        more.push_back(GrammarBuilder::ref(loop));
        b_.add_alt(loop, std::move(more));
        b_.add_alt(loop, Seq{});
      } else {
        b_.add_alt(loop, Seq{});
      }
      tail[limit] = GrammarBuilder::ref(loop);
      if (threshold == 0) {
        // No mandatory element: the whole list is optional repetition.
        Seq more = comma();
        more.push_back(elem(1));
        const Sym rep = b_.star(more);
        Seq body{elem(0), rep};
        Seq out{b_.byte('[')};
        append(out, ws_);
        out.push_back(b_.opt(std::move(body)));
        append(out, ws_);
        out.push_back(b_.byte(']'));
        return b_.alt({std::move(out)}, "array");
      }
    } else {
      tail[limit] = b_.alt({Seq{}}, "end");
    }
    for (int64_t i = limit - 1; i >= 1; --i) {
      Seq more = comma();
      more.push_back(elem(i));
      more.push_back(tail[i + 1]);
      std::vector<Seq> alts{std::move(more)};
      if (i >= min) alts.push_back(Seq{});
      tail[i] = b_.alt(std::move(alts), "items");
    }
    Seq out{b_.byte('[')};
    append(out, ws_);
    if (limit >= 1) {
      Seq body{elem(0), tail[1]};
      if (min == 0)
        out.push_back(b_.opt(std::move(body)));
      else
        append(out, body);
    }
    append(out, ws_);
    out.push_back(b_.byte(']'));
    return b_.alt({std::move(out)}, "array");
  }

  // --- any JSON value ---
  Sym any_value() {
    if (any_) return *any_;
    const uint32_t v = b_.new_rule("value");
    any_ = GrammarBuilder::ref(v);
    const Sym str = b_.alt({{b_.byte('"'), b_.star({string_char()}), b_.byte('"')}}, "string");
    Seq member{str};
    append(member, ws_);
    member.push_back(b_.byte(':'));
    append(member, ws_);
    member.push_back(*any_);
    Seq more_m = comma();
    append(more_m, member);
    Seq members = member;
    members.push_back(b_.star(more_m));
    Seq obj{b_.byte('{')};
    append(obj, ws_);
    obj.push_back(b_.opt(members));
    append(obj, ws_);
    obj.push_back(b_.byte('}'));
    Seq more_v = comma();
    more_v.push_back(*any_);
    Seq items{*any_, b_.star(more_v)};
    Seq arr{b_.byte('[')};
    append(arr, ws_);
    arr.push_back(b_.opt(items));
    append(arr, ws_);
    arr.push_back(b_.byte(']'));
    const Sym num = number_value(json::object(), false, "#");
    b_.add_alt(v, std::move(obj));
    b_.add_alt(v, std::move(arr));
    b_.add_alt(v, {str});
    b_.add_alt(v, {num});
    b_.add_alt(v, b_.lit("true"));
    b_.add_alt(v, b_.lit("false"));
    b_.add_alt(v, b_.lit("null"));
    return *any_;
  }

  GrammarBuilder& b_;
  const json& root_;
  JsonSchemaOptions opt_;
  Seq ws_;
  std::map<std::string, uint32_t> refs_;
  std::optional<Sym> string_char_;
  std::optional<Sym> any_;
  int depth_ = 0;
};

}  // namespace

Sym json_schema_symbol(GrammarBuilder& b, const json& schema, const JsonSchemaOptions& options) {
  SchemaCompiler c(b, schema, options);
  return c.value(schema, "#");
}

Grammar compile_json_schema(const json& schema, const JsonSchemaOptions& options) {
  GrammarBuilder b;
  const Sym v = json_schema_symbol(b, schema, options);
  const uint32_t root = b.rule("root", {{v}});
  return b.build(root);
}

Grammar compile_json_object(const JsonSchemaOptions& options) {
  return compile_json_schema(json{{"type", "object"}}, options);
}

Grammar compile_tool_calls(const std::vector<ToolSchema>& tools, const ToolCallOptions& options) {
  if (tools.empty()) constraint_fail("tool calls: no tools");
  GrammarBuilder b;
  std::vector<Seq> calls;
  for (const ToolSchema& t : tools) {
    const json params = t.parameters.is_null() || (t.parameters.is_object() && t.parameters.empty())
                            ? json{{"type", "object"}}
                            : t.parameters;
    Sym args;
    try {
      // Models write tool arguments as the chat template showed them (json.dumps style,
      // ", " and ": "): whitespace between tokens is allowed there.
      JsonSchemaOptions args_options;
      args_options.any_whitespace = true;
      SchemaCompiler c(b, params, args_options);
      args = c.value(params, "#");
    } catch (const ConstraintError& e) {
      constraint_fail("tool '{}': {}", t.name, e.what());
    }
    Seq call = b.lit(fmt::format("{{\"name\": {}, \"arguments\": ", json(t.name).dump()));
    call.push_back(args);
    call.push_back(b.byte('}'));
    calls.push_back(std::move(call));
  }
  const Sym call = b.alt(std::move(calls), "call");
  Seq inner = b.lit("\n");
  inner.push_back(call);
  append(inner, b.lit("\n</tool_call>"));
  uint32_t root;
  if (!options.with_open_tag) {
    root = b.rule("root", {std::move(inner)});
  } else {
    Seq block = b.lit("<tool_call>");
    append(block, inner);
    const Sym one = b.alt({block}, "block");
    if (options.parallel) {
      Seq more = b.lit("\n");
      more.push_back(one);
      root = b.rule("root", {{one, b.star(more)}});
    } else {
      root = b.rule("root", {{one}});
    }
  }
  return b.build(root);
}

}  // namespace infera::constrain
