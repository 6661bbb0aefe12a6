#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace ember::kv {
namespace {

using V = std::vector<int32_t>;

TEST(BlockPoolTest, StartsAllFreeInIdOrder) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_blocks(), 4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.FreeList(), (V{0, 1, 2, 3}));
  EXPECT_EQ(pool.front(), 0);
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(BlockPoolTest, PopFrontTakesFrontWithRefOne) {
  BlockPool pool(3);
  EXPECT_EQ(pool.PopFront(), 0);
  EXPECT_EQ(pool.PopFront(), 1);
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_EQ(pool.ref_count(2), 0);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.FreeList(), (V{2}));
  EXPECT_EQ(pool.PopFront(), 2);
  EXPECT_EQ(pool.front(), -1);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(BlockPoolTest, ReleaseJoinsTheRequestedEnd) {
  BlockPool pool(4);
  for (int i = 0; i < 4; ++i) pool.PopFront();
  EXPECT_TRUE(pool.Release(2, BlockPool::FreeEnd::kBack));
  EXPECT_TRUE(pool.Release(0, BlockPool::FreeEnd::kBack));
  EXPECT_TRUE(pool.Release(3, BlockPool::FreeEnd::kFront));
  EXPECT_EQ(pool.FreeList(), (V{3, 2, 0}));
  EXPECT_EQ(pool.PopFront(), 3);
  EXPECT_EQ(pool.PopFront(), 2);
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(BlockPoolTest, SharedBlockFreedOnlyByLastReference) {
  BlockPool pool(2);
  const int32_t b = pool.PopFront();
  pool.AddRef(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  EXPECT_FALSE(pool.Release(b, BlockPool::FreeEnd::kBack));
  EXPECT_FALSE(pool.is_free(b));
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_TRUE(pool.Release(b, BlockPool::FreeEnd::kBack));
  EXPECT_EQ(pool.FreeList(), (V{1, 0}));
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(BlockPoolTest, AddRefRevivesFromTheMiddle) {
  BlockPool pool(5);
  pool.AddRef(2);  // revive a free block directly (prefix-cache hit)
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.FreeList(), (V{0, 1, 3, 4}));
  pool.AddRef(0);
  pool.AddRef(4);
  EXPECT_EQ(pool.FreeList(), (V{1, 3}));
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.CheckInvariants(), "");
  pool.Release(4, BlockPool::FreeEnd::kFront);
  EXPECT_EQ(pool.FreeList(), (V{4, 1, 3}));
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(BlockPoolTest, EmptyPool) {
  BlockPool pool(0);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.front(), -1);
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(BlockPoolDeathTest, DoubleFreeAborts) {
  BlockPool pool(1);
  const int32_t b = pool.PopFront();
  pool.Release(b, BlockPool::FreeEnd::kFront);
  EXPECT_DEATH(pool.Release(b, BlockPool::FreeEnd::kFront), "double free");
}

TEST(BlockPoolDeathTest, PopFromEmptyAborts) {
  BlockPool pool(1);
  pool.PopFront();
  EXPECT_DEATH(pool.PopFront(), "no free block");
}

}  // namespace
}  // namespace ember::kv
