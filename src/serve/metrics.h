// Metrics: the server's counters and latency histograms, rendered as Prometheus text (/metrics)
// and as JSON (/stats) together with a snapshot of the engine's EngineStats (queue depth, running
// sequences, KV usage, prefix-cache hit rate). TTFT and inter-token latency come from the
// TokenEvent time_ns stamps. Thread-safe: every method may be called from any HTTP thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_config.h"  // EngineStats

namespace ember::serve {

// A cumulative histogram over fixed upper bounds (seconds), Prometheus style. Thread-compatible.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  // Value below which `q` (0..1) of the observations fall, interpolated within a bucket.
  double Quantile(double q) const;
  void AppendPrometheus(const std::string& name, const std::string& help, std::string* out) const;
  nlohmann::json ToJson() const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds_.size() + 1], the last is +Inf
  int64_t count_ = 0;
  double sum_ = 0.0;
};

class Metrics {
 public:
  Metrics();
  // One finished HTTP request on `route` with its status code.
  void CountRequest(const std::string& route, int status);
  void CountTokens(int64_t prompt_tokens, int64_t completion_tokens);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveRequestLatency(double seconds);
  void StreamOpened();
  void StreamClosed();
  void CountDisconnect();
  // A connection event from the HTTP transport: "disconnect" (as CountDisconnect), "stalled" (a
  // client that stopped reading was cut off), "rejected" (over --max-connections), "timeout" (a
  // request header/body missed its deadline). Unknown names are ignored.
  void CountConnectionEvent(const std::string& event);

  std::string Prometheus(const EngineStats& engine) const;
  nlohmann::json Json(const EngineStats& engine) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (route, status) -> count
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  int64_t open_streams_ = 0, disconnects_ = 0;
  int64_t stalled_clients_ = 0, rejected_connections_ = 0, request_timeouts_ = 0;
  Histogram ttft_, itl_, e2e_;
};

}  // namespace ember::serve
