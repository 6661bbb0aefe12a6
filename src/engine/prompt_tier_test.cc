// The prompt cache's disk tier end to end on a real checkpoint (tinystories-656k, CPU): a prompt
// run by one engine is served from disk by the next engine on the same directory (cached_tokens
// cover its whole blocks) with the output tokens of a cold run; damaged records (flipped bytes,
// truncation, a crashed writer's temp file) cost reuse, never correctness; salts and models do
// not share, nor do KV formats (--kv-cache-dtype: an int8 pool's records are int8 rows, read
// back only by int8 pools); clearing drops both tiers; the cost rule picks the faster path.
// The RAM tier (RamTierTest): a prefix the pool evicted comes back from RAM with the pool hit's
// bit-identical logprobs; the cap holds; clear and salts; RAM in front of the disk across a
// restart; the prefetcher moves a waiting request's prefix from disk to RAM; preemption under a
// tiny pool loses no block. CudaRamTierTest: the same on a GPU, through page-locked records.
#include "engine/prompt_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "backend/cuda_loader.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "util/testing.h"

namespace ember {
namespace {

using testing::ModelDir;
using testing::LoadModel;

constexpr int32_t kBlock = 16;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // each token's, and its top 5 (when the request asked)
  RequestUsage usage;
};

GenerationRequest Greedy(std::vector<int32_t> prompt, const std::string& salt = "") {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = 12;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  r.cache_salt = salt;
  return r;
}

// Reads a submitted request's stream to its end.
Outcome Collect(ResponseStream& stream) {
  Outcome run;
  std::vector<TokenEvent> events;
  while (stream.Next(&events)) {
    for (const TokenEvent& e : events) {
      if (e.token_id < 0) continue;
      run.tokens.push_back(e.token_id);
      run.logprobs.push_back(e.logprob);
      for (const TokenLogprob& t : e.top_logprobs) run.logprobs.push_back(t.logprob);
    }
    events.clear();
  }
  run.usage = stream.usage();
  return run;
}

Outcome Generate(Engine& engine, const GenerationRequest& request) {
  auto submitted = engine.Submit(request);
  auto* stream = std::get_if<std::shared_ptr<ResponseStream>>(&submitted);
  if (stream == nullptr) {
    ADD_FAILURE() << "refused: " << std::get<SubmitError>(submitted).message;
    return {};
  }
  return Collect(**stream);
}

// A prompt of `len` tokens over the first `vocab` + 3 ids, deterministic in `seed`.
std::vector<int32_t> Prompt(int32_t len, int32_t seed, int32_t vocab = 2000) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t i = 0; i < len; ++i) p[static_cast<size_t>(i)] = 3 + (i * 37 + seed * 101) % vocab;
  return p;
}

class PromptTierTest : public ::testing::Test {
 protected:
  virtual std::string ModelName() const { return "tinystories-656k"; }
  virtual DeviceKind Device() const { return DeviceKind::kCpu; }
  void SetUp() override {
    model_dir_ = ModelDir(ModelName());
    if (!testing::DirExists(model_dir_)) GTEST_SKIP() << "fixture not found: " << model_dir_;
    char tmpl[] = "/tmp/ember_prompt_tier_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    cache_dir_ = tmpl;
  }
  void TearDown() override {
    if (!cache_dir_.empty()) std::filesystem::remove_all(cache_dir_);
  }

  EngineConfig Config(bool disk = true) const {
    EngineConfig c;
    c.block_size = kBlock;
    c.max_running = 4;
    c.max_step_tokens = 64;  // prompts prefill in chunks, restored blocks join mid-prompt
    if (disk) {
      c.prompt_cache.dir = cache_dir_;
      c.prompt_cache.disk_bytes = int64_t{64} << 20;
      c.prompt_cache.reuse = PromptCacheConfig::Reuse::kAlways;
    }
    return c;
  }
  // A model owns one KV pool, so each engine gets its own model (kept until the test ends).
  Model* NewModel(KvDType kv = KvDType::kAuto) {
    ModelLoadOptions options;
    options.device = Device();
    options.kv_cache.dtype = kv;
    auto model = Model::Load(model_dir_, options);
    EXPECT_TRUE(model.ok()) << model.message();
    models_.push_back(model.ok() ? std::move(model).value() : nullptr);
    return models_.back().get();
  }
  std::unique_ptr<Engine> NewEngine(const EngineConfig& config, KvDType kv = KvDType::kAuto) {
    auto engine = Engine::Create(NewModel(kv), config);
    EXPECT_TRUE(engine.ok()) << engine.message();
    return engine.ok() ? std::move(engine).value() : nullptr;
  }
  // The output of a run without any cache.
  Outcome ColdRun(const GenerationRequest& request, KvDType kv = KvDType::kAuto) {
    EngineConfig c = Config(/*disk=*/false);
    c.enable_prefix_caching = false;
    return Generate(*NewEngine(c, kv), request);
  }
  std::vector<int32_t> Cold(const GenerationRequest& request, KvDType kv = KvDType::kAuto) {
    return ColdRun(request, kv).tokens;
  }
  // Runs `request` on a fresh engine over the directory and shuts it down (records flushed).
  Outcome RunAndStop(const GenerationRequest& request, const EngineConfig& config) {
    std::unique_ptr<Engine> engine = NewEngine(config);
    if (engine == nullptr) return {};
    return Generate(*engine, request);
  }
  std::vector<std::filesystem::path> Records() const {
    std::vector<std::filesystem::path> out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(cache_dir_))
      if (e.path().extension() == ".kv") out.push_back(e.path());
    return out;
  }
  // The files in `dir` of the first `n` blocks of `prompt` (namespace 0, no salt): block j's key
  // chains the prompt's first j + 1 blocks from the root of the KV fingerprint in `kv_dir`.
  static std::vector<std::filesystem::path> BlockFiles(const std::vector<int32_t>& prompt, int n,
                                                       const std::filesystem::path& kv_dir,
                                                       const std::filesystem::path& dir) {
    std::ifstream in(kv_dir / "FINGERPRINT");
    const std::string fingerprint_text(std::istreambuf_iterator<char>(in), {});
    prompt_cache::Key key = prompt_cache::RootKey(Sha256Of(fingerprint_text), 0, "");
    std::vector<std::filesystem::path> out;
    for (int j = 0; j < n; ++j) {
      key = prompt_cache::ChainKey(
          key, std::span<const int32_t>(prompt).subspan(static_cast<size_t>(j) * kBlock, kBlock));
      out.push_back(dir / ("0000000000000000-" + HexOf(key) + ".kv"));
    }
    return out;
  }
  // Flips one bit of `file` at `offset`.
  static void FlipByte(const std::filesystem::path& file, std::streamoff offset) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset);
    const char c = static_cast<char>(f.peek());
    f.seekp(offset);
    f.put(static_cast<char>(c ^ 0x10));
  }

  std::string model_dir_, cache_dir_;
  std::vector<std::unique_ptr<Model>> models_;  // declared last: engines go before their models
};

TEST_F(PromptTierTest, RestartServesThePrefixFromDiskWithColdOutputs) {
  const GenerationRequest request = Greedy(Prompt(150, 1));
  const std::vector<int32_t> cold = Cold(request);
  const Outcome first = RunAndStop(request, Config());
  EXPECT_EQ(first.tokens, cold);
  EXPECT_EQ(first.usage.cached_tokens, 0);
  // 150 prompt + 12 generated tokens (the last one never computed): 10 full blocks written.
  EXPECT_EQ(Records().size(), 10u);

  std::unique_ptr<Engine> engine = NewEngine(Config());
  ASSERT_NE(engine, nullptr);
  const Outcome second = Generate(*engine, request);
  EXPECT_EQ(second.tokens, cold);
  EXPECT_EQ(second.usage.cached_tokens, 144);  // (150 - 1) / 16 whole blocks
  const PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.promotions, 9);
  EXPECT_EQ(s.hits, 9);
  EXPECT_EQ(s.corrupt_dropped, 0);
  EXPECT_GT(s.bytes_read, 0);
  // The same prompt again hits the pool, not the disk.
  const Outcome third = Generate(*engine, request);
  EXPECT_EQ(third.tokens, cold);
  EXPECT_EQ(third.usage.cached_tokens, 144);
  EXPECT_EQ(engine->Stats().prompt_cache.hits, 9);
}

// A write queue of two records cannot take a prompt's blocks at once: the blocks that did not
// fit wait for the sequence's next commits (as the writer drains) instead of being dropped, so
// every full block reaches the disk by the end of the request.
TEST_F(PromptTierTest, WriteThroughRetriesWhatTheFullQueueDidNotTake) {
  GenerationRequest request = Greedy(Prompt(150, 2));
  request.max_tokens = 100;
  EngineConfig config = Config();
  Model* probe = NewModel();
  config.prompt_cache.max_queue_bytes =
      2 * prompt_cache::RecordBytes(kBlock, kBlock * probe->KvBytesPerToken());
  const Outcome run = RunAndStop(request, config);  // the engine flushes its writer as it goes
  ASSERT_EQ(run.tokens.size(), 100u);
  // 150 + 100 tokens, the last one never computed: 15 full blocks, every one written.
  EXPECT_EQ(Records().size(), 15u);
}

TEST_F(PromptTierTest, LongerPromptExtendsAPoolHitFromDisk) {
  const GenerationRequest shorter = Greedy(Prompt(70, 2));
  std::vector<int32_t> longer_ids = Prompt(70, 2);
  const std::vector<int32_t> tail = Prompt(90, 9);
  longer_ids.insert(longer_ids.end(), tail.begin(), tail.end());
  const GenerationRequest longer = Greedy(longer_ids);
  RunAndStop(longer, Config());  // the disk holds the long prompt's blocks
  std::unique_ptr<Engine> engine = NewEngine(Config());
  ASSERT_NE(engine, nullptr);
  Generate(*engine, shorter);  // the pool holds the first 4 blocks (Prompt(70, 2))
  const Outcome run = Generate(*engine, longer);
  EXPECT_EQ(run.tokens, Cold(longer));
  EXPECT_EQ(run.usage.cached_tokens, 144);  // 4 blocks from the pool, 5 from disk
}

TEST_F(PromptTierTest, DamagedRecordsCostReuseNotCorrectness) {
  const GenerationRequest request = Greedy(Prompt(150, 3));
  const std::vector<int32_t> cold = Cold(request);
  RunAndStop(request, Config());
  // Flip one byte in block 4's record, truncate block 7's, leave a crashed writer's temp file.
  std::unique_ptr<Engine> probe_engine;
  std::vector<std::filesystem::path> records = Records();
  ASSERT_EQ(records.size(), 10u);
  const auto model_fp_dir = records[0].parent_path();
  const std::vector<std::filesystem::path> by_block =
      BlockFiles(request.prompt_ids, 9, model_fp_dir, model_fp_dir);
  for (const auto& file : by_block) ASSERT_TRUE(std::filesystem::exists(file)) << file;
  FlipByte(by_block[4], 1000);
  std::filesystem::resize_file(by_block[7], std::filesystem::file_size(by_block[7]) / 2);
  std::ofstream(by_block[8].string() + ".tmp") << "torn";

  std::unique_ptr<Engine> engine = NewEngine(Config());
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->Stats().prompt_cache.stale_temps_removed, 1);
  EXPECT_EQ(engine->Stats().prompt_cache.corrupt_dropped, 1);  // the truncated one, at start-up
  const Outcome run = Generate(*engine, request);
  EXPECT_EQ(run.tokens, cold);
  EXPECT_EQ(run.usage.cached_tokens, 4 * kBlock);  // blocks 0-3; block 4 is refused on read
  const PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.corrupt_dropped, 2);
  EXPECT_EQ(s.promotions, 4);
  // The run wrote the refused and missing blocks again: the next engine reuses everything.
  engine.reset();
  std::unique_ptr<Engine> again = NewEngine(Config());
  ASSERT_NE(again, nullptr);
  const Outcome healed = Generate(*again, request);
  EXPECT_EQ(healed.tokens, cold);
  EXPECT_EQ(healed.usage.cached_tokens, 144);
}

TEST_F(PromptTierTest, SaltsDoNotShareInThePoolOrOnDisk) {
  const std::vector<int32_t> ids = Prompt(100, 4);
  RunAndStop(Greedy(ids, "tenant-a"), Config());
  std::unique_ptr<Engine> engine = NewEngine(Config());
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(Generate(*engine, Greedy(ids, "tenant-b")).usage.cached_tokens, 0);
  EXPECT_EQ(Generate(*engine, Greedy(ids)).usage.cached_tokens, 0);  // no salt: another namespace
  const Outcome a = Generate(*engine, Greedy(ids, "tenant-a"));
  EXPECT_EQ(a.usage.cached_tokens, 96);
  EXPECT_EQ(a.tokens, Cold(Greedy(ids)));
  // In one engine's pool too: b's blocks are now cached, c sees none of them.
  EXPECT_EQ(Generate(*engine, Greedy(ids, "tenant-c")).usage.cached_tokens, 0);
}

TEST_F(PromptTierTest, AnotherModelOrBlockSizeReusesNothing) {
  const std::vector<int32_t> ids = Prompt(100, 5);
  RunAndStop(Greedy(ids), Config());
  EngineConfig bigger_blocks = Config();
  bigger_blocks.block_size = 32;
  {
    std::unique_ptr<Engine> engine = NewEngine(bigger_blocks);
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(engine->Stats().prompt_cache.records, 0);
    EXPECT_EQ(Generate(*engine, Greedy(ids)).usage.cached_tokens, 0);
  }
  const std::string other_dir = ModelDir("llama3");
  if (!testing::DirExists(other_dir)) return;
  std::unique_ptr<Model> other = LoadModel(other_dir);
  ASSERT_NE(other, nullptr);
  auto engine = Engine::Create(other.get(), Config());
  ASSERT_TRUE(engine.ok()) << engine.message();
  EXPECT_EQ((*engine)->Stats().prompt_cache.records, 0);
  std::vector<int32_t> small_vocab = ids;
  for (int32_t& t : small_vocab) t %= 500;
  EXPECT_EQ(Generate(**engine, Greedy(small_vocab)).usage.cached_tokens, 0);
}

TEST_F(PromptTierTest, SecondEngineOnTheDirectoryIsRefused) {
  std::unique_ptr<Engine> first = NewEngine(Config());
  ASSERT_NE(first, nullptr);
  auto second = Engine::Create(NewModel(), Config());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.message().find("in use by another Ember engine"), std::string::npos)
      << second.message();
}

TEST_F(PromptTierTest, ClearDropsThePoolAndTheDisk) {
  const GenerationRequest request = Greedy(Prompt(100, 6));
  std::unique_ptr<Engine> engine = NewEngine(Config());
  ASSERT_NE(engine, nullptr);
  Generate(*engine, request);
  EXPECT_EQ(Generate(*engine, request).usage.cached_tokens, 96);
  // Another namespace's clear leaves it alone.
  engine->ClearPromptCache(std::string("someone-else"));
  EXPECT_EQ(Generate(*engine, request).usage.cached_tokens, 96);
  engine->ClearPromptCache(std::nullopt);
  EXPECT_EQ(Generate(*engine, request).usage.cached_tokens, 0);
  engine.reset();
  // Writes queued by the last run land after the clear: only that run's blocks are on disk.
  std::unique_ptr<Engine> next = NewEngine(Config());
  ASSERT_NE(next, nullptr);
  EXPECT_LE(next->Stats().prompt_cache.records, 6);
}

TEST_F(PromptTierTest, RefusedConfigurations) {
  EngineConfig ram = Config(/*disk=*/false);
  ram.prompt_cache.ram_bytes = 1000;  // less than one block
  auto r = Engine::Create(NewModel(), ram);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("--prompt-cache-ram-bytes: 1000 holds no KV block"), std::string::npos)
      << r.message();
  ram.prompt_cache.ram_bytes = 1 << 20;
  ram.enable_prefix_caching = false;
  r = Engine::Create(NewModel(), ram);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("--prompt-cache-ram-bytes: needs the prefix cache"), std::string::npos)
      << r.message();
  EngineConfig no_cap = Config();
  no_cap.prompt_cache.disk_bytes = 0;
  r = Engine::Create(NewModel(), no_cap);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("--prompt-cache-disk-bytes"), std::string::npos);
  EngineConfig no_prefix = Config();
  no_prefix.enable_prefix_caching = false;
  EXPECT_FALSE(Engine::Create(NewModel(), no_prefix).ok());
}

TEST_F(PromptTierTest, CostAwareReuseMeasuresAndReports) {
  const GenerationRequest a = Greedy(Prompt(150, 7)), b = Greedy(Prompt(150, 8));
  EngineConfig config = Config();
  config.prompt_cache.reuse = PromptCacheConfig::Reuse::kCostAware;
  {
    std::unique_ptr<Engine> engine = NewEngine(config);
    ASSERT_NE(engine, nullptr);
    Generate(*engine, a);
    Generate(*engine, b);
  }
  std::unique_ptr<Engine> engine = NewEngine(config);
  ASSERT_NE(engine, nullptr);
  // Nothing measured yet (no read, no prefill): the first hit loads, and measures the reads.
  EXPECT_EQ(Generate(*engine, a).usage.cached_tokens, 144);
  PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.last_choice, PromptCacheStats::Choice::kLoadUnmeasured);
  EXPECT_EQ(s.loads, 1);
  EXPECT_GT(s.read_bytes_per_s, 0);
  EXPECT_GT(s.prefill_tokens_per_s, 0);
  // The second hit compares the measured rates, and does what they say.
  const Outcome second = Generate(*engine, b);
  s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.loads + s.recomputes, 2);
  ASSERT_GT(s.last_read_bytes_per_s, 0);
  ASSERT_GT(s.last_prefill_tokens_per_s, 0);
  const bool load = LoadBeatsRecompute(9, engine->Stats().prompt_cache.bytes / s.records, kBlock,
                                       s.last_read_bytes_per_s, s.last_prefill_tokens_per_s);
  EXPECT_EQ(s.last_choice,
            load ? PromptCacheStats::Choice::kLoad : PromptCacheStats::Choice::kRecompute);
  EXPECT_EQ(second.usage.cached_tokens, load ? 144 : 0);
  EXPECT_EQ(second.tokens, Cold(b));
}

TEST(LoadBeatsRecomputeTest, ComparesTheMeasuredRates) {
  // 10 blocks of 16 tokens, 1 MB each: 10 MB at 1 GB/s = 10 ms vs 160 tokens at 1000 tok/s.
  EXPECT_TRUE(LoadBeatsRecompute(10, 1'000'000, 16, 1e9, 1000));
  // The same at 10 MB/s (1 s) vs 100k tok/s (1.6 ms): recompute.
  EXPECT_FALSE(LoadBeatsRecompute(10, 1'000'000, 16, 1e7, 1e5));
}

// Records of an int8 KV pool hold int8 rows (scales included: the payload is the pool's block
// bytes), are served to the next int8 engine with the cold int8 output, and are never read by a
// float32 pool (another fingerprint, another subfolder).
TEST_F(PromptTierTest, QuantizedKvRecordsServeOnlyTheirFormat) {
  const GenerationRequest request = Greedy(Prompt(150, 1));
  const std::vector<int32_t> cold = Cold(request, KvDType::kInt8);
  const Outcome first = RunAndStop(request, Config());  // float32 records first
  EXPECT_EQ(first.usage.cached_tokens, 0);
  const size_t f32_records = Records().size();
  ASSERT_EQ(f32_records, 10u);
  std::unique_ptr<Engine> writer = NewEngine(Config(), KvDType::kInt8);
  ASSERT_NE(writer, nullptr);
  const Outcome second = Generate(*writer, request);
  EXPECT_EQ(second.tokens, cold);
  EXPECT_EQ(second.usage.cached_tokens, 0) << "an int8 pool read float32 records";
  EXPECT_LT(writer->Stats().prompt_cache.bytes, 0.4 * static_cast<double>(f32_records) *
                                                     static_cast<double>(models_[1]->KvBlockBytes()))
      << "int8 records should be about 3.2x smaller than float32 ones here";
  writer.reset();
  EXPECT_EQ(Records().size(), 2 * f32_records);
  std::unique_ptr<Engine> reader = NewEngine(Config(), KvDType::kInt8);
  ASSERT_NE(reader, nullptr);
  const Outcome third = Generate(*reader, request);
  EXPECT_EQ(third.tokens, cold);
  EXPECT_EQ(third.usage.cached_tokens, 144);
}

// The host-RAM tier: blocks the KV pool evicts are kept in RAM and served from there.
class RamTierTest : public PromptTierTest {
 protected:
  // A pool of `blocks` blocks (+ RAM tier of `ram_records` records; + the disk tier when `disk`).
  EngineConfig RamConfig(int32_t blocks, int64_t ram_records, bool disk = false) {
    EngineConfig c = Config(disk);
    Model* probe = NewModel();
    c.kv_cache_bytes = int64_t{blocks} * kBlock * probe->KvBytesPerToken();
    // KvBlockBytes needs an allocated pool; a float32 pool's block is block_size tokens' bytes.
    c.prompt_cache.ram_bytes =
        ram_records * prompt_cache::RecordBytes(kBlock, kBlock * probe->KvBytesPerToken());
    c.prompt_cache.reuse = PromptCacheConfig::Reuse::kAlways;
    return c;
  }
  static GenerationRequest WithLogprobs(GenerationRequest r) {
    r.sampling.top_logprobs = 5;
    return r;
  }
};

// A prompt computed, evicted from the pool by other prompts and asked again is restored from RAM
// (no disk tier at all): the same tokens and bit-identical logprobs as a pool hit, the tokens of
// a cold run.
TEST_F(RamTierTest, PrefixEvictedFromThePoolIsServedFromRam) {
  const GenerationRequest a = WithLogprobs(Greedy(Prompt(150, 11)));
  const std::vector<int32_t> cold = Cold(a);
  std::unique_ptr<Engine> engine = NewEngine(RamConfig(/*blocks=*/24, /*ram_records=*/64));
  ASSERT_NE(engine, nullptr);
  const Outcome first = Generate(*engine, a);
  EXPECT_EQ(first.tokens, cold);
  EXPECT_EQ(first.usage.cached_tokens, 0);
  const Outcome pool_hit = Generate(*engine, a);
  EXPECT_EQ(pool_hit.usage.cached_tokens, 144);
  EXPECT_EQ(pool_hit.tokens, cold);
  PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_FALSE(s.enabled);  // no disk tier
  EXPECT_TRUE(s.ram.enabled);
  EXPECT_EQ(s.ram.promotions, 0);
  // Three other prompts of 11 blocks each push a's blocks out of the 24-block pool.
  for (int seed = 12; seed < 15; ++seed) Generate(*engine, Greedy(Prompt(150, seed)));
  s = engine->Stats().prompt_cache;
  EXPECT_GE(s.ram.demotions, 9);
  EXPECT_EQ(s.ram.records, s.ram.demotions);
  EXPECT_EQ(s.ram.bytes, s.ram.records * prompt_cache::RecordBytes(kBlock, engine->model().KvBlockBytes()));
  const Outcome ram_hit = Generate(*engine, a);
  EXPECT_EQ(ram_hit.usage.cached_tokens, 144);
  EXPECT_EQ(ram_hit.tokens, cold);
  EXPECT_EQ(ram_hit.logprobs, pool_hit.logprobs) << "a RAM hit must be bit-identical to a pool hit";
  s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.promotions, 9);
  EXPECT_EQ(s.ram.hits, 9);
  EXPECT_EQ(s.ram.corrupt_dropped, 0);
  EXPECT_EQ(s.ram.bytes_read, 9 * prompt_cache::RecordBytes(kBlock, engine->model().KvBlockBytes()));
  EXPECT_GT(s.ram.read_bytes_per_s, 0);
  EXPECT_EQ(s.promotions, 0);  // nothing from disk
}

// On a GPU the RAM tier's records are page-locked (pinned_bytes covers the cap): evicted blocks
// are gathered straight into them and restored blocks scattered from where they lie, and the
// restore is bit-identical to a pool hit, as on the CPU. Skips without a CUDA device.
class CudaRamTierTest : public RamTierTest {
 protected:
  DeviceKind Device() const override { return DeviceKind::kCuda; }
  void SetUp() override {
    if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
    RamTierTest::SetUp();
  }
};

TEST_F(CudaRamTierTest, PrefixEvictedFromThePoolIsServedFromPinnedRam) {
  const GenerationRequest a = WithLogprobs(Greedy(Prompt(150, 11)));
  std::unique_ptr<Engine> engine = NewEngine(RamConfig(/*blocks=*/24, /*ram_records=*/64));
  ASSERT_NE(engine, nullptr);
  const Outcome first = Generate(*engine, a);
  const Outcome pool_hit = Generate(*engine, a);
  EXPECT_EQ(pool_hit.usage.cached_tokens, 144);
  EXPECT_EQ(pool_hit.tokens, first.tokens);
  PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.pinned_bytes, s.ram.capacity_bytes);
  for (int seed = 12; seed < 15; ++seed) Generate(*engine, Greedy(Prompt(150, seed)));
  EXPECT_GE(engine->Stats().prompt_cache.ram.demotions, 9);
  const Outcome ram_hit = Generate(*engine, a);
  EXPECT_EQ(ram_hit.usage.cached_tokens, 144);
  EXPECT_EQ(ram_hit.tokens, first.tokens);
  EXPECT_EQ(ram_hit.logprobs, pool_hit.logprobs) << "a RAM hit must be bit-identical to a pool hit";
  s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.promotions, 9);
  EXPECT_EQ(s.ram.corrupt_dropped, 0);
  // Again, after other prompts pushed it out once more (its records were freed from the device's
  // reads and reused meanwhile).
  for (int seed = 15; seed < 18; ++seed) Generate(*engine, Greedy(Prompt(150, seed)));
  const Outcome again = Generate(*engine, a);
  EXPECT_EQ(again.usage.cached_tokens, 144);
  EXPECT_EQ(again.logprobs, pool_hit.logprobs);
}

// The RAM tier's cap holds under a stream of distinct prompts (least recently used out first),
// and a cleared cache serves nothing from RAM.
TEST_F(RamTierTest, CapHoldsAndClearEmptiesRam) {
  std::unique_ptr<Engine> engine = NewEngine(RamConfig(/*blocks=*/24, /*ram_records=*/12));
  ASSERT_NE(engine, nullptr);
  const int64_t cap = engine->Stats().prompt_cache.ram.capacity_bytes;
  for (int seed = 20; seed < 28; ++seed) {
    Generate(*engine, Greedy(Prompt(150, seed)));
    EXPECT_LE(engine->Stats().prompt_cache.ram.bytes, cap) << seed;
  }
  PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.records, 12);
  EXPECT_GT(s.ram.evictions, 0);
  EXPECT_EQ(s.ram.spills, 0);  // no disk tier
  // The newest evictions are held: seed 25's blocks left the pool last among those in RAM...
  // the oldest (seed 20) are gone from both.
  EXPECT_EQ(Generate(*engine, Greedy(Prompt(150, 20))).usage.cached_tokens, 0);
  // Another salt's clear keeps the records; a full clear drops them.
  engine->ClearPromptCache(std::string("other"));
  EXPECT_GT(engine->Stats().prompt_cache.ram.records, 0);
  engine->ClearPromptCache(std::nullopt);
  EXPECT_EQ(engine->Stats().prompt_cache.ram.records, 0);
  EXPECT_EQ(engine->Stats().prompt_cache.ram.bytes, 0);
}

// Salted (tenant) and unsalted requests with the same tokens never share a RAM record.
TEST_F(RamTierTest, SaltsDoNotShareInRam) {
  const std::vector<int32_t> ids = Prompt(150, 30);
  std::unique_ptr<Engine> engine = NewEngine(RamConfig(/*blocks=*/24, /*ram_records=*/64));
  ASSERT_NE(engine, nullptr);
  Generate(*engine, Greedy(ids, "tenant-a"));
  for (int seed = 31; seed < 34; ++seed) Generate(*engine, Greedy(Prompt(150, seed)));
  ASSERT_GE(engine->Stats().prompt_cache.ram.demotions, 9);
  EXPECT_EQ(Generate(*engine, Greedy(ids, "tenant-b")).usage.cached_tokens, 0);
  EXPECT_EQ(Generate(*engine, Greedy(ids)).usage.cached_tokens, 0);
  EXPECT_EQ(engine->Stats().prompt_cache.ram.promotions, 0);
  const Outcome a = Generate(*engine, Greedy(ids, "tenant-a"));
  EXPECT_EQ(a.usage.cached_tokens, 144);
  EXPECT_EQ(a.tokens, Cold(Greedy(ids)));
}

// RAM in front of the disk: what RAM evicts stays on disk (written through, or spilled), and a
// restart (RAM lost) is served from disk with the cold output.
TEST_F(RamTierTest, RamEvictionsReachTheDiskAndSurviveARestart) {
  const GenerationRequest a = Greedy(Prompt(150, 40));
  const std::vector<int32_t> cold = Cold(a);
  {
    std::unique_ptr<Engine> engine =
        NewEngine(RamConfig(/*blocks=*/24, /*ram_records=*/10, /*disk=*/true));
    ASSERT_NE(engine, nullptr);
    Generate(*engine, a);
    for (int seed = 41; seed < 46; ++seed) Generate(*engine, Greedy(Prompt(150, seed)));
    const PromptCacheStats s = engine->Stats().prompt_cache;
    EXPECT_GT(s.ram.evictions, 0);
    EXPECT_LE(s.ram.bytes, s.ram.capacity_bytes);
    // a's blocks left the pool and RAM: the disk serves them (the prefetcher moves the first
    // half of RAM's worth, 5, into RAM as the request arrives; the engine reads the other 4).
    const Outcome from_disk = Generate(*engine, a);
    EXPECT_EQ(from_disk.usage.cached_tokens, 144);
    EXPECT_EQ(from_disk.tokens, cold);
    const PromptCacheStats t = engine->Stats().prompt_cache;
    EXPECT_EQ(t.promotions + t.ram.promotions - s.ram.promotions, 9);
    EXPECT_EQ(t.ram.prefetched, 5);
  }
  std::unique_ptr<Engine> restarted =
      NewEngine(RamConfig(/*blocks=*/24, /*ram_records=*/10, /*disk=*/true));
  ASSERT_NE(restarted, nullptr);
  EXPECT_EQ(restarted->Stats().prompt_cache.ram.records, 0);
  const Outcome after = Generate(*restarted, a);
  EXPECT_EQ(after.usage.cached_tokens, 144);
  EXPECT_EQ(after.tokens, cold);
  // From disk: read by the engine thread, or moved to RAM first by the prefetcher. RAM starts
  // empty, so every block promoted from RAM was prefetched; a prefetch that lands after the
  // engine thread has read its block from disk is counted but never promoted (a race the ASan
  // build lost once: 5 prefetched, 4 promoted).
  const PromptCacheStats s = restarted->Stats().prompt_cache;
  EXPECT_EQ(s.promotions + s.ram.promotions, 9);
  EXPECT_LE(s.ram.promotions, s.ram.prefetched);
}

// A request that waits in the queue has its prefix moved from disk to RAM by the prefetcher
// meanwhile: its admission restores every block from RAM (none from disk on the engine thread),
// with the cold output.
TEST_F(RamTierTest, WaitingRequestsPrefixIsPrefetchedFromDiskIntoRam) {
  const GenerationRequest b = Greedy(Prompt(150, 60));
  const std::vector<int32_t> cold = Cold(b);
  EngineConfig config = RamConfig(/*blocks=*/40, /*ram_records=*/64, /*disk=*/true);
  config.max_running = 1;  // b waits while the first request runs
  RunAndStop(b, config);   // b's blocks on disk
  std::unique_ptr<Engine> engine = NewEngine(config);
  ASSERT_NE(engine, nullptr);
  GenerationRequest busy = Greedy(Prompt(20, 61));
  busy.max_tokens = 300;
  std::shared_ptr<ResponseStream> first = testing::SubmitOrDie(*engine, busy);
  ASSERT_NE(first, nullptr);
  auto submitted = engine->Submit(b);
  auto* second = std::get_if<std::shared_ptr<ResponseStream>>(&submitted);
  ASSERT_NE(second, nullptr);
  std::vector<TokenEvent> events;
  while (first->Next(&events)) events.clear();
  Outcome run;
  while ((*second)->Next(&events)) {
    for (const TokenEvent& e : events)
      if (e.token_id >= 0) run.tokens.push_back(e.token_id);
    events.clear();
  }
  EXPECT_EQ(run.tokens, cold);
  EXPECT_EQ((*second)->usage().cached_tokens, 144);
  const PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.prefetched, 9);
  EXPECT_EQ(s.ram.prefetch_failed, 0);
  EXPECT_EQ(s.ram.promotions, 9);
  EXPECT_EQ(s.promotions, 0) << "the engine thread read the disk";
}

// Four long requests at once in a pool that holds little more than one: sequences are preempted
// and blocks are evicted into RAM while others run. Every output equals its cold run (no block is
// lost or mixed up), and asked again the requests' prefixes come back from RAM.
TEST_F(RamTierTest, PreemptedSequencesComeBackFromRamIntact) {
  std::vector<GenerationRequest> requests;
  for (int seed = 50; seed < 54; ++seed) {
    GenerationRequest r = Greedy(Prompt(120, seed));
    r.max_tokens = 40;
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> cold;
  for (const GenerationRequest& r : requests) cold.push_back(Cold(r));
  std::unique_ptr<Engine> engine = NewEngine(RamConfig(/*blocks=*/14, /*ram_records=*/64));
  ASSERT_NE(engine, nullptr);
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests) streams.push_back(testing::SubmitOrDie(*engine, r));
  for (size_t i = 0; i < streams.size(); ++i) {
    ASSERT_NE(streams[i], nullptr);
    std::vector<int32_t> tokens;
    std::vector<TokenEvent> events;
    while (streams[i]->Next(&events)) {
      for (const TokenEvent& e : events)
        if (e.token_id >= 0) tokens.push_back(e.token_id);
      events.clear();
    }
    EXPECT_EQ(tokens, cold[i]) << "request " << i;
  }
  EngineStats s = engine->Stats();
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prompt_cache.ram.demotions, 0);
  // The pool holds one request's blocks at most: asked again one by one, the others' prefixes
  // come from RAM (and, running alone, with their cold outputs).
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome again = Generate(*engine, requests[i]);
    EXPECT_EQ(again.tokens, cold[i]) << "request " << i << " again";
    EXPECT_GT(again.usage.cached_tokens, 0) << "request " << i << " again";
  }
  s = engine->Stats();
  EXPECT_GT(s.prompt_cache.ram.promotions, 0);
  EXPECT_EQ(s.prompt_cache.ram.corrupt_dropped, 0);
}

TEST(StateShareBytesTest, OneStateRecordPerIntervalOfBlocksAndAtLeastOne) {
  // 1 state record of 300 bytes per 2 KV records of 100: 300 / 500 of the tier.
  EXPECT_EQ(StateShareBytes(1000, 100, 300, 2), 600);
  EXPECT_EQ(StateShareBytes(10000, 100, 300, 32), 10000 * 300 / 3500);
  EXPECT_EQ(StateShareBytes(450, 100, 300, 32), 300);  // at least one checkpoint
  EXPECT_EQ(StateShareBytes(399, 100, 300, 1), 0);     // not one block and one checkpoint
}

// A hybrid model (qwen3_next: gated DeltaNet layers whose recurrent state is not in the KV
// blocks): both tiers keep the pool's state checkpoints beside their blocks, and a prefix from a
// tier resumes only at a block whose checkpoint reads back; that checkpoint is seeded back into
// the pool, and a waiting request's is prefetched from disk into RAM. Every output equals a cold
// run's (tokens and top-5 logprobs).
class HybridTierTest : public RamTierTest {
 protected:
  static constexpr int32_t kVocab = 500;  // the fixture's 512 ids
  std::string ModelName() const override { return "qwen3_next"; }
  // A pool of `blocks` blocks and room for 16 checkpoints, taken at 32, 64, 96 and each prompt's
  // last full block; with `ram`, a RAM tier of 64 blocks and 32 checkpoints.
  EngineConfig HybridConfig(bool disk = true, int32_t blocks = 64, bool ram = false) {
    EngineConfig c = Config(disk);
    Model* probe = NewModel();
    const int64_t state = probe->StateBytesPerSequence();
    c.state_checkpoint_interval = 32;
    c.state_checkpoint_bytes = 16 * state;
    c.kv_cache_bytes = blocks * kBlock * probe->KvBytesPerToken() +
                       (int64_t{c.max_running} + 1) * state + c.state_checkpoint_bytes;
    if (ram) {
      c.prompt_cache.ram_bytes =
          64 * prompt_cache::RecordBytes(kBlock, kBlock * probe->KvBytesPerToken()) +
          32 * prompt_cache::RecordBytes(kBlock, state);
    }
    return c;
  }
  static GenerationRequest Request(int32_t len, int32_t seed) {
    return WithLogprobs(Greedy(Prompt(len, seed, kVocab)));
  }
  // The folders of the KV records and of the state checkpoints (FINGERPRINT says which).
  void Folders(std::filesystem::path* kv, std::filesystem::path* states) const {
    for (const auto& e : std::filesystem::directory_iterator(cache_dir_)) {
      std::ifstream in(e.path() / "FINGERPRINT");
      const std::string text(std::istreambuf_iterator<char>(in), {});
      *(text.starts_with("recurrent-state") ? states : kv) = e.path();
    }
  }
};

// (a) A prompt computed by one engine is served by the next on the same directory (a restart):
// its blocks and the checkpoint at the prompt's last full block come from disk, the state is
// written into the sequence's slot, and the output is the cold run's, bit for bit.
TEST_F(HybridTierTest, RestartResumesFromTheDiskCheckpointWithColdOutputs) {
  const GenerationRequest request = Request(100, 1);
  const Outcome cold = ColdRun(request);
  const Outcome first = RunAndStop(request, HybridConfig());
  EXPECT_EQ(first.tokens, cold.tokens);
  EXPECT_EQ(first.usage.cached_tokens, 0);
  std::unique_ptr<Engine> engine = NewEngine(HybridConfig());
  ASSERT_NE(engine, nullptr);
  PromptCacheStats s = engine->Stats().prompt_cache;
  const int64_t state_record =
      prompt_cache::RecordBytes(kBlock, engine->model().StateBytesPerSequence());
  EXPECT_EQ(s.state_records, 3);  // 32, 64, 96 (the prompt's last full block)
  EXPECT_EQ(s.state_bytes, 3 * state_record);
  EXPECT_EQ(s.bytes, s.records * prompt_cache::RecordBytes(kBlock, engine->model().KvBlockBytes()) +
                         s.state_bytes);
  EXPECT_LE(s.bytes, s.capacity_bytes);
  EXPECT_EQ(s.capacity_bytes, int64_t{64} << 20);  // the checkpoints' share is in the cap
  const Outcome second = Generate(*engine, request);
  EXPECT_EQ(second.usage.cached_tokens, 96);
  EXPECT_EQ(second.tokens, cold.tokens);
  EXPECT_EQ(second.logprobs, cold.logprobs);
  s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.promotions, 6);
  EXPECT_EQ(s.state_hits, 1);
  EXPECT_EQ(s.state_restores, 1);
  EXPECT_EQ(s.corrupt_dropped, 0);
}

// A checkpoint restored from a tier is seeded into the pool as the checkpoint of the block it was
// read for: the same prompt again is a pool hit (no tier lookup, no block or checkpoint read),
// and both runs give the cold run's tokens and logprobs, bit for bit.
TEST_F(HybridTierTest, RestoredCheckpointIsSeededIntoThePool) {
  const GenerationRequest request = Request(100, 5);
  const Outcome cold = ColdRun(request);
  RunAndStop(request, HybridConfig());
  std::unique_ptr<Engine> engine = NewEngine(HybridConfig());
  ASSERT_NE(engine, nullptr);
  const Outcome from_disk = Generate(*engine, request);
  EXPECT_EQ(from_disk.usage.cached_tokens, 96);
  EXPECT_EQ(from_disk.tokens, cold.tokens);
  EXPECT_EQ(from_disk.logprobs, cold.logprobs);
  const EngineStats before = engine->Stats();
  EXPECT_EQ(before.prompt_cache.state_restores, 1);
  EXPECT_EQ(before.prompt_cache.promotions, 6);
  EXPECT_EQ(before.state_checkpoint_saves, 1) << "the restored checkpoint, seeded at 96";
  EXPECT_EQ(before.state_checkpoints, 1);
  const Outcome again = Generate(*engine, request);
  EXPECT_EQ(again.usage.cached_tokens, 96);
  EXPECT_EQ(again.tokens, cold.tokens);
  EXPECT_EQ(again.logprobs, cold.logprobs);
  const EngineStats after = engine->Stats();
  EXPECT_EQ(after.prompt_cache.lookups, before.prompt_cache.lookups) << "looked past the pool";
  EXPECT_EQ(after.prompt_cache.state_restores, 1);
  EXPECT_EQ(after.prompt_cache.state_hits, before.prompt_cache.state_hits);
  EXPECT_EQ(after.prompt_cache.hits, before.prompt_cache.hits);
  EXPECT_EQ(after.prompt_cache.promotions, 6);
  EXPECT_EQ(after.prefix_hit_tokens - before.prefix_hit_tokens, 96);
}

// (c) A prompt sharing 5 blocks with one on disk resumes at the last checkpoint among them (64
// tokens) and recomputes the fifth block and the rest.
TEST_F(HybridTierTest, MatchPastTheLastCheckpointResumesThereAndRecomputesTheRest) {
  const GenerationRequest a = Request(100, 2);
  std::vector<int32_t> ids(a.prompt_ids.begin(), a.prompt_ids.begin() + 80);
  const std::vector<int32_t> tail = Prompt(20, 9, kVocab);
  ids.insert(ids.end(), tail.begin(), tail.end());
  GenerationRequest b = a;
  b.prompt_ids = ids;
  const Outcome cold = ColdRun(b);
  RunAndStop(a, HybridConfig());
  std::unique_ptr<Engine> engine = NewEngine(HybridConfig());
  ASSERT_NE(engine, nullptr);
  const Outcome run = Generate(*engine, b);
  EXPECT_EQ(run.usage.cached_tokens, 64);
  EXPECT_EQ(run.tokens, cold.tokens);
  EXPECT_EQ(run.logprobs, cold.logprobs);
  EXPECT_EQ(engine->Stats().prompt_cache.promotions, 4);
  EXPECT_EQ(engine->Stats().prompt_cache.state_restores, 1);
}

// (b) The RAM tier alone: a prompt's blocks evicted from a small pool go to RAM with their live
// checkpoints; asked again, it resumes from RAM at the prompt's last full block.
TEST_F(HybridTierTest, PoolEvictionsCarryCheckpointsToRam) {
  const GenerationRequest a = Request(100, 11);
  const Outcome cold = ColdRun(a);
  const EngineConfig c = HybridConfig(/*disk=*/false, /*blocks=*/24, /*ram=*/true);
  const int64_t state = NewModel()->StateBytesPerSequence();
  std::unique_ptr<Engine> engine = NewEngine(c);
  ASSERT_NE(engine, nullptr);
  ASSERT_EQ(engine->Stats().kv_blocks_total, 24);
  EXPECT_EQ(Generate(*engine, a).tokens, cold.tokens);
  // Four other prompts of 7 blocks each push a's blocks out of the 24-block pool (their 12
  // checkpoints and a's 3 fit the 16 slots: a's are live when its blocks go).
  for (int seed = 12; seed < 16; ++seed) Generate(*engine, Request(100, seed));
  PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_GE(s.ram.demotions, 6);
  EXPECT_GE(s.ram.state_records, 3);
  EXPECT_EQ(s.ram.state_bytes,
            s.ram.state_records * prompt_cache::RecordBytes(kBlock, state));
  EXPECT_LE(s.ram.bytes, s.ram.capacity_bytes);
  EXPECT_EQ(s.ram.capacity_bytes, c.prompt_cache.ram_bytes);
  const Outcome ram_hit = Generate(*engine, a);
  EXPECT_EQ(ram_hit.usage.cached_tokens, 96);
  EXPECT_EQ(ram_hit.tokens, cold.tokens);
  EXPECT_EQ(ram_hit.logprobs, cold.logprobs);
  s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.promotions, 6);
  EXPECT_EQ(s.ram.state_hits, 1);
  EXPECT_EQ(s.state_restores, 1);
  // The restored checkpoint was seeded into the pool: asked again, a pool hit (nothing from RAM).
  const Outcome again = Generate(*engine, a);
  EXPECT_EQ(again.usage.cached_tokens, 96);
  EXPECT_EQ(again.tokens, cold.tokens);
  EXPECT_EQ(again.logprobs, cold.logprobs);
  s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.promotions, 6);
  EXPECT_EQ(s.ram.state_hits, 1);
  EXPECT_EQ(s.state_restores, 1);
}

// Both tiers: a waiting request's checkpoint is moved from disk into RAM with its blocks while it
// waits, so its admission reads the checkpoint from RAM (the disk is not read on the engine
// thread); the output is the cold run's, bit for bit.
TEST_F(HybridTierTest, WaitingRequestsCheckpointIsPrefetchedFromDiskIntoRam) {
  const GenerationRequest b = Request(100, 6);
  const Outcome cold = ColdRun(b);
  EngineConfig config = HybridConfig(/*disk=*/true, /*blocks=*/64, /*ram=*/true);
  config.max_running = 1;  // b waits while the first request runs
  RunAndStop(b, config);   // b's blocks and checkpoints on disk
  std::unique_ptr<Engine> engine = NewEngine(config);
  ASSERT_NE(engine, nullptr);
  GenerationRequest busy = Request(20, 7);
  busy.max_tokens = 200;
  std::shared_ptr<ResponseStream> first = testing::SubmitOrDie(*engine, busy);
  ASSERT_NE(first, nullptr);
  std::shared_ptr<ResponseStream> second = testing::SubmitOrDie(*engine, b);
  ASSERT_NE(second, nullptr);
  Collect(*first);
  const Outcome run = Collect(*second);
  EXPECT_EQ(run.usage.cached_tokens, 96);
  EXPECT_EQ(run.tokens, cold.tokens);
  EXPECT_EQ(run.logprobs, cold.logprobs);
  const PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.ram.state_prefetched, 1);  // the one at 96, where it resumes
  EXPECT_EQ(s.ram.state_hits, 1);
  EXPECT_EQ(s.ram.prefetched, 6);
  EXPECT_EQ(s.ram.promotions, 6);
  EXPECT_EQ(s.promotions, 0) << "the engine thread read the disk";
  EXPECT_EQ(s.ram.prefetch_failed, 0);
  EXPECT_EQ(s.state_restores, 1);
}

// (d) Damaged checkpoints are refused, never used: the one at 96 has a flipped byte (refused on
// read), the one at 64 is truncated (removed at start-up); the prompt resumes at 32.
TEST_F(HybridTierTest, DamagedCheckpointsAreRefusedAndRecomputed) {
  const GenerationRequest request = Request(100, 3);
  const Outcome cold = ColdRun(request);
  RunAndStop(request, HybridConfig());
  std::filesystem::path kv_dir, state_dir;
  Folders(&kv_dir, &state_dir);
  ASSERT_FALSE(state_dir.empty());
  const std::vector<std::filesystem::path> checkpoints =
      BlockFiles(request.prompt_ids, 6, kv_dir, state_dir);
  for (int j : {1, 3, 5}) ASSERT_TRUE(std::filesystem::exists(checkpoints[j])) << j;
  FlipByte(checkpoints[5], 2000);  // inside the state
  std::filesystem::resize_file(checkpoints[3], std::filesystem::file_size(checkpoints[3]) - 8);
  std::unique_ptr<Engine> engine = NewEngine(HybridConfig());
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->Stats().prompt_cache.corrupt_dropped, 1);  // the truncated one
  const Outcome run = Generate(*engine, request);
  EXPECT_EQ(run.usage.cached_tokens, 32);
  EXPECT_EQ(run.tokens, cold.tokens);
  EXPECT_EQ(run.logprobs, cold.logprobs);
  const PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.corrupt_dropped, 2);
  EXPECT_EQ(s.state_restores, 1);
  EXPECT_EQ(s.promotions, 2);
}

// A damaged KV block before the last checkpoint: the prompt resumes at the checkpoint before it
// (block 4 of 6 refused: the checkpoint at 64), not at the one whose blocks are not all there.
TEST_F(HybridTierTest, DamagedBlockFallsBackToAnEarlierCheckpoint) {
  const GenerationRequest request = Request(100, 4);
  const Outcome cold = ColdRun(request);
  RunAndStop(request, HybridConfig());
  std::filesystem::path kv_dir, state_dir;
  Folders(&kv_dir, &state_dir);
  const std::vector<std::filesystem::path> blocks =
      BlockFiles(request.prompt_ids, 6, kv_dir, kv_dir);
  FlipByte(blocks[4], 1000);
  std::unique_ptr<Engine> engine = NewEngine(HybridConfig());
  ASSERT_NE(engine, nullptr);
  const Outcome run = Generate(*engine, request);
  EXPECT_EQ(run.usage.cached_tokens, 64);
  EXPECT_EQ(run.tokens, cold.tokens);
  EXPECT_EQ(run.logprobs, cold.logprobs);
  const PromptCacheStats s = engine->Stats().prompt_cache;
  EXPECT_EQ(s.corrupt_dropped, 1);
  EXPECT_EQ(s.state_hits, 2);  // the one at 96, then the one at 64
  EXPECT_EQ(s.state_restores, 1);
}

// Without room for a checkpoint (no prefix cache), the tiers are refused for a hybrid model,
// naming the flag.
TEST_F(HybridTierTest, RefusedWithoutCheckpoints) {
  EngineConfig c = Config();
  c.state_checkpoint_bytes = 0;
  auto engine = Engine::Create(NewModel(), c);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.message().find("--state-checkpoint-bytes"), std::string::npos)
      << engine.message();
}

}  // namespace
}  // namespace ember
