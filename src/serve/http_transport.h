// HttpTransport: the event-driven HTTP/1.1 connection core under HttpServer (Boost.Beast's parser
// and Boost.Asio sockets, kept inside http_transport.cc). A few I/O threads serve every
// connection; each connection has deadlines (header, body, keep-alive idle, write stall), its
// body is bounded as bytes arrive (Content-Length or chunked), pipelined requests are answered in
// order, and the connection count is capped. Request handlers run on a small worker pool, never
// on an I/O thread; a long response (a generation) is an AsyncResponse that the connection polls
// when woken and writes with backpressure. Policy (routes, auth, Host/Origin rules, error body
// shape, logging) comes from the HttpHooks. Bind/Serve from one thread; Stop from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace ember::serve {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // path and query, as sent
  std::string path;    // target without the query
  int version = 11;    // 10: HTTP/1.0, 11: HTTP/1.1
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  // The value of header `lower_name` ("" when absent; the first one when repeated).
  std::string Header(std::string_view lower_name) const;
  bool HasHeader(std::string_view lower_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string log_note;  // appended to the access-log line (e.g. token counts); never prompts
};

// A response produced over time. The transport calls every method on the connection's strand
// (one at a time); `wake` may be called from any thread and only schedules a Poll.
class AsyncResponse {
 public:
  virtual ~AsyncResponse() = default;
  // Streaming responses send Head() at once (chunked) and then Poll's output as the body;
  // the others send Final() once Poll returned false.
  virtual bool streaming() const = 0;
  virtual HttpResponse Head() = 0;
  virtual void Start(std::function<void()> wake) = 0;
  // Appends the body bytes now ready to *out (streaming only); false once complete.
  virtual bool Poll(std::string* out) = 0;
  virtual HttpResponse Final() = 0;
  // The client went away or stopped reading: stop the work. Idempotent.
  virtual void Abort() = 0;
  // For the access log once complete (e.g. "tokens=5+12").
  virtual std::string LogNote() const = 0;
};

struct Handled {
  HttpResponse response;                 // used when `async` is null
  std::unique_ptr<AsyncResponse> async;
};

struct HttpHooks {
  // After the header, before the body is read: a response that refuses the request (the
  // connection then closes without reading the body), or nullopt to go on. I/O thread: cheap.
  std::function<std::optional<HttpResponse>(const HttpRequest& head)> check_header;
  // The whole request. Runs on a worker thread, or on the I/O thread when `cheap` says so.
  std::function<Handled(const HttpRequest& request)> handle;
  // Requests answered at once from memory (health, metrics): handled on the I/O thread, so a
  // queue of expensive requests (tokenizing prompts) never delays them. Empty: none.
  std::function<bool(const HttpRequest& request)> cheap;
  // Error responses the transport makes itself (400, 408, 413, 431, 503 at the connection cap).
  std::function<HttpResponse(int status, const std::string& message, const std::string& code)>
      error;
  // Headers added to every response to `request` (CORS). May be empty.
  std::function<void(const HttpRequest& request, HttpResponse* response)> decorate;
  // One finished exchange (status 499: the client went away first); for metrics and the log.
  std::function<void(const HttpRequest& request, int status, double seconds,
                     const std::string& note)>
      finished;
  // Counted events: "disconnect" (client gone while work was in flight), "stalled" (a client
  // that read nothing for stall_timeout_s), "rejected" (over max_connections), "timeout"
  // (a header/body deadline passed).
  std::function<void(const char* event)> count;
};

struct TransportConfig {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  int io_threads = 2;
  int worker_threads = 4;  // run HttpHooks::handle
  int max_connections = 4096;
  size_t max_body_bytes = size_t{16} << 20;
  size_t max_header_bytes = size_t{64} << 10;
  double header_timeout_s = 10;    // a request's header must arrive complete within this
  double body_timeout_s = 30;      // and its body within this after the header
  double keep_alive_timeout_s = 10;  // an idle connection's next request header, likewise
  // Unsent bytes above which a stream stops taking output; also each connection's kernel send
  // buffer (SO_SNDBUF, at most 4 MiB), so that memory is bounded per connection too.
  size_t stream_buffer_bytes = size_t{1} << 20;
  double stall_timeout_s = 30;     // unsent bytes and no write progress for this long: cut off
};

class HttpTransport {
 public:
  HttpTransport(TransportConfig config, HttpHooks hooks);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens (no SO_REUSEPORT: a port another server holds is an error). Returns the
  // port bound.
  Result<int> Bind();
  // Runs the I/O threads until Stop() and every connection has closed.
  void Serve();
  // Stops accepting; idle connections close, those with a response in flight close after it
  // (at most a few seconds later). Any thread.
  void Stop();
  // Connections open now.
  int64_t num_connections() const;

  class Impl;  // in http_transport.cc, with the connections it serves

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::serve
