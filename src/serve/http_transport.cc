// The only file that includes Boost.Asio/Beast (they are heavy to compile). Each connection is a
// Session whose handlers all run on its own strand: one read loop feeds Beast's request parser
// (and, while a response is in flight, keeps watching the socket for a client that went away), one
// write queue sends what the responses produce, and timers enforce the deadlines.
#include "serve/http_transport.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <deque>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "util/log.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember::serve {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

std::string HttpRequest::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return value;
  return "";
}

bool HttpRequest::HasHeader(std::string_view lower_name) const {
  for (const auto& header : headers)
    if (header.first == lower_name) return true;
  return false;
}

namespace {

// Bytes of pipelined requests held while a response is in flight; beyond it reading pauses.
constexpr size_t kMaxHeldBytes = size_t{64} << 10;
constexpr size_t kReadChunk = 16 << 10;
// After the last response of a closing connection: how long unread input is drained (so the
// client sees the response instead of a reset).
constexpr auto kLingerTime = std::chrono::seconds(2);
// A half-closed client (EOF while its response is in flight) is probed at these delays; a probe
// write that fails means the client is gone, one that succeeds means it is still reading.
// The first probe draws a reset from a closed socket within a round trip; the later ones see it.
constexpr std::chrono::milliseconds kProbeDelays[] = {
    std::chrono::milliseconds(0), std::chrono::milliseconds(20), std::chrono::milliseconds(100),
    std::chrono::milliseconds(500), std::chrono::milliseconds(2000)};
// Stop(): connections still open after this are dropped.
constexpr auto kStopGrace = std::chrono::seconds(3);

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string Sanitized(const std::string& value) {
  std::string out;
  for (char c : value)
    if (c != '\r' && c != '\n') out += c;
  return out;
}

bool HasBody(int status) { return status >= 200 && status != 204 && status != 304; }

// Status line and headers; the body follows (Content-Length) or is chunked.
std::string SerializeHead(const HttpResponse& r, bool keep_alive, bool chunked) {
  const auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(r.status)));
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + std::string(reason) + "\r\n";
  if (HasBody(r.status)) out += "Content-Type: " + Sanitized(r.content_type) + "\r\n";
  for (const auto& [name, value] : r.headers) out += name + ": " + Sanitized(value) + "\r\n";
  if (chunked) {
    out += "Transfer-Encoding: chunked\r\n";
  } else if (HasBody(r.status)) {
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  }
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return out;
}

std::string Chunk(const std::string& data) {
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

void FillHead(const http::request<http::string_body>& req, HttpRequest* out) {
  out->method = std::string(req.method_string());
  out->target = std::string(req.target());
  out->path = out->target.substr(0, out->target.find('?'));
  out->version = static_cast<int>(req.version());
  out->headers.clear();
  for (const auto& field : req) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    out->headers.emplace_back(std::move(name), std::string(field.value()));
  }
}

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

class Session;

class HttpTransport::Impl {
 public:
  Impl(TransportConfig config, HttpHooks hooks)
      : config(std::move(config)), hooks(std::move(hooks)),
        workers(static_cast<size_t>(std::max(1, this->config.worker_threads))),
        io(std::max(1, this->config.io_threads)), main(asio::make_strand(io)), acceptor(main),
        retry_timer(main), stop_timer(main) {}

  Result<int> Bind();
  void Serve();
  void Stop();
  void Accept();
  void OnAccept(error_code ec, tcp::socket socket);
  void RejectBusy(tcp::socket& socket);
  void Register(Session* session, std::weak_ptr<Session> weak) EXCLUDES(sessions_mu);
  void Unregister(Session* session) EXCLUDES(sessions_mu);
  // The open sessions (those still alive), collected under sessions_mu.
  std::vector<std::shared_ptr<Session>> OpenSessions() const EXCLUDES(sessions_mu);
  int64_t NumConnections() const EXCLUDES(sessions_mu) {
    MutexLock lock(&sessions_mu);
    return static_cast<int64_t>(sessions.size());
  }
  void Count(const char* event) const {
    if (hooks.count) hooks.count(event);
  }

  const TransportConfig config;
  const HttpHooks hooks;
  int max_connections = 0;  // config.max_connections within the descriptor limit
  std::atomic<bool> stopping{false};
  // The connection registry: I/O threads register and unregister sessions, Stop and Serve walk it.
  mutable Mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions GUARDED_BY(sessions_mu);
  asio::thread_pool workers;
  // Destroyed before the members above: pending handlers own sessions, which unregister.
  asio::io_context io;
  asio::strand<asio::io_context::executor_type> main;  // the acceptor and the stop timer
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer, stop_timer;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpTransport::Impl* owner, tcp::socket socket)
      : owner_(owner), config_(owner->config), socket_(std::move(socket)),
        read_deadline_(socket_.get_executor()), stall_timer_(socket_.get_executor()),
        probe_timer_(socket_.get_executor()), wake_flag_(std::make_shared<std::atomic<bool>>()) {}
  ~Session() {
    if (async_) async_->Abort();
    owner_->Unregister(this);
  }

  asio::any_io_executor executor() { return socket_.get_executor(); }
  void Start() { BeginRequest(); }
  // Only when no I/O thread runs (the end of Serve).
  void ForceClose() { Close(); }
  // Stop(): close now when no request is in flight, else after its response.
  void CloseWhenIdle() {
    stop_requested_ = true;
    keep_alive_ = false;
    if (phase_ == Phase::kReading) Close();
  }

 private:
  enum class Phase { kReading, kHandling, kResponding, kLingering };

  void BeginRequest();
  void Read();
  void OnRead(error_code ec, size_t n);
  void ParseBuffered();
  bool OnHeader();
  void FailParse(error_code ec);
  void OnRequest();
  Handled RunHandler();
  void OnHandled(Handled handled);
  void PollAsync();
  void Queue(std::string bytes);
  void QueueWhole(HttpResponse response);
  void RespondAndClose(HttpResponse response);
  void Write();
  void OnWrite(error_code ec, size_t n);
  void OnResponseWritten();
  void OnPeerEof();
  // The client went away (or, `stalled`, stopped reading): the work in flight is cancelled.
  void OnPeerGone(bool stalled = false);
  void Probe(size_t index);
  void ArmReadDeadline(Clock::duration after);
  void OnReadDeadline();
  void Finished(int status, const std::string& note = "");
  void LingerClose();
  void Close();

  HttpTransport::Impl* const owner_;
  const TransportConfig& config_;
  tcp::socket socket_;
  asio::steady_timer read_deadline_, stall_timer_, probe_timer_;
  boost::beast::flat_buffer in_;  // received, not yet parsed
  std::array<char, kReadChunk> read_chunk_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kReading;
  bool first_request_ = true, header_checked_ = false, reading_ = false, peer_eof_ = false;
  bool closed_ = false, stop_requested_ = false, keep_alive_ = true, chunked_ = true;
  bool finished_ = false;  // Finished() was called for the current request
  HttpRequest current_;
  Clock::time_point started_;
  // The response in flight.
  std::unique_ptr<AsyncResponse> async_;
  int async_status_ = 200;
  bool response_complete_ = false;  // all of it is queued
  bool paused_ = false, poll_wanted_ = false;
  std::shared_ptr<std::atomic<bool>> wake_flag_;  // a poll is posted and not yet run
  // Set while async_ is: nothing else may be pending then (a half-closed client has no read).
  std::shared_ptr<Session> self_while_async_;
  // The write queue: out_[0] is partly sent (out_offset_ bytes); out_bytes_ are unsent.
  std::deque<std::string> out_;
  size_t out_offset_ = 0, out_bytes_ = 0;
  bool writing_ = false;
};

// ---- reading and parsing ----

void Session::BeginRequest() {
  phase_ = Phase::kReading;
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(config_.max_header_bytes));
  parser_->body_limit(config_.max_body_bytes);
  header_checked_ = false;
  finished_ = false;
  current_ = HttpRequest{};
  ArmReadDeadline(Seconds(first_request_ ? config_.header_timeout_s
                                         : config_.keep_alive_timeout_s));
  first_request_ = false;
  ParseBuffered();
  if (phase_ != Phase::kReading || closed_) return;
  if (peer_eof_) {  // no further request can arrive
    Close();
    return;
  }
  Read();
}

void Session::Read() {
  if (reading_ || closed_ || peer_eof_) return;
  if (phase_ != Phase::kReading && phase_ != Phase::kLingering && in_.size() >= kMaxHeldBytes)
    return;  // pipelined input waits in the kernel until this response is done
  reading_ = true;
  // Into a buffer of its own: in_ may be parsed and consumed while this read is pending (the
  // next request of a keep-alive connection), which moves in_'s free space.
  socket_.async_read_some(asio::buffer(read_chunk_),
                          [self = shared_from_this()](error_code ec, size_t n) {
                            self->OnRead(ec, n);
                          });
}

void Session::OnRead(error_code ec, size_t n) {
  reading_ = false;
  if (closed_) return;
  if (ec == asio::error::eof) {
    OnPeerEof();
    return;
  }
  if (ec) {
    OnPeerGone();
    return;
  }
  if (phase_ == Phase::kLingering) {
    Read();  // draining: the bytes are dropped
    return;
  }
  asio::buffer_copy(in_.prepare(n), asio::buffer(read_chunk_.data(), n));
  in_.commit(n);
  if (phase_ == Phase::kReading) ParseBuffered();
  Read();
}

void Session::ParseBuffered() {
  while (phase_ == Phase::kReading && !closed_ && in_.size() > 0) {
    error_code ec;
    const size_t used = parser_->put(in_.data(), ec);
    in_.consume(used);
    if (ec == http::error::need_more) return;
    if (ec) {
      FailParse(ec);
      return;
    }
    if (parser_->is_header_done() && !header_checked_ && !OnHeader()) return;
    if (parser_->is_done()) {
      OnRequest();
      return;
    }
    if (used == 0) return;
  }
}

// The header is complete and the body (if any) not yet read.
bool Session::OnHeader() {
  header_checked_ = true;
  FillHead(parser_->get(), &current_);
  started_ = Clock::now();
  if (owner_->hooks.check_header) {
    if (std::optional<HttpResponse> refusal = owner_->hooks.check_header(current_)) {
      RespondAndClose(std::move(*refusal));
      return false;
    }
  }
  if (!parser_->is_done()) {
    ArmReadDeadline(Seconds(config_.body_timeout_s));
    // The size was checked against the limit with the header (an oversized Content-Length never
    // gets here): the client may send its body now.
    if (IEquals(current_.Header("expect"), "100-continue") && current_.version >= 11) {
      Queue("HTTP/1.1 100 Continue\r\n\r\n");
      Write();
    }
  }
  parser_->eager(true);
  return true;
}

void Session::FailParse(error_code ec) {
  // An announced Content-Length over the limit fails as the header completes: the header is
  // whole then too (the error body's shape depends on the path).
  if (current_.method.empty() && (parser_->is_header_done() || ec == http::error::body_limit))
    FillHead(parser_->get(), &current_);
  if (!header_checked_) started_ = Clock::now();
  const auto& error = owner_->hooks.error;
  if (ec == http::error::body_limit) {
    RespondAndClose(error(413,
                          "The request body is larger than the limit of " +
                              std::to_string(config_.max_body_bytes) + " bytes (--max-body-bytes)",
                          "request_too_large"));
  } else if (ec == http::error::header_limit) {
    RespondAndClose(error(431,
                          "The request header is larger than the limit of " +
                              std::to_string(config_.max_header_bytes) + " bytes",
                          "header_too_large"));
  } else {
    RespondAndClose(error(400, "malformed HTTP request: " + ec.message(), "bad_request"));
  }
}

void Session::OnRequest() {
  read_deadline_.cancel();
  phase_ = Phase::kHandling;
  http::request<http::string_body> request = parser_->release();
  current_.body = std::move(request.body());
  keep_alive_ = request.keep_alive() && !stop_requested_ && !owner_->stopping.load();
  chunked_ = current_.version >= 11;
  if (owner_->hooks.cheap && owner_->hooks.cheap(current_)) {
    OnHandled(RunHandler());
    Read();
    return;
  }
  asio::post(owner_->workers, [self = shared_from_this()]() mutable {
    // current_ is not touched on the strand while the handler runs.
    Handled handled = self->RunHandler();
    auto executor = self->executor();
    asio::post(executor, [self = std::move(self), handled = std::move(handled)]() mutable {
      self->OnHandled(std::move(handled));
    });
  });
  Read();  // keeps watching: EOF (half-close or gone), a reset, or pipelined requests
}

Handled Session::RunHandler() {
  try {
    return owner_->hooks.handle(current_);
  } catch (const std::exception& e) {
    LOG_ERROR << "request handler threw: " << e.what();
    return Handled{owner_->hooks.error(500, std::string("internal error: ") + e.what(),
                                       "internal_error"),
                   nullptr};
  }
}

void Session::OnHandled(Handled handled) {
  if (closed_) {  // the client went away while the handler ran
    if (handled.async) handled.async->Abort();
    return;
  }
  if (!handled.async) {
    phase_ = Phase::kResponding;
    const int status = handled.response.status;
    const std::string note = handled.response.log_note;
    QueueWhole(std::move(handled.response));
    response_complete_ = true;
    Finished(status, note);
    Write();
    return;
  }
  phase_ = Phase::kResponding;
  async_ = std::move(handled.async);
  self_while_async_ = shared_from_this();
  if (async_->streaming()) {
    HttpResponse head = async_->Head();
    if (owner_->hooks.decorate) owner_->hooks.decorate(current_, &head);
    async_status_ = head.status;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends when the connection does
    Queue(SerializeHead(head, keep_alive_, chunked_));
    Write();
  }
  std::weak_ptr<Session> weak = shared_from_this();
  auto executor = this->executor();
  auto flag = wake_flag_;
  async_->Start([weak, executor, flag] {
    if (flag->exchange(true)) return;  // a poll is already on its way
    asio::post(executor, [weak, flag] {
      flag->store(false);
      if (auto self = weak.lock()) self->PollAsync();
    });
  });
  PollAsync();
  if (peer_eof_ && async_) Probe(0);
}

// Takes what the response has ready; pauses while the client has too much unsent.
void Session::PollAsync() {
  if (!async_ || closed_) return;
  auto hold = shared_from_this();  // the response may end here, and with it self_while_async_
  if (paused_) {
    poll_wanted_ = true;
    return;
  }
  std::string out;
  const bool more = async_->Poll(&out);
  if (async_->streaming()) {
    if (!out.empty()) Queue(chunked_ ? Chunk(out) : std::move(out));
    if (!more) {
      if (chunked_) Queue("0\r\n\r\n");
      response_complete_ = true;
      Finished(async_status_, async_->LogNote());
      async_.reset();
      self_while_async_.reset();
    }
  } else if (!more) {
    HttpResponse final_response = async_->Final();
    const int status = final_response.status;
    const std::string note = async_->LogNote();
    async_.reset();
    self_while_async_.reset();
    QueueWhole(std::move(final_response));
    response_complete_ = true;
    Finished(status, note);
  }
  if (async_ && out_bytes_ > config_.stream_buffer_bytes) paused_ = true;
  Write();
}

// ---- writing ----

void Session::Queue(std::string bytes) {
  if (bytes.empty()) return;
  out_bytes_ += bytes.size();
  out_.push_back(std::move(bytes));
}

void Session::QueueWhole(HttpResponse response) {
  if (owner_->hooks.decorate) owner_->hooks.decorate(current_, &response);
  std::string bytes = SerializeHead(response, keep_alive_, /*chunked=*/false);
  if (HasBody(response.status) && current_.method != "HEAD") bytes += response.body;
  Queue(std::move(bytes));
}

void Session::RespondAndClose(HttpResponse response) {
  read_deadline_.cancel();
  phase_ = Phase::kResponding;
  keep_alive_ = false;
  const int status = response.status;
  QueueWhole(std::move(response));
  response_complete_ = true;
  Finished(status);
  Write();
}

void Session::Write() {
  if (writing_ || out_.empty() || closed_) return;
  writing_ = true;
  std::vector<asio::const_buffer> buffers;
  for (size_t i = 0; i < out_.size() && i < 16; ++i) {
    const size_t skip = i == 0 ? out_offset_ : 0;
    buffers.emplace_back(out_[i].data() + skip, out_[i].size() - skip);
  }
  // No progress for stall_timeout_s while bytes wait: the client stopped reading.
  stall_timer_.expires_after(Seconds(config_.stall_timeout_s));
  stall_timer_.async_wait([weak = weak_from_this()](error_code ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_ || !self->writing_) return;
    if (self->stall_timer_.expiry() > Clock::now()) return;  // re-armed meanwhile
    self->owner_->Count("stalled");
    LOG_WARN << "http: closing a connection whose client read nothing for "
             << self->config_.stall_timeout_s << " s (" << self->out_bytes_ << " bytes unsent)";
    self->OnPeerGone(/*stalled=*/true);
  });
  socket_.async_write_some(buffers, [self = shared_from_this()](error_code ec, size_t n) {
    self->OnWrite(ec, n);
  });
}

void Session::OnWrite(error_code ec, size_t n) {
  writing_ = false;
  stall_timer_.cancel();
  if (closed_) return;
  if (ec) {
    OnPeerGone();
    return;
  }
  out_bytes_ -= n;
  while (n > 0) {
    const size_t left = out_.front().size() - out_offset_;
    if (n < left) {
      out_offset_ += n;
      break;
    }
    n -= left;
    out_.pop_front();
    out_offset_ = 0;
  }
  if (paused_ && out_bytes_ <= config_.stream_buffer_bytes / 2) {
    paused_ = false;
    if (poll_wanted_) {
      poll_wanted_ = false;
      PollAsync();
    }
  }
  if (!out_.empty()) {
    Write();
  } else if (response_complete_) {
    OnResponseWritten();
  }
}

void Session::OnResponseWritten() {
  response_complete_ = false;
  probe_timer_.cancel();
  if (!keep_alive_ || stop_requested_ || owner_->stopping.load()) {
    LingerClose();
    return;
  }
  BeginRequest();  // answers pipelined requests already buffered, in order
}

// ---- the client going away ----

void Session::OnPeerEof() {
  peer_eof_ = true;
  switch (phase_) {
    case Phase::kReading:  // between requests, or in the middle of one: nothing to answer
    case Phase::kLingering:
      Close();
      return;
    case Phase::kHandling:
    case Phase::kResponding:
      // Half-closed (the client is done sending) or gone: a response in progress goes on, and
      // probes tell the two apart.
      if (async_) Probe(0);
      return;
  }
}

void Session::Probe(size_t index) {
  if (closed_ || !async_ || index >= std::size(kProbeDelays)) return;
  probe_timer_.expires_after(kProbeDelays[index]);
  probe_timer_.async_wait([weak = weak_from_this(), index](error_code ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_ || !self->async_) return;
    // Harmless to a live client: a 1xx interim response before the final one, or an SSE comment.
    if (self->async_->streaming()) {
      if (self->chunked_) self->Queue(Chunk(":\n\n"));
    } else if (self->current_.version >= 11) {
      self->Queue("HTTP/1.1 102 Processing\r\n\r\n");
    }
    self->Write();
    self->Probe(index + 1);
  });
}

void Session::OnPeerGone(bool stalled) {
  if (async_ || phase_ == Phase::kHandling) {
    if (!stalled) owner_->Count("disconnect");
    if (async_) async_->Abort();
    Finished(499);
  }
  Close();
}

// ---- deadlines and closing ----

void Session::ArmReadDeadline(Clock::duration after) {
  read_deadline_.expires_after(after);
  read_deadline_.async_wait([weak = weak_from_this()](error_code ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_) return;
    if (self->read_deadline_.expiry() > Clock::now()) return;
    self->OnReadDeadline();
  });
}

void Session::OnReadDeadline() {
  if (phase_ == Phase::kLingering) {
    Close();
    return;
  }
  if (phase_ != Phase::kReading) return;
  const bool started = parser_->got_some() || in_.size() > 0;
  if (!started) {  // an idle keep-alive connection
    Close();
    return;
  }
  owner_->Count("timeout");
  if (!header_checked_) started_ = Clock::now();
  RespondAndClose(owner_->hooks.error(
      408, std::string("the request ") + (header_checked_ ? "body" : "header") +
               " did not arrive in time",
      "request_timeout"));
}

void Session::Finished(int status, const std::string& note) {
  if (finished_) return;
  finished_ = true;
  if (!owner_->hooks.finished) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - started_).count();
  owner_->hooks.finished(current_, status, seconds, note);
}

void Session::LingerClose() {
  if (closed_) return;
  phase_ = Phase::kLingering;
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  if (peer_eof_) {
    Close();
    return;
  }
  in_.consume(in_.size());
  ArmReadDeadline(kLingerTime);
  Read();
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  read_deadline_.cancel();
  stall_timer_.cancel();
  probe_timer_.cancel();
  if (async_) {
    async_->Abort();
    async_.reset();
  }
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  const std::shared_ptr<Session> last = std::move(self_while_async_);  // dies after this line
}

// ---- the listener ----

Result<int> HttpTransport::Impl::Bind() {
  error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(config.host, std::to_string(config.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty())
    return Status::Error("--host " + config.host + ": not an address of this machine (" +
                         ec.message() + ")");
  const tcp::endpoint endpoint = *endpoints.begin();
  const std::string where = config.host + ":" + std::to_string(config.port);
  acceptor.open(endpoint.protocol(), ec);
  // SO_REUSEADDR only lets a restarted server bind while old connections linger in TIME_WAIT;
  // Linux still refuses a port that another socket listens on (SO_REUSEPORT is never set).
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (ec == asio::error::address_in_use)
    return Status::Error("cannot listen on " + where +
                         ": the port is already in use (is another server running there?)");
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::Error("cannot listen on " + where + ": " + ec.message());

  // Every connection is a descriptor: raise the soft limit to the hard one, and keep the cap
  // within it (a few descriptors stay for the model files and logs).
  rlimit limit{};
  max_connections = config.max_connections;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    if (limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      setrlimit(RLIMIT_NOFILE, &limit);
      getrlimit(RLIMIT_NOFILE, &limit);
    }
    const auto usable = static_cast<int64_t>(limit.rlim_cur) - 64;
    if (usable < max_connections) {
      max_connections = static_cast<int>(std::max<int64_t>(usable, 16));
      LOG_WARN << "http: --max-connections lowered to " << max_connections
               << " by the open-file limit (ulimit -n " << limit.rlim_cur << ")";
    }
  }
  return static_cast<int>(acceptor.local_endpoint().port());
}

void HttpTransport::Impl::Serve() {
  asio::post(main, [this] { Accept(); });
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, config.io_threads); ++i) threads.emplace_back([this] { io.run(); });
  io.run();
  for (std::thread& t : threads) t.join();
  workers.join();
  // Connections Stop's grace left open: close them and run their last handlers here, so no
  // response outlives Serve (its job borrows the model).
  std::vector<std::shared_ptr<Session>> open = OpenSessions();
  for (auto& s : open) s->ForceClose();
  open.clear();
  io.restart();
  io.run_for(std::chrono::seconds(1));
}

void HttpTransport::Impl::Accept() {
  if (stopping.load()) return;
  acceptor.async_accept(asio::make_strand(io), [this](error_code ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket));
  });
}

void HttpTransport::Impl::OnAccept(error_code ec, tcp::socket socket) {
  if (stopping.load() || ec == asio::error::operation_aborted) return;
  if (ec) {  // e.g. out of descriptors: retry shortly rather than spin
    LOG_WARN << "http: accept failed: " << ec.message();
    retry_timer.expires_after(std::chrono::milliseconds(50));
    retry_timer.async_wait([this](error_code wait_ec) {
      if (!wait_ec) Accept();
    });
    return;
  }
  if (NumConnections() >= max_connections) {
    RejectBusy(socket);
  } else {
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    // The kernel's send buffer counts toward a client's unsent bytes too: without a cap it
    // autotunes to megabytes per connection, and a client that never reads is noticed late.
    const size_t kernel_buffer = std::min(config.stream_buffer_bytes, size_t{4} << 20);
    socket.set_option(asio::socket_base::send_buffer_size(static_cast<int>(kernel_buffer)), ignored);
    auto session = std::make_shared<Session>(this, std::move(socket));
    Register(session.get(), session);
    asio::post(session->executor(), [session] { session->Start(); });
  }
  Accept();
}

// Over the connection cap: a 503 written without waiting (it fits the socket buffer), then close.
void HttpTransport::Impl::RejectBusy(tcp::socket& socket) {
  Count("rejected");
  HttpResponse r = hooks.error(503,
                               "the server has too many open connections (--max-connections " +
                                   std::to_string(max_connections) + "); retry shortly",
                               "too_many_connections");
  r.headers.emplace_back("Retry-After", "1");
  const std::string bytes = SerializeHead(r, /*keep_alive=*/false, /*chunked=*/false) + r.body;
  error_code ec;
  socket.non_blocking(true, ec);
  if (!ec) socket.write_some(asio::buffer(bytes), ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

std::vector<std::shared_ptr<Session>> HttpTransport::Impl::OpenSessions() const {
  std::vector<std::shared_ptr<Session>> open;
  MutexLock lock(&sessions_mu);
  for (auto& [ptr, weak] : sessions)
    if (auto s = weak.lock()) open.push_back(std::move(s));
  return open;
}

void HttpTransport::Impl::Register(Session* session, std::weak_ptr<Session> weak) {
  MutexLock lock(&sessions_mu);
  sessions.emplace(session, std::move(weak));
}

void HttpTransport::Impl::Unregister(Session* session) {
  bool last = false;
  {
    MutexLock lock(&sessions_mu);
    sessions.erase(session);
    last = sessions.empty();
  }
  if (last && stopping.load() && !io.stopped()) asio::post(main, [this] { stop_timer.cancel(); });
}

void HttpTransport::Impl::Stop() {
  asio::post(main, [this] {
    if (stopping.exchange(true)) return;
    error_code ignored;
    acceptor.close(ignored);
    retry_timer.cancel();
    std::vector<std::shared_ptr<Session>> open = OpenSessions();
    if (open.empty()) return;
    for (auto& s : open) asio::post(s->executor(), [s] { s->CloseWhenIdle(); });
    // Responses in flight get a short while to finish; then the I/O threads stop regardless.
    stop_timer.expires_after(kStopGrace);
    stop_timer.async_wait([this](error_code ec) {
      if (!ec) io.stop();
    });
  });
}

// ---- HttpTransport ----

HttpTransport::HttpTransport(TransportConfig config, HttpHooks hooks)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(hooks))) {}

HttpTransport::~HttpTransport() = default;

Result<int> HttpTransport::Bind() { return impl_->Bind(); }
void HttpTransport::Serve() { impl_->Serve(); }
void HttpTransport::Stop() { impl_->Stop(); }
int64_t HttpTransport::num_connections() const { return impl_->NumConnections(); }

}  // namespace ember::serve
