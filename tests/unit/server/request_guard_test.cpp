#include "infera/server/request_guard.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace infera::server {
namespace {

struct Req {
  std::string method = "POST";
  std::string path = "/v1/chat/completions";
  std::optional<std::string> host = "127.0.0.1:8000";
  std::optional<std::string> origin;
  std::optional<std::string> content_type = "application/json";
};

std::optional<GuardDenial> check(const RequestGuard& g, const Req& r) {
  GuardRequest q;
  q.method = r.method;
  q.path = r.path;
  q.host = r.host ? &*r.host : nullptr;
  q.origin = r.origin ? &*r.origin : nullptr;
  q.content_type = r.content_type ? &*r.content_type : nullptr;
  return g.check(q);
}

int status(const RequestGuard& g, const Req& r) {
  auto d = check(g, r);
  return d ? d->status : 200;
}

RequestGuard loopback(std::vector<std::string> hosts = {}, std::vector<std::string> origins = {}) {
  return RequestGuard({false, "127.0.0.1", std::move(hosts), std::move(origins)});
}

TEST(RequestGuard, HostNames) {
  EXPECT_EQ(host_name_of("LocalHost:8000"), "localhost");
  EXPECT_EQ(host_name_of("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(host_name_of("[::1]:80"), "::1");
  EXPECT_EQ(host_name_of("localhost."), "localhost");
  EXPECT_EQ(host_name_of("::1"), "");  // IPv6 needs brackets
  EXPECT_EQ(host_name_of("a:b:c"), "");
  EXPECT_EQ(host_name_of("host:port"), "");
  EXPECT_EQ(host_name_of("host:123456"), "");
  EXPECT_EQ(host_name_of("[::1"), "");
  EXPECT_EQ(host_name_of("[nothost]"), "");
  EXPECT_EQ(host_name_of("evil.com/x"), "");
  EXPECT_EQ(host_name_of(""), "");
  EXPECT_EQ(host_name_of(":80"), "");
  EXPECT_TRUE(is_loopback_host("127.5.6.7"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("0:0:0:0:0:0:0:1"));
  EXPECT_TRUE(is_loopback_host("::ffff:127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("app.localhost"));
  EXPECT_FALSE(is_loopback_host("localhost.evil.com"));
  EXPECT_FALSE(is_loopback_host("128.0.0.1"));
  EXPECT_FALSE(is_loopback_host("::2"));
  EXPECT_TRUE(is_ip_literal("10.0.0.1"));
  EXPECT_TRUE(is_ip_literal("fe80::1"));
  EXPECT_FALSE(is_ip_literal("example.com"));
  EXPECT_TRUE(is_json_content_type("application/json"));
  EXPECT_TRUE(is_json_content_type("Application/JSON; charset=utf-8"));
  EXPECT_FALSE(is_json_content_type("text/plain"));
  EXPECT_FALSE(is_json_content_type("application/jsonx"));
  EXPECT_FALSE(is_json_content_type("application/x-www-form-urlencoded"));
  EXPECT_FALSE(is_json_content_type(""));
}

TEST(RequestGuard, KeylessServerAnswersOnlyLoopbackHosts) {
  const RequestGuard g = loopback();
  EXPECT_EQ(status(g, {}), 200);
  for (const char* host : {"localhost:8000", "LOCALHOST", "[::1]:8000", "127.0.0.2", "my.localhost:1"}) {
    Req r;
    r.host = host;
    EXPECT_EQ(status(g, r), 200) << host;
  }
  for (const char* host :
       {"evil.example:8000", "attacker.com", "localhost.attacker.com", "10.0.0.1", "", "a b", "[::1"}) {
    Req r;
    r.host = host;
    auto d = check(g, r);
    ASSERT_TRUE(d) << host;
    EXPECT_EQ(d->status, 403);
    EXPECT_EQ(d->code, "host_not_allowed");
  }
  Req none;  // no Host header (HTTP/1.0 tools): not a browser
  none.host.reset();
  EXPECT_EQ(status(g, none), 200);
  Req get;  // GETs too: a rebinding page could read /v1/models or /metrics
  get.method = "GET";
  get.path = "/v1/models";
  get.host = "rebind.attacker.com";
  get.content_type.reset();
  EXPECT_EQ(status(g, get), 403);
}

TEST(RequestGuard, HealthAndReadyStayOpen) {
  const RequestGuard g = loopback();
  for (const char* path : {"/health", "/ready"}) {
    Req r;
    r.method = "GET";
    r.path = path;
    r.host = "pod-1234.cluster.internal";
    r.origin = "http://evil.com";
    r.content_type.reset();
    EXPECT_EQ(status(g, r), 200) << path;
  }
}

// Each Host header against a guard, and the status it should get.
void expect_hosts(const RequestGuard& g, const std::vector<std::pair<std::string, int>>& cases) {
  Req r;
  for (const auto& [host, want] : cases) {
    r.host = host;
    EXPECT_EQ(status(g, r), want) << host;
  }
}

TEST(RequestGuard, ConfiguredAndBoundHosts) {
  const RequestGuard g = loopback({"infera.internal", "GPU-BOX:9000", "fd00::5"});
  expect_hosts(g, {{"Infera.Internal:8000", 200}, {"gpu-box", 200}, {"[fd00::5]:8000", 200}, {"other.internal", 403}});
  expect_hosts(loopback({"*"}), {{"other.internal", 200}});
  expect_hosts(RequestGuard({false, "192.168.1.20", {}, {}}),
               {{"192.168.1.20:8000", 200}, {"192.168.1.21:8000", 403}, {"localhost:8000", 200}});
  // Bound to every address: any IP literal (an address cannot be rebound), no names.
  expect_hosts(RequestGuard({false, "0.0.0.0", {}, {}}),
               {{"10.1.2.3:8000", 200}, {"[2001:db8::1]:8000", 200}, {"myhost.lan:8000", 403}});
}

TEST(RequestGuard, OriginMustBeOwnOrConfigured) {
  const RequestGuard g = loopback({}, {"http://localhost:3000", "HTTPS://App.Example.com/"});
  Req r;
  r.host = "localhost:8000";
  for (const char* origin : {"http://localhost:8000", "http://LOCALHOST:8000", "http://localhost:3000",
                             "https://app.example.com", "https://app.example.com:443"}) {
    r.origin = origin;
    EXPECT_EQ(status(g, r), 200) << origin;
  }
  for (const char* origin : {"http://evil.com", "null", "", "http://localhost:8001", "https://app.example.com:8443",
                             "http://localhost:8000/path", "localhost:8000", "http://user@localhost:8000"}) {
    r.origin = origin;
    auto d = check(g, r);
    ASSERT_TRUE(d) << origin;
    EXPECT_EQ(d->status, 403);
    EXPECT_EQ(d->code, "origin_not_allowed");
  }
  r.host.reset();  // no Host: only configured origins
  r.origin = "http://localhost:8000";
  EXPECT_EQ(status(g, r), 403);
  r.origin = "http://localhost:3000";
  EXPECT_EQ(status(g, r), 200);
  const RequestGuard any = loopback({}, {"*"});
  r.origin = "http://whatever.example";
  EXPECT_EQ(status(any, r), 200);
}

TEST(RequestGuard, PostsMustBeJson) {
  const RequestGuard g = loopback();
  Req r;
  for (const char* ct :
       {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "json"}) {
    r.content_type = ct;
    auto d = check(g, r);
    ASSERT_TRUE(d) << ct;
    EXPECT_EQ(d->status, 415);
    EXPECT_EQ(d->code, "unsupported_media_type");
  }
  r.content_type.reset();
  EXPECT_EQ(status(g, r), 415);
  r.content_type = "application/json; charset=utf-8";
  EXPECT_EQ(status(g, r), 200);
  r.method = "GET";  // GETs have no body
  r.path = "/v1/models";
  r.content_type = "text/plain";
  EXPECT_EQ(status(g, r), 200);
}

TEST(RequestGuard, KeysTurnItOff) {
  const RequestGuard g({true, "127.0.0.1", {}, {}});
  Req r;
  r.host = "attacker.com";
  r.origin = "http://attacker.com";
  r.content_type = "text/plain";
  EXPECT_EQ(status(g, r), 200);
}

}  // namespace
}  // namespace infera::server
