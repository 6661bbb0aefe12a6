// Prefetcher: a job's blocks move from disk to RAM, verified, in order; a block already in RAM is
// not read again; a missing or damaged block ends its job (the rest stays on disk); the queue
// bound drops whole jobs and counts them; WaitIfFetching returns at once for keys of no job in
// progress.
#include "prompt_cache/prefetcher.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "prompt_cache/store_testing.h"

namespace ember::prompt_cache {
namespace {

const Key kFp = Sha256Of("model A");

// Block i of one chain of `n` blocks (parents chained).
std::vector<PrefetchBlock> Chain(int n, int seed) {
  std::vector<PrefetchBlock> out;
  Key parent = RootKey(kFp, 0, "");
  for (int i = 0; i < n; ++i) {
    PrefetchBlock b;
    b.tokens = {seed, i, i + 1, i + 2};
    b.parent = parent;
    b.key = ChainKey(parent, b.tokens);
    parent = b.key;
    out.push_back(b);
  }
  return out;
}

BlockIdentity Id(const PrefetchBlock& b) { return {kFp, b.parent, b.key, b.ns, b.tokens}; }

std::vector<uint8_t> Payload(const Key& key) {
  std::vector<uint8_t> p(kPayload);
  for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<uint8_t>(key[j % key.size()] + j);
  return p;
}

class PrefetcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto disk = DiskStore::Open(TestDiskConfig(dir_, kFp, kBlockSize, kPayload, 100));
    ASSERT_TRUE(disk.ok()) << disk.message();
    disk_ = std::move(disk).value();
    RamStoreConfig rc;
    rc.max_bytes = 50 * RecordBytes(kBlockSize, kPayload);
    rc.fingerprint = kFp;
    rc.block_size = kBlockSize;
    rc.payload_bytes = kPayload;
    ram_ = std::make_unique<RamStore>(rc);
  }
  void TearDown() override {
    ram_.reset();
    disk_.reset();
  }
  void Store(const std::vector<PrefetchBlock>& chain) {
    for (const PrefetchBlock& b : chain) {
      RecordBuffer record = disk_->NewRecord();
      const std::vector<uint8_t> p = Payload(b.key);
      std::copy(p.begin(), p.end(), record.bytes().begin() + PayloadOffset(kBlockSize));
      disk_->Write(Id(b), std::move(record));
    }
    disk_->Flush();
  }

  ScopedTempDir tmp_{"ember_prefetcher"};
  const std::string dir_ = tmp_.path();
  std::unique_ptr<DiskStore> disk_;
  std::unique_ptr<RamStore> ram_;
};

TEST_F(PrefetcherTest, MovesAJobsBlocksFromDiskToRamVerified) {
  const std::vector<PrefetchBlock> chain = Chain(6, 1);
  Store(chain);
  // Block 2 is in RAM already: it is refreshed, not read again.
  {
    RecordBuffer record = ram_->NewRecord();
    const std::vector<uint8_t> p = Payload(chain[2].key);
    std::copy(p.begin(), p.end(), record.bytes().begin() + PayloadOffset(kBlockSize));
    ram_->Insert(Id(chain[2]), std::move(record));
  }
  const int64_t disk_hits_before = disk_->Stats().hits;
  Prefetcher prefetcher(ram_.get(), disk_.get(), 100);
  EXPECT_TRUE(prefetcher.Enqueue(chain));
  prefetcher.Drain();
  const PrefetcherStats s = prefetcher.Stats();
  EXPECT_EQ(s.fetched, 5);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.queued_blocks, 0);
  EXPECT_EQ(disk_->Stats().hits - disk_hits_before, 5);
  for (const PrefetchBlock& b : chain) {
    const RamStore::Record r = ram_->Read(Id(b));
    ASSERT_NE(r, nullptr);
    const std::span<const uint8_t> p = RecordPayload(r->bytes(), kBlockSize, kPayload);
    EXPECT_EQ(std::vector<uint8_t>(p.begin(), p.end()), Payload(b.key));
  }
  EXPECT_FALSE(prefetcher.WaitIfFetching(chain[0].key));  // no job in progress
}

TEST_F(PrefetcherTest, AMissingOrDamagedBlockEndsItsJob) {
  const std::vector<PrefetchBlock> chain = Chain(6, 2);
  std::vector<PrefetchBlock> stored = chain;
  stored.erase(stored.begin() + 3);  // block 3 never reached the disk
  Store(stored);
  Prefetcher prefetcher(ram_.get(), disk_.get(), 100);
  prefetcher.Enqueue(chain);
  prefetcher.Drain();
  EXPECT_EQ(prefetcher.Stats().fetched, 3);
  EXPECT_EQ(prefetcher.Stats().failed, 1);
  EXPECT_TRUE(ram_->Contains(chain[2].key));
  EXPECT_FALSE(ram_->Contains(chain[4].key));

  // A flipped byte in another chain's block 1: refused by the disk (removed, counted), job ends.
  const std::vector<PrefetchBlock> other = Chain(3, 3);
  Store(other);
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
    if (e.path().string().find(HexOf(other[1].key)) == std::string::npos) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    const char c = static_cast<char>(f.peek());
    f.seekp(200);
    f.put(static_cast<char>(c ^ 1));
  }
  prefetcher.Enqueue(other);
  prefetcher.Drain();
  EXPECT_TRUE(ram_->Contains(other[0].key));
  EXPECT_FALSE(ram_->Contains(other[1].key));
  EXPECT_FALSE(ram_->Contains(other[2].key));
  EXPECT_EQ(prefetcher.Stats().failed, 2);
  EXPECT_EQ(disk_->Stats().corrupt_dropped, 1);
}

TEST_F(PrefetcherTest, TheQueueBoundDropsWholeJobs) {
  Prefetcher prefetcher(ram_.get(), disk_.get(), /*max_queued_blocks=*/4);
  EXPECT_FALSE(prefetcher.Enqueue(Chain(5, 4)));
  EXPECT_EQ(prefetcher.Stats().dropped_jobs, 1);
  EXPECT_TRUE(prefetcher.Enqueue({}));
  prefetcher.Drain();
  EXPECT_EQ(prefetcher.Stats().fetched, 0);
}

}  // namespace
}  // namespace ember::prompt_cache
