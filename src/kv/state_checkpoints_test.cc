// StateCheckpoints over a real KvCacheManager: a prefix hit for a hybrid model ends only at a
// block with a live checkpoint; checkpoints go stale with their blocks; slots are reused free
// first, then stale, then least recently used, never pending; bytes count live ones only.
#include "kv/state_checkpoints.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

namespace ember::kv {
namespace {

using V = std::vector<int32_t>;
constexpr int32_t kBlock = 4;

V Iota(int32_t n, int32_t start = 0) {
  V v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

KvCacheConfig Config(int32_t num_blocks) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = kBlock;
  return c;
}

// Runs `tokens` as seq (all computed, blocks registered) and frees it; returns the hit tokens.
int32_t RunPrompt(KvCacheManager& kv, SeqId seq, const V& tokens) {
  const int32_t hit = kv.AcquireCachedPrefix(seq, tokens, 0);
  EXPECT_TRUE(kv.Allocate(seq, static_cast<int32_t>(tokens.size())));
  kv.CommitComputed(seq, tokens, static_cast<int32_t>(tokens.size()), 0);
  return hit;
}

// Checkpoints `seq`'s state at the end of its block num_blocks - 1 (reserve, then commit).
int32_t Checkpoint(KvCacheManager& kv, StateCheckpoints& ckpt, SeqId seq, int32_t num_blocks) {
  const int32_t slot = ckpt.Reserve();
  EXPECT_GE(slot, 0);
  const std::vector<int32_t>& table = kv.BlockTable(seq);
  ckpt.Commit(slot, kv.prefix_cache().Ref(table[static_cast<size_t>(num_blocks - 1)]));
  return slot;
}

TEST(StateCheckpointsTest, HitEndsAtTheLastCheckpointedBlock) {
  KvCacheManager kv(Config(16));
  StateCheckpoints ckpt(/*first_slot=*/5, /*num_slots=*/2, /*bytes=*/100, &kv.prefix_cache(), 16);
  kv.set_prefix_end_filter(&ckpt);
  const V prompt = Iota(21);  // 5 full blocks, the last token uncovered
  EXPECT_EQ(RunPrompt(kv, 1, prompt), 0);
  EXPECT_EQ(kv.PeekCachedPrefix(prompt, 0), 0);  // no checkpoint: no hit
  const int32_t at2 = Checkpoint(kv, ckpt, 1, 2);
  EXPECT_EQ(at2, 5);
  EXPECT_EQ(kv.PeekCachedPrefix(prompt, 0), 2 * kBlock);
  const int32_t at4 = Checkpoint(kv, ckpt, 1, 4);
  EXPECT_EQ(at4, 6);
  EXPECT_EQ(kv.PeekCachedPrefix(prompt, 0), 4 * kBlock);
  kv.Free(1);
  // A prompt diverging in block 3 hits up to the checkpoint at block 2's end.
  V other = prompt;
  other[13] = 999;
  EXPECT_EQ(kv.AcquireCachedPrefix(2, other, 0), 2 * kBlock);
  const std::optional<BlockRef> end = kv.ChainEnd(2, 2);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(ckpt.Find(*end), at2);
  EXPECT_EQ(kv.BlockTable(2).size(), 2u);
  EXPECT_FALSE(kv.ChainEnd(2, 3).has_value());
  EXPECT_EQ(kv.CheckInvariants(), "");
  EXPECT_EQ(ckpt.NumLive(), 2);
  EXPECT_EQ(ckpt.LiveBytes(), 200);
  EXPECT_EQ(ckpt.CheckInvariants(), "");
}

TEST(StateCheckpointsTest, EvictedBlockMakesItsCheckpointStaleAndItsSlotReusedFirst) {
  KvCacheManager kv(Config(6));
  StateCheckpoints ckpt(0, 2, 8, &kv.prefix_cache(), 6);
  kv.set_prefix_end_filter(&ckpt);
  const V a = Iota(9);  // blocks 0, 1 (and a partial one)
  RunPrompt(kv, 1, a);
  const int32_t slot_a = Checkpoint(kv, ckpt, 1, 2);
  kv.Free(1);
  const V b = Iota(9, 100);
  RunPrompt(kv, 2, b);
  const int32_t slot_b = Checkpoint(kv, ckpt, 2, 2);
  kv.Free(2);
  EXPECT_EQ(ckpt.NumLive(), 2);
  ckpt.Touch(slot_a);  // a used more recently than b
  // Fill the pool with uncached content: every cached block is evicted, b's first (LRU).
  ASSERT_TRUE(kv.Allocate(3, 6 * kBlock));
  EXPECT_EQ(ckpt.NumLive(), 0);
  EXPECT_EQ(ckpt.LiveBytes(), 0);
  kv.Free(3);
  EXPECT_EQ(kv.PeekCachedPrefix(a, 0), 0);
  // Stale slots are taken before any live one; no live one is evicted.
  const int32_t r1 = ckpt.Reserve();
  const int32_t r2 = ckpt.Reserve();
  EXPECT_NE(r1, r2);
  EXPECT_TRUE((r1 == slot_a || r1 == slot_b) && (r2 == slot_a || r2 == slot_b));
  EXPECT_EQ(ckpt.Reserve(), -1);  // both pending
  ckpt.Release(r1);
  ckpt.Release(r2);
  EXPECT_EQ(ckpt.num_evicted(), 0);
  EXPECT_EQ(ckpt.CheckInvariants(), "");
}

TEST(StateCheckpointsTest, FullStoreEvictsTheLeastRecentlyUsedAndDedupes) {
  KvCacheManager kv(Config(16));
  StateCheckpoints ckpt(3, 2, 8, &kv.prefix_cache(), 16);
  kv.set_prefix_end_filter(&ckpt);
  const V p = Iota(13);  // 3 full blocks
  RunPrompt(kv, 1, p);
  const int32_t s1 = Checkpoint(kv, ckpt, 1, 1);
  const int32_t s2 = Checkpoint(kv, ckpt, 1, 2);
  ckpt.Touch(s1);
  // A third checkpoint evicts the least recently used live one (block 2's end).
  const int32_t s3 = Checkpoint(kv, ckpt, 1, 3);
  EXPECT_EQ(s3, s2);
  EXPECT_EQ(ckpt.num_evicted(), 1);
  EXPECT_EQ(kv.PeekCachedPrefix(p, 0), 3 * kBlock);
  // The same block checkpointed again (another sequence, same prefix): the new slot goes back.
  const int32_t again = ckpt.Reserve();
  ckpt.Commit(again, kv.prefix_cache().Ref(kv.BlockTable(1)[2]));
  EXPECT_EQ(ckpt.NumLive(), 1);  // the reservation evicted s1's; the duplicate was released
  EXPECT_EQ(ckpt.Find(kv.prefix_cache().Ref(kv.BlockTable(1)[2])), s3);
  EXPECT_EQ(ckpt.num_saved(), 3);
  EXPECT_EQ(ckpt.CheckInvariants(), "");
  kv.Free(1);
}

// Random prompts from a few shared bases through a small pool and a small checkpoint store,
// checkpointing the last full block of half of them as the engine does (reserve, then commit
// to the chain's end, which may be another sequence's block): every hit ends at a block with a live checkpoint and both indexes stay consistent.
TEST(StateCheckpointsTest, RandomWorkloadKeepsHitsOnLiveCheckpoints) {
  std::mt19937 rng(2026);
  KvCacheManager kv(Config(24));
  StateCheckpoints ckpt(2, 3, 10, &kv.prefix_cache(), 24);
  kv.set_prefix_end_filter(&ckpt);
  std::vector<V> bases;
  for (int b = 0; b < 3; ++b) bases.push_back(Iota(40, 1000 * b));
  std::vector<SeqId> live;
  for (SeqId seq = 1; seq <= 400; ++seq) {
    V prompt = bases[rng() % bases.size()];
    prompt.resize(5 + rng() % 35);
    if (rng() % 3 == 0) prompt[rng() % prompt.size()] = -1 - static_cast<int32_t>(seq);
    const int32_t hit = kv.AcquireCachedPrefix(seq, prompt, 0);
    ASSERT_EQ(hit % kBlock, 0);
    if (hit > 0) {
      const std::optional<BlockRef> end = kv.ChainEnd(seq, hit / kBlock);
      ASSERT_TRUE(end.has_value());
      ASSERT_GE(ckpt.Find(*end), 0) << "a hit without its checkpoint";
    }
    if (!kv.Allocate(seq, static_cast<int32_t>(prompt.size()))) {
      kv.Free(seq);
    } else {
      kv.CommitComputed(seq, prompt, static_cast<int32_t>(prompt.size()), 0);
      const int32_t full = static_cast<int32_t>(prompt.size()) / kBlock;
      if (full > 0 && rng() % 2 == 0) {
        const int32_t slot = ckpt.Reserve();
        const std::optional<BlockRef> end = kv.ChainEnd(seq, full);  // maybe another seq's
        ASSERT_TRUE(end.has_value());
        if (slot >= 0) ckpt.Commit(slot, *end);
      }
      live.push_back(seq);
    }
    while (live.size() > 2 || (!live.empty() && rng() % 2 == 0)) {
      kv.Free(live.front());
      live.erase(live.begin());
    }
    ASSERT_EQ(kv.CheckInvariants(), "");
    ASSERT_EQ(ckpt.CheckInvariants(), "");
    ASSERT_LE(ckpt.NumLive(), 3);
  }
  EXPECT_GT(ckpt.num_saved(), 0);
  EXPECT_GT(ckpt.num_evicted(), 0);
  EXPECT_GT(kv.prefix_hit_tokens(), 0);
}

}  // namespace
}  // namespace ember::kv
