// HttpServer: the OpenAI-compatible HTTP front end over cpp-httplib — routing (/v1/chat/
// completions, /v1/completions, /v1/models, /health, /metrics, /stats), bearer-key auth
// (constant-time compare), the request-body limit (413), 404/405 with OpenAI-shaped error bodies,
// client-disconnect cancellation, and the shutdown switch (new work answers 503).
// One worker thread per connection from a fixed pool (hundreds of concurrent streams need
// hundreds of threads). Bind/Serve from one thread; BeginShutdown/Stop from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/metrics.h"
#include "serve/request_builder.h"
#include "util/status.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace ember::serve {

struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (see Bind)
  std::string api_key;                   // empty: no auth
  size_t max_body_bytes = size_t{16} << 20;
  int num_threads = 512;                 // concurrent connections served at once
  int keep_alive_seconds = 10;
};

class HttpServer {
 public:
  HttpServer(HttpConfig config, ServedModel model);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port bound.
  Result<int> Bind();
  // Serves until Stop(). Returns when every connection's worker has finished.
  void Serve();
  // Refuse new generation requests with 503 (in-flight ones continue).
  void BeginShutdown() { shutting_down_.store(true); }
  // Stops accepting and ends Serve().
  void Stop();

  Metrics& metrics() { return metrics_; }
  // The /v1/models entry for the served model (also used by tests).
  nlohmann::json ModelJson() const;

 private:
  void Route();
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;
  void HandleGeneration(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);

  HttpConfig config_;
  ServedModel model_;
  Metrics metrics_;
  std::unique_ptr<httplib::Server> server_;
  std::atomic<bool> shutting_down_{false};
  int64_t started_unix_ = 0;
};

}  // namespace ember::serve
