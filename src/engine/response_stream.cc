#include "engine/response_stream.h"

namespace ember {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

bool ResponseStream::Next(std::vector<TokenEvent>* out,
                          std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [this] { return !pending_.empty() || closed_; };
  if (timeout) {
    cv_.wait_for(lock, *timeout, ready);
  } else {
    cv_.wait(lock, ready);
  }
  bool had_events = !pending_.empty();
  for (TokenEvent& e : pending_) out->push_back(std::move(e));
  pending_.clear();
  // The last events of a closed stream went out with `true`: the end itself is still news for
  // the next call, so an event-driven consumer is woken for it (Close's notify came earlier).
  std::shared_ptr<const std::function<void()>> notify = had_events && closed_ ? notify_ : nullptr;
  lock.unlock();
  if (notify) (*notify)();
  return had_events || !closed_;
}

void ResponseStream::SetNotify(std::function<void()> notify) {
  std::shared_ptr<const std::function<void()>> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify_ = notify ? std::make_shared<const std::function<void()>>(std::move(notify)) : nullptr;
    if (!pending_.empty() || closed_) now = notify_;
  }
  if (now) (*now)();
}

void ResponseStream::Cancel() { cancelled_.store(true, std::memory_order_relaxed); }

RequestUsage ResponseStream::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_;
}

void ResponseStream::Push(TokenEvent event) {
  std::shared_ptr<const std::function<void()>> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(event));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) (*notify)();
}

void ResponseStream::SetUsage(const RequestUsage& usage) {
  std::lock_guard<std::mutex> lock(mu_);
  usage_ = usage;
}

void ResponseStream::Close() {
  std::shared_ptr<const std::function<void()>> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) (*notify)();
}

}  // namespace ember
