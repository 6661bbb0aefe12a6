#include "engine/state_tier.h"

#include <algorithm>
#include <cstring>

#include "engine/prompt_tier.h"  // KvBlockIo
#include "util/log.h"
#include "util/sha256.h"

namespace ember {

int64_t StateShareBytes(int64_t tier_bytes, int64_t kv_record, int64_t state_record,
                        int64_t blocks_per_checkpoint) {
  if (tier_bytes < kv_record + state_record) return 0;
  const double share = static_cast<double>(state_record) /
                       (static_cast<double>(state_record) +
                        static_cast<double>(std::max<int64_t>(1, blocks_per_checkpoint)) *
                            static_cast<double>(kv_record));
  const auto bytes = static_cast<int64_t>(static_cast<double>(tier_bytes) * share);
  return std::clamp(bytes, state_record, tier_bytes - kv_record);
}

Result<std::unique_ptr<StateTier>> StateTier::Open(const StateTierConfig& config) {
  const prompt_cache::Key fingerprint = Sha256()
                                            .Update("ember recurrent-state record v")
                                            .UpdateU64(kStateRecordVersion)
                                            .Update(config.kv_fingerprint)
                                            .UpdateU64(static_cast<uint64_t>(config.state_bytes))
                                            .Finish();
  auto tier = std::unique_ptr<StateTier>(new StateTier(config, fingerprint));
  if (config.ram_bytes > 0) {
    prompt_cache::RamStoreConfig ram;
    ram.max_bytes = config.ram_bytes;
    ram.fingerprint = fingerprint;
    ram.block_size = config.block_size;
    ram.payload_bytes = config.state_bytes;
    tier->ram_ = std::make_unique<prompt_cache::RamStore>(ram);
  }
  if (!config.dir.empty()) {
    prompt_cache::DiskStoreConfig disk;
    disk.dir = config.dir;
    disk.max_bytes = config.disk_bytes;
    disk.fingerprint = fingerprint;
    disk.fingerprint_text = "recurrent-state checkpoints, record version " +
                            std::to_string(kStateRecordVersion) + ", " +
                            std::to_string(config.state_bytes) + " bytes each, of the blocks of:\n" +
                            config.kv_fingerprint_text;
    disk.block_size = config.block_size;
    disk.payload_bytes = config.state_bytes;
    disk.max_queue_bytes = config.max_queue_bytes;
    EMBER_ASSIGN_OR_RETURN(tier->disk_, prompt_cache::DiskStore::Open(disk));
  }
  if (tier->ram_ != nullptr && tier->disk_ != nullptr) {
    // One checkpoint per waiting request: at most a RAM's worth waits.
    const int64_t records = config.ram_bytes / tier->ram_->record_bytes();
    tier->prefetcher_ = std::make_unique<prompt_cache::Prefetcher>(
        tier->ram_.get(), tier->disk_.get(), std::max<int64_t>(1, records));
  }
  return tier;
}

StateTier::StateTier(const StateTierConfig& config, const prompt_cache::Key& fingerprint)
    : config_(config), fingerprint_(fingerprint) {}

prompt_cache::BlockIdentity StateTier::Of(prompt_cache::BlockIdentity kv) const {
  kv.fingerprint = fingerprint_;
  return kv;
}

bool StateTier::Has(const prompt_cache::Key& key) const {
  return (ram_ != nullptr && ram_->Contains(key)) || (disk_ != nullptr && disk_->Contains(key));
}

bool StateTier::Read(const prompt_cache::BlockIdentity& kv, std::vector<uint8_t>* state) {
  const prompt_cache::BlockIdentity id = Of(kv);
  std::span<const uint8_t> payload;
  prompt_cache::RamStore::Record record;
  // A checkpoint the prefetcher is reading now is waited for (not read twice); it lands in RAM.
  const bool in_ram = ram_ != nullptr && (ram_->Contains(id.key) ||
                                          (prefetcher_ != nullptr &&
                                           prefetcher_->WaitIfFetching(id.key)));
  if (in_ram && (record = ram_->Read(id)) != nullptr) {
    payload = prompt_cache::RecordPayload(record->bytes(), config_.block_size, config_.state_bytes);
  } else if (disk_ != nullptr) {
    payload = disk_->Read(id);  // absent or refused (counted by the store): empty
  }
  if (payload.empty()) return false;
  state->assign(payload.begin(), payload.end());
  return true;
}

void StateTier::Prefetch(prompt_cache::PrefetchBlock block) {
  if (prefetcher_ == nullptr || ram_->Contains(block.key) || !disk_->Contains(block.key)) return;
  std::vector<prompt_cache::PrefetchBlock> job;
  job.push_back(std::move(block));
  prefetcher_->Enqueue(std::move(job));  // dropped (counted) when the queue is full
}

bool StateTier::CopyOut(int32_t slot, std::span<uint8_t> record, KvBlockIo& io) {
  const Status st = io.CopyStateToHost(
      slot, record.subspan(prompt_cache::PayloadOffset(config_.block_size),
                           static_cast<size_t>(config_.state_bytes)));
  if (!st.ok()) {
    if (copy_failures_++ == 0) {
      LOG_WARN << "prompt cache: cannot copy a state checkpoint out: " << st.message();
    }
    return false;
  }
  return true;
}

void StateTier::WriteThrough(const prompt_cache::BlockIdentity& kv, int32_t slot, KvBlockIo& io) {
  if (disk_ == nullptr || disk_->Contains(kv.key)) return;
  prompt_cache::RecordBuffer record = disk_->NewRecord();
  // Dropped when the queue is full.
  if (CopyOut(slot, record.bytes(), io)) disk_->Write(Of(kv), std::move(record));
}

void StateTier::Demote(const prompt_cache::BlockIdentity& kv, int32_t slot, KvBlockIo& io) {
  if (ram_ == nullptr || ram_->Refresh(kv.key)) return;
  prompt_cache::RecordBuffer record = ram_->NewRecord();
  if (!CopyOut(slot, record.bytes(), io)) return;
  const std::vector<prompt_cache::RamStore::Evicted> evicted =
      ram_->Insert(Of(kv), std::move(record));
  if (disk_ != nullptr) prompt_cache::SpillToDisk(evicted, *disk_);
}

int64_t StateTier::Clear(std::optional<uint64_t> ns) {
  int64_t removed = 0;
  if (prefetcher_ != nullptr) prefetcher_->DropQueued();
  if (ram_ != nullptr) removed += ram_->Clear(ns);
  if (disk_ != nullptr) removed += disk_->Clear(ns);
  return removed;
}

void StateTier::AddStats(PromptCacheStats* s) const {
  s->state_checkpoints = true;
  if (disk_ != nullptr) {
    const prompt_cache::DiskStoreStats d = disk_->Stats();
    s->state_records = d.records;
    s->state_bytes = d.bytes;
    s->state_hits = d.hits;
    s->bytes += d.bytes;
    s->capacity_bytes += d.capacity_bytes;
    s->evictions += d.evictions;
    s->corrupt_dropped += d.corrupt_dropped;
    s->write_drops += d.write_drops;
    s->write_errors += d.write_errors;
    s->stale_temps_removed += d.stale_temps_removed;
    s->queued_bytes += d.queued_bytes;
  }
  if (ram_ != nullptr) {
    const prompt_cache::RamStoreStats r = ram_->Stats();
    PromptCacheRamStats& m = s->ram;
    m.state_records = r.records;
    m.state_bytes = r.bytes;
    m.state_hits = r.hits;
    m.bytes += r.bytes;
    m.capacity_bytes += r.capacity_bytes;
    m.evictions += r.evictions;
    m.corrupt_dropped += r.corrupt_dropped;
    m.insert_drops += r.insert_drops;
  }
  if (prefetcher_ != nullptr) {
    const prompt_cache::PrefetcherStats f = prefetcher_->Stats();
    PromptCacheRamStats& m = s->ram;
    m.state_prefetched = f.fetched;
    m.prefetch_failed += f.failed;
    m.prefetch_dropped += f.dropped_jobs;
    m.spills += f.spills;
  }
}

}  // namespace ember
