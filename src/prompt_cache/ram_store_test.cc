// RamStore: records round-trip verified; the byte cap holds after every insert; eviction is least
// recently used (reads and refreshes count as use) and hands the evicted records back, sealed, so
// the disk tier stores them as they are; clearing all or one namespace; a read under another
// namespace, model fingerprint, parent or token ids is refused and the record dropped, never used.
#include "prompt_cache/ram_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "prompt_cache/disk_store.h"
#include "prompt_cache/store_testing.h"

namespace ember::prompt_cache {
namespace {

using Block = TestBlock;

const Key kFp = Sha256Of("model A");

Block MakeBlock(int i, uint64_t ns = 0, const std::string& salt = "") {
  Block b;
  b.ns = ns;
  b.tokens = {i, i + 1, i + 2, i + 3};
  b.parent = RootKey(kFp, ns, salt);
  b.key = ChainKey(b.parent, b.tokens);
  return b;
}


RamStoreConfig Config(int64_t max_records) {
  RamStoreConfig c;
  c.max_bytes = max_records * RecordBytes(kBlockSize, kPayload);
  c.fingerprint = kFp;
  c.block_size = kBlockSize;
  c.payload_bytes = kPayload;
  return c;
}

std::vector<RamStore::Evicted> Put(RamStore& store, const Block& b, int i) {
  std::vector<uint8_t> record = store.NewRecordBuffer();
  const std::vector<uint8_t> p = TestPayload(i);
  std::copy(p.begin(), p.end(), record.begin() + PayloadOffset(kBlockSize));
  return store.Insert(b.Id(kFp), std::move(record));
}

std::vector<uint8_t> PayloadOf(const RamStore& store, const RamStore::Record& r) {
  const std::span<const uint8_t> p =
      RecordPayload(*r, store.config().block_size, store.config().payload_bytes);
  return {p.begin(), p.end()};
}

TEST(RamStoreTest, RoundTripsVerifiedRecords) {
  RamStore store(Config(8));
  const Block b = MakeBlock(1);
  EXPECT_TRUE(Put(store, b, 1).empty());
  EXPECT_TRUE(store.Contains(b.key));
  const RamStore::Record r = store.Read(b.Id(kFp));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(PayloadOf(store, r), TestPayload(1));
  EXPECT_EQ(VerifyRecord(*r, b.Id(kFp), kPayload), "");
  EXPECT_EQ(store.Read(MakeBlock(2).Id(kFp)), nullptr);
  const RamStoreStats s = store.Stats();
  EXPECT_EQ(s.records, 1);
  EXPECT_EQ(s.bytes, store.record_bytes());
  EXPECT_EQ(s.capacity_bytes, 8 * store.record_bytes());
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.inserts, 1);
  EXPECT_EQ(s.bytes_read, store.record_bytes());
  EXPECT_EQ(s.bytes_written, store.record_bytes());
}

TEST(RamStoreTest, ByteCapHoldsAndEvictsLeastRecentlyUsed) {
  RamStore store(Config(3));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Put(store, MakeBlock(i), i).empty());
  // Use 0 (read) and 1 (refresh): 2 is now the least recently used.
  ASSERT_NE(store.Read(MakeBlock(0).Id(kFp)), nullptr);
  EXPECT_TRUE(store.Refresh(MakeBlock(1).key));
  EXPECT_FALSE(store.Refresh(MakeBlock(9).key));
  std::vector<RamStore::Evicted> out = Put(store, MakeBlock(3), 3);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].key, MakeBlock(2).key);
  EXPECT_FALSE(store.Contains(MakeBlock(2).key));
  // The evicted record is whole and sealed: it verifies as block 2 with its payload.
  ASSERT_NE(out[0].record, nullptr);
  EXPECT_EQ(VerifyRecord(*out[0].record, MakeBlock(2).Id(kFp), kPayload), "");
  EXPECT_EQ(PayloadOf(store, out[0].record), TestPayload(2));
  for (int i = 4; i < 20; ++i) {
    Put(store, MakeBlock(i), i);
    EXPECT_LE(store.Stats().bytes, store.config().max_bytes) << i;
  }
  EXPECT_EQ(store.Stats().records, 3);
  EXPECT_EQ(store.Stats().evictions, 17);
  // Inserting a key already held refreshes it and evicts nothing.
  EXPECT_TRUE(Put(store, MakeBlock(17), 17).empty());
  EXPECT_EQ(store.Stats().inserts, 20);
}

TEST(RamStoreTest, RecordLargerThanTheCapIsRefused) {
  RamStoreConfig c = Config(1);
  c.max_bytes -= 1;
  RamStore store(c);
  EXPECT_TRUE(Put(store, MakeBlock(0), 0).empty());
  EXPECT_FALSE(store.Contains(MakeBlock(0).key));
  EXPECT_EQ(store.Stats().insert_drops, 1);
  EXPECT_EQ(store.Stats().bytes, 0);
}

TEST(RamStoreTest, ClearsAllOrOneNamespace) {
  RamStore store(Config(10));
  for (int i = 0; i < 3; ++i) Put(store, MakeBlock(i, /*ns=*/7), i);
  for (int i = 3; i < 5; ++i) Put(store, MakeBlock(i, /*ns=*/8), i);
  EXPECT_EQ(store.Clear(uint64_t{7}), 3);
  EXPECT_FALSE(store.Contains(MakeBlock(0, 7).key));
  EXPECT_TRUE(store.Contains(MakeBlock(3, 8).key));
  EXPECT_EQ(store.Stats().bytes, 2 * store.record_bytes());
  EXPECT_EQ(store.Clear(std::nullopt), 2);
  EXPECT_EQ(store.Stats().records, 0);
  EXPECT_EQ(store.Stats().bytes, 0);
}

// The key already separates namespaces and models (it chains from RootKey), but the read checks
// every field anyway: a lookup that presents a held key with another identity is refused and
// the record dropped.
TEST(RamStoreTest, AnotherNamespaceModelOrPrefixIsRefused) {
  RamStore store(Config(10));
  const Block b = MakeBlock(1, /*ns=*/5, "tenant-a");
  // Same tokens, another salt / namespace: another key, a plain miss.
  EXPECT_EQ(store.Read(MakeBlock(1, 5, "tenant-b").Id(kFp)), nullptr);
  EXPECT_EQ(store.Read(MakeBlock(1, 6, "tenant-a").Id(kFp)), nullptr);
  struct Case {
    const char* what;
    BlockIdentity id;
  };
  Block other_tokens = b;
  other_tokens.tokens[2] = 99;
  Block other_parent = b;
  other_parent.parent = RootKey(kFp, 5, "tenant-b");
  Block other_ns = b;
  other_ns.ns = 6;
  const Key other_fp = Sha256Of("model B, or the same model with an int8 KV cache");
  for (const Case& c : {Case{"tokens", other_tokens.Id(kFp)}, Case{"parent", other_parent.Id(kFp)},
                        Case{"namespace", other_ns.Id(kFp)}, Case{"fingerprint", b.Id(other_fp)}}) {
    Put(store, b, 1);
    ASSERT_TRUE(store.Contains(b.key));
    EXPECT_EQ(store.Read(c.id), nullptr) << c.what;
    EXPECT_FALSE(store.Contains(b.key)) << c.what << ": a refused record is dropped";
  }
  EXPECT_EQ(store.Stats().corrupt_dropped, 4);
  Put(store, b, 1);
  EXPECT_NE(store.Read(b.Id(kFp)), nullptr);
}

// A record evicted from RAM goes to the disk tier as it is (WriteSealed) and reads back there.
TEST(RamStoreTest, EvictedRecordsSpillToDiskSealed) {
  ScopedTempDir tmp("ember_ram_store");
  {
    auto disk = DiskStore::Open(TestDiskConfig(tmp.path(), kFp, kBlockSize, kPayload, 10));
    ASSERT_TRUE(disk.ok()) << disk.message();
    RamStore ram(Config(1));
    Put(ram, MakeBlock(0), 0);
    std::vector<RamStore::Evicted> out = Put(ram, MakeBlock(1), 1);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ((*disk)->WriteSealed(out[0].key, out[0].ns, *out[0].record),
              DiskStore::WriteResult::kQueued);
    EXPECT_EQ((*disk)->WriteSealed(out[0].key, out[0].ns, *out[0].record),
              DiskStore::WriteResult::kPresent);
    (*disk)->Flush();
    const std::span<const uint8_t> p = (*disk)->Read(MakeBlock(0).Id(kFp));
    EXPECT_EQ(std::vector<uint8_t>(p.begin(), p.end()), TestPayload(0));
  }
}

}  // namespace
}  // namespace ember::prompt_cache
