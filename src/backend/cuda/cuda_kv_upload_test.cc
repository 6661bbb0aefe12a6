// The prompt cache's block uploads on CUDA (cuda_kv_upload.cc): CopyKvBlockFromHost stages
// records in page-locked halves and sends a half when it fills or when something reads the
// pool. Every block must read back (CopyKvBlockToHost, and CopyKvBlocksToHost's gathers: 2 MiB
// records, 16 to a 32 MiB batch, so 47 blocks out of order take 3) as the last record staged for
// it, across several sends, in a bf16 pool and in an int8 pool whose segments are not 16-byte
// multiples.
// Page-locked records (the RAM tier's, AllocPinnedHost): CopyKvBlockFromPinned queues blocks read
// in place at the next send, in order with the staged ones (the later write of a block wins
// whichever path each took), PinnedReadsDone says when the reads are over, and a batch read into
// page-locked outputs (the gather writes them directly) equals one into plain memory.
// Skips when no CUDA device is present (CI has none). One of the sources of cuda_ops_test.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/cuda_test_util.h"
#include "backend/kv_format.h"

namespace ember::cuda_test {
namespace {

TEST_F(CudaOpsTest, KvBlockUploadsReadBackAcrossSends) {
  struct Case {
    int32_t layers, block_size, heads, head_dim;
    KvDType dtype;
  };
  // 32 layers of the 8B's shape: 2 MiB records, 16 to a staging half, so 48 blocks take 3 sends.
  for (const Case c : {Case{32, 16, 8, 128, KvDType::kAuto}, Case{6, 3, 2, 64, KvDType::kInt8}}) {
    SCOPED_TRACE(c.layers);
    auto be = Make(false);
    KvFormat format;
    format.layers.assign(static_cast<size_t>(c.layers), c.dtype);
    format.layers[0] = KvDType::kAuto;  // a mixed pool: layer 0 in the pool's own type
    ASSERT_TRUE(be->SetKvFormat(format, c.head_dim).ok());
    constexpr int32_t kBlocks = 48;
    ASSERT_TRUE(be->AllocateKvPool(c.layers, kBlocks, c.block_size, c.heads, c.head_dim).ok());
    const size_t bytes = static_cast<size_t>(be->KvBlockBytes());
    std::mt19937 rng(3);
    std::vector<std::vector<uint8_t>> want(kBlocks);
    auto stage = [&](int32_t b) {
      want[static_cast<size_t>(b)].resize(bytes);
      for (uint8_t& x : want[static_cast<size_t>(b)]) x = static_cast<uint8_t>(rng());
      ASSERT_TRUE(be->CopyKvBlockFromHost(b, want[static_cast<size_t>(b)]).ok());
    };
    for (int32_t b = 0; b < kBlocks; ++b) stage(b);
    stage(kBlocks - 1);  // staged twice in one half: the later record wins
    stage(5);            // staged again after its half was sent
    std::vector<uint8_t> got(bytes);
    for (int32_t b = 0; b < kBlocks; ++b) {
      ASSERT_TRUE(be->CopyKvBlockToHost(b, got).ok());
      EXPECT_TRUE(got == want[static_cast<size_t>(b)]) << "block " << b;
    }
    // Staged again, then read in one batch without a send in between (the batch sends first).
    stage(7);
    std::vector<int32_t> order;
    for (int32_t b = kBlocks - 1; b > 0; --b) order.push_back(b);  // 47 blocks, descending
    std::vector<std::vector<uint8_t>> batch(order.size(), std::vector<uint8_t>(bytes));
    const std::vector<std::span<uint8_t>> outs(batch.begin(), batch.end());
    ASSERT_TRUE(be->CopyKvBlocksToHost(order, outs).ok());
    for (size_t i = 0; i < order.size(); ++i)
      EXPECT_TRUE(batch[i] == want[static_cast<size_t>(order[i])]) << "block " << order[i];
  }
}

TEST_F(CudaOpsTest, PinnedKvBlocksReadInPlaceInOrder) {
  for (const KvDType dtype : {KvDType::kAuto, KvDType::kInt8}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    auto be = Make(false);
    ASSERT_TRUE(be->HasPinnedHost());
    KvFormat format;
    format.layers.assign(4, dtype);
    ASSERT_TRUE(be->SetKvFormat(format, 64).ok());
    constexpr int32_t kBlocks = 40;
    ASSERT_TRUE(be->AllocateKvPool(4, kBlocks, 16, 2, 64).ok());
    const size_t bytes = static_cast<size_t>(be->KvBlockBytes());
    // Records 256 bytes apart plus a 192-byte header, as the RAM tier lays them out.
    const size_t stride = (bytes + 192 + 255) / 256 * 256;
    auto* pinned = static_cast<uint8_t*>(be->AllocPinnedHost(stride * (kBlocks + 8)));
    ASSERT_NE(pinned, nullptr);
    auto record = [&](int32_t slot) {
      return std::span<uint8_t>(pinned + static_cast<size_t>(slot) * stride + 192, bytes);
    };
    std::mt19937 rng(5);
    std::vector<std::vector<uint8_t>> want(kBlocks, std::vector<uint8_t>(bytes));
    auto fill = [&](std::span<uint8_t> r, int32_t b) {
      for (uint8_t& x : r) x = static_cast<uint8_t>(rng());
      want[static_cast<size_t>(b)].assign(r.begin(), r.end());
    };
    std::vector<uint8_t> plain(bytes);
    for (int32_t b = 0; b < kBlocks; ++b) {
      if (b % 3 == 0) {  // every third block staged from plain memory
        fill(plain, b);
        ASSERT_TRUE(be->CopyKvBlockFromHost(b, plain).ok());
      } else {
        fill(record(b), b);
        ASSERT_TRUE(be->CopyKvBlockFromPinned(b, record(b)).ok());
      }
    }
    // Block 4: pinned, then staged (the staged bytes win); block 6: staged, then pinned from
    // another record (the pinned one wins); block 8 queued twice (the second record wins).
    fill(plain, 4);
    ASSERT_TRUE(be->CopyKvBlockFromHost(4, plain).ok());
    fill(record(kBlocks), 6);
    ASSERT_TRUE(be->CopyKvBlockFromPinned(6, record(kBlocks)).ok());
    fill(record(kBlocks + 1), 8);
    ASSERT_TRUE(be->CopyKvBlockFromPinned(8, record(kBlocks + 1)).ok());
    EXPECT_FALSE(be->PinnedReadsDone(/*wait=*/false));  // queued, not sent
    EXPECT_TRUE(be->PinnedReadsDone(/*wait=*/true));
    EXPECT_TRUE(be->PinnedReadsDone(/*wait=*/false));
    // Read back into plain memory and, in one batch, into page-locked records (direct gather).
    std::vector<int32_t> order;
    for (int32_t b = kBlocks - 1; b >= 0; --b) order.push_back(b);
    std::vector<std::vector<uint8_t>> batch(order.size(), std::vector<uint8_t>(bytes));
    const std::vector<std::span<uint8_t>> outs(batch.begin(), batch.end());
    ASSERT_TRUE(be->CopyKvBlocksToHost(order, outs).ok());
    auto* back = static_cast<uint8_t*>(be->AllocPinnedHost(stride * kBlocks));
    ASSERT_NE(back, nullptr);
    std::vector<std::span<uint8_t>> pinned_outs;
    for (size_t i = 0; i < order.size(); ++i)
      pinned_outs.emplace_back(back + i * stride + 192, bytes);
    ASSERT_TRUE(be->CopyKvBlocksToHost(order, pinned_outs).ok());
    for (size_t i = 0; i < order.size(); ++i) {
      const std::vector<uint8_t>& w = want[static_cast<size_t>(order[i])];
      EXPECT_TRUE(batch[i] == w) << "block " << order[i];
      EXPECT_TRUE(std::equal(w.begin(), w.end(), pinned_outs[i].begin())) << "block " << order[i];
    }
    be->FreePinnedHost(back);
    be->FreePinnedHost(pinned);
  }
}

}  // namespace
}  // namespace ember::cuda_test
