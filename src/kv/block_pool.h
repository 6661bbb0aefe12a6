// BlockPool: the fixed set of KV blocks, their reference counts and the free list. Bookkeeping
// only (block ids are indices into the backend's KV tensors; nothing here touches memory).
// Invariants: a block is in the free list iff its ref count is 0; the free list is ordered
// front (next to be handed out) to back (most recently freed), so cached content freed last
// survives longest (LRU). Single-threaded: owned by the engine thread through KvCacheManager.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ember::kv {

class BlockPool {
 public:
  // Where a block whose ref count drops to 0 joins the free list.
  enum class FreeEnd { kFront, kBack };

  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t ref_count(int32_t block_id) const { return ref_counts_[block_id]; }
  bool is_free(int32_t block_id) const { return ref_counts_[block_id] == 0; }
  // The block PopFront() would return, or -1 when none is free.
  int32_t front() const { return head_; }

  // Takes the block at the front of the free list and gives it ref count 1. CHECKs num_free() > 0.
  int32_t PopFront();
  // Adds a reference; a free block (ref count 0) is unlinked from the free list (revived).
  void AddRef(int32_t block_id);
  // Drops a reference; returns true when the count reached 0 and the block joined the free list
  // at `end`. CHECKs the count was positive.
  bool Release(int32_t block_id, FreeEnd end);

  // Free list from front to back (tests and invariant checks; allocates).
  std::vector<int32_t> FreeList() const;
  // Consistency of links, counts and sizes; empty string when OK.
  std::string CheckInvariants() const;

 private:
  void Unlink(int32_t block_id);
  void PushFront(int32_t block_id);
  void PushBack(int32_t block_id);

  std::vector<int32_t> ref_counts_;  // [num_blocks]
  // Intrusive doubly linked free list: [num_blocks] each, -1 = none (O(1) revive from the middle).
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  int32_t head_ = -1;
  int32_t tail_ = -1;
  int32_t num_free_ = 0;
};

}  // namespace ember::kv
