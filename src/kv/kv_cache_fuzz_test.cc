// Bookkeeping fuzz: random admit / step (allocate + write + commit) / fork / free / restart /
// evict-by-pressure sequences against a model of what each block's KV holds. After every op:
// CheckInvariants() is clean, every live sequence's computed blocks still hold its own prefix
// (nobody overwrote a block in use), and every cached block's recorded content is what was really
// written there (no stale hash). Every cache hit must return blocks whose content equals the query.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <random>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace ember::kv {
namespace {

using V = std::vector<int32_t>;

// Every block whose first token has the same parity collides.
uint64_t WeakHash(uint64_t, std::span<const int32_t> tokens, uint64_t) {
  return static_cast<uint64_t>(tokens[0] & 1);
}

// Keys ignore the parent: only the verified parent identity keeps chains apart.
uint64_t ParentBlindHash(uint64_t, std::span<const int32_t> tokens, uint64_t ns) {
  return HashBlockTokens(kRootBlockKey, tokens, ns);
}

struct FuzzParams {
  const char* name;
  BlockHashFn hash_fn;
  bool prefix_caching;
  int32_t num_ops;
  uint32_t seed;
  friend void PrintTo(const FuzzParams& p, std::ostream* os) {
    *os << p.name << " seed " << p.seed;
  }
};

class KvFuzzer {
 public:
  explicit KvFuzzer(const FuzzParams& p)
      : kv_(MakeConfig(p), p.hash_fn), rng_(p.seed), content_(kNumBlocks) {
    for (int i = 0; i < 6; ++i) stems_.push_back(RandomTokens(Uniform(0, 28)));
  }

  void Run(int32_t num_ops) {
    for (int32_t op = 0; op < num_ops; ++op) {
      const int r = Uniform(0, 99);
      if (live_.empty() || (r < 15 && live_.size() < 12)) {
        Admit(NextPrompt(), static_cast<uint64_t>(Uniform(0, 1)));
      } else if (r < 25) {
        Fork(PickLive());
      } else if (r < 70) {
        Step(PickLive());
      } else if (r < 88 || live_.size() >= 12) {
        Free(PickLive());
      } else if (r < 96) {
        Restart(PickLive());
      } else {
        Pressure();
      }
      Verify(op);
      if (::testing::Test::HasFatalFailure()) return;
    }
    while (!live_.empty()) Free(live_.begin()->first);
    ASSERT_EQ(kv_.CheckInvariants(), "");
    ASSERT_EQ(kv_.NumUsedBlocks(), 0);
    ASSERT_EQ(kv_.NumFreeBlocks(), kNumBlocks);
    ASSERT_EQ(kv_.NumSeqs(), 0);
  }

  int64_t num_hit_blocks = 0, num_failed_allocs = 0, num_pressure_evictions = 0;

 private:
  static constexpr int32_t kNumBlocks = 48;
  static constexpr int32_t kBlockSize = 4;

  // What the KV in a block represents: the full token prefix up to the block's end.
  struct Content {
    bool full = false;  // false: partially written or garbage
    uint64_t ns = 0;
    V prefix;
  };
  struct LiveSeq {
    V tokens;
    int32_t num_computed = 0;
    uint64_t ns = 0;
  };

  static KvCacheConfig MakeConfig(const FuzzParams& p) {
    KvCacheConfig c;
    c.block_size = kBlockSize;
    c.num_blocks = kNumBlocks;
    c.enable_prefix_caching = p.prefix_caching;
    return c;
  }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  V RandomTokens(int n) {
    V v(n);
    for (auto& t : v) t = Uniform(0, 3);  // tiny vocabulary: many equal blocks across prompts
    return v;
  }
  V NextPrompt() {
    V p = stems_[Uniform(0, static_cast<int>(stems_.size()) - 1)];
    p.resize(Uniform(0, static_cast<int>(p.size())));
    const V tail = RandomTokens(Uniform(p.empty() ? 1 : 0, 10));
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  }
  SeqId PickLive() {
    auto it = live_.begin();
    std::advance(it, Uniform(0, static_cast<int>(live_.size()) - 1));
    return it->first;
  }
  bool Matches(int32_t block, uint64_t ns, const V& tokens, size_t end) const {
    const Content& c = content_[block];
    return c.full && c.ns == ns && c.prefix.size() == end &&
           std::equal(c.prefix.begin(), c.prefix.end(), tokens.begin());
  }

  void Acquire(SeqId id, const V& tokens, uint64_t ns) {
    const int32_t peek = kv_.PeekCachedPrefix(tokens, ns);
    const int32_t cached = kv_.AcquireCachedPrefix(id, tokens, ns);
    ASSERT_EQ(cached, peek);
    ASSERT_EQ(cached % kBlockSize, 0);
    ASSERT_LE(cached, static_cast<int32_t>(tokens.size()) - 1);
    const std::vector<int32_t>& table = kv_.BlockTable(id);
    ASSERT_EQ(static_cast<int32_t>(table.size()), cached / kBlockSize);
    for (size_t j = 0; j < table.size(); ++j) {
      ASSERT_TRUE(Matches(table[j], ns, tokens, (j + 1) * kBlockSize))
          << "cache hit returned block " << table[j] << " whose content differs from the query";
    }
    num_hit_blocks += static_cast<int64_t>(table.size());
    live_[id] = LiveSeq{tokens, cached, ns};
  }

  void Admit(const V& tokens, uint64_t ns) { Acquire(next_id_++, tokens, ns); }

  void Fork(SeqId src) {
    const LiveSeq& s = live_.at(src);
    V tokens(s.tokens.begin(), s.tokens.begin() + Uniform(0, static_cast<int>(s.tokens.size())));
    const V tail = RandomTokens(Uniform(tokens.empty() ? 1 : 0, 6));
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    Admit(tokens, s.ns);
  }

  void Step(SeqId id) {
    LiveSeq& s = live_.at(id);
    if (s.num_computed == static_cast<int32_t>(s.tokens.size())) s.tokens.push_back(Uniform(0, 3));
    const int32_t target =
        s.num_computed +
        std::min(static_cast<int32_t>(s.tokens.size()) - s.num_computed, Uniform(1, 12));
    const std::vector<int32_t> before = kv_.BlockTable(id);
    if (kv_.NumBlocksNeeded(id, target) > kv_.NumFreeBlocks()) {
      const std::vector<int32_t> free_before = kv_.pool().FreeList();
      const int32_t cached_before = kv_.NumCachedBlocks();
      ASSERT_FALSE(kv_.Allocate(id, target));
      ASSERT_EQ(kv_.BlockTable(id), before);
      ASSERT_EQ(kv_.pool().FreeList(), free_before);
      ASSERT_EQ(kv_.NumCachedBlocks(), cached_before);
      ++num_failed_allocs;
      if (Uniform(0, 1) == 0) Restart(id);  // preempt
      return;
    }
    ASSERT_TRUE(kv_.Allocate(id, target));
    const std::vector<int32_t>& table = kv_.BlockTable(id);
    ASSERT_EQ(static_cast<int32_t>(table.size()), (target + kBlockSize - 1) / kBlockSize);
    ASSERT_TRUE(std::equal(before.begin(), before.end(), table.begin()));
    for (size_t j = before.size(); j < table.size(); ++j) content_[table[j]] = Content{};
    // The backend writes K/V for [num_computed, target): those blocks must be private and uncached.
    for (int32_t pos = s.num_computed; pos < target; ++pos) {
      const int32_t b = table[pos / kBlockSize];
      ASSERT_EQ(kv_.RefCount(b), 1) << "writing into a shared block " << b;
      ASSERT_FALSE(kv_.prefix_cache().is_cached(b)) << "writing into cached block " << b;
      Content& c = content_[b];
      c = Content{};
      if ((pos + 1) % kBlockSize == 0)
        c = Content{true, s.ns, V(s.tokens.begin(), s.tokens.begin() + pos + 1)};
    }
    s.num_computed = target;
    kv_.CommitComputed(id, s.tokens, target, s.ns);
    if (s.tokens.size() > 64) Free(id);  // finished
  }

  void Free(SeqId id) {
    kv_.Free(id);
    live_.erase(id);
  }

  void Restart(SeqId id) {
    const LiveSeq s = live_.at(id);
    Free(id);
    Acquire(id, s.tokens, s.ns);
  }

  // A greedy allocation takes every free block, evicting all revivable cached content.
  void Pressure() {
    const SeqId hog = next_id_++;
    const int32_t n = kv_.NumFreeBlocks();
    const int32_t cached_free = kv_.NumCachedBlocks() - CachedInUse();
    ASSERT_TRUE(kv_.Allocate(hog, n * kBlockSize));
    ASSERT_EQ(kv_.NumFreeBlocks(), 0);
    ASSERT_EQ(kv_.NumCachedBlocks(), CachedInUse());
    num_pressure_evictions += cached_free;
    for (int32_t b : kv_.BlockTable(hog)) content_[b] = Content{};  // overwritten with garbage
    kv_.Free(hog);
  }

  int32_t CachedInUse() const {
    int32_t n = 0;
    for (int32_t b = 0; b < kNumBlocks; ++b)
      n += kv_.prefix_cache().is_cached(b) && kv_.RefCount(b) > 0;
    return n;
  }

  void Verify(int32_t op) {
    ASSERT_EQ(kv_.CheckInvariants(), "") << "after op " << op;
    ASSERT_EQ(kv_.NumUsedBlocks() + kv_.NumFreeBlocks(), kNumBlocks);
    ASSERT_EQ(kv_.NumSeqs(), static_cast<int32_t>(live_.size()));
    for (const auto& [id, s] : live_) {
      const std::vector<int32_t>& table = kv_.BlockTable(id);
      for (int32_t j = 0; j < s.num_computed / kBlockSize; ++j) {
        ASSERT_TRUE(Matches(table[j], s.ns, s.tokens, (j + 1) * kBlockSize))
            << "op " << op << ": seq " << id << " block " << j << " was overwritten";
      }
    }
    for (int32_t b = 0; b < kNumBlocks; ++b) {
      if (!kv_.prefix_cache().is_cached(b)) continue;
      const Content& c = content_[b];
      ASSERT_TRUE(c.full) << "op " << op << ": cached block " << b << " holds garbage";
      const std::span<const int32_t> recorded = kv_.prefix_cache().Tokens(b);
      ASSERT_TRUE(std::equal(recorded.begin(), recorded.end(), c.prefix.end() - kBlockSize))
          << "op " << op << ": cached block " << b << " has a stale hash";
    }
  }

  KvCacheManager kv_;
  std::mt19937 rng_;
  std::vector<Content> content_;  // [num_blocks]
  std::vector<V> stems_;
  std::map<SeqId, LiveSeq> live_;
  SeqId next_id_ = 0;
};

class KvFuzzTest : public ::testing::TestWithParam<FuzzParams> {};

TEST_P(KvFuzzTest, RandomOpsKeepBookkeepingAndContentConsistent) {
  const FuzzParams& p = GetParam();
  KvFuzzer fuzzer(p);
  fuzzer.Run(p.num_ops);
  if (HasFatalFailure()) return;
  // The run must actually have exercised the interesting paths.
  EXPECT_GT(fuzzer.num_failed_allocs, 0);
  if (p.prefix_caching) {
    EXPECT_GT(fuzzer.num_hit_blocks, p.num_ops / 50);
    EXPECT_GT(fuzzer.num_pressure_evictions, 0);
  } else {
    EXPECT_EQ(fuzzer.num_hit_blocks, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kv, KvFuzzTest,
    ::testing::Values(FuzzParams{"default_hash", HashBlockTokens, true, 100000, 1},
                      FuzzParams{"default_hash_seed2", HashBlockTokens, true, 30000, 2},
                      FuzzParams{"weak_hash", WeakHash, true, 30000, 3},
                      FuzzParams{"parent_blind_hash", ParentBlindHash, true, 30000, 5},
                      FuzzParams{"no_prefix_caching", HashBlockTokens, false, 10000, 4}),
    [](const ::testing::TestParamInfo<FuzzParams>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ember::kv
