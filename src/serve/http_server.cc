#include "serve/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>

#include "engine/engine.h"
#include "serve/generation_job.h"
#include "serve/peer_watch.h"
#include "template/chat_template.h"
#include "util/json_bounds.h"
#include "util/log.h"

namespace ember::serve {

namespace {

using nlohmann::json;

constexpr auto kPollInterval = std::chrono::milliseconds(20);

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                  "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) { SendJson(res, e.http_status, e.ToJson()); }

// Constant-time comparison: the time taken does not depend on where the strings differ.
bool SecureEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string RouteLabel(const std::string& path) {
  static const char* kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                  "/health", "/metrics", "/stats"};
  for (const char* r : kRoutes)
    if (path == r) return r;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models";
  return "other";
}

// httplib 0.11 listens with a backlog of 5, far too few for hundreds of clients connecting at
// once (dropped SYNs cost seconds of retransmits). The listening socket is protected state of
// httplib::Server; this subclass exposes it so Bind can raise the backlog (Linux lets listen()
// be called again on a listening socket to change it).
class BacklogServer : public httplib::Server {
 public:
  int listening_socket() const { return static_cast<int>(svr_sock_.load()); }
};

}  // namespace

HttpServer::HttpServer(HttpConfig config, ServedModel model)
    : config_(std::move(config)), model_(std::move(model)),
      server_(std::make_unique<BacklogServer>()) {
  started_unix_ = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const int threads = config_.num_threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(config_.max_body_bytes);
  server_->set_keep_alive_max_count(100000);
  server_->set_keep_alive_timeout(config_.keep_alive_seconds);
  server_->set_tcp_nodelay(true);
  Route();
}

HttpServer::~HttpServer() = default;

Result<int> HttpServer::Bind() {
  int port = config_.port;
  if (port == 0) {
    port = server_->bind_to_any_port(config_.host);
    if (port < 0) return Status::Error("cannot bind to " + config_.host + " (any port)");
  } else if (!server_->bind_to_port(config_.host, port)) {
    return Status::Error("cannot bind to " + config_.host + ":" + std::to_string(port) +
                         " (in use, or not an address of this machine)");
  }
  const int fd = static_cast<BacklogServer*>(server_.get())->listening_socket();
  if (fd >= 0 && ::listen(fd, SOMAXCONN) != 0) {
    LOG_WARN << "could not raise the listen backlog; many simultaneous connects may be slow";
  }
  return port;
}

void HttpServer::Serve() { server_->listen_after_bind(); }

void HttpServer::Stop() { server_->stop(); }

bool HttpServer::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (config_.api_key.empty()) return true;
  if (SecureEquals(req.get_header_value("Authorization"), "Bearer " + config_.api_key))
    return true;
  SendError(res, ApiError{401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                          "invalid_request_error", "", "invalid_api_key"});
  return false;
}

json HttpServer::ModelJson() const {
  const GenerationDefaults& d = model_.defaults;
  json defaults = json::object();
  if (d.temperature) defaults["temperature"] = *d.temperature;
  if (d.top_p) defaults["top_p"] = *d.top_p;
  if (d.top_k) defaults["top_k"] = *d.top_k;
  if (d.min_p) defaults["min_p"] = *d.min_p;
  if (d.repetition_penalty) defaults["repetition_penalty"] = *d.repetition_penalty;
  if (d.max_new_tokens) defaults["max_tokens"] = *d.max_new_tokens;
  defaults["eos_token_ids"] = d.eos_token_ids;
  const bool chat = model_.chat_template != nullptr && model_.chat_template->has_template();
  json capabilities = {
      {"completions", true},
      {"chat_completions", chat},
      {"streaming", true},
      {"logprobs", true},
      {"max_top_logprobs", 20},
      {"max_n", model_.max_n},
      {"stop_strings", true},
      {"seed", true},
      {"logit_bias", true},
      // Tool definitions reach the prompt through the chat template; calls come back as
      // tool_calls when the server knows the model's tool-call format.
      {"tools", chat && model_.tool_format != ToolCallFormat::kNone},
      {"tool_call_format", ToolCallFormatName(model_.tool_format)},
      {"tool_definitions_in_prompt", chat},
      // A leading <think> block (or harmony's analysis channel) comes back as reasoning_content.
      {"reasoning_content", chat && model_.reasoning_format != ReasoningFormat::kNone},
      {"reasoning_format", ReasoningFormatName(model_.reasoning_format)},
      // JSON mode and JSON schemas (the supported subset: src/serve/README.md).
      {"structured_output", model_.token_texts != nullptr},
      {"response_formats", model_.token_texts != nullptr ? json::array({"text", "json_object", "json_schema"})
                                                         : json::array({"text"})},
      {"embeddings", false},
      {"vision", false},
      {"audio", false},
      {"prefix_caching", true},
  };
  return {{"id", model_.name},
          {"object", "model"},
          {"created", started_unix_},
          {"owned_by", "ember"},
          {"context_length", model_.context_length},
          {"max_model_len", model_.context_length},
          {"generation_defaults", defaults},
          {"capabilities", capabilities}};
}

void HttpServer::HandleGeneration(const httplib::Request& req, httplib::Response& res,
                                  Endpoint endpoint) {
  const int64_t arrival_ns = NowNs();
  if (!Authorized(req, res)) return;
  if (shutting_down_.load()) {
    SendError(res, ApiError{503, "the server is shutting down", "server_error", "",
                            "shutting_down"});
    return;
  }
  // Parsed once, in the client's key order; nesting past kMaxBodyDepth is refused by a linear
  // pre-scan before the parser sees it, and objects parse in time linear in their keys.
  Result<RequestJson> parsed = ParseOrderedJsonBounded(req.body, kMaxBodyDepth);
  if (!parsed.ok()) {
    SendError(res, InvalidRequest("the request body is not valid JSON (UTF-8): " +
                                      parsed.message(),
                                  "", "invalid_json"));
    return;
  }
  const RequestJson body = std::move(*parsed);
  Prepared prepared =
      endpoint == Endpoint::kChat ? PrepareChat(model_, body) : PrepareCompletion(model_, body);
  if (auto* error = std::get_if<ApiError>(&prepared)) {
    SendError(res, *error);
    return;
  }
  auto started = GenerationJob::Start(model_, std::move(std::get<PreparedRequest>(prepared)),
                                      &metrics_, arrival_ns);
  if (auto* error = std::get_if<ApiError>(&started)) {
    SendError(res, *error);
    return;
  }
  std::shared_ptr<GenerationJob> job = std::move(std::get<std::unique_ptr<GenerationJob>>(started));
  auto watch = std::make_shared<PeerWatch>(req.remote_addr, req.remote_port, req.local_port);

  if (!job->stream()) {
    while (!job->PollUntilDone(kPollInterval)) {
      if (watch->PeerGone()) {
        job->Cancel();
        metrics_.CountDisconnect();
        res.status = 499;  // nobody reads it; the connection is gone
        return;
      }
    }
    std::variant<json, ApiError> result = job->Result();
    if (auto* error = std::get_if<ApiError>(&result)) {
      SendError(res, *error);
    } else {
      SendJson(res, 200, std::get<json>(result));
    }
    return;
  }

  metrics_.StreamOpened();
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  Metrics* metrics = &metrics_;
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, watch, metrics](size_t, httplib::DataSink& sink) {
        std::string out;
        const bool more = job->PollStream(kPollInterval, &out);
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          job->Cancel();
          metrics->CountDisconnect();
          return false;
        }
        if (!more) {
          sink.done();
          return true;
        }
        if (out.empty() && watch->PeerGone()) {
          job->Cancel();
          metrics->CountDisconnect();
          return false;
        }
        return true;
      },
      [job, metrics](bool success) {
        if (!success) job->Cancel();
        metrics->StreamClosed();
      });
}

void HttpServer::Route() {
  httplib::Server& s = *server_;
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(req, res, Endpoint::kChat);
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGeneration(req, res, Endpoint::kCompletion);
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    SendJson(res, 200, {{"object", "list"}, {"data", json::array({ModelJson()})}});
  });
  s.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    if (req.matches[1] != model_.name) {
      SendError(res, ApiError{404, "The model '" + std::string(req.matches[1]) +
                                       "' does not exist",
                              "invalid_request_error", "model", "model_not_found"});
      return;
    }
    SendJson(res, 200, ModelJson());
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (shutting_down_.load()) {
      SendJson(res, 503, {{"status", "shutting_down"}});
    } else {
      SendJson(res, 200, {{"status", "ok"}});
    }
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.Prometheus(model_.engine->Stats()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
    json stats = metrics_.Json(model_.engine->Stats());
    stats["model"] = model_.name;
    stats["context_length"] = model_.context_length;
    stats["kv_capacity_tokens"] = model_.engine->kv_capacity_tokens();
    stats["kv_cache_bytes"] = model_.engine->kv_cache_bytes();
    stats["max_batch"] = model_.engine->max_running();
    stats["max_step_tokens"] = model_.engine->max_step_tokens();
    SendJson(res, 200, stats);
  });

  // Known paths with the wrong method: 405 rather than 404.
  auto method_not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    SendError(res, ApiError{405, "Method " + req.method + " is not allowed on " + req.path,
                            "invalid_request_error", "", "method_not_allowed"});
  };
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    s.Get(path, method_not_allowed);
    s.Put(path, method_not_allowed);
    s.Patch(path, method_not_allowed);
    s.Delete(path, method_not_allowed);
  }
  for (const char* path : {"/v1/models", "/health", "/metrics", "/stats"}) {
    s.Post(path, method_not_allowed);
    s.Put(path, method_not_allowed);
    s.Patch(path, method_not_allowed);
    s.Delete(path, method_not_allowed);
  }

  // Errors httplib produces itself (404 unknown path, 413 body too large, 400 bad HTTP) get an
  // OpenAI-shaped body.
  const size_t max_body = config_.max_body_bytes;
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = res.status;
    if (res.status == 404) {
      e.message = "Unknown path " + req.path;
      e.code = "not_found";
    } else if (res.status == 413) {
      e.message = "The request body is larger than the limit of " + std::to_string(max_body) +
                  " bytes (--max-body-bytes)";
      e.code = "request_too_large";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LOG_ERROR << "request handler threw: " << what;
    SendError(res, ApiError{500, "internal error: " + what, "server_error", "", "internal_error"});
  });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.CountRequest(RouteLabel(req.path), res.status);
  });
}

}  // namespace ember::serve
