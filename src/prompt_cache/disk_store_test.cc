// DiskStore and BlockRecord: records round-trip; torn, truncated, flipped, foreign and stale
// records are refused and counted, never returned; the byte cap holds at every point; eviction is
// least recently used (and survives a restart); another fingerprint sees nothing; a second opener
// is refused; leftover temp files are removed; clearing by namespace.
#include "prompt_cache/disk_store.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "prompt_cache/store_testing.h"

namespace ember::prompt_cache {
namespace {

using Block = TestBlock;

class DiskStoreTest : public ::testing::Test {
 protected:
  DiskStoreConfig Config(int64_t max_records = 100) const {
    return TestDiskConfig(dir_, fp_, kBlockSize, kPayload, max_records);
  }
  std::unique_ptr<DiskStore> Open(const DiskStoreConfig& c) {
    auto store = DiskStore::Open(c);
    EXPECT_TRUE(store.ok()) << store.message();
    return store.ok() ? std::move(store).value() : nullptr;
  }
  // Block i of one chain (namespace ns).
  static Block MakeBlock(int i, uint64_t ns = 0, const Key& fp = Sha256Of("model A")) {
    Block b;
    b.ns = ns;
    b.tokens = {i, i + 1, i + 2, i + 3};
    b.parent = i == 0 ? RootKey(fp, ns, "") : ChainKey(RootKey(fp, ns, ""), {});
    b.key = ChainKey(b.parent, b.tokens);
    return b;
  }
  static void Put(DiskStore& store, const Block& b, const Key& fp, int i) {
    RecordBuffer record = store.NewRecord();
    const std::vector<uint8_t> p = TestPayload(i);
    std::copy(p.begin(), p.end(), record.bytes().begin() + PayloadOffset(kBlockSize));
    EXPECT_EQ(store.Write(b.Id(fp), std::move(record)), DiskStore::WriteResult::kQueued);
  }
  std::vector<std::string> Files(const DiskStore& store) const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(store.path())) {
      if (e.path().extension() == ".kv") out.push_back(e.path().string());
    }
    return out;
  }
  std::string FileOf(const DiskStore& store, const Block& b) const {
    char tag[17];
    std::snprintf(tag, sizeof(tag), "%016llx", static_cast<unsigned long long>(b.ns));
    return store.path() + "/" + tag + "-" + HexOf(b.key) + ".kv";
  }

  ScopedTempDir tmp_{"ember_disk_store"};
  const std::string dir_ = tmp_.path();
  Key fp_ = Sha256Of("model A");
};

TEST_F(DiskStoreTest, WriteThenReadVerifies) {
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 3; ++i) Put(*store, MakeBlock(i), fp_, i);
  store->Flush();
  for (int i = 0; i < 3; ++i) {
    const auto payload = store->Read(MakeBlock(i).Id(fp_));
    ASSERT_EQ(payload.size(), static_cast<size_t>(kPayload)) << i;
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), TestPayload(i).begin()));
  }
  EXPECT_TRUE(store->Read(MakeBlock(7).Id(fp_)).empty());
  const DiskStoreStats s = store->Stats();
  EXPECT_EQ(s.records, 3);
  EXPECT_EQ(s.writes, 3);
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.bytes, 3 * store->record_bytes());
  EXPECT_EQ(s.bytes_read, 3 * store->record_bytes());
  EXPECT_EQ(s.corrupt_dropped, 0);
  // A second write of a stored key is not queued again.
  EXPECT_EQ(store->Write(MakeBlock(0).Id(fp_), store->NewRecord()),
            DiskStore::WriteResult::kPresent);
}

TEST_F(DiskStoreTest, ReadRefusesAnythingThatDiffers) {
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  const Block b = MakeBlock(1);
  Put(*store, b, fp_, 1);
  store->Flush();
  BlockIdentity wrong_tokens = b.Id(fp_);
  const std::vector<int32_t> other = {9, 9, 9, 9};
  wrong_tokens.tokens = other;
  EXPECT_TRUE(store->Read(wrong_tokens).empty());  // refused and dropped
  EXPECT_EQ(store->Stats().corrupt_dropped, 1);
  EXPECT_EQ(store->Stats().records, 0);
  Put(*store, b, fp_, 1);
  store->Flush();
  BlockIdentity wrong_parent = b.Id(fp_);
  wrong_parent.parent = Sha256Of("elsewhere");
  EXPECT_TRUE(store->Read(wrong_parent).empty());
  Put(*store, b, fp_, 1);
  store->Flush();
  BlockIdentity wrong_ns = b.Id(fp_);
  wrong_ns.ns = 5;
  EXPECT_TRUE(store->Read(wrong_ns).empty());
  EXPECT_EQ(store->Stats().corrupt_dropped, 3);
  EXPECT_EQ(store->Stats().hits, 0);
}

TEST_F(DiskStoreTest, FlippedAndTruncatedRecordsAreDroppedAndCounted) {
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 4; ++i) Put(*store, MakeBlock(i), fp_, i);
  store->Flush();
  {  // one payload byte flipped
    std::fstream f(FileOf(*store, MakeBlock(0)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(PayloadOffset(kBlockSize) + 17));
    f.put('\x5a');
  }
  {  // one header byte flipped (the checksum covers it)
    std::fstream f(FileOf(*store, MakeBlock(1)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x01');
  }
  ASSERT_EQ(truncate(FileOf(*store, MakeBlock(2)).c_str(), 100), 0);
  EXPECT_TRUE(store->Read(MakeBlock(0).Id(fp_)).empty());
  EXPECT_TRUE(store->Read(MakeBlock(1).Id(fp_)).empty());
  EXPECT_TRUE(store->Read(MakeBlock(2).Id(fp_)).empty());
  EXPECT_EQ(store->Read(MakeBlock(3).Id(fp_)).size(), static_cast<size_t>(kPayload));
  const DiskStoreStats s = store->Stats();
  EXPECT_EQ(s.corrupt_dropped, 3);
  EXPECT_EQ(s.records, 1);
  EXPECT_EQ(Files(*store).size(), 1u);  // the refused files are gone
}

TEST_F(DiskStoreTest, StartupRemovesTruncatedRecordsAndTempFilesWithoutReading) {
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 3; ++i) Put(*store, MakeBlock(i), fp_, i);
    store->Flush();
    ASSERT_EQ(truncate(FileOf(*store, MakeBlock(1)).c_str(), store->record_bytes() - 1), 0);
    // A crashed writer's temp file, and a foreign file that is left alone.
    std::ofstream(FileOf(*store, MakeBlock(5)) + ".tmp") << "partial";
    std::ofstream(store->path() + "/notes.txt") << "mine";
  }
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  const DiskStoreStats s = store->Stats();
  EXPECT_EQ(s.records, 2);
  EXPECT_EQ(s.corrupt_dropped, 1);
  EXPECT_EQ(s.stale_temps_removed, 1);
  EXPECT_TRUE(std::filesystem::exists(store->path() + "/notes.txt"));
  EXPECT_EQ(store->Read(MakeBlock(0).Id(fp_)).size(), static_cast<size_t>(kPayload));
  EXPECT_TRUE(store->Read(MakeBlock(1).Id(fp_)).empty());
  EXPECT_EQ(store->Read(MakeBlock(2).Id(fp_)).size(), static_cast<size_t>(kPayload));
}

TEST_F(DiskStoreTest, CapHoldsAndEvictionIsLeastRecentlyUsed) {
  auto store = Open(Config(/*max_records=*/3));
  ASSERT_NE(store, nullptr);
  const int64_t cap = store->config().max_bytes;
  for (int i = 0; i < 3; ++i) {
    Put(*store, MakeBlock(i), fp_, i);
    store->Flush();
    EXPECT_LE(store->Stats().bytes, cap);
  }
  ASSERT_FALSE(store->Read(MakeBlock(0).Id(fp_)).empty());  // 0 is now the most recent
  for (int i = 3; i < 6; ++i) {
    Put(*store, MakeBlock(i), fp_, i);
    store->Flush();
    const DiskStoreStats s = store->Stats();
    EXPECT_LE(s.bytes, cap);
    EXPECT_LE(static_cast<int64_t>(Files(*store).size()) * store->record_bytes(), cap);
  }
  // Written 0 1 2, read 0, then 3 4 5: 1 and 2 went first, then 0 (the least recent of the rest).
  EXPECT_FALSE(store->Contains(MakeBlock(1).key));
  EXPECT_FALSE(store->Contains(MakeBlock(2).key));
  EXPECT_FALSE(store->Contains(MakeBlock(0).key));
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(store->Contains(MakeBlock(i).key)) << i;
  EXPECT_EQ(store->Stats().evictions, 3);
}

TEST_F(DiskStoreTest, RecencySurvivesRestartAndSmallerCapEvictsOldest) {
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 3; ++i) {
      Put(*store, MakeBlock(i), fp_, i);
      store->Flush();
      usleep(20000);  // distinct modification times
    }
    ASSERT_FALSE(store->Read(MakeBlock(0).Id(fp_)).empty());
  }
  auto store = Open(Config(/*max_records=*/2));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().records, 2);
  EXPECT_TRUE(store->Contains(MakeBlock(0).key));  // read last: kept
  EXPECT_FALSE(store->Contains(MakeBlock(1).key));
  EXPECT_TRUE(store->Contains(MakeBlock(2).key));
}

TEST_F(DiskStoreTest, RecordLargerThanCapIsNeverWritten) {
  DiskStoreConfig c = Config();
  c.max_bytes = RecordBytes(kBlockSize, kPayload) - 1;
  auto store = Open(c);
  ASSERT_NE(store, nullptr);
  Put(*store, MakeBlock(0), fp_, 0);
  store->Flush();
  EXPECT_EQ(store->Stats().records, 0);
  EXPECT_EQ(store->Stats().bytes, 0);
  EXPECT_EQ(store->Stats().write_drops, 1);
  EXPECT_TRUE(Files(*store).empty());
}

TEST_F(DiskStoreTest, FullQueueDropsAndCounts) {
  DiskStoreConfig c = Config();
  c.max_queue_bytes = RecordBytes(kBlockSize, kPayload) - 1;  // nothing fits the queue
  auto store = Open(c);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Write(MakeBlock(0).Id(fp_), store->NewRecord()),
            DiskStore::WriteResult::kDropped);
  store->Flush();
  EXPECT_EQ(store->Stats().write_drops, 1);
  EXPECT_EQ(store->Stats().records, 0);
}

TEST_F(DiskStoreTest, AnotherFingerprintSharesNothing) {
  {
    auto store = Open(Config());
    ASSERT_NE(store, nullptr);
    Put(*store, MakeBlock(0), fp_, 0);
    store->Flush();
  }
  DiskStoreConfig other = Config();
  other.fingerprint = Sha256Of("model B");
  auto store = Open(other);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().records, 0);
  // Model A's record copied into B's directory under its file name: B still refuses it (the
  // fingerprint inside differs), and B's chain keys differ anyway.
  const Block a = MakeBlock(0);
  char tag[17];
  std::snprintf(tag, sizeof(tag), "%016llx", 0ull);
  const std::string a_file = dir_ + "/" + HexOf(fp_) + "/" + tag + "-" + HexOf(a.key) + ".kv";
  std::filesystem::copy_file(a_file, FileOf(*store, a));
  store.reset();
  store = Open(other);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Stats().records, 1);
  EXPECT_TRUE(store->Read(a.Id(other.fingerprint)).empty());
  EXPECT_EQ(store->Stats().corrupt_dropped, 1);
  EXPECT_NE(MakeBlock(0, 0, other.fingerprint).key, a.key);
}

TEST_F(DiskStoreTest, SecondOpenerIsRefusedUntilTheFirstCloses) {
  auto first = Open(Config());
  ASSERT_NE(first, nullptr);
  auto second = DiskStore::Open(Config());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.message().find("in use by another Ember engine (pid " +
                                  std::to_string(getpid())),
            std::string::npos)
      << second.message();
  first.reset();
  EXPECT_TRUE(DiskStore::Open(Config()).ok());
}

TEST_F(DiskStoreTest, ClearOneNamespaceOrAll) {
  auto store = Open(Config());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 3; ++i) Put(*store, MakeBlock(i, /*ns=*/1), fp_, i);
  for (int i = 0; i < 2; ++i) Put(*store, MakeBlock(i, /*ns=*/2), fp_, i);
  store->Flush();
  EXPECT_EQ(store->Clear(uint64_t{1}), 3);
  EXPECT_EQ(store->Stats().records, 2);
  EXPECT_TRUE(store->Read(MakeBlock(0, 1).Id(fp_)).empty());
  EXPECT_FALSE(store->Read(MakeBlock(0, 2).Id(fp_)).empty());
  EXPECT_EQ(store->Clear(std::nullopt), 2);
  EXPECT_EQ(store->Stats().records, 0);
  EXPECT_EQ(store->Stats().bytes, 0);
  EXPECT_TRUE(Files(*store).empty());
}

TEST(BlockRecordTest, KeysSeparateSaltsNamespacesAndModels) {
  const Key a = Sha256Of("model A");
  EXPECT_NE(RootKey(a, 0, ""), RootKey(a, 0, "salt"));
  EXPECT_NE(RootKey(a, 0, "x"), RootKey(a, 0, "y"));
  EXPECT_NE(RootKey(a, 0, ""), RootKey(a, 1, ""));
  EXPECT_NE(RootKey(a, 0, ""), RootKey(Sha256Of("model B"), 0, ""));
  const std::vector<int32_t> t1 = {1, 2}, t2 = {2, 1};
  EXPECT_NE(ChainKey(RootKey(a, 0, ""), t1), ChainKey(RootKey(a, 0, ""), t2));
}

}  // namespace
}  // namespace ember::prompt_cache
