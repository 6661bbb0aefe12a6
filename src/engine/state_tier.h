// StateTier: a hybrid model's recurrent-state checkpoints in the prompt cache's RAM and disk
// tiers (qwen3_next: the state at a prefix's end is not in its KV blocks, so a prefix served
// from a tier needs the state at its end too). A checkpoint the pool took at the end of block j
// (kv/state_checkpoints.h) travels down with block j: written through to the disk tier when it
// is committed, copied into the RAM tier when block j is evicted from the pool (RAM records it
// evicts spill to disk, as the KV records do). PromptTier resumes a prefix only at a block whose
// checkpoint reads back (engine/prompt_tier.h).
//
// Records: a checkpoint is a companion record of its block's KV record: the same block_record
// format and identity (parent key, key, token ids, namespace: the chain key names the whole
// prefix) with the state's bytes (Backend::CopyStateSlotToHost: every recurrent layer's conv
// window and delta-rule matrices, float32) as payload, under its own fingerprint: SHA-256 over
// "ember recurrent-state record v" kStateRecordVersion, the KV fingerprint's digest and the
// state's size. So the companion stores are their own RamStore and DiskStore (on disk
// DIR/<state fingerprint hex>/, its own lock); a record of another state layout, version, model
// or block is in another folder or refused on read (header, size, tokens, CRC-32C), never
// misread, and a KV record can never be read as a state.
// Bytes: the companion stores' caps are a share of the tier's own cap (StateShareBytes), so the
// checkpoints count against --prompt-cache-ram-bytes and --prompt-cache-disk-bytes.
// Prefetch (both tiers): a waiting request's checkpoint, the one its admission will resume
// from, is moved from disk to RAM by this tier's own Prefetcher (a second worker thread, beside
// the KV blocks' one), and Read waits for it rather than read the file a second time.
// Threads: the engine thread, except Clear and AddStats (the stores are thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "prompt_cache/disk_store.h"
#include "prompt_cache/prefetcher.h"
#include "prompt_cache/ram_store.h"
#include "util/status.h"

namespace ember {

class KvBlockIo;

// Bumped whenever the meaning of a state record's payload changes (the fingerprint digests it).
inline constexpr uint32_t kStateRecordVersion = 1;

// The companion store's share of a tier of `tier_bytes`, holding one state record of
// `state_record` bytes per `blocks_per_checkpoint` KV records of `kv_record` bytes: at least one
// state record; 0 when the tier cannot hold one KV record and one state record.
int64_t StateShareBytes(int64_t tier_bytes, int64_t kv_record, int64_t state_record,
                        int64_t blocks_per_checkpoint);

struct StateTierConfig {
  prompt_cache::Key kv_fingerprint{};  // PromptTierShape::fingerprint
  std::string kv_fingerprint_text;     // what it digests (written beside the disk records)
  int32_t block_size = 0;
  int64_t state_bytes = 0;   // Model::StateBytesPerSequence
  int64_t ram_bytes = 0;     // the RAM companion's cap; 0: no RAM tier
  std::string dir;           // the disk tier's directory; empty: no disk tier
  int64_t disk_bytes = 0;    // the disk companion's cap
  int64_t max_queue_bytes = 0;
};

class StateTier {
 public:
  static Result<std::unique_ptr<StateTier>> Open(const StateTierConfig& config);

  // The identity of block `kv`'s checkpoint record (kv: the block's KV record identity).
  prompt_cache::BlockIdentity Of(prompt_cache::BlockIdentity kv) const;
  // Whether a tier holds the checkpoint at the end of the block with this chain key.
  bool Has(const prompt_cache::Key& key) const;
  // The verified checkpoint at the end of block `kv` into *state (RAM, after waiting for the
  // prefetcher when it is reading it now; else disk); false when absent or refused (a refused
  // record is removed and counted by its store).
  bool Read(const prompt_cache::BlockIdentity& kv, std::vector<uint8_t>* state);
  // Both tiers: queues the checkpoint at the end of `block` (its KV block's identity) for the
  // prefetcher when the disk holds it and RAM does not; else a no-op.
  void Prefetch(prompt_cache::PrefetchBlock block);
  // Disk write-through: queues the state in `slot` as block kv's checkpoint (no-op without a disk
  // tier or when stored already).
  void WriteThrough(const prompt_cache::BlockIdentity& kv, int32_t slot, KvBlockIo& io);
  // RAM: block kv leaves the pool with its checkpoint in `slot`: copied in (or refreshed), what
  // RAM evicts for room spills to disk. No-op without a RAM tier.
  void Demote(const prompt_cache::BlockIdentity& kv, int32_t slot, KvBlockIo& io);
  // Removes the checkpoints (every namespace, or one); returns how many.
  int64_t Clear(std::optional<uint64_t> ns);
  // Adds the companion stores' counters: state_* fields, and their bytes, caps, evictions and
  // refused records into the tiers' totals.
  void AddStats(PromptCacheStats* s) const;
  prompt_cache::DiskStore* disk() { return disk_.get(); }
  int64_t record_bytes() const {
    return prompt_cache::RecordBytes(config_.block_size, config_.state_bytes);
  }

 private:
  StateTier(const StateTierConfig& config, const prompt_cache::Key& fingerprint);
  // Copies slot's state into the payload of `record` (a whole record); false on an error.
  bool CopyOut(int32_t slot, std::span<uint8_t> record, KvBlockIo& io);

  const StateTierConfig config_;
  const prompt_cache::Key fingerprint_;
  std::unique_ptr<prompt_cache::RamStore> ram_;
  std::unique_ptr<prompt_cache::DiskStore> disk_;
  std::unique_ptr<prompt_cache::Prefetcher> prefetcher_;  // after the stores: stops first
  int64_t copy_failures_ = 0;  // engine thread
};

}  // namespace ember
