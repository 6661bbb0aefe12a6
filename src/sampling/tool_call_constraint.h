// Forced tool calls (`tool_choice` "required" or a named function): the sample's text must be
// exactly one call in the model's own tool-call syntax. The serve layer spells that syntax as a
// ToolCallPattern: one of `heads` (the call's opening up to its arguments, one per function the
// call may name), then one JSON object (the arguments, as JSON mode scans them), then `tail`.
// ToolCallMachine is the byte machine of that language for ByteMachineConstraint
// (json_constraint.h); MakeToolCallConstraint builds the token constraint. Heads must be
// non-empty and prefix-free (no head is a prefix of another: a JSON-escaped name closed by a
// quote guarantees it); the machine's state is a few words, copied freely.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sampling/json_constraint.h"
#include "sampling/token_constraint.h"

namespace ember {

struct ToolCallPattern {
  std::vector<std::string> heads;  // sorted, distinct, prefix-free, non-empty
  std::string tail;
};

class ToolCallMachine {
 public:
  ToolCallMachine() = default;
  explicit ToolCallMachine(const ToolCallPattern* pattern);  // borrowed: outlives the machine

  bool Step(uint8_t c);
  bool Done() const { return phase_ == kDone; }
  bool InPlainString() const { return phase_ == kArguments && arguments_.InPlainString(); }

 private:
  enum Phase : uint8_t { kHead, kArguments, kTail, kDone };
  const ToolCallPattern* pattern_ = nullptr;
  JsonScanner arguments_;
  uint32_t pos_ = 0;          // bytes matched of the head or the tail
  uint32_t lo_ = 0, hi_ = 0;  // kHead: the heads that match so far, [lo_, hi_) in sorted order
  Phase phase_ = kHead;
};

// Checks and sorts `pattern`'s heads (CHECK: non-empty, prefix-free).
std::shared_ptr<TokenConstraint> MakeToolCallConstraint(std::shared_ptr<const TokenTexts> texts,
                                                        ToolCallPattern pattern);

}  // namespace ember
