#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace ember::kv {
namespace {

using V = std::vector<int32_t>;

// Tokens [start, start + n).
V Iota(int32_t n, int32_t start = 0) {
  V v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}
V Concat(V a, const V& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

KvCacheConfig Config(int32_t num_blocks, int32_t block_size = 4, bool prefix = true) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.enable_prefix_caching = prefix;
  return c;
}

// Runs a prompt to completion: acquire, allocate, "compute", commit. Returns the cached tokens.
int32_t RunPrompt(KvCacheManager& kv, SeqId seq, const V& tokens, uint64_t ns = 0) {
  const int32_t cached = kv.AcquireCachedPrefix(seq, tokens, ns);
  EXPECT_TRUE(kv.Allocate(seq, static_cast<int32_t>(tokens.size())));
  kv.CommitComputed(seq, tokens, static_cast<int32_t>(tokens.size()), ns);
  EXPECT_EQ(kv.CheckInvariants(), "");
  return cached;
}

TEST(NumBlocksForBytesTest, CapHoldsBeforeAllocation) {
  // 1 KiB per token, 16-token blocks: 16 KiB per block.
  EXPECT_EQ(NumBlocksForBytes(16 << 10, 1024, 16), 1);
  EXPECT_EQ(NumBlocksForBytes((16 << 10) - 1, 1024, 16), 0);
  EXPECT_EQ(NumBlocksForBytes((100 << 10) + 5, 1024, 16), 6);  // rounds down, never over the cap
  EXPECT_EQ(NumBlocksForBytes(0, 1024, 16), 0);
  EXPECT_EQ(NumBlocksForBytes(1 << 20, 0, 16), 0);
  EXPECT_EQ(NumBlocksForBytes(1 << 20, 1024, 0), 0);
  EXPECT_EQ(NumBlocksForBytes(INT64_MAX, 1, 1), INT32_MAX);
  EXPECT_EQ(NumBlocksForBytes(INT64_MAX, INT64_MAX / 2, 16), 0);  // bytes per block overflows
}

TEST(KvCacheManagerTest, AllocateGrowsTableAndFreeReturnsBlocks) {
  KvCacheManager kv(Config(8));
  EXPECT_FALSE(kv.Has(1));
  EXPECT_EQ(kv.NumBlocksNeeded(1, 9), 3);
  EXPECT_TRUE(kv.Allocate(1, 9));
  EXPECT_TRUE(kv.Has(1));
  EXPECT_EQ(kv.BlockTable(1), (V{0, 1, 2}));
  EXPECT_EQ(kv.NumBlocksNeeded(1, 12), 0);
  EXPECT_EQ(kv.NumBlocksNeeded(1, 13), 1);
  EXPECT_TRUE(kv.Allocate(1, 12));  // already covered
  EXPECT_EQ(kv.BlockTable(1).size(), 3u);
  EXPECT_TRUE(kv.Allocate(1, 13));
  EXPECT_EQ(kv.BlockTable(1), (V{0, 1, 2, 3}));
  EXPECT_EQ(kv.NumUsedBlocks(), 4);
  EXPECT_EQ(kv.NumFreeBlocks(), 4);
  EXPECT_EQ(kv.CheckInvariants(), "");
  kv.Free(1);
  EXPECT_FALSE(kv.Has(1));
  EXPECT_EQ(kv.NumUsedBlocks(), 0);
  EXPECT_EQ(kv.NumFreeBlocks(), 8);
  kv.Free(1);  // unknown: no-op
  kv.Free(99);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

// Speculative decoding's rollback: the blocks past a sequence's new end go back to the free list
// (uncached, at the front), the registered ones stay, and dropping a registered block is a CHECK.
TEST(KvCacheManagerTest, TruncateReleasesTheBlocksPastTheEnd) {
  KvCacheManager kv(Config(8));
  const V tokens = Iota(9);  // block size 4: two full blocks and one more token
  ASSERT_TRUE(kv.Allocate(1, 20));  // 5 blocks: room for 11 drafted tokens
  kv.CommitComputed(1, tokens, 8, 0);  // registers blocks 0 and 1
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  kv.Truncate(1, 9);
  EXPECT_EQ(kv.BlockTable(1), (V{0, 1, 2}));
  EXPECT_EQ(kv.NumUsedBlocks(), 3);
  EXPECT_EQ(kv.pool().front(), 3);  // released uncached: handed out first
  kv.Truncate(1, 12);  // already that short: nothing
  kv.Truncate(99, 0);  // unknown: nothing
  EXPECT_EQ(kv.BlockTable(1).size(), 3u);
  EXPECT_EQ(kv.CheckInvariants(), "");
  EXPECT_DEATH(kv.Truncate(1, 4), "registered in the prefix cache");
  kv.Free(1);
  EXPECT_EQ(kv.NumUsedBlocks(), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(KvCacheManagerTest, AllocateFailureChangesNothing) {
  KvCacheManager kv(Config(4));
  RunPrompt(kv, 1, Iota(9));  // 3 blocks, 2 of them full and cached
  kv.Free(1);
  ASSERT_TRUE(kv.Allocate(2, 4));
  const V table = kv.BlockTable(2);
  const V free_list = kv.pool().FreeList();
  const int32_t cached = kv.NumCachedBlocks();
  EXPECT_FALSE(kv.Allocate(2, 4 * 4 + 1));  // needs 4 more, 3 free
  EXPECT_FALSE(kv.Allocate(3, 4 * 4));      // unknown seq, needs 4
  EXPECT_EQ(kv.BlockTable(2), table);
  EXPECT_FALSE(kv.Has(3));
  EXPECT_EQ(kv.pool().FreeList(), free_list);
  EXPECT_EQ(kv.NumCachedBlocks(), cached);
  EXPECT_EQ(kv.NumFreeBlocks(), 3);
  // The cached prompt is still fully revivable.
  EXPECT_EQ(kv.PeekCachedPrefix(Iota(9), 0), 8);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(KvCacheManagerTest, CachedPrefixIsRevivedWithTheSameBlocks) {
  KvCacheManager kv(Config(16));
  const V prompt = Iota(10);  // blocks [0..4) [4..8) full, [8..10) partial
  EXPECT_EQ(RunPrompt(kv, 1, prompt), 0);
  const V table = kv.BlockTable(1);
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  kv.Free(1);
  EXPECT_EQ(kv.NumUsedBlocks(), 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 2);  // freed but revivable

  const V longer = Concat(prompt, Iota(6, 100));
  EXPECT_EQ(kv.AcquireCachedPrefix(2, longer, 0), 8);
  EXPECT_EQ(kv.BlockTable(2), (V{table[0], table[1]}));
  EXPECT_EQ(kv.RefCount(table[0]), 1);
  EXPECT_EQ(kv.NumUsedBlocks(), 2);
  EXPECT_EQ(kv.prefix_queries_tokens(), 10 + 16);
  EXPECT_EQ(kv.prefix_hit_tokens(), 8);
  EXPECT_EQ(kv.CheckInvariants(), "");
  // A different namespace (e.g. another adapter) never shares.
  EXPECT_EQ(kv.PeekCachedPrefix(longer, 7), 0);
  // A prompt diverging inside the second block hits only the first.
  EXPECT_EQ(kv.PeekCachedPrefix(Concat(Iota(6), V{50, 51, 52, 53}), 0), 4);
  EXPECT_EQ(kv.PeekCachedPrefix(Concat(V{9}, Iota(9, 1)), 0), 0);
}

TEST(KvCacheManagerTest, AtLeastOneTokenIsAlwaysComputed) {
  KvCacheManager kv(Config(16));
  const V prompt = Iota(8);  // exactly two full blocks
  RunPrompt(kv, 1, prompt);
  kv.Free(1);
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, prompt, 0), 4);  // not 8: the last token needs logits
  EXPECT_EQ(kv.BlockTable(2).size(), 1u);
  EXPECT_EQ(kv.PeekCachedPrefix(Concat(prompt, V{1}), 0), 8);
  EXPECT_EQ(kv.PeekCachedPrefix(V{0, 1, 2, 3}, 0), 0);
  EXPECT_EQ(kv.PeekCachedPrefix(V{}, 0), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(3, V{}, 0), 0);
}

TEST(KvCacheManagerTest, UncachedFreedBlocksAreReusedBeforeCachedOnes) {
  KvCacheManager kv(Config(6));
  RunPrompt(kv, 1, Iota(8));  // 2 full cached blocks
  const V cached_blocks = kv.BlockTable(1);
  ASSERT_TRUE(kv.Allocate(2, 12));  // 3 uncached blocks (never committed)
  kv.Free(1);
  kv.Free(2);
  // 6 free: 4 uncached at the front, the 2 cached at the back.
  ASSERT_TRUE(kv.Allocate(3, 16));
  for (int32_t b : kv.BlockTable(3)) {
    EXPECT_NE(b, cached_blocks[0]);
    EXPECT_NE(b, cached_blocks[1]);
  }
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  EXPECT_EQ(kv.PeekCachedPrefix(Iota(9), 0), 8);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(KvCacheManagerTest, LruEvictsLeastRecentlyFreedFirstAndEvictionDropsHash) {
  KvCacheManager kv(Config(4, 4));
  const V a = Iota(5, 0), b = Iota(5, 100);  // one full block each
  RunPrompt(kv, 1, a);
  RunPrompt(kv, 2, b);
  kv.Free(1);  // a's cached block freed first -> least recently used
  kv.Free(2);
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  // Reviving a moves it out of the LRU; freeing it again makes it the most recent.
  EXPECT_EQ(kv.AcquireCachedPrefix(3, a, 0), 4);
  kv.Free(3);
  // Pressure: 3 blocks needed; 2 uncached free first, then the LRU cached one (b's).
  ASSERT_TRUE(kv.Allocate(4, 12));
  EXPECT_EQ(kv.NumCachedBlocks(), 1);
  EXPECT_EQ(kv.PeekCachedPrefix(b, 0), 0);  // evicted: hash dropped
  EXPECT_EQ(kv.PeekCachedPrefix(a, 0), 4);
  EXPECT_EQ(kv.CheckInvariants(), "");
  ASSERT_TRUE(kv.Allocate(4, 16));
  EXPECT_EQ(kv.NumCachedBlocks(), 0);
  EXPECT_EQ(kv.PeekCachedPrefix(a, 0), 0);
  EXPECT_EQ(kv.NumFreeBlocks(), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

// The observer sees each cached block Allocate reuses, before its entry goes (its tokens and
// namespace still readable), and nothing for uncached blocks or DropCached.
TEST(KvCacheManagerTest, EvictionObserverSeesCachedBlocksBeforeReuse) {
  struct Recorder : EvictionObserver {
    const KvCacheManager* kv = nullptr;
    std::vector<int32_t> blocks;
    std::vector<V> tokens;
    void OnEvict(int32_t block_id) override {
      EXPECT_TRUE(kv->prefix_cache().is_cached(block_id));
      blocks.push_back(block_id);
      const std::span<const int32_t> t = kv->prefix_cache().Tokens(block_id);
      tokens.emplace_back(t.begin(), t.end());
    }
  } recorder;
  KvCacheManager kv(Config(6, 4));  // each prompt: one full (cached) block and one partial
  recorder.kv = &kv;
  kv.set_eviction_observer(&recorder);
  const V a = Iota(5, 0), b = Iota(5, 100), c = Iota(5, 200);
  RunPrompt(kv, 1, a);
  RunPrompt(kv, 2, b);
  RunPrompt(kv, 3, c);
  kv.Free(1);
  kv.Free(2);
  kv.Free(3);
  ASSERT_TRUE(kv.Allocate(4, 12));  // the uncached free blocks first: nothing evicted
  EXPECT_TRUE(recorder.blocks.empty());
  ASSERT_TRUE(kv.Allocate(4, 16));  // then a's block, the least recently freed
  ASSERT_EQ(recorder.blocks.size(), 1u);
  EXPECT_EQ(recorder.tokens[0], Iota(4, 0));
  EXPECT_FALSE(kv.prefix_cache().is_cached(recorder.blocks[0]));
  kv.DropCached(std::nullopt);  // forgetting is not an eviction
  ASSERT_TRUE(kv.Allocate(4, 24));
  EXPECT_EQ(recorder.blocks.size(), 1u);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(KvCacheManagerTest, FreeingASharedBlockKeepsItForTheOtherSequence) {
  KvCacheManager kv(Config(8));
  const V prompt = Iota(9);
  RunPrompt(kv, 1, prompt);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, prompt, 0), 8);
  ASSERT_TRUE(kv.Allocate(2, 9));
  const V t1 = kv.BlockTable(1), t2 = kv.BlockTable(2);
  EXPECT_EQ(t1[0], t2[0]);
  EXPECT_EQ(t1[1], t2[1]);
  EXPECT_NE(t1[2], t2[2]);  // the partial block is private
  EXPECT_EQ(kv.RefCount(t1[0]), 2);
  EXPECT_EQ(kv.NumUsedBlocks(), 4);
  kv.Free(1);
  EXPECT_EQ(kv.RefCount(t1[0]), 1);
  EXPECT_FALSE(kv.pool().is_free(t1[0]));
  EXPECT_TRUE(kv.pool().is_free(t1[2]));
  EXPECT_EQ(kv.NumUsedBlocks(), 3);
  EXPECT_EQ(kv.CheckInvariants(), "");
  kv.Free(2);
  EXPECT_EQ(kv.NumUsedBlocks(), 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(KvCacheManagerTest, CommitIsIncrementalAndIdempotent) {
  KvCacheManager kv(Config(8));
  V tokens = Iota(6);
  EXPECT_EQ(kv.AcquireCachedPrefix(1, tokens, 0), 0);
  ASSERT_TRUE(kv.Allocate(1, 6));
  kv.CommitComputed(1, tokens, 3, 0);  // chunked prefill: no full block yet
  EXPECT_EQ(kv.NumCachedBlocks(), 0);
  kv.CommitComputed(1, tokens, 6, 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 1);
  kv.CommitComputed(1, tokens, 6, 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 1);
  // Decode: generated tokens join the sequence and fill the second block.
  tokens.push_back(6);
  tokens.push_back(7);
  ASSERT_TRUE(kv.Allocate(1, 8));
  kv.CommitComputed(1, tokens, 7, 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 1);
  kv.CommitComputed(1, tokens, 8, 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  EXPECT_EQ(kv.CheckInvariants(), "");
  // Preemption and restart: the sequence gets its own computed blocks back.
  const V table = kv.BlockTable(1);
  kv.Free(1);
  tokens.push_back(8);
  EXPECT_EQ(kv.AcquireCachedPrefix(1, tokens, 0), 8);
  EXPECT_EQ(kv.BlockTable(1), table);
}

TEST(KvCacheManagerTest, DuplicateComputationKeepsOneEntryAndChainsThroughIt) {
  KvCacheManager kv(Config(16));
  const V p1 = Iota(9);                       // blocks A0 A1 (+ partial)
  const V p2 = Concat(Iota(8), Iota(5, 50));  // same two blocks, then a third full block
  // Both computed without sharing (admitted in the same step before either committed).
  EXPECT_EQ(kv.AcquireCachedPrefix(1, p1, 0), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, p2, 0), 0);
  ASSERT_TRUE(kv.Allocate(1, 9));
  ASSERT_TRUE(kv.Allocate(2, 13));
  kv.CommitComputed(1, p1, 9, 0);
  kv.CommitComputed(2, p2, 13, 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 3);  // seq 2's first two blocks are duplicates, not registered
  EXPECT_EQ(kv.CheckInvariants(), "");
  const V t1 = kv.BlockTable(1), t2 = kv.BlockTable(2);
  EXPECT_EQ(kv.AcquireCachedPrefix(3, Concat(p2, V{1}), 0), 12);
  EXPECT_EQ(kv.BlockTable(3), (V{t1[0], t1[1], t2[2]}));
  EXPECT_EQ(kv.CheckInvariants(), "");
}

// ChainEnd names the cached block of any block of a sequence's registered chain (through another
// sequence's duplicates), not only its last; none past the chain or once a chain block is gone.
TEST(KvCacheManagerTest, ChainEndNamesEveryBlockOfTheRegisteredChain) {
  KvCacheManager kv(Config(10));
  const V p = Iota(13);  // three full blocks
  EXPECT_EQ(kv.AcquireCachedPrefix(1, p, 0), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, p, 0), 0);
  ASSERT_TRUE(kv.Allocate(1, 13));
  ASSERT_TRUE(kv.Allocate(2, 13));
  kv.CommitComputed(1, p, 13, 0);
  kv.CommitComputed(2, p, 13, 0);  // duplicates: seq 2's chain runs through seq 1's blocks
  const V t1 = kv.BlockTable(1);
  for (int32_t n = 1; n <= 3; ++n) {
    for (SeqId seq : {1, 2}) {
      const std::optional<BlockRef> ref = kv.ChainEnd(seq, n);
      ASSERT_TRUE(ref.has_value()) << seq << " " << n;
      EXPECT_EQ(ref->block_id, t1[static_cast<size_t>(n - 1)]) << seq << " " << n;
      EXPECT_EQ(*ref, kv.prefix_cache().Ref(ref->block_id));
    }
  }
  EXPECT_FALSE(kv.ChainEnd(1, 4).has_value());
  EXPECT_FALSE(kv.ChainEnd(1, 0).has_value());
  // Seq 1's blocks evicted: seq 2's chain ran through them, so its earlier blocks are unknown.
  kv.Free(1);
  ASSERT_TRUE(kv.Allocate(3, kv.NumFreeBlocks() * 4));
  EXPECT_FALSE(kv.ChainEnd(2, 1).has_value());
  EXPECT_EQ(kv.CheckInvariants(), "");
}

// When the block a chain ran through (another sequence's duplicate) is evicted, the next commit
// re-registers this sequence's own blocks so its whole prefix stays reachable.
TEST(KvCacheManagerTest, EvictedDuplicateIsReplacedByOwnBlocks) {
  KvCacheManager kv(Config(10));
  const V p = Iota(9);
  EXPECT_EQ(kv.AcquireCachedPrefix(1, p, 0), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, p, 0), 0);
  ASSERT_TRUE(kv.Allocate(1, 9));
  ASSERT_TRUE(kv.Allocate(2, 9));
  kv.CommitComputed(1, p, 9, 0);
  kv.CommitComputed(2, p, 9, 0);  // duplicates of seq 1's blocks: not registered
  EXPECT_EQ(kv.NumCachedBlocks(), 2);
  kv.Free(1);
  ASSERT_TRUE(kv.Allocate(3, kv.NumFreeBlocks() * 4));  // evicts seq 1's cached blocks
  kv.Free(3);
  EXPECT_EQ(kv.NumCachedBlocks(), 0);
  // seq 2 decodes into its third block; its commit re-registers blocks 0..2 as its own.
  V tokens = Concat(p, V{9, 10, 11});
  ASSERT_TRUE(kv.Allocate(2, 12));
  kv.CommitComputed(2, tokens, 12, 0);
  EXPECT_EQ(kv.NumCachedBlocks(), 3);
  EXPECT_EQ(kv.CheckInvariants(), "");
  const V table = kv.BlockTable(2);
  kv.Free(2);
  EXPECT_EQ(kv.AcquireCachedPrefix(4, Concat(tokens, V{1}), 0), 12);
  EXPECT_EQ(kv.BlockTable(4), table);
}

// A deliberately terrible hash: every block collides with every other.
uint64_t ConstantHash(uint64_t, std::span<const int32_t>, uint64_t) {
  return 1;
}

TEST(KvCacheManagerTest, HashCollisionsNeverReturnWrongBlocks) {
  KvCacheManager kv(Config(16), ConstantHash);
  const V x = Concat(Iota(4, 0), Iota(4, 10));   // [a][c]
  const V y = Concat(Iota(4, 20), Iota(4, 10));  // [b][c]: same second block, other parent
  RunPrompt(kv, 1, Concat(x, V{99}));
  RunPrompt(kv, 2, Concat(Iota(4, 20), V{98}));  // registers [b] only
  EXPECT_EQ(kv.NumCachedBlocks(), 3);
  // Under a parent-key-only check [c] would match after [b]; the parent identity check refuses.
  EXPECT_EQ(kv.PeekCachedPrefix(Concat(y, V{97}), 0), 4);
  EXPECT_EQ(kv.PeekCachedPrefix(Concat(x, V{97}), 0), 8);
  EXPECT_EQ(kv.PeekCachedPrefix(Iota(9, 30), 0), 0);
  EXPECT_EQ(kv.PeekCachedPrefix(Concat(x, V{97}), 1), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(3, Concat(y, V{97}), 0), 4);
  EXPECT_EQ(kv.BlockTable(3), V{kv.BlockTable(2)[0]});
  EXPECT_EQ(kv.CheckInvariants(), "");
}

// A hash that ignores the parent: a child's key is the same under any parent.
uint64_t ParentBlindHash(uint64_t, std::span<const int32_t> tokens, uint64_t ns) {
  return HashBlockTokens(kRootBlockKey, tokens, ns);
}

TEST(KvCacheManagerTest, ChildOfAnEvictedAndReusedParentIsNotReturned) {
  KvCacheManager kv(Config(4), ParentBlindHash);
  const V p = Iota(4, 0), c = Iota(4, 10), q = Iota(4, 20);
  // A computes [P]; B computes [P][C] concurrently, so B's [C] is registered under A's [P].
  EXPECT_EQ(kv.AcquireCachedPrefix(1, p, 0), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, Concat(Concat(p, c), V{1}), 0), 0);
  ASSERT_TRUE(kv.Allocate(1, 4));
  ASSERT_TRUE(kv.Allocate(2, 9));
  kv.CommitComputed(1, p, 4, 0);
  kv.CommitComputed(2, Concat(Concat(p, c), V{1}), 9, 0);
  const int32_t parent_block = kv.BlockTable(1)[0];
  kv.Free(1);
  // Q takes A's block (evicting [P]) and registers [Q] in it: same block id, new epoch.
  EXPECT_EQ(kv.AcquireCachedPrefix(3, q, 0), 0);
  ASSERT_TRUE(kv.Allocate(3, 4));
  ASSERT_EQ(kv.BlockTable(3)[0], parent_block);
  kv.CommitComputed(3, q, 4, 0);
  EXPECT_EQ(kv.PeekCachedPrefix(Concat(Concat(q, c), V{1}), 0), 4);  // [Q] hits, [C] must not
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(KvCacheManagerTest, PrefixCachingOff) {
  KvCacheManager kv(Config(8, 4, /*prefix=*/false));
  RunPrompt(kv, 1, Iota(9));
  kv.Free(1);
  EXPECT_EQ(kv.NumCachedBlocks(), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, Iota(9), 0), 0);
  EXPECT_EQ(kv.prefix_queries_tokens(), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(KvCacheManagerDeathTest, AcquireOnASequenceWithBlocksAborts) {
  KvCacheManager kv(Config(4));
  ASSERT_TRUE(kv.Allocate(1, 4));
  EXPECT_DEATH(kv.AcquireCachedPrefix(1, Iota(5), 0), "already holds blocks");
}

}  // namespace
}  // namespace ember::kv

namespace ember::kv {
namespace {

// DropCached (POST /v1/cache/clear): one namespace's free cached blocks become plain free blocks
// at the front, a running sequence keeps its blocks and registers them again as it commits.
TEST(KvCacheManagerTest, DropCachedForgetsOneNamespaceOrAll) {
  KvCacheManager kv(Config(16));
  RunPrompt(kv, 1, Iota(9), /*ns=*/1);
  RunPrompt(kv, 2, Iota(9), /*ns=*/2);
  kv.Free(1);
  kv.Free(2);
  EXPECT_EQ(kv.NumCachedBlocks(), 4);
  EXPECT_EQ(kv.DropCached(uint64_t{1}), 2);
  EXPECT_EQ(kv.CheckInvariants(), "");
  EXPECT_EQ(kv.PeekCachedPrefix(Iota(9), 1), 0);
  EXPECT_EQ(kv.PeekCachedPrefix(Iota(9), 2), 8);
  // A running sequence's blocks: forgotten now, registered again by its next commit.
  const V longer = Iota(13);
  EXPECT_EQ(kv.AcquireCachedPrefix(3, longer, 2), 8);
  ASSERT_TRUE(kv.Allocate(3, 13));
  EXPECT_EQ(kv.DropCached(std::nullopt), 2);
  EXPECT_EQ(kv.NumCachedBlocks(), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
  kv.CommitComputed(3, longer, 13, 2);
  EXPECT_EQ(kv.NumCachedBlocks(), 3);
  EXPECT_EQ(kv.CheckInvariants(), "");
  EXPECT_EQ(kv.PeekCachedPrefix(longer, 2), 12);
}

}  // namespace
}  // namespace ember::kv
