#include "engine/prompt_tier.h"

#include <algorithm>

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

PromptTier::PromptTier(std::unique_ptr<prompt_cache::DiskStore> disk,
                       PromptCacheConfig::Reuse reuse, KvBlockIo* io, const EngineStats* counters)
    : disk_(std::move(disk)),
      reuse_(reuse),
      io_(io),
      counters_(counters),
      block_size_(disk_->config().block_size) {}

void PromptTier::EnsureKeys(Sequence& seq, int32_t num_blocks) const {
  const size_t bs = static_cast<size_t>(block_size_);
  const GenerationRequest& request = seq.request->request;
  while (static_cast<int32_t>(seq.tier_keys.size()) < num_blocks) {
    const size_t j = seq.tier_keys.size();
    if ((j + 1) * bs > seq.tokens.size()) return;
    const std::span<const int32_t> tokens = std::span<const int32_t>(seq.tokens).subspan(j * bs, bs);
    // A placeholder (an in-flight sampled token, -1 - r) is not content yet.
    if (std::ranges::any_of(tokens, [](int32_t t) { return t < 0; })) return;
    const prompt_cache::Key parent =
        j == 0 ? prompt_cache::RootKey(disk_->config().fingerprint, request.cache_namespace,
                                       request.cache_salt)
               : seq.tier_keys[j - 1];
    seq.tier_keys.push_back(prompt_cache::ChainKey(parent, tokens));
  }
}

prompt_cache::BlockIdentity PromptTier::Identity(const Sequence& seq, int32_t block) const {
  const GenerationRequest& request = seq.request->request;
  const auto j = static_cast<size_t>(block);
  prompt_cache::BlockIdentity id;
  id.fingerprint = disk_->config().fingerprint;
  id.parent = j == 0 ? prompt_cache::RootKey(id.fingerprint, request.cache_namespace,
                                             request.cache_salt)
                     : seq.tier_keys[j - 1];
  id.key = seq.tier_keys[j];
  id.ns = request.cache_namespace;
  id.tokens = std::span<const int32_t>(seq.tokens).subspan(j * block_size_, block_size_);
  return id;
}

double PromptTier::ReadBytesPerSecond() const {
  const prompt_cache::DiskStoreStats disk = disk_->Stats();
  return disk.read_ns > 0 ? static_cast<double>(disk.bytes_read) * 1e9 / disk.read_ns : 0.0;
}

double PromptTier::PrefillTokensPerSecond() const {
  const int64_t tokens =
      counters_->computed_tokens - counters_->decode_rows - counters_->decode_padding_rows;
  const int64_t ns = counters_->forward_ns - counters_->decode_forward_ns;
  return ns > 0 && tokens > 0 ? static_cast<double>(tokens) * 1e9 / ns : 0.0;
}

bool PromptTier::ShouldLoad(int32_t num_blocks) {
  last_read_bytes_per_s_ = ReadBytesPerSecond();
  last_prefill_tokens_per_s_ = PrefillTokensPerSecond();
  bool load = true;
  if (reuse_ == PromptCacheConfig::Reuse::kAlways) {
    last_choice_ = PromptCacheStats::Choice::kLoad;
  } else if (last_read_bytes_per_s_ <= 0 || last_prefill_tokens_per_s_ <= 0) {
    last_choice_ = PromptCacheStats::Choice::kLoadUnmeasured;  // the load measures the rate
  } else {
    load = LoadBeatsRecompute(num_blocks, disk_->record_bytes(), block_size_,
                              last_read_bytes_per_s_, last_prefill_tokens_per_s_);
    last_choice_ = load ? PromptCacheStats::Choice::kLoad : PromptCacheStats::Choice::kRecompute;
  }
  ++(load ? loads_ : recomputes_);
  return load;
}

int32_t PromptTier::ExtendCachedPrefix(Sequence& seq, int32_t pool_tokens, kv::KvCacheManager& kv,
                                       int32_t budget_tokens) {
  // As the pool: whole blocks only, and the prompt's last token is always computed.
  const int32_t max_blocks = (seq.num_tokens() - 1) / block_size_;
  const int32_t first = pool_tokens / block_size_;
  if (first >= max_blocks) return pool_tokens;
  EnsureKeys(seq, max_blocks);
  const int32_t known = std::min<int32_t>(max_blocks, static_cast<int32_t>(seq.tier_keys.size()));
  ++lookups_;
  int32_t found = 0;
  while (first + found < known && disk_->Contains(seq.tier_keys[first + found])) ++found;
  if (found == 0) {
    ++lookup_misses_;
    return pool_tokens;
  }
  if (!ShouldLoad(found)) return pool_tokens;
  const int32_t restored_end = (first + found) * block_size_;
  // Read nothing unless the whole admission fits now (else it is retried on a later step).
  const int32_t admitted_end = std::min(seq.num_tokens(), restored_end + budget_tokens);
  if (kv.NumBlocksNeeded(seq.id, admitted_end) > kv.NumFreeBlocks()) return pool_tokens;
  if (!kv.Allocate(seq.id, restored_end)) return pool_tokens;
  const std::vector<int32_t>& table = kv.BlockTable(seq.id);
  int32_t loaded = 0;
  for (; loaded < found; ++loaded) {
    const int32_t j = first + loaded;
    const std::span<const uint8_t> payload = disk_->Read(Identity(seq, j));
    if (payload.empty()) break;  // evicted meanwhile, or refused (counted by the store)
    const Status st = io_->CopyBlockFromHost(table[static_cast<size_t>(j)], payload);
    if (!st.ok()) {
      LOG_WARN << "prompt cache: cannot restore a block: " << st.message();
      ++promote_failures_;
      break;
    }
  }
  promoted_blocks_ += loaded;
  // Blocks past `loaded` stay allocated: they are recomputed in place.
  return (first + loaded) * block_size_;
}

void PromptTier::CommitComputed(Sequence& seq, int32_t num_computed,
                                const kv::KvCacheManager& kv) {
  if (!kv.Has(seq.id)) return;
  const std::vector<int32_t>& table = kv.BlockTable(seq.id);
  const int32_t full = static_cast<int32_t>(
      std::min<int64_t>({num_computed, seq.num_tokens(),
                         static_cast<int64_t>(table.size()) * block_size_}) /
      block_size_);
  if (full <= seq.tier_blocks_stored) return;
  EnsureKeys(seq, full);
  const int32_t keyed = std::min<int32_t>(full, static_cast<int32_t>(seq.tier_keys.size()));
  int32_t j = seq.tier_blocks_stored;
  for (; j < keyed; ++j) {
    if (disk_->Contains(seq.tier_keys[static_cast<size_t>(j)])) continue;
    std::vector<uint8_t> record = disk_->NewRecordBuffer();
    const std::span<uint8_t> payload =
        std::span<uint8_t>(record).subspan(prompt_cache::PayloadOffset(block_size_),
                                           static_cast<size_t>(disk_->config().payload_bytes));
    const Status st = io_->CopyBlockToHost(table[static_cast<size_t>(j)], payload);
    if (!st.ok()) {
      LOG_WARN << "prompt cache: cannot copy a block out: " << st.message();
      break;
    }
    disk_->Write(Identity(seq, j), std::move(record));  // dropped when the queue is full
  }
  seq.tier_blocks_stored = j;
}

void PromptTier::DiskStats(const prompt_cache::DiskStore& disk, PromptCacheStats* out) {
  const prompt_cache::DiskStoreStats d = disk.Stats();
  PromptCacheStats& s = *out;
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
}

PromptCacheStats PromptTier::Stats() const {
  PromptCacheStats s;
  DiskStats(*disk_, &s);
  s.lookups = lookups_;
  s.lookup_misses = lookup_misses_;
  s.promotions = promoted_blocks_;
  s.loads = loads_;
  s.recomputes = recomputes_;
  s.read_bytes_per_s = ReadBytesPerSecond();
  s.prefill_tokens_per_s = PrefillTokensPerSecond();
  s.last_read_bytes_per_s = last_read_bytes_per_s_;
  s.last_prefill_tokens_per_s = last_prefill_tokens_per_s_;
  s.last_choice = last_choice_;
  return s;
}

}  // namespace ember
