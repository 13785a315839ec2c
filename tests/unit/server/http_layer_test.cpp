// The HTTP layer under hostile clients, over raw sockets: body limits whatever the
// framing, compressed bodies, head limits, strict framing (no request smuggling), Range,
// many idle or slow connections and many streams without a thread each, and shutdown
// (cancelling what runs after the drain, a stop at once, a client that leaves a
// non-streaming request). A scripted backend (fake_backend.h) stands in for the engine.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../test_support.h"
#include "fake_backend.h"
#include "infera/chat/chat_template.h"
#include "infera/server/http_server.h"
#include "server_fixture.h"

namespace infera::server {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using namespace std::chrono_literals;
using test::wait_for;
using Clock = std::chrono::steady_clock;

const std::string kStories = test::stories_dir();

struct Options {
  int64_t body_limit = 4096;
  std::vector<ApiKeyConfig> keys;
  std::chrono::milliseconds delay = 1ms;
  double timeout_s = 30;
  double head_timeout_s = 10;
  std::string script = "Once upon a time, there was a little girl.";
  std::vector<int32_t> script_ids;  // instead of `script` when set
};

class Server {
 public:
  explicit Server(const Options& o = {}) {
    auto m = testing::stories_instance("stories");
    const Tokenizer& tok = m->tokenizer();
    backend = std::make_shared<FakeBackend>(o.script_ids.empty() ? tok.encode(o.script, false) : o.script_ids, o.delay);
    m->set_backend(backend);
    ServerConfig c;
    c.body_limit_bytes = o.body_limit;
    c.api_keys = o.keys;
    c.request_timeout_s = o.timeout_s;
    c.head_timeout_s = o.head_timeout_s;
    server = testing::start_server(c, {m});
  }
  ~Server() {
    if (server) server->stop();
  }
  int port() const { return server->port(); }

  std::shared_ptr<FakeBackend> backend;
  std::unique_ptr<HttpServer> server;
};

// A raw client connection.
class Conn {
 public:
  explicit Conn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  bool ok() const { return ok_; }

  // False when the peer closed before everything was sent.
  bool send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads until `done(buffer)` or the peer closes or `limit` passes.
  std::string read_until(const std::function<bool(const std::string&)>& done,
                         std::chrono::milliseconds limit = 5000ms) {
    const auto until = Clock::now() + limit;
    while (!done(buf_)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      char tmp[65536];
      const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (n <= 0) {
        peer_closed_ = true;
        break;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
    return buf_;
  }

  // One response with a Content-Length body (or until the close); returns its status
  // (0: none) and leaves the rest buffered.
  int response(std::string* body = nullptr, std::string* head = nullptr, std::chrono::milliseconds limit = 5000ms) {
    auto complete = [](const std::string& b) {
      const size_t end = b.find("\r\n\r\n");
      if (end == std::string::npos) return false;
      const size_t cl = lower(b.substr(0, end)).find("content-length:");
      if (cl == std::string::npos) return false;
      return b.size() >= end + 4 + std::stoul(b.substr(cl + 15));
    };
    read_until(complete, limit);
    const size_t end = buf_.find("\r\n\r\n");
    if (buf_.size() < 12 || !buf_.starts_with("HTTP/1.") || end == std::string::npos) return 0;
    const int status = std::stoi(buf_.substr(9, 3));
    const std::string h = buf_.substr(0, end);
    size_t body_len = buf_.size() - end - 4;
    if (const size_t cl = lower(h).find("content-length:"); cl != std::string::npos)
      body_len = std::min(body_len, std::stoul(h.substr(cl + 15)));
    if (head) *head = h;
    if (body) *body = buf_.substr(end + 4, body_len);
    buf_.erase(0, end + 4 + body_len);
    return status;
  }

  // True when bytes (or the close) wait to be read.
  bool readable() const {
    pollfd p{fd_, POLLIN, 0};
    return !buf_.empty() || ::poll(&p, 1, 0) > 0;
  }

  // True when the server closes the connection within `limit` (bytes before the close are dropped).
  bool closed_by_peer(std::chrono::milliseconds limit = 3000ms) {
    read_until([](const std::string&) { return false; }, limit);
    return peer_closed_;
  }

  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  bool peer_closed_ = false;
  std::string buf_;
};

const std::string kChatBody = R"({"model":"stories","messages":[{"role":"user","content":"Hi"}],"max_tokens":3})";

std::string post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// GET /health on a fresh connection; the status (0: no answer within `limit`).
int health(int port, std::chrono::milliseconds limit = 5000ms) {
  Conn c(port);
  if (!c.ok() || !c.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")) return 0;
  return c.response(nullptr, nullptr, limit);
}

int process_threads() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("Threads:")) return std::stoi(line.substr(8));
  }
  return -1;
}

// Lifts the soft limit on open files to what `needed` descriptors take, if the hard limit allows.
bool ensure_open_files(rlim_t needed) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
  if (rl.rlim_cur >= needed) return true;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < needed) return false;
  rl.rlim_cur = needed;
  return ::setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

// ---- finding 2: bodies --------------------------------------------------------------

TEST(HttpLayer, ChunkedBodyOverTheLimitIs413) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;  // body limit 4096
  Conn c(s.port());
  ASSERT_TRUE(c.ok());
  std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: "
      "chunked\r\n\r\n";
  const std::string piece(1000, ' ');
  for (int i = 0; i < 8; ++i) req += "3e8\r\n" + piece + "\r\n";  // 8000 bytes, no end
  c.send(req);
  std::string body;
  EXPECT_EQ(c.response(&body), 413) << body;
  EXPECT_EQ(json::parse(body)["error"]["code"], "body_too_large");
  EXPECT_TRUE(c.closed_by_peer());
  // Endless chunks: the server stops reading and closes.
  Conn d(s.port());
  d.send(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: "
      "chunked\r\n\r\n");
  bool closed = false;
  for (int i = 0; i < 2000 && !closed && !d.readable(); ++i) closed = !d.send("3e8\r\n" + piece + "\r\n");
  EXPECT_EQ(d.response(), 413);
  EXPECT_EQ(health(s.port()), 200);
}

TEST(HttpLayer, ChunkedBodyWithinTheLimitIsServed) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  Conn c(s.port());
  std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: "
      "chunked\r\n\r\n";
  const size_t half = kChatBody.size() / 2;
  req += fmt::format("{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n", half, kChatBody.substr(0, half), kChatBody.size() - half,
                     kChatBody.substr(half));
  c.send(req);
  std::string body;
  ASSERT_EQ(c.response(&body), 200) << body;
  EXPECT_EQ(json::parse(body)["choices"][0]["finish_reason"], "length");
}

TEST(HttpLayer, ContentLengthOverTheLimitIsRefusedBeforeTheBody) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  Conn c(s.port());
  c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000000\r\n\r\n{");
  std::string body;
  EXPECT_EQ(c.response(&body, nullptr, 2000ms), 413) << body;
  EXPECT_TRUE(c.closed_by_peer());
}

TEST(HttpLayer, BodyWithoutALengthIsNotRead) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  // HTTP/1.0 without Content-Length: no body (never "until the close"); the JSON is missing.
  Conn c(s.port());
  c.send("POST /v1/chat/completions HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n\r\n" + kChatBody);
  std::string body;
  EXPECT_EQ(c.response(&body), 400) << body;
  EXPECT_TRUE(c.closed_by_peer());
}

TEST(HttpLayer, CompressedBodiesAre415) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  // A gzip member of 1 MiB of zeros would be ~1 KiB on the wire; nothing is inflated.
  for (const char* enc : {"gzip", "deflate", "br", "x-gzip", "gzip, identity"}) {
    Conn c(s.port());
    c.send(post("/v1/chat/completions", std::string(600, '\0'), std::string("Content-Encoding: ") + enc + "\r\n"));
    std::string body;
    EXPECT_EQ(c.response(&body), 415) << enc << ": " << body;
    EXPECT_EQ(json::parse(body)["error"]["code"], "unsupported_content_encoding");
  }
  Conn ok(s.port());
  ok.send(post("/v1/chat/completions", kChatBody, "Content-Encoding: identity\r\n"));
  EXPECT_EQ(ok.response(), 200);
}

TEST(HttpLayer, KeyIsCheckedBeforeTheBodyIsRead) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {{"k", "secret-key-1", {}, 0, 0, std::nullopt}};
  Server s(o);
  Conn c(s.port());
  // The head announces a body within the limit but never sends it: the answer comes anyway.
  c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4000\r\n\r\n");
  std::string body;
  EXPECT_EQ(c.response(&body, nullptr, 2000ms), 401) << body;
  EXPECT_EQ(json::parse(body)["error"]["code"], "missing_api_key");
}

// ---- finding 3: the request head ---------------------------------------------------------

TEST(HttpLayer, OverlongHeadIs431) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  Conn c(s.port());
  // One endless header line: answered (and closed) long before it ends.
  bool refused = !c.send("GET /health HTTP/1.1\r\nHost: localhost\r\nX-Long: ");
  for (int i = 0; i < 1000 && !refused && !c.readable(); ++i) refused = !c.send(std::string(1024, 'a'));
  EXPECT_EQ(c.response(), 431);
  // An endless request line.
  Conn d(s.port());
  d.send("GET /" + std::string(40000, 'a'));
  EXPECT_EQ(d.response(), 431);
  EXPECT_EQ(health(s.port()), 200);
}

TEST(HttpLayer, TooManyHeaderFieldsIs431) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  Conn c(s.port());
  std::string req = "GET /health HTTP/1.1\r\nHost: localhost\r\n";
  for (int i = 0; i < 1000; ++i) req += "X-" + std::to_string(i) + ": v\r\n";  // ~9 KB: small, but 1000 fields
  req += "\r\n";
  c.send(req);
  EXPECT_EQ(c.response(), 431);
  Conn d(s.port());
  std::string fine = "GET /health HTTP/1.1\r\nHost: localhost\r\n";
  for (int i = 0; i < 50; ++i) fine += "X-" + std::to_string(i) + ": v\r\n";
  d.send(fine + "\r\n");
  EXPECT_EQ(d.response(), 200);
}

// ---- finding 10: framing ---------------------------------------------------------------

TEST(HttpLayer, LenientFramingIs400AndCloses) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  const std::string body = kChatBody;
  const std::string cl = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  struct Case {
    const char* what;
    std::string request;
  };
  const std::vector<Case> cases = {
      {"bare LF", "POST /v1/chat/completions HTTP/1.1\nHost: localhost\nContent-Length: " +
                      std::to_string(body.size()) + "\n\n" + body},
      {"bare LF in one line", "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\n" + cl + "\r\n" + body},
      {"space before colon",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding : "
       "chunked\r\n" +
           cl + "\r\n" + body},
      {"negative length",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: "
       "-1\r\n\r\n" +
           body},
      {"duplicate length",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + cl + cl +
           "\r\n" + body},
      {"length list",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + ", " + std::to_string(body.size()) + "\r\n\r\n" + body},
      {"length and chunked",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + cl +
           "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
      {"other transfer coding",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: "
       "gzip, chunked\r\n\r\n0\r\n\r\n"},
      {"chunked twice",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: "
       "chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
      {"folded line",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-A: a\r\n b\r\n" +
           cl + "\r\n" + body},
      {"control byte",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-A: a\x01z\r\n" +
           cl + "\r\n" + body},
      {"bad chunk size",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: "
       "chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n"},
  };
  for (const Case& c : cases) {
    Conn conn(s.port());
    ASSERT_TRUE(conn.ok());
    // A second request rides behind the first: it must never be answered (smuggling).
    conn.send(c.request + "GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n");
    std::string rbody;
    EXPECT_EQ(conn.response(&rbody), 400) << c.what << ": " << rbody;
    EXPECT_TRUE(conn.closed_by_peer()) << c.what << ": the connection stayed open";
  }
  EXPECT_EQ(s.backend->submitted(), 0);
  EXPECT_EQ(health(s.port()), 200);
}

TEST(HttpLayer, HeaderValuesAreNotPercentDecoded) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.keys = {{"k", "secret-key-1", {}, 0, 0, std::nullopt}};
  Server s(o);
  Conn c(s.port());
  c.send(post("/v1/chat/completions", kChatBody, "Authorization: Bearer secret%2Dkey-1\r\n"));
  EXPECT_EQ(c.response(), 401);
  Conn d(s.port());
  d.send(post("/v1/chat/completions", kChatBody, "Authorization: Bearer secret-key-1\r\n"));
  EXPECT_EQ(d.response(), 200);
}

// ---- finding 9: Range ------------------------------------------------------------------

TEST(HttpLayer, RangeIsIgnored) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  std::string ranges = "bytes=0-10";
  for (int i = 0; i < 2000; ++i) ranges += ",0-" + std::to_string(i % 50 + 10);
  for (const char* target : {"/v1/models", "/health"}) {
    Conn c(s.port());
    c.send(std::string("GET ") + target + " HTTP/1.1\r\nHost: localhost\r\nRange: " + ranges + "\r\n\r\n");
    std::string body, head;
    ASSERT_EQ(c.response(&body, &head), 200) << target;
    EXPECT_EQ(Conn::lower(head).find("content-range"), std::string::npos) << head;
    EXPECT_TRUE(json::accept(body)) << body.substr(0, 200);
  }
  Conn c(s.port());
  c.send(post("/v1/chat/completions", kChatBody, "Range: bytes=0-1,2-3\r\n"));
  std::string body;
  ASSERT_EQ(c.response(&body), 200);
  EXPECT_TRUE(json::accept(body));
}

// ---- finding 4: idle and slow connections, streams ----------------------------------------

TEST(HttpLayer, HealthAnswersWithAThousandIdleAndSlowConnectionsOpen) {
  INFERA_REQUIRE_FIXTURE(kStories);
  constexpr int kIdle = 1000;
  if (!ensure_open_files(2 * kIdle + 256))
    GTEST_SKIP() << "the open-files hard limit (ulimit -Hn) is below " << 2 * kIdle + 256;
  Server s;
  std::vector<std::unique_ptr<Conn>> idle;
  for (int i = 0; i < kIdle; ++i) {
    auto c = std::make_unique<Conn>(s.port());
    ASSERT_TRUE(c->ok()) << "connection " << i;
    // A third send nothing, a third half a head (a slow client's first header line),
    // a third half a body.
    if (i % 3 == 1) c->send("GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: 1\r\n");
    if (i % 3 == 2)
      c->send("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{\"model\":");
    idle.push_back(std::move(c));
  }
  ASSERT_TRUE(wait_for([&] { return health(s.port()) == 200; }));
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    EXPECT_EQ(health(s.port(), 1000ms), 200);
    EXPECT_LT(Clock::now() - t0, 1000ms) << "round " << round;
    Conn r(s.port());
    r.send("GET /ready HTTP/1.1\r\nHost: localhost\r\n\r\n");
    EXPECT_EQ(r.response(nullptr, nullptr, 1000ms), 200);
  }
  // A slow client's next header line, much later, still finds its connection open (the
  // head timeout is seconds, not this short), and the request is answered.
  idle[1]->send("\r\n");
  EXPECT_EQ(idle[1]->response(), 200);
  EXPECT_LT(process_threads(), 200);
}

// A client that sends part of a request head and stalls, or trickles it a byte at a time,
// loses its connection once head_timeout_s has passed since its first byte (bytes that keep
// coming do not extend it): a 408 or the close without one (the socket is closed when its
// deadline passes); /health answers meanwhile and after.
TEST(HttpLayer, AStalledOrTricklingHeadIsCutOff) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.head_timeout_s = 0.3;
  Server s(o);
  Conn stalled(s.port());
  ASSERT_TRUE(stalled.ok());
  ASSERT_TRUE(stalled.send("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Ty"));
  Conn trickling(s.port());
  ASSERT_TRUE(trickling.ok());
  EXPECT_EQ(health(s.port()), 200);
  // A byte every 20 ms: a head that would take seconds; the server ends it first.
  const std::string head = "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + std::string(400, 'a');
  bool cut_off = false;
  for (char ch : head) {
    if (!trickling.send(std::string_view(&ch, 1)) || trickling.readable()) {
      cut_off = true;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(cut_off) << "the trickled head was read to its end";
  for (Conn* c : {&trickling, &stalled}) {
    std::string body;
    const int status = c->response(&body);
    EXPECT_TRUE(status == 0 || status == 408) << status << " " << body;
    if (status == 408) {
      EXPECT_EQ(json::parse(body)["error"]["code"], "request_timeout");
    }
    EXPECT_TRUE(c->closed_by_peer());
  }
  EXPECT_EQ(health(s.port()), 200);
  // A connection that has sent nothing is idle, not slow: the head timeout does not close it.
  Conn quiet(s.port());
  ASSERT_TRUE(quiet.ok());
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(quiet.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  EXPECT_EQ(quiet.response(), 200);
}

TEST(HttpLayer, ManyStreamsDoNotTakeAThreadEach) {
  INFERA_REQUIRE_FIXTURE(kStories);
  constexpr int kStreams = 256;
  if (!ensure_open_files(2 * kStreams + 256)) GTEST_SKIP() << "the open-files hard limit is too low";
  Options o;
  o.delay = 2ms;
  Server s(o);
  s.backend->set_paused(true);
  const int threads_before = process_threads();
  std::vector<std::unique_ptr<Conn>> streams;
  const std::string body =
      R"({"model":"stories","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_tokens":4})";
  for (int i = 0; i < kStreams; ++i) {
    auto c = std::make_unique<Conn>(s.port());
    ASSERT_TRUE(c->ok());
    c->send(post("/v1/chat/completions", body));
    streams.push_back(std::move(c));
  }
  ASSERT_TRUE(wait_for([&] { return s.backend->live() == kStreams; }, 20000ms)) << s.backend->live();
  EXPECT_EQ(health(s.port(), 1000ms), 200);
  EXPECT_LT(process_threads() - threads_before, 64) << "threads grew with the streams";
  s.backend->set_paused(false);
  int done = 0;
  for (auto& c : streams) {
    const std::string out =
        c->read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 20000ms);
    done += out.find("data: [DONE]") != std::string::npos;
  }
  EXPECT_EQ(done, kStreams);
  EXPECT_TRUE(wait_for([&] { return s.server->in_flight() == 0; }));
}

// ---- finding 13: shutdown and disconnects ------------------------------------------------

TEST(HttpLayer, ClientLeavingANonStreamingRequestCancelsIt) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  s.backend->set_paused(true);
  {
    Conn c(s.port());
    c.send(post("/v1/chat/completions", kChatBody));
    ASSERT_TRUE(wait_for([&] { return s.backend->live() == 1; }));
  }  // closed
  EXPECT_TRUE(wait_for([&] { return s.backend->cancels() == 1; })) << "no cancel after the client left";
  s.backend->set_paused(false);
  EXPECT_TRUE(wait_for([&] { return s.backend->live() == 0 && s.server->in_flight() == 0; }));
}

TEST(HttpLayer, DrainCancelsWhatIsLeftAfterTheGracePeriod) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  s.backend->set_paused(true);  // never finishes by itself
  Conn stream(s.port());
  stream.send(
      post("/v1/chat/completions", R"({"model":"stories","messages":[{"role":"user","content":"Hi"}],"stream":true})"));
  Conn plain(s.port());
  plain.send(post("/v1/chat/completions", kChatBody));
  ASSERT_TRUE(wait_for([&] { return s.backend->live() == 2; }));
  const auto t0 = Clock::now();
  s.server->drain_and_stop(0.3);
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_TRUE(wait_for([&] { return s.backend->cancels() == 2; })) << s.backend->cancels();
  EXPECT_TRUE(stream.closed_by_peer());
  EXPECT_TRUE(plain.closed_by_peer());
  s.backend->set_paused(false);
  EXPECT_TRUE(wait_for([&] { return s.backend->live() == 0; }));
  EXPECT_EQ(s.server->in_flight(), 0);
}

TEST(HttpLayer, StopDuringADrainStopsAtOnce) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  s.backend->set_paused(true);
  Conn c(s.port());
  c.send(post("/v1/chat/completions", kChatBody));
  ASSERT_TRUE(wait_for([&] { return s.backend->live() == 1; }));
  const auto t0 = Clock::now();
  std::thread drainer([&] { s.server->drain_and_stop(60); });  // the first signal
  ASSERT_TRUE(wait_for([&] { return s.server->draining(); }));
  s.server->stop();  // the second
  drainer.join();
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_TRUE(wait_for([&] { return s.backend->cancels() == 1; }));
  EXPECT_TRUE(c.closed_by_peer());
}

// An error inside one stream's pipeline (here: a token id the tokenizer cannot decode)
// ends that stream with an error event and [DONE]; the server goes on.
TEST(HttpLayer, AnErrorInAStreamEndsItWithAnErrorEvent) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Options o;
  o.script_ids = {1000000, 1000001};
  Server s(o);
  Conn c(s.port());
  c.send(
      post("/v1/chat/completions", R"({"model":"stories","messages":[{"role":"user","content":"Hi"}],"stream":true})"));
  const std::string out =
      c.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; });
  ASSERT_NE(out.find("data: [DONE]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"error\""), std::string::npos) << out;
  Conn d(s.port());
  d.send(post("/v1/chat/completions", kChatBody));
  std::string body;
  EXPECT_EQ(d.response(&body), 500) << body;
  EXPECT_EQ(health(s.port()), 200);
}

TEST(HttpLayer, PipelinedRequestsAreAnsweredInOrder) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  Conn c(s.port());
  c.send("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n" + post("/v1/chat/completions", kChatBody) +
         "GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n");
  std::string a, b, m;
  EXPECT_EQ(c.response(&a), 200);
  EXPECT_EQ(json::parse(a)["status"], "ok");
  EXPECT_EQ(c.response(&b), 200);
  EXPECT_EQ(json::parse(b)["object"], "chat.completion");
  EXPECT_EQ(c.response(&m), 200);
  EXPECT_EQ(json::parse(m)["object"], "list");
}

TEST(HttpLayer, ExpectContinueGetsAnInterimResponse) {
  INFERA_REQUIRE_FIXTURE(kStories);
  Server s;
  Conn c(s.port());
  c.send(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nExpect: "
      "100-continue\r\nContent-Length: " +
      std::to_string(kChatBody.size()) + "\r\n\r\n");
  const std::string interim =
      c.read_until([](const std::string& b) { return b.find("\r\n\r\n") != std::string::npos; });
  EXPECT_TRUE(interim.starts_with("HTTP/1.1 100")) << interim;
  c.send(kChatBody);
  std::string rest =
      c.read_until([](const std::string& b) { return b.find("\"chat.completion\"") != std::string::npos; });
  EXPECT_NE(rest.find("HTTP/1.1 200"), std::string::npos) << rest;
}

}  // namespace
}  // namespace infera::server
