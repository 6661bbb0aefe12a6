#include "serve/http_server.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "engine/engine.h"
#include "serve/api_dialect.h"
#include "serve/body_fields.h"
#include "serve/generation_job.h"
#include "serve/utility_routes.h"
#include "serve/web_ui.h"
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
  return IsModelPath(path) || IsWebUiPath(path);
}

// The LoRA admin routes: /v1/adapters and /v1/adapters/NAME.
bool IsAdapterPath(const std::string& path) {
  return path == "/v1/adapters" || path.rfind("/v1/adapters/", 0) == 0;
}

std::string RouteLabel(const std::string& path) {
  if (IsAdapterPath(path)) return "/v1/adapters";
  if (IsGenerationRoute(path) || IsReadRoute(path) || IsUtilityRoute(path))
    return IsModelPath(path) ? "/v1/models" : path;
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
  GenerationResponse(ModelLibrary::Lease model, std::unique_ptr<GenerationJob> job, Metrics* metrics,
                     std::unique_ptr<DialectOutput> dialect)
      : model_(std::move(model)), job_(std::move(job)), metrics_(metrics),
        dialect_(std::move(dialect)) {
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

  ModelLibrary::Lease model_;  // pins the model the job borrows (declared first: outlives the job)
  std::unique_ptr<GenerationJob> job_;
  Metrics* metrics_;
  std::unique_ptr<DialectOutput> dialect_;
  bool dialect_begun_ = false;
};

// Another response that borrows a model, holding the model's lease as long as it lives.
class LeasedResponse final : public AsyncResponse {
 public:
  LeasedResponse(ModelLibrary::Lease model, std::unique_ptr<AsyncResponse> inner)
      : model_(std::move(model)), inner_(std::move(inner)) {}
  bool streaming() const override { return inner_->streaming(); }
  HttpResponse Head() override { return inner_->Head(); }
  void Start(std::function<void()> wake) override { inner_->Start(std::move(wake)); }
  bool Poll(std::string* out) override { return inner_->Poll(out); }
  HttpResponse Final() override { return inner_->Final(); }
  void Abort() override { inner_->Abort(); }
  std::string LogNote() const override { return inner_->LogNote(); }

 private:
  ModelLibrary::Lease model_;  // declared first: outlives inner_
  std::unique_ptr<AsyncResponse> inner_;
};

// A library's models each have their own RAM tier and disk directory: their counters add up; the
// last decision shown is any model's.
void AddRamTierStats(const PromptCacheRamStats& s, PromptCacheRamStats* total) {
  if (!s.enabled) return;
  total->enabled = true;
  for (auto [sum, value] : {std::pair{&total->records, s.records},
                            {&total->bytes, s.bytes},
                            {&total->capacity_bytes, s.capacity_bytes},
                            {&total->pinned_bytes, s.pinned_bytes},
                            {&total->lookup_misses, s.lookup_misses},
                            {&total->hits, s.hits},
                            {&total->misses, s.misses},
                            {&total->promotions, s.promotions},
                            {&total->demotions, s.demotions},
                            {&total->demote_failures, s.demote_failures},
                            {&total->evictions, s.evictions},
                            {&total->spills, s.spills},
                            {&total->prefetched, s.prefetched},
                            {&total->prefetch_failed, s.prefetch_failed},
                            {&total->prefetch_dropped, s.prefetch_dropped},
                            {&total->insert_drops, s.insert_drops},
                            {&total->corrupt_dropped, s.corrupt_dropped},
                            {&total->bytes_read, s.bytes_read},
                            {&total->bytes_written, s.bytes_written},
                            {&total->state_records, s.state_records},
                            {&total->state_bytes, s.state_bytes},
                            {&total->state_hits, s.state_hits},
                            {&total->state_prefetched, s.state_prefetched}})
    *sum += value;
  total->read_bytes_per_s = std::max(total->read_bytes_per_s, s.read_bytes_per_s);
}

void AddPromptCacheStats(const PromptCacheStats& s, PromptCacheStats* total) {
  AddRamTierStats(s.ram, &total->ram);
  if (!s.enabled && !s.ram.enabled) return;
  total->enabled = total->enabled || s.enabled;
  for (auto [sum, value] : {std::pair{&total->records, s.records},
                            {&total->bytes, s.bytes},
                            {&total->capacity_bytes, s.capacity_bytes},
                            {&total->queued_bytes, s.queued_bytes},
                            {&total->lookups, s.lookups},
                            {&total->lookup_misses, s.lookup_misses},
                            {&total->hits, s.hits},
                            {&total->misses, s.misses},
                            {&total->promotions, s.promotions},
                            {&total->evictions, s.evictions},
                            {&total->writes, s.writes},
                            {&total->write_drops, s.write_drops},
                            {&total->write_errors, s.write_errors},
                            {&total->corrupt_dropped, s.corrupt_dropped},
                            {&total->stale_temps_removed, s.stale_temps_removed},
                            {&total->bytes_read, s.bytes_read},
                            {&total->bytes_written, s.bytes_written},
                            {&total->loads, s.loads},
                            {&total->recomputes, s.recomputes},
                            {&total->state_records, s.state_records},
                            {&total->state_bytes, s.state_bytes},
                            {&total->state_hits, s.state_hits},
                            {&total->state_restores, s.state_restores},
                            {&total->state_misses, s.state_misses}})
    *sum += value;
  total->state_checkpoints = total->state_checkpoints || s.state_checkpoints;
  if (s.last_choice != PromptCacheStats::Choice::kNone) {
    total->last_choice = s.last_choice;
    total->last_read_bytes_per_s = s.last_read_bytes_per_s;
    total->last_prefill_tokens_per_s = s.last_prefill_tokens_per_s;
  }
  total->read_bytes_per_s = std::max(total->read_bytes_per_s, s.read_bytes_per_s);
  total->prefill_tokens_per_s = std::max(total->prefill_tokens_per_s, s.prefill_tokens_per_s);
}

void AddEngineStats(const EngineStats& s, EngineStats* total) {
  total->requests_submitted += s.requests_submitted;
  total->requests_finished += s.requests_finished;
  total->requests_cancelled += s.requests_cancelled;
  total->prompt_tokens += s.prompt_tokens;
  total->generated_tokens += s.generated_tokens;
  total->computed_tokens += s.computed_tokens;
  total->steps += s.steps;
  total->preemptions += s.preemptions;
  total->num_queued += s.num_queued;
  total->num_running += s.num_running;
  total->kv_blocks_total += s.kv_blocks_total;
  total->kv_blocks_used += s.kv_blocks_used;
  total->kv_blocks_cached += s.kv_blocks_cached;
  total->block_size = s.block_size;
  total->prefix_query_tokens += s.prefix_query_tokens;
  total->prefix_hit_tokens += s.prefix_hit_tokens;
  total->state_checkpoints += s.state_checkpoints;
  total->state_checkpoint_bytes += s.state_checkpoint_bytes;
  total->state_checkpoint_capacity_bytes += s.state_checkpoint_capacity_bytes;
  total->state_checkpoint_saves += s.state_checkpoint_saves;
  total->state_checkpoint_evictions += s.state_checkpoint_evictions;
  total->schedule_ns += s.schedule_ns;
  total->forward_ns += s.forward_ns;
  total->finish_ns += s.finish_ns;
  total->decode_steps += s.decode_steps;
  total->decode_rows += s.decode_rows;
  total->decode_forward_ns += s.decode_forward_ns;
  total->decode_padding_rows += s.decode_padding_rows;
  total->overlapped_steps += s.overlapped_steps;
  total->sampled_seq_steps += s.sampled_seq_steps;
  total->sampled_tokens += s.sampled_tokens;
  total->spec_verify_steps += s.spec_verify_steps;
  total->spec_draft_tokens += s.spec_draft_tokens;
  total->spec_accepted_tokens += s.spec_accepted_tokens;
  total->forced_tokens += s.forced_tokens;
  total->masked_rows_host += s.masked_rows_host;
  total->masked_rows_edits += s.masked_rows_edits;
  total->masked_rows_bits += s.masked_rows_bits;
  AddPromptCacheStats(s.prompt_cache, &total->prompt_cache);
}

// The body's `model` when it is a string ("" otherwise: the schema names a wrong type).
std::string RequestedModel(const RequestJson& body) {
  if (!body.is_object()) return "";
  auto it = body.find("model");
  return it != body.end() && it->is_string() ? it->get<std::string>() : "";
}

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
    // (A LoRA adapter's load reads its files: a worker's job too.)
    return !(req.method == "POST" && (IsGenerationRoute(req.path) || IsUtilityPostRoute(req.path) ||
                                      IsAdapterPath(req.path)));
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

void HttpServer::Serve(const ServedModel& model) {
  model_ = &model;
  transport_->Serve();
}

void HttpServer::ServeLibrary(ModelLibrary* library) {
  library_ = library;
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
  if (!origin.empty() && config_.cors_origin != "*" && origin != config_.cors_origin &&
      !IsSameOrigin(origin, host)) {
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
  const std::string methods = IsGenerationRoute(req.path) || IsUtilityPostRoute(req.path)
                                  ? "POST, OPTIONS"
                                  : "GET, HEAD, OPTIONS";
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

json HttpServer::ModelJson(const ServedModel& model) const {
  const GenerationDefaults& d = model.defaults;
  json defaults = json::object();
  if (d.temperature) defaults["temperature"] = *d.temperature;
  if (d.top_p) defaults["top_p"] = *d.top_p;
  if (d.top_k) defaults["top_k"] = *d.top_k;
  if (d.min_p) defaults["min_p"] = *d.min_p;
  if (d.repetition_penalty) defaults["repetition_penalty"] = *d.repetition_penalty;
  if (d.max_new_tokens) defaults["max_tokens"] = *d.max_new_tokens;
  defaults["eos_token_ids"] = d.eos_token_ids;
  const bool chat = model.chat_template != nullptr && model.chat_template->has_template();
  json capabilities = {
      {"completions", true},
      {"chat_completions", chat},
      {"streaming", true},
      {"logprobs", true},
      {"max_top_logprobs", 20},
      {"max_n", model.max_n},
      {"stop_strings", true},
      {"seed", true},
      {"logit_bias", true},
      // Tool definitions reach the prompt through the chat template; calls come back as
      // tool_calls when the server knows the model's tool-call format.
      {"tools", chat && model.tool_format != ToolCallFormat::kNone},
      {"tool_call_format", ToolCallFormatName(model.tool_format)},
      {"tool_definitions_in_prompt", chat},
      // A leading <think> block (or harmony's analysis channel) comes back as reasoning_content.
      {"reasoning_content", chat && model.reasoning_format != ReasoningFormat::kNone},
      {"reasoning_format", ReasoningFormatName(model.reasoning_format)},
      // JSON mode and JSON schemas (the supported subset: src/serve/README.md).
      {"structured_output", model.token_texts != nullptr},
      {"response_formats", model.token_texts != nullptr ? json::array({"text", "json_object", "json_schema"})
                                                         : json::array({"text"})},
      {"embeddings", model.embeddings.available},
      {"vision", false},
      {"audio", false},
      // Off with --no-prefix-cache, and for a model with recurrent layers (qwen3_next) without
      // room for a state checkpoint (--state-checkpoint-bytes 0).
      {"prefix_caching", model.engine == nullptr || model.engine->Stats().prefix_caching},
  };
  return {{"id", model.name},
          {"object", "model"},
          {"created", started_unix_},
          {"owned_by", "ember"},
          {"ember_version", kEmberVersion},
          {"uptime_s", UnixNow() - started_unix_},
          {"context_length", model.context_length},
          {"max_model_len", model.context_length},
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
  auto resolved = ResolveModel(RequestedModel(body));
  if (auto* error = std::get_if<ApiError>(&resolved)) return {ErrorResponse(*error), nullptr};
  ModelLibrary::Lease model = std::move(std::get<ModelLibrary::Lease>(resolved));
  std::unique_ptr<DialectOutput> dialect;
  Prepared prepared;
  if (IsDialectRoute(req.path)) {
    DialectResult result = PrepareDialect(req.path, *model, body);
    if (auto* error = std::get_if<ApiError>(&result)) return {ErrorResponse(*error), nullptr};
    if (auto* answer = std::get_if<json>(&result)) return {JsonResponse(200, *answer), nullptr};
    DialectGeneration& generation = std::get<DialectGeneration>(result);
    prepared = std::move(generation.prepared);
    dialect = std::move(generation.output);
  } else {
    prepared =
        endpoint == Endpoint::kChat ? PrepareChat(*model, body) : PrepareCompletion(*model, body);
  }
  if (auto* error = std::get_if<ApiError>(&prepared)) return {ErrorResponse(*error), nullptr};
  auto started = GenerationJob::Start(*model, std::move(std::get<PreparedRequest>(prepared)),
                                      &metrics_, arrival_ns);
  if (auto* error = std::get_if<ApiError>(&started)) return {ErrorResponse(*error), nullptr};
  return {HttpResponse{}, std::make_unique<GenerationResponse>(
                              std::move(model),
                              std::move(std::get<std::unique_ptr<GenerationJob>>(started)),
                              &metrics_, std::move(dialect))};
}

// /v1/embeddings, /tokenize, /detokenize on the model the body names (utility_routes.h), the
// response holding the model's lease; /version needs none.
Handled HttpServer::HandleUtility(const HttpRequest& req) {
  if (req.path == "/version") return {JsonResponse(200, {{"version", kEmberVersion}}), nullptr};
  std::string requested;
  if (library_ != nullptr) {  // the body names the model (a single model's name is checked later)
    Result<RequestJson> body = ParseOrderedJsonBounded(req.body, kMaxBodyDepth);
    if (!body.ok()) {
      return {ErrorResponse(InvalidRequest(
                  "the request body is not valid JSON (UTF-8): " + body.message(), "",
                  "invalid_json")),
              nullptr};
    }
    requested = RequestedModel(*body);
  }
  auto resolved = ResolveModel(requested);
  if (auto* error = std::get_if<ApiError>(&resolved)) return {ErrorResponse(*error), nullptr};
  ModelLibrary::Lease model = std::move(std::get<ModelLibrary::Lease>(resolved));
  Handled handled = HandleUtilityRoute(*model, req, shutting_down_.load());
  if (handled.async != nullptr)
    handled.async = std::make_unique<LeasedResponse>(std::move(model), std::move(handled.async));
  return handled;
}

std::variant<ModelLibrary::Lease, ApiError> HttpServer::ResolveModel(const std::string& requested) {
  if (model_ != nullptr)  // the single model: request_builder checks the name
    return ModelLibrary::Lease(model_, [](const ServedModel*) {});
  if (requested.empty()) {
    return InvalidRequest("model: required (this server serves a library of models; GET "
                          "/v1/models lists them)",
                          "model", "model_required");
  }
  auto acquired = library_->Acquire(requested);
  if (auto* lease = std::get_if<ModelLibrary::Lease>(&acquired)) return std::move(*lease);
  const LibraryError& e = std::get<LibraryError>(acquired);
  const char* code = e.http_status == 404   ? "model_not_found"
                     : e.http_status == 503 ? "model_memory_busy"
                     : e.http_status == 400 ? "model_unavailable"
                                            : "model_load_failed";
  return ApiError{e.http_status, e.message,
                  e.http_status >= 500 ? "server_error" : "invalid_request_error", "model", code};
}

EngineStats HttpServer::TotalEngineStats() const {
  if (model_ != nullptr) return model_->engine->Stats();
  EngineStats total;
  for (const ModelLibrary::Lease& m : library_->Resident()) AddEngineStats(m->engine->Stats(), &total);
  return total;
}

// The sizes and limits of one served model, for /stats.
static json EngineSizes(const ServedModel& m) {
  return {{"model", m.name},
          {"context_length", m.context_length},
          {"kv_capacity_tokens", m.engine->kv_capacity_tokens()},
          {"kv_cache_bytes", m.engine->kv_cache_bytes()},
          {"kv_cache_dtype", m.engine->model().KvDTypes()},
          {"max_batch", m.engine->max_running()},
          {"max_step_tokens", m.engine->max_step_tokens()}};
}

HttpResponse HttpServer::Stats() const {
  json stats = metrics_.Json(TotalEngineStats());
  if (model_ != nullptr) {
    stats.update(EngineSizes(*model_));
    if (AdapterRegistry* adapters = model_->engine->adapters()) {
      const EngineStats s = model_->engine->Stats();
      json names = json::array();
      for (const auto& info : adapters->List()) names.push_back(info->name);
      stats["lora"] = {{"adapters", std::move(names)},
                       {"max_loras", model_->engine->max_loras()},
                       {"loads", s.lora_loads},
                       {"evictions", s.lora_evictions},
                       {"waiting", s.lora_waiting}};
    }
  } else {
    stats["library"] = library_->Stats();
    json models = json::array();
    for (const ModelLibrary::Lease& m : library_->Resident()) {
      json entry = EngineSizes(*m);
      const EngineStats s = m->engine->Stats();
      entry["num_running"] = s.num_running;
      entry["num_queued"] = s.num_queued;
      models.push_back(std::move(entry));
    }
    stats["models"] = std::move(models);
  }
  stats["http"]["open_connections"] = transport_->num_connections();
  return JsonResponse(200, stats);
}

// A library model's /v1/models entry: the served model's when it is resident, else what the scan
// read from its files; `library` carries the scan's details and its state either way.
json HttpServer::LibraryModelJson(const json& entry) const {
  const std::string id = entry.value("id", "");
  if (ModelLibrary::Lease m = library_->FindResident(id)) {
    json out = ModelJson(*m);
    out["library"] = entry;
    return out;
  }
  const bool loadable = entry.value("state", "") != "unavailable";
  const bool chat = loadable && entry.value("chat_template", false);
  const std::string reasoning = entry.value("reasoning_format", "none");
  json capabilities = {{"completions", loadable},
                       {"chat_completions", chat},
                       {"tools", chat && entry.value("tools", false)},
                       {"tool_call_format", entry.value("tool_call_format", "none")},
                       {"reasoning_content", chat && reasoning != "none"},
                       {"reasoning_format", reasoning},
                       {"embeddings", loadable && entry.value("embeddings", false)}};
  return {{"id", id},
          {"object", "model"},
          {"created", started_unix_},
          {"owned_by", "ember"},
          {"ember_version", kEmberVersion},
          {"context_length", entry.value("context_length", json())},
          {"capabilities", capabilities},
          {"library", entry}};
}

// POST /v1/adapters {"name", "path"} loads a LoRA adapter of the single model; DELETE
// /v1/adapters/NAME unloads it (requests already submitted finish with it); GET lists them.
HttpResponse HttpServer::AdapterAdmin(const HttpRequest& req) {
  AdapterRegistry* adapters = model_ != nullptr ? model_->engine->adapters() : nullptr;
  if (adapters == nullptr)
    return ErrorResponse(ApiError{400,
                                  "LoRA adapters are off (start the server with one model and "
                                  "--lora NAME=DIR or --max-loras N)",
                                  "invalid_request_error", "", "lora_disabled"});
  if (req.method == "GET" && req.path == "/v1/adapters") {
    json data = json::array();
    for (const auto& info : adapters->List()) data.push_back(AdapterJson(*model_, *info));
    return JsonResponse(200, {{"object", "list"}, {"data", std::move(data)}});
  }
  if (req.method == "DELETE" && req.path.size() > std::string("/v1/adapters/").size()) {
    const std::string name = req.path.substr(std::string("/v1/adapters/").size());
    if (Status st = adapters->Unregister(name); !st.ok())
      return ErrorResponse(
          ApiError{404, st.message(), "invalid_request_error", "name", "adapter_not_found"});
    return JsonResponse(200, {{"id", name}, {"object", "model"}, {"deleted", true}});
  }
  if (req.method == "POST" && req.path == "/v1/adapters") {
    Result<RequestJson> body = ParseOrderedJsonBounded(req.body, kMaxBodyDepth);
    if (!body.ok() || !body->is_object())
      return ErrorResponse(InvalidRequest("the body must be a JSON object {name, path}", "",
                                          "invalid_json"));
    if (auto e = CheckFields(*body, {"name", "path"})) return ErrorResponse(*e);
    std::optional<std::string> name, path;
    if (auto e = ReadString(*body, "name", &name)) return ErrorResponse(*e);
    if (auto e = ReadString(*body, "path", &path)) return ErrorResponse(*e);
    if (!name || name->empty()) return ErrorResponse(InvalidRequest("name: required", "name"));
    if (!path || path->empty()) return ErrorResponse(InvalidRequest("path: required", "path"));
    auto info = adapters->Register(*name, *path);
    if (!info.ok()) return ErrorResponse(InvalidRequest(info.message(), "path", "adapter_invalid"));
    return JsonResponse(200, AdapterJson(*model_, **info));
  }
  return ErrorResponse(ApiError{405,
                                "Method " + LoggablePath(req.method) + " is not allowed on " +
                                    LoggablePath(req.path) +
                                    " (GET or POST /v1/adapters, DELETE /v1/adapters/NAME)",
                                "invalid_request_error", "", "method_not_allowed"});
}

// An adapter as /v1/models lists it (vLLM's LoRA cards: root is its folder, parent the base).
json HttpServer::AdapterJson(const ServedModel& model, const AdapterInfo& info) const {
  return {{"id", info.name},           {"object", "model"},
          {"created", started_unix_},  {"owned_by", "ember"},
          {"root", info.dir},          {"parent", model.name},
          {"lora", {{"rank", info.rank}, {"scale", info.scale},
                    {"target_modules", info.target_modules}}}};
}

HttpResponse HttpServer::ModelsList(const HttpRequest& req) {
  json data = json::array();
  if (model_ != nullptr) {
    data.push_back(ModelJson(*model_));
    if (AdapterRegistry* adapters = model_->engine->adapters()) {
      for (const auto& info : adapters->List()) data.push_back(AdapterJson(*model_, *info));
    }
  } else {
    const std::string& target = req.target;
    if (target.find("refresh=1") != std::string::npos ||
        target.find("refresh=true") != std::string::npos) {
      if (Status rescanned = library_->Rescan(); !rescanned.ok())
        return ErrorResponse(ApiError{500, rescanned.message(), "server_error", "", "rescan_failed"});
    }
    for (const json& entry : library_->List()) data.push_back(LibraryModelJson(entry));
  }
  return JsonResponse(200, {{"object", "list"}, {"data", std::move(data)}});
}

HttpResponse HttpServer::ModelDetails(const std::string& id) const {
  if (model_ != nullptr && id == model_->name) return JsonResponse(200, ModelJson(*model_));
  if (model_ != nullptr && model_->engine->adapters() != nullptr) {
    if (auto info = model_->engine->adapters()->Find(id))
      return JsonResponse(200, AdapterJson(*model_, *info));
  }
  if (library_ != nullptr) {
    for (const json& entry : library_->List())
      if (entry.value("id", "") == id) return JsonResponse(200, LibraryModelJson(entry));
  }
  return ErrorResponse(ApiError{404, "The model '" + id + "' does not exist",
                                "invalid_request_error", "model", "model_not_found"});
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
  const bool utility = IsUtilityRoute(path);  // /v1/embeddings, /tokenize, /detokenize, /version
  if (!generation && !utility && !IsAdapterPath(path) && !IsReadRoute(path))
    return {ErrorResponse(ApiError{404, "Unknown path " + LoggablePath(path),
                                   "invalid_request_error", "", "not_found"}),
            nullptr};
  if (req.method == "OPTIONS") return {Preflight(req), nullptr};
  if (IsAdapterPath(path)) {
    if (auto denied = Unauthorized(req)) return {std::move(*denied), nullptr};
    return {AdapterAdmin(req), nullptr};
  }
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (generation || IsUtilityPostRoute(path) ? req.method != "POST" : !get) {
    return {ErrorResponse(ApiError{405, "Method " + LoggablePath(req.method) +
                                            " is not allowed on " + LoggablePath(path),
                                   "invalid_request_error", "", "method_not_allowed"}),
            nullptr};
  }
  if (utility) {
    if (auto denied = Unauthorized(req)) return {std::move(*denied), nullptr};
    return HandleUtility(req);
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
    res.body = metrics_.Prometheus(TotalEngineStats());
    return {std::move(res), nullptr};
  }
  if (path == "/stats") return {Stats(), nullptr};
  if (IsWebUiPath(path)) return {WebUiResponse(req), nullptr};  // the page needs no key
  if (auto denied = Unauthorized(req)) return {std::move(*denied), nullptr};
  if (path == "/v1/models") return {ModelsList(req), nullptr};
  return {ModelDetails(path.substr(std::string("/v1/models/").size())), nullptr};
}

}  // namespace ember::serve
