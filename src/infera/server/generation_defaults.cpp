#include "infera/server/generation_defaults.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/base/text_file.h"

namespace infera::server {
namespace fs = std::filesystem;

namespace {

// At most this many stop strings, each at most this long, as ParseLimits' defaults allow a
// request.
constexpr size_t kMaxStops = 16, kMaxStopLength = 256;

// The number under `key` when it is one within [lo, hi] (exclusive of lo when open_lo).
std::optional<double> number_in(const nlohmann::json& j, const char* key, double lo, double hi, bool open_lo,
                                const std::string& source, std::vector<std::string>* ignored) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_number()) {
    const double v = it->get<double>();
    if ((open_lo ? v > lo : v >= lo) && v <= hi) return v;
  }
  if (ignored) {
    ignored->push_back(fmt::format("{}: {} {} is not a number in {}{}, {}]", source, key, json_excerpt(*it, 40),
                                   open_lo ? '(' : '[', lo, hi));
  }
  return std::nullopt;
}

}  // namespace

bool GenerationDefaults::empty() const {
  return !temperature && !top_p && !min_p && !repetition_penalty && !presence_penalty && !frequency_penalty && !top_k &&
         stop.empty() && !system && messages.empty();
}

namespace {

bool is_system_turn(const ChatMessage& m) { return m.role == "system" || m.role == "developer"; }

// `to` + a blank line + `from`'s text (Ollama's collate joins same-role neighbours so).
void join_into(ChatMessage& to, const ChatMessage& from) {
  to.content = to.content.value_or("") + "\n\n" + from.content.value_or("");
}

// A plain turn: text only (no tool calls or results, no reasoning, no name), safe to join.
bool plain_turn(const ChatMessage& m) {
  return m.tool_calls.empty() && !m.tool_call_id && !m.reasoning_content && !m.name;
}

}  // namespace

size_t GenerationDefaults::apply_chat(std::vector<ChatMessage>& chat) const {
  const bool own_system = !chat.empty() && is_system_turn(chat.front());
  auto preset = messages.begin();
  // The model's system turns: its system prompt and its presets' leading system messages, as
  // one message; a chat's own system message replaces them all.
  std::optional<ChatMessage> model_system;
  if (!own_system && system) {
    model_system.emplace();
    model_system->role = "system";
    model_system->content = *system;
  }
  for (; preset != messages.end() && is_system_turn(*preset); ++preset) {
    if (own_system) continue;
    if (model_system)
      join_into(*model_system, *preset);
    else
      model_system = *preset;
  }
  // The other presets after the chat's leading system messages; where the last meets a chat
  // turn of its own role, the two are one (templates that want roles to alternate take it).
  auto at = std::find_if_not(chat.begin(), chat.end(), is_system_turn);
  if (preset != messages.end()) {
    const auto n = messages.end() - preset;
    at = chat.insert(at, preset, messages.end()) + n;
    if (at != chat.end() && at->role == (at - 1)->role && plain_turn(*at)) {
      join_into(*(at - 1), *at);
      at = chat.erase(at) - 1;  // (the joined turn differs from chat to chat)
    }
  }
  size_t shared = static_cast<size_t>(at - chat.begin());
  if (model_system) {
    chat.insert(chat.begin(), std::move(*model_system));
    ++shared;
  }
  return shared;
}

GenerationDefaults GenerationDefaults::taken_by(uint32_t given) const {
  GenerationDefaults t;
  const auto take = [given](const auto& value, auto& to, uint32_t bit) {
    if (!(given & bit)) to = value;
  };
  take(temperature, t.temperature, kGivenTemperature);
  take(top_p, t.top_p, kGivenTopP);
  take(top_k, t.top_k, kGivenTopK);
  take(min_p, t.min_p, kGivenMinP);
  take(repetition_penalty, t.repetition_penalty, kGivenRepetitionPenalty);
  take(presence_penalty, t.presence_penalty, kGivenPresencePenalty);
  take(frequency_penalty, t.frequency_penalty, kGivenFrequencyPenalty);
  take(stop, t.stop, kGivenStop);
  t.source = source;
  return t;
}

void GenerationDefaults::apply(GenerationOptions& o) const {
  const GenerationDefaults t = taken_by(o.given);
  if (t.temperature) o.temperature = *t.temperature;
  if (t.top_p) o.top_p = *t.top_p;
  if (t.top_k) o.top_k = *t.top_k;
  if (t.min_p) o.min_p = *t.min_p;
  if (t.repetition_penalty) o.repetition_penalty = *t.repetition_penalty;
  if (t.presence_penalty) o.presence_penalty = *t.presence_penalty;
  if (t.frequency_penalty) o.frequency_penalty = *t.frequency_penalty;
  if (!t.stop.empty()) o.stop = t.stop;
}

SamplingParams sampling_of(const GenerationOptions& o) {
  SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_p = o.top_p;
  sp.top_k = o.top_k;
  sp.min_p = o.min_p;
  sp.presence_penalty = o.presence_penalty;
  sp.frequency_penalty = o.frequency_penalty;
  sp.repetition_penalty = o.repetition_penalty;
  return sp;
}

std::string GenerationDefaults::describe() const {
  std::string out;
  const auto add = [&out](const std::string& item) { out += (out.empty() ? "" : ", ") + item; };
  if (temperature) add(fmt::format("temperature {}", *temperature));
  if (top_p) add(fmt::format("top_p {}", *top_p));
  if (top_k) add(fmt::format("top_k {}", *top_k));
  if (min_p) add(fmt::format("min_p {}", *min_p));
  if (repetition_penalty) add(fmt::format("repetition_penalty {}", *repetition_penalty));
  if (presence_penalty) add(fmt::format("presence_penalty {}", *presence_penalty));
  if (frequency_penalty) add(fmt::format("frequency_penalty {}", *frequency_penalty));
  if (!stop.empty()) add(fmt::format("{} stop string{}", stop.size(), stop.size() == 1 ? "" : "s"));
  if (system) add(fmt::format("a system prompt of {} bytes", system->size()));
  if (!messages.empty()) add(fmt::format("{} preset message{}", messages.size(), messages.size() == 1 ? "" : "s"));
  return out.empty() ? "none" : out;
}

GenerationDefaults parse_generation_defaults(const nlohmann::json& j, const std::string& source,
                                             std::vector<std::string>* ignored, DefaultsKind kind) {
  GenerationDefaults d;
  d.source = source;
  if (!j.is_object()) return d;
  const bool hf = kind == DefaultsKind::kGenerationConfig;
  // A generation_config.json value equal to transformers' own default (temperature 1, top_p
  // 1, top_k 50, repetition_penalty 1) says nothing of the model: vLLM reads the file's
  // difference from those (to_diff_dict), so such a value is not taken either.
  const auto transformers_default = [hf](const char* key, double v) {
    if (!hf) return false;
    const std::string_view k = key;
    return ((k == "temperature" || k == "top_p" || k == "repetition_penalty") && v == 1.0) || (k == "top_k" && v == 50);
  };
  const auto take = [&](const char* key, double lo, double hi, bool open_lo) -> std::optional<double> {
    std::optional<double> v = number_in(j, key, lo, hi, open_lo, source, ignored);
    return v && transformers_default(key, *v) ? std::nullopt : v;
  };
  // The ranges a request may send (openai_api.cpp parse_options).
  if (auto v = take("temperature", 0.0, 2.0, false)) d.temperature = static_cast<float>(*v);
  if (auto v = take("top_p", 0.0, 1.0, true)) d.top_p = static_cast<float>(*v);
  if (auto v = take("top_k", -1, 1 << 20, false)) {
    if (*v == std::floor(*v)) {
      d.top_k = static_cast<int32_t>(std::max(*v, 0.0));  // (-1 or 0: off)
    } else if (ignored) {
      ignored->push_back(fmt::format("{}: top_k {} is not a whole number", source, *v));
    }
  }
  if (auto v = take("min_p", 0.0, 1.0, false)) d.min_p = static_cast<float>(*v);
  if (auto v = take(hf ? "repetition_penalty" : "repeat_penalty", 0.0, 10.0, true)) {
    d.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = take("presence_penalty", -2.0, 2.0, false)) d.presence_penalty = static_cast<float>(*v);
  if (auto v = take("frequency_penalty", -2.0, 2.0, false)) d.frequency_penalty = static_cast<float>(*v);
  if (const auto it = j.find("stop"); !hf && it != j.end() && !it->is_null()) {
    const nlohmann::json list = it->is_string() ? nlohmann::json::array({*it}) : *it;
    const bool ok =
        list.is_array() && list.size() <= kMaxStops &&
        std::all_of(list.begin(), list.end(), [](const nlohmann::json& s) {
          return s.is_string() && !s.get<std::string>().empty() && s.get<std::string>().size() <= kMaxStopLength;
        });
    if (ok) {
      for (const auto& s : list) d.stop.push_back(s.get<std::string>());
    } else if (ignored) {
      ignored->push_back(fmt::format("{}: stop {} is not a list of at most {} strings of 1 to {} bytes", source,
                                     json_excerpt(*it, 40), kMaxStops, kMaxStopLength));
    }
  }
  // Settings of the file Infera does not take as request defaults: named, so nobody
  // wonders why they have no effect.
  static constexpr const char* kUnused[] = {"max_new_tokens", "num_predict", "num_ctx",      "repeat_last_n",
                                            "seed",           "mirostat",    "mirostat_eta", "mirostat_tau",
                                            "typical_p",      "tfs_z",       "num_keep",     "penalize_newline"};
  for (const char* key : kUnused) {
    if (ignored && j.contains(key)) ignored->push_back(fmt::format("{}: {} is not applied", source, key));
  }
  return d;
}

std::vector<ChatMessage> parse_preset_messages(const nlohmann::json& j, const std::string& source) {
  if (!j.is_array()) fail("{}: expected a JSON array of messages", source);
  if (j.size() > kMaxPresetMessages)
    fail("{}: {} messages, more than the {} taken", source, j.size(), kMaxPresetMessages);
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    const auto role = e.is_object() ? e.find("role") : e.end();
    if (!e.is_object() || role == e.end() || !role->is_string() ||
        (*role != "system" && *role != "user" && *role != "assistant")) {
      fail("{}: message {} ({}) is not an object with a role of system, user or assistant", source, i,
           json_excerpt(e, 60));
    }
    ChatMessage m;
    m.role = role->get<std::string>();
    const auto content = e.find("content");
    if (content != e.end() && !content->is_null() && !content->is_string())
      fail("{}: message {}'s content {} is not a string", source, i, json_excerpt(*content, 40));
    m.content = content != e.end() && content->is_string() ? content->get<std::string>() : std::string();
    out.push_back(std::move(m));
  }
  return out;
}

namespace {

// The defaults in `file` (automatic: the model's own, advisory; else the deployment's).
GenerationDefaults load_defaults_file(const fs::path& file, DefaultsKind kind, bool automatic) {
  nlohmann::json j;
  try {
    j = read_json_file(file.string(), "cannot read the generation defaults (generation_config)");
    if (!j.is_object()) fail("{}: expected a JSON object of sampling defaults (generation_config)", file.string());
  } catch (const Error& e) {
    // The model's own file (auto) is advisory, as vLLM treats it: the model serves without
    // its defaults. A file the deployment names is not.
    if (!automatic) throw;
    GenerationDefaults none;
    none.ignored.push_back(fmt::format("{} (no sampling defaults taken from it)", e.what()));
    return none;
  }
  std::vector<std::string> ignored;
  GenerationDefaults d = parse_generation_defaults(j, file.string(), &ignored, kind);
  d.ignored = std::move(ignored);
  return d;
}

}  // namespace

GenerationDefaults load_generation_defaults(const ModelDeployConfig& m) {
  const std::string& how = m.generation_config;
  if (how == "none" || how == "vllm") return {};  // ("vllm": vLLM's name for the same)
  fs::path file;
  std::error_code ec;
  DefaultsKind kind = DefaultsKind::kGenerationConfig;
  if (how.empty() || how == "auto") {
    // An Ollama model's system prompt and preset messages, with its params or without.
    std::optional<std::string> system;
    std::vector<ChatMessage> messages;
    std::vector<std::string> problems;
    if (!m.ollama_system.empty()) {
      try {
        std::string text = read_text_file(m.ollama_system, "the system prompt", kMaxSystemBytes);
        if (!text.empty()) system = std::move(text);  // (an empty one is none, as in Ollama)
      } catch (const Error& e) {
        problems.push_back(e.what());
      }
    }
    if (!m.ollama_messages.empty()) {
      try {
        const std::string text = read_text_file(m.ollama_messages, "the preset messages", kMaxSystemBytes);
        const std::optional<nlohmann::json> j = parse_json_within(text, kMaxJsonFileDepth);
        if (!j) fail("{}: the preset messages are not JSON (or nest too deep)", m.ollama_messages);
        messages = parse_preset_messages(*j, m.ollama_messages);
      } catch (const Error& e) {
        problems.push_back(fmt::format("{} (no preset messages taken)", e.what()));
      }
    }
    const auto with_system = [&](GenerationDefaults d) {
      // `source`: every file that gave something ("" where none did)
      std::string source = d.empty() ? std::string() : d.source;
      const auto from = [&source](const std::string& file) { source += (source.empty() ? "" : ", ") + file; };
      if (system) {
        d.system = std::move(system);
        from(m.ollama_system);
      }
      if (!messages.empty()) {
        d.messages = std::move(messages);
        from(m.ollama_messages);
      }
      d.source = source;
      d.ignored.insert(d.ignored.end(), problems.begin(), problems.end());
      return d;
    };
    if (!m.ollama_params.empty()) {
      file = m.ollama_params;
      kind = DefaultsKind::kOllamaParams;
    } else if (fs::is_directory(m.path, ec) && fs::is_regular_file(fs::path(m.path) / "generation_config.json", ec)) {
      file = fs::path(m.path) / "generation_config.json";
    } else {
      return with_system({});  // a GGUF file, a directory without one
    }
    return with_system(load_defaults_file(file, kind, true));
  }
  file = fs::is_directory(how, ec) ? fs::path(how) / "generation_config.json" : fs::path(how);
  if (!fs::is_regular_file(file, ec)) {
    fail("'{}' is neither auto, none nor a generation_config.json (or a folder holding one)", how);
  }
  return load_defaults_file(file, kind, false);
}

}  // namespace infera::server
