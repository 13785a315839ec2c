// Log-probabilities in OpenAI's two response shapes, from the engine's per-token
// TokenLogprobs (raw model distribution; runtime/sampler.h):
//   chat        choices[i].logprobs = {"content": [{token, logprob, bytes, top_logprobs:
//               [{token, logprob, bytes}]}], "refusal": null}
//   completions choices[i].logprobs = {tokens, token_logprobs, top_logprobs (one
//               {token text: logprob} object per token), text_offset}
// A token's text is its bytes as UTF-8, a piece of a multi-byte character shown as
// U+FFFD; `bytes` always carries the exact bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "infera/runtime/sampler.h"
#include "infera/tokenizer/tokenizer.h"

namespace infera::server {

// The chat "content" array for these tokens.
nlohmann::json chat_logprobs_content(const Tokenizer& tok, std::span<const TokenLogprobs> tokens);
// The whole chat "logprobs" object.
nlohmann::json chat_logprobs(const Tokenizer& tok, std::span<const TokenLogprobs> tokens);

// The legacy completions object for these tokens. `text_offset` is the position (in
// Unicode code points) in the choice's text where the first token starts; it is advanced
// past the tokens, so consecutive stream chunks continue where the last one ended.
nlohmann::json completion_logprobs(const Tokenizer& tok, std::span<const TokenLogprobs> tokens, int64_t& text_offset);
// The same object for an echoed prompt (`echo` with `logprobs`): its first token with
// null logprob and top_logprobs (nothing before it predicts it, as OpenAI reports), then
// `rest`, the engine's entries for prompt tokens 1... Offsets count the token strings.
nlohmann::json completion_prompt_logprobs(const Tokenizer& tok, int32_t first_token,
                                          std::span<const TokenLogprobs> rest, int64_t& text_offset);
// vLLM's `prompt_logprobs`: null for the first prompt token, then per prompt token an object
// keyed by token id (as a string) holding {logprob, rank, decoded_token} of the prompt
// token and of its `top_n` most likely alternatives (so up to top_n + 1 keys).
nlohmann::json vllm_prompt_logprobs(const Tokenizer& tok, std::span<const TokenLogprobs> rest, int32_t top_n);
// Appends the entries of `more` (a completions object, or null) to `into` (null: becomes `more`).
void append_completion_logprobs(nlohmann::json& into, const nlohmann::json& more);

// Unicode code points of UTF-8 text (an invalid byte counts as one).
int64_t code_point_count(std::string_view text);

// The most prompt-scoring entries one response may hold: each choice carries its prompt's
// tokens times (alternatives + 1), for `prompt_logprobs` and for `echo` with `logprobs`
// (an entry is 40-80 bytes of JSON, so about 50 MB). Without a bound, n x echo x logprobs
// x prompt_logprobs turns a 40 KB request into gigabytes of JSON.
inline constexpr int64_t kMaxPromptLogprobEntries = 1'000'000;

struct PromptScoringAsk {
  int32_t n = 1;  // choices per prompt
  int32_t prompt_logprobs = -1;  // alternatives per prompt token; -1: not asked
  int32_t echo_logprobs = -1;  // echo with logprobs: alternatives per token; -1: not asked
};
// The entries `ask` puts in the response for prompts of these token counts.
int64_t prompt_scoring_entries(const PromptScoringAsk& ask, std::span<const int64_t> prompt_tokens);
// Throws ApiException (400, naming the parameters) past kMaxPromptLogprobEntries.
void check_prompt_scoring_size(const PromptScoringAsk& ask, std::span<const int64_t> prompt_tokens);

}  // namespace infera::server
