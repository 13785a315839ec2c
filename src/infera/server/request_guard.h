// Keeps web browsers out of a server that has no API keys. Without keys anything that
// can reach the port may use it, and a web page the user visits can reach a loopback
// port: by DNS rebinding (its own host name resolving to 127.0.0.1, so the Host header
// carries that name) or by a cross-site "simple" POST (text/plain, no preflight). So,
// when no keys are configured, before the body is read:
//   - Host, when present, must name a loopback address (127.0.0.0/8, ::1, localhost,
//     *.localhost), the bound address (any IP literal when bound to 0.0.0.0 / ::: an
//     address cannot be rebound) or one of allowed_hosts ("*": any);
//   - Origin, when present, must be the server's own (http://<Host>) or one of
//     allowed_origins ("*": any); "null" (sandboxed frames, file://) is refused;
//   - POST bodies must be Content-Type: application/json (415 otherwise).
// /health and /ready stay open to every Host (probes address the pod by any name). With
// API keys none of this applies: a page cannot send the key without the key's owner.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace infera::server {

struct GuardConfig {
  bool keys_enabled = false;
  std::string bound_host;  // the listen address (server.host)
  std::vector<std::string> allowed_hosts;  // host names (no port); "*": any
  std::vector<std::string> allowed_origins;  // scheme://host[:port]; "*": any
};

// The headers the guard reads; null when the request has none.
struct GuardRequest {
  std::string_view method;
  std::string_view path;
  const std::string* host = nullptr;
  const std::string* origin = nullptr;
  const std::string* content_type = nullptr;
};

struct GuardDenial {
  int status = 403;  // 403 (host, origin) or 415 (content type)
  std::string code;  // host_not_allowed, origin_not_allowed, unsupported_media_type
  std::string message;
};

class RequestGuard {
 public:
  explicit RequestGuard(GuardConfig config);
  // Nothing when the request may proceed.
  std::optional<GuardDenial> check(const GuardRequest& request) const;

 private:
  GuardConfig config_;
  bool wildcard_bind_ = false;
  std::string bound_name_;  // the bound address, normalised
};

// Host name of a Host header value or an origin's authority, lower-cased, without port
// or IPv6 brackets ("" when malformed).
std::string host_name_of(std::string_view authority);
// 127.0.0.0/8, ::1, localhost and *.localhost (RFC 6761: always loopback).
bool is_loopback_host(std::string_view name);
// A literal IPv4 or IPv6 address (no DNS name that could be rebound).
bool is_ip_literal(std::string_view name);
// "application/json" with optional parameters, case-insensitive.
bool is_json_content_type(std::string_view content_type);

}  // namespace infera::server
