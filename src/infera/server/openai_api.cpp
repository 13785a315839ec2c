#include "infera/server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "infera/base/json_file.h"
#include "infera/runtime/sampler.h"

namespace infera::server {

using nlohmann::json;

namespace {

constexpr int kMaxJsonDepth = 64;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::number_float: return "number";
    default: return "integer";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& got) {
  throw_api(bad_request(fmt::format("'{}' must be {}, got {}", param, expected, type_name(got)), param));
}

[[noreturn]] void out_of_range(const std::string& param, const std::string& what) {
  throw_api(bad_request(fmt::format("'{}' {}", param, what), param));
}

// A present, non-null field, or nullptr. OpenAI treats explicit nulls as "not given".
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const json& obj, const char* key, double lo, double hi) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    out_of_range(key, fmt::format("must be between {} and {}, got {}", lo, hi, d));
  return d;
}

std::optional<int64_t> get_integer(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      out_of_range(key, "is too large");
    return v->get<int64_t>();
  }
  if (v->is_number_float()) {  // 5.0 is fine, 5.5 is not
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  wrong_type(key, "an integer", *v);
}

std::optional<int64_t> get_integer_in(const json& obj, const char* key, int64_t lo, int64_t hi) {
  auto v = get_integer(obj, key);
  if (v && (*v < lo || *v > hi)) out_of_range(key, fmt::format("must be between {} and {}, got {}", lo, hi, *v));
  return v;
}

std::optional<bool> get_bool(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const char* key, const std::string& param) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) wrong_type(param, "a string", *it);
  return it->get<std::string>();
}

void require_object(const json& body) {
  if (!body.is_object())
    throw_api(bad_request(fmt::format("the request body must be a JSON object, got {}", type_name(body))));
}

// The key the output limit comes under: max_completion_tokens supersedes the deprecated max_tokens.
const char* max_tokens_key(const json& body) {
  return field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
}

// Parameters Infera cannot honour: a 400 naming them, never silently ignored.
void parse_unsupported(const json& body, const GenerationOptions& o) {
  if (auto v = get_integer(body, "best_of"); v && *v != o.n)
    out_of_range("best_of", fmt::format("is not supported (only best_of equal to n, {}), got {}", o.n, *v));
  for (const char* key : {"functions", "function_call"}) {
    if (field(body, key))
      throw_api(bad_request(fmt::format("'{}' is not supported; use 'tools' and 'tool_choice'", key), key));
  }
  for (const char* key : {"prediction", "audio"}) {
    if (field(body, key)) throw_api(bad_request(fmt::format("'{}' is not supported", key), key));
  }
  if (const json* m = field(body, "modalities")) {
    if (!m->is_array()) wrong_type("modalities", "an array", *m);
    for (const json& x : *m) {
      if (!x.is_string() || x.get<std::string>() != "text")
        throw_api(bad_request("'modalities' may only hold \"text\"", "modalities"));
    }
  }
}

constexpr size_t kMaxLogitBias = 1024;

void parse_logit_bias(const json& body, GenerationOptions& o) {
  const json* lb = field(body, "logit_bias");
  if (!lb) return;
  if (!lb->is_object()) wrong_type("logit_bias", "an object mapping token ids to numbers", *lb);
  if (lb->size() > kMaxLogitBias)
    out_of_range("logit_bias", fmt::format("may hold at most {} token ids, got {}", kMaxLogitBias, lb->size()));
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    const std::string param = "logit_bias." + key;
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
      id = std::stoll(key);
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw_api(bad_request(fmt::format("'logit_bias' keys must be token ids (integers as strings), got '{}'", key),
                            "logit_bias"));
    if (!it->is_number()) wrong_type(param, "a number", *it);
    const double bias = it->get<double>();
    if (!std::isfinite(bias) || bias < -100 || bias > 100)
      out_of_range(param, fmt::format("must be between -100 and 100, got {}", bias));
    o.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
}

using constrain::ConstraintSpec;

// A JSON Schema given as an object or as JSON text (vLLM accepts both).
json schema_field(const json& v, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    std::optional<json> parsed = parse_json_within(v.get<std::string>(), kMaxJsonDepth);
    if (parsed && (parsed->is_object() || parsed->is_boolean())) return *parsed;
    throw_api(bad_request(fmt::format("'{}' is not a JSON Schema (an object, or its JSON text)", param), param));
  }
  wrong_type(param, "a JSON Schema object", v);
}

void set_constraint(GenerationOptions& o, ConstraintSpec spec, const std::string& param) {
  if (o.constraint) {
    throw_api(
        bad_request(fmt::format("'{}' and '{}' both constrain the output; give only one", o.constraint_param, param),
                    param));
  }
  o.constraint = std::move(spec);
  o.constraint_param = param;
}

// The vLLM structured-output fields of `obj` ({json, regex, choice, grammar, json_object});
// `prefix` is how their names are written ("structured_outputs." or "guided_").
void parse_structured_fields(const json& obj, GenerationOptions& o, const std::string& prefix, bool nested) {
  const char* json_key = nested ? "json" : "guided_json";
  const char* regex_key = nested ? "regex" : "guided_regex";
  const char* choice_key = nested ? "choice" : "guided_choice";
  const char* grammar_key = nested ? "grammar" : "guided_grammar";
  const std::string pfx = nested ? prefix : "";
  if (const json* v = field(obj, json_key)) {
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::kJsonSchema;
    spec.json = schema_field(*v, pfx + json_key);
    set_constraint(o, std::move(spec), pfx + json_key);
  }
  if (const json* v = field(obj, regex_key)) {
    if (!v->is_string()) wrong_type(pfx + regex_key, "a string", *v);
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::kRegex;
    spec.text = v->get<std::string>();
    set_constraint(o, std::move(spec), pfx + regex_key);
  }
  if (const json* v = field(obj, choice_key)) {
    const std::string param = pfx + choice_key;
    if (!v->is_array() || v->empty()) wrong_type(param, "a non-empty array of strings", *v);
    for (const json& c : *v)
      if (!c.is_string()) wrong_type(param, "a non-empty array of strings", *v);
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::kChoice;
    spec.json = *v;
    set_constraint(o, std::move(spec), param);
  }
  if (const json* v = field(obj, grammar_key)) {
    if (!v->is_string()) wrong_type(pfx + grammar_key, "a string (GBNF)", *v);
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::kGrammar;
    spec.text = v->get<std::string>();
    set_constraint(o, std::move(spec), pfx + grammar_key);
  }
}

void parse_constraint(const json& body, GenerationOptions& o) {
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    const auto type = get_string(*rf, "type", "response_format.type");
    if (!type) throw_api(bad_request("'response_format.type' is required", "response_format.type"));
    if (*type == "json_object") {
      ConstraintSpec spec;
      spec.kind = ConstraintSpec::Kind::kJsonObject;
      set_constraint(o, std::move(spec), "response_format");
    } else if (*type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        throw_api(bad_request("'response_format.json_schema' must be an object with a 'schema'",
                              "response_format.json_schema"));
      for (auto it = js->begin(); it != js->end(); ++it) {
        const std::string& k = it.key();
        if (k != "name" && k != "schema" && k != "strict" && k != "description")
          throw_api(bad_request(fmt::format("'response_format.json_schema.{}' is not supported", k),
                                "response_format.json_schema." + k));
      }
      get_bool(*js, "strict");  // type-checked; the schema is always enforced
      const json* schema = field(*js, "schema");
      ConstraintSpec spec;
      spec.kind = ConstraintSpec::Kind::kJsonSchema;
      spec.json = schema ? schema_field(*schema, "response_format.json_schema.schema") : json::object();
      set_constraint(o, std::move(spec), "response_format.json_schema.schema");
    } else if (*type != "text") {
      throw_api(bad_request(fmt::format("'response_format.type' must be \"text\", \"json_object\" or "
                                        "\"json_schema\", got \"{}\"",
                                        *type),
                            "response_format.type"));
    }
  }
  if (const json* so = field(body, "structured_outputs")) {
    if (!so->is_object()) wrong_type("structured_outputs", "an object", *so);
    static const char* kKnown[] = {"json",
                                   "regex",
                                   "choice",
                                   "grammar",
                                   "json_object",
                                   "disable_any_whitespace",
                                   "disable_additional_properties",
                                   "disable_fallback"};
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it->is_null()) continue;
      if (std::find(std::begin(kKnown), std::end(kKnown), it.key()) == std::end(kKnown))
        throw_api(bad_request(fmt::format("'structured_outputs.{}' is not supported", it.key()),
                              "structured_outputs." + it.key()));
    }
    parse_structured_fields(*so, o, "structured_outputs.", /*nested=*/true);
    if (get_bool(*so, "json_object").value_or(false)) {
      ConstraintSpec spec;
      spec.kind = ConstraintSpec::Kind::kJsonObject;
      set_constraint(o, std::move(spec), "structured_outputs.json_object");
    }
    if (auto compact = get_bool(*so, "disable_any_whitespace"); compact && !*compact && o.constraint)
      o.constraint->schema_options.any_whitespace = true;
    get_bool(*so, "disable_fallback");  // there is no fallback: a constraint compiles or is a 400
    if (auto v = get_bool(*so, "disable_additional_properties"); v && !*v)
      throw_api(bad_request("'structured_outputs.disable_additional_properties' false is not supported",
                            "structured_outputs.disable_additional_properties"));
  }
  parse_structured_fields(body, o, "", /*nested=*/false);
  if (field(body, "guided_whitespace_pattern"))
    throw_api(bad_request("'guided_whitespace_pattern' is not supported", "guided_whitespace_pattern"));
  if (const json* g = field(body, "grammar")) {  // llama.cpp
    if (!g->is_string()) wrong_type("grammar", "a string (GBNF)", *g);
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::kGrammar;
    spec.text = g->get<std::string>();
    set_constraint(o, std::move(spec), "grammar");
  }
  if (const json* js = field(body, "json_schema")) {  // llama.cpp
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::kJsonSchema;
    spec.json = schema_field(*js, "json_schema");
    set_constraint(o, std::move(spec), "json_schema");
  }
}

GenerationOptions parse_options(const json& body, const ParseLimits& limits, bool chat) {
  GenerationOptions o;
  o.model = get_string(body, "model", "model");
  if (o.model && o.model->empty()) throw_api(bad_request("'model' must not be empty", "model"));
  const char* max_key = max_tokens_key(body);
  o.max_tokens = get_integer(body, max_key);
  // Completions take 0 with 'echo' (checked there): the prompt back, scored with 'logprobs'.
  const int64_t min_tokens = chat ? 1 : 0;
  if (o.max_tokens && *o.max_tokens < min_tokens) {
    out_of_range(max_key, fmt::format("must be at least {}, got {}", min_tokens, *o.max_tokens));
  }
  if (auto v = get_number(body, "temperature", 0.0, 2.0)) {
    o.temperature = static_cast<float>(*v);
    o.given |= kGivenTemperature;
  }
  if (auto v = get_number(body, "top_p", 0.0, 1.0)) {
    if (*v == 0.0) out_of_range("top_p", "must be greater than 0");
    o.top_p = static_cast<float>(*v);
    o.given |= kGivenTopP;
  }
  if (auto v = get_integer_in(body, "top_k", -1, 1 << 20)) {
    o.top_k = static_cast<int32_t>(std::max<int64_t>(*v, 0));
    o.given |= kGivenTopK;
  }
  if (auto v = get_number(body, "min_p", 0.0, 1.0)) {
    o.min_p = static_cast<float>(*v);
    o.given |= kGivenMinP;
  }
  o.seed = get_integer(body, "seed");
  if (auto v = get_number(body, "presence_penalty", -2.0, 2.0)) {
    o.presence_penalty = static_cast<float>(*v);
    o.given |= kGivenPresencePenalty;
  }
  if (auto v = get_number(body, "frequency_penalty", -2.0, 2.0)) {
    o.frequency_penalty = static_cast<float>(*v);
    o.given |= kGivenFrequencyPenalty;
  }
  if (auto v = get_number(body, "repetition_penalty", 0.0, 10.0)) {
    if (*v == 0.0) out_of_range("repetition_penalty", "must be greater than 0");
    o.repetition_penalty = static_cast<float>(*v);
    o.given |= kGivenRepetitionPenalty;
  }
  if (auto v = get_integer_in(body, "n", 1, limits.max_n)) o.n = static_cast<int32_t>(*v);
  if (const json* stop = field(body, "stop")) {
    o.given |= kGivenStop;
    if (stop->is_string()) {
      o.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (static_cast<int32_t>(stop->size()) > limits.max_stop_strings)
        out_of_range("stop", fmt::format("may hold at most {} strings, got {}", limits.max_stop_strings, stop->size()));
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) wrong_type(fmt::format("stop[{}]", i), "a string", (*stop)[i]);
        o.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *stop);
    }
    for (const auto& s : o.stop) {
      if (static_cast<int32_t>(s.size()) > limits.max_stop_length)
        out_of_range("stop",
                     fmt::format("strings may be at most {} bytes long, got {}", limits.max_stop_length, s.size()));
    }
  }
  if (chat) {
    o.logprobs = get_bool(body, "logprobs").value_or(false);
    if (auto v = get_integer_in(body, "top_logprobs", 0, kMaxTopLogprobs)) {
      if (!o.logprobs) throw_api(bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs"));
      o.top_logprobs = static_cast<int32_t>(*v);
    }
  } else if (auto v = get_integer_in(body, "logprobs", 0, kMaxTopLogprobs)) {
    // Legacy: an integer, the number of alternatives (OpenAI allows 5; vLLM, as here, 20).
    o.logprobs = true;
    o.top_logprobs = static_cast<int32_t>(*v);
  }
  if (auto v = get_integer_in(body, "prompt_logprobs", 0, kMaxTopLogprobs))
    o.prompt_logprobs = static_cast<int32_t>(*v);
  o.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (!o.stream) throw_api(bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options"));
    o.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  o.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  parse_unsupported(body, o);
  parse_logit_bias(body, o);
  parse_constraint(body, o);
  o.cache_salt = get_string(body, "cache_salt", "cache_salt");
  if (o.cache_salt && (o.cache_salt->empty() || o.cache_salt->size() > 1024)) {
    throw_api(bad_request("'cache_salt' must be a non-empty string of at most 1024 bytes", "cache_salt"));
  }
  return o;
}

// Message content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<std::string> parse_content(const json& msg, const std::string& param) {
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) wrong_type(param, "a string or an array of content parts", *it);
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& part = (*it)[i];
    const std::string part_param = fmt::format("{}[{}]", param, i);
    if (!part.is_object()) wrong_type(part_param, "an object", part);
    auto type = get_string(part, "type", part_param + ".type");
    if (type != "text") {
      throw_api(bad_request(fmt::format("'{}.type' must be \"text\" (this model accepts text only)", part_param),
                            part_param + ".type"));
    }
    auto t = get_string(part, "text", part_param + ".text");
    if (!t) throw_api(bad_request(fmt::format("'{}.text' is required", part_param), part_param + ".text"));
    text += *t;
  }
  return text;
}

ChatMessage parse_message(const json& msg, size_t index) {
  const std::string param = fmt::format("messages[{}]", index);
  if (!msg.is_object()) wrong_type(param, "an object", msg);
  ChatMessage m;
  auto role = get_string(msg, "role", param + ".role");
  if (!role) throw_api(bad_request(fmt::format("'{}.role' is required", param), param + ".role"));
  static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
  if (std::find(std::begin(kRoles), std::end(kRoles), *role) == std::end(kRoles)) {
    throw_api(bad_request(fmt::format("'{}.role' must be one of system, developer, user, assistant, tool; got '{}'",
                                      param, *role),
                          param + ".role"));
  }
  m.role = *role == "developer" ? "system" : *role;
  m.content = parse_content(msg, param + ".content");
  m.name = get_string(msg, "name", param + ".name");
  m.reasoning_content = get_string(msg, "reasoning_content", param + ".reasoning_content");
  m.tool_call_id = get_string(msg, "tool_call_id", param + ".tool_call_id");
  if (const json* calls = field(msg, "tool_calls")) {
    if (!calls->is_array()) wrong_type(param + ".tool_calls", "an array", *calls);
    for (size_t i = 0; i < calls->size(); ++i) {
      const json& c = (*calls)[i];
      const std::string cp = fmt::format("{}.tool_calls[{}]", param, i);
      if (!c.is_object()) wrong_type(cp, "an object", c);
      const json* fn = field(c, "function");
      if (!fn || !fn->is_object())
        throw_api(bad_request(fmt::format("'{}.function' must be an object", cp), cp + ".function"));
      ToolCall call;
      call.id = get_string(c, "id", cp + ".id").value_or("");
      auto name = get_string(*fn, "name", cp + ".function.name");
      if (!name) throw_api(bad_request(fmt::format("'{}.function.name' is required", cp), cp + ".function.name"));
      call.name = *name;
      const json* args = field(*fn, "arguments");
      call.arguments = !args ? "{}" : (args->is_string() ? args->get<std::string>() : args->dump());
      // The arguments text is parsed again for the chat template: its own nesting counts.
      if (json_nesting_depth(call.arguments, kMaxJsonDepth) > kMaxJsonDepth) {
        throw_api(
            bad_request(fmt::format("'{}.function.arguments' is JSON nested deeper than {} levels", cp, kMaxJsonDepth),
                        cp + ".function.arguments"));
      }
      m.tool_calls.push_back(std::move(call));
    }
  }
  if (!m.content && m.tool_calls.empty() && m.role != "assistant") {
    throw_api(bad_request(fmt::format("'{}.content' is required for role '{}'", param, m.role), param + ".content"));
  }
  if (m.role == "tool" && !m.content)
    throw_api(bad_request(fmt::format("'{}.content' is required", param), param + ".content"));
  return m;
}

ToolDefinition parse_tool(const json& t, size_t index) {
  const std::string param = fmt::format("tools[{}]", index);
  if (!t.is_object()) wrong_type(param, "an object", t);
  auto type = get_string(t, "type", param + ".type");
  if (type != "function") throw_api(bad_request(fmt::format("'{}.type' must be \"function\"", param), param + ".type"));
  const json* fn = field(t, "function");
  if (!fn) throw_api(bad_request(fmt::format("'{}.function' is required", param), param + ".function"));
  if (!fn->is_object()) wrong_type(param + ".function", "an object", *fn);
  ToolDefinition d;
  auto name = get_string(*fn, "name", param + ".function.name");
  if (!name || name->empty())
    throw_api(bad_request(fmt::format("'{}.function.name' is required", param), param + ".function.name"));
  d.name = *name;
  d.description = get_string(*fn, "description", param + ".function.description").value_or("");
  if (const json* p = field(*fn, "parameters")) {
    if (!p->is_object()) wrong_type(param + ".function.parameters", "an object", *p);
    d.parameters = *p;
  } else {
    d.parameters = json::object();
  }
  return d;
}

// Byte offset of the first invalid UTF-8 sequence (overlongs, surrogates and code points
// above U+10FFFF included), or npos.
size_t invalid_utf8_offset(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0)
      len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      len = 4, cp = c & 0x07;
    else
      return i;
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

}  // namespace

json parse_json_body(const std::string& body) {
  if (body.empty()) throw_api(bad_request("the request body is empty; send a JSON object"));
  // Checked before parsing so that a hostile body cannot make the parser build a huge nested tree.
  if (json_nesting_depth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    throw_api(bad_request(fmt::format("the request JSON is nested deeper than {} levels", kMaxJsonDepth)));
  }
  if (const size_t bad = invalid_utf8_offset(body); bad != std::string::npos) {
    throw_api(bad_request(fmt::format("the request body is not valid UTF-8 (byte {})", bad)));
  }
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at ..." -> "parse error at ..."
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    throw_api(bad_request("the request body is not valid JSON: " + what));
  }
}

namespace {
// The most keys an object inside `v` has (v nests at most kMaxJsonDepth deep).
size_t largest_object(const json& v) {
  size_t most = v.is_object() ? v.size() : 0;
  if (v.is_structured())
    for (const auto& e : v) most = std::max(most, largest_object(e));
  return most;
}
}  // namespace

void keep_declared_order(const json& sorted_body, const std::string& raw_body, GenerationOptions& options,
                         std::vector<ToolDefinition>* tools) {
  const bool schema = options.constraint && options.constraint->kind == ConstraintSpec::Kind::kJsonSchema;
  if (!schema && (!tools || tools->empty())) return;
  if (json_nesting_depth(raw_body, kMaxJsonDepth) > kMaxJsonDepth || largest_object(sorted_body) > kMaxOrderedKeys)
    return;
  const nlohmann::ordered_json body = nlohmann::ordered_json::parse(raw_body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return;
  // The ordered value replaces the sorted one only where both hold the same schema.
  auto same = [](const nlohmann::ordered_json& ordered, const json& sorted) { return json(ordered) == sorted; };
  if (schema) {
    const nlohmann::ordered_json* v = &body;
    size_t from = 0;
    const std::string& path = options.constraint_param;  // e.g. "response_format.json_schema.schema"
    while (v && from <= path.size()) {
      const size_t dot = std::min(path.find('.', from), path.size());
      const std::string key = path.substr(from, dot - from);
      v = v->is_object() && v->contains(key) ? &(*v)[key] : nullptr;
      from = dot + 1;
    }
    if (v && v->is_string()) {
      const std::string text = v->get<std::string>();
      nlohmann::ordered_json parsed;
      if (json_nesting_depth(text, kMaxJsonDepth) <= kMaxJsonDepth &&
          largest_object(json(options.constraint->json)) <= kMaxOrderedKeys)
        parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded() && same(parsed, json(options.constraint->json))) options.constraint->json = parsed;
    } else if (v && same(*v, json(options.constraint->json))) {
      options.constraint->json = *v;
    }
  }
  if (tools && body.contains("tools") && body["tools"].is_array() && body["tools"].size() == tools->size()) {
    for (size_t i = 0; i < tools->size(); ++i) {
      const nlohmann::ordered_json& t = body["tools"][i];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
      const nlohmann::ordered_json& fn = t["function"];
      if (fn.contains("parameters") && same(fn["parameters"], (*tools)[i].parameters))
        (*tools)[i].ordered_parameters = fn["parameters"];
    }
  }
}

ChatRequest parse_chat_request(const json& body, const ParseLimits& limits) {
  require_object(body);
  ChatRequest r;
  r.options = parse_options(body, limits, /*chat=*/true);
  const json* messages = field(body, "messages");
  if (!messages) throw_api(bad_request("'messages' is required", "messages"));
  if (!messages->is_array()) wrong_type("messages", "an array", *messages);
  if (messages->empty()) throw_api(bad_request("'messages' must hold at least one message", "messages"));
  for (size_t i = 0; i < messages->size(); ++i) r.messages.push_back(parse_message((*messages)[i], i));
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) r.tools.push_back(parse_tool((*tools)[i], i));
  }
  r.tools_enabled = !r.tools.empty();
  if (const json* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      const auto c = choice->get<std::string>();
      if (c == "none")
        r.tools_enabled = false;
      else if (c == "required")
        r.tool_required = true;
      else if (c != "auto")
        throw_api(bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or a function", "tool_choice"));
    } else if (choice->is_object()) {
      const json* fn = field(*choice, "function");
      auto name = fn && fn->is_object() ? get_string(*fn, "name", "tool_choice.function.name") : std::nullopt;
      if (!name) throw_api(bad_request("'tool_choice.function.name' is required", "tool_choice.function.name"));
      bool known = false;
      for (const auto& t : r.tools) known |= t.name == *name;
      if (!known)
        throw_api(bad_request(fmt::format("'tool_choice' names '{}', which is not in 'tools'", *name), "tool_choice"));
      r.forced_tool = *name;
    } else {
      wrong_type("tool_choice", "a string or an object", *choice);
    }
  }
  if ((r.tool_required || r.forced_tool) && r.tools.empty())
    throw_api(bad_request("'tool_choice' asks for a tool call but 'tools' is empty", "tool_choice"));
  if ((r.tool_required || r.forced_tool) && r.options.constraint) {
    throw_api(bad_request(fmt::format("'tool_choice' forces a tool call; '{}' cannot constrain the output as well",
                                      r.options.constraint_param),
                          r.options.constraint_param));
  }
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
    r.enable_thinking = get_bool(*kw, "enable_thinking");
  }
  return r;
}

CompletionRequest parse_completion_request(const json& body, const ParseLimits& limits) {
  require_object(body);
  CompletionRequest r;
  r.options = parse_options(body, limits, /*chat=*/false);
  const json* prompt = field(body, "prompt");
  if (!prompt) throw_api(bad_request("'prompt' is required", "prompt"));
  auto token_list = [](const json& arr, const std::string& param) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < arr.size(); ++i) {
      if (!arr[i].is_number_integer()) wrong_type(fmt::format("{}[{}]", param, i), "an integer token id", arr[i]);
      const int64_t id = arr[i].get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max())
        out_of_range(fmt::format("{}[{}]", param, i), "is not a valid token id");
      ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
  };
  if (prompt->is_string()) {
    r.prompts.emplace_back(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) throw_api(bad_request("'prompt' must not be empty", "prompt"));
    if ((*prompt)[0].is_number()) {
      r.prompts.emplace_back(token_list(*prompt, "prompt"));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& p = (*prompt)[i];
        const std::string param = fmt::format("prompt[{}]", i);
        if (p.is_string())
          r.prompts.emplace_back(p.get<std::string>());
        else if (p.is_array() && !p.empty())
          r.prompts.emplace_back(token_list(p, param));
        else
          wrong_type(param, "a string or a non-empty array of token ids", p);
      }
    }
    if (static_cast<int32_t>(r.prompts.size()) * r.options.n > limits.max_n) {
      out_of_range("prompt", fmt::format("times 'n' asks for {} choices; at most {} are allowed",
                                         r.prompts.size() * r.options.n, limits.max_n));
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or an array of token ids", *prompt);
  }
  r.echo = get_bool(body, "echo").value_or(false);
  if (r.options.max_tokens == 0 && !r.echo) {
    out_of_range(max_tokens_key(body),
                 "must be at least 1, got 0 (0 only with 'echo': the prompt back, scored with 'logprobs')");
  }
  if (const json* suffix = field(body, "suffix")) {
    if (!suffix->is_string()) wrong_type("suffix", "a string", *suffix);
    if (!suffix->get<std::string>().empty()) throw_api(bad_request("'suffix' is not supported", "suffix"));
  }
  return r;
}

TokenizeRequest parse_tokenize_request(const json& body) {
  require_object(body);
  TokenizeRequest r;
  r.model = get_string(body, "model", "model");
  // vLLM uses "prompt"; llama.cpp uses "content".
  auto text = get_string(body, "prompt", "prompt");
  if (!text) text = get_string(body, "content", "content");
  if (!text) throw_api(bad_request("'prompt' is required", "prompt"));
  r.text = *text;
  r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
  return r;
}

DetokenizeRequest parse_detokenize_request(const json& body) {
  require_object(body);
  DetokenizeRequest r;
  r.model = get_string(body, "model", "model");
  const json* tokens = field(body, "tokens");
  if (!tokens) throw_api(bad_request("'tokens' is required", "tokens"));
  if (!tokens->is_array()) wrong_type("tokens", "an array of token ids", *tokens);
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    if (!t.is_number_integer()) wrong_type(fmt::format("tokens[{}]", i), "an integer", t);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      out_of_range(fmt::format("tokens[{}]", i), "is not a valid token id");
    r.tokens.push_back(static_cast<int32_t>(id));
  }
  return r;
}

json messages_to_template_json(const std::vector<ChatMessage>& messages) {
  json out = json::array();
  for (const auto& m : messages) {
    json j = {{"role", m.role}};
    j["content"] = m.content ? json(*m.content) : json(nullptr);
    if (m.name) j["name"] = *m.name;
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    if (m.tool_call_id) j["tool_call_id"] = *m.tool_call_id;
    if (!m.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& c : m.tool_calls) {
        // HF templates want arguments as a mapping (they |tojson it themselves). Text that is
        // not JSON, or nests too deeply (the parser refuses it first), stays a string.
        std::optional<json> parsed = parse_json_within(c.arguments, kMaxJsonDepth);
        json fn = json::object();
        fn["name"] = c.name;
        fn["arguments"] = parsed ? std::move(*parsed) : json(c.arguments);
        json call = json::object();
        call["id"] = c.id;
        call["type"] = "function";
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      j["tool_calls"] = std::move(calls);
    }
    out.push_back(std::move(j));
  }
  return out;
}

json tools_to_template_json(const std::vector<ToolDefinition>& tools) {
  json out = json::array();
  for (const auto& t : tools) {
    json fn = {{"name", t.name}, {"parameters", t.parameters}};
    if (!t.description.empty()) fn["description"] = t.description;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

json error_to_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param ? json(*e.param) : json(nullptr);
  err["code"] = e.code ? json(*e.code) : json(nullptr);
  return {{"error", std::move(err)}};
}

std::string sse_error_and_done(const ApiError& e) {
  return "data: " + error_to_json(e).dump(-1, ' ', false, json::error_handler_t::replace) + "\n\ndata: [DONE]\n\n";
}

}  // namespace infera::server
