#include "engine/prompt_tier.h"

#include <algorithm>

#include "util/check.h"
#include "util/log.h"

namespace ember {

const char* PromptCacheChoiceName(PromptCacheStats::Choice choice) {
  switch (choice) {
    case PromptCacheStats::Choice::kNone: return "none";
    case PromptCacheStats::Choice::kLoad: return "load";
    case PromptCacheStats::Choice::kLoadUnmeasured: return "load_unmeasured";
    case PromptCacheStats::Choice::kRecompute: return "recompute";
  }
  return "none";
}

bool LoadBeatsRecompute(int64_t num_blocks, int64_t record_bytes, int32_t block_size,
                        double read_bytes_per_s, double prefill_tokens_per_s) {
  const double load_s = static_cast<double>(num_blocks) * record_bytes / read_bytes_per_s;
  const double compute_s = static_cast<double>(num_blocks) * block_size / prefill_tokens_per_s;
  return load_s < compute_s;
}

PromptTier::PromptTier(const PromptTierShape& shape, std::unique_ptr<prompt_cache::RamStore> ram,
                       std::unique_ptr<prompt_cache::DiskStore> disk,
                       PromptCacheConfig::Reuse reuse, KvBlockIo* io, kv::KvCacheManager* kv,
                       const EngineStats* counters)
    : shape_(shape),
      ram_(std::move(ram)),
      disk_(std::move(disk)),
      reuse_(reuse),
      io_(io),
      kv_(kv),
      counters_(counters),
      block_size_(shape.block_size) {
  CHECK(ram_ != nullptr || disk_ != nullptr);
  if (ram_ != nullptr) {
    tags_.resize(static_cast<size_t>(shape.num_blocks));
    kv_->set_eviction_observer(this);
  }
  if (ram_ != nullptr && disk_ != nullptr) {
    // At most a RAM's worth of blocks waits: more would evict what it fetched first.
    prefetcher_ = std::make_unique<prompt_cache::Prefetcher>(
        ram_.get(), disk_.get(), std::max<int64_t>(1, MaxPrefetchBlocks()));
  }
}

int64_t PromptTier::MaxPrefetchBlocks() const {
  return ram_->config().max_bytes / ram_->record_bytes();
}

void PromptTier::Prefetch(const GenerationRequest& request, const kv::KvCacheManager& kv) {
  // As Scheduler::AdmitWaiting: requests that need every prompt row computed skip the cache.
  if (prefetcher_ == nullptr || request.prompt_logprobs >= 0 ||
      request.pooling.kind != PoolingKind::kNone || request.prompt_ids.size() < 2)
    return;
  const std::span<const int32_t> prompt(request.prompt_ids);
  const auto bs = static_cast<size_t>(block_size_);
  const auto max_blocks = static_cast<int32_t>((prompt.size() - 1) / bs);
  const int32_t first = kv.PeekCachedPrefix(prompt, request.cache_namespace) / block_size_;
  if (first >= max_blocks) return;
  // Half of RAM at most per request: a longer prefix's head would be evicted by its own tail.
  const int64_t cap = std::max<int64_t>(1, MaxPrefetchBlocks() / 2);
  std::vector<prompt_cache::PrefetchBlock> job;
  // A hybrid model: the checkpoint the admission will resume from, at the last block of the run
  // found below the pool that has one (ExtendCachedPrefix's choice, before the cost rule).
  std::optional<prompt_cache::PrefetchBlock> state;
  prompt_cache::Key parent =
      prompt_cache::RootKey(shape_.fingerprint, request.cache_namespace, request.cache_salt);
  for (int32_t j = 0; j < max_blocks; ++j) {
    if (static_cast<int64_t>(job.size()) >= cap && states_ == nullptr) break;
    const std::span<const int32_t> tokens = prompt.subspan(static_cast<size_t>(j) * bs, bs);
    const prompt_cache::Key key = prompt_cache::ChainKey(parent, tokens);
    if (j >= first) {
      const bool in_ram = ram_->Contains(key);
      if (!in_ram && !disk_->Contains(key)) break;
      prompt_cache::PrefetchBlock block{key, parent, request.cache_namespace,
                                        {tokens.begin(), tokens.end()}};
      if (states_ != nullptr && states_->Has(key)) state = block;
      if (!in_ram && static_cast<int64_t>(job.size()) < cap) job.push_back(std::move(block));
    }
    parent = key;
  }
  prefetcher_->Enqueue(std::move(job));
  if (state.has_value()) states_->Prefetch(std::move(*state));
}

PromptTier::~PromptTier() {
  if (ram_ != nullptr) kv_->set_eviction_observer(nullptr);
  ReleasePinnedReads(/*wait=*/true);
}

void PromptTier::ReleasePinnedReads(bool wait) {
  if (!pinned_reads_.empty() && io_->PinnedReadsDone(wait)) pinned_reads_.clear();
}

prompt_cache::Key PromptTier::RootOf(const Sequence& seq) const {
  const GenerationRequest& request = seq.request->request;
  return prompt_cache::RootKey(shape_.fingerprint, request.cache_namespace, request.cache_salt);
}

void PromptTier::EnsureKeys(Sequence& seq, int32_t num_blocks) const {
  const size_t bs = static_cast<size_t>(block_size_);
  while (static_cast<int32_t>(seq.tier_keys.size()) < num_blocks) {
    const size_t j = seq.tier_keys.size();
    if ((j + 1) * bs > seq.tokens.size()) return;
    const std::span<const int32_t> tokens = std::span<const int32_t>(seq.tokens).subspan(j * bs, bs);
    // A placeholder (an in-flight sampled token, -1 - r) is not content yet.
    if (std::ranges::any_of(tokens, [](int32_t t) { return t < 0; })) return;
    const prompt_cache::Key parent = j == 0 ? RootOf(seq) : seq.tier_keys[j - 1];
    seq.tier_keys.push_back(prompt_cache::ChainKey(parent, tokens));
  }
}

prompt_cache::BlockIdentity PromptTier::Identity(const Sequence& seq, int32_t block) const {
  const auto j = static_cast<size_t>(block);
  prompt_cache::BlockIdentity id;
  id.fingerprint = shape_.fingerprint;
  id.parent = j == 0 ? RootOf(seq) : seq.tier_keys[j - 1];
  id.key = seq.tier_keys[j];
  id.ns = seq.request->request.cache_namespace;
  id.tokens = std::span<const int32_t>(seq.tokens).subspan(j * block_size_, block_size_);
  return id;
}

namespace {
double Rate(int64_t bytes, int64_t ns) {
  return ns > 0 ? static_cast<double>(bytes) * 1e9 / static_cast<double>(ns) : 0.0;
}
}  // namespace

double PromptTier::RamReadBytesPerSecond() const {
  if (ram_ == nullptr) return 0.0;
  const prompt_cache::RamStoreStats s = ram_->Stats();
  return Rate(s.bytes_read, s.read_ns);
}

double PromptTier::DiskReadBytesPerSecond() const {
  if (disk_ == nullptr) return 0.0;
  const prompt_cache::DiskStoreStats s = disk_->Stats();
  return Rate(s.bytes_read, s.read_ns);
}

double PromptTier::PrefillTokensPerSecond() const {
  const int64_t tokens =
      counters_->computed_tokens - counters_->decode_rows - counters_->decode_padding_rows;
  const int64_t ns = counters_->forward_ns - counters_->decode_forward_ns;
  return ns > 0 && tokens > 0 ? static_cast<double>(tokens) * 1e9 / ns : 0.0;
}

bool PromptTier::ShouldLoad(int32_t in_ram, int32_t on_disk) {
  const double ram_rate = in_ram > 0 ? RamReadBytesPerSecond() : 0.0;
  const double disk_rate = on_disk > 0 ? DiskReadBytesPerSecond() : 0.0;
  const bool measured =
      (in_ram == 0 || ram_rate > 0) && (on_disk == 0 || disk_rate > 0);
  const int32_t n = in_ram + on_disk;
  // A hybrid model's hit also reads one state checkpoint: spread over the blocks.
  const double record =
      static_cast<double>(prompt_cache::RecordBytes(block_size_, shape_.payload_bytes)) +
      (states_ != nullptr ? static_cast<double>(states_->record_bytes()) / n : 0.0);
  // The blocks' bytes over the time both tiers take to read them: one rate for the cost rule.
  const double seconds = (in_ram > 0 && ram_rate > 0 ? in_ram * record / ram_rate : 0.0) +
                         (on_disk > 0 && disk_rate > 0 ? on_disk * record / disk_rate : 0.0);
  last_read_bytes_per_s_ = measured && seconds > 0 ? n * record / seconds : 0.0;
  last_prefill_tokens_per_s_ = PrefillTokensPerSecond();
  bool load = true;
  if (reuse_ == PromptCacheConfig::Reuse::kAlways) {
    last_choice_ = PromptCacheStats::Choice::kLoad;
  } else if (last_read_bytes_per_s_ <= 0 || last_prefill_tokens_per_s_ <= 0) {
    last_choice_ = PromptCacheStats::Choice::kLoadUnmeasured;  // the load measures the rate
  } else {
    load = LoadBeatsRecompute(n, static_cast<int64_t>(record), block_size_,
                              last_read_bytes_per_s_, last_prefill_tokens_per_s_);
    last_choice_ = load ? PromptCacheStats::Choice::kLoad : PromptCacheStats::Choice::kRecompute;
  }
  ++(load ? loads_ : recomputes_);
  return load;
}

int32_t PromptTier::FindBelow(const Sequence& seq, int32_t first, int32_t known, int32_t* on_disk,
                              int32_t* in_ram_run) const {
  int32_t found = 0;
  *on_disk = 0;
  *in_ram_run = 0;
  for (; first + found < known; ++found) {
    const prompt_cache::Key& key = seq.tier_keys[static_cast<size_t>(first + found)];
    if (ram_ != nullptr && ram_->Contains(key)) {
      if (*on_disk == 0) ++*in_ram_run;
    } else if (disk_ != nullptr && disk_->Contains(key)) {
      ++*on_disk;
    } else {
      break;
    }
  }
  return found;
}

bool PromptTier::Restore(const Sequence& seq, int32_t j, int32_t block_id) {
  const prompt_cache::BlockIdentity id = Identity(seq, j);
  prompt_cache::RamStore::Record record;
  std::span<const uint8_t> payload;
  bool from_ram = false;
  // A block the prefetcher is reading now is waited for (not read twice); it lands in RAM.
  const bool in_ram = ram_ != nullptr && (ram_->Contains(id.key) ||
                                          (prefetcher_ != nullptr &&
                                           prefetcher_->WaitIfFetching(id.key)));
  if (in_ram && (record = ram_->Read(id)) != nullptr) {
    payload = prompt_cache::RecordPayload(record->bytes(), block_size_, shape_.payload_bytes);
    from_ram = true;
  } else if (disk_ != nullptr) {
    payload = disk_->Read(id);  // evicted meanwhile, or refused (counted by the store): empty
  }
  if (payload.empty()) return false;
  // A page-locked record is read by the device where it lies, later: it is held until then.
  const bool pinned = record != nullptr && record->pinned();
  const Status st = pinned ? io_->CopyBlockFromPinned(block_id, payload)
                           : io_->CopyBlockFromHost(block_id, payload);
  if (pinned && st.ok()) pinned_reads_.push_back(std::move(record));
  if (!st.ok()) {
    LOG_WARN << "prompt cache: cannot restore a block: " << st.message();
    ++promote_failures_;
    return false;
  }
  ++(from_ram ? ram_promotions_ : disk_promotions_);
  return true;
}

int32_t PromptTier::ExtendCachedPrefix(Sequence& seq, int32_t pool_tokens, kv::KvCacheManager& kv,
                                       int32_t budget_tokens) {
  // As the pool: whole blocks only, and the prompt's last token is always computed.
  const int32_t max_blocks = (seq.num_tokens() - 1) / block_size_;
  const int32_t first = pool_tokens / block_size_;
  if (first >= max_blocks) return pool_tokens;
  ReleasePinnedReads(/*wait=*/false);
  FlushDemotions();  // blocks evicted since the last flush are in RAM when looked up
  EnsureKeys(seq, max_blocks);
  const int32_t known = std::min<int32_t>(max_blocks, static_cast<int32_t>(seq.tier_keys.size()));
  ++lookups_;
  int32_t on_disk = 0, in_ram_run = 0;
  int32_t found = FindBelow(seq, first, known, &on_disk, &in_ram_run);
  if (ram_ != nullptr && in_ram_run == 0) ++ram_lookup_misses_;
  if (found == 0) {
    ++lookup_misses_;
    return pool_tokens;
  }
  if (!ShouldLoad(found - on_disk, on_disk)) {
    // The disk's part is not worth it: the RAM run before it may still be.
    if (in_ram_run == 0 || !ShouldLoad(in_ram_run, 0)) return pool_tokens;
    found = in_ram_run;
  }
  if (states_ != nullptr && (found = ResumableBlocks(seq, first, found)) == 0) {
    ++state_misses_;
    return pool_tokens;
  }
  // Most recently used now: the evictions Allocate may cause below push other records out first.
  if (ram_ != nullptr)
    for (int32_t j = first; j < first + found; ++j) ram_->Refresh(seq.tier_keys[static_cast<size_t>(j)]);
  const int32_t restored_end = (first + found) * block_size_;
  // Read nothing unless the whole admission fits now (else it is retried on a later step).
  const int32_t admitted_end = std::min(seq.num_tokens(), restored_end + budget_tokens);
  if (kv.NumBlocksNeeded(seq.id, admitted_end) > kv.NumFreeBlocks() ||
      // Allocating may evict cached pool blocks into RAM (OnEvict), which may push this prompt's
      // own RAM records out to disk: Restore reads either tier.
      !kv.Allocate(seq.id, restored_end)) {
    seq.tier_state.clear();
    return pool_tokens;
  }
  FlushDemotions();  // what Allocate evicted, before blocks are restored into
  const std::vector<int32_t>& table = kv.BlockTable(seq.id);
  int32_t loaded = 0;
  while (loaded < found && Restore(seq, first + loaded, table[static_cast<size_t>(first + loaded)]))
    ++loaded;
  if (states_ != nullptr) {
    // The state read is the one at the end of all `found` blocks: with fewer, an earlier
    // checkpoint among the restored ones, or none (restored blocks are recomputed in place).
    if (loaded < found && (loaded = ResumableBlocks(seq, first, loaded)) == 0) return pool_tokens;
    ++state_restores_;
  }
  // Blocks past `loaded` stay allocated: they are recomputed in place.
  return (first + loaded) * block_size_;
}

int32_t PromptTier::ResumableBlocks(Sequence& seq, int32_t first, int32_t found) {
  for (int32_t n = found; n > 0; --n) {
    const int32_t j = first + n - 1;
    if (states_->Has(seq.tier_keys[static_cast<size_t>(j)]) &&
        states_->Read(Identity(seq, j), &seq.tier_state))
      return n;
  }
  seq.tier_state.clear();
  return 0;
}

void PromptTier::AttachStates(std::unique_ptr<StateTier> states,
                              const kv::StateCheckpoints* checkpoints) {
  CHECK(states != nullptr && checkpoints != nullptr);
  states_ = std::move(states);
  checkpoints_ = checkpoints;
}

void PromptTier::OnCheckpoint(Sequence& seq, int32_t num_blocks, int32_t slot) {
  if (states_ == nullptr || states_->disk() == nullptr || slot < 0) return;
  EnsureKeys(seq, num_blocks);
  if (static_cast<int32_t>(seq.tier_keys.size()) < num_blocks) return;
  states_->WriteThrough(Identity(seq, num_blocks - 1), slot, *io_);
}

void PromptTier::TagBlocks(Sequence& seq, int32_t keyed, const std::vector<int32_t>& table,
                           const kv::KvCacheManager& kv) {
  const kv::PrefixCache& cache = kv.prefix_cache();
  const uint64_t ns = seq.request->request.cache_namespace;
  for (int32_t j = seq.tier_blocks_tagged; j < keyed; ++j) {
    const int32_t b = table[static_cast<size_t>(j)];
    // Another sequence's block holds this content when this one's is not registered (its owner
    // tagged it). Tokens and namespace are checked so a tag never names other content.
    if (!cache.is_cached(b) || cache.ns(b) != ns ||
        !std::ranges::equal(cache.Tokens(b), Identity(seq, j).tokens))
      continue;
    PoolTag& tag = tags_[static_cast<size_t>(b)];
    tag.key = seq.tier_keys[static_cast<size_t>(j)];
    tag.parent = j == 0 ? RootOf(seq) : seq.tier_keys[static_cast<size_t>(j) - 1];
    tag.epoch = cache.Ref(b).epoch;
    tag.valid = true;
  }
  seq.tier_blocks_tagged = std::max(seq.tier_blocks_tagged, keyed);
}

template <typename Store>
Result<std::vector<prompt_cache::RecordBuffer>> PromptTier::CopyOut(
    std::span<const int32_t> blocks, Store& store) {
  std::vector<prompt_cache::RecordBuffer> records;
  std::vector<std::span<uint8_t>> payloads;
  records.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    records.push_back(store.NewRecord());
    payloads.push_back(records.back().bytes().subspan(prompt_cache::PayloadOffset(block_size_),
                                                      static_cast<size_t>(shape_.payload_bytes)));
  }
  EMBER_RETURN_IF_ERROR(io_->CopyBlocksToHost(blocks, payloads));
  return records;
}

void PromptTier::WriteThrough(Sequence& seq, int32_t keyed, const std::vector<int32_t>& table) {
  // No more than the writer's queue takes now is copied out (the rest would be dropped after the
  // copy); the blocks from the first one that did not fit stay for the sequence's next commit
  // (tier_blocks_stored stops there), as the writer drains.
  const int64_t room = disk_->QueueRoom();
  if (room == 0) return;
  std::vector<int32_t> indices, blocks;
  int32_t next = keyed;  // the first block neither stored nor queued after this call
  for (int32_t j = seq.tier_blocks_stored; j < keyed; ++j) {
    if (disk_->Contains(seq.tier_keys[static_cast<size_t>(j)])) continue;
    if (static_cast<int64_t>(blocks.size()) == room) {
      next = j;
      break;
    }
    indices.push_back(j);
    blocks.push_back(table[static_cast<size_t>(j)]);
  }
  if (!blocks.empty()) {
    Result<std::vector<prompt_cache::RecordBuffer>> records = CopyOut(blocks, *disk_);
    if (!records.ok()) {
      LOG_WARN << "prompt cache: cannot copy blocks out: " << records.message();
      return;  // retried at the next commit
    }
    for (size_t i = 0; i < indices.size(); ++i) {
      // Dropped when the queue filled meanwhile (the RAM tier spills from the prefetcher
      // thread): retried later.
      if (disk_->Write(Identity(seq, indices[i]), std::move((*records)[i])) ==
          prompt_cache::DiskStore::WriteResult::kDropped)
        next = std::min(next, indices[i]);
    }
  }
  seq.tier_blocks_stored = std::max(seq.tier_blocks_stored, next);
}

void PromptTier::CommitComputed(Sequence& seq, int32_t num_computed,
                                const kv::KvCacheManager& kv) {
  if (!kv.Has(seq.id)) return;
  const std::vector<int32_t>& table = kv.BlockTable(seq.id);
  const int32_t full = static_cast<int32_t>(
      std::min<int64_t>({num_computed, seq.num_tokens(),
                         static_cast<int64_t>(table.size()) * block_size_}) /
      block_size_);
  const bool tags = ram_ != nullptr && full > seq.tier_blocks_tagged;
  const bool writes = disk_ != nullptr && full > seq.tier_blocks_stored;
  if (!tags && !writes) return;
  EnsureKeys(seq, full);
  const int32_t keyed = std::min<int32_t>(full, static_cast<int32_t>(seq.tier_keys.size()));
  if (tags) TagBlocks(seq, keyed, table, kv);
  if (writes) WriteThrough(seq, keyed, table);
}

void PromptTier::OnEvict(int32_t block_id) {
  const kv::PrefixCache& cache = kv_->prefix_cache();
  PoolTag& tag = tags_[static_cast<size_t>(block_id)];
  if (!tag.valid || tag.epoch != cache.Ref(block_id).epoch) return;  // untagged: recomputed
  tag.valid = false;
  Demotion d;
  d.block_id = block_id;
  d.id.fingerprint = shape_.fingerprint;
  d.id.parent = tag.parent;
  d.id.key = tag.key;
  d.id.ns = cache.ns(block_id);
  const std::span<const int32_t> tokens = cache.Tokens(block_id);
  d.tokens.assign(tokens.begin(), tokens.end());
  d.id.tokens = d.tokens;  // (the vector's heap buffer: moves keep it)
  if (checkpoints_ != nullptr) {  // its live checkpoint goes down with it
    if (const int32_t slot = checkpoints_->Find(cache.Ref(block_id)); slot >= 0)
      states_->Demote(d.id, slot, *io_);
  }
  if (ram_->Refresh(tag.key)) return;  // held already (restored from RAM, or evicted before)
  d.clears = clears_.load(std::memory_order_relaxed);
  demotions_.push_back(std::move(d));
}

void PromptTier::FlushDemotions() {
  if (demotions_.empty()) return;
  // In batches: a full RAM frees a batch's worth of (page-locked) slots as it inserts one, and
  // the next batch takes them.
  constexpr size_t kBatch = 64;
  std::vector<int32_t> blocks;
  for (size_t first = 0; first < demotions_.size(); first += kBatch) {
    const size_t n = std::min(kBatch, demotions_.size() - first);
    blocks.clear();
    for (size_t i = first; i < first + n; ++i) blocks.push_back(demotions_[i].block_id);
    Result<std::vector<prompt_cache::RecordBuffer>> records = CopyOut(blocks, *ram_);
    if (!records.ok()) {
      LOG_WARN << "prompt cache: cannot copy " << n
               << " evicted blocks to RAM: " << records.message();
      ram_demote_failures_ += static_cast<int64_t>(n);
      continue;
    }
    const uint64_t clears = clears_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) {
      const Demotion& d = demotions_[first + i];
      if (d.clears != clears) continue;  // a Clear came since it was evicted: not kept
      ++ram_demotions_;
      const std::vector<prompt_cache::RamStore::Evicted> evicted =
          ram_->Insert(d.id, std::move((*records)[i]));
      if (disk_ != nullptr) ram_spills_ += prompt_cache::SpillToDisk(evicted, *disk_);
    }
  }
  demotions_.clear();
}

PromptCacheCleared PromptTier::Clear(std::optional<uint64_t> ns) {
  PromptCacheCleared removed;
  clears_.fetch_add(1, std::memory_order_relaxed);  // queued demotions are not kept
  if (prefetcher_ != nullptr) prefetcher_->DropQueued();
  if (ram_ != nullptr) removed.ram_blocks = ram_->Clear(ns);
  if (disk_ != nullptr) removed.disk_blocks = disk_->Clear(ns);
  if (states_ != nullptr) removed.state_checkpoints = states_->Clear(ns);
  return removed;
}

void PromptTier::StoreStats(PromptCacheStats* out) const {
  PromptCacheStats& s = *out;
  if (disk_ != nullptr) {
    const prompt_cache::DiskStoreStats d = disk_->Stats();
    s.enabled = true;
    s.records = d.records;
    s.bytes = d.bytes;
    s.capacity_bytes = d.capacity_bytes;
    s.queued_bytes = d.queued_bytes;
    s.hits = d.hits;
    s.misses = d.misses;
    s.evictions = d.evictions;
    s.writes = d.writes;
    s.write_drops = d.write_drops;
    s.write_errors = d.write_errors;
    s.corrupt_dropped = d.corrupt_dropped;
    s.stale_temps_removed = d.stale_temps_removed;
    s.bytes_read = d.bytes_read;
    s.bytes_written = d.bytes_written;
    s.read_bytes_per_s = Rate(d.bytes_read, d.read_ns);
  }
  if (ram_ != nullptr) {
    const prompt_cache::RamStoreStats r = ram_->Stats();
    PromptCacheRamStats& m = s.ram;
    m.enabled = true;
    m.records = r.records;
    m.bytes = r.bytes;
    m.capacity_bytes = r.capacity_bytes;
    m.pinned_bytes = r.pinned_bytes;
    m.hits = r.hits;
    m.misses = r.misses;
    m.evictions = r.evictions;
    m.insert_drops = r.insert_drops;
    m.corrupt_dropped = r.corrupt_dropped;
    m.bytes_read = r.bytes_read;
    m.bytes_written = r.bytes_written;
    m.read_bytes_per_s = Rate(r.bytes_read, r.read_ns);
    m.spills = ram_spills_.load();
  }
  if (prefetcher_ != nullptr) {
    const prompt_cache::PrefetcherStats f = prefetcher_->Stats();
    s.ram.prefetched = f.fetched;
    s.ram.prefetch_failed = f.failed;
    s.ram.prefetch_dropped = f.dropped_jobs;
    s.ram.spills += f.spills;
  }
  if (states_ != nullptr) states_->AddStats(&s);
}

PromptCacheStats PromptTier::Stats() const {
  PromptCacheStats s;
  StoreStats(&s);
  s.lookups = lookups_;
  s.lookup_misses = lookup_misses_;
  s.promotions = disk_promotions_;
  s.loads = loads_;
  s.recomputes = recomputes_;
  s.prefill_tokens_per_s = PrefillTokensPerSecond();
  s.last_read_bytes_per_s = last_read_bytes_per_s_;
  s.last_prefill_tokens_per_s = last_prefill_tokens_per_s_;
  s.last_choice = last_choice_;
  s.ram.lookup_misses = ram_lookup_misses_;
  s.ram.promotions = ram_promotions_;
  s.ram.demotions = ram_demotions_;
  s.ram.demote_failures = ram_demote_failures_;
  s.state_restores = state_restores_;
  s.state_misses = state_misses_;
  return s;
}

}  // namespace ember
