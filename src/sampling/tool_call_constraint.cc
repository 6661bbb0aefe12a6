#include "sampling/tool_call_constraint.h"

#include <algorithm>

#include "util/check.h"

namespace ember {

ToolCallMachine::ToolCallMachine(const ToolCallPattern* pattern)
    : pattern_(pattern), hi_(static_cast<uint32_t>(pattern->calls.size())) {}

void ToolCallMachine::AppendKey(std::string* key) const {
  const uint32_t words[] = {static_cast<uint32_t>(phase_), pos_, lo_, hi_,
                            static_cast<uint32_t>(schema_)};
  key->append(reinterpret_cast<const char*>(words), sizeof(words));
  if (phase_ != kArguments) return;
  if (schema_) {
    schema_arguments_.AppendKey(key);
  } else {
    arguments_.AppendKey(key);
  }
}

bool ToolCallMachine::Step(uint8_t c) {
  switch (phase_) {
    case kHead: {
      // The heads in [lo_, hi_) share their first pos_ bytes and are sorted, so their bytes at
      // pos_ ascend: the ones with c there are a sub-range.
      const std::vector<ToolCallPattern::Call>& calls = pattern_->calls;
      const auto first = calls.begin() + lo_, last = calls.begin() + hi_;
      const uint32_t pos = pos_;
      auto byte_at = [pos](const ToolCallPattern::Call& call) {
        return static_cast<uint8_t>(call.head[pos]);
      };
      const auto lo =
          std::partition_point(first, last, [&](const auto& h) { return byte_at(h) < c; });
      const auto hi =
          std::partition_point(lo, last, [&](const auto& h) { return byte_at(h) == c; });
      if (lo == hi) return false;
      lo_ = static_cast<uint32_t>(lo - calls.begin());
      hi_ = static_cast<uint32_t>(hi - calls.begin());
      // Prefix-free: a head that ends here is the only one left.
      if (++pos_ == calls[lo_].head.size()) {
        phase_ = kArguments;
        pos_ = 0;
        schema_ = calls[lo_].arguments != nullptr;
        if (schema_) schema_arguments_ = JsonSchemaMachine(calls[lo_].arguments.get());
      }
      return true;
    }
    case kArguments: {
      const bool took = schema_ ? schema_arguments_.Step(c) : arguments_.Step(c);
      if (!took) return false;
      if (schema_ ? schema_arguments_.Done() : arguments_.Done())
        phase_ = pattern_->tail.empty() ? kDone : kTail;
      return true;
    }
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
  CHECK(!pattern.calls.empty());
  std::sort(pattern.calls.begin(), pattern.calls.end(),
            [](const auto& a, const auto& b) { return a.head < b.head; });
  for (size_t i = 0; i < pattern.calls.size(); ++i) {
    CHECK(!pattern.calls[i].head.empty());
    // Sorted: a head that is a prefix of another sorts right before one that it prefixes.
    if (i > 0) CHECK(!pattern.calls[i].head.starts_with(pattern.calls[i - 1].head));
  }
  auto owned = std::make_shared<const ToolCallPattern>(std::move(pattern));
  return std::make_shared<ByteMachineConstraint<ToolCallMachine>>(
      std::move(texts), ToolCallMachine(owned.get()), owned);
}

}  // namespace ember
