// PromptTier: the engine's side of the prompt cache below the KV pool: a host-RAM tier
// (prompt_cache/ram_store.h, --prompt-cache-ram-bytes) and a disk tier (prompt_cache/disk_store.h,
// --prompt-cache-dir), either or both. Four calls, each from one seam, engine thread only:
//  - Prefetch (Engine::TakeWork, as a request arrives; both tiers on): the blocks of its prompt
//    past the pool's hit that RAM lacks and the disk holds are queued for the Prefetcher, whose
//    thread moves them from disk to RAM (prompt_cache/prefetcher.h) while the request waits.
//  - OnEvict (kv::EvictionObserver; KvCacheManager::Allocate, before it reuses a cached block):
//    the block's content moves down to RAM: it is queued, and FlushDemotions copies the queued
//    blocks out through KvBlockIo into new RAM records in batches of 64 (a GPU waits once a batch,
//    not once per block; page-locked records are written by the GPU directly) and inserts them
//    under their chain keys. The engine flushes before it
//    launches a step (the first that may write a reused block) and this class before it looks
//    below the pool or restores into blocks it allocated (ExtendCachedPrefix), so a queued block
//    is still intact when it is copied. A block RAM already holds is only marked recently used.
//    Records RAM evicts for room go to the disk writer as they are (WriteSealed, queued: the
//    engine thread never waits for the disk) unless the disk holds them already.
//  - ExtendCachedPrefix (Scheduler::AdmitWaiting, after KvCacheManager::AcquireCachedPrefix):
//    the prompt's next whole blocks that the pool missed are looked up in RAM, then on disk; when
//    loading them beats recomputing them (measured rates, below) they get pool blocks, are read
//    (from RAM, after waiting for the prefetcher when it is reading that block now; else disk),
//    verified and copied into those blocks (KvBlockIo, before the step that admits the sequence
//    is launched: the copy is ordered after every step already enqueued), and count as computed.
//    A record that fails verification ends the extension there: its block and the rest are
//    recomputed.
//  - CommitComputed (StepPostprocessor::CommitComputed, after the pool registered the blocks):
//    the pool blocks registered for the sequence are tagged with their chain keys (what OnEvict
//    needs: the pool's own keys are 64-bit hashes); with a disk tier, write-through: each newly
//    computed full block is copied to host memory (one batch per call, into the disk queue's
//    records: page-locked on a GPU) and queued for the disk writer, as many as the queue takes
//    (the rest wait for the sequence's next commit, when the writer has drained some). Blocks
//    already stored are skipped.
// Keys: a block's key is the SHA-256 chain over the model fingerprint, the request's namespace
// and cache_salt and every token id up to the block's end (block_record.h), kept per sequence
// in Sequence::tier_keys; both tiers hold the same sealed records, checked in full on every read,
// so a block is never reused across models, KV dtypes, block sizes, adapters or salts. Cost: with
// measured read rates (bytes/s of each tier's reads) and the prefill rate P (tokens/s, the
// engine's non-decode forward time), n blocks of which r in RAM and d on disk load iff
// r * record_bytes / R_ram + d * record_bytes / R_disk < n * block_size / P; until the rates
// involved are measured they load (the first load measures them). The choice is counted and the
// last one's rates are published (Stats).
// A hybrid model (recurrent layers, qwen3_next; AttachStates): the state at a prefix's end is
// not in its blocks, so each tier also keeps the pool's state checkpoints (engine/state_tier.h),
// saved beside their blocks (OnCheckpoint writes a committed checkpoint through to disk; OnEvict
// copies an evicted block's live checkpoint into RAM). ExtendCachedPrefix then resumes only at
// the last found block whose checkpoint reads back and verifies (blocks past it are recomputed):
// the state goes to Sequence::tier_state, written into the sequence's state slot before its
// first rows and copied into a pool checkpoint slot for that block too (StepBuilder::
// AddStateCopies: the same prompt again hits in the pool); when a block up to there fails to
// restore, it resumes at the last checkpoint before that block (or uses none of the extension).
// Prefetch also queues the checkpoint a waiting request would resume from (StateTier::Prefetch).
// The cost rule counts the checkpoint's record in the bytes to read.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "engine/engine_config.h"
#include "engine/sequence.h"
#include "engine/state_tier.h"
#include "kv/kv_cache_manager.h"
#include "kv/state_checkpoints.h"
#include "prompt_cache/disk_store.h"
#include "prompt_cache/prefetcher.h"
#include "prompt_cache/ram_store.h"
#include "util/status.h"

namespace ember {

// Copies pool blocks' K/V (all layers) to and from host memory (Backend::CopyKvBlocksToHost
// and CopyKvBlockFromHost through the model; ModelRunner implements it), and one recurrent-state
// slot's (a hybrid model's state checkpoints: Backend::CopyStateSlotToHost / FromHost).
class KvBlockIo {
 public:
  virtual ~KvBlockIo() = default;
  // outs[i] receives blocks[i] (one batch: a GPU waits once, not per block).
  virtual Status CopyBlocksToHost(std::span<const int32_t> blocks,
                                  std::span<const std::span<uint8_t>> outs) = 0;
  virtual Status CopyBlockFromHost(int32_t block_id, std::span<const uint8_t> in) = 0;
  // From a page-locked record (prompt_cache::RecordBuffer::pinned): the device may read `in`
  // after this returns, until PinnedReadsDone (Backend::CopyKvBlockFromPinned).
  virtual Status CopyBlockFromPinned(int32_t block_id, std::span<const uint8_t> in) {
    return CopyBlockFromHost(block_id, in);
  }
  virtual bool PinnedReadsDone(bool /*wait*/) { return true; }
  virtual Status CopyStateToHost(int32_t slot, std::span<uint8_t> out) = 0;
  virtual Status CopyStateFromHost(int32_t slot, std::span<const uint8_t> in) = 0;
};

// The cost rule: reading num_blocks records of record_bytes at read_bytes_per_s takes less time
// than prefilling num_blocks * block_size tokens at prefill_tokens_per_s (both > 0).
bool LoadBeatsRecompute(int64_t num_blocks, int64_t record_bytes, int32_t block_size,
                        double read_bytes_per_s, double prefill_tokens_per_s);

// What the tiers' records are for: this model and pool (the same for RAM and disk).
struct PromptTierShape {
  prompt_cache::Key fingerprint{};
  int32_t block_size = 0;
  int64_t payload_bytes = 0;  // Backend::KvBlockBytes
  int32_t num_blocks = 0;     // the pool's
};

class PromptTier : public kv::EvictionObserver {
 public:
  // `ram` or `disk` may be null (not both). `io`, `kv` and `counters` (the engine's running
  // totals, for the prefill rate) must outlive this. Registers itself as kv's eviction observer
  // when there is a RAM tier.
  PromptTier(const PromptTierShape& shape, std::unique_ptr<prompt_cache::RamStore> ram,
             std::unique_ptr<prompt_cache::DiskStore> disk, PromptCacheConfig::Reuse reuse,
             KvBlockIo* io, kv::KvCacheManager* kv, const EngineStats* counters);
  ~PromptTier() override;

  // Queues the disk blocks of `request`'s prefix past the pool's hit for the prefetcher, and a
  // hybrid model's checkpoint at the last of the blocks found below the pool that has one (a
  // no-op without both tiers, or for a request that does not look its prefix up).
  void Prefetch(const GenerationRequest& request, const kv::KvCacheManager& kv);
  // Returns seq's computed tokens after extending the pool's hit of `pool_tokens` with blocks
  // from RAM and disk (>= pool_tokens; blocks are allocated to seq for what it returns).
  // `budget_tokens`: what this step may still compute, to check that the whole admission will
  // fit before reading.
  int32_t ExtendCachedPrefix(Sequence& seq, int32_t pool_tokens, kv::KvCacheManager& kv,
                             int32_t budget_tokens);
  // Tags seq's registered pool blocks within its first num_computed tokens; with a disk tier,
  // queues its full blocks there that are not stored yet.
  void CommitComputed(Sequence& seq, int32_t num_computed, const kv::KvCacheManager& kv);
  // kv::EvictionObserver: the pool is about to reuse cached block `block_id` (queued for
  // FlushDemotions).
  void OnEvict(int32_t block_id) override;
  // Copies the blocks OnEvict queued out of the pool in one batch and inserts them into RAM.
  // Before anything writes a queued block (Engine::Launch; ExtendCachedPrefix itself).
  void FlushDemotions();
  // A hybrid model: its checkpoints' companion stores and the pool's checkpoints (both outlive
  // this). Before the first step.
  void AttachStates(std::unique_ptr<StateTier> states, const kv::StateCheckpoints* checkpoints);
  // The pool committed the checkpoint in `slot` at the end of seq's first num_blocks blocks
  // (StepPostprocessor::CommitStateSaves): written through to the disk tier.
  void OnCheckpoint(Sequence& seq, int32_t num_blocks, int32_t slot);
  // Removes stored blocks from both tiers (every namespace, or one); returns how many. Any thread.
  PromptCacheCleared Clear(std::optional<uint64_t> ns);
  // The stores' counters with this tier's decisions and rates. The stores' parts are read now;
  // the decision counters are the engine thread's (the engine publishes them each step).
  PromptCacheStats Stats() const;
  // The stores' fields of PromptCacheStats, now (any thread: the stores' counters are their own).
  void StoreStats(PromptCacheStats* out) const;
  prompt_cache::DiskStore* disk() { return disk_.get(); }
  prompt_cache::RamStore* ram() { return ram_.get(); }

 private:
  // A pool block's chain key while it is registered (epoch: the prefix cache's at tagging).
  struct PoolTag {
    prompt_cache::Key key{}, parent{};
    uint32_t epoch = 0;
    bool valid = false;
  };
  // Computes seq's chain keys up to `num_blocks` blocks (stops at a token not yet known).
  void EnsureKeys(Sequence& seq, int32_t num_blocks) const;
  prompt_cache::Key RootOf(const Sequence& seq) const;
  prompt_cache::BlockIdentity Identity(const Sequence& seq, int32_t block) const;
  // How many of seq's blocks from `first` on (up to `known`) RAM or the disk hold; *on_disk: how
  // many of those only the disk holds; *in_ram_run: the leading run RAM holds.
  int32_t FindBelow(const Sequence& seq, int32_t first, int32_t known, int32_t* on_disk,
                    int32_t* in_ram_run) const;
  // Copies block j of seq from RAM or disk into pool block `block_id`; false when neither
  // tier gives a verified record (or the copy fails).
  bool Restore(const Sequence& seq, int32_t j, int32_t block_id);
  void TagBlocks(Sequence& seq, int32_t keyed, const std::vector<int32_t>& table,
                 const kv::KvCacheManager& kv);
  void WriteThrough(Sequence& seq, int32_t keyed, const std::vector<int32_t>& table);
  // Pool blocks `blocks` copied out in one batch (KvBlockIo::CopyBlocksToHost), each into the
  // payload of a new record of `store` (NewRecord: the RAM tier's or the disk queue's; the store
  // that takes it writes the rest).
  template <typename Store>
  Result<std::vector<prompt_cache::RecordBuffer>> CopyOut(std::span<const int32_t> blocks,
                                                          Store& store);
  // Drops the page-locked records restored blocks were read from once the device has read them
  // (KvBlockIo::PinnedReadsDone; wait: waits for it).
  void ReleasePinnedReads(bool wait);
  // A hybrid model: how many of the `found` blocks from `first` end at the last one whose
  // checkpoint reads back (its bytes into seq.tier_state), 0 when none does.
  int32_t ResumableBlocks(Sequence& seq, int32_t first, int32_t found);
  // The measured rates (0 until measured): a store's reads, the engine's non-decode forwards.
  double RamReadBytesPerSecond() const;
  double DiskReadBytesPerSecond() const;
  double PrefillTokensPerSecond() const;
  int64_t MaxPrefetchBlocks() const;  // RAM's cap in records
  // Whether loading `in_ram` blocks from RAM and `on_disk` from disk beats recomputing them
  // (counts the choice).
  bool ShouldLoad(int32_t in_ram, int32_t on_disk);

  const PromptTierShape shape_;
  std::unique_ptr<prompt_cache::RamStore> ram_;
  std::unique_ptr<prompt_cache::DiskStore> disk_;
  std::unique_ptr<prompt_cache::Prefetcher> prefetcher_;  // after the stores: stops first
  std::unique_ptr<StateTier> states_;                     // a hybrid model's, else null
  const kv::StateCheckpoints* checkpoints_ = nullptr;
  // OnEvict's queue: blocks still intact in the pool, copied out by FlushDemotions. `tokens`
  // owns what the pool's prefix cache held for the block (reused with the block).
  struct Demotion {
    int32_t block_id = 0;
    prompt_cache::BlockIdentity id;
    std::vector<int32_t> tokens;
    uint64_t clears = 0;  // clears_ when queued: a Clear since drops it
  };
  std::vector<Demotion> demotions_;
  // Page-locked RAM records handed to the device (KvBlockIo::CopyBlockFromPinned), held until it
  // has read them: a slot is not reused (nor its record freed) while a copy may read it.
  std::vector<prompt_cache::RamStore::Record> pinned_reads_;
  std::atomic<uint64_t> clears_{0};  // Clear calls (any thread)
  PromptCacheConfig::Reuse reuse_;
  KvBlockIo* io_;
  kv::KvCacheManager* kv_;
  const EngineStats* counters_;
  const int32_t block_size_;
  std::vector<PoolTag> tags_;  // [pool blocks] (RAM tier only)
  // Decisions and promotions (engine thread).
  int64_t lookups_ = 0, lookup_misses_ = 0, ram_lookup_misses_ = 0, loads_ = 0, recomputes_ = 0;
  int64_t disk_promotions_ = 0, ram_promotions_ = 0, promote_failures_ = 0;
  int64_t ram_demotions_ = 0, ram_demote_failures_ = 0;
  int64_t state_restores_ = 0, state_misses_ = 0;
  std::atomic<int64_t> ram_spills_{0};  // engine thread writes; StoreStats reads (any thread)
  double last_read_bytes_per_s_ = 0, last_prefill_tokens_per_s_ = 0;
  PromptCacheStats::Choice last_choice_ = PromptCacheStats::Choice::kNone;
};

}  // namespace ember
