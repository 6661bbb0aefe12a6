#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "util/check.h"

namespace ember::kv {

int32_t NumBlocksForBytes(int64_t bytes, int64_t kv_bytes_per_token, int32_t block_size) {
  if (bytes <= 0 || kv_bytes_per_token <= 0 || block_size <= 0) return 0;
  // One block would exceed int64 bytes: nothing fits.
  if (kv_bytes_per_token > std::numeric_limits<int64_t>::max() / block_size) return 0;
  const int64_t bytes_per_block = kv_bytes_per_token * block_size;
  return static_cast<int32_t>(
      std::min<int64_t>(bytes / bytes_per_block, std::numeric_limits<int32_t>::max()));
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : KvCacheManager(config, HashBlockTokens) {}

namespace {
const KvCacheConfig& Validated(const KvCacheConfig& config) {
  CHECK_GT(config.block_size, 0);
  CHECK_GE(config.num_blocks, 0);
  return config;
}
}  // namespace

KvCacheManager::KvCacheManager(const KvCacheConfig& config, BlockHashFn hash_fn)
    : config_(Validated(config)),
      pool_(config.num_blocks),
      cache_(config.num_blocks, config.block_size, hash_fn) {}

int32_t KvCacheManager::Walk(std::span<const int32_t> tokens, uint64_t ns, SeqState* into) const {
  if (!config_.enable_prefix_caching || tokens.empty()) return 0;
  const size_t bs = static_cast<size_t>(config_.block_size);
  // At least the last prompt token is always computed (its logits are needed).
  const size_t max_blocks = (tokens.size() - 1) / bs;
  uint64_t key = kRootBlockKey;
  BlockRef parent;
  // The usable end so far: its length in blocks, key and block.
  size_t num_hit = 0;
  uint64_t hit_key = key;
  BlockRef hit_ref;
  for (size_t n = 0; n < max_blocks; ++n) {
    const std::span<const int32_t> block_tokens = tokens.subspan(n * bs, bs);
    const uint64_t block_key = cache_.Hash(key, block_tokens, ns);
    const int32_t block_id = cache_.Find(block_key, parent, block_tokens, ns);
    if (block_id < 0) break;
    key = block_key;
    parent = cache_.Ref(block_id);
    if (filter_ == nullptr || filter_->Usable(parent)) {
      num_hit = n + 1;
      hit_key = key;
      hit_ref = parent;
    }
  }
  if (into != nullptr) {
    // The blocks of the usable run: walk its parents back from its last block.
    into->blocks.resize(into->blocks.size() + num_hit);
    BlockRef ref = hit_ref;
    for (size_t n = num_hit; n > 0; --n) {
      into->blocks[into->blocks.size() - num_hit + n - 1] = ref.block_id;
      ref = cache_.Parent(ref.block_id);
    }
    into->num_registered = static_cast<int32_t>(num_hit);
    into->last_key = hit_key;
    into->last_ref = hit_ref;
  }
  return static_cast<int32_t>(num_hit);
}

int32_t KvCacheManager::AcquireCachedPrefix(SeqId seq, std::span<const int32_t> tokens,
                                            uint64_t ns) {
  SeqState& state = seqs_[seq];
  CHECK(state.blocks.empty()) << "AcquireCachedPrefix: seq " << seq << " already holds blocks";
  state = SeqState();
  state.ns = ns;
  state.blocks.reserve((tokens.size() + config_.block_size - 1) / config_.block_size);
  const int32_t num_hit = Walk(tokens, ns, &state);
  for (int32_t block_id : state.blocks) pool_.AddRef(block_id);  // revives free cached blocks
  if (config_.enable_prefix_caching) {
    prefix_queries_tokens_ += static_cast<int64_t>(tokens.size());
    prefix_hit_tokens_ += static_cast<int64_t>(num_hit) * config_.block_size;
  }
  return num_hit * config_.block_size;
}

int32_t KvCacheManager::PeekCachedPrefix(std::span<const int32_t> tokens, uint64_t ns) const {
  return Walk(tokens, ns, nullptr) * config_.block_size;
}

namespace {
// Blocks covering num_tokens slots.
int64_t BlocksFor(int32_t num_tokens, int32_t block_size) {
  return (static_cast<int64_t>(std::max(num_tokens, 0)) + block_size - 1) / block_size;
}
}  // namespace

int32_t KvCacheManager::NumBlocksNeeded(SeqId seq, int32_t num_tokens) const {
  auto it = seqs_.find(seq);
  const int64_t held = it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  return static_cast<int32_t>(
      std::max<int64_t>(0, BlocksFor(num_tokens, config_.block_size) - held));
}

bool KvCacheManager::Allocate(SeqId seq, int32_t num_tokens) {
  auto it = seqs_.find(seq);
  const int64_t held = it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  const int64_t num_new = BlocksFor(num_tokens, config_.block_size) - held;
  if (num_new > pool_.num_free()) return false;  // the cap holds before allocation
  if (it == seqs_.end()) it = seqs_.try_emplace(seq).first;
  std::vector<int32_t>& blocks = it->second.blocks;
  for (int64_t i = 0; i < num_new; ++i) {
    // The front is the least valuable free block: uncached, or the least recently used cached one.
    const int32_t block_id = pool_.front();
    if (observer_ != nullptr && cache_.is_cached(block_id)) observer_->OnEvict(block_id);
    cache_.Evict(block_id);  // its content is about to be overwritten
    CHECK_EQ(pool_.PopFront(), block_id);
    blocks.push_back(block_id);
  }
  return true;
}

void KvCacheManager::CommitComputed(SeqId seq, std::span<const int32_t> tokens,
                                    int32_t num_computed, uint64_t ns) {
  auto it = seqs_.find(seq);
  CHECK(it != seqs_.end()) << "CommitComputed: unknown seq " << seq;
  if (!config_.enable_prefix_caching) return;
  SeqState& state = it->second;
  if (state.num_registered == 0) state.ns = ns;
  CHECK_EQ(state.ns, ns) << "CommitComputed: seq " << seq << " changed namespace";
  const size_t bs = static_cast<size_t>(config_.block_size);
  const size_t num_full = std::min(
      {static_cast<size_t>(std::max(num_computed, 0)), tokens.size(), state.blocks.size() * bs});
  const int32_t num_full_blocks = static_cast<int32_t>(num_full / bs);
  if (state.num_registered >= num_full_blocks) return;
  // The chain may run through another sequence's block (see below) that has since been evicted;
  // then re-walk from the root so this sequence's own blocks take its place.
  const BlockRef last = state.last_ref;
  if (last.block_id >= 0 &&
      !(cache_.is_cached(last.block_id) && cache_.Ref(last.block_id) == last)) {
    state.num_registered = 0;
    state.last_key = kRootBlockKey;
    state.last_ref = BlockRef();
  }
  for (int32_t j = state.num_registered; j < num_full_blocks; ++j) {
    const std::span<const int32_t> block_tokens = tokens.subspan(j * bs, bs);
    const uint64_t key = cache_.Hash(state.last_key, block_tokens, ns);
    // Another sequence may have computed the same content first: keep its entry (the chain
    // continues through it) and leave this block unregistered.
    int32_t canonical = cache_.Find(key, state.last_ref, block_tokens, ns);
    if (canonical < 0) {
      canonical = state.blocks[j];
      cache_.Evict(canonical);  // registered before under a chain that is now stale
      cache_.Insert(canonical, key, state.last_key, state.last_ref, block_tokens, ns);
    }
    state.last_key = key;
    state.last_ref = cache_.Ref(canonical);
    state.num_registered = j + 1;
  }
}

void KvCacheManager::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  // Reverse order: a prompt's tail blocks are the least likely to be shared, so they sit nearer
  // the front of the free list and are evicted first.
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    pool_.Release(*b,
                  cache_.is_cached(*b) ? BlockPool::FreeEnd::kBack : BlockPool::FreeEnd::kFront);
  }
  seqs_.erase(it);
}

void KvCacheManager::Truncate(SeqId seq, int32_t num_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqState& state = it->second;
  const auto keep = static_cast<size_t>(BlocksFor(num_tokens, config_.block_size));
  if (state.blocks.size() <= keep) return;
  CHECK_LE(state.num_registered, static_cast<int32_t>(keep))
      << "Truncate: seq " << seq << " would drop a block registered in the prefix cache";
  while (state.blocks.size() > keep) {
    const int32_t b = state.blocks.back();
    state.blocks.pop_back();
    pool_.Release(b, cache_.is_cached(b) ? BlockPool::FreeEnd::kBack : BlockPool::FreeEnd::kFront);
  }
}

int32_t KvCacheManager::DropCached(std::optional<uint64_t> ns) {
  int32_t dropped = 0;
  for (int32_t b = 0; b < pool_.num_blocks(); ++b) {
    if (!cache_.is_cached(b) || (ns && cache_.ns(b) != *ns)) continue;
    cache_.Evict(b);
    if (pool_.is_free(b)) {  // uncached free blocks go before cached ones
      pool_.AddRef(b);
      pool_.Release(b, BlockPool::FreeEnd::kFront);
    }
    ++dropped;
  }
  return dropped;
}

std::optional<BlockRef> KvCacheManager::ChainEnd(SeqId seq, int32_t num_blocks) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || num_blocks <= 0 || it->second.num_registered < num_blocks)
    return std::nullopt;
  auto linked = [this](BlockRef ref) {
    return ref.block_id >= 0 && cache_.is_cached(ref.block_id) && cache_.Ref(ref.block_id) == ref;
  };
  BlockRef ref = it->second.last_ref;
  for (int32_t n = it->second.num_registered; n > num_blocks; --n) {
    if (!linked(ref)) return std::nullopt;
    ref = cache_.Parent(ref.block_id);
  }
  if (num_blocks < it->second.num_registered && !linked(ref)) return std::nullopt;
  return ref;
}

const std::vector<int32_t>& KvCacheManager::BlockTable(SeqId seq) const {
  auto it = seqs_.find(seq);
  CHECK(it != seqs_.end()) << "BlockTable: unknown seq " << seq;
  return it->second.blocks;
}

std::string KvCacheManager::CheckInvariants() const {
  std::ostringstream err;
  err << pool_.CheckInvariants() << cache_.CheckInvariants();
  const int32_t n = pool_.num_blocks();
  if (n != config_.num_blocks) err << "pool has " << n << " blocks, config " << config_.num_blocks;
  std::vector<int32_t> refs(n, 0);
  std::vector<int32_t> stamp(n, -1);  // index of the last seq seen holding each block
  int32_t seq_idx = 0;
  for (const auto& [seq, state] : seqs_) {
    for (int32_t b : state.blocks) {
      if (b < 0 || b >= n) {
        err << "seq " << seq << " holds invalid block " << b << "; ";
        continue;
      }
      if (stamp[b] == seq_idx) err << "seq " << seq << " holds block " << b << " twice; ";
      stamp[b] = seq_idx;
      ++refs[b];
    }
    ++seq_idx;
    if (state.num_registered > static_cast<int32_t>(state.blocks.size()))
      err << "seq " << seq << " registered past its table; ";
  }
  for (int32_t b = 0; b < n; ++b) {
    if (refs[b] != pool_.ref_count(b))
      err << "block " << b << " ref count " << pool_.ref_count(b) << " but held " << refs[b]
          << " times; ";
  }
  // Uncached free blocks are always handed out before cached (revivable) ones.
  bool seen_cached = false;
  for (int32_t b : pool_.FreeList()) {
    if (cache_.is_cached(b)) {
      seen_cached = true;
    } else if (seen_cached) {
      err << "uncached free block " << b << " behind a cached one; ";
    }
  }
  if (!config_.enable_prefix_caching && cache_.num_cached() != 0) err << "cache used while off; ";
  return err.str();
}

}  // namespace ember::kv
