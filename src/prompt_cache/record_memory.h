// RecordMemory: where the RAM tier's records live. On a GPU the records are page-locked memory
// the device reads and writes itself (Backend::AllocPinnedHost): a block evicted from the pool is
// gathered straight into its record, and a restored record is scattered from where it lies, so a
// RAM hit costs the bus transfer and no host copy. The page-locked slots are taken once, up to the
// tier's cap (pinning memory is slow: tens of milliseconds a gigabyte, never on a request's path);
// a record beyond them (a batch in flight while the tier is full, a reader holding an evicted
// record) takes plain heap memory, which the backend copies through its staging as before.
//
// Invariants: a slot belongs to one RecordBuffer at a time; it goes back to the free list when
// that buffer is destroyed (a Record is shared_ptr<const RecordBuffer>, so after its last
// reader); the memory itself is freed when the RecordMemory goes, which every buffer's
// reference keeps alive. Slots are `stride` bytes apart (a multiple of 256), so every record's
// payload has the alignment its first byte has. Threads: Take and the buffers' destruction from
// any thread (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace ember::prompt_cache {

// Page-locked host memory from the backend (Backend::AllocPinnedHost / FreePinnedHost).
class PinnedAllocator {
 public:
  virtual ~PinnedAllocator() = default;
  // Null when it cannot (then the records use plain memory).
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
};

class RecordMemory;

// One record's bytes: a slot of a RecordMemory. Move-only; returns the slot when destroyed.
class RecordBuffer {
 public:
  RecordBuffer() = default;
  RecordBuffer(RecordBuffer&& other) noexcept { *this = std::move(other); }
  RecordBuffer& operator=(RecordBuffer&& other) noexcept;
  RecordBuffer(const RecordBuffer&) = delete;
  RecordBuffer& operator=(const RecordBuffer&) = delete;
  ~RecordBuffer() { Release(); }

  std::span<uint8_t> bytes() { return {data_, size_}; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  // In page-locked memory (the backend copies it without staging).
  bool pinned() const { return pinned_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class RecordMemory;
  void Release();

  std::shared_ptr<RecordMemory> memory_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

class RecordMemory : public std::enable_shared_from_this<RecordMemory> {
 public:
  // Slots of `record_bytes`; with `pinned`, up to `pinned_slots` of them page-locked, taken now
  // in pieces of at most 1 GiB (fewer when the allocator refuses: logged once).
  static std::shared_ptr<RecordMemory> Create(size_t record_bytes, int64_t pinned_slots,
                                              std::shared_ptr<PinnedAllocator> pinned);
  ~RecordMemory();
  RecordMemory(const RecordMemory&) = delete;
  RecordMemory& operator=(const RecordMemory&) = delete;

  // A free slot (page-locked when one is free), zero bytes not guaranteed.
  RecordBuffer Take() EXCLUDES(mu_);
  int64_t pinned_slots() const { return num_pinned_; }
  // Slots in use now (both kinds), and how many of them are plain memory.
  int64_t in_use() const EXCLUDES(mu_);
  int64_t plain_in_use() const EXCLUDES(mu_);

 private:
  friend class RecordBuffer;
  RecordMemory(size_t record_bytes, std::shared_ptr<PinnedAllocator> pinned);
  void Give(uint8_t* data, bool pinned) EXCLUDES(mu_);

  const size_t record_bytes_, stride_;
  const std::shared_ptr<PinnedAllocator> pinned_;
  std::vector<void*> chunks_;  // page-locked pieces, freed with this
  int64_t num_pinned_ = 0;
  mutable Mutex mu_;
  std::vector<uint8_t*> free_ GUARDED_BY(mu_);  // free page-locked slots
  int64_t in_use_ GUARDED_BY(mu_) = 0, plain_in_use_ GUARDED_BY(mu_) = 0;
};

}  // namespace ember::prompt_cache
