#include "kv/state_checkpoints.h"

#include <sstream>

#include "util/check.h"

namespace ember::kv {

StateCheckpoints::StateCheckpoints(int32_t first_slot, int32_t num_slots,
                                   int64_t bytes_per_checkpoint, const PrefixCache* cache,
                                   int32_t num_blocks)
    : first_slot_(first_slot),
      bytes_per_checkpoint_(bytes_per_checkpoint),
      cache_(cache),
      slots_(static_cast<size_t>(num_slots)),
      by_block_(static_cast<size_t>(num_blocks), -1) {
  CHECK_GE(first_slot, 0);
  CHECK_GE(num_slots, 0);
  CHECK(cache != nullptr);
}

size_t StateCheckpoints::Index(int32_t slot) const {
  CHECK(slot >= first_slot_ && slot - first_slot_ < num_slots())
      << "state slot " << slot << " is not a checkpoint slot";
  return static_cast<size_t>(slot - first_slot_);
}

bool StateCheckpoints::IsLive(const Slot& s) const {
  return s.state == SlotState::kCommitted && cache_->is_cached(s.ref.block_id) &&
         cache_->Ref(s.ref.block_id) == s.ref;
}

int32_t StateCheckpoints::Find(BlockRef ref) const {
  if (ref.block_id < 0 || ref.block_id >= static_cast<int32_t>(by_block_.size())) return -1;
  const int32_t i = by_block_[static_cast<size_t>(ref.block_id)];
  if (i < 0) return -1;
  const Slot& s = slots_[static_cast<size_t>(i)];
  return s.ref == ref && IsLive(s) ? first_slot_ + i : -1;
}

void StateCheckpoints::Touch(int32_t slot) {
  slots_[Index(slot)].last_use = ++tick_;
}

void StateCheckpoints::Unlink(size_t i) {
  Slot& s = slots_[i];
  if (s.state == SlotState::kCommitted) {
    int32_t& b = by_block_[static_cast<size_t>(s.ref.block_id)];
    if (b == static_cast<int32_t>(i)) b = -1;
  }
  s.state = SlotState::kPending;
  s.ref = BlockRef();
}

int32_t StateCheckpoints::Reserve() {
  size_t best = slots_.size();
  int rank_best = 3;  // 0 free, 1 stale, 2 live (then the least recently used)
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == SlotState::kPending) continue;
    const int rank = s.state == SlotState::kFree ? 0 : IsLive(s) ? 2 : 1;
    if (rank < rank_best || (rank == rank_best && rank == 2 && s.last_use < slots_[best].last_use)) {
      best = i;
      rank_best = rank;
    }
    if (rank == 0) break;
  }
  if (best == slots_.size()) return -1;
  if (rank_best == 2) ++num_evicted_;
  Unlink(best);
  slots_[best].last_use = ++tick_;
  return first_slot_ + static_cast<int32_t>(best);
}

void StateCheckpoints::Commit(int32_t slot, BlockRef ref) {
  const size_t i = Index(slot);
  CHECK(slots_[i].state == SlotState::kPending) << "Commit of a state slot not reserved: " << slot;
  CHECK(cache_->is_cached(ref.block_id) && cache_->Ref(ref.block_id) == ref)
      << "Commit: block " << ref.block_id << " is not cached under that epoch";
  if (Find(ref) >= 0) {  // another sequence checkpointed the same prefix first
    Release(slot);
    return;
  }
  // A stale checkpoint of an earlier registration of this block: its slot goes free.
  if (const int32_t old = by_block_[static_cast<size_t>(ref.block_id)]; old >= 0) {
    Unlink(static_cast<size_t>(old));
    slots_[static_cast<size_t>(old)].state = SlotState::kFree;
  }
  slots_[i].state = SlotState::kCommitted;
  slots_[i].ref = ref;
  slots_[i].last_use = ++tick_;
  by_block_[static_cast<size_t>(ref.block_id)] = static_cast<int32_t>(i);
  ++num_saved_;
}

void StateCheckpoints::Release(int32_t slot) {
  const size_t i = Index(slot);
  CHECK(slots_[i].state == SlotState::kPending) << "Release of a state slot not reserved: " << slot;
  slots_[i].state = SlotState::kFree;
}

int32_t StateCheckpoints::NumLive() const {
  int32_t n = 0;
  for (const Slot& s : slots_) n += IsLive(s) ? 1 : 0;
  return n;
}

std::string StateCheckpoints::CheckInvariants() const {
  std::ostringstream err;
  for (size_t b = 0; b < by_block_.size(); ++b) {
    const int32_t i = by_block_[b];
    if (i < 0) continue;
    const Slot& s = slots_[static_cast<size_t>(i)];
    if (s.state != SlotState::kCommitted || s.ref.block_id != static_cast<int32_t>(b))
      err << "block " << b << " indexes slot " << i << " that is not its checkpoint; ";
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state == SlotState::kCommitted &&
        by_block_[static_cast<size_t>(s.ref.block_id)] != static_cast<int32_t>(i))
      err << "committed slot " << i << " is not indexed; ";
  }
  return err.str();
}

}  // namespace ember::kv
