#include "infera/server/request_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace infera::server {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() <= 5 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_'; }

// Both literal addresses of the same family and bytes (so "::1" equals "0:0::1").
bool same_address(const std::string& a, const std::string& b) {
  unsigned char x[16], y[16];
  if (inet_pton(AF_INET, a.c_str(), x) == 1 && inet_pton(AF_INET, b.c_str(), y) == 1) return std::memcmp(x, y, 4) == 0;
  if (inet_pton(AF_INET6, a.c_str(), x) == 1 && inet_pton(AF_INET6, b.c_str(), y) == 1)
    return std::memcmp(x, y, 16) == 0;
  return false;
}

bool contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// "scheme://authority" of an Origin header, lower-cased, without a default port; "" when
// malformed (a path, no scheme).
std::string normalise_origin(std::string_view origin) {
  origin = trim(origin);
  while (!origin.empty() && origin.back() == '/') origin.remove_suffix(1);
  const std::string o = lower(origin);
  const size_t sep = o.find("://");
  if (sep == std::string::npos || sep == 0) return "";
  const std::string scheme = o.substr(0, sep);
  std::string authority = o.substr(sep + 3);
  if (authority.empty() || authority.find_first_of("/?#@ ") != std::string::npos) return "";
  if (host_name_of(authority).empty()) return "";
  if (scheme == "http" && authority.ends_with(":80")) authority.resize(authority.size() - 3);
  if (scheme == "https" && authority.ends_with(":443")) authority.resize(authority.size() - 4);
  return scheme + "://" + authority;
}

}  // namespace

std::string host_name_of(std::string_view authority) {
  authority = trim(authority);
  if (authority.empty()) return "";
  std::string_view name;
  std::string_view rest;
  if (authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return "";
    name = authority.substr(1, close - 1);
    rest = authority.substr(close + 1);
    const std::string n(name);
    unsigned char buf[16];
    if (inet_pton(AF_INET6, n.c_str(), buf) != 1) return "";
  } else {
    const size_t colon = authority.find(':');
    if (colon != std::string_view::npos && authority.find(':', colon + 1) != std::string_view::npos) return "";
    name = authority.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view() : authority.substr(colon);
    if (name.empty()) return "";
  }
  if (!rest.empty() && !(rest.front() == ':' && all_digits(rest.substr(1)))) return "";
  std::string out = lower(name);
  if (authority.front() != '[') {
    if (!std::all_of(out.begin(), out.end(), name_char)) return "";
    if (out.size() > 1 && out.back() == '.') out.pop_back();  // "localhost." is localhost
  }
  return out;
}

bool is_ip_literal(std::string_view name) {
  const std::string n(name);
  unsigned char buf[16];
  return inet_pton(AF_INET, n.c_str(), buf) == 1 || inet_pton(AF_INET6, n.c_str(), buf) == 1;
}

bool is_loopback_host(std::string_view name_in) {
  const std::string name = lower(name_in);
  if (name == "localhost" || name.ends_with(".localhost")) return true;
  unsigned char buf[16];
  if (inet_pton(AF_INET, name.c_str(), buf) == 1) return buf[0] == 127;
  if (inet_pton(AF_INET6, name.c_str(), buf) == 1) {
    static const unsigned char loopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static const unsigned char mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(buf, loopback6, 16) == 0) return true;
    return std::memcmp(buf, mapped_prefix, 12) == 0 && buf[12] == 127;  // ::ffff:127.x.y.z
  }
  return false;
}

bool is_json_content_type(std::string_view content_type) {
  std::string_view media = content_type.substr(0, content_type.find(';'));
  return lower(trim(media)) == "application/json";
}

RequestGuard::RequestGuard(GuardConfig config) : config_(std::move(config)) {
  for (auto& h : config_.allowed_hosts) {
    if (h == "*") continue;
    std::string name = host_name_of(h);
    h = name.empty() ? lower(trim(h)) : name;  // a bare IPv6 address has no brackets
  }
  for (auto& o : config_.allowed_origins) {
    if (o == "*") continue;
    std::string n = normalise_origin(o);
    o = n.empty() ? lower(trim(o)) : n;
  }
  const std::string b = lower(trim(config_.bound_host));
  wildcard_bind_ = b.empty() || b == "0.0.0.0" || b == "::" || b == "[::]";
  bound_name_ = is_ip_literal(b) ? b : host_name_of(b);
}

std::optional<GuardDenial> RequestGuard::check(const GuardRequest& r) const {
  if (config_.keys_enabled) return std::nullopt;
  if (r.path == "/health" || r.path == "/ready") return std::nullopt;

  if (r.host) {
    const std::string name = host_name_of(*r.host);
    bool ok = false;
    if (!name.empty()) {
      ok = is_loopback_host(name) || contains(config_.allowed_hosts, "*") || contains(config_.allowed_hosts, name) ||
           (wildcard_bind_ && is_ip_literal(name)) || name == bound_name_ ||
           (is_ip_literal(name) && is_ip_literal(bound_name_) && same_address(name, bound_name_));
      if (!ok) {
        for (const auto& h : config_.allowed_hosts) {
          if (is_ip_literal(h) && same_address(h, name)) ok = true;
        }
      }
    }
    if (!ok) {
      return GuardDenial{
          403, "host_not_allowed",
          "the Host header names a host this server does not answer to without API keys (a web page may be "
          "trying to reach it); add the name with --allowed-host (server.allowed_hosts) or configure API keys"};
    }
  }

  if (r.origin) {
    bool ok = contains(config_.allowed_origins, "*");
    const std::string origin = normalise_origin(*r.origin);
    if (!ok && !origin.empty()) {
      ok = contains(config_.allowed_origins, origin);
      if (!ok && r.host) {
        const std::string own = lower(trim(*r.host));
        ok = origin == "http://" + own || origin == "https://" + own || normalise_origin("http://" + own) == origin;
      }
    }
    if (!ok) {
      return GuardDenial{403, "origin_not_allowed",
                         "requests from web pages of another origin are refused without API keys; add the origin with "
                         "--allowed-origin (server.allowed_origins) or configure API keys"};
    }
  }

  if (r.method == "POST" && !(r.content_type && is_json_content_type(*r.content_type))) {
    return GuardDenial{415, "unsupported_media_type",
                       fmt::format("POST {} needs 'Content-Type: application/json'{}", r.path,
                                   r.content_type ? fmt::format(", not '{}'", r.content_type->substr(0, 100))
                                                  : std::string())};
  }
  return std::nullopt;
}

}  // namespace infera::server
