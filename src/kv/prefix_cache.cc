#include "kv/prefix_cache.h"

#include <algorithm>
#include <bit>
#include <sstream>

#include "util/check.h"

namespace ember::kv {
namespace {

// murmur3's 64-bit finalizer: every input bit affects every output bit.
inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

uint64_t HashBlockTokens(uint64_t parent_key, std::span<const int32_t> tokens, uint64_t ns) {
  uint64_t h = Mix(parent_key ^ 0x243f6a8885a308d3ull);
  h = Mix(h ^ ns ^ (static_cast<uint64_t>(tokens.size()) << 56));
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {  // two token ids per 64-bit word
    const uint64_t w = (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) << 32) |
                       static_cast<uint32_t>(tokens[i + 1]);
    h = Mix(h ^ w) + 0x9e3779b97f4a7c15ull;
  }
  if (i < tokens.size()) h = Mix(h ^ static_cast<uint32_t>(tokens[i]));
  return h;
}

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size, BlockHashFn hash_fn)
    : block_size_(block_size),
      hash_fn_(hash_fn),
      entries_(num_blocks),
      tokens_(static_cast<size_t>(num_blocks) * block_size, 0) {
  CHECK_GT(block_size, 0);
  CHECK(hash_fn != nullptr);
  const size_t capacity = std::bit_ceil(std::max<size_t>(8, 2 * static_cast<size_t>(num_blocks)));
  slot_keys_.assign(capacity, 0);
  slot_heads_.assign(capacity, -1);
  slot_mask_ = capacity - 1;
}

size_t PrefixCache::Home(uint64_t key) const {
  return Mix(key) & slot_mask_;
}

int64_t PrefixCache::Slot(uint64_t key) const {
  for (size_t i = Home(key);; i = (i + 1) & slot_mask_) {
    if (slot_heads_[i] < 0) return -1;
    if (slot_keys_[i] == key) return static_cast<int64_t>(i);
  }
}

void PrefixCache::MapInsert(uint64_t key, int32_t head) {
  size_t i = Home(key);
  while (slot_heads_[i] >= 0) i = (i + 1) & slot_mask_;
  slot_keys_[i] = key;
  slot_heads_[i] = head;
  ++num_keys_;
}

void PrefixCache::MapErase(uint64_t key) {
  int64_t found = Slot(key);
  CHECK_GE(found, 0);
  size_t hole = static_cast<size_t>(found);
  // Backward-shift deletion: pull later entries of the probe run into the hole when their home
  // slot does not lie cyclically in (hole, j].
  for (size_t j = (hole + 1) & slot_mask_; slot_heads_[j] >= 0; j = (j + 1) & slot_mask_) {
    const size_t home = Home(slot_keys_[j]);
    const bool home_in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (home_in_range) continue;
    slot_keys_[hole] = slot_keys_[j];
    slot_heads_[hole] = slot_heads_[j];
    hole = j;
  }
  slot_heads_[hole] = -1;
  --num_keys_;
}

std::span<const int32_t> PrefixCache::Tokens(int32_t block_id) const {
  return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(block_id) * block_size_,
                                                   block_size_);
}

int32_t PrefixCache::Find(uint64_t key, BlockRef parent, std::span<const int32_t> tokens,
                          uint64_t ns) const {
  CHECK_EQ(static_cast<int64_t>(tokens.size()), block_size_);
  const int64_t slot = Slot(key);
  if (slot < 0) return -1;
  for (int32_t b = slot_heads_[slot]; b >= 0; b = entries_[b].next_same_key) {
    const Entry& e = entries_[b];
    if (e.parent == parent && e.ns == ns && std::ranges::equal(Tokens(b), tokens)) return b;
  }
  return -1;
}

void PrefixCache::Insert(int32_t block_id, uint64_t key, uint64_t parent_key, BlockRef parent,
                         std::span<const int32_t> tokens, uint64_t ns) {
  CHECK_EQ(static_cast<int64_t>(tokens.size()), block_size_);
  Entry& e = entries_[block_id];
  CHECK(!e.cached) << "block " << block_id << " is already cached";
  e.cached = true;
  ++e.epoch;
  e.key = key;
  e.parent_key = parent_key;
  e.ns = ns;
  e.parent = parent;
  std::ranges::copy(tokens, tokens_.begin() + static_cast<size_t>(block_id) * block_size_);
  const int64_t slot = Slot(key);
  if (slot < 0) {
    e.next_same_key = -1;
    MapInsert(key, block_id);
  } else {  // newest first in the chain
    e.next_same_key = slot_heads_[slot];
    slot_heads_[slot] = block_id;
  }
  ++num_cached_;
}

void PrefixCache::Evict(int32_t block_id) {
  Entry& e = entries_[block_id];
  if (!e.cached) return;
  const int64_t slot = Slot(e.key);
  CHECK_GE(slot, 0) << "cached block " << block_id << " missing from the key index";
  if (slot_heads_[slot] == block_id) {
    if (e.next_same_key < 0) {
      MapErase(e.key);
    } else {
      slot_heads_[slot] = e.next_same_key;
    }
  } else {
    int32_t b = slot_heads_[slot];
    while (entries_[b].next_same_key != block_id) {
      b = entries_[b].next_same_key;
      CHECK_GE(b, 0) << "cached block " << block_id << " missing from its key chain";
    }
    entries_[b].next_same_key = e.next_same_key;
  }
  e.cached = false;
  e.next_same_key = -1;
  --num_cached_;
}

std::string PrefixCache::CheckInvariants() const {
  std::ostringstream err;
  const int32_t n = static_cast<int32_t>(entries_.size());
  std::vector<char> seen(n, 0);
  int32_t num_listed = 0;
  int32_t num_keys = 0;
  for (size_t s = 0; s <= slot_mask_; ++s) {
    if (slot_heads_[s] < 0) continue;
    ++num_keys;
    const uint64_t key = slot_keys_[s];
    if (Slot(key) != static_cast<int64_t>(s)) err << "key in slot " << s << " is unreachable; ";
    int32_t steps = 0;
    for (int32_t b = slot_heads_[s]; b >= 0; b = entries_[b].next_same_key) {
      if (b >= n || seen[b] || ++steps > n) {
        err << "key chain of slot " << s << " revisits block " << b;
        return err.str();
      }
      seen[b] = 1;
      ++num_listed;
      const Entry& e = entries_[b];
      if (!e.cached) err << "block " << b << " listed but not cached; ";
      if (e.key != key) err << "block " << b << " listed under a foreign key; ";
      if (hash_fn_(e.parent_key, Tokens(b), e.ns) != e.key) err << "block " << b << " stale key; ";
      if (e.parent.block_id == b && e.parent.epoch >= e.epoch)
        err << "block " << b << " is its own parent; ";
      if (e.parent.block_id < 0 && e.parent_key != kRootBlockKey)
        err << "root block " << b << " has a parent key; ";
    }
  }
  for (int32_t b = 0; b < n; ++b) {
    if (entries_[b].cached && !seen[b]) err << "cached block " << b << " not indexed; ";
  }
  if (num_listed != num_cached_)
    err << "indexed " << num_listed << " != num_cached " << num_cached_ << "; ";
  if (num_keys != num_keys_) err << "keys " << num_keys << " != num_keys " << num_keys_ << "; ";
  return err.str();
}

}  // namespace ember::kv
