#include "serve/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace ember::serve {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings)
    : stop_strings_(std::move(stop_strings)) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
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
  // Earliest match over all stop strings. Only the held suffix (shorter than the longest stop
  // string) plus the new piece can contain a match not seen before, and pending_ is exactly that.
  size_t first = std::string::npos;
  for (const std::string& s : stop_strings_) {
    const size_t at = pending_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
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
  size_t held = 0;
  for (const std::string& s : stop_strings_) held = std::max(held, PartialTagLength(pending_, s));
  return held;
}

size_t PartialTagLength(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.empty() ? 0 : tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace ember::serve
