#include "prompt_cache/ram_store.h"

#include <chrono>

#include "prompt_cache/disk_store.h"
#include "util/check.h"
#include "util/log.h"

namespace ember::prompt_cache {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

RamStore::RamStore(const RamStoreConfig& config)
    : config_(config),
      record_bytes_(RecordBytes(config.block_size, config.payload_bytes)),
      memory_(RecordMemory::Create(static_cast<size_t>(record_bytes_),
                                   config.max_bytes / record_bytes_, config.pinned)) {
  CHECK_GT(config.max_bytes, 0);
  CHECK_GT(config.block_size, 0);
  CHECK_GT(config.payload_bytes, 0);
}

bool RamStore::Contains(const Key& key) const {
  MutexLock lock(&mu_);
  return index_.contains(key);
}

bool RamStore::Refresh(const Key& key) {
  MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return true;
}

void RamStore::Erase(const Key& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.erase(it->second.lru);
  index_.erase(it);
  bytes_ -= record_bytes_;
}

std::vector<RamStore::Evicted> RamStore::Insert(const BlockIdentity& id, RecordBuffer record) {
  CHECK_EQ(static_cast<int64_t>(record.bytes().size()), record_bytes_);
  CHECK_EQ(static_cast<int32_t>(id.tokens.size()), config_.block_size);
  std::vector<Evicted> evicted;
  if (record_bytes_ > config_.max_bytes) {
    MutexLock lock(&mu_);
    ++counts_.insert_drops;
    return evicted;
  }
  if (Refresh(id.key)) return evicted;
  WriteRecordHeader(id, record.bytes());
  auto shared = std::make_shared<const RecordBuffer>(std::move(record));
  MutexLock lock(&mu_);
  if (index_.contains(id.key)) return evicted;  // inserted meanwhile (another thread)
  while (!lru_.empty() && bytes_ + record_bytes_ > config_.max_bytes) {
    const Key victim = lru_.front();
    Entry& e = index_.at(victim);
    evicted.push_back(Evicted{victim, e.ns, std::move(e.record)});
    Erase(victim);
    ++counts_.evictions;
  }
  lru_.push_back(id.key);
  index_[id.key] = Entry{id.ns, std::move(shared), std::prev(lru_.end())};
  bytes_ += record_bytes_;
  ++counts_.inserts;
  counts_.bytes_written += record_bytes_;
  return evicted;
}

RamStore::Record RamStore::Read(const BlockIdentity& id) {
  const int64_t start = NowNs();
  Record record;
  {
    MutexLock lock(&mu_);
    auto it = index_.find(id.key);
    if (it == index_.end()) {
      ++counts_.misses;
      return nullptr;
    }
    record = it->second.record;
    lru_.splice(lru_.end(), lru_, it->second.lru);
  }
  const std::string why =
      VerifyRecord(record->bytes(), id, config_.payload_bytes, Checksum::kSkip);
  MutexLock lock(&mu_);
  if (!why.empty()) {
    LOG_WARN << "prompt cache: dropping a RAM record: " << why;
    ++counts_.corrupt_dropped;
    // Only the entry that was read (a concurrent Insert of the same key is a new record).
    auto it = index_.find(id.key);
    if (it != index_.end() && it->second.record == record) Erase(id.key);
    return nullptr;
  }
  ++counts_.hits;
  counts_.bytes_read += record_bytes_;
  counts_.read_ns += NowNs() - start;
  return record;
}

int64_t RamStore::Clear(std::optional<uint64_t> ns) {
  MutexLock lock(&mu_);
  int64_t removed = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    const Key key = *it++;
    if (ns && index_.at(key).ns != *ns) continue;
    Erase(key);
    ++removed;
  }
  return removed;
}

RamStoreStats RamStore::Stats() const {
  MutexLock lock(&mu_);
  RamStoreStats s = counts_;
  s.records = static_cast<int64_t>(index_.size());
  s.bytes = bytes_;
  s.capacity_bytes = config_.max_bytes;
  s.pinned_bytes = memory_->pinned_slots() * record_bytes_;
  return s;
}

int64_t SpillToDisk(const std::vector<RamStore::Evicted>& evicted, DiskStore& disk) {
  int64_t queued = 0;
  for (const RamStore::Evicted& out : evicted) {
    // Usually on disk already (the disk tier writes computed blocks through).
    if (disk.Contains(out.key)) continue;
    if (disk.WriteRam(out.key, out.ns, out.record) == DiskStore::WriteResult::kQueued) ++queued;
  }
  return queued;
}

}  // namespace ember::prompt_cache
