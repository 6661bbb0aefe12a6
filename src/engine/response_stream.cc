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
  MutexLock lock(&mu_);
  auto ready = [this]() REQUIRES(mu_) { return Ready(); };
  if (timeout) {
    cv_.WaitFor(&mu_, *timeout, ready);
  } else {
    cv_.Wait(&mu_, ready);
  }
  const bool had_events = !pending_.empty();
  // Read with the events it goes with: a Push and Close landing after the unlock must not make
  // this call report "closed and drained" while their events wait for the next call.
  const bool closed = closed_;
  for (TokenEvent& e : pending_) out->push_back(std::move(e));
  pending_.clear();
  // The last events of a closed stream went out with `true`: the end itself is still news for
  // the next call, so an event-driven consumer is woken for it (Close's notify came earlier).
  std::shared_ptr<const std::function<void()>> notify = had_events && closed ? notify_ : nullptr;
  lock.Unlock();
  if (notify) (*notify)();
  return had_events || !closed;
}

void ResponseStream::SetNotify(std::function<void()> notify) {
  std::shared_ptr<const std::function<void()>> now;
  {
    MutexLock lock(&mu_);
    notify_ = notify ? std::make_shared<const std::function<void()>>(std::move(notify)) : nullptr;
    if (Ready()) now = notify_;
  }
  if (now) (*now)();
}

void ResponseStream::Cancel() { cancelled_.store(true, std::memory_order_relaxed); }

RequestUsage ResponseStream::usage() const {
  MutexLock lock(&mu_);
  return usage_;
}

void ResponseStream::Push(TokenEvent event) {
  std::shared_ptr<const std::function<void()>> notify;
  {
    MutexLock lock(&mu_);
    pending_.push_back(std::move(event));
    notify = notify_;
  }
  cv_.NotifyAll();
  if (notify) (*notify)();
}

void ResponseStream::SetUsage(const RequestUsage& usage) {
  MutexLock lock(&mu_);
  usage_ = usage;
}

void ResponseStream::Close() {
  std::shared_ptr<const std::function<void()>> notify;
  {
    MutexLock lock(&mu_);
    closed_ = true;
    notify = notify_;
  }
  cv_.NotifyAll();
  if (notify) (*notify)();
}

}  // namespace ember
