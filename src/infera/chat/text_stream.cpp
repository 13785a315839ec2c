#include "infera/chat/text_stream.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/json_file.h"

namespace infera::chat {

namespace {
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";
// Model output is as untrusted as a request: a tool call nested deeper than this is text.
constexpr int kMaxToolCallDepth = 64;
constexpr size_t kMaxOrderedKeys = 256;

// The most keys an object inside `v` has (v nests at most kMaxToolCallDepth deep).
size_t largest_object(const nlohmann::json& v) {
  size_t most = v.is_object() ? v.size() : 0;
  if (v.is_structured())
    for (const auto& e : v) most = std::max(most, largest_object(e));
  return most;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string new_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}
}  // namespace

size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const size_t longest = std::min(text.size(), marker.empty() ? 0 : marker.size() - 1);
  for (size_t len = longest; len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::feed(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  size_t first = std::string::npos;
  for (const auto& stop : stops_) first = std::min(first, pending_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  size_t hold = 0;
  for (const auto& stop : stops_) hold = std::max(hold, partial_marker_suffix(pending_, stop));
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

// ---------------------------------------------------------------------------------------
OutputRouter::OutputRouter(Options options) : options_(options) {
  if (!options_.parse_reasoning) {
    mode_ = Mode::kContent;
  } else {
    mode_ = options_.start_in_reasoning ? Mode::kReasoning : Mode::kStart;
  }
}

OutputDelta OutputRouter::feed(std::string_view text) {
  OutputDelta out;
  pending_.append(text);
  route(out, false);
  return out;
}

OutputDelta OutputRouter::finish() {
  OutputDelta out;
  route(out, true);
  if (mode_ == Mode::kToolCalls) parse_tool_block(out);
  return out;
}

void OutputRouter::route(OutputDelta& out, bool at_end) {
  while (true) {
    switch (mode_) {
      case Mode::kStart: {
        // Reasoning only counts when <think> opens the output (after whitespace).
        size_t lead = 0;
        while (lead < pending_.size() && is_space(pending_[lead])) ++lead;
        std::string_view rest = std::string_view(pending_).substr(lead);
        if (rest.starts_with(kThinkOpen)) {
          pending_.erase(0, lead + kThinkOpen.size());
          mode_ = Mode::kReasoning;
          continue;
        }
        if (!at_end && kThinkOpen.starts_with(rest)) return;  // maybe <think> still coming
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kReasoning: {
        const size_t close = pending_.find(kThinkClose);
        if (close != std::string::npos) {
          out.reasoning.append(pending_, 0, close);
          pending_.erase(0, close + kThinkClose.size());
          mode_ = Mode::kContent;
          strip_leading_newlines_ = true;
          continue;
        }
        const size_t hold = at_end ? 0 : partial_marker_suffix(pending_, kThinkClose);
        out.reasoning.append(pending_, 0, pending_.size() - hold);
        pending_.erase(0, pending_.size() - hold);
        return;
      }
      case Mode::kContent: {
        if (strip_leading_newlines_) {
          size_t lead = 0;
          while (lead < pending_.size() && is_space(pending_[lead])) ++lead;
          pending_.erase(0, lead);
          if (pending_.empty()) return;
          strip_leading_newlines_ = false;
        }
        if (!options_.parse_tool_calls) {
          out.content.append(pending_);
          pending_.clear();
          return;
        }
        const size_t open = pending_.find(kToolOpen);
        if (open != std::string::npos) {
          out.content.append(pending_, 0, open);
          tool_text_.append(pending_, open);
          pending_.clear();
          mode_ = Mode::kToolCalls;
          return;
        }
        const size_t hold = at_end ? 0 : partial_marker_suffix(pending_, kToolOpen);
        out.content.append(pending_, 0, pending_.size() - hold);
        pending_.erase(0, pending_.size() - hold);
        return;
      }
      case Mode::kToolCalls:
        tool_text_.append(pending_);
        pending_.clear();
        return;
    }
  }
}

void OutputRouter::parse_tool_block(OutputDelta& out) {
  std::vector<ToolCall> calls;
  std::string outside;  // text between / after blocks
  std::string_view rest = tool_text_;
  bool ok = true;
  while (ok) {
    const size_t open = rest.find(kToolOpen);
    if (open == std::string_view::npos) {
      outside.append(rest);
      break;
    }
    outside.append(rest.substr(0, open));
    rest.remove_prefix(open + kToolOpen.size());
    size_t close = rest.find(kToolClose);
    // A block cut off by max_tokens / EOS without its closing tag still counts if its JSON is whole.
    std::string_view body = rest.substr(0, close == std::string_view::npos ? rest.size() : close);
    rest.remove_prefix(close == std::string_view::npos ? rest.size() : close + kToolClose.size());
    std::optional<nlohmann::json> parsed = parse_json_within(trim(body), kMaxToolCallDepth);
    if (!parsed || !parsed->is_object() || !parsed->contains("name") || !(*parsed)["name"].is_string()) {
      ok = false;
      break;
    }
    // Parsed again keeping key order: the arguments are passed on with their keys as the
    // model wrote them (in a schema's declared order when constrained), not sorted. Not for
    // objects past kMaxOrderedKeys keys (ordered_json inserts in linear time per key).
    nlohmann::ordered_json j;
    if (largest_object(*parsed) <= kMaxOrderedKeys) j = nlohmann::ordered_json::parse(trim(body), nullptr, false);
    if (!j.is_object()) j = nlohmann::ordered_json(*parsed);
    ToolCall call;
    call.id = new_tool_call_id();
    call.name = j["name"].get<std::string>();
    const auto it = j.contains("arguments") ? j.find("arguments") : j.find("parameters");
    if (it == j.end())
      call.arguments = "{}";
    else
      call.arguments = it->is_string() ? it->get<std::string>()
                                       : it->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    calls.push_back(std::move(call));
  }
  if (!ok || calls.empty()) {
    out.content.append(tool_text_);
  } else {
    if (!trim(outside).empty()) out.content.append(trim(outside));
    tool_calls_ = std::move(calls);
  }
  tool_text_.clear();
}

}  // namespace infera::chat
