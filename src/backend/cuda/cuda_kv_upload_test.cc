// The prompt cache's block uploads on CUDA (cuda_kv_upload.cc): CopyKvBlockFromHost stages
// records in page-locked halves and sends a half when it fills or when something reads the
// pool. Every block must read back (CopyKvBlockToHost, and CopyKvBlocksToHost's gathers: 2 MiB
// records, 16 to a 32 MiB batch, so 47 blocks out of order take 3) as the last record staged for
// it, across several sends, in a bf16 pool and in an int8 pool whose segments are not 16-byte
// multiples.
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

}  // namespace
}  // namespace ember::cuda_test
