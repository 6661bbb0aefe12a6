// Prefetcher: moves the blocks of a waiting request's prefix from the disk tier into the RAM tier
// on its own thread, so that the request's admission restores them from RAM (a memory copy)
// instead of reading the disk on the engine thread, and a queue of requests does not stall the
// engine's steps on disk reads. The engine glue (engine/prompt_tier.h) decides what to fetch when
// a request arrives: the whole blocks past the pool's hit that RAM lacks and the disk holds.
//
// Invariants: a block reaches RAM only through DiskStore::ReadRecord (size, header, token ids and
// checksum verified against the block's full identity) and RamStore::Insert; a block that fails
// ends its prefix's job (the blocks after it would not be reachable). What RAM evicts to make room
// goes to the disk writer (SpillToDisk). The queue is bounded in blocks; a job that does not fit
// is dropped and counted (the admission then reads the disk itself, as without a prefetcher).
// An admission that needs a block of the job being fetched now, or of the next one, waits for it
// (WaitIfFetching) rather than read the same file twice: it then copies block j into the pool
// while the worker reads block j + 1. Blocks of jobs further back in the queue are not waited for.
// Threads: Enqueue, WaitIfFetching, Drain and Stats from any thread; one worker does the reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "prompt_cache/block_record.h"
#include "prompt_cache/disk_store.h"
#include "prompt_cache/ram_store.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember::prompt_cache {

// One block to fetch: what BlockIdentity names, with its own copy of the token ids.
struct PrefetchBlock {
  Key key{}, parent{};
  uint64_t ns = 0;
  std::vector<int32_t> tokens;  // [block_size]
};

struct PrefetcherStats {
  int64_t fetched = 0;       // blocks read from disk into RAM
  int64_t failed = 0;        // reads that found the block gone or refused it (job ended there)
  int64_t dropped_jobs = 0;  // jobs refused: the queue was full
  int64_t spills = 0;        // RAM evictions the fetches caused that were queued for the disk
  int64_t queued_blocks = 0;
};

class Prefetcher {
 public:
  // `ram` and `disk` must outlive this; their fingerprint is the records'.
  Prefetcher(RamStore* ram, DiskStore* disk, int64_t max_queued_blocks);
  // Stops the worker (what is still queued is dropped) and joins it.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Queues one prefix's blocks in chain order; false (and counted) when the queue is full.
  bool Enqueue(std::vector<PrefetchBlock> blocks) EXCLUDES(mu_);
  // When `key` is a block of the job in progress not done yet, or of the job that starts next,
  // waits until it is done (in RAM, or failed) and returns true; else returns false at once.
  bool WaitIfFetching(const Key& key) EXCLUDES(mu_);
  // Drops the queued jobs (a cache clear); the job in progress finishes.
  void DropQueued() EXCLUDES(mu_);
  // Waits until every queued job is done (tests, benchmarks).
  void Drain() EXCLUDES(mu_);
  PrefetcherStats Stats() const EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);
  void Fetch(const std::vector<PrefetchBlock>& job, RecordBuffer& buffer) EXCLUDES(mu_);
  // The job in progress has finished its blocks before `next` (all of them: job.size()).
  void Advance(size_t next) EXCLUDES(mu_);

  RamStore* ram_;
  DiskStore* disk_;
  const int64_t max_queued_blocks_;
  mutable Mutex mu_;
  CondVar cv_;  // queue or worker state changed
  std::deque<std::vector<PrefetchBlock>> queue_ GUARDED_BY(mu_);
  int64_t queued_blocks_ GUARDED_BY(mu_) = 0;
  bool busy_ GUARDED_BY(mu_) = false;
  // The job in progress: its keys, and how many of them are done.
  std::vector<Key> fetching_ GUARDED_BY(mu_);
  size_t fetched_in_job_ GUARDED_BY(mu_) = 0;
  uint64_t job_number_ GUARDED_BY(mu_) = 0;  // jobs started
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<int64_t> fetched_{0}, failed_{0}, dropped_jobs_{0}, spills_{0};
  std::thread worker_;
};

}  // namespace ember::prompt_cache
