// Metrics: the server's counters and latency histograms, rendered as Prometheus text (/metrics)
// and as JSON (/stats) together with a snapshot of the engine's EngineStats (queue depth, running
// sequences, KV usage, prefix-cache hit rate). TTFT and inter-token latency come from the
// TokenEvent time_ns stamps. Thread-safe: every method may be called from any HTTP thread; the
// counters and histograms are GUARDED_BY(mu_).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_config.h"  // EngineStats
#include "util/mutex.h"
#include "util/thread_annotations.h"

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
  void CountRequest(const std::string& route, int status) EXCLUDES(mu_);
  void CountTokens(int64_t prompt_tokens, int64_t completion_tokens) EXCLUDES(mu_);
  void ObserveTimeToFirstToken(double seconds) EXCLUDES(mu_);
  void ObserveInterTokenLatency(double seconds) EXCLUDES(mu_);
  void ObserveRequestLatency(double seconds) EXCLUDES(mu_);
  void StreamOpened() EXCLUDES(mu_);
  void StreamClosed() EXCLUDES(mu_);
  void CountDisconnect() EXCLUDES(mu_);
  // A connection event from the HTTP transport: "disconnect" (as CountDisconnect), "stalled" (a
  // client that stopped reading was cut off), "rejected" (over --max-connections), "timeout" (a
  // request header/body missed its deadline). Unknown names are ignored.
  void CountConnectionEvent(const std::string& event) EXCLUDES(mu_);

  std::string Prometheus(const EngineStats& engine) const EXCLUDES(mu_);
  nlohmann::json Json(const EngineStats& engine) const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  // (route, status) -> count
  std::map<std::pair<std::string, int>, int64_t> requests_ GUARDED_BY(mu_);
  int64_t prompt_tokens_ GUARDED_BY(mu_) = 0;
  int64_t completion_tokens_ GUARDED_BY(mu_) = 0;
  int64_t open_streams_ GUARDED_BY(mu_) = 0;
  int64_t disconnects_ GUARDED_BY(mu_) = 0;
  int64_t stalled_clients_ GUARDED_BY(mu_) = 0;
  int64_t rejected_connections_ GUARDED_BY(mu_) = 0;
  int64_t request_timeouts_ GUARDED_BY(mu_) = 0;
  Histogram ttft_ GUARDED_BY(mu_);
  Histogram itl_ GUARDED_BY(mu_);
  Histogram e2e_ GUARDED_BY(mu_);
};

}  // namespace ember::serve
