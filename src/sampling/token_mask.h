// TokenMask: a token constraint's mask for one sampled row, built before the step's launch (on a
// helper thread: a mask depends only on the tokens already accepted) in the form its consumer
// reads: 0/1 bytes for the host sampler (Sample()'s `allowed`), or packed bits for a backend that
// makes the row's token (Backend::ApplyTokenMasks; PackAllowedBits' layout, token_constraint.h)
// together with the masked ids when there are few (the kMask edit form, sampling/logit_edits.h).
// Either form is the constraint's set; Allows() reads both. Not thread-safe (one builder).
#pragma once

#include <cstdint>
#include <vector>

#include "sampling/token_constraint.h"

namespace ember {

struct TokenMask {
  enum class Form : uint8_t {
    kBytes,  // `allowed`: the host samples the row
    kBits,   // `bits`, and `masked` when short: the backend makes the row's token
  };
  Form form = Form::kBytes;
  int32_t vocab_size = 0;
  int64_t num_allowed = 0;
  std::vector<uint8_t> allowed;  // kBytes: [vocab_size], 1 = allowed
  std::vector<uint32_t> bits;    // kBits: [ceil(vocab_size / 32)], bit id % 32 of word id / 32
  std::vector<int32_t> masked;   // kBits: the ids not allowed, ascending, when listed

  // The constraint's next-token set in `form`. kBits lists the masked ids when there are at most
  // max_listed of them (from the bits' zero words: no pass over a byte per token otherwise).
  void Build(const TokenConstraint& constraint, Form form, int64_t max_listed = 0);
  // kBits: every masked id is in `masked`.
  bool masked_listed() const {
    return form == Form::kBits && static_cast<int64_t>(masked.size()) == vocab_size - num_allowed;
  }
  bool Allows(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return form == Form::kBytes ? allowed[i] != 0 : ((bits[i / 32] >> (i % 32)) & 1u) != 0;
  }
};

}  // namespace ember
