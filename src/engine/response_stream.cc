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
  return had_events || !closed_;
}

void ResponseStream::Cancel() { cancelled_.store(true, std::memory_order_relaxed); }

RequestUsage ResponseStream::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_;
}

void ResponseStream::Push(TokenEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void ResponseStream::SetUsage(const RequestUsage& usage) {
  std::lock_guard<std::mutex> lock(mu_);
  usage_ = usage;
}

void ResponseStream::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace ember
