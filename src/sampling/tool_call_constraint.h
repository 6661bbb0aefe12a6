// Forced tool calls (`tool_choice` "required" or a named function): the sample's text must be
// exactly one call in the model's own tool-call syntax. The serve layer spells that syntax as a
// ToolCallPattern: one of its calls' heads (the call's opening up to its arguments, one per
// function the call may name), then one JSON object (the arguments: valid against that function's compiled
// parameters schema when it has one, else any object, as JSON mode scans them), then `tail`.
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
#include "sampling/json_schema.h"
#include "sampling/token_constraint.h"

namespace ember {

struct ToolCallPattern {
  struct Call {
    std::string head;                                     // non-empty
    std::shared_ptr<const CompiledJsonSchema> arguments;  // null: any JSON object
  };
  std::vector<Call> calls;  // heads distinct and prefix-free; sorted by head when built
  std::string tail;
};

class ToolCallMachine {
 public:
  ToolCallMachine() = default;
  explicit ToolCallMachine(const ToolCallPattern* pattern);  // borrowed: outlives the machine

  bool Step(uint8_t c);
  bool Done() const { return phase_ == kDone; }
  void AppendKey(std::string* key) const;  // the state's bytes (json_constraint.h)
  bool InPlainString() const {
    return phase_ == kArguments &&
           (schema_ ? schema_arguments_.InPlainString() : arguments_.InPlainString());
  }
  bool InBoundedString(uint32_t* room) const {
    return phase_ == kArguments && schema_ && schema_arguments_.InBoundedString(room);
  }
  const RegexDfa* StringDfa(int32_t* state) const {
    return phase_ == kArguments && schema_ ? schema_arguments_.StringDfa(state) : nullptr;
  }

 private:
  enum Phase : uint8_t { kHead, kArguments, kTail, kDone };
  const ToolCallPattern* pattern_ = nullptr;
  JsonScanner arguments_;               // a call without a schema
  JsonSchemaMachine schema_arguments_;  // a call with one
  bool schema_ = false;
  uint32_t pos_ = 0;          // bytes matched of the head or the tail
  uint32_t lo_ = 0, hi_ = 0;  // kHead: the heads that match so far, [lo_, hi_) in sorted order
  Phase phase_ = kHead;
};

// Checks and sorts `pattern`'s calls by head (CHECK: non-empty, prefix-free heads).
std::shared_ptr<TokenConstraint> MakeToolCallConstraint(std::shared_ptr<const TokenTexts> texts,
                                                        ToolCallPattern pattern);

}  // namespace ember
