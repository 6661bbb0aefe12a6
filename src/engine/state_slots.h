// StateSlots: which of the backend's recurrent-state slots (Model::AllocateKvCache's
// num_state_slots) are free, for a model with recurrent layers (qwen3_next). The scheduler takes
// one for a sequence when it starts (beside its first KV blocks) and gives it back wherever the
// sequence's blocks are freed (finish, cancel, preemption, a failed admission); the step builder
// names it in the sequence's SequenceSlice. A slot needs no clearing: a sequence's first rows sit
// at position 0, where the backend's recurrent ops start from the zero state (backend.h), or
// past a prefix hit whose state checkpoint is copied in first (kv/state_checkpoints.h).
// Invariant: at most `num_slots` sequences are started at once (max_running). Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

namespace ember {

class StateSlots {
 public:
  explicit StateSlots(int32_t num_slots);
  // A free slot; CHECKs that one is left.
  int32_t Acquire();
  // Gives `slot` back (-1: none, a no-op).
  void Release(int32_t slot);
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

 private:
  std::vector<int32_t> free_;  // a stack: the lowest slot on top
};

}  // namespace ember
