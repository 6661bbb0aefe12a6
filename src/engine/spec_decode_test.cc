// Speculative decoding in the engine on real checkpoints (CPU backend; one test on a GPU where
// present: `--batch-invariant auto`'s per-step invariance keeps the tokens): outputs are token-identical
// with and without it — greedy against the reference goldens of every fixture model, solo and in
// a mixed batch (speculating and non-speculating requests, staggered, chunked prefill); seeded
// sampled requests with every logits processor (penalties, logit_bias, min_tokens, logprobs, n)
// and constrained requests likewise; drafts that are mostly wrong leave no KV block behind, even
// under preemption; usage counts the drafts of a speculating request and nothing otherwise. The
// draft-model source (ModelDraftSource) likewise: a model drafting for itself (greedy: every draft
// kept), another model of the same vocabulary (mostly rejected), seeded sampling with n > 1, and
// preemption with both KV pools small. The mtp source (a deepseek_v3 checkpoint's multi-token-
// prediction module, on temporary checkpoints from mtp_testing.h): random module weights leave
// greedy outputs unchanged, batched and solo; a module built to predict what the target predicts
// has its drafts kept.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cuda_loader.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/model_draft_source.h"
#include "engine/replay_draft_source.h"
#include "model/mtp_testing.h"
#include "util/testing.h"

namespace ember {
namespace {

using testing::Greedy;
using testing::ModelDir;
using testing::StrideConstraint;

struct SampleOut {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason finish = FinishReason::kNone;
  bool operator==(const SampleOut& o) const {
    if (ids != o.ids || logprobs != o.logprobs || finish != o.finish || top.size() != o.top.size())
      return false;
    for (size_t i = 0; i < top.size(); ++i) {
      if (top[i].size() != o.top[i].size()) return false;
      for (size_t j = 0; j < top[i].size(); ++j)
        if (top[i][j].token_id != o.top[i][j].token_id || top[i][j].logprob != o.top[i][j].logprob)
          return false;
    }
    return true;
  }
};

struct RunResult {
  std::vector<std::vector<SampleOut>> outputs;  // per request, per sample
  std::vector<RequestUsage> usage;
  EngineStats stats;
};

// The target's own outputs of `reference` as replay drafts, every `error_every`-th proposed token
// wrong.
std::unique_ptr<DraftSource> Replay(const std::vector<GenerationRequest>& requests,
                                    const RunResult& reference, int32_t error_every,
                                    int32_t vocab) {
  std::vector<ReplayDraftSource::Run> runs;
  for (size_t i = 0; i < requests.size(); ++i)
    for (const SampleOut& s : reference.outputs[i]) runs.push_back({requests[i].prompt_ids, s.ids});
  return std::make_unique<ReplayDraftSource>(std::move(runs), vocab,
                                             ReplayDraftSource::Errors{error_every, 1.0});
}

// Proposes random tokens: almost every draft is rejected.
class NoiseDraftSource : public DraftSource {
 public:
  explicit NoiseDraftSource(int32_t vocab) : vocab_(vocab) {}
  std::string name() const override { return "noise"; }
  void Propose(kv::SeqId, std::span<const int32_t>, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    out->clear();
    for (int32_t i = 0; i < max_tokens; ++i)
      out->push_back(static_cast<int32_t>(rng_() % static_cast<uint32_t>(vocab_)));
  }

 private:
  int32_t vocab_;
  std::mt19937 rng_{17};
};

struct RunOptions {
  int32_t max_running = 16;
  int32_t max_step_tokens = 0;  // 0: the default
  int64_t kv_cache_bytes = 0;
  bool stagger = false;
  bool solo = false;  // one request at a time
  bool jump_forward = true;  // EngineConfig::jump_forward
  int32_t state_checkpoint_interval = 0;  // 0: the default (a hybrid model's checkpoints)
  int64_t state_checkpoint_bytes = -1;    // -1: auto
  SpeculationConfig::Method method = SpeculationConfig::Method::kNone;
  std::unique_ptr<DraftSource> source;  // replaces `method`'s when set
  ModelLoadOptions load;                // the device, and CUDA's batch-invariant option
  bool invariant_steps = false;         // SpeculationConfig::invariant_steps (`auto`)
};

RunResult RunEngine(const std::string& dir, const std::vector<GenerationRequest>& requests,
              RunOptions options) {
  RunResult result;
  auto model = Model::Load(dir, options.load);
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return result;
  EngineConfig config;
  config.max_running = options.max_running;
  config.max_step_tokens = options.max_step_tokens;
  config.kv_cache_bytes = options.kv_cache_bytes;
  config.jump_forward = options.jump_forward;
  config.speculation.method = options.method;
  if (options.state_checkpoint_interval > 0)
    config.state_checkpoint_interval = options.state_checkpoint_interval;
  config.state_checkpoint_bytes = options.state_checkpoint_bytes;
  config.speculation.num_spec_tokens = 4;
  config.speculation.max_batch = 64;
  config.speculation.invariant_steps = options.invariant_steps;
  if (options.source != nullptr) config.speculation.method = SpeculationConfig::Method::kNgram;
  auto engine = Engine::Create(model->get(), config, std::move(options.source));
  EXPECT_TRUE(engine.ok()) << engine.message();
  if (!engine.ok()) return result;
  auto collect = [&](const std::shared_ptr<ResponseStream>& stream) {
    std::vector<SampleOut> samples(static_cast<size_t>(stream->num_samples()));
    std::vector<TokenEvent> events;
    while (stream->Next(&events)) {
      for (const TokenEvent& e : events) {
        SampleOut& s = samples[static_cast<size_t>(e.sample_index)];
        if (e.token_id >= 0) {
          s.ids.push_back(e.token_id);
          s.logprobs.push_back(e.logprob);
          s.top.push_back(e.top_logprobs);
        }
        if (e.finish != FinishReason::kNone) s.finish = e.finish;
      }
      events.clear();
    }
    result.outputs.push_back(std::move(samples));
    result.usage.push_back(stream->usage());
  };
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto submitted = (*engine)->Submit(requests[i]);
    if (auto* error = std::get_if<SubmitError>(&submitted)) {
      ADD_FAILURE() << "submit refused: " << error->message;
      return result;
    }
    streams.push_back(std::get<std::shared_ptr<ResponseStream>>(submitted));
    if (options.solo) collect(streams.back());
    if (options.stagger && i % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!options.solo)
    for (auto& s : streams) collect(s);
  (*engine)->Shutdown(true);
  result.stats = (*engine)->Stats();
  EXPECT_EQ(result.stats.kv_blocks_used, 0) << "blocks leaked";
  return result;
}

// The golden prompts of a fixture model and their reference greedy continuations.
void GoldenRequests(const std::string& dir, std::vector<GenerationRequest>* requests,
                    std::vector<std::vector<int32_t>>* expected) {
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  if (golden.contains("prompts")) {  // tinystories-656k
    for (const auto& p : golden["prompts"]) {
      expected->push_back(p["greedy_ids"].get<std::vector<int32_t>>());
      requests->push_back(Greedy(p["ids"].get<std::vector<int32_t>>(),
                                 static_cast<int32_t>(expected->back().size())));
    }
    return;
  }
  for (const auto& [name, ids] : golden["sequences"].items()) {
    if (!golden["greedy"].contains(name)) continue;  // a sequence with logits goldens only
    expected->push_back(golden["greedy"][name].get<std::vector<int32_t>>());
    requests->push_back(Greedy(ids.get<std::vector<int32_t>>(),
                               static_cast<int32_t>(expected->back().size())));
  }
}

std::vector<std::vector<int32_t>> FirstSamples(const RunResult& r) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& samples : r.outputs) out.push_back(samples.empty() ? std::vector<int32_t>{} : samples[0].ids);
  return out;
}

class SpecGreedyTest : public ::testing::TestWithParam<std::string> {};

// The reference greedy continuations with ngram drafts (solo), and with replayed drafts (one in
// three wrong) in a staggered batch with chunked prefill where every other request does not
// speculate and unrelated requests run beside them.
TEST_P(SpecGreedyTest, GoldenContinuationsWithDraftsSoloAndBatched) {
  const std::string dir = ModelDir(GetParam());
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  GoldenRequests(dir, &requests, &expected);
  RunOptions ngram;
  ngram.solo = true;
  ngram.method = SpeculationConfig::Method::kNgram;
  const RunResult solo = RunEngine(dir, requests, std::move(ngram));
  EXPECT_EQ(FirstSamples(solo), expected);
  EXPECT_GT(solo.stats.spec_draft_tokens, 0) << "ngram proposed nothing: the test tests nothing";

  // The batch: the golden requests twice (speculating, then not) and unrelated prompts.
  const size_t num_golden = requests.size();
  std::vector<GenerationRequest> batch = requests;
  for (size_t i = 0; i < num_golden; ++i) {
    batch.push_back(requests[i]);
    batch.back().speculate = false;
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 30);
    for (int32_t& t : prompt) t = 1 + static_cast<int32_t>(rng() % 200);
    batch.push_back(Greedy(prompt, 6 + static_cast<int32_t>(rng() % 10)));
  }
  RunOptions plain_options;
  plain_options.solo = true;
  const RunResult plain = RunEngine(dir, batch, std::move(plain_options));
  RunOptions replay;
  replay.max_step_tokens = 13;
  replay.stagger = true;
  auto probe = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(probe.ok());
  replay.source = Replay(batch, plain, 3, (*probe)->config().vocab_size);
  const RunResult batched = RunEngine(dir, batch, std::move(replay));
  const auto got = FirstSamples(batched);
  ASSERT_EQ(got.size(), batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(got[i], i < 2 * num_golden ? expected[i % num_golden] : FirstSamples(plain)[i])
        << "request " << i;
  }
  EXPECT_GT(batched.stats.spec_accepted_tokens, 0);
  EXPECT_GT(batched.stats.spec_draft_tokens, batched.stats.spec_accepted_tokens);
  for (size_t i = 0; i < batch.size(); ++i)
    EXPECT_EQ(batched.usage[i].speculative, batch[i].speculate) << "request " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpecGreedyTest,
                         ::testing::Values("tinystories-656k", "llama3", "qwen2", "qwen3",
                                           "qwen3_moe", "gpt_oss", "mistral", "phi3", "gemma2",
                                           "gemma3", "qwen3_next"));

// On a GPU in the bf16 mode, as `--batch-invariant auto` serves with speculation: the backend's
// default products, and batch-invariant steps wherever drafting may run (BatchPlan::
// batch_invariant). A staggered, chunked batch of speculating (replayed drafts, one in three
// wrong) and non-speculating requests gives the tokens that `--batch-invariant on` without
// speculation gives each request alone.
class CudaSpecGreedyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSpecGreedyTest, AutoInvarianceKeepsUnspeculatedTokens) {
  const std::string dir = ModelDir(GetParam());
  EMBER_REQUIRE_DIR(dir);
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> golden;
  GoldenRequests(dir, &requests, &golden);
  const size_t num_golden = requests.size();
  for (size_t i = 0; i < num_golden; ++i) {
    requests.push_back(requests[i]);
    requests.back().speculate = false;
  }
  RunOptions on;  // --batch-invariant on, no speculation, one request at a time
  on.solo = true;
  on.load.device = DeviceKind::kCuda;
  on.load.cuda_batch_invariant = true;
  const RunResult reference = RunEngine(dir, requests, std::move(on));
  RunOptions autos;
  autos.load.device = DeviceKind::kCuda;
  autos.invariant_steps = true;
  autos.max_step_tokens = 13;
  autos.stagger = true;
  auto probe = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(probe.ok()) << probe.message();
  autos.source = Replay(requests, reference, 3, (*probe)->config().vocab_size);
  const RunResult batched = RunEngine(dir, requests, std::move(autos));
  EXPECT_EQ(FirstSamples(batched), FirstSamples(reference));
  EXPECT_GT(batched.stats.spec_accepted_tokens, 0);
  EXPECT_GT(batched.stats.spec_draft_tokens, batched.stats.spec_accepted_tokens);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaSpecGreedyTest,
                         ::testing::Values("tinystories-656k", "llama3", "qwen3", "qwen3_moe",
                                           "gemma2", "deepseek_v3", "qwen3_next"));

std::vector<GenerationRequest> SampledRequests() {
  std::vector<GenerationRequest> requests;
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 80, 147, 201, 282, 57}, {1, 300, 301, 302, 300, 301, 302, 300}, {1, 45, 9, 77}};
  for (int i = 0; i < 9; ++i) {
    GenerationRequest r = Greedy(prompts[static_cast<size_t>(i) % prompts.size()], 40);
    SamplingParams& s = r.sampling;
    s.temperature = 0.5f + 0.15f * static_cast<float>(i % 4);
    s.seed = 100 + static_cast<uint64_t>(i);
    if (i % 3 == 1) s.top_k = 20;
    if (i % 3 == 2) s.top_p = 0.9f;
    if (i == 3) s.min_p = 0.05f;
    if (i == 4) s.repetition_penalty = 1.3f;
    if (i == 5) s.frequency_penalty = 0.5f, s.presence_penalty = 0.3f;
    if (i == 6) s.logit_bias = {{300, 3.0f}, {57, -2.0f}};
    if (i == 7) {
      s.min_tokens = 30;
      r.ignore_eos = false;
    }
    if (i == 8) s.top_logprobs = 3, r.n = 2;
    requests.push_back(r);
  }
  requests.push_back(Greedy({1, 80, 147}, 30));
  requests.back().sampling.repetition_penalty = 1.2f;  // greedy with a processor
  // llama.cpp's samplers: DRY reads the history (row j must see tokens 0..j-1), XTC's trigger is
  // per position, typical_p / top_n_sigma sample on the host.
  GenerationRequest dry = Greedy({1, 300, 301, 302, 300, 301, 302, 300}, 40);
  dry.sampling.temperature = 0.8f;
  dry.sampling.seed = 7;
  dry.sampling.dry_multiplier = 0.8f;
  dry.sampling.dry_allowed_length = 1;
  dry.sampling.dry_breaker_ids =
      std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{57});
  requests.push_back(dry);
  dry.sampling.temperature = 0.0f;  // greedy with DRY
  requests.push_back(dry);
  GenerationRequest filters = Greedy({1, 80, 147, 201, 282, 57}, 40);
  filters.sampling.temperature = 1.0f;
  filters.sampling.seed = 11;
  filters.sampling.xtc_probability = 0.5f;
  filters.sampling.xtc_threshold = 0.05f;
  filters.sampling.typical_p = 0.9f;
  requests.push_back(filters);
  filters.sampling.xtc_probability = 0.0f;
  filters.sampling.typical_p = 1.0f;
  filters.sampling.top_n_sigma = 1.0f;
  requests.push_back(filters);
  return requests;
}

// Seeded sampled requests draw the same tokens (and logprobs) with drafts as without: each
// verified row is sampled with the state ordinary decoding has at that position, including its
// uniform. Drafts replay the outputs with one in `error_every` wrong, so rows are kept and
// rejected. Returns the plain (no speculation) run.
RunResult ExpectSeededReplaysMatch(const std::string& dir, int32_t vocab,
                                   std::initializer_list<int32_t> error_rates) {
  const std::vector<GenerationRequest> requests = SampledRequests();
  RunOptions plain_options;
  plain_options.max_running = 4;
  RunResult plain = RunEngine(dir, requests, std::move(plain_options));
  for (int32_t error_every : error_rates) {
    RunOptions spec;
    spec.max_running = 4;
    spec.source = Replay(requests, plain, error_every, vocab);
    const RunResult got = RunEngine(dir, requests, std::move(spec));
    EXPECT_EQ(got.outputs.size(), plain.outputs.size());
    for (size_t i = 0; i < requests.size() && i < got.outputs.size(); ++i)
      EXPECT_TRUE(got.outputs[i] == plain.outputs[i]) << "request " << i << " errors " << error_every;
    EXPECT_GT(got.stats.spec_accepted_tokens, 0);
    EXPECT_GT(got.stats.spec_draft_tokens, got.stats.spec_accepted_tokens);
    // More than one token per target step on average: the drafts paid.
    EXPECT_GT(got.stats.sampled_tokens, got.stats.sampled_seq_steps);
  }
  return plain;
}

TEST(SpecDecodeTest, SeededSampledOutputsAreIdenticalWithEveryProcessor) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  ExpectSeededReplaysMatch(dir, 2048, {2, 5});
}

// A hybrid model (qwen3_next: gated DeltaNet layers whose recurrent state advances past every
// verified row): rejected drafts are rolled back from the per-row state snapshots, so greedy
// outputs are the plain ones, with ngram drafts on copy-heavy prompts (the random-weight fixture
// never copies them, so every ngram draft is rejected) solo and batched, and with replayed drafts
// (one in three wrong: kept and rejected) batched with n = 2; all with the prefix cache on:
// state checkpoints taken every block, also while decoding (never on a step that verifies
// drafts), and later requests whose prompts are earlier ones plus part of their outputs hit them
// and still get the plain tokens.
TEST(SpecDecodeTest, HybridModelRollsBackRejectedDrafts) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  auto probe = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(probe.ok());
  const int64_t per_state = (*probe)->StateBytesPerSequence();
  std::vector<GenerationRequest> requests;
  const std::vector<std::vector<int32_t>> motifs = {
      {11, 12, 13, 14, 15}, {200, 201, 202}, {40, 41, 42, 43, 44, 45, 46}, {7, 300, 7, 301}};
  for (size_t i = 0; i < motifs.size(); ++i) {
    std::vector<int32_t> prompt = {1};
    for (int rep = 0; rep < 5; ++rep)
      prompt.insert(prompt.end(), motifs[i].begin(), motifs[i].end());
    prompt.push_back(90 + static_cast<int32_t>(i));
    requests.push_back(Greedy(prompt, 48));
  }
  requests.push_back(requests[1]);
  requests.back().n = 2;
  auto options = [&](bool solo) {
    RunOptions o;
    o.solo = solo;
    o.max_step_tokens = solo ? 0 : 13;
    o.state_checkpoint_interval = 16;
    o.state_checkpoint_bytes = 32 * per_state;
    return o;
  };
  const RunResult first = RunEngine(dir, requests, options(true));
  ASSERT_EQ(first.outputs.size(), requests.size());
  // Prompts that extend earlier requests by part of their output: prefix hits past a prompt.
  for (size_t i = 0; i < 2; ++i) {
    GenerationRequest more = requests[i];
    const std::vector<int32_t>& out = first.outputs[i][0].ids;
    more.prompt_ids.insert(more.prompt_ids.end(), out.begin(), out.begin() + 30);
    more.max_tokens = 24;
    requests.push_back(more);
  }
  const RunResult plain = RunEngine(dir, requests, options(true));
  auto expect_plain = [&](const RunResult& got, const std::string& what) {
    ASSERT_EQ(got.outputs.size(), requests.size()) << what;
    for (size_t i = 0; i < requests.size(); ++i)
      EXPECT_TRUE(got.outputs[i] == plain.outputs[i]) << "request " << i << ", " << what;
    EXPECT_GT(got.stats.spec_draft_tokens, got.stats.spec_accepted_tokens) << what;
  };
  for (bool solo : {true, false}) {
    RunOptions ngram = options(solo);
    ngram.method = SpeculationConfig::Method::kNgram;
    const RunResult got = RunEngine(dir, requests, std::move(ngram));
    expect_plain(got, solo ? "ngram solo" : "ngram batched");
    EXPECT_GT(got.stats.spec_draft_tokens, 0);
    if (solo) {
      EXPECT_GT(got.stats.prefix_hit_tokens, 2 * 32) << "no prefix hit past a prompt";
    }
  }
  for (bool solo : {true, false}) {
    RunOptions replay = options(solo);
    replay.source = Replay(requests, plain, 3, (*probe)->config().vocab_size);
    const RunResult got = RunEngine(dir, requests, std::move(replay));
    expect_plain(got, solo ? "replay solo" : "replay batched");
    EXPECT_GT(got.stats.spec_accepted_tokens, 0);
    EXPECT_GT(got.stats.sampled_tokens, got.stats.sampled_seq_steps);  // drafts paid
    if (solo) {
      EXPECT_GT(got.stats.prefix_hit_tokens, 2 * 32) << "no prefix hit past a prompt";
    }
  }
}

// A hybrid model with replayed drafts wrong at a known rate (every 2nd, 3rd token): seeded
// sampled requests with every processor, n = 2, batched, give the plain tokens and logprobs; and
// with a KV cache small enough to preempt, rejected drafts leave no block behind.
TEST(SpecDecodeTest, HybridModelSeededSampledAndPreemptedOutputsAreIdentical) {
  const std::string dir = ModelDir("qwen3_next");
  EMBER_REQUIRE_DIR(dir);
  const int32_t vocab = 512;
  const std::vector<GenerationRequest> requests = SampledRequests();
  const RunResult plain = ExpectSeededReplaysMatch(dir, vocab, {2, 3});
  auto probe = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(probe.ok());
  const int64_t per_state = (*probe)->StateBytesPerSequence();
  const int64_t per_token = (*probe)->KvBytesPerToken();
  RunOptions small;
  small.max_running = 6;
  // Six sequences' slots, the scratch one, 6 x 4 snapshots, 4 checkpoints and 14 blocks.
  small.state_checkpoint_bytes = 4 * per_state;
  small.kv_cache_bytes = (6 + 1 + 24 + 4) * per_state + 14 * 16 * per_token;
  small.source = Replay(requests, plain, 3, vocab);
  const RunResult preempted = RunEngine(dir, requests, std::move(small));
  ASSERT_EQ(preempted.outputs.size(), plain.outputs.size());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_TRUE(preempted.outputs[i] == plain.outputs[i]) << "request " << i << " preempted";
  EXPECT_GT(preempted.stats.preemptions, 0) << "no preemption: make the cache smaller";
  EXPECT_GT(preempted.stats.spec_draft_tokens, preempted.stats.spec_accepted_tokens);
}

// A constrained request's rows are verified under the constraint's mask as if the drafts before
// them were accepted: the same tokens as without drafts, all allowed, done at the same token;
// drafts the mask forbids (the replay's wrong ones, and noise) are simply rejected. Two requests'
// constraints force runs of tokens, which jump forward beside the drafting (the reference runs
// token by token: no drafts, no jump-forward).
TEST(SpecDecodeTest, ConstrainedOutputsAreIdenticalAndValid) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = Greedy({1, 80, 147, 201}, 40);
    const std::vector<int32_t> forced =
        i == 1 || i == 2 ? std::vector<int32_t>{5, 6, 7, 8, 15, 16} : std::vector<int32_t>{};
    r.constraint = std::make_shared<StrideConstraint>(2048, 7 + i % 2, 25, -1, forced);
    if (i >= 2) r.sampling.temperature = 0.9f, r.sampling.seed = 5 + static_cast<uint64_t>(i);
    if (i == 3) r.sampling.top_logprobs = 1;
    requests.push_back(r);
  }
  RunOptions token_by_token;
  token_by_token.jump_forward = false;
  const RunResult plain = RunEngine(dir, requests, std::move(token_by_token));
  for (const auto& samples : plain.outputs) ASSERT_EQ(samples[0].ids.size(), 25u);
  RunOptions replay;
  replay.source = Replay(requests, plain, 3, 2048);
  const RunResult got = RunEngine(dir, requests, std::move(replay));
  RunOptions noise;
  noise.source = std::make_unique<NoiseDraftSource>(2048);
  const RunResult noisy = RunEngine(dir, requests, std::move(noise));
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(got.outputs[i] == plain.outputs[i]) << "request " << i;
    EXPECT_TRUE(noisy.outputs[i] == plain.outputs[i]) << "request " << i;
    EXPECT_EQ(got.outputs[i][0].finish, FinishReason::kStop);
  }
  EXPECT_GT(got.stats.spec_accepted_tokens, 0);
  // A forced position is jumped over, or verified as a draft (its row masked to that token).
  EXPECT_GT(got.stats.forced_tokens, 0);
  EXPECT_GT(noisy.stats.forced_tokens, 0);
}

// Drafts that are nearly all wrong, many requests, a KV cache small enough to preempt, prefix
// caching on: the outputs do not change, every block comes back, the counters add up, and the
// requests' usage carries exactly their drafted tokens.
TEST(SpecDecodeTest, RejectedDraftsLeaveNoBlockBehindUnderPreemption) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests;
  std::mt19937 rng(11);
  const std::vector<int32_t> shared = {1, 80, 147, 201, 282, 57, 300, 301, 302, 300, 301, 302,
                                       9, 10, 11, 12, 13, 14};
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt = shared;
    for (int j = 0; j < i % 5; ++j) prompt.push_back(1 + static_cast<int32_t>(rng() % 2000));
    requests.push_back(Greedy(prompt, 20 + i));
  }
  RunOptions plain_options;
  plain_options.solo = true;
  const RunResult plain = RunEngine(dir, requests, std::move(plain_options));
  // TinyStories' KV: 2 layers x 2 (K, V) x 4 heads x 16 floats = 1 KiB a token; 12 blocks of 16 tokens.
  RunOptions noisy_options;
  noisy_options.kv_cache_bytes = int64_t{12} * 16 * 1024;
  noisy_options.max_running = 8;
  noisy_options.source = std::make_unique<NoiseDraftSource>(2048);
  const RunResult noisy = RunEngine(dir, requests, std::move(noisy_options));
  EXPECT_EQ(FirstSamples(noisy), FirstSamples(plain));
  EXPECT_GT(noisy.stats.preemptions, 0) << "no preemption: make the cache smaller";
  EXPECT_GT(noisy.stats.spec_draft_tokens, 50);  // few: the sequences pause drafting (SpecAdapt)
  int64_t accepted = 0, rejected = 0;
  for (const RequestUsage& u : noisy.usage) {
    EXPECT_TRUE(u.speculative);
    accepted += u.accepted_prediction_tokens;
    rejected += u.rejected_prediction_tokens;
  }
  EXPECT_EQ(accepted, noisy.stats.spec_accepted_tokens);
  EXPECT_EQ(accepted + rejected, noisy.stats.spec_draft_tokens);
  EXPECT_EQ(noisy.stats.kv_blocks_used, 0);
  for (const RequestUsage& u : plain.usage) {
    EXPECT_FALSE(u.speculative);
    EXPECT_EQ(u.accepted_prediction_tokens + u.rejected_prediction_tokens, 0);
  }
}

// A draft model loaded from `dir` for a target of `target_vocab` tokens (null on failure, with
// the test failed).
std::unique_ptr<DraftSource> DraftModel(const std::string& dir, int32_t target_vocab,
                                        int64_t kv_cache_bytes = 0) {
  auto model = Model::Load(dir, ModelLoadOptions{});
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return nullptr;
  ModelDraftSource::Options options;
  options.kv_cache_bytes = kv_cache_bytes;
  options.max_step_tokens = 7;  // the catch-up in several forwards
  auto source = ModelDraftSource::Create(std::move(*model), target_vocab, options);
  EXPECT_TRUE(source.ok()) << source.message();
  if (!source.ok()) return nullptr;
  return std::move(*source);
}

int32_t VocabOf(const std::string& dir) {
  auto model = Model::Load(dir, ModelLoadOptions{});
  EXPECT_TRUE(model.ok()) << model.message();
  return model.ok() ? (*model)->config().vocab_size : 0;
}

class SpecDraftModelTest : public ::testing::TestWithParam<std::string> {};

// A model drafting for itself (greedy): the golden continuations, every draft kept, more than one
// token per target step; batched, staggered, chunked prefill, half the requests not speculating.
TEST_P(SpecDraftModelTest, SelfDraftKeepsEveryGreedyDraft) {
  const std::string dir = ModelDir(GetParam());
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  GoldenRequests(dir, &requests, &expected);
  const size_t num_golden = requests.size();
  for (size_t i = 0; i < num_golden; ++i) {
    requests.push_back(requests[i]);
    requests.back().speculate = false;
  }
  RunOptions draft;
  draft.max_step_tokens = 13;
  draft.stagger = true;
  draft.source = DraftModel(dir, VocabOf(dir));
  ASSERT_NE(draft.source, nullptr);
  const RunResult got = RunEngine(dir, requests, std::move(draft));
  const auto ids = FirstSamples(got);
  ASSERT_EQ(ids.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(ids[i], expected[i % num_golden]) << "request " << i;
  EXPECT_GT(got.stats.spec_draft_tokens, 0);
  EXPECT_EQ(got.stats.spec_accepted_tokens, got.stats.spec_draft_tokens);
  EXPECT_GT(got.stats.sampled_tokens, got.stats.sampled_seq_steps);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpecDraftModelTest,
                         ::testing::Values("tinystories-656k", "llama3", "qwen3", "gemma2"));

// Another model of the same vocabulary (llama3's fixture drafting for qwen2's, both 512 tokens of
// random weights): its drafts are mostly rejected, the outputs are still the goldens.
TEST(SpecDecodeTest, DraftModelThatDisagreesChangesNothing) {
  const std::string dir = ModelDir("qwen2"), draft_dir = ModelDir("llama3");
  EMBER_REQUIRE_DIR(dir);
  EMBER_REQUIRE_DIR(draft_dir);
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  GoldenRequests(dir, &requests, &expected);
  RunOptions draft;
  draft.source = DraftModel(draft_dir, VocabOf(dir));
  ASSERT_NE(draft.source, nullptr);
  const RunResult got = RunEngine(dir, requests, std::move(draft));
  EXPECT_EQ(FirstSamples(got), expected);
  EXPECT_GT(got.stats.spec_draft_tokens, got.stats.spec_accepted_tokens);
}

// Seeded sampling with every processor and n = 2, the model drafting for itself: the draft's
// greedy tokens are often rejected at temperature > 0, the outputs (and logprobs) are the same.
TEST(SpecDecodeTest, DraftModelSeededSampledOutputsAreIdentical) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  const std::vector<GenerationRequest> requests = SampledRequests();
  RunOptions plain_options;
  plain_options.max_running = 4;
  const RunResult plain = RunEngine(dir, requests, std::move(plain_options));
  RunOptions spec;
  spec.max_running = 4;
  spec.source = DraftModel(dir, 2048);
  ASSERT_NE(spec.source, nullptr);
  const RunResult got = RunEngine(dir, requests, std::move(spec));
  ASSERT_EQ(got.outputs.size(), plain.outputs.size());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_TRUE(got.outputs[i] == plain.outputs[i]) << "request " << i;
  EXPECT_GT(got.stats.spec_accepted_tokens, 0);
  EXPECT_GT(got.stats.spec_draft_tokens, got.stats.spec_accepted_tokens);
}

// Preemption in the target's pool and a draft pool too small for every sequence (the draft drops
// idle sequences' state and skips what does not fit): the outputs do not change, no target block
// is left behind.
TEST(SpecDecodeTest, DraftModelUnderPreemptionAndASmallDraftPool) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  std::vector<GenerationRequest> requests;
  std::mt19937 rng(11);
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt = {1, 80, 147, 201, 282, 57, 300, 301, 302, 9, 10, 11};
    for (int j = 0; j < i % 5; ++j) prompt.push_back(1 + static_cast<int32_t>(rng() % 2000));
    requests.push_back(Greedy(prompt, 20 + i));
    if (i % 4 == 3) requests.back().sampling.temperature = 0.8f, requests.back().sampling.seed = 9;
  }
  RunOptions plain_options;
  plain_options.solo = true;
  const RunResult plain = RunEngine(dir, requests, std::move(plain_options));
  RunOptions spec;
  spec.kv_cache_bytes = int64_t{12} * 16 * 1024;  // 12 blocks of 16 tokens (1 KiB a token)
  spec.max_running = 8;
  spec.source = DraftModel(dir, 2048, /*kv_cache_bytes=*/int64_t{8} * 16 * 1024);
  ASSERT_NE(spec.source, nullptr);
  const RunResult got = RunEngine(dir, requests, std::move(spec));
  ASSERT_EQ(got.outputs.size(), plain.outputs.size());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_TRUE(got.outputs[i] == plain.outputs[i]) << "request " << i;
  EXPECT_GT(got.stats.preemptions, 0) << "no preemption: make the cache smaller";
  EXPECT_GT(got.stats.spec_accepted_tokens, 0);
  EXPECT_EQ(got.stats.kv_blocks_used, 0);
}

// The refusals: a draft of another vocabulary (naming both sizes), and --spec-method draft
// without --draft-model or made from a config alone.
TEST(SpecDecodeTest, DraftModelRefusals) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto model = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  auto refused = ModelDraftSource::Create(std::move(*model), 512, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("2048"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("512"), std::string::npos) << refused.message();
  SpeculationConfig config;
  config.method = SpeculationConfig::Method::kDraft;
  Status no_model = CheckSpeculationConfig(config);
  ASSERT_FALSE(no_model.ok());
  EXPECT_NE(no_model.message().find("--draft-model"), std::string::npos) << no_model.message();
  config.draft_model = dir;
  EXPECT_TRUE(CheckSpeculationConfig(config).ok());
  EXPECT_FALSE(CreateDraftSource(config).ok());  // the engine alone cannot load it
  auto target = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(target.ok());
  EngineConfig engine_config;
  engine_config.speculation = config;
  EXPECT_FALSE(Engine::Create(target->get(), engine_config).ok());
}

// ---- mtp: the target checkpoint's multi-token-prediction module ----

std::string TempMtpDir(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("ember_spec_mtp_" + name + "_" + std::to_string(::getpid())))
      .string();
}

std::unique_ptr<DraftSource> MtpSource(const std::string& dir, int32_t vocab,
                                       const ModelLoadOptions& load = {}) {
  SpeculationConfig config;
  config.method = SpeculationConfig::Method::kMtp;
  auto source = LoadDraftSource(config, load, vocab, dir);
  EXPECT_TRUE(source.ok()) << source.message();
  return source.ok() ? std::move(*source) : nullptr;
}

// Greedy prompts of 2 to 41 tokens, one of them not speculating.
std::vector<GenerationRequest> MtpRequests() {
  std::mt19937 rng(5);
  std::vector<GenerationRequest> requests;
  for (int len : {2, 5, 9, 17, 30, 41}) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < len; ++i) prompt.push_back(3 + static_cast<int32_t>(rng() % 500));
    requests.push_back(Greedy(prompt, 20));
  }
  requests[1].speculate = false;
  return requests;
}

// Random MTP weights (drafts mostly wrong): the greedy outputs are those without speculation,
// batched (staggered, chunked prefill) and solo; on deepseek_v3 (MLA) and on qwen3_next, whose
// recurrent state rolls back from the per-row snapshots.
TEST(SpecDecodeTest, MtpDraftsLeaveGreedyOutputsUnchanged) {
  for (const std::string fixture : {"deepseek_v3", "qwen3_next"}) {
    EMBER_REQUIRE_DIR(ModelDir(fixture));
    const std::string dir = TempMtpDir("random_" + fixture);
    testing::WriteMtpCheckpoint(ModelDir(fixture), dir, {});
    const std::vector<GenerationRequest> requests = MtpRequests();
    const RunResult plain = RunEngine(dir, requests, {});
    ASSERT_EQ(plain.outputs.size(), requests.size());
    for (bool solo : {false, true}) {
      RunOptions mtp;
      mtp.solo = solo;
      mtp.stagger = !solo;
      mtp.max_step_tokens = 13;
      mtp.source = MtpSource(dir, 512);
      ASSERT_NE(mtp.source, nullptr) << fixture;
      const RunResult got = RunEngine(dir, requests, std::move(mtp));
      EXPECT_EQ(FirstSamples(got), FirstSamples(plain)) << fixture << (solo ? " solo" : " batched");
      EXPECT_GT(got.stats.spec_draft_tokens, 0) << fixture;
    }
    std::filesystem::remove_all(dir);
  }
}

// MTP drafts on a GPU (random module weights, loaded on the GPU too), as
// CudaSpecGreedyTest: batched and staggered with `--batch-invariant auto`, the tokens of
// `--batch-invariant on` without speculation, one request at a time; qwen3_next's rejected rows
// roll back from the CUDA backend's per-row state snapshots.
TEST(SpecDecodeTest, CudaMtpDraftsKeepUnspeculatedTokens) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  for (const std::string fixture : {"deepseek_v3", "qwen3_next"}) {
    EMBER_REQUIRE_DIR(ModelDir(fixture));
    const std::string dir = TempMtpDir("cuda_" + fixture);
    testing::WriteMtpCheckpoint(ModelDir(fixture), dir, {});
    const std::vector<GenerationRequest> requests = MtpRequests();
    RunOptions on;
    on.solo = true;
    on.load.device = DeviceKind::kCuda;
    on.load.cuda_batch_invariant = true;
    const RunResult reference = RunEngine(dir, requests, std::move(on));
    ASSERT_EQ(reference.outputs.size(), requests.size()) << fixture;
    RunOptions mtp;
    mtp.load.device = DeviceKind::kCuda;
    mtp.invariant_steps = true;
    mtp.stagger = true;
    mtp.max_step_tokens = 13;
    mtp.source = MtpSource(dir, 512, mtp.load);
    ASSERT_NE(mtp.source, nullptr) << fixture;
    const RunResult got = RunEngine(dir, requests, std::move(mtp));
    EXPECT_EQ(FirstSamples(got), FirstSamples(reference)) << fixture;
    EXPECT_GT(got.stats.spec_draft_tokens, 0) << fixture;
    std::filesystem::remove_all(dir);
  }
}

// A module that must predict what the target predicts: the target has one layer whose attention
// adds nothing (o_proj = 0: a row's logits depend on its own token only), the MTP block is a copy
// of it with eh_proj = [I | 0] and +-1 embeddings (enorm keeps them), so its draft after token t
// is the target's greedy token after t (up to enorm's eps), and so is every chained draft. (With
// attention on, no MTP module reproduces a target in general: it sees the tokens shifted by one.)
TEST(SpecDecodeTest, MtpDraftsOfACopiedBlockAreAccepted) {
  EMBER_REQUIRE_DIR(ModelDir("deepseek_v3"));
  const std::string dir = TempMtpDir("copy");
  testing::MtpCheckpointOptions options;
  options.one_layer = true;
  options.zero_attention_out = true;
  options.eh = testing::MtpCheckpointOptions::EhProj::kEmbeddingHalf;
  testing::WriteMtpCheckpoint(ModelDir("deepseek_v3"), dir, options);
  const std::vector<GenerationRequest> requests = MtpRequests();
  const RunResult plain = RunEngine(dir, requests, {});
  RunOptions mtp;
  mtp.stagger = true;
  mtp.source = MtpSource(dir, 512);
  ASSERT_NE(mtp.source, nullptr);
  const RunResult got = RunEngine(dir, requests, std::move(mtp));
  EXPECT_EQ(FirstSamples(got), FirstSamples(plain));
  EXPECT_GT(got.stats.spec_accepted_tokens, 0);
  EXPECT_GE(got.stats.spec_accepted_tokens * 10, got.stats.spec_draft_tokens * 9)
      << got.stats.spec_accepted_tokens << " of " << got.stats.spec_draft_tokens;
  EXPECT_GT(got.stats.sampled_tokens, got.stats.sampled_seq_steps);
  std::filesystem::remove_all(dir);
}

// --spec-method mtp: made by the caller (LoadDraftSource), never with --draft-model.
TEST(SpecDecodeTest, MtpConfigRefusals) {
  SpeculationConfig config;
  config.method = SpeculationConfig::Method::kMtp;
  EXPECT_TRUE(CheckSpeculationConfig(config).ok());
  EXPECT_FALSE(CreateDraftSource(config).ok());
  config.draft_model = "x";
  EXPECT_FALSE(CheckSpeculationConfig(config).ok());
}

}  // namespace
}  // namespace ember
