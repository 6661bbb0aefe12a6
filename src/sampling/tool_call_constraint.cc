#include "sampling/tool_call_constraint.h"

#include <algorithm>

#include "util/check.h"

namespace ember {

ToolCallMachine::ToolCallMachine(const ToolCallPattern* pattern)
    : pattern_(pattern), hi_(static_cast<uint32_t>(pattern->heads.size())) {}

bool ToolCallMachine::Step(uint8_t c) {
  switch (phase_) {
    case kHead: {
      // The heads in [lo_, hi_) share their first pos_ bytes and are sorted, so their bytes at
      // pos_ ascend: the ones with c there are a sub-range.
      const std::vector<std::string>& heads = pattern_->heads;
      const auto first = heads.begin() + lo_, last = heads.begin() + hi_;
      const uint32_t pos = pos_;
      auto byte_at = [pos](const std::string& h) { return static_cast<uint8_t>(h[pos]); };
      const auto lo = std::partition_point(first, last, [&](const std::string& h) { return byte_at(h) < c; });
      const auto hi = std::partition_point(lo, last, [&](const std::string& h) { return byte_at(h) == c; });
      if (lo == hi) return false;
      lo_ = static_cast<uint32_t>(lo - heads.begin());
      hi_ = static_cast<uint32_t>(hi - heads.begin());
      // Prefix-free: a head that ends here is the only one left.
      if (++pos_ == heads[lo_].size()) {
        phase_ = kArguments;
        pos_ = 0;
      }
      return true;
    }
    case kArguments:
      if (!arguments_.Step(c)) return false;
      if (arguments_.Done()) phase_ = pattern_->tail.empty() ? kDone : kTail;
      return true;
    case kTail:
      if (c != static_cast<uint8_t>(pattern_->tail[pos_])) return false;
      if (++pos_ == pattern_->tail.size()) phase_ = kDone;
      return true;
    case kDone:
      return false;
  }
  return false;
}

std::shared_ptr<TokenConstraint> MakeToolCallConstraint(std::shared_ptr<const TokenTexts> texts,
                                                        ToolCallPattern pattern) {
  CHECK(!pattern.heads.empty());
  std::sort(pattern.heads.begin(), pattern.heads.end());
  for (size_t i = 0; i < pattern.heads.size(); ++i) {
    CHECK(!pattern.heads[i].empty());
    // Sorted: a head that is a prefix of another sorts right before one that it prefixes.
    if (i > 0) CHECK(!pattern.heads[i].starts_with(pattern.heads[i - 1]));
  }
  auto owned = std::make_shared<const ToolCallPattern>(std::move(pattern));
  return std::make_shared<ByteMachineConstraint<ToolCallMachine>>(
      std::move(texts), ToolCallMachine(owned.get()), owned);
}

}  // namespace ember
