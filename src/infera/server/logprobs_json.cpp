#include "infera/server/logprobs_json.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "infera/server/api_error.h"
#include "infera/tokenizer/unicode.h"

namespace infera::server {

using nlohmann::json;

namespace {

std::string token_string(std::string_view bytes) {
  if (unicode::find_invalid_utf8(bytes) == std::string_view::npos) return std::string(bytes);
  std::string text;
  unicode::Utf8Stream stream;
  stream.push(bytes, text);
  stream.flush(text);
  return text;
}

json bytes_json(std::string_view bytes) {
  json out = json::array();
  for (char c : bytes) out.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return out;
}

json chat_entry(const Tokenizer& tok, const TokenLogprob& t) {
  const std::string_view bytes = tok.token_bytes(t.token);
  return {{"token", token_string(bytes)}, {"logprob", t.logprob}, {"bytes", bytes_json(bytes)}};
}

}  // namespace

int64_t code_point_count(std::string_view text) {
  int64_t n = 0;
  size_t pos = 0;
  char32_t cp;
  while (pos < text.size()) {
    unicode::next_code_point(text, pos, cp);
    ++n;
  }
  return n;
}

json chat_logprobs_content(const Tokenizer& tok, std::span<const TokenLogprobs> tokens) {
  json content = json::array();
  for (const TokenLogprobs& lp : tokens) {
    json entry = chat_entry(tok, lp.sampled);
    json top = json::array();
    for (const TokenLogprob& t : lp.top) top.push_back(chat_entry(tok, t));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return content;
}

json chat_logprobs(const Tokenizer& tok, std::span<const TokenLogprobs> tokens) {
  return {{"content", chat_logprobs_content(tok, tokens)}, {"refusal", nullptr}};
}

json completion_logprobs(const Tokenizer& tok, std::span<const TokenLogprobs> tokens, int64_t& text_offset) {
  json texts = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& lp : tokens) {
    const std::string text = token_string(tok.token_bytes(lp.sampled.token));
    texts.push_back(text);
    logprobs.push_back(lp.sampled.logprob);
    // The top alternatives and, as OpenAI does, always the sampled token (so up to N + 1
    // entries). Two ids with the same text share one key: the likelier one stays.
    json top = json::object();
    for (const TokenLogprob& t : lp.top) {
      const std::string key = token_string(tok.token_bytes(t.token));
      if (!top.contains(key)) top[key] = t.logprob;
    }
    if (!top.contains(text)) top[text] = lp.sampled.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += code_point_count(text);
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json completion_prompt_logprobs(const Tokenizer& tok, int32_t first_token, std::span<const TokenLogprobs> rest,
                                int64_t& text_offset) {
  const std::string first = token_string(tok.token_bytes(first_token));
  json out = {{"tokens", json::array({first})},
              {"token_logprobs", json::array({nullptr})},
              {"top_logprobs", json::array({nullptr})},
              {"text_offset", json::array({text_offset})}};
  text_offset += code_point_count(first);
  append_completion_logprobs(out, completion_logprobs(tok, rest, text_offset));
  return out;
}

json vllm_prompt_logprobs(const Tokenizer& tok, std::span<const TokenLogprobs> rest, int32_t top_n) {
  json out = json::array({nullptr});
  for (const TokenLogprobs& lp : rest) {
    json entry = json::object();
    const int32_t n = std::min<int32_t>(top_n, static_cast<int32_t>(lp.top.size()));
    for (int32_t i = 0; i < n; ++i) {
      const TokenLogprob& t = lp.top[i];
      entry[std::to_string(t.token)] = {{"logprob", t.logprob},
                                        {"rank", i + 1},
                                        {"decoded_token", token_string(tok.token_bytes(t.token))}};
    }
    entry[std::to_string(lp.sampled.token)] = {{"logprob", lp.sampled.logprob},
                                               {"rank", lp.sampled_rank},
                                               {"decoded_token", token_string(tok.token_bytes(lp.sampled.token))}};
    out.push_back(std::move(entry));
  }
  return out;
}

void append_completion_logprobs(json& into, const json& more) {
  if (more.is_null()) return;
  if (into.is_null()) {
    into = more;
    return;
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    json& to = into[key];
    for (const json& v : more[key]) to.push_back(v);
  }
}

int64_t prompt_scoring_entries(const PromptScoringAsk& ask, std::span<const int64_t> prompt_tokens) {
  const int64_t per_token =
      (ask.prompt_logprobs >= 0 ? ask.prompt_logprobs + 1 : 0) + (ask.echo_logprobs >= 0 ? ask.echo_logprobs + 1 : 0);
  int64_t tokens = 0;
  for (int64_t t : prompt_tokens) tokens += t;
  return static_cast<int64_t>(ask.n) * tokens * per_token;
}

void check_prompt_scoring_size(const PromptScoringAsk& ask, std::span<const int64_t> prompt_tokens) {
  const int64_t entries = prompt_scoring_entries(ask, prompt_tokens);
  if (entries <= kMaxPromptLogprobEntries) return;
  const char* param = ask.prompt_logprobs >= 0 ? "prompt_logprobs" : "logprobs";
  throw_api(bad_request(fmt::format("the response would hold {} prompt log-probability entries (n x prompt tokens x "
                                    "(alternatives + 1) for prompt_logprobs and for echo with logprobs), more than {}; "
                                    "lower n, logprobs or prompt_logprobs, or shorten the prompt",
                                    entries, kMaxPromptLogprobEntries),
                        param));
}

}  // namespace infera::server
