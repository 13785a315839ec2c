// Errors a client can cause, in OpenAI's shape: {"error": {"message", "type", "param",
// "code"}} with an HTTP status. Thrown while validating a request and turned into a
// response at the HTTP edge; never carries paths or internals.
#pragma once

#include <optional>
#include <string>

namespace infera::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::optional<std::string> param;  // the offending field, dotted ("messages[2].role")
  std::optional<std::string> code;  // e.g. "model_not_found", "context_length_exceeded"
  int retry_after_s = 0;  // > 0: sent as Retry-After (429, 503)
};

inline ApiError bad_request(std::string message, std::optional<std::string> param = std::nullopt,
                            std::optional<std::string> code = std::nullopt) {
  return ApiError{400, "invalid_request_error", std::move(message), std::move(param), std::move(code), 0};
}

// Thrown by request parsing; caught at the route boundary.
struct ApiException {
  ApiError error;
};

[[noreturn]] inline void throw_api(ApiError e) { throw ApiException{std::move(e)}; }

}  // namespace infera::server
