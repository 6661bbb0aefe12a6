#include "serve/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace ember::serve {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings)
    : stop_strings_(std::move(stop_strings)) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stop_strings_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

TextDelta StopStringMatcher::Push(std::string_view piece) {
  TextDelta delta;
  if (stopped_) {
    delta.stopped = true;
    return delta;
  }
  if (stop_strings_.empty()) {
    delta.text.assign(piece);
    return delta;
  }
  pending_.append(piece);
  // Earliest match over all stop strings. Only the held suffix (< max_stop_len_ bytes) plus the
  // new piece can contain a match that was not seen before, and pending_ is exactly that.
  size_t first = std::string::npos;
  for (const std::string& s : stop_strings_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    delta.text = pending_.substr(0, first);
    delta.stopped = true;
    stopped_ = true;
    pending_.clear();
    return delta;
  }
  const size_t held = HeldSuffixLength();
  delta.text = pending_.substr(0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return delta;
}

std::string StopStringMatcher::Finish() {
  std::string rest;
  if (!stopped_) rest.swap(pending_);
  pending_.clear();
  return rest;
}

size_t StopStringMatcher::HeldSuffixLength() const {
  const size_t limit = std::min(pending_.size(), max_stop_len_ - 1);
  for (size_t len = limit; len > 0; --len) {
    std::string_view suffix(pending_.data() + pending_.size() - len, len);
    for (const std::string& s : stop_strings_) {
      if (s.size() > len && std::string_view(s).substr(0, len) == suffix) return len;
    }
  }
  return 0;
}

}  // namespace ember::serve
