// DiskStore: the prompt cache's disk tier. Full KV blocks, one file per block
// (block_record.h), under DIR/<model fingerprint hex>/, so a directory written by another model,
// dtype, block size or KV format is never even listed as this one's (and every record's header
// repeats the fingerprint, checked on read).
//
// Why one file per record, written to a temp file and renamed: rename is atomic, so after a
// kill -9 (or a crash mid-write) a record is either absent or whole; a leftover temp file is
// removed at the next start. No fsync: a power loss may leave a renamed record whose bytes never
// reached the disk, which its CRC-32C refuses on read (dropped and counted), so losing the cache
// is the worst case. Eviction is one unlink and needs no compaction; an append-only log would
// write fewer inodes but needs replay, compaction and its own free-space accounting.
//
// Start-up lists the directory and stats each file (no record is read): names that parse and
// sizes that match become the index, ordered by modification time (a read touches it, so the
// order survives restarts as LRU); wrong sizes are removed as corrupt. Exactly one process may
// use a fingerprint directory: Open takes an exclusive flock on its LOCK file and refuses, naming
// the holder's pid, when another process (or another engine of this one) holds it.
//
// Bytes on disk never exceed max_bytes: the writer evicts least recently used records before it
// writes (a record larger than the cap is dropped). Writes are queued to one writer thread; the
// queue is bounded by bytes and a write that does not fit is dropped and counted, never waited
// for. Threads: Read is for one thread at a time (the engine thread; it owns the read buffer);
// ReadRecord (the caller's buffer), Contains, Write, Clear, Flush and stats from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "prompt_cache/block_record.h"
#include "prompt_cache/record_memory.h"
#include "util/mutex.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace ember::prompt_cache {

struct DiskStoreConfig {
  std::string dir;               // --prompt-cache-dir; records go to dir/<fingerprint hex>/
  int64_t max_bytes = 0;         // --prompt-cache-disk-bytes (> 0)
  Key fingerprint{};             // the model's (engine/model_fingerprint.h)
  std::string fingerprint_text;  // what it digests, written beside the records for people
  int32_t block_size = 0;        // tokens per block
  int64_t payload_bytes = 0;     // K/V bytes per block (Backend::KvBlockBytes)
  int64_t max_queue_bytes = int64_t{256} << 20;  // waiting writes; beyond: dropped
  // Page-locked memory for the queued records (a GPU's: the device writes blocks into them
  // directly), or null: plain memory.
  std::shared_ptr<PinnedAllocator> pinned;
};

struct DiskStoreStats {
  int64_t records = 0, bytes = 0, capacity_bytes = 0;
  int64_t hits = 0;             // records read and verified
  int64_t misses = 0;           // reads of a key not on disk
  int64_t writes = 0;           // records written
  int64_t write_drops = 0;      // writes dropped: the queue was full
  int64_t write_errors = 0;     // writes that failed (disk full, permissions): logged once
  int64_t evictions = 0;        // records removed to make room (LRU)
  int64_t corrupt_dropped = 0;  // records refused (size, header, tokens, checksum) and removed
  int64_t stale_temps_removed = 0;  // temp files of a crashed writer, removed at start-up
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t read_ns = 0;          // time spent in Read (open, read, verify)
  int64_t queued_bytes = 0;     // writes waiting for the writer now
};

class DiskStore {
 public:
  // Creates the directories, takes the lock, removes temp files, indexes the records.
  static Result<std::unique_ptr<DiskStore>> Open(const DiskStoreConfig& config);
  // Writes what is queued, stops the writer, releases the lock.
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  const DiskStoreConfig& config() const { return config_; }
  const std::string& path() const { return path_; }  // dir/<fingerprint hex>
  int64_t record_bytes() const { return record_bytes_; }

  bool Contains(const Key& key) const EXCLUDES(mu_);
  // The verified payload of the record for `id` ([payload_bytes], valid until the next Read), or
  // an empty span: absent (a miss) or refused (removed and counted as corrupt).
  std::span<const uint8_t> Read(const BlockIdentity& id) EXCLUDES(mu_);
  // The same into `record` (the whole verified record, RecordBytes): false when absent or
  // refused. Any thread.
  bool ReadRecord(const BlockIdentity& id, std::span<uint8_t> record) EXCLUDES(mu_);
  // A buffer for one record (page-locked up to the queue's size when the config gives memory):
  // fill its payload at PayloadOffset(block_size), then Write it. Any thread.
  RecordBuffer NewRecord() { return memory_->Take(); }
  enum class WriteResult { kQueued, kPresent, kDropped };
  // Writes `record`'s header and token ids and queues it for the writer, which takes the
  // checksum (not this thread). kPresent: the key is stored or queued already (its recency is
  // refreshed); kDropped: the queue is full.
  WriteResult Write(const BlockIdentity& id, RecordBuffer record) EXCLUDES(mu_);
  // Queues a RAM-tier record for this store's fingerprint (header written, not checksummed;
  // spilled on eviction), shared as it is: the writer thread takes its checksum and writes it
  // after the record's body, so neither thread copies it. The record is verified when read.
  WriteResult WriteRam(const Key& key, uint64_t ns, std::shared_ptr<const RecordBuffer> record)
      EXCLUDES(mu_);
  // How many more records the write queue takes now (a caller copies no more than that out).
  int64_t QueueRoom() const EXCLUDES(mu_);
  // Removes every record (ns: nullopt) or those of one namespace, queued writes included.
  // Returns how many records were removed.
  int64_t Clear(std::optional<uint64_t> ns) EXCLUDES(mu_);
  // Waits until the queued writes are on disk (tests, shutdown).
  void Flush() EXCLUDES(mu_);
  DiskStoreStats Stats() const EXCLUDES(mu_);

 private:
  struct Entry {
    uint64_t ns = 0;
    std::list<Key>::iterator lru;
  };
  struct Pending {
    Key key{};
    uint64_t ns = 0;
    RecordBuffer record;                      // header written (Write)
    std::shared_ptr<const RecordBuffer> ram;  // or a RAM record (WriteRam)
  };
  explicit DiskStore(const DiskStoreConfig& config);
  Status Init();
  Status LockDirectory();
  void IndexExisting();
  std::string FileName(const Key& key, uint64_t ns) const;
  // Write's checks before sealing: kPresent / kDropped, or nullopt to go on.
  std::optional<WriteResult> Admit(const Key& key) EXCLUDES(mu_);
  WriteResult Enqueue(Pending item) EXCLUDES(mu_);
  void WriterLoop() EXCLUDES(mu_);
  bool WriteFile(const Pending& item);  // temp + rename; false on an I/O error
  // Removes least recently used records until `incoming` more bytes fit.
  void MakeRoom(int64_t incoming) REQUIRES(mu_);
  void Erase(const Key& key) REQUIRES(mu_);  // index and file
  void Touch(const Key& key) REQUIRES(mu_);

  const DiskStoreConfig config_;
  const int64_t record_bytes_;
  const std::shared_ptr<RecordMemory> memory_;  // the queued records' (NewRecord)
  std::string path_;
  int lock_fd_ = -1;
  std::vector<uint8_t> read_buffer_;  // Read's (one reader)

  mutable Mutex mu_;
  CondVar cv_;  // queue and writer state changed
  std::unordered_map<Key, Entry, KeyHash> index_ GUARDED_BY(mu_);
  std::list<Key> lru_ GUARDED_BY(mu_);  // front: least recently used
  int64_t bytes_ GUARDED_BY(mu_) = 0;
  std::deque<Pending> queue_ GUARDED_BY(mu_);
  std::unordered_map<Key, int, KeyHash> queued_keys_ GUARDED_BY(mu_);  // queued or being written
  int64_t queued_bytes_ GUARDED_BY(mu_) = 0;
  bool writing_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  bool logged_write_error_ = false;  // writer thread only

  std::atomic<int64_t> hits_{0}, misses_{0}, writes_{0}, write_drops_{0}, write_errors_{0};
  std::atomic<int64_t> evictions_{0}, corrupt_{0}, stale_temps_{0};
  std::atomic<int64_t> bytes_read_{0}, bytes_written_{0}, read_ns_{0};
  std::thread writer_;
};

}  // namespace ember::prompt_cache
