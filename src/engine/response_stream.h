// ResponseStream: the thread-safe channel between the engine thread (producer) and one caller
// (consumer) for one request. The engine pushes TokenEvents and finally closes the stream; the
// caller pops them and may Cancel() at any time (the engine frees the request's KV blocks before
// its next step). An event-driven consumer registers SetNotify instead of blocking in Next. Any
// thread may call any method: the state both sides touch is GUARDED_BY(mu_).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/request.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember {

class ResponseStream {
 public:
  explicit ResponseStream(int32_t num_samples) : num_samples_(num_samples) {}

  // Consumer: waits until events are available, the stream closed, or the timeout passed.
  // Appends the pending events to *out. Returns false once the stream is closed and drained.
  bool Next(std::vector<TokenEvent>* out,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt) EXCLUDES(mu_);
  // Consumer: asks the engine to stop this request. Idempotent.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // Consumer: `notify` runs whenever a Next call would return something new: after every Push
  // and on Close (on the engine thread), at once here when events are already pending or the
  // stream closed, and in Next when it hands over a closed stream's last events (the end is then
  // still to be seen). Never with the stream's lock held; it must be cheap (post work to the
  // consumer's own thread). An empty function removes the hook.
  void SetNotify(std::function<void()> notify) EXCLUDES(mu_);

  // Valid after the stream closed.
  RequestUsage usage() const EXCLUDES(mu_);
  int32_t num_samples() const { return num_samples_; }

  // Producer side (engine thread only).
  void Push(TokenEvent event) EXCLUDES(mu_);
  void SetUsage(const RequestUsage& usage) EXCLUDES(mu_);
  void Close() EXCLUDES(mu_);

 private:
  const int32_t num_samples_;
  // True when Next has something to hand over: events, or the end of the stream.
  bool Ready() const REQUIRES(mu_) { return !pending_.empty() || closed_; }

  mutable Mutex mu_;
  CondVar cv_;  // with mu_: wakes a consumer blocked in Next
  std::vector<TokenEvent> pending_ GUARDED_BY(mu_);
  RequestUsage usage_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  // Copied under mu_, called outside it.
  std::shared_ptr<const std::function<void()>> notify_ GUARDED_BY(mu_);
  // Not guarded: an atomic flag the engine polls (relaxed; the engine reaps before its next step).
  std::atomic<bool> cancelled_{false};
};

}  // namespace ember
