// StateCheckpoints: which recurrent-state checkpoints exist, for a hybrid model (qwen3_next:
// gated DeltaNet layers whose per-sequence state lives in backend state slots, beside attention
// layers in the paged KV pool). A checkpoint is a copy of a sequence's whole recurrent state taken
// when its computed length reached the end of a full block; it lives in one of `num_slots`
// dedicated backend state slots (first_slot, first_slot + 1, ...) and is keyed by the cached block
// (PrefixCache BlockRef: block id + epoch) at whose end it was taken. A prefix hit for a hybrid
// model is then the longest cached block run that ends at a block with a live checkpoint
// (KvCacheManager's PrefixEndFilter): the new sequence copies the checkpoint into its own slot
// and prefills from there.
// A checkpoint is live while its block is cached under the same epoch: when the block is evicted
// or re-registered the checkpoint is stale (useless without its blocks) and its slot is taken
// first. Slots are free, pending (reserved for a copy launched but not yet committed to a block)
// or committed; Reserve takes a free slot, else a stale one, else the least recently used live
// one (never a pending one). Bookkeeping only (the copies are the engine's); engine thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/prefix_cache.h"

namespace ember::kv {

class StateCheckpoints : public PrefixEndFilter {
 public:
  // `cache` (the KV manager's prefix cache, num_blocks entries) must outlive this.
  StateCheckpoints(int32_t first_slot, int32_t num_slots, int64_t bytes_per_checkpoint,
                   const PrefixCache* cache, int32_t num_blocks);

  // PrefixEndFilter: a live checkpoint was taken at the end of block `last`.
  bool Usable(BlockRef last) const override { return Find(last) >= 0; }
  // The backend slot holding the live checkpoint at the end of `ref`, or -1.
  int32_t Find(BlockRef ref) const;
  // Marks the checkpoint in `slot` as just used (a hit), for the LRU order.
  void Touch(int32_t slot);
  // A slot for a new checkpoint (pending until Commit or Release): free, else stale, else the
  // least recently used live one (its checkpoint is dropped). -1 when every slot is pending.
  int32_t Reserve();
  // The pending `slot` now holds the state at the end of `ref` (a cached block). When `ref`
  // already has a live checkpoint the slot goes back free instead (same tokens, same state).
  void Commit(int32_t slot, BlockRef ref);
  // The pending `slot` goes back free (its copy is not needed: the step failed, the sequence
  // was preempted or its block is not cached).
  void Release(int32_t slot);

  int32_t num_slots() const { return static_cast<int32_t>(slots_.size()); }
  int32_t first_slot() const { return first_slot_; }
  int64_t bytes_per_checkpoint() const { return bytes_per_checkpoint_; }
  // Live checkpoints now (stale ones no longer count), and their bytes.
  int32_t NumLive() const;
  int64_t LiveBytes() const { return int64_t{NumLive()} * bytes_per_checkpoint_; }
  // Checkpoints ever committed, and live ones dropped to make room (LRU evictions).
  int64_t num_saved() const { return num_saved_; }
  int64_t num_evicted() const { return num_evicted_; }
  // Index consistency (by_block_ and the slots agree); empty when OK.
  std::string CheckInvariants() const;

 private:
  enum class SlotState : uint8_t { kFree, kPending, kCommitted };
  struct Slot {
    SlotState state = SlotState::kFree;
    BlockRef ref;           // kCommitted: the block at whose end the state was taken
    uint64_t last_use = 0;  // LRU tick
  };
  bool IsLive(const Slot& s) const;
  // Index into slots_ of backend slot `slot`; CHECKs the range.
  size_t Index(int32_t slot) const;
  // Drops slot i's association (it becomes pending for the caller).
  void Unlink(size_t i);

  int32_t first_slot_;
  int64_t bytes_per_checkpoint_;
  const PrefixCache* cache_;
  std::vector<Slot> slots_;
  std::vector<int32_t> by_block_;  // [num_blocks] index into slots_ of a committed one, or -1
  uint64_t tick_ = 0;
  int64_t num_saved_ = 0, num_evicted_ = 0;
};

}  // namespace ember::kv
