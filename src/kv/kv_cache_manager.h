// KvCacheManager: per-sequence block tables over a BlockPool, with automatic prefix caching.
// A sequence's table covers its token slots in order (slot i lives in block table[i / block_size]).
// Full, computed blocks are registered in the PrefixCache; when the last sequence releases such a
// block it stays cached at the back of the free list (LRU) and a later prompt with the same prefix
// revives it. Allocation takes from the front of the free list, evicting a cached block's entry
// first (an EvictionObserver sees the block, its content still intact, just before). The capacity
// (num_blocks, from the KV byte cap) holds before any allocation: Allocate refuses, changing
// nothing, rather than over-commit. A PrefixEndFilter (a hybrid model's state checkpoints) limits
// where a hit may end. Single-threaded: owned by the engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_cache.h"

namespace ember::kv {

using SeqId = int64_t;

struct KvCacheConfig {
  int32_t block_size = 16;
  int32_t num_blocks = 0;  // computed by the caller from the byte cap (NumBlocksForBytes)
  bool enable_prefix_caching = true;
};

// Blocks that fit in `bytes` given the model's KV bytes per token (all layers, K and V): the cap
// holds before allocation. 0 when not even one block fits.
int32_t NumBlocksForBytes(int64_t bytes, int64_t kv_bytes_per_token, int32_t block_size);

// Told about each cached block Allocate is about to reuse (its prefix-cache entry, tokens and
// namespace still readable, its KV not yet overwritten): the prompt cache's RAM tier copies it
// out (engine/prompt_tier.h). Not called for DropCached or for re-registration.
class EvictionObserver {
 public:
  virtual ~EvictionObserver() = default;
  virtual void OnEvict(int32_t block_id) = 0;
};

// Where a prefix hit may end (a hybrid model: only at a block whose recurrent state was
// checkpointed, kv/state_checkpoints.h). Without one, a hit may end at any matched block.
class PrefixEndFilter {
 public:
  virtual ~PrefixEndFilter() = default;
  // Whether a hit may end with the cached block `last`.
  virtual bool Usable(BlockRef last) const = 0;
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);
  // Test hook: a custom (e.g. deliberately weak) block hash.
  KvCacheManager(const KvCacheConfig& config, BlockHashFn hash_fn);

  // Starts (or restarts after preemption) `seq` with its full token list. Takes references on the
  // longest cached, verified prefix of whole blocks and returns how many tokens it covers
  // (multiple of block_size, <= tokens.size() - 1). CHECKs that seq has no blocks yet.
  int32_t AcquireCachedPrefix(SeqId seq, std::span<const int32_t> tokens, uint64_t ns);
  // Tokens AcquireCachedPrefix would cover now, without taking references or counting stats.
  int32_t PeekCachedPrefix(std::span<const int32_t> tokens, uint64_t ns) const;
  // Blocks seq still needs to hold num_tokens slots (0 if already covered; unknown seq: all).
  int32_t NumBlocksNeeded(SeqId seq, int32_t num_tokens) const;
  // Blocks obtainable now (free, including evictable cached ones).
  int32_t NumFreeBlocks() const { return pool_.num_free(); }
  // Grows seq's block table to cover num_tokens slots. Returns false and changes nothing if
  // there are not enough free blocks. An unknown seq is started with an empty table.
  bool Allocate(SeqId seq, int32_t num_tokens);
  // After a step: registers seq's full blocks within its first num_computed tokens in the prefix
  // cache (tokens = seq's full token list; idempotent for blocks already registered).
  void CommitComputed(SeqId seq, std::span<const int32_t> tokens, int32_t num_computed,
                      uint64_t ns);
  // Shrinks seq's block table to the blocks covering its first num_tokens slots, releasing the
  // rest (speculative decoding: the blocks past a sequence's end after rejected drafts). Block
  // bookkeeping only: nothing is copied; the slots past num_tokens in the last kept block are
  // simply written again later. CHECKs that no block registered in the prefix cache is dropped
  // (the caller commits only what it keeps). Unknown seq or a table already that short: no-op.
  void Truncate(SeqId seq, int32_t num_tokens);
  // Releases seq's references (cached blocks stay revivable in LRU order). Unknown seq: no-op.
  void Free(SeqId seq);
  // Forgets cached content, of every namespace or of `ns`: free cached blocks become plain free
  // blocks (front of the free list), blocks in use stay with their sequences but are no longer
  // found by lookups (a running sequence registers its blocks again as it commits). Returns how
  // many blocks were forgotten.
  int32_t DropCached(std::optional<uint64_t> ns);
  // Where a hit may end (null: at any matched block). It must outlive its registration.
  void set_prefix_end_filter(const PrefixEndFilter* filter) { filter_ = filter; }
  // The cached block holding seq's block num_blocks - 1 of its registered (or matched) chain:
  // its last block, or one before it found through the chain's parents. nullopt for an unknown
  // seq, num_blocks 0, a chain shorter than num_blocks, or a chain block no longer cached under
  // the epoch it was linked with.
  std::optional<BlockRef> ChainEnd(SeqId seq, int32_t num_blocks) const;
  // The observer of evictions (null: none). It must outlive its registration.
  void set_eviction_observer(EvictionObserver* observer) { observer_ = observer; }
  // seq's blocks in slot order. CHECKs Has(seq).
  const std::vector<int32_t>& BlockTable(SeqId seq) const;
  bool Has(SeqId seq) const { return seqs_.contains(seq); }

  int32_t block_size() const { return config_.block_size; }
  int32_t num_blocks() const { return config_.num_blocks; }
  int32_t NumUsedBlocks() const { return pool_.num_blocks() - pool_.num_free(); }  // referenced
  int32_t NumCachedBlocks() const { return cache_.num_cached(); }  // hashed (used or revivable)
  int32_t NumSeqs() const { return static_cast<int32_t>(seqs_.size()); }
  // Prefix-cache statistics for /metrics: prompt tokens looked up and tokens hit.
  int64_t prefix_queries_tokens() const { return prefix_queries_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  // Debug / tests.
  int32_t RefCount(int32_t block_id) const { return pool_.ref_count(block_id); }
  const BlockPool& pool() const { return pool_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  // Full consistency check (refcounts vs block tables, free list, hash index); empty when OK.
  std::string CheckInvariants() const;

 private:
  struct SeqState {
    std::vector<int32_t> blocks;  // [ceil(num_slots / block_size)]
    uint64_t ns = 0;
    int32_t num_registered = 0;         // leading blocks already in (or matched by) the cache
    uint64_t last_key = kRootBlockKey;  // key of block num_registered - 1
    BlockRef last_ref;                  // cached block holding that content (may be another seq's)
  };
  // Longest verified cached prefix of whole blocks (at most (tokens.size() - 1) / block_size)
  // that ends where the PrefixEndFilter allows.
  // Returns its length in blocks; when `into` is set, appends the blocks to into->blocks and
  // advances its registration cursor (takes no references).
  int32_t Walk(std::span<const int32_t> tokens, uint64_t ns, SeqState* into) const;

  KvCacheConfig config_;
  BlockPool pool_;
  PrefixCache cache_;
  std::unordered_map<SeqId, SeqState> seqs_;
  EvictionObserver* observer_ = nullptr;
  const PrefixEndFilter* filter_ = nullptr;
  int64_t prefix_queries_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace ember::kv
