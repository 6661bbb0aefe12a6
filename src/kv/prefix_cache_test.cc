#include "kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace ember::kv {
namespace {

using V = std::vector<int32_t>;

uint64_t ConstantHash(uint64_t, std::span<const int32_t>, uint64_t) {
  return 42;
}
// Distinct keys for distinct first tokens only, ignoring parent and namespace.
uint64_t FirstTokenHash(uint64_t, std::span<const int32_t> tokens, uint64_t) {
  return static_cast<uint64_t>(tokens[0]);
}

TEST(HashBlockTokensTest, DependsOnEveryInput) {
  const V a = {1, 2, 3, 4};
  const uint64_t h = HashBlockTokens(kRootBlockKey, a, 0);
  EXPECT_EQ(h, HashBlockTokens(kRootBlockKey, a, 0));
  EXPECT_NE(h, HashBlockTokens(kRootBlockKey + 1, a, 0));
  EXPECT_NE(h, HashBlockTokens(kRootBlockKey, a, 1));
  EXPECT_NE(h, HashBlockTokens(kRootBlockKey, V{1, 2, 4, 3}, 0));
  EXPECT_NE(h, HashBlockTokens(kRootBlockKey, V{1, 2, 3, 5}, 0));
  EXPECT_NE(h, HashBlockTokens(kRootBlockKey, V{1, 2, 3}, 0));
  EXPECT_NE(HashBlockTokens(kRootBlockKey, V{0, 1}, 0), HashBlockTokens(kRootBlockKey, V{1, 0}, 0));
}

TEST(PrefixCacheTest, InsertFindEvict) {
  PrefixCache cache(8, 4);
  const V t = {5, 6, 7, 8};
  const uint64_t key = cache.Hash(kRootBlockKey, t, 0);
  EXPECT_EQ(cache.Find(key, BlockRef{}, t, 0), -1);
  cache.Insert(3, key, kRootBlockKey, BlockRef{}, t, 0);
  EXPECT_TRUE(cache.is_cached(3));
  EXPECT_EQ(cache.num_cached(), 1);
  EXPECT_EQ(cache.Find(key, BlockRef{}, t, 0), 3);
  EXPECT_EQ(V(cache.Tokens(3).begin(), cache.Tokens(3).end()), t);
  EXPECT_EQ(cache.Find(key, BlockRef{}, t, 1), -1);              // other namespace
  EXPECT_EQ(cache.Find(key, BlockRef{0, 1}, t, 0), -1);          // other parent
  EXPECT_EQ(cache.Find(key, BlockRef{}, V{5, 6, 7, 9}, 0), -1);  // other tokens
  EXPECT_EQ(cache.CheckInvariants(), "");
  cache.Evict(3);
  EXPECT_FALSE(cache.is_cached(3));
  EXPECT_EQ(cache.num_cached(), 0);
  EXPECT_EQ(cache.Find(key, BlockRef{}, t, 0), -1);
  cache.Evict(3);  // no-op
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(PrefixCacheTest, ReRegisteredParentGetsANewEpoch) {
  PrefixCache cache(4, 2);
  const V p = {1, 2}, c = {3, 4};
  const uint64_t pk = cache.Hash(kRootBlockKey, p, 0);
  cache.Insert(0, pk, kRootBlockKey, BlockRef{}, p, 0);
  const BlockRef parent = cache.Ref(0);
  const uint64_t ck = cache.Hash(pk, c, 0);
  cache.Insert(1, ck, pk, parent, c, 0);
  EXPECT_EQ(cache.Find(ck, parent, c, 0), 1);
  // Block 0 is evicted and reused for the same content: the child must not match the new one.
  cache.Evict(0);
  cache.Insert(0, pk, kRootBlockKey, BlockRef{}, p, 0);
  EXPECT_NE(cache.Ref(0), parent);
  EXPECT_EQ(cache.Find(ck, cache.Ref(0), c, 0), -1);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(PrefixCacheTest, CollidingKeysAreVerified) {
  PrefixCache cache(8, 2, ConstantHash);
  for (int32_t b = 0; b < 6; ++b) {
    const V t = {b, b};
    cache.Insert(b, 42, kRootBlockKey, BlockRef{}, t, 0);
  }
  EXPECT_EQ(cache.CheckInvariants(), "");
  for (int32_t b = 0; b < 6; ++b) EXPECT_EQ(cache.Find(42, BlockRef{}, V{b, b}, 0), b);
  EXPECT_EQ(cache.Find(42, BlockRef{}, V{7, 7}, 0), -1);
  // Evict from the middle, the head and the tail of the collision chain.
  cache.Evict(2);
  cache.Evict(5);
  cache.Evict(0);
  EXPECT_EQ(cache.CheckInvariants(), "");
  EXPECT_EQ(cache.num_cached(), 3);
  for (int32_t b : {1, 3, 4}) EXPECT_EQ(cache.Find(42, BlockRef{}, V{b, b}, 0), b);
  for (int32_t b : {0, 2, 5}) EXPECT_EQ(cache.Find(42, BlockRef{}, V{b, b}, 0), -1);
}

// Random inserts and evictions against a std::map model exercise the open-addressing index
// (probe runs, wrap-around, backward-shift deletion).
TEST(PrefixCacheTest, RandomIndexMatchesModel) {
  constexpr int32_t kBlocks = 32;
  PrefixCache cache(kBlocks, 1, FirstTokenHash);
  std::map<int32_t, int32_t> model;  // token -> block
  std::vector<int32_t> token_of(kBlocks, -1);
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const int32_t b = static_cast<int32_t>(rng() % kBlocks);
    if (cache.is_cached(b)) {
      cache.Evict(b);
      model.erase(token_of[b]);
      token_of[b] = -1;
    } else {
      int32_t t;
      do t = static_cast<int32_t>(rng() % 1000);
      while (model.contains(t));
      const V tokens = {t};
      cache.Insert(b, static_cast<uint64_t>(t), kRootBlockKey, BlockRef{}, tokens, 0);
      model[t] = b;
      token_of[b] = t;
    }
    ASSERT_EQ(cache.CheckInvariants(), "") << "step " << step;
    ASSERT_EQ(cache.num_cached(), static_cast<int32_t>(model.size()));
    const int32_t probe = static_cast<int32_t>(rng() % 1000);
    const auto it = model.find(probe);
    ASSERT_EQ(cache.Find(static_cast<uint64_t>(probe), BlockRef{}, V{probe}, 0),
              it == model.end() ? -1 : it->second);
  }
}

}  // namespace
}  // namespace ember::kv
