// Engine invariants on real checkpoints (fixture models, CPU backend; batch invariance also on
// CUDA where a GPU exists): a request's greedy output is the reference continuation and does not
// depend on its batch-mates, arrival time, chunking, prefix-cache hits or preemption; seeded
// sampling is batch-independent; cancellation and
// shutdown free every KV block.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cuda_loader.h"
#include "engine/engine_testing.h"
#include "model/lora_set.h"
#include "sampling/gbnf_automaton.h"
#include "sampling/gbnf_constraint.h"
#include "sampling/json_schema.h"
#include "tokenizer/tokenizer.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

using testing::Greedy;
using testing::ModelDir;
using testing::SubmitOrDie;
using testing::StrideConstraint;
using json = nlohmann::json;

std::unique_ptr<Model> LoadModel(const std::string& dir, DeviceKind device = DeviceKind::kCpu) {
  ModelLoadOptions options;
  options.device = device;
  // CUDA: bf16 with the batch-invariant GEMM (`--batch-invariant on`): the tests compare batched
  // and solo runs token for token.
  options.cuda_batch_invariant = true;
  auto model = Model::Load(dir, options);
  EXPECT_TRUE(model.ok()) << model.message();
  return model.ok() ? std::move(model).value() : nullptr;
}

struct Output {
  std::vector<std::vector<int32_t>> samples;
  RequestUsage usage;
  FinishReason finish = FinishReason::kNone;
};

Output Collect(const std::shared_ptr<ResponseStream>& stream) {
  Output out;
  out.samples.resize(stream->num_samples());
  std::vector<TokenEvent> events;
  while (stream->Next(&events)) {
    for (const TokenEvent& e : events) {
      if (e.token_id >= 0) out.samples[e.sample_index].push_back(e.token_id);
      if (e.finish != FinishReason::kNone) out.finish = e.finish;
    }
    events.clear();
  }
  out.usage = stream->usage();
  return out;
}

// Prompts of assorted lengths over the model's vocabulary, deterministic.
std::vector<GenerationRequest> MakeRequests(int32_t count, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<GenerationRequest> requests;
  for (int32_t i = 0; i < count; ++i) {
    int32_t len = 1 + static_cast<int32_t>(rng() % 40);
    std::vector<int32_t> prompt(len);
    for (int32_t& t : prompt) t = 1 + static_cast<int32_t>(rng() % (vocab - 1));
    requests.push_back(Greedy(prompt, 4 + static_cast<int32_t>(rng() % 12)));
  }
  return requests;
}

std::vector<std::vector<int32_t>> RunSolo(const std::string& dir,
                                          const std::vector<GenerationRequest>& requests,
                                          DeviceKind device = DeviceKind::kCpu) {
  auto model = LoadModel(dir, device);
  EngineConfig config;
  config.max_running = 1;
  config.enable_prefix_caching = false;
  auto engine = Engine::Create(model.get(), config);
  EXPECT_TRUE(engine.ok()) << engine.message();
  std::vector<std::vector<int32_t>> outputs;
  for (const GenerationRequest& r : requests) {
    auto stream = SubmitOrDie(**engine, r);
    outputs.push_back(stream ? Collect(stream).samples[0] : std::vector<int32_t>{});
  }
  return outputs;
}

TEST(EngineTest, TinyStoriesGreedyMatchesTheReference) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::ifstream in(dir + "/golden.json");
  nlohmann::json golden = nlohmann::json::parse(in);
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : golden["prompts"]) {  // all prompts at once: batched
    auto expect = p["greedy_ids"].get<std::vector<int32_t>>();
    streams.push_back(SubmitOrDie(**engine, Greedy(p["ids"].get<std::vector<int32_t>>(),
                                                   static_cast<int32_t>(expect.size()))));
    expected.push_back(expect);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    Output out = Collect(streams[i]);
    EXPECT_EQ(out.samples[0], expected[i]) << "prompt " << i;
    EXPECT_EQ(out.finish, FinishReason::kLength);
  }
}

// 16 greedy requests alone, then in batches of 4 and 16 with staggered arrivals and 13-token
// chunked prefill mixed with decode rows: every output identical.
void CheckBatchInvariance(const std::string& dir, DeviceKind device) {
  auto probe = LoadModel(dir, device);
  ASSERT_NE(probe, nullptr);
  std::vector<GenerationRequest> requests = MakeRequests(16, probe->config().vocab_size, 7);
  std::vector<std::vector<int32_t>> solo = RunSolo(dir, requests, device);

  for (int32_t batch : {4, 16}) {
    auto model = LoadModel(dir, device);
    EngineConfig config;
    config.max_running = batch;
    config.max_step_tokens = 13;  // forces chunked prefill mixed with decode rows
    auto engine = Engine::Create(model.get(), config);
    ASSERT_TRUE(engine.ok()) << engine.message();
    std::vector<std::shared_ptr<ResponseStream>> streams;
    for (size_t i = 0; i < requests.size(); ++i) {
      streams.push_back(SubmitOrDie(**engine, requests[i]));
      if (i % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // stagger
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(Collect(streams[i]).samples[0], solo[i])
          << dir << " batch " << batch << " request " << i;
    }
    (*engine)->Shutdown(true);
    EXPECT_EQ((*engine)->Stats().kv_blocks_used, 0);
  }
}

class BatchInvarianceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvarianceTest, BatchedStaggeredChunkedEqualsSolo) {
  EMBER_REQUIRE_DIR(ModelDir(GetParam()));
  CheckBatchInvariance(ModelDir(GetParam()), DeviceKind::kCpu);
}

// The same on the CUDA backend in bf16 mode with --batch-invariant on, where a GPU exists.
TEST_P(BatchInvarianceTest, OnCuda) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  EMBER_REQUIRE_DIR(ModelDir(GetParam()));
  CheckBatchInvariance(ModelDir(GetParam()), DeviceKind::kCuda);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvarianceTest,
                         ::testing::Values("tinystories-656k", "llama3", "qwen2", "qwen3",
                                           "qwen3_moe", "gpt_oss", "mistral", "phi3", "gemma2",
                                           "gemma3", "qwen3_next", "deepseek_v3"));

// A hybrid model (qwen3_next: recurrent state per sequence in state slots beside the paged KV)
// through the engine: the golden greedy tokens; every KV block and state slot given back.
TEST(HybridModelTest, GoldenGreedyThroughTheEngine) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  std::ifstream in(dir + "/golden.json");
  nlohmann::json golden = nlohmann::json::parse(in);
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  std::vector<std::vector<int32_t>> expected;
  for (auto& [name, want] : golden["greedy"].items()) {  // all at once: batched
    expected.push_back(want.get<std::vector<int32_t>>());
    const auto prompt = golden["sequences"][name].get<std::vector<int32_t>>();
    streams.push_back(
        SubmitOrDie(**engine, Greedy(prompt, static_cast<int32_t>(expected.back().size()))));
  }
  for (size_t i = 0; i < streams.size(); ++i)
    EXPECT_EQ(Collect(streams[i]).samples[0], expected[i]) << "sequence " << i;
  (*engine)->Shutdown(true);
  EXPECT_EQ((*engine)->Stats().kv_blocks_used, 0);
}

// Preemption (a KV budget of a few blocks beside the state slots) recomputes a sequence from
// its first token, its state starting over: the tokens of every request equal its solo run.
TEST(HybridModelTest, PreemptionThenResumeGivesTheSoloTokens) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  std::vector<GenerationRequest> requests = MakeRequests(24, model->config().vocab_size, 5);
  std::vector<std::vector<int32_t>> solo = RunSolo(dir, requests);
  EngineConfig config;
  config.max_running = 24;
  config.kv_cache_bytes =
      25 * model->StateBytesPerSequence() + model->KvBytesPerToken() * 16 * 6;
  auto engine = Engine::Create(model.get(), config);
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests) streams.push_back(SubmitOrDie(**engine, r));
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(Collect(streams[i]).samples[0], solo[i]) << "request " << i;
  (*engine)->Shutdown(true);
  EngineStats stats = (*engine)->Stats();
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

// n > 1: the samples after the first restore the state checkpointed at the prompt's last full
// block into their own slots, so greedy samples all equal the solo run; padded decode steps
// (graph buckets, the padding rows in the scratch slot) change no token.
TEST(HybridModelTest, SamplesAndPaddedStepsGiveTheSoloTokens) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests = MakeRequests(6, 512, 9);
  std::vector<std::vector<int32_t>> solo = RunSolo(dir, requests);
  for (GenerationRequest& r : requests) r.n = 3;
  ModelLoadOptions options;
  options.cpu_decode_graph_buckets = {1, 2, 4, 8};
  auto model = Model::Load(dir, options);
  ASSERT_TRUE(model.ok()) << model.message();
  EngineConfig config;
  config.max_running = 5;
  config.max_step_tokens = 11;
  auto engine = Engine::Create(model->get(), config);
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests) streams.push_back(SubmitOrDie(**engine, r));
  for (size_t i = 0; i < requests.size(); ++i) {
    const Output out = Collect(streams[i]);
    for (int32_t k = 0; k < 3; ++k)
      EXPECT_EQ(out.samples[k], solo[i]) << "request " << i << " sample " << k;
  }
  (*engine)->Shutdown(true);
  EXPECT_GT((*engine)->Stats().prefix_hit_tokens, 0);
  EXPECT_GT((*engine)->Stats().decode_padding_rows, 0);
  EXPECT_EQ((*engine)->Stats().kv_blocks_used, 0);
}

// A hybrid model's prefix cache keeps recurrent-state checkpoints, taken out of the KV budget
// (an eighth by default, --state-checkpoint-bytes, 0 turning the prefix cache off); a bad
// interval is refused, naming the reason; the prompt cache's tiers are not (they keep the
// checkpoints too: prompt_tier_test's HybridTierTest); speculation adds snapshot slots.
TEST(HybridModelTest, PrefixCacheKeepsStateCheckpointsWithTiersAndSpeculation) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  const int64_t per_state = model->StateBytesPerSequence();
  EXPECT_GT(per_state, 0);
  auto sizing = SizeEngine(*model, EngineConfig{});
  ASSERT_TRUE(sizing.ok()) << sizing.message();
  EXPECT_TRUE(sizing->config.enable_prefix_caching);
  EXPECT_GT(sizing->state_bytes, 0);
  EXPECT_GT(sizing->num_state_checkpoints, 0);
  EXPECT_EQ(sizing->state_checkpoint_bytes, sizing->num_state_checkpoints * per_state);
  // An explicit budget holds the state slots, the checkpoints and the blocks.
  EngineConfig budget;
  budget.max_running = 4;
  budget.kv_cache_bytes = 100 * per_state;
  budget.state_checkpoint_bytes = 7 * per_state + 5;
  auto sized = SizeEngine(*model, budget);
  ASSERT_TRUE(sized.ok()) << sized.message();
  EXPECT_EQ(sized->num_state_checkpoints, 7);
  EXPECT_EQ(sized->state_checkpoint_bytes, 7 * per_state);
  EXPECT_EQ(sized->state_bytes, 5 * per_state);
  EXPECT_LE(sized->kv_cache_bytes + sized->state_bytes + sized->state_checkpoint_bytes,
            budget.kv_cache_bytes);
  EXPECT_GT(sized->kv_cache_bytes + model->KvBytesPerToken() * budget.block_size,
            budget.kv_cache_bytes - sized->state_bytes - sized->state_checkpoint_bytes);
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok()) << engine.message();
  EXPECT_TRUE((*engine)->Stats().prefix_caching);  // /stats: prefix_cache.enabled
  EXPECT_EQ((*engine)->Stats().recurrent_state_bytes, sizing->state_bytes);
  EXPECT_EQ((*engine)->Stats().state_checkpoint_capacity_bytes, sizing->state_checkpoint_bytes);
  EXPECT_EQ((*engine)->Stats().state_checkpoints, 0);
  (*engine)->Shutdown(true);
  EngineConfig none;
  none.state_checkpoint_bytes = 0;
  auto off = SizeEngine(*model, none);
  ASSERT_TRUE(off.ok()) << off.message();
  EXPECT_FALSE(off->config.enable_prefix_caching);
  EXPECT_EQ(off->num_state_checkpoints, 0);
  EngineConfig bad_interval;
  bad_interval.state_checkpoint_interval = 24;
  auto bad = SizeEngine(*model, bad_interval);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--state-checkpoint-interval"), std::string::npos);
  EngineConfig too_big = budget;
  too_big.state_checkpoint_bytes = 100 * per_state;
  EXPECT_FALSE(SizeEngine(*model, too_big).ok());
  EngineConfig with_disk;
  with_disk.prompt_cache.dir = "/tmp/ember-qwen3next-never-created";
  with_disk.prompt_cache.disk_bytes = 1 << 20;
  EXPECT_TRUE(SizeEngine(*model, with_disk).ok());
  // Speculation (the CPU backend keeps per-row state snapshots): num_spec_tokens snapshot slots
  // for each sequence that may draft at once, taken from the explicit budget with the others.
  EngineConfig spec = budget;
  spec.speculation.method = SpeculationConfig::Method::kNgram;
  spec.speculation.num_spec_tokens = 3;
  spec.speculation.max_batch = 2;
  auto with_spec = SizeEngine(*model, spec);
  ASSERT_TRUE(with_spec.ok()) << with_spec.message();
  EXPECT_EQ(with_spec->num_spec_snapshot_slots, 2 * 3);
  EXPECT_EQ(with_spec->state_bytes, (5 + 6) * per_state);
  EXPECT_LE(with_spec->kv_cache_bytes + with_spec->state_bytes +
                with_spec->state_checkpoint_bytes,
            budget.kv_cache_bytes);
  spec.speculation.max_batch = 16;  // more than max_running: max_running sequences draft at most
  EXPECT_EQ(SizeEngine(*model, spec)->num_spec_snapshot_slots, 4 * 3);
  spec.kv_cache_bytes = (5 + 12) * per_state;  // exactly the slots: no room left
  auto too_small = SizeEngine(*model, spec);
  ASSERT_FALSE(too_small.ok());
  EXPECT_NE(too_small.message().find("12 speculation snapshots"), std::string::npos)
      << too_small.message();
}

// Tokens and their logprobs (top 3) of a greedy request's one sample.
struct Scored {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<float> top;
  int32_t cached_tokens = 0;
};
Scored CollectScored(const std::shared_ptr<ResponseStream>& stream) {
  Scored out;
  std::vector<TokenEvent> events;
  while (stream->Next(&events)) {
    for (const TokenEvent& e : events) {
      if (e.token_id < 0) continue;
      out.tokens.push_back(e.token_id);
      out.logprobs.push_back(e.logprob);
      for (const TokenLogprob& t : e.top_logprobs) out.top.push_back(t.logprob);
    }
    events.clear();
  }
  out.cached_tokens = stream->usage().cached_tokens;
  return out;
}

GenerationRequest Scoring(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r = Greedy(std::move(prompt), max_tokens);
  r.sampling.top_logprobs = 3;
  return r;
}

// Prefix-cache hits on a hybrid model restore the recurrent state checkpointed at the hit's end:
// at the end of an earlier prompt's last full block, and mid-recurrence at an interval
// checkpoint (a prompt that shares only part of the earlier one). Tokens and logprobs equal a
// cold run's; the hit sizes, the checkpoints and their bytes show in the stats.
TEST(HybridModelTest, PrefixHitsRestoreCheckpointsAndGiveTheColdOutputs) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(45);
  std::vector<int32_t> first(100);
  for (int32_t& t : first) t = 1 + static_cast<int32_t>(rng() % 500);
  std::vector<int32_t> partial(first.begin(), first.begin() + 70);  // diverges in block 4
  for (int32_t i = 0; i < 20; ++i) partial.push_back(3 + i);
  std::vector<int32_t> longer = first;  // extends the first prompt
  for (int32_t i = 0; i < 9; ++i) longer.push_back(7 + i);
  const std::vector<GenerationRequest> requests = {Scoring(first, 6), Scoring(partial, 10),
                                                   Scoring(longer, 10)};
  std::vector<Scored> cold;
  {
    auto cold_model = LoadModel(dir);
    EngineConfig config;
    config.enable_prefix_caching = false;
    auto engine = Engine::Create(cold_model.get(), config);
    ASSERT_TRUE(engine.ok()) << engine.message();
    for (const GenerationRequest& r : requests)
      cold.push_back(CollectScored(SubmitOrDie(**engine, r)));
  }
  EngineConfig config;
  config.state_checkpoint_interval = 32;  // checkpoints at 32, 64, 96 and the prompt ends
  auto engine = Engine::Create(model.get(), config);
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<Scored> warm;
  for (const GenerationRequest& r : requests) warm.push_back(CollectScored(SubmitOrDie(**engine, r)));
  const std::vector<int32_t> want_cached = {0, 64, 96};  // interval checkpoint; prompt end
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(warm[i].cached_tokens, want_cached[i]) << "request " << i;
    EXPECT_EQ(warm[i].tokens, cold[i].tokens) << "request " << i;
    EXPECT_EQ(warm[i].logprobs, cold[i].logprobs) << "request " << i;
    EXPECT_EQ(warm[i].top, cold[i].top) << "request " << i;
    EXPECT_EQ(cold[i].cached_tokens, 0);
  }
  (*engine)->Shutdown(true);
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.prefix_hit_tokens, 64 + 96);
  EXPECT_GE(stats.state_checkpoints, 4);  // 32, 64, 96 of the first prompt, 64 + 16 of partial
  EXPECT_EQ(stats.state_checkpoint_bytes,
            int64_t{stats.state_checkpoints} * model->StateBytesPerSequence());
  EXPECT_LE(stats.state_checkpoint_bytes, stats.state_checkpoint_capacity_bytes);
  EXPECT_EQ(stats.state_checkpoint_saves, stats.state_checkpoints);  // none evicted here
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

// Requests sharing prefixes, batched and staggered with chunked prefill, n > 1 (samples after
// the first hit the prompt's checkpoint), under a KV budget that preempts and a checkpoint budget
// of two that evicts: every sample's tokens equal its solo run.
TEST(HybridModelTest, SharedPrefixesBatchedSamplesPreemptedAndEvictedGiveTheSoloTokens) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> bases(3);
  for (auto& b : bases) {
    b.resize(40 + rng() % 30);
    for (int32_t& t : b) t = 1 + static_cast<int32_t>(rng() % 500);
  }
  std::vector<GenerationRequest> requests;
  for (int32_t i = 0; i < 18; ++i) {
    const std::vector<int32_t>& base = bases[static_cast<size_t>(i) % bases.size()];
    std::vector<int32_t> prompt(base.begin(), base.begin() + 20 + rng() % (base.size() - 20));
    for (uint32_t k = rng() % 12; k > 0; --k) prompt.push_back(1 + static_cast<int32_t>(rng() % 500));
    requests.push_back(Greedy(prompt, 4 + static_cast<int32_t>(rng() % 10)));
  }
  const std::vector<std::vector<int32_t>> solo = RunSolo(dir, requests);
  for (size_t i = 0; i < requests.size(); i += 4) requests[i].n = 2;
  EngineConfig config;
  config.max_running = 6;
  config.max_step_tokens = 13;  // chunked prefill mixed with decode rows
  config.state_checkpoint_interval = 16;
  config.state_checkpoint_bytes = 2 * model->StateBytesPerSequence();
  config.kv_cache_bytes = (7 + 2) * model->StateBytesPerSequence() +
                          model->KvBytesPerToken() * config.block_size * 8;
  auto engine = Engine::Create(model.get(), config);
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (size_t i = 0; i < requests.size(); ++i) {
    streams.push_back(SubmitOrDie(**engine, requests[i]));
    if (i % 5 == 4) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // stagger
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const Output out = Collect(streams[i]);
    for (int32_t k = 0; k < requests[i].n; ++k)
      EXPECT_EQ(out.samples[static_cast<size_t>(k)], solo[i]) << "request " << i << " sample " << k;
  }
  (*engine)->Shutdown(true);
  const EngineStats stats = (*engine)->Stats();
  EXPECT_GT(stats.prefix_hit_tokens, 0);
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_GT(stats.state_checkpoint_evictions, 0);
  EXPECT_LE(stats.state_checkpoints, 2);
  EXPECT_LE(stats.state_checkpoint_bytes, stats.state_checkpoint_capacity_bytes);
  EXPECT_EQ(stats.kv_blocks_used, 0);
}

// deepseek_v3 (multi-head latent attention, its KV pool holding the latent): the same, on the CPU
// (the CUDA backend refuses it).
TEST(EngineTest, MlaBatchedStaggeredChunkedEqualsSolo) {
  EMBER_REQUIRE_DIR(ModelDir("deepseek_v3"));
  CheckBatchInvariance(ModelDir("deepseek_v3"), DeviceKind::kCpu);
}

// A second request that shares a 40-token prefix with the first reuses its two full blocks and
// makes the tokens it makes without the cache.
void CheckPrefixCacheHit(const std::string& dir) {
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  std::vector<int32_t> shared(40);
  const int32_t span = std::min(2000, model->config().vocab_size - 3);
  for (int32_t i = 0; i < 40; ++i) shared[i] = 3 + (i * 37) % span;
  std::vector<int32_t> second = shared;
  second.insert(second.end(), {11, 12, 13, 14, 15});
  GenerationRequest first_request = Greedy(shared, 8);
  GenerationRequest second_request = Greedy(second, 12);
  std::vector<std::vector<int32_t>> uncached = RunSolo(dir, {second_request});

  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok());
  Output a = Collect(SubmitOrDie(**engine, first_request));
  EXPECT_EQ(a.usage.cached_tokens, 0);
  int64_t computed_before = (*engine)->Stats().computed_tokens;
  Output b = Collect(SubmitOrDie(**engine, second_request));
  EXPECT_EQ(b.usage.cached_tokens, 32);  // two full 16-token blocks of the shared prefix
  EXPECT_EQ(b.samples[0], uncached[0]);
  // Only the uncached prompt tokens (45 - 32) and the decode steps were computed.
  EXPECT_EQ((*engine)->Stats().computed_tokens - computed_before, (45 - 32) + (12 - 1));
}

TEST(EngineTest, PrefixCacheHitReproducesUncachedOutput) {
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  CheckPrefixCacheHit(ModelDir("tinystories-656k"));
}

// The latent pool's blocks are shared by the prefix cache unchanged.
TEST(EngineTest, MlaPrefixCacheHitReproducesUncachedOutput) {
  EMBER_REQUIRE_DIR(ModelDir("deepseek_v3"));
  CheckPrefixCacheHit(ModelDir("deepseek_v3"));
}

TEST(EngineTest, SeededSamplingIsBatchIndependent) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  GenerationRequest r = Greedy({1, 80, 147, 201, 282, 57}, 24);
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  r.n = 2;
  auto model = LoadModel(dir);
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok());
  Output alone = Collect(SubmitOrDie(**engine, r));
  EXPECT_NE(alone.samples[0], alone.samples[1]);  // the two samples draw different streams

  std::vector<GenerationRequest> others = MakeRequests(8, 2048, 99);
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (size_t i = 0; i < others.size(); ++i) {
    if (i == 3) streams.push_back(SubmitOrDie(**engine, r));
    streams.push_back(SubmitOrDie(**engine, others[i]));
  }
  Output batched = Collect(streams[3]);
  EXPECT_EQ(batched.samples, alone.samples);
  for (auto& s : streams) Collect(s);
}

// A token constraint (structured output) decides every token of its samples, alone and beside
// unconstrained requests (whose tokens it does not change), greedy and seeded-sampled, n = 2 with
// logprobs; the sample ends with "stop" when the constraint is done, and with an error (no
// token) when it allows nothing; a constraint over another vocabulary is refused.
void CheckTokenConstraint(const std::string& dir, DeviceKind device) {
  auto model = LoadModel(dir, device);
  ASSERT_NE(model, nullptr);
  const int32_t vocab = model->config().vocab_size;
  std::vector<GenerationRequest> others = MakeRequests(4, vocab, 5);
  std::vector<std::vector<int32_t>> solo = RunSolo(dir, others, device);
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok());

  GenerationRequest greedy = Greedy({1, 80, 147, 201}, 30);
  greedy.constraint = std::make_shared<StrideConstraint>(vocab, 7, 9);
  GenerationRequest sampled = greedy;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 3;
  sampled.sampling.top_logprobs = 2;
  sampled.n = 2;
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : others) streams.push_back(SubmitOrDie(**engine, r));
  auto greedy_stream = SubmitOrDie(**engine, greedy);
  auto sampled_stream = SubmitOrDie(**engine, sampled);
  for (size_t i = 0; i < others.size(); ++i)
    EXPECT_EQ(Collect(streams[i]).samples[0], solo[i]) << "request " << i;
  // The same requests with logprobs: their rows are sampled on the host (the mask applied
  // there) instead of by the backend (the mask as edits); the tokens must not change.
  GenerationRequest greedy_host = greedy, sampled_backend = sampled;
  greedy_host.sampling.top_logprobs = 0;
  sampled_backend.sampling.top_logprobs = -1;
  auto greedy_host_stream = SubmitOrDie(**engine, greedy_host);
  auto sampled_backend_stream = SubmitOrDie(**engine, sampled_backend);
  const Output greedy_out = Collect(greedy_stream), sampled_out = Collect(sampled_stream);
  for (const Output& out : {greedy_out, sampled_out}) {
    EXPECT_EQ(out.finish, FinishReason::kStop);
    for (const auto& sample : out.samples) {
      EXPECT_EQ(sample.size(), 9u);
      for (int32_t id : sample) EXPECT_EQ(id % 7, 0) << id;
    }
  }
  EXPECT_EQ(Collect(greedy_host_stream).samples, greedy_out.samples);
  EXPECT_EQ(Collect(sampled_backend_stream).samples, sampled_out.samples);

  GenerationRequest blocked = Greedy({1, 80, 147}, 30);
  blocked.constraint = std::make_shared<StrideConstraint>(vocab, 7, 9, /*block_at=*/3);
  Output out = Collect(SubmitOrDie(**engine, blocked));
  EXPECT_EQ(out.finish, FinishReason::kError);
  EXPECT_EQ(out.samples[0].size(), 3u);

  GenerationRequest wrong = Greedy({1, 80}, 4);
  wrong.constraint = std::make_shared<StrideConstraint>(vocab + 1, 7, 9);
  auto refused = (*engine)->Submit(wrong);
  ASSERT_TRUE(std::holds_alternative<SubmitError>(refused));
  EXPECT_EQ(std::get<SubmitError>(refused).param, "response_format");
  EXPECT_EQ((*engine)->Stats().kv_blocks_used, 0);
}

// A GBNF grammar constraint over the model's real vocabulary (the fixture's tokenizer): sampled
// outputs, n = 2, are sentences of the grammar and end by themselves ("stop").
TEST(EngineTest, GrammarConstraintOutputParses) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.message();
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  auto texts = TokenTexts::Build((*tokenizer)->TokenBytesTable(model->config().vocab_size));
  auto grammar = ParseGbnf(R"g(root ::= word (" " word){0,5} "."
                              word ::= [a-z]{1,8} | "(" [0-9]+ ("+" [0-9]+)? ")")g", "grammar");
  ASSERT_TRUE(grammar.ok()) << grammar.message();
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok());
  GenerationRequest r = Greedy({1, 80, 147}, 120);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 5;
  r.n = 2;
  r.constraint = MakeGbnfConstraint(texts, *grammar, {});
  const Output out = Collect(SubmitOrDie(**engine, r));
  EXPECT_EQ(out.finish, FinishReason::kStop);
  GbnfAutomaton recognizer(*grammar);
  for (const auto& sample : out.samples) {
    std::string text;
    for (int32_t id : sample) text += texts->bytes[static_cast<size_t>(id)].value_or("<none>");
    const int32_t state = recognizer.Walk(recognizer.start(), text);
    ASSERT_NE(state, GbnfAutomaton::kDead) << text;
    EXPECT_TRUE(recognizer.Terminal(state)) << text;
  }
}

// A JSON-schema constraint with fixed keys over the fixture's real vocabulary, whose tokens "<"
// and ">" spell "{" and "}" here (it has no brace; the model does not care what a token spells).
std::shared_ptr<TokenConstraint> FixedKeysSchemaConstraint(const std::string& dir) {
  auto tokenizer = Tokenizer::Load(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.message();
  if (!tokenizer.ok()) return nullptr;
  std::vector<std::optional<std::string>> bytes =
      (*tokenizer)->TokenBytesTable((*tokenizer)->vocab_size());
  for (std::optional<std::string>& b : bytes) {
    if (b == "<") b = "{";
    if (b == ">") b = "}";
  }
  auto schema = CompileJsonSchema(nlohmann::ordered_json::parse(R"({"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 8},
                     "age": {"type": "integer", "minimum": 0, "maximum": 99},
                     "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]},
                     "happy": {"type": "boolean"}},
      "required": ["name", "age", "city", "happy"], "additionalProperties": false})"),
                                  "schema");
  EXPECT_TRUE(schema.ok()) << schema.message();
  if (!schema.ok()) return nullptr;
  return MakeJsonSchemaConstraint(TokenTexts::Build(std::move(bytes)), *schema);
}

// One engine (jump-forward on or off, KV cache `kv_bytes`, 0: auto) over `requests`, one at a
// time or all submitted at once (`batched`); the outputs in request order and the engine's stats.
std::vector<Output> RunWithJumpForward(const std::string& dir,
                                       const std::vector<GenerationRequest>& requests,
                                       bool jump_forward, bool batched, int64_t kv_bytes,
                                       EngineStats* stats) {
  auto model = LoadModel(dir);
  EngineConfig config;
  config.jump_forward = jump_forward;
  config.kv_cache_bytes = kv_bytes;
  auto engine = Engine::Create(model.get(), config);
  EXPECT_TRUE(engine.ok()) << engine.message();
  if (!engine.ok()) return {};
  std::vector<Output> outs;
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests) {
    streams.push_back(SubmitOrDie(**engine, r));
    if (!batched) outs.push_back(Collect(streams.back()));
  }
  for (size_t i = 0; batched && i < streams.size(); ++i) outs.push_back(Collect(streams[i]));
  *stats = (*engine)->Stats();
  return outs;
}

// Jump-forward (tokens the constraint forces are appended without sampling and computed as the
// next step's chunk) changes no token: greedy, seeded sampling with penalties (the sampler's
// counts and its RNG stream) and n = 2, alone and batched with unconstrained requests, and
// max_tokens cuts at every length land on the same token with the same finish; it forced tokens
// (usage, stats) and saved steps. A request with logprobs does not jump forward.
TEST(EngineTest, JumpForwardChangesNoToken) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::shared_ptr<TokenConstraint> constraint = FixedKeysSchemaConstraint(dir);
  ASSERT_NE(constraint, nullptr);
  GenerationRequest greedy = Greedy({1, 80, 147, 201}, 90);
  greedy.constraint = constraint;
  GenerationRequest sampled = greedy;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 11;
  sampled.sampling.presence_penalty = 0.5f;
  sampled.n = 2;
  GenerationRequest with_logprobs = greedy;
  with_logprobs.sampling.top_logprobs = 1;
  const std::vector<GenerationRequest> requests = {greedy, sampled, with_logprobs};
  EngineStats off_stats, on_stats, batched_stats;
  const std::vector<Output> off = RunWithJumpForward(dir, requests, false, false, 0, &off_stats);
  const std::vector<Output> on = RunWithJumpForward(dir, requests, true, false, 0, &on_stats);
  std::vector<GenerationRequest> mixed = MakeRequests(3, 2048, 17);
  mixed.insert(mixed.begin() + 1, requests.begin(), requests.end());
  const std::vector<Output> batched =
      RunWithJumpForward(dir, mixed, true, true, 0, &batched_stats);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(off[i].finish, FinishReason::kStop) << "request " << i;
    EXPECT_EQ(on[i].samples, off[i].samples) << "request " << i;
    EXPECT_EQ(on[i].finish, off[i].finish) << "request " << i;
    EXPECT_EQ(batched[i + 1].samples, off[i].samples) << "request " << i;
    EXPECT_FALSE(off[i].usage.jump_forward);
    EXPECT_EQ(off[i].usage.forced_tokens, 0);
  }
  EXPECT_NE(off[1].samples[0], off[1].samples[1]);
  EXPECT_TRUE(on[0].usage.jump_forward);
  EXPECT_GT(on[0].usage.forced_tokens, 0);
  EXPECT_GT(on[1].usage.forced_tokens, 0);
  EXPECT_FALSE(on[2].usage.jump_forward);  // logprobs: every token sampled
  EXPECT_EQ(on[2].usage.forced_tokens, 0);
  EXPECT_EQ(on_stats.forced_tokens, on[0].usage.forced_tokens + on[1].usage.forced_tokens);
  EXPECT_EQ(off_stats.forced_tokens, 0);
  EXPECT_LT(on_stats.steps, off_stats.steps);  // forced tokens cost no step of their own
  // max_tokens cuts: every length of the greedy output, the cut inside forced runs included.
  const std::vector<int32_t>& full = off[0].samples[0];
  std::vector<GenerationRequest> cuts;
  for (size_t k = 1; k < full.size(); ++k) {
    cuts.push_back(greedy);
    cuts.back().max_tokens = static_cast<int32_t>(k);
  }
  EngineStats cut_stats;
  const std::vector<Output> cut = RunWithJumpForward(dir, cuts, true, true, 0, &cut_stats);
  EXPECT_GT(cut_stats.forced_tokens, 0);
  for (size_t k = 1; k < full.size(); ++k) {
    EXPECT_EQ(cut[k - 1].samples[0], std::vector<int32_t>(full.begin(), full.begin() + k)) << k;
    EXPECT_EQ(cut[k - 1].finish, FinishReason::kLength) << k;
    EXPECT_EQ(cut[k - 1].usage.completion_tokens, static_cast<int32_t>(k));
  }
}

// Jump-forward chains of several tokens (a test constraint that forces runs of tokens, the last
// run ending the output): the forced runs are computed as chunks of the next step and change no
// token, greedy and seeded (n = 2), alone, batched and under preemption with prefix-cache hits;
// max_tokens cuts at every length, inside the runs included, land on the same token with the
// same finish.
TEST(EngineTest, JumpForwardChainsChangeNoToken) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  const std::vector<int32_t> forced = {3, 4, 5, 6, 7, 8, 9, 13, 17, 18, 19, 20, 21, 22, 23};
  std::vector<int32_t> prompt = {1, 80, 147, 201};
  for (int32_t i = 0; i < 36; ++i) prompt.push_back(300 + 17 * i);  // two full KV blocks
  GenerationRequest greedy = Greedy(prompt, 40);
  greedy.constraint = std::make_shared<StrideConstraint>(2048, 7, 24, -1, forced);
  GenerationRequest sampled = greedy;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 4;
  sampled.sampling.frequency_penalty = 0.3f;
  sampled.n = 2;
  std::vector<GenerationRequest> requests = {greedy, sampled};
  for (int32_t k = 1; k < 24; ++k) {
    requests.push_back(k % 2 ? greedy : sampled);
    requests.back().max_tokens = k;
  }
  EngineStats off_stats, on_stats, batched_stats;
  const std::vector<Output> off = RunWithJumpForward(dir, requests, false, false, 0, &off_stats);
  const std::vector<Output> on = RunWithJumpForward(dir, requests, true, false, 0, &on_stats);
  const std::vector<Output> batched =
      RunWithJumpForward(dir, requests, true, true, 0, &batched_stats);
  // TinyStories' KV is 1 KiB a token: 10 blocks of 16 tokens for 48 samples of up to 64 tokens
  // preempt (and recompute forced tokens), and their shared prompt hits the prefix cache.
  EngineStats tight_stats;
  const std::vector<Output> tight =
      RunWithJumpForward(dir, requests, true, true, int64_t{10} * 16 * 1024, &tight_stats);
  EXPECT_GT(tight_stats.preemptions, 0);
  EXPECT_GT(tight_stats.prefix_hit_tokens, 0);
  EXPECT_EQ(tight_stats.kv_blocks_used, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(tight[i].samples, off[i].samples) << "request " << i;
    EXPECT_EQ(on[i].samples, off[i].samples) << "request " << i;
    EXPECT_EQ(batched[i].samples, off[i].samples) << "request " << i;
    EXPECT_EQ(on[i].finish, off[i].finish) << "request " << i;
    EXPECT_EQ(batched[i].finish, off[i].finish) << "request " << i;
    EXPECT_EQ(on[i].usage.completion_tokens, off[i].usage.completion_tokens) << "request " << i;
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(off[i].finish, FinishReason::kStop);
    for (const auto& sample : off[i].samples) {
      ASSERT_EQ(sample.size(), 24u);
      for (int32_t p : forced)
        EXPECT_EQ(sample[static_cast<size_t>(p)],
                  StrideConstraint(2048, 7, 24, -1, forced).ForcedId(p));
    }
    // Each listed position follows a token of the output, so each is forced.
    EXPECT_EQ(on[i].usage.forced_tokens,
              static_cast<int32_t>(forced.size() * on[i].samples.size()));
  }
  EXPECT_NE(off[1].samples[0], off[1].samples[1]);
  EXPECT_LT(on_stats.steps, off_stats.steps);
}

TEST(EngineTest, TokenConstraintDecidesEveryToken) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  CheckTokenConstraint(dir, DeviceKind::kCpu);
}

// On the GPU a constrained row's mask goes to the backend as edits (or, with logprobs, its
// logits come to the host) beside rows the backend samples.
TEST(EngineTest, CudaTokenConstraintDecidesEveryToken) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CheckTokenConstraint(dir, DeviceKind::kCuda);
}

// Decode steps padded to graph buckets (as on a GPU; here the CPU backend reports buckets) give
// the same tokens and logprobs as unpadded ones: the padding rows write only the scratch KV block
// and their outputs are dropped. Greedy and seeded sampled requests, one with logprobs (its row's
// logits go to the host sampler beside the padding rows' argmax), n = 2, and chunked prefill
// mixed with decode rows; every KV block is free afterwards.
TEST(EngineTest, PaddedDecodeStepsChangeNoToken) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests = MakeRequests(11, 2048, 5);
  requests[2].sampling.temperature = 0.8f;
  requests[2].sampling.top_p = 0.9f;
  requests[2].sampling.seed = 7;
  requests[5].sampling.top_logprobs = 3;
  requests[7].n = 2;
  requests[7].sampling.temperature = 1.0f;
  requests[7].sampling.seed = 11;
  struct Run {
    std::vector<std::vector<std::pair<int32_t, float>>> events;  // per request and sample
    EngineStats stats;
  };
  auto run = [&](const std::vector<int32_t>& buckets) {
    ModelLoadOptions options;
    options.cpu_decode_graph_buckets = buckets;
    auto model = Model::Load(dir, options);
    EXPECT_TRUE(model.ok()) << model.message();
    EngineConfig config;
    config.max_running = 6;
    config.max_step_tokens = 13;
    auto engine = Engine::Create(model->get(), config);
    EXPECT_TRUE(engine.ok()) << engine.message();
    std::vector<std::shared_ptr<ResponseStream>> streams;
    for (const GenerationRequest& r : requests) streams.push_back(SubmitOrDie(**engine, r));
    Run result;
    for (auto& stream : streams) {
      std::vector<TokenEvent> events;
      std::vector<std::pair<int32_t, float>> got;
      while (stream->Next(&events)) {
        for (const TokenEvent& e : events)
          if (e.token_id >= 0) got.emplace_back(e.token_id * 16 + e.sample_index, e.logprob);
        events.clear();
      }
      result.events.push_back(got);
    }
    (*engine)->Shutdown(true);
    result.stats = (*engine)->Stats();
    EXPECT_EQ(result.stats.kv_blocks_used, 0);
    return result;
  };
  const Run plain = run({});
  const Run padded = run({1, 2, 4, 8});
  EXPECT_EQ(plain.stats.decode_padding_rows, 0);
  EXPECT_GT(padded.stats.decode_padding_rows, 0);  // the padding really ran
  ASSERT_EQ(plain.events.size(), padded.events.size());
  for (size_t i = 0; i < plain.events.size(); ++i)
    EXPECT_EQ(plain.events[i], padded.events[i]) << "request " << i;
}

// Every request's sample-0 tokens from one engine over `dir` with the given backend sampling:
// all submitted at once (batched as the engine thread picks them up), or one after another
// (`solo`: every step's batch is the same in every run, whatever the timing).
std::vector<std::vector<int32_t>> RunAll(const std::string& dir,
                                         const std::vector<GenerationRequest>& requests,
                                         EngineConfig::BackendSampling mode,
                                         DeviceKind device = DeviceKind::kCpu, bool solo = false) {
  auto model = LoadModel(dir, device);
  EngineConfig config;
  config.backend_sampling = mode;
  auto engine = Engine::Create(model.get(), config);
  EXPECT_TRUE(engine.ok()) << engine.message();
  std::vector<std::vector<int32_t>> out;
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests) {
    streams.push_back(SubmitOrDie(**engine, r));
    if (solo) out.push_back(Collect(streams.back()).samples[0]);
  }
  if (!solo) {
    for (auto& s : streams) out.push_back(Collect(s).samples[0]);
  }
  return out;
}

// Sampled requests drawn by the backend (the CPU twin of the GPU's SampleRows, forced here) give
// the same tokens as the host sampler for the same seeds, alone and batched.
TEST(EngineTest, BackendSamplingEqualsTheHostSampler) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests = MakeRequests(12, 2048, 5);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams& s = requests[i].sampling;
    s.temperature = 0.6f + 0.1f * static_cast<float>(i % 6);
    s.top_k = i % 3 == 0 ? 0 : 30;
    s.top_p = i % 2 == 0 ? 1.0f : 0.9f;
    s.min_p = i % 4 == 1 ? 0.05f : 0.0f;
    s.seed = 100 + i;
    requests[i].max_tokens = 20;
  }
  const auto host = RunAll(dir, requests, EngineConfig::BackendSampling::kAuto);  // CPU: host
  const auto backend = RunAll(dir, requests, EngineConfig::BackendSampling::kAlways);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(backend[i], host[i]) << "request " << i;
}

// The logits processors applied by the backend (Backend::ApplyLogitEdits, then ArgmaxRows /
// SampleRows) give the same tokens as the host sampler applying them (forced by asking for
// logprobs, which keeps every row on the host): logit_bias (a repeated id too), each penalty
// (repetition above and below 1, presence and frequency, negative ones too), min_tokens with
// stop ids the plain run would have picked, and combinations where one id is biased, penalised
// and masked at once; greedy and seeded sampled rows, batched together.
void CheckBackendProcessors(const std::string& dir, DeviceKind device, bool solo) {
  std::vector<GenerationRequest> requests = MakeRequests(16, 2048, 9);
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationRequest& r = requests[i];
    r.max_tokens = 16;
    r.ignore_eos = true;
    if (i >= 8) {
      r.sampling.temperature = 0.7f + 0.1f * static_cast<float>(i % 4);
      r.sampling.top_k = i % 3 == 0 ? 0 : 40;
      r.sampling.top_p = i % 2 == 0 ? 1.0f : 0.9f;
    } else {
      r.sampling.temperature = 0.0f;
    }
    r.sampling.seed = 300 + i;
  }
  const auto plain = RunAll(dir, requests, EngineConfig::BackendSampling::kAlways, device, solo);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_GE(plain[i].size(), 3u) << "request " << i;
    GenerationRequest& r = requests[i];
    SamplingParams& s = r.sampling;
    const int32_t first = plain[i][0], third = plain[i][2], prompt0 = r.prompt_ids[0];
    switch (i % 8) {
      case 0:  // bias, with a repeated id whose entries add up
        s.logit_bias = {{first, -4.0f}, {third, 2.5f}, {first, -1.25f}, {7, 3.0f}};
        break;
      case 1:
        s.repetition_penalty = 1.3f;
        break;
      case 2:  // presence penalty and DRY (kSubtract edits after the penalty's)
        s.presence_penalty = 1.5f;
        s.dry_multiplier = 1.5f;
        s.dry_allowed_length = 1;
        break;
      case 3:
        s.frequency_penalty = 0.8f;
        break;
      case 4:  // min_tokens: the plain run's first and third tokens (and EOS) masked at first
        s.min_tokens = 6;
        r.stop_token_ids = {first, third};
        r.ignore_eos = false;
        break;
      case 5:  // one id biased, penalised (a prompt id) and masked; another biased and penalised
        s.logit_bias = {{prompt0, 5.0f}, {first, 1.5f}, {third, -2.0f}};
        s.repetition_penalty = 1.2f;
        s.frequency_penalty = 0.5f;
        s.presence_penalty = 0.3f;
        s.min_tokens = 4;
        r.stop_token_ids = {prompt0, third};
        break;
      case 6:  // a repetition penalty below 1 (favours repeats) and a bias on a prompt id
        s.repetition_penalty = 0.8f;
        s.logit_bias = {{prompt0, 0.75f}};
        break;
      case 7:  // negative presence / frequency penalties with a bias; DRY with a breaker
        s.presence_penalty = -0.7f;
        s.frequency_penalty = -0.3f;
        s.logit_bias = {{first, -3.0f}};
        s.dry_multiplier = 0.8f;
        s.dry_base = 2.0f;
        s.dry_allowed_length = 1;
        s.dry_penalty_last_n = 8;
        s.dry_breaker_ids =
            std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{third});
        break;
    }
    // Host-only filters on sampled rows (i >= 8): the backend must hand these rows to the host.
    if (i == 9) s.xtc_probability = 1.0f, s.xtc_threshold = 0.02f;
    if (i == 10) s.typical_p = 0.3f;
    if (i == 11) s.top_n_sigma = 0.3f;
  }
  const auto backend = RunAll(dir, requests, EngineConfig::BackendSampling::kAlways, device, solo);
  // kAuto: on the CPU greedy rows on the backend, draws on the host; on a GPU the same as above.
  const auto mixed = RunAll(dir, requests, EngineConfig::BackendSampling::kAuto, device, solo);
  for (GenerationRequest& r : requests) r.sampling.top_logprobs = 0;  // every row on the host
  const auto host = RunAll(dir, requests, EngineConfig::BackendSampling::kAlways, device, solo);
  int32_t changed = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(backend[i], host[i]) << "request " << i;
    EXPECT_EQ(mixed[i], host[i]) << "request " << i << " (kAuto)";
    changed += host[i] != plain[i];
  }
  // The processors did change the outputs (min_tokens rows must: their first token is masked).
  EXPECT_NE(host[4], plain[4]);
  EXPECT_NE(host[12], plain[12]);
  EXPECT_GE(changed, 12) << "of 16 requests";
}

TEST(EngineTest, BackendLogitsProcessorsEqualTheHostSampler) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  CheckBackendProcessors(dir, DeviceKind::kCpu, /*solo=*/false);
}

// The same on a GPU: the CUDA edit kernel, ArgmaxRows and SampleRows against the host sampler
// over the GPU's own logits (copied for the logprobs rows). One request at a time: batched as
// the engine thread happens to pick the requests up, one late draw differed in ~1 of 3 runs with
// either SampleRows kernel, i.e. the GPU step's logits still depended on the batch's timing.
TEST(EngineTest, CudaBackendLogitsProcessorsEqualTheHostSampler) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CheckBackendProcessors(dir, DeviceKind::kCuda, /*solo=*/true);
}

// A test constraint that masks few ids (the multiples of `stride`), done after `length` tokens:
// its masks go to the backend as kMask edits, not bits.
class FewMaskedConstraint : public TokenConstraint {
 public:
  FewMaskedConstraint(int32_t vocab, int32_t stride, int32_t length)
      : vocab_(vocab), stride_(stride), length_(length) {}
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<FewMaskedConstraint>(*this);
  }
  int32_t vocab_size() const override { return vocab_; }
  int64_t Allowed(std::vector<uint8_t>& allowed) const override {
    allowed.assign(static_cast<size_t>(vocab_), 1);
    int64_t masked = 0;
    for (int32_t id = 0; id < vocab_; id += stride_) allowed[static_cast<size_t>(id)] = 0, ++masked;
    return vocab_ - masked;
  }
  bool Accept(int32_t id) override { return id % stride_ != 0 && ++accepted_ > 0; }
  bool Done() const override { return accepted_ >= length_; }

 private:
  int32_t vocab_, stride_, length_;
  int32_t accepted_ = 0;
};

// Token masks applied by the backend (Backend::ApplyTokenMasks after ApplyLogitEdits, then
// ArgmaxRows / SampleRows; or, for masks of few ids, kMask edits) give the same tokens as the
// host sampler masking the same rows (forced by asking for logprobs): the fixed-key JSON schema
// over the fixture's real vocabulary (structure, enums, numbers, bounded strings: bits), greedy
// and seeded-sampled (n = 2) with processors on the same rows (logit_bias, presence penalty,
// min_tokens), plus a constraint that masks few ids (edits), batched with unconstrained requests.
// The counters show where each run's masks went.
void CheckBackendTokenMasks(const std::string& dir, DeviceKind device, bool solo) {
  std::shared_ptr<TokenConstraint> schema = FixedKeysSchemaConstraint(dir);
  ASSERT_NE(schema, nullptr);
  GenerationRequest greedy = Greedy({1, 80, 147, 201}, 90);
  greedy.constraint = schema;
  GenerationRequest sampled = greedy;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 11;
  sampled.sampling.presence_penalty = 0.5f;
  sampled.n = 2;
  GenerationRequest biased = sampled;
  biased.sampling.seed = 12;
  biased.sampling.top_p = 0.9f;
  biased.sampling.logit_bias = {{7, 2.0f}, {100, -1.5f}, {201, 3.0f}};
  biased.sampling.min_tokens = 12;
  biased.n = 1;
  GenerationRequest few = Greedy({1, 80, 147}, 24);
  few.constraint = std::make_shared<FewMaskedConstraint>(2048, 300, 24);
  GenerationRequest few_sampled = few;
  few_sampled.sampling.temperature = 0.8f;
  few_sampled.sampling.seed = 5;
  std::vector<GenerationRequest> requests = MakeRequests(3, 2048, 23);
  for (const GenerationRequest& r : {greedy, sampled, biased, few, few_sampled})
    requests.push_back(r);
  auto run = [&](bool host, EngineStats* stats) {
    auto model = LoadModel(dir, device);
    EngineConfig config;
    config.backend_sampling = EngineConfig::BackendSampling::kAlways;
    auto engine = Engine::Create(model.get(), config);
    EXPECT_TRUE(engine.ok()) << engine.message();
    std::vector<Output> outs;
    std::vector<std::shared_ptr<ResponseStream>> streams;
    for (GenerationRequest r : requests) {
      if (host && r.constraint != nullptr) r.sampling.top_logprobs = 0;  // every row on the host
      streams.push_back(SubmitOrDie(**engine, r));
      if (solo) outs.push_back(Collect(streams.back()));
    }
    for (size_t i = 0; !solo && i < streams.size(); ++i) outs.push_back(Collect(streams[i]));
    (*engine)->Shutdown(true);
    *stats = (*engine)->Stats();
    return outs;
  };
  EngineStats host_stats, backend_stats;
  const std::vector<Output> host = run(true, &host_stats);
  const std::vector<Output> backend = run(false, &backend_stats);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(backend[i].samples, host[i].samples) << "request " << i;
    EXPECT_EQ(backend[i].finish, host[i].finish) << "request " << i;
  }
  for (size_t i = 3; i < 6; ++i) EXPECT_EQ(host[i].finish, FinishReason::kStop) << "request " << i;
  EXPECT_NE(host[4].samples[0], host[4].samples[1]);  // the two samples draw different streams
  EXPECT_GT(host_stats.masked_rows_host, 0);
  EXPECT_EQ(host_stats.masked_rows_bits + host_stats.masked_rows_edits, 0);
  EXPECT_EQ(backend_stats.masked_rows_host, 0);
  EXPECT_GT(backend_stats.masked_rows_bits, 0);
  EXPECT_GT(backend_stats.masked_rows_edits, 0);
  // Every constrained token took a masked row, or (without logprobs) was forced: the same
  // tokens either way.
  EXPECT_EQ(host_stats.forced_tokens, 0);
  EXPECT_EQ(backend_stats.masked_rows_bits + backend_stats.masked_rows_edits +
                backend_stats.forced_tokens,
            host_stats.masked_rows_host);
}

TEST(EngineTest, BackendTokenMasksEqualTheHostSampler) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  CheckBackendTokenMasks(dir, DeviceKind::kCpu, /*solo=*/false);
}

// The same on a GPU: the token-mask kernel (uploaded bits) before ArgmaxRows / SampleRows, in
// decode steps replayed from graphs, against the host sampler over the GPU's own logits. One
// request at a time, as CudaBackendLogitsProcessorsEqualTheHostSampler.
TEST(EngineTest, CudaBackendTokenMasksEqualTheHostSampler) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CheckBackendTokenMasks(dir, DeviceKind::kCuda, /*solo=*/true);
}

TEST(EngineTest, PreemptionUnderTinyKvCacheKeepsOutputsCorrect) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests = MakeRequests(64, 2048, 5);
  std::vector<std::vector<int32_t>> solo = RunSolo(dir, requests);
  auto model = LoadModel(dir);
  EngineConfig config;
  config.max_running = 64;
  // Room for ~6 blocks of 16 tokens: far below 64 concurrent sequences.
  config.kv_cache_bytes = model->KvBytesPerToken() * 16 * 6;
  auto engine = Engine::Create(model.get(), config);
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests) streams.push_back(SubmitOrDie(**engine, r));
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(Collect(streams[i]).samples[0], solo[i]) << "request " << i;
  (*engine)->Shutdown(true);  // publishes the final stats
  EngineStats stats = (*engine)->Stats();
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.num_running, 0);
}

// Overlapped steps (EngineConfig::overlap_steps: a step launched before the previous step's
// tokens are read, its decode rows fed those tokens where they were made) change nothing a client
// sees: greedy and seeded sampled requests, ones that end early on a stop id (their wasted row in
// the next step is dropped), n = 2, and requests whose steps cannot overlap (penalties,
// min_tokens, logprobs), with room for every sequence and under preemption, give the same tokens,
// finish reasons and usage with and without, and free every KV block; with it on steps did
// overlap.
void CheckOverlappedSteps(const std::string& dir, DeviceKind device) {
  std::vector<GenerationRequest> requests = MakeRequests(24, 2048, 17);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams& s = requests[i].sampling;
    requests[i].max_tokens = 6 + static_cast<int32_t>(i % 9);
    s.seed = 500 + i;
    if (i % 4 == 1) {
      s.temperature = 0.8f;
      s.top_p = 0.9f;
    }
    if (i == 3 || i == 15) {
      requests[i].n = 2;
      s.temperature = 1.0f;
    }
    if (i == 6) s.repetition_penalty = 1.2f;
    if (i == 10) s.top_logprobs = 2;
  }
  struct Run {
    std::vector<Output> outputs;
    EngineStats stats;
  };
  auto run = [&](bool overlap, bool tiny_kv) {
    auto model = LoadModel(dir, device);
    EngineConfig config;
    config.max_running = 16;
    config.max_step_tokens = 48;
    config.overlap_steps = overlap;
    config.backend_sampling = EngineConfig::BackendSampling::kAlways;
    if (tiny_kv) config.kv_cache_bytes = model->KvBytesPerToken() * 16 * 8;
    auto engine = Engine::Create(model.get(), config);
    EXPECT_TRUE(engine.ok()) << engine.message();
    std::vector<std::shared_ptr<ResponseStream>> streams;
    for (const GenerationRequest& r : requests) streams.push_back(SubmitOrDie(**engine, r));
    Run result;
    for (auto& stream : streams) result.outputs.push_back(Collect(stream));
    (*engine)->Shutdown(true);
    result.stats = (*engine)->Stats();
    EXPECT_EQ(result.stats.kv_blocks_used, 0);
    EXPECT_EQ(result.stats.num_running, 0);
    return result;
  };
  // Stop ids from a first run: request i stops at its third token (min_tokens 4 for one of them
  // masks it at first).
  const Run first = run(false, false);
  for (size_t i = 0; i < requests.size(); i += 5) {
    ASSERT_GE(first.outputs[i].samples[0].size(), 3u) << "request " << i;
    requests[i].stop_token_ids = {first.outputs[i].samples[0][2]};
  }
  requests[5].sampling.min_tokens = 4;
  for (bool tiny_kv : {false, true}) {
    const Run plain = run(false, tiny_kv);
    const Run overlapped = run(true, tiny_kv);
    EXPECT_EQ(plain.stats.overlapped_steps, 0);
    EXPECT_GT(overlapped.stats.overlapped_steps, 0);
    if (tiny_kv) {
      EXPECT_GT(overlapped.stats.preemptions, 0);
    }
    int stopped = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const Output& a = plain.outputs[i];
      const Output& b = overlapped.outputs[i];
      EXPECT_EQ(a.samples, b.samples) << "request " << i << (tiny_kv ? " (tiny KV)" : "");
      EXPECT_EQ(a.finish, b.finish) << "request " << i;
      EXPECT_EQ(a.usage.completion_tokens, b.usage.completion_tokens) << "request " << i;
      stopped += b.finish == FinishReason::kStop;
    }
    EXPECT_GE(stopped, 3);  // the stop ids did end requests early
  }
}

TEST(EngineTest, OverlappedStepsChangeNoToken) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  CheckOverlappedSteps(dir, DeviceKind::kCpu);
}

// The same on a GPU (bf16, batch-invariant GEMM: batching may differ between the runs).
TEST(EngineTest, CudaOverlappedStepsChangeNoToken) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CheckOverlappedSteps(dir, DeviceKind::kCuda);
}

TEST(EngineTest, DefaultKvCacheFollowsTheMemoryBudget) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  auto mem = model->MemoryInfo();
  ASSERT_TRUE(mem.ok()) << mem.message();
  EXPECT_FALSE(mem->device);
  EXPECT_GT(mem->total_bytes, 0);
  EXPECT_GT(mem->free_bytes, 0);
  EXPECT_LE(mem->free_bytes, mem->total_bytes);
  EngineConfig config;
  auto bytes = DefaultKvCacheBytes(*model, config);
  ASSERT_TRUE(bytes.ok()) << bytes.message();
  const int64_t full = int64_t{config.max_running} * model->config().max_position_embeddings *
                       model->KvBytesPerToken();
  EXPECT_EQ(*bytes, std::min({full, int64_t{4} << 30, mem->free_bytes / 2}));
  config.gpu_memory_fraction = 1.5;
  auto bad = Engine::Create(model.get(), config);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--gpu-memory-fraction"), std::string::npos) << bad.message();
}

// A config whose two limits are left to the device (ResolveEngineLimits).
EngineConfig AutoLimits() {
  EngineConfig config;
  config.max_running = 0;
  config.max_step_tokens = 0;
  return config;
}

// An engine whose limits are the device's defaults serves a request.
void ExpectDefaultLimitsServe(Model& model) {
  auto engine = Engine::Create(&model, AutoLimits());
  ASSERT_TRUE(engine.ok()) << engine.message();
  Output out = Collect(SubmitOrDie(**engine, Greedy({1, 80, 147}, 5)));
  EXPECT_EQ(out.usage.completion_tokens, 5);
}

// Limits left at 0 take the device's defaults; negative ones are errors naming their flag.
TEST(EngineTest, DeviceDefaultLimitsOnTheCpu) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  EngineConfig config = AutoLimits();
  auto resolved = ResolveEngineLimits(*model, config);
  ASSERT_TRUE(resolved.ok()) << resolved.message();
  EXPECT_EQ(resolved->max_running, 64);
  EXPECT_EQ(resolved->max_step_tokens, 512);
  EXPECT_EQ(resolved->speculation.max_batch, SpeculationConfig::kCpuSpecMaxBatch);
  config.max_running = 3;
  config.max_step_tokens = 100;
  resolved = ResolveEngineLimits(*model, config);
  ASSERT_TRUE(resolved.ok()) << resolved.message();
  EXPECT_EQ(resolved->max_running, 3);
  EXPECT_EQ(resolved->max_step_tokens, 100);
  config.max_running = -1;
  resolved = ResolveEngineLimits(*model, config);
  ASSERT_FALSE(resolved.ok());
  EXPECT_NE(resolved.message().find("--max-batch"), std::string::npos) << resolved.message();
  config.max_running = 0;
  config.max_step_tokens = -5;
  auto bad = Engine::Create(model.get(), config);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--max-step-tokens"), std::string::npos) << bad.message();
  config.max_step_tokens = 0;
  config.speculation.method = SpeculationConfig::Method::kNgram;
  config.speculation.max_batch = -1;
  bad = Engine::Create(model.get(), config);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--spec-max-batch"), std::string::npos) << bad.message();
  ExpectDefaultLimitsServe(*model);
}

// A GPU's default step: 8,192 tokens, halved while its workspace exceeds the given bytes.
TEST(EngineTest, GpuStepTokensHalveToFitTheBudget) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  EngineConfig config;
  config.max_running = 256;
  auto workspace = [&](int32_t tokens) {
    EngineConfig c = config;
    c.max_step_tokens = tokens;
    return StepWorkspaceBytes(*model, c);
  };
  EXPECT_EQ(GpuStepTokens(*model, config, int64_t{1} << 50), 8192);
  EXPECT_EQ(GpuStepTokens(*model, config, workspace(8192)), 8192);
  EXPECT_EQ(GpuStepTokens(*model, config, workspace(8192) - 1), 4096);
  EXPECT_EQ(GpuStepTokens(*model, config, workspace(2048)), 2048);
  EXPECT_EQ(GpuStepTokens(*model, config, workspace(1024) - 1), 512);
  EXPECT_EQ(GpuStepTokens(*model, config, 0), 512);
}

// On a GPU: 256 sequences and the largest step whose workspace fits a quarter of what is left.
TEST(EngineTest, CudaDefaultLimits) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  auto model = LoadModel(dir, DeviceKind::kCuda);
  const EngineConfig config = AutoLimits();
  auto resolved = ResolveEngineLimits(*model, config);
  ASSERT_TRUE(resolved.ok()) << resolved.message();
  EXPECT_EQ(resolved->max_running, 256);
  auto mem = model->MemoryInfo();
  ASSERT_TRUE(mem.ok() && mem->device);
  const int64_t left =
      static_cast<int64_t>(config.gpu_memory_fraction * static_cast<double>(mem->total_bytes)) -
      (mem->total_bytes - mem->free_bytes);
  EXPECT_EQ(resolved->max_step_tokens, GpuStepTokens(*model, *resolved, left / 4));
  ExpectDefaultLimitsServe(*model);
}

TEST(EngineTest, CancelFreesBlocksAndRejectsImpossibleRequests) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok());
  auto stream = SubmitOrDie(**engine, Greedy({1, 80, 147}, 500));
  std::vector<TokenEvent> events;
  ASSERT_TRUE(stream->Next(&events));
  stream->Cancel();
  Output rest = Collect(stream);
  EXPECT_EQ(rest.finish, FinishReason::kCancelled);
  EXPECT_LT(rest.usage.completion_tokens, 500);
  (*engine)->Shutdown(true);
  EXPECT_EQ((*engine)->Stats().kv_blocks_used, 0);

  auto model2 = LoadModel(dir);
  auto engine2 = Engine::Create(model2.get(), EngineConfig{});
  auto refused = (*engine2)->Submit(Greedy(std::vector<int32_t>(500, 5), 100));
  ASSERT_TRUE(std::holds_alternative<SubmitError>(refused));
  const SubmitError& error = std::get<SubmitError>(refused);
  EXPECT_EQ(error.param, "max_tokens");
  EXPECT_NE(error.message.find("512"), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("600"), std::string::npos) << error.message;
  auto bad_id = (*engine2)->Submit(Greedy({1, 999999}, 4));
  ASSERT_TRUE(std::holds_alternative<SubmitError>(bad_id));
}

// ---- LoRA adapters (issue 44): the engine resolves a request's adapter by name, gives it a
// slot of the model's LoraSet for its life, and namespaces its prefix-cache blocks by adapter ----

std::string AdapterFixture(const std::string& name) {
  return testing::FixturesDir() + "/adapters/" + name;
}

// An engine on `model` with LoRA on (max_loras slots) and llama3-a / llama3-b registered as a, b.
std::unique_ptr<Engine> LoraEngine(Model* model, int32_t max_loras, bool prefix_cache = true,
                                   bool speculate = false) {
  EngineConfig config;
  if (speculate) {
    config.speculation.method = SpeculationConfig::Method::kNgram;
    config.speculation.num_spec_tokens = 4;
  }
  config.max_loras = max_loras;
  config.enable_prefix_caching = prefix_cache;
  auto engine = Engine::Create(model, config);
  EXPECT_TRUE(engine.ok()) << engine.message();
  if (!engine.ok()) return nullptr;
  for (const char* name : {"a", "b"}) {
    auto info = (*engine)->adapters()->Register(name, AdapterFixture(std::string("llama3-") + name));
    EXPECT_TRUE(info.ok()) << info.message();
  }
  return std::move(engine).value();
}

GenerationRequest WithAdapter(GenerationRequest r, const std::string& adapter) {
  r.adapter = adapter;
  return r;
}

// Base and adapter requests in one batch (decode steps padded to the graph buckets, overlapped)
// each give their solo run's tokens; on the CPU the adapters' greedy goldens too (CUDA's bf16
// goldens are lora_test's CudaLoraParity, with the bf16 margin rule).
void CheckLoraEngine(DeviceKind device) {
  EMBER_REQUIRE_DIR(AdapterFixture("llama3-b"));
  auto model = LoadModel(ModelDir("llama3"), device);
  ASSERT_NE(model, nullptr);
  auto engine = LoraEngine(model.get(), 2, /*prefix_cache=*/false);
  ASSERT_NE(engine, nullptr);
  const std::vector<std::string> adapters = {"a", "none", "b", "a", "", "b"};
  std::vector<std::vector<int32_t>> solo;
  for (const std::string name : {"a", "b"}) {
    if (device != DeviceKind::kCpu) break;
    const json golden = json::parse(*ReadFileToString(AdapterFixture("llama3-" + name) +
                                                      "/golden.json"));
    const auto prompt = golden["sequences"]["short"].get<std::vector<int32_t>>();
    const auto want = golden["greedy"]["short"].get<std::vector<int32_t>>();
    Output out = Collect(SubmitOrDie(*engine, WithAdapter(
                                                   Greedy(prompt, static_cast<int32_t>(want.size())), name)));
    EXPECT_EQ(out.samples[0], want) << "adapter " << name;
  }
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 42, 8, 511, 99, 250, 3, 77, 128};
  for (const std::string& name : adapters)
    solo.push_back(Collect(SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 16), name))).samples[0]);
  EXPECT_NE(solo[0], solo[1]);  // the adapter changes the output (the test can fail)
  EXPECT_EQ(solo[1], solo[4]);  // "none" is the base model
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const std::string& name : adapters)
    streams.push_back(SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 16), name)));
  for (size_t i = 0; i < streams.size(); ++i)
    EXPECT_EQ(Collect(streams[i]).samples[0], solo[i]) << "request " << i << " " << adapters[i];
  // An unknown adapter is refused by name.
  auto refused = engine->Submit(WithAdapter(Greedy(prompt, 4), "nope"));
  ASSERT_TRUE(std::holds_alternative<SubmitError>(refused));
  EXPECT_NE(std::get<SubmitError>(refused).message.find("\"nope\""), std::string::npos);
  EXPECT_EQ(std::get<SubmitError>(refused).param, "adapter");
}

TEST(EngineLoraTest, GreedyMatchesTheGoldenAndAMixedBatchEqualsSoloRuns) {
  CheckLoraEngine(DeviceKind::kCpu);
}

TEST(EngineLoraTest, CudaMixedBatchEqualsSoloRuns) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CheckLoraEngine(DeviceKind::kCuda);
}

TEST(EngineLoraTest, PrefixCacheBlocksAreNamespacedByAdapter) {
  EMBER_REQUIRE_DIR(AdapterFixture("llama3-b"));
  auto model = LoadModel(ModelDir("llama3"));
  ASSERT_NE(model, nullptr);
  auto engine = LoraEngine(model.get(), 2);
  ASSERT_NE(engine, nullptr);
  std::vector<int32_t> prompt(40);
  for (int32_t i = 0; i < 40; ++i) prompt[static_cast<size_t>(i)] = 3 + (i * 37) % 500;
  auto cached = [&](const std::string& adapter) {
    return Collect(SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 2), adapter)))
        .usage.cached_tokens;
  };
  EXPECT_EQ(cached("a"), 0);
  EXPECT_EQ(cached("b"), 0);   // same prompt, other adapter: no shared block
  EXPECT_EQ(cached(""), 0);    // nor the base model
  EXPECT_EQ(cached("a"), 32);  // same adapter: two full blocks
  EXPECT_EQ(cached("none"), 32);
}

TEST(EngineLoraTest, RequestsWaitForASlotWhenEveryOneIsHeld) {
  EMBER_REQUIRE_DIR(AdapterFixture("llama3-b"));
  auto model = LoadModel(ModelDir("llama3"));
  ASSERT_NE(model, nullptr);
  auto engine = LoraEngine(model.get(), 1, /*prefix_cache=*/false);  // one slot for a and b
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt = {1, 14, 51, 88, 125, 162};
  const auto solo_a = Collect(SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 12), "a"))).samples;
  const auto solo_b = Collect(SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 12), "b"))).samples;
  auto sa = SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 12), "a"));
  auto sb = SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 12), "b"));
  auto sa2 = SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 12), "a"));
  EXPECT_EQ(Collect(sa).samples, solo_a);
  EXPECT_EQ(Collect(sb).samples, solo_b);
  EXPECT_EQ(Collect(sa2).samples, solo_a);
  EXPECT_GE(model->lora()->evictions(), 2);
  // Unloading keeps submitted requests running and refuses new ones.
  auto pending = SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 12), "b"));
  ASSERT_TRUE(engine->adapters()->Unregister("b").ok());
  EXPECT_EQ(Collect(pending).samples, solo_b);
  EXPECT_TRUE(std::holds_alternative<SubmitError>(engine->Submit(WithAdapter(Greedy(prompt, 2), "b"))));
}

TEST(EngineLoraTest, SpeculativeDecodingVerifiesDraftsUnderTheAdapter) {
  EMBER_REQUIRE_DIR(AdapterFixture("llama3-b"));
  auto model = LoadModel(ModelDir("llama3"));
  ASSERT_NE(model, nullptr);
  // A copy-heavy prompt: prompt lookup finds drafts; verified rows carry the adapter too.
  std::vector<int32_t> prompt;
  for (int32_t r = 0; r < 4; ++r)
    for (int32_t t : {1, 14, 51, 88, 125, 162, 199, 236}) prompt.push_back(t);
  std::vector<std::vector<int32_t>> plain;
  {
    auto engine = LoraEngine(model.get(), 2, false);
    ASSERT_NE(engine, nullptr);
    for (const char* name : {"a", "b", "none"})
      plain.push_back(Collect(SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 24), name))).samples[0]);
  }
  auto spec_model = LoadModel(ModelDir("llama3"));  // (a model's KV pool is allocated once)
  ASSERT_NE(spec_model, nullptr);
  auto engine = LoraEngine(spec_model.get(), 2, false, /*speculate=*/true);
  ASSERT_NE(engine, nullptr);
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const char* name : {"a", "b", "none"})
    streams.push_back(SubmitOrDie(*engine, WithAdapter(Greedy(prompt, 24), name)));
  for (size_t i = 0; i < streams.size(); ++i) EXPECT_EQ(Collect(streams[i]).samples[0], plain[i]) << i;
  EXPECT_GT(engine->Stats().spec_draft_tokens, 0);
}

}  // namespace
}  // namespace ember
