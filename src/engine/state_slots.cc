#include "engine/state_slots.h"

#include "util/check.h"

namespace ember {

StateSlots::StateSlots(int32_t num_slots) {
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t StateSlots::Acquire() {
  CHECK(!free_.empty()) << "no recurrent-state slot left (more started sequences than slots)";
  const int32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void StateSlots::Release(int32_t slot) {
  if (slot >= 0) free_.push_back(slot);
}

}  // namespace ember
