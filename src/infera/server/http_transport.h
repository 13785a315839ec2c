// HTTP/1.1 transport of the server on Boost.Asio, with Boost.Beast's request parser: an
// asynchronous acceptor per port and one state machine per connection, all on a small
// pool of I/O threads (no thread is parked per connection or per stream). It knows
// nothing of OpenAI: a request goes to a Handler, which answers through its HttpExchange
// now or later, from any thread, in one piece or as a stream.
//
// What it enforces before any handler runs (docs/server.md, "HTTP layer"):
// - the request head (request line + headers) within `head_bytes`, at most `max_headers`
//   fields, complete within `head_timeout` (slow clients cannot hold a head open);
// - strict framing: CRLF line ends only, no folded header lines, no whitespace before a
//   header's colon, one Content-Length of digits only, Transfer-Encoding exactly
//   `chunked` and never together with Content-Length; anything else is 400 and the
//   connection closes (no request smuggling behind a proxy);
// - the body within `body_bytes` whatever its framing (chunked bodies included), read
//   within `body_timeout`; no Content-Encoding is decoded (the head check answers 415);
// - at most `max_connections` connections; idle keep-alive connections close after
//   `idle_timeout`; a client that does not take its response within `write_timeout`,
//   or lets more than `max_pending_output` bytes pile up, is dropped.
// Header values are never percent-decoded; Range is never honoured (always the whole body).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace infera::server {

struct HttpLimits {
  size_t head_bytes = 16 << 10;
  size_t max_headers = 100;
  uint64_t body_bytes = 4 << 20;
  std::chrono::milliseconds head_timeout{10'000};
  std::chrono::milliseconds idle_timeout{30'000};
  std::chrono::milliseconds body_timeout{60'000};
  std::chrono::milliseconds write_timeout{30'000};
  size_t max_connections = 4096;
  size_t max_pending_output = 16 << 20;
};

struct HttpHeader {
  std::string name;
  std::string value;
};

struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;  // target up to '?'
  int version = 11;  // 10 or 11
  std::vector<HttpHeader> headers;
  std::string body;

  // The first field of that name (case-insensitive), or nullptr.
  const std::string* find(std::string_view name) const;
  std::string header(std::string_view name) const;  // "" when absent
  bool has(std::string_view name) const { return find(name) != nullptr; }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<HttpHeader> headers;
  std::string body;
};

class HttpConnection;

// One request and its response. Thread-safe; every call after the response ended (or
// the client left) does nothing.
class HttpExchange {
 public:
  HttpExchange(std::shared_ptr<HttpConnection> connection, HttpRequest request);
  ~HttpExchange();
  const HttpRequest& request() const { return request_; }

  // A whole response; `on_sent` runs once its last byte is handed to the kernel (or the
  // client is gone).
  void respond(HttpResponse response, std::function<void()> on_sent = {});
  // A streamed response: the head now (chunked for HTTP/1.1, close-delimited for 1.0),
  // then write() pieces, then end().
  void begin_stream(HttpResponse head);
  void write(std::string data);
  void end(std::function<void()> on_sent = {});
  // Runs once, on an I/O thread, if the client disconnects (or stops reading) before the
  // response ended. Set it before starting work that should stop then.
  void on_disconnect(std::function<void()> f);

 private:
  std::shared_ptr<HttpConnection> connection_;
  HttpRequest request_;
  uint64_t gen_ = 0;
  bool answered_ = false;
};

// Called on an I/O thread with the complete request. Must not block: long work goes
// elsewhere (the exchange may be answered from any thread).
using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;
// Called on an I/O thread once the head is read, before the body: a response here is
// sent instead of reading the body (a missing key, an unknown endpoint, an encoded body),
// and the connection closes.
using HttpHeadCheck = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;
// The response for a request the transport itself rejects (413, 400, 431, ...).
using HttpErrorBody = std::function<HttpResponse(int status, const std::string& message)>;

class HttpTransport {
 public:
  HttpTransport(HttpLimits limits, int io_threads, HttpErrorBody error_body);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens (backlog 1024). Port 0 picks a free port. Returns the port; throws
  // infera::Error (`what` names the setting) when the address cannot be bound.
  int listen(const std::string& host, int port, HttpHeadCheck check, HttpHandler handler, const std::string& what);
  // Serves until stop(); blocks. The I/O threads are started here.
  void run();
  bool running() const;
  bool stopped() const;
  // Stops accepting and closes every connection at once; run() returns. Thread-safe.
  void stop();
  // After run() has returned and the layers above have ended their work (their jobs
  // aborted): drops the callbacks connections still hold and runs the handlers still
  // queued, so that nothing they own outlives the transport. The destructor calls it too.
  void release();
  // Runs `f` on an I/O thread after `delay` (timers of the layers above); a handle that
  // cancels it.
  struct Timer;
  std::shared_ptr<Timer> schedule(std::chrono::milliseconds delay, std::function<void()> f);
  static void cancel(const std::shared_ptr<Timer>& t);
  // A serial executor: functions posted through the returned poster run one at a time,
  // in order, on the I/O threads. It may outlive the transport (posting then does nothing).
  std::function<void(std::function<void()>)> make_serial();
  size_t connections() const;
  const HttpLimits& limits() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace infera::server
