// ResponseStream: the thread-safe channel between the engine thread (producer) and one caller
// (consumer) for one request. The engine pushes TokenEvents and finally closes the stream; the
// caller pops them and may Cancel() at any time (the engine frees the request's KV blocks before
// its next step). An event-driven consumer registers SetNotify instead of blocking in Next. Any
// thread may call any method.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/request.h"

namespace ember {

class ResponseStream {
 public:
  explicit ResponseStream(int32_t num_samples) : num_samples_(num_samples) {}

  // Consumer: waits until events are available, the stream closed, or the timeout passed.
  // Appends the pending events to *out. Returns false once the stream is closed and drained.
  bool Next(std::vector<TokenEvent>* out,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Consumer: asks the engine to stop this request. Idempotent.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // Consumer: `notify` runs whenever a Next call would return something new: after every Push
  // and on Close (on the engine thread), at once here when events are already pending or the
  // stream closed, and in Next when it hands over a closed stream's last events (the end is then
  // still to be seen). Never with the stream's lock held; it must be cheap (post work to the
  // consumer's own thread). An empty function removes the hook.
  void SetNotify(std::function<void()> notify);

  // Valid after the stream closed.
  RequestUsage usage() const;
  int32_t num_samples() const { return num_samples_; }

  // Producer side (engine thread only).
  void Push(TokenEvent event);
  void SetUsage(const RequestUsage& usage);
  void Close();

 private:
  const int32_t num_samples_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenEvent> pending_;
  RequestUsage usage_;
  bool closed_ = false;
  std::shared_ptr<const std::function<void()>> notify_;  // copied under mu_, called outside it
  std::atomic<bool> cancelled_{false};
};

}  // namespace ember
