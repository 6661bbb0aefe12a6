// RamStore: records round-trip verified; the byte cap holds after every insert; eviction is least
// recently used (reads and refreshes count as use) and hands the evicted records back, so the
// disk tier stores them (checksummed by its writer); clearing all or one namespace; a read under
// another namespace, model fingerprint, parent or token ids is refused and the record dropped,
// never used. RecordMemory: page-locked slots taken once and reused, plain memory beyond them.
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
  RecordBuffer record = store.NewRecord();
  const std::vector<uint8_t> p = TestPayload(i);
  std::copy(p.begin(), p.end(), record.bytes().begin() + PayloadOffset(kBlockSize));
  return store.Insert(b.Id(kFp), std::move(record));
}

std::vector<uint8_t> PayloadOf(const RamStore& store, const RamStore::Record& r) {
  const std::span<const uint8_t> p =
      RecordPayload(r->bytes(), store.config().block_size, store.config().payload_bytes);
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
  EXPECT_EQ(VerifyRecord(r->bytes(), b.Id(kFp), kPayload, Checksum::kSkip), "");
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
  // The evicted record is whole: it verifies as block 2 with its payload (no checksum yet: the
  // disk tier's writer takes it).
  ASSERT_NE(out[0].record, nullptr);
  EXPECT_EQ(VerifyRecord(out[0].record->bytes(), MakeBlock(2).Id(kFp), kPayload, Checksum::kSkip),
            "");
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

// A record evicted from RAM goes to the disk tier (WriteRam: the writer copies it and takes its
// checksum) and reads back there, checksum verified; the RAM slot is free once written.
TEST(RamStoreTest, EvictedRecordsSpillToDiskSealed) {
  ScopedTempDir tmp("ember_ram_store");
  {
    auto disk = DiskStore::Open(TestDiskConfig(tmp.path(), kFp, kBlockSize, kPayload, 10));
    ASSERT_TRUE(disk.ok()) << disk.message();
    RamStore ram(Config(1));
    Put(ram, MakeBlock(0), 0);
    std::vector<RamStore::Evicted> out = Put(ram, MakeBlock(1), 1);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ((*disk)->WriteRam(out[0].key, out[0].ns, out[0].record),
              DiskStore::WriteResult::kQueued);
    EXPECT_EQ((*disk)->WriteRam(out[0].key, out[0].ns, out[0].record),
              DiskStore::WriteResult::kPresent);
    out.clear();
    (*disk)->Flush();
    EXPECT_EQ(ram.memory().in_use(), 1);  // block 1's; block 0's slot came back
    const std::span<const uint8_t> p = (*disk)->Read(MakeBlock(0).Id(kFp));
    EXPECT_EQ(std::vector<uint8_t>(p.begin(), p.end()), TestPayload(0));
  }
}

// Page-locked slots come from the allocator once, up to the cap, in whole pieces; they are reused
// as records go; a record beyond them takes plain memory, which is freed when it goes; the pieces
// are freed with the memory, after the last record.
class FakePinned : public PinnedAllocator {
 public:
  void* Allocate(size_t bytes) override {
    if (refuse_after >= 0 && allocations >= refuse_after) return nullptr;
    ++allocations;
    ++live;
    bytes_total += bytes;
    return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  }
  void Free(void* p) override {
    --live;
    std::free(p);
  }
  int allocations = 0, live = 0, refuse_after = -1;
  size_t bytes_total = 0;
};

TEST(RecordMemoryTest, PinnedSlotsAreReusedAndPlainOnesAreExtra) {
  auto pinned = std::make_shared<FakePinned>();
  std::shared_ptr<RecordMemory> memory = RecordMemory::Create(1000, 3, pinned);
  EXPECT_EQ(pinned->allocations, 1);
  EXPECT_EQ(pinned->bytes_total, 3u * 1024u);  // slots 256-byte aligned
  EXPECT_EQ(memory->pinned_slots(), 3);
  std::vector<RecordBuffer> held;
  for (int i = 0; i < 4; ++i) held.push_back(memory->Take());
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(held[static_cast<size_t>(i)].pinned()) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(held[static_cast<size_t>(i)].bytes().data()) % 256, 0u);
    EXPECT_EQ(held[static_cast<size_t>(i)].bytes().size(), 1000u);
  }
  EXPECT_FALSE(held[3].pinned());
  EXPECT_EQ(memory->in_use(), 4);
  EXPECT_EQ(memory->plain_in_use(), 1);
  uint8_t* first = held[0].bytes().data();
  held[0] = RecordBuffer();  // back to the free list
  held[3] = RecordBuffer();  // freed
  EXPECT_EQ(memory->in_use(), 2);
  EXPECT_EQ(memory->plain_in_use(), 0);
  RecordBuffer again = memory->Take();
  EXPECT_TRUE(again.pinned());
  EXPECT_EQ(again.bytes().data(), first);
  // The memory outlives its owner's reference while records hold it.
  std::weak_ptr<RecordMemory> weak = memory;
  memory.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(pinned->live, 1);
  held.clear();
  again = RecordBuffer();
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(pinned->live, 0);
}

TEST(RecordMemoryTest, RefusedPinningFallsBackToPlainMemory) {
  auto pinned = std::make_shared<FakePinned>();
  pinned->refuse_after = 0;
  std::shared_ptr<RecordMemory> memory = RecordMemory::Create(1000, 3, pinned);
  EXPECT_EQ(memory->pinned_slots(), 0);
  RecordBuffer b = memory->Take();
  EXPECT_FALSE(b.pinned());
  EXPECT_EQ(b.bytes().size(), 1000u);
  // Without an allocator (the CPU backend) every record is plain memory.
  std::shared_ptr<RecordMemory> plain = RecordMemory::Create(64, 8, nullptr);
  EXPECT_FALSE(plain->Take().pinned());
}

// A RAM store over page-locked memory: its records are pinned up to the cap.
TEST(RamStoreTest, RecordsArePinnedWhenTheBackendGivesMemory) {
  auto pinned = std::make_shared<FakePinned>();
  RamStoreConfig c = Config(2);
  c.pinned = pinned;
  RamStore store(c);
  EXPECT_EQ(store.memory().pinned_slots(), 2);
  Put(store, MakeBlock(0), 0);
  const RamStore::Record r = store.Read(MakeBlock(0).Id(kFp));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->pinned());
  EXPECT_EQ(PayloadOf(store, r), TestPayload(0));
}

}  // namespace
}  // namespace ember::prompt_cache
