#include "prompt_cache/record_memory.h"

#include <algorithm>
#include <cstdlib>

#include "util/check.h"
#include "util/log.h"

namespace ember::prompt_cache {
namespace {

constexpr size_t kSlotAlign = 256;
constexpr size_t kMaxChunkBytes = size_t{1} << 30;

}  // namespace

RecordBuffer& RecordBuffer::operator=(RecordBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    memory_ = std::move(other.memory_);
    data_ = other.data_;
    size_ = other.size_;
    pinned_ = other.pinned_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.pinned_ = false;
  }
  return *this;
}

void RecordBuffer::Release() {
  if (data_ == nullptr) return;
  memory_->Give(data_, pinned_);
  data_ = nullptr;
  size_ = 0;
  memory_.reset();
}

RecordMemory::RecordMemory(size_t record_bytes, std::shared_ptr<PinnedAllocator> pinned)
    : record_bytes_(record_bytes),
      stride_((record_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign),
      pinned_(std::move(pinned)) {
  CHECK_GT(record_bytes, size_t{0});
}

std::shared_ptr<RecordMemory> RecordMemory::Create(size_t record_bytes, int64_t pinned_slots,
                                                   std::shared_ptr<PinnedAllocator> pinned) {
  std::shared_ptr<RecordMemory> m(new RecordMemory(record_bytes, std::move(pinned)));
  if (m->pinned_ == nullptr || pinned_slots <= 0) return m;
  const int64_t per_chunk = std::max<int64_t>(1, static_cast<int64_t>(kMaxChunkBytes / m->stride_));
  MutexLock lock(&m->mu_);
  for (int64_t left = pinned_slots; left > 0;) {
    const int64_t n = std::min(left, per_chunk);
    void* chunk = m->pinned_->Allocate(static_cast<size_t>(n) * m->stride_);
    if (chunk == nullptr) {
      LOG_WARN << "prompt cache: page-locked memory for " << left << " of " << pinned_slots
               << " RAM-tier records refused; those use plain memory (copied through staging)";
      break;
    }
    m->chunks_.push_back(chunk);
    for (int64_t i = n - 1; i >= 0; --i)
      m->free_.push_back(static_cast<uint8_t*>(chunk) + static_cast<size_t>(i) * m->stride_);
    m->num_pinned_ += n;
    left -= n;
  }
  return m;
}

RecordMemory::~RecordMemory() {
  for (void* chunk : chunks_) pinned_->Free(chunk);
}

RecordBuffer RecordMemory::Take() {
  RecordBuffer b;
  {
    MutexLock lock(&mu_);
    ++in_use_;
    if (!free_.empty()) {
      b.data_ = free_.back();
      free_.pop_back();
      b.pinned_ = true;
    } else {
      ++plain_in_use_;
    }
  }
  if (b.data_ == nullptr) {
    b.data_ = static_cast<uint8_t*>(std::aligned_alloc(kSlotAlign, stride_));
    CHECK(b.data_ != nullptr) << "out of memory for a prompt-cache record of " << stride_
                              << " bytes";
  }
  b.size_ = record_bytes_;
  b.memory_ = shared_from_this();
  return b;
}

void RecordMemory::Give(uint8_t* data, bool pinned) {
  if (!pinned) std::free(data);
  MutexLock lock(&mu_);
  --in_use_;
  if (pinned) {
    free_.push_back(data);
  } else {
    --plain_in_use_;
  }
}

int64_t RecordMemory::in_use() const {
  MutexLock lock(&mu_);
  return in_use_;
}

int64_t RecordMemory::plain_in_use() const {
  MutexLock lock(&mu_);
  return plain_in_use_;
}

}  // namespace ember::prompt_cache
