#include "serve/http_server.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "engine/engine.h"
#include "serve/api_dialect.h"
#include "serve/generation_job.h"
#include "template/chat_template.h"
#include "util/json_bounds.h"
#include "util/log.h"
#include "util/version.h"

namespace ember::serve {

namespace {

using nlohmann::json;

constexpr auto kNoWait = std::chrono::milliseconds(0);
constexpr const char* kGenerationRoutes[] = {"/v1/chat/completions", "/v1/completions"};
constexpr const char* kReadRoutes[] = {"/v1/models", "/health", "/metrics", "/stats"};

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

HttpResponse JsonResponse(int status, const json& body) {
  HttpResponse res;
  res.status = status;
  res.body = body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return res;
}

HttpResponse ErrorResponse(const ApiError& e) { return JsonResponse(e.http_status, e.ToJson()); }

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

bool IsGenerationRoute(const std::string& path) {
  for (const char* r : kGenerationRoutes)
    if (path == r) return true;
  return IsDialectRoute(path);  // Anthropic Messages, OpenAI Responses (api_dialect.h)
}

bool IsModelPath(const std::string& path) {
  return path.size() > 11 && path.rfind("/v1/models/", 0) == 0;
}

bool IsReadRoute(const std::string& path) {
  for (const char* r : kReadRoutes)
    if (path == r) return true;
  return IsModelPath(path);
}

std::string RouteLabel(const std::string& path) {
  if (IsGenerationRoute(path) || IsReadRoute(path)) return IsModelPath(path) ? "/v1/models" : path;
  return "other";
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The host name of a Host header: "[::1]:8080" -> "::1", "Example.com:80" -> "example.com".
std::string HostName(const std::string& header) {
  if (!header.empty() && header[0] == '[') {
    const size_t close = header.find(']');
    return Lower(header.substr(1, close == std::string::npos ? std::string::npos : close - 1));
  }
  const size_t colon = header.find(':');
  if (colon != std::string::npos && header.find(':', colon + 1) == std::string::npos)
    return Lower(header.substr(0, colon));
  return Lower(header);
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

bool IsWildcard(const std::string& host) { return host.empty() || host == "0.0.0.0" || host == "::"; }

// For the access log: the path only (never the query), printable, bounded.
std::string LoggablePath(const std::string& path) {
  std::string out;
  for (char c : path.substr(0, 200)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

// A generation in flight, driven by its connection: the job's streams wake the connection, which
// polls without waiting. Destroying an unfinished one cancels the job. A dialect route's output
// (non-null `dialect`) is reshaped from the chat completion's.
class GenerationResponse final : public AsyncResponse {
 public:
  GenerationResponse(std::unique_ptr<GenerationJob> job, Metrics* metrics,
                     std::unique_ptr<DialectOutput> dialect)
      : job_(std::move(job)), metrics_(metrics), dialect_(std::move(dialect)) {
    if (job_->stream()) metrics_->StreamOpened();
  }
  ~GenerationResponse() override {
    job_->SetNotify(nullptr);  // the engine may outlive the connection that woke on it
    if (job_->stream()) metrics_->StreamClosed();
  }

  bool streaming() const override { return job_->stream(); }
  HttpResponse Head() override {
    HttpResponse head;
    head.content_type = "text/event-stream";
    head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
    return head;
  }
  void Start(std::function<void()> wake) override { job_->SetNotify(wake); }
  bool Poll(std::string* out) override {
    if (!job_->stream()) return !job_->PollUntilDone(kNoWait);
    if (dialect_ == nullptr) return job_->PollStream(kNoWait, out);
    return PollDialect(out);
  }
  HttpResponse Final() override {
    std::variant<json, ApiError> result = job_->Result();
    if (auto* error = std::get_if<ApiError>(&result)) return ErrorResponse(*error);
    if (dialect_ != nullptr)
      return JsonResponse(200, dialect_->Body(std::get<json>(result), job_->stop_string(0)));
    return JsonResponse(200, std::get<json>(result));
  }
  void Abort() override { job_->Cancel(); }
  std::string LogNote() const override {
    const Usage usage = job_->usage();
    return "tokens=" + std::to_string(usage.prompt_tokens) + "+" +
           std::to_string(usage.completion_tokens);
  }

 private:
  bool PollDialect(std::string* out) {
    if (!dialect_begun_) {
      dialect_begun_ = true;
      dialect_->Begin(job_->usage(), out);
    }
    std::vector<json> chunks;
    const bool more = job_->PollChunks(kNoWait, &chunks);
    for (const json& chunk : chunks) dialect_->Chunk(chunk, out);
    if (more) return true;
    if (job_->error()) dialect_->Fail(*job_->error(), out);
    else dialect_->End(job_->usage(), job_->stop_string(0), out);
    return false;
  }

  std::unique_ptr<GenerationJob> job_;
  Metrics* metrics_;
  std::unique_ptr<DialectOutput> dialect_;
  bool dialect_begun_ = false;
};

}  // namespace

HttpServer::HttpServer(HttpConfig config) : config_(std::move(config)) {
  started_unix_ = UnixNow();
  TransportConfig t;
  t.host = config_.host;
  t.port = config_.port;
  t.io_threads = config_.num_threads;
  t.worker_threads = std::max(2, config_.num_threads);
  t.max_connections = config_.max_connections;
  t.max_body_bytes = config_.max_body_bytes;
  t.header_timeout_s = config_.header_timeout_s;
  t.body_timeout_s = config_.body_timeout_s;
  t.keep_alive_timeout_s = config_.keep_alive_timeout_s;
  t.stream_buffer_bytes = config_.stream_buffer_bytes;
  t.stall_timeout_s = config_.stall_timeout_s;
  HttpHooks hooks;
  hooks.check_header = [this](const HttpRequest& head) { return CheckHeader(head); };
  hooks.handle = [this](const HttpRequest& req) { return Handle(req); };
  // Everything but a generation is answered from memory.
  hooks.cheap = [](const HttpRequest& req) {
    return !(req.method == "POST" && IsGenerationRoute(req.path));
  };
  hooks.error = [](int status, const std::string& message, const std::string& code) {
    return ErrorResponse(ApiError{status, message,
                                  status >= 500 ? "server_error" : "invalid_request_error", "",
                                  code});
  };
  hooks.decorate = [this](const HttpRequest& req, HttpResponse* res) {
    ShapeDialectError(req.path, res->status, &res->body);  // Anthropic's error shape on its routes
    AddCorsHeaders(req, res);
  };
  hooks.finished = [this](const HttpRequest& req, int status, double seconds,
                          const std::string& note) { OnFinished(req, status, seconds, note); };
  hooks.count = [this](const char* event) { metrics_.CountConnectionEvent(event); };
  transport_ = std::make_unique<HttpTransport>(std::move(t), std::move(hooks));
}

HttpServer::~HttpServer() = default;

Result<int> HttpServer::Bind() { return transport_->Bind(); }

void HttpServer::Serve(ServedModel model) {
  model_ = std::move(model);
  transport_->Serve();
}

void HttpServer::Stop() { transport_->Stop(); }

// ---- request policy: Host, Origin, CORS, auth ----

bool HttpServer::HostAllowed(const std::string& host_header) const {
  const std::string name = HostName(host_header);
  const std::string bound = Lower(config_.host);
  for (const std::string& allowed : config_.allowed_hosts)
    if (allowed == "*" || Lower(allowed) == name) return true;
  if (name == bound) return true;
  if (IsLoopback(bound) && IsLoopback(name)) return true;
  // Bound to every address: the client names one of them (a DNS-rebinding page needs a name).
  return IsWildcard(bound) && (IsIpLiteral(name) || name == "localhost");
}

std::optional<HttpResponse> HttpServer::CheckHeader(const HttpRequest& head) const {
  if (!head.HasHeader("host")) {
    if (head.version < 11) return std::nullopt;  // HTTP/1.0 may omit it
    return ErrorResponse(InvalidRequest("the Host header is required (HTTP/1.1)", "",
                                        "missing_host"));
  }
  const std::string host = head.Header("host");
  if (!HostAllowed(host)) {
    return ErrorResponse(ApiError{
        403,
        "Host '" + LoggablePath(host) + "' is not a name of this server (DNS-rebinding "
        "protection); to reach it by that name start it with --allowed-hosts " +
            LoggablePath(HostName(host)) + " (or '*')",
        "invalid_request_error", "", "host_not_allowed"});
  }
  const std::string origin = head.Header("origin");
  if (!origin.empty() && config_.cors_origin != "*" && origin != config_.cors_origin) {
    return ErrorResponse(ApiError{
        403,
        "cross-origin request from '" + LoggablePath(origin) +
            "' refused: start the server with --cors-origin ORIGIN to let a web page call it",
        "invalid_request_error", "", "origin_not_allowed"});
  }
  return std::nullopt;
}

void HttpServer::AddCorsHeaders(const HttpRequest& req, HttpResponse* res) const {
  if (config_.cors_origin.empty()) return;
  const std::string origin = req.Header("origin");
  if (origin.empty()) return;
  if (config_.cors_origin != "*" && origin != config_.cors_origin) return;
  res->headers.emplace_back("Access-Control-Allow-Origin",
                            config_.cors_origin == "*" ? "*" : config_.cors_origin);
  res->headers.emplace_back("Vary", "Origin");
}

// OPTIONS: a browser's preflight (its Origin already passed CheckHeader) or a plain question.
HttpResponse HttpServer::Preflight(const HttpRequest& req) const {
  HttpResponse res;
  res.status = 204;
  const std::string methods = IsGenerationRoute(req.path) ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
  res.headers.emplace_back("Allow", methods);
  if (!config_.cors_origin.empty() && req.HasHeader("origin")) {
    res.headers.emplace_back("Access-Control-Allow-Methods", methods);
    std::string headers = req.Header("access-control-request-headers");
    res.headers.emplace_back("Access-Control-Allow-Headers",
                             headers.empty() ? "Authorization, Content-Type" : headers);
    res.headers.emplace_back("Access-Control-Max-Age", "600");
  }
  return res;
}

std::optional<HttpResponse> HttpServer::Unauthorized(const HttpRequest& req) const {
  if (config_.api_key.empty()) return std::nullopt;
  if (SecureEquals(req.Header("authorization"), "Bearer " + config_.api_key)) return std::nullopt;
  if (SecureEquals(req.Header("x-api-key"), config_.api_key)) return std::nullopt;  // Anthropic's
  return ErrorResponse(ApiError{401, "Incorrect or missing API key: send 'Authorization: Bearer KEY' "
                                "(or 'x-api-key: KEY')",
                                "invalid_request_error", "", "invalid_api_key"});
}

void HttpServer::OnFinished(const HttpRequest& req, int status, double seconds,
                            const std::string& note) {
  metrics_.CountRequest(RouteLabel(req.path), status);
  char ms[32];
  std::snprintf(ms, sizeof(ms), "%.1f", seconds * 1e3);
  LOG_INFO << "http " << (req.method.empty() ? "-" : LoggablePath(req.method)) << " "
           << (req.path.empty() ? "-" : LoggablePath(req.path)) << " " << status << " " << ms
           << " ms" << (note.empty() ? "" : " ") << note;
}

// ---- routes ----

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
          {"ember_version", kEmberVersion},
          {"uptime_s", UnixNow() - started_unix_},
          {"context_length", model_.context_length},
          {"max_model_len", model_.context_length},
          {"generation_defaults", defaults},
          {"capabilities", capabilities}};
}

Handled HttpServer::HandleGeneration(const HttpRequest& req, Endpoint endpoint) {
  const int64_t arrival_ns = NowNs();
  if (auto denied = Unauthorized(req)) return {std::move(*denied), nullptr};
  if (shutting_down_.load()) {
    return {ErrorResponse(ApiError{503, "the server is shutting down", "server_error", "",
                                   "shutting_down"}),
            nullptr};
  }
  // Parsed once, in the client's key order; nesting past kMaxBodyDepth is refused by a linear
  // pre-scan before the parser sees it, and objects parse in time linear in their keys.
  Result<RequestJson> parsed = ParseOrderedJsonBounded(req.body, kMaxBodyDepth);
  if (!parsed.ok()) {
    return {ErrorResponse(InvalidRequest(
                "the request body is not valid JSON (UTF-8): " + parsed.message(), "",
                "invalid_json")),
            nullptr};
  }
  const RequestJson body = std::move(*parsed);
  std::unique_ptr<DialectOutput> dialect;
  Prepared prepared;
  if (IsDialectRoute(req.path)) {
    DialectResult result = PrepareDialect(req.path, model_, body);
    if (auto* error = std::get_if<ApiError>(&result)) return {ErrorResponse(*error), nullptr};
    if (auto* answer = std::get_if<json>(&result)) return {JsonResponse(200, *answer), nullptr};
    DialectGeneration& generation = std::get<DialectGeneration>(result);
    prepared = std::move(generation.prepared);
    dialect = std::move(generation.output);
  } else {
    prepared = endpoint == Endpoint::kChat ? PrepareChat(model_, body) : PrepareCompletion(model_, body);
  }
  if (auto* error = std::get_if<ApiError>(&prepared)) return {ErrorResponse(*error), nullptr};
  auto started = GenerationJob::Start(model_, std::move(std::get<PreparedRequest>(prepared)),
                                      &metrics_, arrival_ns);
  if (auto* error = std::get_if<ApiError>(&started)) return {ErrorResponse(*error), nullptr};
  return {HttpResponse{}, std::make_unique<GenerationResponse>(
                              std::move(std::get<std::unique_ptr<GenerationJob>>(started)),
                              &metrics_, std::move(dialect))};
}

HttpResponse HttpServer::Stats() const {
  json stats = metrics_.Json(model_.engine->Stats());
  stats["model"] = model_.name;
  stats["context_length"] = model_.context_length;
  stats["kv_capacity_tokens"] = model_.engine->kv_capacity_tokens();
  stats["kv_cache_bytes"] = model_.engine->kv_cache_bytes();
  stats["max_batch"] = model_.engine->max_running();
  stats["max_step_tokens"] = model_.engine->max_step_tokens();
  stats["http"]["open_connections"] = transport_->num_connections();
  return JsonResponse(200, stats);
}

Handled HttpServer::Handle(const HttpRequest& req) {
  try {
    return Route(req);
  } catch (const std::exception& e) {
    LOG_ERROR << "request handler threw: " << e.what();
    return {ErrorResponse(ApiError{500, std::string("internal error: ") + e.what(), "server_error",
                                   "", "internal_error"}),
            nullptr};
  }
}

Handled HttpServer::Route(const HttpRequest& req) {
  const std::string& path = req.path;
  const bool generation = IsGenerationRoute(path);
  if (!generation && !IsReadRoute(path))
    return {ErrorResponse(ApiError{404, "Unknown path " + LoggablePath(path),
                                   "invalid_request_error", "", "not_found"}),
            nullptr};
  if (req.method == "OPTIONS") return {Preflight(req), nullptr};
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (generation ? req.method != "POST" : !get) {
    return {ErrorResponse(ApiError{405, "Method " + LoggablePath(req.method) +
                                            " is not allowed on " + LoggablePath(path),
                                   "invalid_request_error", "", "method_not_allowed"}),
            nullptr};
  }
  if (generation)
    return HandleGeneration(req, path == "/v1/completions" ? Endpoint::kCompletion
                                                           : Endpoint::kChat);
  if (path == "/health") {
    if (shutting_down_.load()) return {JsonResponse(503, {{"status", "shutting_down"}}), nullptr};
    return {JsonResponse(200, {{"status", "ok"}}), nullptr};
  }
  if (path == "/metrics") {
    HttpResponse res;
    res.content_type = "text/plain; version=0.0.4; charset=utf-8";
    res.body = metrics_.Prometheus(model_.engine->Stats());
    return {std::move(res), nullptr};
  }
  if (path == "/stats") return {Stats(), nullptr};
  if (auto denied = Unauthorized(req)) return {std::move(*denied), nullptr};
  if (path == "/v1/models")
    return {JsonResponse(200, {{"object", "list"}, {"data", json::array({ModelJson()})}}), nullptr};
  const std::string id = path.substr(std::string("/v1/models/").size());
  if (id != model_.name) {
    return {ErrorResponse(ApiError{404, "The model '" + id + "' does not exist",
                                   "invalid_request_error", "model", "model_not_found"}),
            nullptr};
  }
  return {JsonResponse(200, ModelJson()), nullptr};
}

}  // namespace ember::serve
