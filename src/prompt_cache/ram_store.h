// RamStore: the prompt cache's host-RAM tier, between the KV pool and the disk (DiskStore). Full
// KV blocks the pool's prefix cache evicts are kept here as records (block_record.h: the bytes a
// disk record has, header and token ids included, but no checksum: it is taken when a record goes
// to disk, SpillToDisk), under a byte cap with least-recently-used eviction. The records live in a
// RecordMemory (record_memory.h): page-locked on a GPU, so the device copies blocks into and out
// of them without staging.
//
// Invariants:
//  - bytes() <= max_bytes at every point: Insert evicts least recently used records before it
//    stores (a record larger than the cap is refused). Bytes are counted as RecordBytes per record.
//  - A record is returned only after VerifyRecord accepted it against the reader's full identity
//    (model fingerprint, namespace, parent key, key, token ids; not the checksum, which RAM
//    records do not carry): one built for another model, KV dtype, block size, adapter or
//    cache_salt is refused (removed and counted), never used. The store is per engine, and its
//    fingerprint is the engine's, but the check is made on every read all the same.
//  - A record is immutable once inserted (readers may hand it to the device to read later).
//  - Records are shared_ptr<const>: a reader keeps its record alive while Clear or an eviction
//    drops the store's reference.
// Insert hands back what it evicted, so the caller can spill it to the disk tier (SpillToDisk):
// the store itself does no I/O.
// Threads: every method takes the store's mutex; any thread (the engine thread inserts and reads,
// HTTP threads clear and read the stats).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "prompt_cache/block_record.h"
#include "prompt_cache/record_memory.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember::prompt_cache {

class DiskStore;

struct RamStoreConfig {
  int64_t max_bytes = 0;      // --prompt-cache-ram-bytes (> 0)
  Key fingerprint{};          // the model's (the disk tier's, too)
  int32_t block_size = 0;     // tokens per block
  int64_t payload_bytes = 0;  // K/V bytes per block (Backend::KvBlockBytes)
  // Page-locked memory for the records (a GPU's), or null: plain memory.
  std::shared_ptr<PinnedAllocator> pinned;
};

struct RamStoreStats {
  int64_t records = 0, bytes = 0, capacity_bytes = 0;
  int64_t pinned_bytes = 0;     // page-locked memory taken for the records (RecordMemory)
  int64_t hits = 0;             // records read and verified
  int64_t misses = 0;           // reads of a key not held
  int64_t inserts = 0;          // records stored
  int64_t insert_drops = 0;     // records refused: larger than the cap
  int64_t evictions = 0;        // records removed to make room (LRU)
  int64_t corrupt_dropped = 0;  // records refused on read (identity or checksum) and removed
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t read_ns = 0;          // time spent in Read (lookup and verification)
};

class RamStore {
 public:
  using Record = std::shared_ptr<const RecordBuffer>;
  // An evicted record, for the tier below.
  struct Evicted {
    Key key{};
    uint64_t ns = 0;
    Record record;
  };

  explicit RamStore(const RamStoreConfig& config);
  RamStore(const RamStore&) = delete;
  RamStore& operator=(const RamStore&) = delete;

  const RamStoreConfig& config() const { return config_; }
  int64_t record_bytes() const { return record_bytes_; }
  // A buffer for one record: fill its payload at PayloadOffset(block_size), then Insert it.
  // Any thread.
  RecordBuffer NewRecord() { return memory_->Take(); }
  const RecordMemory& memory() const { return *memory_; }

  bool Contains(const Key& key) const EXCLUDES(mu_);
  // Marks the record most recently used; false when it is not held.
  bool Refresh(const Key& key) EXCLUDES(mu_);
  // Writes `record`'s header for `id` and stores it (a key already held is refreshed, not
  // replaced). Returns the records evicted to make room, least recently used first.
  std::vector<Evicted> Insert(const BlockIdentity& id, RecordBuffer record) EXCLUDES(mu_);
  // The verified record for `id` (RecordPayload gives its K/V), or null: absent (a miss) or
  // refused (removed and counted as corrupt). A hit marks it most recently used.
  Record Read(const BlockIdentity& id) EXCLUDES(mu_);
  // Removes every record (ns: nullopt) or those of one namespace; returns how many.
  int64_t Clear(std::optional<uint64_t> ns) EXCLUDES(mu_);
  RamStoreStats Stats() const EXCLUDES(mu_);

 private:
  struct Entry {
    uint64_t ns = 0;
    Record record;
    std::list<Key>::iterator lru;
  };
  void Erase(const Key& key) REQUIRES(mu_);

  const RamStoreConfig config_;
  const int64_t record_bytes_;
  const std::shared_ptr<RecordMemory> memory_;

  mutable Mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> index_ GUARDED_BY(mu_);
  std::list<Key> lru_ GUARDED_BY(mu_);  // front: least recently used
  int64_t bytes_ GUARDED_BY(mu_) = 0;
  RamStoreStats counts_ GUARDED_BY(mu_);  // the counters (records/bytes/capacity: Stats fills)
};

// Queues RAM's evicted records that `disk` does not hold for its writer (DiskStore::WriteRam: no
// wait, no copy or checksum pass on this thread). Returns how many were queued. Any thread.
int64_t SpillToDisk(const std::vector<RamStore::Evicted>& evicted, DiskStore& disk);

}  // namespace ember::prompt_cache
