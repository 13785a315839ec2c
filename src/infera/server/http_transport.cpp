#include "infera/server/http_transport.h"
#include "infera/base/ascii.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_set>
#include <utility>  // before Boost 1.74's asio (its awaitable.hpp uses std::exchange)

#include <fmt/format.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "infera/base/error.h"
#include "infera/base/log.h"

namespace infera::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Strand = asio::strand<asio::io_context::executor_type>;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string status_line(int status, int version) {
  const auto reason = bhttp::obsolete_reason(bhttp::int_to_status(static_cast<unsigned>(status)));
  return fmt::format("HTTP/1.{} {} {}\r\n", version == 10 ? 0 : 1, status,
                     std::string_view(reason.data(), reason.size()));
}

// Framing checks over the raw head (Beast's parser accepts some of these forms):
// bare LF line ends, folded (obsolete continuation) lines, and the header count.
// Returns 0 when fine, else the status to answer.
int check_raw_head(std::string_view head, size_t max_headers, std::string& why) {
  for (size_t i = 0; i < head.size(); ++i) {
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) {
      why = "bare LF in the request head";
      return 400;
    }
    if (head[i] == '\r' && (i + 1 >= head.size() || head[i + 1] != '\n')) {
      why = "bare CR in the request head";
      return 400;
    }
  }
  size_t lines = 0;
  size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos && pos + 2 < head.size()) {
    const char next = head[pos + 2];
    if (next == ' ' || next == '\t') {
      why = "folded header line";
      return 400;
    }
    if (next == '\r') break;  // the empty line
    ++lines;
    pos = head.find("\r\n", pos + 2);
  }
  if (lines > max_headers) {
    why = fmt::format("more than {} header fields", max_headers);
    return 431;
  }
  return 0;
}

}  // namespace

const std::string* HttpRequest::find(std::string_view name) const {
  for (const auto& h : headers) {
    if (ascii_iequals(h.name, name)) return &h.value;
  }
  return nullptr;
}

std::string HttpRequest::header(std::string_view name) const {
  const std::string* v = find(name);
  return v ? *v : std::string();
}

struct HttpTransport::Timer {
  explicit Timer(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
};

struct HttpListener {
  tcp::acceptor acceptor;
  HttpHeadCheck check;
  HttpHandler handler;
  explicit HttpListener(asio::io_context& io) : acceptor(io) {}
};

// What the serial executors of make_serial() post through. They may be held by threads of
// other layers (an engine's event callback) past the transport's end: posting then does
// nothing, and nothing of the io_context is touched.
struct SerialGate {
  std::shared_mutex mutex;
  std::vector<Strand>* strands = nullptr;  // null once the transport is gone
};

struct HttpTransport::Impl {
  HttpLimits limits;
  int io_threads = 2;
  HttpErrorBody error_body;
  std::atomic<size_t> connections{0};
  std::atomic<bool> running{false};
  std::atomic<bool> stopped{false};
  std::mutex live_mutex;
  std::unordered_set<HttpConnection*> live;  // for stop(): close them all
  // Declared last: destroyed first (queued handlers hold connections, which use the above).
  asio::io_context io;
  std::vector<std::unique_ptr<HttpListener>> listeners;
  // The strands make_serial() hands out, round robin (the layers above need order, not
  // one strand each): they never outlive the io_context.
  std::vector<Strand> serials;
  std::atomic<size_t> next_serial{0};
  std::shared_ptr<SerialGate> gate = std::make_shared<SerialGate>();

  Impl() {
    for (int i = 0; i < 64; ++i) serials.push_back(asio::make_strand(io));
    gate->strands = &serials;
  }
  ~Impl() {
    std::unique_lock lock(gate->mutex);
    gate->strands = nullptr;
  }

  void accept(HttpListener& l);
};

// ---------------------------------------------------------------------------------------
// One connection: read a head, check it, read the body, hand the request over, write the
// response, repeat while keep-alive. Everything runs on the connection's strand.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(HttpTransport::Impl& t, HttpListener& l, tcp::socket socket)
      : t_(t), l_(l), strand_(asio::make_strand(t.io)), stream_(std::move(socket)) {
    ++t_.connections;
  }
  ~HttpConnection() {
    --t_.connections;
    std::lock_guard lock(t_.live_mutex);
    t_.live.erase(this);
  }

  void start() {
    {
      std::lock_guard lock(t_.live_mutex);
      t_.live.insert(this);
    }
    asio::dispatch(strand_, [self = shared_from_this()] { self->read_head(); });
  }

  // Called from HttpTransport::run() after the I/O threads ended.
  void force_close() {
    beast::error_code ec;
    stream_.socket().close(ec);
  }
  // Called from HttpTransport::release(): the callbacks still held (a response's on_sent
  // holds its job, which holds this connection's exchange) are dropped, which ends the
  // cycle; returned, so that the caller destroys them outside the live-set lock.
  std::pair<std::function<void()>, std::function<void()>> take_callbacks() {
    return {std::exchange(after_write_, nullptr), std::exchange(on_disconnect_, nullptr)};
  }

  // --- exchange side (any thread) ---
  void respond(uint64_t gen, HttpResponse r, std::function<void()> on_sent) {
    asio::post(strand_, [self = shared_from_this(), gen, r = std::move(r), on_sent = std::move(on_sent)]() mutable {
      if (!self->current(gen)) {
        if (on_sent) on_sent();
        return;
      }
      self->responding_ = true;
      self->queue(self->serialize(r, false));
      self->finish_response(std::move(on_sent));
    });
  }
  void begin_stream(uint64_t gen, HttpResponse head) {
    asio::post(strand_, [self = shared_from_this(), gen, head = std::move(head)] {
      if (!self->current(gen)) return;
      self->responding_ = true;
      self->streaming_ = true;
      self->queue(self->serialize(head, true));
    });
  }
  void write(uint64_t gen, std::string data) {
    asio::post(strand_, [self = shared_from_this(), gen, data = std::move(data)]() mutable {
      if (!self->current(gen) || !self->streaming_ || data.empty()) return;
      if (self->chunked_) {
        self->queue(fmt::format("{:x}\r\n", data.size()));
        self->queue(std::move(data));
        self->queue("\r\n");
      } else {
        self->queue(std::move(data));
      }
    });
  }
  void end(uint64_t gen, std::function<void()> on_sent) {
    asio::post(strand_, [self = shared_from_this(), gen, on_sent = std::move(on_sent)]() mutable {
      if (!self->current(gen) || !self->streaming_) {
        if (on_sent) on_sent();
        return;
      }
      if (self->chunked_)
        self->queue("0\r\n\r\n");
      else
        self->keep_alive_ = false;  // HTTP/1.0: the close ends the body
      self->finish_response(std::move(on_sent));
    });
  }
  void on_disconnect(uint64_t gen, std::function<void()> f) {
    asio::post(strand_, [self = shared_from_this(), gen, f = std::move(f)]() mutable {
      if (!self->current(gen)) {
        if (self->closed_ && gen == self->gen_ && f) f();  // already gone
        return;
      }
      self->on_disconnect_ = std::move(f);
    });
  }
  void exchange_gone(uint64_t gen) {
    // The handler dropped its exchange without answering: a bug; answer 500 rather than hang.
    asio::post(strand_, [self = shared_from_this(), gen] {
      if (!self->current(gen) || self->responding_) return;
      LOG_ERROR("a request was dropped without a response");
      self->respond(gen, self->t_.error_body(500, "the request was not answered"), {});
    });
  }

 private:
  bool current(uint64_t gen) const { return !closed_ && gen == gen_ && handling_; }

  // --- reading ---
  void read_head() {
    if (closed_) return;
    // Between requests the connection may idle for idle_timeout; from its first byte a
    // head must be complete within head_timeout.
    head_started_ = !head_buf_.empty();
    stream_.expires_after(head_started_ ? t_.limits.head_timeout : t_.limits.idle_timeout);
    if (try_parse_head()) return;
    read_more_head();
  }

  void read_more_head() {
    const size_t room = t_.limits.head_bytes + 4 - head_buf_.size();
    chunk_.resize(std::min<size_t>(room, 8192));
    stream_.async_read_some(asio::buffer(chunk_),
                            asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->on_head_bytes(ec, n);
                            }));
  }

  void on_head_bytes(beast::error_code ec, size_t n) {
    if (closed_) return;
    if (ec) {
      if (ec == beast::error::timeout && !head_buf_.empty()) {
        reject(408, "the request head was not complete in time");
      } else {
        close();
      }
      return;
    }
    if (!head_started_ && n > 0) {
      head_started_ = true;
      stream_.expires_after(t_.limits.head_timeout);
    }
    head_buf_.append(chunk_.data(), n);
    if (!try_parse_head()) read_more_head();
  }

  // True when the head was complete (and handled, one way or another).
  bool try_parse_head() {
    // Tolerate empty lines before a request (RFC 9112 2.2).
    while (head_buf_.starts_with("\r\n")) head_buf_.erase(0, 2);
    const size_t end = head_buf_.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (head_buf_.size() > t_.limits.head_bytes) {
        reject(431, fmt::format("the request head is larger than {} bytes", t_.limits.head_bytes));
        return true;
      }
      if (head_buf_.find('\n') != std::string::npos) {  // bare LF framing never ends with CRLFCRLF
        std::string why;
        const size_t last_nl = head_buf_.rfind('\n');
        if (check_raw_head(std::string_view(head_buf_).substr(0, last_nl + 1), t_.limits.max_headers, why) != 0) {
          reject(why.starts_with("more") ? 431 : 400, why);
          return true;
        }
      }
      return false;
    }
    if (end + 4 > t_.limits.head_bytes) {
      reject(431, fmt::format("the request head is larger than {} bytes", t_.limits.head_bytes));
      return true;
    }
    const std::string_view head(head_buf_.data(), end + 4);
    std::string why;
    if (const int status = check_raw_head(head, t_.limits.max_headers, why)) {
      reject(status, why);
      return true;
    }
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(t_.limits.head_bytes + 4));
    parser_->body_limit(t_.limits.body_bytes);
    parser_->eager(true);
    beast::error_code ec;
    const size_t used = parser_->put(asio::buffer(head.data(), head.size()), ec);
    if (ec == bhttp::error::body_limit) {  // a Content-Length over the limit
      reject(413, fmt::format("the request body is larger than the limit of {} bytes", t_.limits.body_bytes));
      return true;
    }
    if (ec == bhttp::error::header_limit) {
      reject(431, fmt::format("the request head is larger than {} bytes", t_.limits.head_bytes));
      return true;
    }
    if (ec || !parser_->is_header_done() || used != head.size()) {
      reject(400, fmt::format("malformed request head ({})", ec ? ec.message() : "incomplete"));
      return true;
    }
    std::string rest = head_buf_.substr(end + 4);
    head_buf_.clear();
    on_head(std::move(rest));
    return true;
  }

  void on_head(std::string rest) {
    const auto& msg = parser_->get();
    request_ = HttpRequest{};
    request_.method = std::string(msg.method_string());
    request_.target = std::string(msg.target());
    request_.path = request_.target.substr(0, request_.target.find('?'));
    request_.version = static_cast<int>(msg.version());
    head_only_ = request_.method == "HEAD";
    if (request_.version != 10 && request_.version != 11) {
      reject(505, "only HTTP/1.0 and HTTP/1.1 are served");
      return;
    }
    int content_lengths = 0, transfer_encodings = 0;
    for (const auto& f : msg) {
      HttpHeader h{std::string(f.name_string()), std::string(f.value())};
      if (ascii_iequals(h.name, "Content-Length")) {
        ++content_lengths;
        const std::string_view v = trim(h.value);
        if (v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos) {
          reject(400, "Content-Length must be one decimal number");
          return;
        }
      } else if (ascii_iequals(h.name, "Transfer-Encoding")) {
        ++transfer_encodings;
        if (!ascii_iequals(trim(h.value), "chunked")) {
          reject(400, "only 'Transfer-Encoding: chunked' is accepted");
          return;
        }
      }
      request_.headers.push_back(std::move(h));
    }
    if (content_lengths > 1) {
      reject(400, "more than one Content-Length");
      return;
    }
    if (transfer_encodings > 1 || (transfer_encodings && content_lengths)) {
      reject(400, "both Content-Length and Transfer-Encoding, or Transfer-Encoding twice");
      return;
    }
    keep_alive_ = msg.keep_alive();
    const auto length = parser_->content_length();
    if (length && *length > t_.limits.body_bytes) {
      reject(413, fmt::format("the request body is larger than the limit of {} bytes", t_.limits.body_bytes));
      return;
    }
    if (l_.check) {
      std::optional<HttpResponse> early;
      try {
        early = l_.check(request_);
      } catch (const std::exception& e) {
        LOG_ERROR("request head check failed: {}", e.what());
        early = t_.error_body(500, "internal error");
      }
      if (early) {
        keep_alive_ = false;
        respond_now(std::move(*early));
        return;
      }
    }
    if (parser_->is_done()) {  // no body
      body_buf_.consume(body_buf_.size());
      auto b = body_buf_.prepare(rest.size());
      asio::buffer_copy(b, asio::buffer(rest));
      body_buf_.commit(rest.size());
      dispatch();
      return;
    }
    if (ascii_iequals(trim(request_.header("Expect")), "100-continue") && request_.version == 11) {
      queue(status_line(100, 11) + "\r\n");
    }
    body_buf_.consume(body_buf_.size());
    auto b = body_buf_.prepare(rest.size());
    asio::buffer_copy(b, asio::buffer(rest));
    body_buf_.commit(rest.size());
    stream_.expires_after(t_.limits.body_timeout);
    reading_body_ = true;
    bhttp::async_read(stream_, body_buf_, *parser_,
                      asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->reading_body_ = false;
                        self->on_body(ec);
                      }));
  }

  void on_body(beast::error_code ec) {
    if (closed_) return;
    if (ec == bhttp::error::body_limit) {
      reject(413, fmt::format("the request body is larger than the limit of {} bytes", t_.limits.body_bytes));
    } else if (ec == beast::error::timeout) {
      reject(408, "the request body did not arrive in time");
    } else if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
               ec == asio::error::operation_aborted) {
      close();
    } else if (ec) {
      reject(400, fmt::format("malformed request body ({})", ec.message()));
    } else {
      dispatch();
    }
  }

  void dispatch() {
    request_.body = std::move(parser_->get().body());
    parser_.reset();
    stream_.expires_never();
    handling_ = true;
    responding_ = false;
    streaming_ = false;
    chunked_ = request_.version == 11;
    ++gen_;
    watch_peer();
    auto exchange = std::make_shared<HttpExchange>(shared_from_this(), std::move(request_));
    try {
      l_.handler(std::move(exchange));
    } catch (const std::exception& e) {
      LOG_ERROR("request handler failed: {}", e.what());
      respond(gen_, t_.error_body(500, "internal error"), {});
    }
  }

  // While a request is handled, notice a client that goes away: wait until the socket is
  // readable, then peek. End of stream or an error: gone. Bytes (a pipelined request):
  // stop watching.
  void watch_peer() {
    stream_.socket().async_wait(tcp::socket::wait_read,
                                asio::bind_executor(strand_, [self = shared_from_this(),
                                                              gen = gen_](beast::error_code ec) {
                                  if (ec || self->closed_ || gen != self->gen_ || !self->handling_) return;
                                  if (self->body_buf_.size() > 0) return;  // data of the next request already read
                                  char byte;
                                  const ssize_t n =
                                      ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
                                  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                                    self->client_gone();
                                  } else if (n < 0) {
                                    self->watch_peer();
                                  }
                                }));
  }

  // --- writing ---
  std::string serialize(const HttpResponse& r, bool stream) {
    std::string out = status_line(r.status, request_version());
    if (!r.content_type.empty()) out += fmt::format("Content-Type: {}\r\n", r.content_type);
    for (const auto& h : r.headers) out += fmt::format("{}: {}\r\n", h.name, h.value);
    if (stream) {
      if (chunked_)
        out += "Transfer-Encoding: chunked\r\n";
      else
        keep_alive_ = false;
    } else {
      out += fmt::format("Content-Length: {}\r\n", r.body.size());
    }
    out += keep_alive_ ? (request_version() == 10 ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n";
    out += "\r\n";
    if (!stream && !head_only_) out += r.body;  // HEAD: the length, not the body
    return out;
  }
  int request_version() const { return version_for_response_; }

  void queue(std::string data) {
    if (closed_ || data.empty()) return;
    pending_bytes_ += data.size();
    if (pending_bytes_ > t_.limits.max_pending_output) {
      LOG_WARN("a client does not read its response; dropping the connection");
      client_gone();
      return;
    }
    out_.push_back(std::move(data));
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    in_write_.clear();
    std::vector<asio::const_buffer> bufs;
    while (!out_.empty() && in_write_.size() < 64) {
      in_write_.push_back(std::move(out_.front()));
      out_.pop_front();
    }
    for (const auto& s : in_write_) bufs.emplace_back(asio::buffer(s));
    if (!reading_body_) stream_.expires_after(t_.limits.write_timeout);
    asio::async_write(stream_, bufs,
                      asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t n) {
                        self->on_write(ec, n);
                      }));
  }

  void on_write(beast::error_code ec, size_t n) {
    writing_ = false;
    pending_bytes_ -= std::min(pending_bytes_, n);
    in_write_.clear();
    if (closed_) return;
    if (ec) {
      client_gone();
      return;
    }
    if (!out_.empty()) {
      do_write();
      return;
    }
    if (!reading_body_) stream_.expires_never();  // (after 100 Continue the body's deadline stays)
    if (after_write_) {
      auto f = std::move(after_write_);
      after_write_ = nullptr;
      f();
    }
  }

  // The response is complete once the queued bytes are written.
  void finish_response(std::function<void()> on_sent) {
    handling_ = false;  // later exchange calls do nothing
    on_disconnect_ = nullptr;
    after_write_ = [self = shared_from_this(), on_sent = std::move(on_sent)] {
      if (on_sent) on_sent();
      self->next_request();
    };
    if (!writing_ && out_.empty()) on_write({}, 0);
  }

  void next_request() {
    if (!keep_alive_ || t_.stopped) {
      graceful_close();
      return;
    }
    // Bytes of a pipelined request already read go first.
    head_buf_.assign(static_cast<const char*>(body_buf_.data().data()), body_buf_.size());
    body_buf_.consume(body_buf_.size());
    version_for_response_ = 11;
    read_head();
  }

  // An answer the transport gives itself; the connection then closes. Whatever the client
  // still sends is read and dropped for a moment, so that the answer is not lost to a
  // reset while its body is still arriving.
  void reject(int status, const std::string& why) {
    if (closed_) return;
    keep_alive_ = false;
    respond_now(t_.error_body(status, why));
  }

  void respond_now(HttpResponse r) {
    handling_ = false;
    version_for_response_ = request_.version == 10 ? 10 : 11;
    queue(serialize(r, false));
    after_write_ = [self = shared_from_this()] { self->linger(); };
    if (!writing_ && out_.empty()) on_write({}, 0);
  }

  void linger() {
    if (closed_) return;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    linger_left_ = 1 << 20;
    stream_.expires_after(std::chrono::seconds(2));
    drain_some();
  }

  void drain_some() {
    chunk_.resize(8192);
    stream_.async_read_some(asio::buffer(chunk_),
                            asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec || n >= self->linger_left_) {
                                self->close();
                                return;
                              }
                              self->linger_left_ -= n;
                              self->drain_some();
                            }));
  }

  void graceful_close() {
    if (closed_) return;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    linger_left_ = 64 << 10;
    stream_.expires_after(std::chrono::seconds(1));
    drain_some();
  }

  void client_gone() {
    if (closed_) return;
    auto f = std::move(on_disconnect_);
    on_disconnect_ = nullptr;
    close();
    if (f) f();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    handling_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    out_.clear();
    if (after_write_) {
      // A response's on_sent still runs (its work is over either way).
      auto f = std::move(after_write_);
      after_write_ = nullptr;
      f();
    }
    std::lock_guard lock(t_.live_mutex);
    t_.live.erase(this);
  }

  HttpTransport::Impl& t_;
  HttpListener& l_;
  Strand strand_;
  beast::tcp_stream stream_;
  std::string head_buf_;
  std::string chunk_;
  bool head_started_ = false;
  bool reading_body_ = false;
  bool head_only_ = false;  // a HEAD request: responses carry no body
  beast::flat_buffer body_buf_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  HttpRequest request_;
  uint64_t gen_ = 0;
  bool handling_ = false;  // a handler owns the current request
  bool responding_ = false;  // it has started its response
  bool streaming_ = false;
  bool chunked_ = true;
  bool keep_alive_ = true;
  int version_for_response_ = 11;
  bool closed_ = false;
  std::deque<std::string> out_;
  std::vector<std::string> in_write_;
  size_t pending_bytes_ = 0;
  bool writing_ = false;
  std::function<void()> after_write_;
  std::function<void()> on_disconnect_;
  size_t linger_left_ = 0;

  friend class HttpExchange;
  friend struct HttpTransport::Impl;
  friend class HttpTransport;

 public:
  void set_version_for_response(int v) { version_for_response_ = v; }
  uint64_t generation() const { return gen_; }
};

// ---------------------------------------------------------------------------------------
HttpExchange::HttpExchange(std::shared_ptr<HttpConnection> connection, HttpRequest request)
    : connection_(std::move(connection)), request_(std::move(request)) {
  connection_->set_version_for_response(request_.version == 10 ? 10 : 11);
  gen_ = connection_->generation();
}

HttpExchange::~HttpExchange() {
  if (!answered_) connection_->exchange_gone(gen_);
}

void HttpExchange::respond(HttpResponse response, std::function<void()> on_sent) {
  answered_ = true;
  connection_->respond(gen_, std::move(response), std::move(on_sent));
}
void HttpExchange::begin_stream(HttpResponse head) {
  answered_ = true;
  connection_->begin_stream(gen_, std::move(head));
}
void HttpExchange::write(std::string data) { connection_->write(gen_, std::move(data)); }
void HttpExchange::end(std::function<void()> on_sent) { connection_->end(gen_, std::move(on_sent)); }
void HttpExchange::on_disconnect(std::function<void()> f) { connection_->on_disconnect(gen_, std::move(f)); }

// ---------------------------------------------------------------------------------------
void HttpTransport::Impl::accept(HttpListener& l) {
  l.acceptor.async_accept(asio::make_strand(io), [this, &l](beast::error_code ec, tcp::socket socket) {
    if (stopped) return;
    if (!ec) {
      if (connections.load() >= limits.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);  // over the cap: refuse at once
      } else {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        std::make_shared<HttpConnection>(*this, l, std::move(socket))->start();
      }
    } else if (ec == asio::error::operation_aborted || !l.acceptor.is_open()) {
      return;
    } else if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space) {
      LOG_WARN("cannot accept a connection: {}", ec.message());
      auto t = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(50));
      t->async_wait([this, &l, t](beast::error_code) {
        if (!stopped) accept(l);
      });
      return;
    }
    accept(l);
  });
}

HttpTransport::HttpTransport(HttpLimits limits, int io_threads, HttpErrorBody error_body)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->io_threads = std::max(1, io_threads);
  impl_->error_body = std::move(error_body);
}

HttpTransport::~HttpTransport() {
  stop();
  if (!impl_->running) release();
}

int HttpTransport::listen(const std::string& host, int port, HttpHeadCheck check, HttpHandler handler,
                          const std::string& what) {
  auto l = std::make_unique<HttpListener>(impl_->io);
  l->check = std::move(check);
  l->handler = std::move(handler);
  beast::error_code ec;
  tcp::endpoint ep;
  if (const auto address = asio::ip::make_address(host, ec); !ec) {
    ep = tcp::endpoint(address, static_cast<uint16_t>(port));
  } else {  // a host name: its first address
    tcp::resolver resolver(impl_->io);
    const auto found = resolver.resolve(host, std::to_string(port), ec);
    if (ec || found.empty()) fail("{}: cannot resolve the address '{}' to listen on", what, host);
    ep = found.begin()->endpoint();
  }
  l->acceptor.open(ep.protocol(), ec);
  if (!ec) l->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) l->acceptor.bind(ep, ec);
  if (!ec) l->acceptor.listen(1024, ec);
  if (ec) {
    if (port == 0) fail("{}: cannot listen on {} (any port): {}", what, host, ec.message());
    fail("{}: cannot listen on {}:{}; the port is in use or the address is not local; pick another port", what, host,
         port);
  }
  const int bound = l->acceptor.local_endpoint().port();
  impl_->listeners.push_back(std::move(l));
  return bound;
}

void HttpTransport::run() {
  Impl& s = *impl_;
  if (s.stopped) return;
  for (auto& l : s.listeners) s.accept(*l);
  auto guard = asio::make_work_guard(s.io);
  std::vector<std::thread> threads;
  for (int i = 1; i < s.io_threads; ++i) threads.emplace_back([&s] { s.io.run(); });
  s.running = true;
  s.io.run();
  for (auto& t : threads) t.join();
  s.running = false;
  // Stopped: close every connection still open (their clients see the close now).
  std::vector<HttpConnection*> live;
  {
    std::lock_guard lock(s.live_mutex);
    live.assign(s.live.begin(), s.live.end());
  }
  for (HttpConnection* c : live) c->force_close();
}

void HttpTransport::release() {
  Impl& s = *impl_;
  if (s.running) return;  // only once run() has returned (or never ran)
  // A connection still holding callbacks keeps itself (and a job) alive: drop them.
  std::vector<std::shared_ptr<HttpConnection>> live;
  {
    std::lock_guard lock(s.live_mutex);
    for (HttpConnection* c : s.live) {
      if (auto p = c->weak_from_this().lock()) live.push_back(std::move(p));
    }
  }
  for (auto& c : live) {
    c->force_close();
    auto dropped = c->take_callbacks();
  }
  live.clear();
  // Handlers still queued (a job's last steps, connections' completions) run now, on this
  // thread, so that what they hold ends while the io_context exists. Each round may queue
  // a few more (a closed socket's completion); a bounded number of rounds.
  for (int round = 0; round < 64; ++round) {
    s.io.restart();
    if (s.io.poll() == 0) break;
  }
}

bool HttpTransport::running() const { return impl_->running; }
bool HttpTransport::stopped() const { return impl_->stopped; }

void HttpTransport::stop() {
  Impl& s = *impl_;
  if (s.stopped.exchange(true)) return;
  for (auto& l : s.listeners) {
    asio::post(s.io, [l = l.get()] {
      beast::error_code ec;
      l->acceptor.close(ec);
    });
  }
  s.io.stop();
}

std::shared_ptr<HttpTransport::Timer> HttpTransport::schedule(std::chrono::milliseconds delay,
                                                              std::function<void()> f) {
  auto t = std::make_shared<Timer>(impl_->io);
  t->timer.expires_after(delay);
  t->timer.async_wait([f = std::move(f)](beast::error_code ec) {
    if (!ec) f();
  });
  return t;
}

void HttpTransport::cancel(const std::shared_ptr<Timer>& t) {
  if (t) t->timer.cancel();
}

std::function<void(std::function<void()>)> HttpTransport::make_serial() {
  const size_t i = impl_->next_serial.fetch_add(1) % impl_->serials.size();
  return [gate = impl_->gate, i](std::function<void()> f) {
    std::shared_lock lock(gate->mutex);
    if (gate->strands) asio::post((*gate->strands)[i], std::move(f));
  };
}

size_t HttpTransport::connections() const { return impl_->connections; }
const HttpLimits& HttpTransport::limits() const { return impl_->limits; }

}  // namespace infera::server
