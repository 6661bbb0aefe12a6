// PrefixCache: content index of full, computed KV blocks. A block is keyed by a hash chained from
// its parent's key, its block_size token ids and a namespace (e.g. an adapter id); a lookup walks a
// prompt block by block and stops at the first miss. Every hit is verified: the cache keeps each
// block's token ids, namespace and the exact identity (block id + epoch) of its parent block, so
// neither a hash collision nor a parent that was evicted and reused can return wrong KV.
// Bookkeeping only; single-threaded (owned by KvCacheManager on the engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ember::kv {

// hash(parent_key, block token ids, namespace). Replaceable in tests to force collisions.
using BlockHashFn = uint64_t (*)(uint64_t parent_key, std::span<const int32_t> tokens, uint64_t ns);
// The default: a fast 64-bit mix of all inputs.
uint64_t HashBlockTokens(uint64_t parent_key, std::span<const int32_t> tokens, uint64_t ns);
// Key of the (empty) parent of a prompt's first block.
inline constexpr uint64_t kRootBlockKey = 0x9e3779b97f4a7c15ull;

// Identity of a cached block's content: the block id plus the epoch it was registered in (a block
// gets a new epoch each time it is registered, so a stale reference never matches).
struct BlockRef {
  int32_t block_id = -1;  // -1: the root (no parent)
  uint32_t epoch = 0;
  bool operator==(const BlockRef&) const = default;
};

class PrefixCache {
 public:
  PrefixCache(int32_t num_blocks, int32_t block_size, BlockHashFn hash_fn = HashBlockTokens);

  int32_t block_size() const { return block_size_; }
  uint64_t Hash(uint64_t parent_key, std::span<const int32_t> tokens, uint64_t ns) const {
    return hash_fn_(parent_key, tokens, ns);
  }

  // The cached block with this key whose parent is `parent` and whose tokens and namespace equal
  // the query, or -1. tokens.size() == block_size.
  int32_t Find(uint64_t key, BlockRef parent, std::span<const int32_t> tokens, uint64_t ns) const;
  // Registers block_id (must not be cached) under key; gives it a new epoch.
  void Insert(int32_t block_id, uint64_t key, uint64_t parent_key, BlockRef parent,
              std::span<const int32_t> tokens, uint64_t ns);
  // Drops block_id's entry (no-op when it is not cached).
  void Evict(int32_t block_id);

  bool is_cached(int32_t block_id) const { return entries_[block_id].cached; }
  BlockRef Ref(int32_t block_id) const { return {block_id, entries_[block_id].epoch}; }
  uint64_t key(int32_t block_id) const { return entries_[block_id].key; }
  uint64_t ns(int32_t block_id) const { return entries_[block_id].ns; }
  // The parent a cached block was registered under (block_id -1: the root).
  BlockRef Parent(int32_t block_id) const { return entries_[block_id].parent; }
  // The token ids a cached block was registered with: [block_size].
  std::span<const int32_t> Tokens(int32_t block_id) const;
  int32_t num_cached() const { return num_cached_; }

  // Index consistency (every cached block reachable exactly once under its key, keys recompute
  // from the stored inputs, counts agree); empty string when OK.
  std::string CheckInvariants() const;

 private:
  struct Entry {
    bool cached = false;
    uint32_t epoch = 0;
    uint64_t key = 0;
    uint64_t parent_key = 0;
    uint64_t ns = 0;
    BlockRef parent;
    int32_t next_same_key = -1;  // chain of blocks sharing one key (collisions, duplicates)
  };
  // Open-addressing key -> first block id map (linear probing, backward-shift deletion), sized to
  // twice num_blocks so it never grows.
  int64_t Slot(uint64_t key) const;  // slot holding key, or -1
  void MapInsert(uint64_t key, int32_t head);
  void MapErase(uint64_t key);
  size_t Home(uint64_t key) const;

  int32_t block_size_;
  BlockHashFn hash_fn_;
  std::vector<Entry> entries_;       // [num_blocks]
  std::vector<int32_t> tokens_;      // [num_blocks, block_size]
  std::vector<uint64_t> slot_keys_;  // [capacity]
  std::vector<int32_t> slot_heads_;  // [capacity], -1 = empty slot
  size_t slot_mask_ = 0;
  int32_t num_keys_ = 0;
  int32_t num_cached_ = 0;
};

}  // namespace ember::kv
