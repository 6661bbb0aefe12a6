// PromptTier: the engine's side of the prompt cache below the KV pool (the disk tier,
// prompt_cache/disk_store.h). Two calls, each from one seam, engine thread only:
//  - ExtendCachedPrefix (Scheduler::AdmitWaiting, after KvCacheManager::AcquireCachedPrefix):
//    the prompt's next whole blocks that the pool missed are looked up on disk; when loading them
//    beats recomputing them (measured rates, below) they get pool blocks, are read, verified and
//    copied into those blocks (KvBlockIo, before the step that admits the sequence is launched:
//    the copy is ordered after every step already enqueued), and count as computed. A record that
//    fails verification ends the extension there: its block and the rest are recomputed.
//  - CommitComputed (StepPostprocessor::CommitComputed, after the pool registered the blocks):
//    write-through: each newly computed full block is copied to host memory and queued for the
//    disk writer (dropped, and counted, when the queue is full). Blocks already stored are skipped.
// Keys: a block's key is the SHA-256 chain over the model fingerprint, the request's namespace
// and cache_salt and every token id up to the block's end (block_record.h), kept per sequence
// in Sequence::tier_keys. Cost: with a measured disk read rate R (bytes/s, this store's reads)
// and prefill rate P (tokens/s, the engine's non-decode forward time), n blocks load iff
// n * record_bytes / R < n * block_size / P; until both are measured they load (the first load
// measures R). The choice is counted and the last one's rates are published (Stats).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "engine/engine_config.h"
#include "engine/sequence.h"
#include "kv/kv_cache_manager.h"
#include "prompt_cache/disk_store.h"
#include "util/status.h"

namespace ember {

// Copies one pool block's K/V (all layers) to and from host memory (Backend::CopyKvBlockToHost
// and CopyKvBlockFromHost through the model; ModelRunner implements it).
class KvBlockIo {
 public:
  virtual ~KvBlockIo() = default;
  virtual Status CopyBlockToHost(int32_t block_id, std::span<uint8_t> out) = 0;
  virtual Status CopyBlockFromHost(int32_t block_id, std::span<const uint8_t> in) = 0;
};

// The cost rule: reading num_blocks records of record_bytes at read_bytes_per_s takes less time
// than prefilling num_blocks * block_size tokens at prefill_tokens_per_s (both > 0).
bool LoadBeatsRecompute(int64_t num_blocks, int64_t record_bytes, int32_t block_size,
                        double read_bytes_per_s, double prefill_tokens_per_s);

class PromptTier {
 public:
  // `io` and `counters` (the engine's running totals, for the prefill rate) must outlive this.
  PromptTier(std::unique_ptr<prompt_cache::DiskStore> disk, PromptCacheConfig::Reuse reuse,
             KvBlockIo* io, const EngineStats* counters);

  // Returns seq's computed tokens after extending the pool's hit of `pool_tokens` with disk
  // blocks (>= pool_tokens; blocks are allocated to seq for what it returns). `budget_tokens`:
  // what this step may still compute, to check that the whole admission will fit before reading.
  int32_t ExtendCachedPrefix(Sequence& seq, int32_t pool_tokens, kv::KvCacheManager& kv,
                             int32_t budget_tokens);
  // Queues seq's full blocks within its first num_computed tokens that are not stored yet.
  void CommitComputed(Sequence& seq, int32_t num_computed, const kv::KvCacheManager& kv);
  // Removes stored blocks (every namespace, or one); returns how many. Any thread.
  int64_t Clear(std::optional<uint64_t> ns) { return disk_->Clear(ns); }
  // The disk's counters with this tier's decisions and rates. Any thread for the disk's part;
  // the decision counters are the engine thread's (the engine publishes them each step).
  PromptCacheStats Stats() const;
  // The disk's fields of PromptCacheStats, now (any thread: the store's counters are its own).
  static void DiskStats(const prompt_cache::DiskStore& disk, PromptCacheStats* out);
  prompt_cache::DiskStore& disk() { return *disk_; }
  const prompt_cache::DiskStore& disk() const { return *disk_; }

 private:
  // Computes seq's chain keys up to `num_blocks` blocks (stops at a token not yet known).
  void EnsureKeys(Sequence& seq, int32_t num_blocks) const;
  prompt_cache::BlockIdentity Identity(const Sequence& seq, int32_t block) const;
  // The measured rates (0 until measured): this store's reads, the engine's non-decode forwards.
  double ReadBytesPerSecond() const;
  double PrefillTokensPerSecond() const;
  // Whether loading n blocks beats recomputing them (counts the choice).
  bool ShouldLoad(int32_t num_blocks);

  std::unique_ptr<prompt_cache::DiskStore> disk_;
  PromptCacheConfig::Reuse reuse_;
  KvBlockIo* io_;
  const EngineStats* counters_;
  int32_t block_size_;
  // Decisions and promotions (engine thread).
  int64_t lookups_ = 0, lookup_misses_ = 0, loads_ = 0, recomputes_ = 0;
  int64_t promoted_blocks_ = 0, promote_failures_ = 0;
  double last_read_bytes_per_s_ = 0, last_prefill_tokens_per_s_ = 0;
  PromptCacheStats::Choice last_choice_ = PromptCacheStats::Choice::kNone;
};

}  // namespace ember
