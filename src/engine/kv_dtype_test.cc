// The engine over a quantized KV cache (--kv-cache-dtype; backend/kv_quant.h) on the trained
// TinyStories fixture: greedy continuations of the golden prompts stay the reference's where the
// format's logit error is below the goldens' margins, the same --kv-cache-bytes holds more tokens
// in proportion to the row bytes, batched runs (chunked prefill, staggered arrivals, preemption,
// prefix-cache hits) equal solo runs token for token, the KV fingerprint (the disk tier's key)
// differs per format, and (where a GPU exists) the CUDA backend's int8 / fp8 / int4 pools give the
// CPU's greedy continuations where the margins are clear of the two backends' logit difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cuda_loader.h"
#include "backend/kv_quant.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"

namespace ember {
namespace {

using testing::Greedy;
using testing::ModelDir;
using testing::SubmitOrDie;

std::unique_ptr<Model> LoadWithKv(const std::string& dir, KvDType dtype,
                                  std::vector<KvLayerOverride> layers = {},
                                  DeviceKind device = DeviceKind::kCpu,
                                  bool cuda_f32_compute = false) {
  ModelLoadOptions options;
  options.device = device;
  options.cuda_f32_compute = cuda_f32_compute;
  options.kv_cache.dtype = dtype;
  options.kv_cache.layers = std::move(layers);
  auto model = Model::Load(dir, options);
  EXPECT_TRUE(model.ok()) << model.message();
  return model.ok() ? std::move(model).value() : nullptr;
}

std::vector<int32_t> Tokens(const std::shared_ptr<ResponseStream>& stream) {
  std::vector<int32_t> out;
  std::vector<TokenEvent> events;
  while (stream->Next(&events)) {
    for (const TokenEvent& e : events)
      if (e.token_id >= 0) out.push_back(e.token_id);
    events.clear();
  }
  return out;
}

// Every golden prompt's 64-token greedy continuation, all prompts batched: how many of the
// prompts' continuations equal the reference, of how many.
std::pair<int, int> GoldenMatches(const std::string& dir, KvDType dtype) {
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  auto model = LoadWithKv(dir, dtype);
  auto engine = Engine::Create(model.get(), EngineConfig{});
  EXPECT_TRUE(engine.ok()) << engine.message();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : golden["prompts"]) {
    expected.push_back(p["greedy_ids"].get<std::vector<int32_t>>());
    streams.push_back(SubmitOrDie(**engine, Greedy(p["ids"].get<std::vector<int32_t>>(),
                                                   static_cast<int32_t>(expected.back().size()))));
  }
  int equal = 0;
  for (size_t i = 0; i < streams.size(); ++i) equal += Tokens(streams[i]) == expected[i];
  return {equal, static_cast<int>(streams.size())};
}

// The logits of every position of `ids` (one prefill: every row attends to K/V read back from
// the pool in the model's format).
std::vector<float> AllLogits(Model& model, const std::vector<int32_t>& ids) {
  const int32_t blocks = static_cast<int32_t>((ids.size() + 15) / 16);
  if (model.num_kv_blocks() == 0) {
    EXPECT_TRUE(model.AllocateKvCache(blocks, 16).ok());
  }
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int32_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = b;
  BatchPlan plan;
  plan.block_size = 16;
  plan.AddSequence(ids, 0, table, false);
  for (int32_t r = 0; r < static_cast<int32_t>(ids.size()); ++r) plan.logits_rows.push_back(r);
  std::vector<float> logits(ids.size() * static_cast<size_t>(model.config().vocab_size));
  EXPECT_TRUE(model.Forward(plan, logits).ok());
  return logits;
}

// f16 keeps every golden continuation (batched engine run, 64 tokens each). The coarser formats
// are held to what the goldens' margins allow: over each golden sequence (prompt + continuation,
// teacher-forced), every logit stays within the format's bound of the float32 path's, and the
// top-1 token is the float32 path's wherever its top-1/top-2 margin exceeds twice that bound.
TEST(KvDTypeTest, TinyStoriesGreedyMatchesTheReferenceWhereMarginsAllow) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  const auto [equal, total] = GoldenMatches(dir, KvDType::kF16);
  EXPECT_EQ(equal, total) << "f16";
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  // Bounds about 1.5x what was measured (2026-12-05: f16 0.014, bf16 0.076, int8 0.21, fp8 1.11,
  // int4 3.6 over the 3 golden sequences; the logits span about 30).
  struct Case {
    KvDType dtype;
    float bound;      // the largest |logit - float32 logit| allowed
    int min_checked;  // rows whose margin must be wide enough to check the top-1 there
  };
  for (const Case c : {Case{KvDType::kF16, 0.025f, 100}, Case{KvDType::kBF16, 0.12f, 100},
                       Case{KvDType::kInt8, 0.32f, 60}, Case{KvDType::kFP8, 1.7f, 5},
                       Case{KvDType::kInt4, 5.5f, 0}}) {
    float worst = 0;
    int checked = 0;
    for (const auto& p : golden["prompts"]) {
      std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
      const size_t prompt_len = ids.size();
      for (int32_t t : p["greedy_ids"]) ids.push_back(t);
      auto f32 = LoadWithKv(dir, KvDType::kF32);
      auto quant = LoadWithKv(dir, c.dtype);
      const std::vector<float> ref = AllLogits(*f32, ids), got = AllLogits(*quant, ids);
      const int64_t vocab = f32->config().vocab_size;
      for (size_t r = prompt_len - 1; r + 1 < ids.size(); ++r) {
        const float* a = ref.data() + r * vocab;
        const float* b = got.data() + r * vocab;
        std::vector<float> sorted(a, a + vocab);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        for (int64_t i = 0; i < vocab; ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
        if (sorted[0] - sorted[1] > 2 * c.bound) {
          ++checked;
          EXPECT_EQ(std::max_element(b, b + vocab) - b, ids[r + 1])
              << KvDTypeName(c.dtype) << " row " << r;
        }
      }
    }
    EXPECT_LT(worst, c.bound) << KvDTypeName(c.dtype);
    EXPECT_GE(checked, c.min_checked) << KvDTypeName(c.dtype) << ": too few rows checked";
    std::printf("%s: max |logit - f32 logit| %.4f, top-1 checked at %d rows\n",
                KvDTypeName(c.dtype), worst, checked);
  }
}

TEST(KvDTypeTest, CapacityInTokensFollowsTheRowBytes) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto f32 = LoadWithKv(dir, KvDType::kAuto);
  ASSERT_NE(f32, nullptr);
  const ModelConfig& c = f32->config();
  EngineConfig config;
  config.kv_cache_bytes = f32->KvBytesPerToken() * 16 * 64;  // 64 blocks of float32 rows
  auto base = Engine::Create(f32.get(), config);
  ASSERT_TRUE(base.ok()) << base.message();
  EXPECT_EQ((*base)->kv_capacity_tokens(), 16 * 64);
  EXPECT_EQ(f32->KvDTypes(), "f32");
  for (KvDType t : {KvDType::kBF16, KvDType::kF16, KvDType::kInt8, KvDType::kFP8, KvDType::kInt4}) {
    auto model = LoadWithKv(dir, t);
    ASSERT_NE(model, nullptr);
    const int64_t row = KvRowBytes(t, c.head_dim);
    EXPECT_EQ(model->KvBytesPerToken(), 2LL * c.num_layers * c.num_kv_heads * row);
    auto engine = Engine::Create(model.get(), config);
    ASSERT_TRUE(engine.ok()) << engine.message();
    // Whole blocks of the same bytes: 64 * (4 * head_dim / row) blocks, rounded down.
    EXPECT_EQ((*engine)->kv_capacity_tokens(), 16 * (64 * 4 * c.head_dim / row)) << KvDTypeName(t);
    EXPECT_LE((*engine)->kv_cache_bytes(), config.kv_cache_bytes);
    EXPECT_EQ(model->KvDTypes(), KvDTypeName(t));
    EXPECT_EQ(model->KvBlockBytes(), 16 * model->KvBytesPerToken());
    EXPECT_NE(model->KvFingerprint(), f32->KvFingerprint()) << KvDTypeName(t);
  }
  auto mixed = LoadWithKv(dir, KvDType::kInt8, {{-1, -1, KvDType::kBF16}});
  ASSERT_NE(mixed, nullptr);
  EXPECT_EQ(mixed->KvDTypes(), "int8 (layers 0), bf16 (1)");
  EXPECT_EQ(mixed->KvBytesPerToken(),
            2LL * c.num_kv_heads * (KvRowBytes(KvDType::kInt8, c.head_dim) +
                                    KvRowBytes(KvDType::kBF16, c.head_dim)));
}

// The CUDA backend against the CPU backend, both with int8 (then fp8, int4) KV rows: the engine's
// 48-token greedy continuation of each golden prompt (decode steps: the CUDA graphs, RopeWriteKv
// quantizing on write) equals the CPU's up to the first step whose CPU top-1/top-2 margin is
// below twice the largest |CUDA - CPU| logit difference over the CPU's sequence (teacher-forced
// prefill of prompt + continuation on both); after such a step the two may legitimately part.
// In the f32 mode (f32 weights and GEMMs, the f32 attention kernels reading the quantized rows)
// the difference is float32 rounding, and at least half the steps must be checked that way; in
// the bf16 mode (bf16 weights, the batch-invariant attention) the bf16 error (about 0.2 here)
// exceeds most of this small model's margins, so only the clear steps are held, as in model_test's
// CudaBf16ParityTest.
TEST(KvDTypeTest, CudaGreedyEqualsCpuUnderQuantizedKv) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  constexpr int32_t kSteps = 48;
  for (const bool f32 : {true, false})
  for (KvDType t : {KvDType::kInt8, KvDType::kFP8, KvDType::kInt4}) {
    SCOPED_TRACE(f32 ? "f32 mode" : "bf16 mode");
    auto cpu = LoadWithKv(dir, t);
    auto gpu = LoadWithKv(dir, t, {}, DeviceKind::kCuda, f32);
    ASSERT_NE(cpu, nullptr);
    ASSERT_NE(gpu, nullptr);
    EXPECT_EQ(gpu->KvDTypes(), KvDTypeName(t));
    EXPECT_EQ(gpu->KvBytesPerToken(), cpu->KvBytesPerToken());
    std::vector<std::vector<int32_t>> prompts, wants, gots;
    {
      EngineConfig config;
      config.kv_cache_bytes = cpu->KvBytesPerToken() * 16 * 64;
      auto cpu_engine = Engine::Create(cpu.get(), config);
      auto gpu_engine = Engine::Create(gpu.get(), config);
      ASSERT_TRUE(cpu_engine.ok()) << cpu_engine.message();
      ASSERT_TRUE(gpu_engine.ok()) << gpu_engine.message();
      for (const auto& p : golden["prompts"]) {
        prompts.push_back(p["ids"].get<std::vector<int32_t>>());
        wants.push_back(Tokens(SubmitOrDie(**cpu_engine, Greedy(prompts.back(), kSteps))));
        gots.push_back(Tokens(SubmitOrDie(**gpu_engine, Greedy(prompts.back(), kSteps))));
      }
      (*cpu_engine)->Shutdown(true);
      (*gpu_engine)->Shutdown(true);
    }
    EXPECT_EQ(gpu->KvBlockBytes(), cpu->KvBlockBytes());  // the disk tier's record size
    int checked = 0, total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {  // (the engines are gone: the pools are free)
      const std::vector<int32_t>& prompt = prompts[i];
      const std::vector<int32_t>& want = wants[i];
      const std::vector<int32_t>& got = gots[i];
      std::vector<int32_t> ids = prompt;
      ids.insert(ids.end(), want.begin(), want.end());
      const std::vector<float> ref = AllLogits(*cpu, ids), dev = AllLogits(*gpu, ids);
      const int64_t vocab = cpu->config().vocab_size;
      float diff = 0;
      for (size_t j = 0; j < ref.size(); ++j) diff = std::max(diff, std::abs(ref[j] - dev[j]));
      total += static_cast<int>(want.size());
      for (size_t s = 0; s < want.size(); ++s) {
        const float* a = ref.data() + (prompt.size() - 1 + s) * vocab;
        std::vector<float> sorted(a, a + vocab);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        if (sorted[0] - sorted[1] <= 2 * diff) break;  // from here they may part
        ASSERT_LT(s, got.size());
        EXPECT_EQ(got[s], want[s]) << KvDTypeName(t) << " step " << s << " (margin "
                                   << sorted[0] - sorted[1] << ", bound " << 2 * diff << ")";
        ++checked;
      }
      std::printf("%s, %s mode: max |cuda - cpu logit| %.5f, %d of %d steps checked so far\n",
                  KvDTypeName(t), f32 ? "f32" : "bf16", diff, checked, total);
    }
    if (f32) {
      EXPECT_GE(2 * checked, total) << KvDTypeName(t) << ": too few steps clear of the bound";
    }
  }
}

// 16 greedy requests alone, then 16 at once with 13-token chunked prefill, staggered arrivals,
// a pool too small for all of them (preemption) and prefix caching on: the same tokens.
TEST(KvDTypeTest, BatchedEqualsSoloUnderQuantizedKv) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::mt19937 rng(21);
  std::vector<GenerationRequest> requests;
  const std::vector<int32_t> shared = {1, 401, 87, 1200, 55, 9, 300, 17, 640, 1001, 77, 5, 88, 12,
                                       900, 31, 44};  // a shared prefix: prefix-cache hits
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt = shared;
    prompt.resize(shared.size() + 1 + rng() % 30);
    for (size_t j = shared.size(); j < prompt.size(); ++j) prompt[j] = 1 + static_cast<int32_t>(rng() % 2047);
    requests.push_back(Greedy(prompt, 6 + static_cast<int32_t>(rng() % 12)));
  }
  for (KvDType t : {KvDType::kInt8, KvDType::kInt4}) {
    std::vector<std::vector<int32_t>> solo;
    {
      auto model = LoadWithKv(dir, t);
      EngineConfig config;
      config.max_running = 1;
      config.enable_prefix_caching = false;
      auto engine = Engine::Create(model.get(), config);
      ASSERT_TRUE(engine.ok()) << engine.message();
      for (const GenerationRequest& r : requests) solo.push_back(Tokens(SubmitOrDie(**engine, r)));
    }
    // Staggered arrivals race the engine thread (on a loaded machine a run may finish its early
    // requests before the pool fills), so the preemption path is checked on a run that submits
    // all 16 at once (16 x ~3 blocks for a 10-block pool); both runs must give the solo tokens.
    auto run_batched = [&](bool stagger) {
      auto model = LoadWithKv(dir, t);
      EngineConfig config;
      config.max_running = 16;
      config.max_step_tokens = 13;
      config.kv_cache_bytes = model->KvBytesPerToken() * 16 * 10;  // 10 blocks: preemption
      auto engine = Engine::Create(model.get(), config);
      EXPECT_TRUE(engine.ok()) << engine.message();
      if (!engine.ok()) return EngineStats{};
      std::vector<std::shared_ptr<ResponseStream>> streams;
      for (size_t i = 0; i < requests.size(); ++i) {
        streams.push_back(SubmitOrDie(**engine, requests[i]));
        if (stagger && i % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      for (size_t i = 0; i < requests.size(); ++i)
        EXPECT_EQ(Tokens(streams[i]), solo[i]) << KvDTypeName(t) << " request " << i;
      (*engine)->Shutdown(true);
      return (*engine)->Stats();
    };
    EXPECT_EQ(run_batched(/*stagger=*/true).kv_blocks_used, 0);
    const EngineStats stats = run_batched(/*stagger=*/false);
    EXPECT_GT(stats.preemptions, 0) << KvDTypeName(t);
    EXPECT_GT(stats.prefix_hit_tokens, 0) << KvDTypeName(t);
    EXPECT_EQ(stats.kv_blocks_used, 0);
  }
}

}  // namespace
}  // namespace ember
