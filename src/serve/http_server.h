// HttpServer: the OpenAI-compatible HTTP front end — routing (/v1/chat/completions,
// /v1/completions, /v1/models, /health, /metrics, /stats), bearer-key auth (constant-time
// compare), the Host/Origin rules (DNS rebinding and cross-site requests are refused; CORS only
// with --cors-origin), OpenAI-shaped error bodies (404/405/413/...), one access-log line per
// request, and the shutdown switch (new work answers 503). Connections, deadlines, limits and
// backpressure are HttpTransport's (http_transport.h); a generation is an AsyncResponse that its
// connection polls when the engine pushes events, so no thread waits on a client.
// Bind, then Serve, from one thread; BeginShutdown/Stop from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/http_transport.h"
#include "serve/metrics.h"
#include "serve/model_library.h"
#include "serve/request_builder.h"
#include "util/status.h"

namespace ember::serve {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (see Bind)
  std::string api_key;                   // empty: no auth
  size_t max_body_bytes = size_t{16} << 20;
  int num_threads = 2;                   // I/O threads (every connection shares them)
  int max_connections = 4096;            // more are answered 503 and closed
  double header_timeout_s = 10;
  double body_timeout_s = 30;
  double keep_alive_timeout_s = 10;
  size_t stream_buffer_bytes = size_t{1} << 20;  // a response's unsent bytes before it pauses
  double stall_timeout_s = 30;           // a client that reads nothing this long is cut off
  // Host header names accepted besides the bound address (and localhost names when it is a
  // loopback address; any IP literal when it is a wildcard). "*": any.
  std::vector<std::string> allowed_hosts;
  std::string cors_origin;               // empty: cross-origin requests refused; "*": any
};

class HttpServer {
 public:
  explicit HttpServer(HttpConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; returns the port bound. Cheap: call it before loading the model, so a
  // port in use fails at once.
  Result<int> Bind();
  // Serves `model` (borrowed; it outlives Serve) until Stop(). Returns when every connection has
  // closed.
  void Serve(const ServedModel& model);
  // The same over a model library (--models-dir): requests name their model, which is loaded on
  // demand; /v1/models lists the library.
  void ServeLibrary(ModelLibrary* library);
  // Refuse new generation requests with 503 (in-flight ones continue).
  void BeginShutdown() { shutting_down_.store(true); }
  // Stops accepting and ends Serve() (responses in flight get a few seconds to finish).
  void Stop();

  Metrics& metrics() { return metrics_; }
  // The /v1/models entry for a served model (also used by tests).
  nlohmann::json ModelJson(const ServedModel& model) const;

 private:
  Handled Handle(const HttpRequest& req);
  Handled Route(const HttpRequest& req);
  std::optional<HttpResponse> CheckHeader(const HttpRequest& head) const;
  bool HostAllowed(const std::string& host_header) const;
  void AddCorsHeaders(const HttpRequest& req, HttpResponse* res) const;
  HttpResponse Preflight(const HttpRequest& req) const;
  std::optional<HttpResponse> Unauthorized(const HttpRequest& req) const;
  HttpResponse Stats() const;
  void OnFinished(const HttpRequest& req, int status, double seconds, const std::string& note);
  Handled HandleGeneration(const HttpRequest& req, Endpoint endpoint);
  Handled HandleUtility(const HttpRequest& req);
  // The model a request names (`requested`, the body's `model`; empty when absent): the served
  // model, or a library model loaded if need be (blocks for the load: worker threads only).
  std::variant<ModelLibrary::Lease, ApiError> ResolveModel(const std::string& requested);
  HttpResponse ModelsList(const HttpRequest& req);
  HttpResponse AdapterAdmin(const HttpRequest& req);
  nlohmann::json AdapterJson(const ServedModel& model, const AdapterInfo& info) const;
  HttpResponse ModelDetails(const std::string& id) const;
  nlohmann::json LibraryModelJson(const nlohmann::json& entry) const;
  EngineStats TotalEngineStats() const;

  HttpConfig config_;
  const ServedModel* model_ = nullptr;  // the single served model, or null with a library
  ModelLibrary* library_ = nullptr;
  Metrics metrics_;
  std::unique_ptr<HttpTransport> transport_;
  std::atomic<bool> shutting_down_{false};
  int64_t started_unix_ = 0;
};

}  // namespace ember::serve
