// The OpenAI response writer, beside the request parser (openai_api.h): a generation
// job's whole response, its SSE chunks, usage, and errors in OpenAI's shape as HTTP
// responses. Pure JSON; nothing here touches a socket or a thread.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "infera/server/api_error.h"
#include "infera/server/generation_job.h"
#include "infera/server/http_transport.h"

namespace infera::server {

ApiError make_error(int status, std::string type, std::string message, std::optional<std::string> code = std::nullopt,
                    std::optional<std::string> param = std::nullopt);
// A bug: a generic message (details only in the server log).
ApiError internal_error();
ApiError timeout_error(double timeout_s);

// JSON text; invalid UTF-8 (there should be none) becomes U+FFFD rather than an exception.
std::string dump_json(const nlohmann::json& j);
HttpResponse json_response(const nlohmann::json& j, int status = 200);
HttpResponse error_response(const ApiError& e);  // with Retry-After when set
std::string sse(const nlohmann::json& j);  // one `data:` event
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

nlohmann::json usage_json(const Job& job);
// The engine's own timings of the job, beside `usage` in a whole response and in the
// stream's usage chunk, under llama-server's names (not all with its meanings):
// `queue_ms` submission to the first choice scheduled; `cache_n` prompt tokens served by the
// prefix cache; `prompt_n` the others; `prompt_ms` from the first choice scheduled to the
// last choice's first token; `predicted_n` completion tokens; `predicted_ms` from the first
// first token to the last choice's finish (its last token, or later for a stop string or a
// cancel); the rates over those windows, `predicted_per_second` counting each choice's tokens
// after its first (llama-server counts every token), absent where there is no time to divide
// by. A job with no token has them all 0.
nlohmann::json timings_json(const Job& job);
// The non-streaming body (chat.completion / text_completion).
nlohmann::json final_response(const Job& job);
// One chunk object around `choices`.
nlohmann::json chunk(const Job& job, nlohmann::json choices);
// The SSE chunks one event produces for its choice, appended to `out`.
void stream_chunks(const Job& job, Choice& c, const OutputDelta& d, bool finished, std::string& out);

}  // namespace infera::server
