// Prompt logprobs (GenerationRequest::prompt_logprobs) on fixture models, CPU backend: each
// prompt token's logprob is log_softmax of the reference logits of the position before it (the
// golden logits, within the model tests' accuracy), with the top ids where their margins allow;
// the values are bitwise identical whatever the prefill chunking, the batch, preemption or an
// earlier request caching the same prefix; logits processors never touch them; max_tokens 0
// computes the prompt only; they arrive once, on sample 0's first event.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "model/safetensors.h"
#include "util/testing.h"

namespace ember {
namespace {

using testing::ModelDir;
using testing::LoadModel;

struct Output {
  std::vector<std::vector<int32_t>> samples;
  std::vector<FinishReason> finish;
  std::vector<PromptLogprob> prompt_logprobs;
  int32_t num_prompt_logprob_events = 0;
  RequestUsage usage;
};

// Reads a stream to its end; checks that the prompt logprobs, when present, ride on sample 0's
// first event.
Output Collect(const std::shared_ptr<ResponseStream>& stream) {
  Output out;
  out.samples.resize(static_cast<size_t>(stream->num_samples()));
  out.finish.resize(static_cast<size_t>(stream->num_samples()), FinishReason::kNone);
  std::vector<int32_t> num_events(static_cast<size_t>(stream->num_samples()), 0);
  std::vector<TokenEvent> events;
  while (stream->Next(&events)) {
    for (TokenEvent& e : events) {
      const auto i = static_cast<size_t>(e.sample_index);
      if (e.prompt_logprobs) {
        EXPECT_EQ(e.sample_index, 0);
        EXPECT_EQ(num_events[i], 0) << "prompt logprobs after sample 0's first event";
        ++out.num_prompt_logprob_events;
        out.prompt_logprobs = std::move(*e.prompt_logprobs);
      }
      ++num_events[i];
      if (e.token_id >= 0) out.samples[i].push_back(e.token_id);
      if (e.finish != FinishReason::kNone) out.finish[i] = e.finish;
    }
    events.clear();
  }
  out.usage = stream->usage();
  return out;
}

Output Generate(Engine& engine, const GenerationRequest& request) {
  auto result = engine.Submit(request);
  if (auto* error = std::get_if<SubmitError>(&result)) {
    ADD_FAILURE() << "submit refused: " << error->message;
    return {};
  }
  return Collect(std::get<std::shared_ptr<ResponseStream>>(result));
}

GenerationRequest PromptOnly(std::vector<int32_t> prompt, int32_t num_top) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = 0;
  r.prompt_logprobs = num_top;
  r.sampling.temperature = 0.0f;
  return r;
}

// Every field bit for bit (logprobs as floats compared with ==, -inf included).
void ExpectIdentical(const std::vector<PromptLogprob>& got, const std::vector<PromptLogprob>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].logprob, want[i].logprob) << what << ", position " << i + 1;
    EXPECT_EQ(got[i].rank, want[i].rank) << what << ", position " << i + 1;
    ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << what;
    for (size_t k = 0; k < got[i].top_logprobs.size(); ++k) {
      EXPECT_EQ(got[i].top_logprobs[k].token_id, want[i].top_logprobs[k].token_id) << what;
      EXPECT_EQ(got[i].top_logprobs[k].logprob, want[i].top_logprobs[k].logprob) << what;
    }
  }
}

// The golden logits are transformers' at every position; the CPU backend matches them within
// relative L2 1e-4 per position (model_test.cc). Here: |logprob - golden| <= kTolerance, where
// the golden logprob is log_softmax in double of the golden row (the fixtures' worst is 1.6e-6,
// gemma3). A top-k id must match the golden's wherever its golden logit is more than twice the
// tolerance away from its neighbours' (a closer pair may legitimately swap); the rank lies
// between the golden ids surely ahead of the token and those possibly ahead.
constexpr double kTolerance = 2e-5;

class PromptLogprobsGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PromptLogprobsGoldenTest, EqualLogSoftmaxOfTheGoldenLogits) {
  const std::string dir = ModelDir(GetParam());
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadModel(dir);
  ASSERT_NE(model, nullptr);
  const int32_t vocab = model->config().vocab_size;
  auto engine = Engine::Create(model.get(), EngineConfig{});
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  auto golden_logits = WeightStore::OpenFile(dir + "/golden_logits.safetensors");
  ASSERT_TRUE(golden_logits.ok()) << golden_logits.message();
  constexpr int32_t kTop = 5;
  int32_t checked = 0;
  for (const auto& [name, ids] : golden["sequences"].items()) {
    SCOPED_TRACE(GetParam() + "/" + name);
    const std::vector<int32_t> prompt = ids.get<std::vector<int32_t>>();
    auto ref = (*golden_logits)->Get("logits." + name);
    ASSERT_TRUE(ref.ok()) << ref.message();
    ASSERT_EQ(ref->nbytes, prompt.size() * static_cast<size_t>(vocab) * 4);
    const Output out = Generate(**engine, PromptOnly(prompt, kTop));
    EXPECT_EQ(out.num_prompt_logprob_events, 1);
    EXPECT_EQ(out.finish[0], FinishReason::kLength);  // max_tokens 0: no token
    EXPECT_TRUE(out.samples[0].empty());
    EXPECT_EQ(out.usage.completion_tokens, 0);
    ASSERT_EQ(out.prompt_logprobs.size(), prompt.size() - 1);
    for (size_t p = 1; p < prompt.size(); ++p) {
      const float* row = static_cast<const float*>(ref->data) + (p - 1) * vocab;
      double max = row[0];
      for (int32_t j = 0; j < vocab; ++j) max = std::max(max, static_cast<double>(row[j]));
      double sum = 0.0;
      for (int32_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - max);
      const double lse = max + std::log(sum);
      const PromptLogprob& got = out.prompt_logprobs[p - 1];
      const double err = std::abs(got.logprob - (row[prompt[p]] - lse));
      EXPECT_LE(err, kTolerance) << "position " << p;
      // The golden's order by logit (desc, ties by lower id), for the top ids and the rank.
      std::vector<int32_t> order(static_cast<size_t>(vocab));
      for (int32_t j = 0; j < vocab; ++j) order[static_cast<size_t>(j)] = j;
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      ASSERT_EQ(got.top_logprobs.size(), static_cast<size_t>(kTop));
      for (size_t k = 0; k < got.top_logprobs.size(); ++k) {
        const double lo = k + 1 < order.size() ? row[order[k + 1]] : -INFINITY;
        const double hi = k > 0 ? row[order[k - 1]] : INFINITY;
        const bool clear =
            hi - row[order[k]] > 2 * kTolerance && row[order[k]] - lo > 2 * kTolerance;
        if (clear) {
          EXPECT_EQ(got.top_logprobs[k].token_id, order[k]) << "position " << p << " top " << k;
        }
        EXPECT_NEAR(got.top_logprobs[k].logprob, row[got.top_logprobs[k].token_id] - lse,
                    kTolerance);
      }
      const double own = row[prompt[p]];
      const auto surely_ahead =
          std::count_if(row, row + vocab, [&](float x) { return x > own + 2 * kTolerance; });
      const auto maybe_ahead =
          std::count_if(row, row + vocab, [&](float x) { return x >= own - 2 * kTolerance; }) - 1;
      EXPECT_GE(got.rank - 1, surely_ahead) << "position " << p;
      EXPECT_LE(got.rank - 1, maybe_ahead) << "position " << p;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, PromptLogprobsGoldenTest,
                         ::testing::Values("llama3", "qwen2", "qwen3", "qwen3_moe", "gpt_oss",
                                           "mistral", "phi3", "gemma2", "gemma3"));

// A prompt of `len` ids over the vocabulary, deterministic.
std::vector<int32_t> Prompt(int32_t len, int32_t vocab, int32_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (int32_t i = 0; i < len; ++i)
    ids[static_cast<size_t>(i)] = 1 + (i * 37 + salt * 11) % (vocab - 1);
  return ids;
}

// A model holds one engine's KV pool: each engine gets its own copy of the checkpoint.
struct ModelAndEngine {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
};
ModelAndEngine Start(const std::string& dir, const EngineConfig& config) {
  ModelAndEngine out;
  out.model = LoadModel(dir);
  if (out.model == nullptr) return out;
  auto engine = Engine::Create(out.model.get(), config);
  EXPECT_TRUE(engine.ok()) << engine.message();
  if (engine.ok()) out.engine = std::move(engine).value();
  return out;
}

TEST(PromptLogprobsTest, BitwiseIdenticalWhateverTheChunkingBatchOrCache) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  ModelAndEngine solo = Start(dir, EngineConfig{});
  ASSERT_NE(solo.engine, nullptr);
  const int32_t vocab = solo.model->config().vocab_size;
  const std::vector<int32_t> prompt = Prompt(75, vocab, 1);
  GenerationRequest request = PromptOnly(prompt, 20);
  const std::vector<PromptLogprob> reference = Generate(*solo.engine, request).prompt_logprobs;
  ASSERT_EQ(reference.size(), prompt.size() - 1);

  // Prefill chunks of 7 rows; the prompt-logits bound at 3 rows a step (the bytes of 3 rows).
  for (const auto& [step_tokens, logits_bytes] :
       {std::pair<int32_t, int64_t>{7, int64_t{64} << 20}, {512, int64_t{3} * 4 * vocab}}) {
    EngineConfig config;
    config.max_step_tokens = step_tokens;
    config.prompt_logits_bytes = logits_bytes;
    ModelAndEngine chunked = Start(dir, config);
    ASSERT_NE(chunked.engine, nullptr);
    const Output out = Generate(*chunked.engine, request);
    ExpectIdentical(out.prompt_logprobs, reference, "chunked");
    // Each step computed at most min(step_tokens, the bound) of its rows.
    const int64_t per_step = std::min<int64_t>(step_tokens, logits_bytes / (4 * vocab));
    EXPECT_GE(chunked.engine->Stats().steps, (75 + per_step - 1) / per_step);
  }

  // Batched with greedy requests and another prompt-logprobs request, 13-token steps; then the
  // same prompt after a greedy request committed it to the prefix cache: no hit is taken, the
  // values are the same, and its blocks are committed for a later request without logprobs.
  EngineConfig config;
  config.max_step_tokens = 13;
  ModelAndEngine batched = Start(dir, config);
  ASSERT_NE(batched.engine, nullptr);
  Engine* engine = batched.engine.get();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (int32_t i = 0; i < 6; ++i) {
    GenerationRequest r = i == 3 ? request : PromptOnly(Prompt(20 + 9 * i, vocab, i + 2), 2);
    if (i % 2 == 0) {
      r.prompt_logprobs = -1;
      r.max_tokens = 10;
    }
    streams.push_back(std::get<std::shared_ptr<ResponseStream>>(engine->Submit(r)));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    Output out = Collect(streams[i]);
    if (i == 3) ExpectIdentical(out.prompt_logprobs, reference, "batched");
    EXPECT_EQ(out.num_prompt_logprob_events, i % 2 == 0 ? 0 : 1) << i;
  }
  GenerationRequest greedy = request;
  greedy.prompt_logprobs = -1;
  greedy.max_tokens = 4;
  EXPECT_EQ(Generate(*engine, greedy).num_prompt_logprob_events, 0);
  const Output after_cache = Generate(*engine, request);
  EXPECT_EQ(after_cache.usage.cached_tokens, 0);
  ExpectIdentical(after_cache.prompt_logprobs, reference, "after a prefix-cache fill");

  ModelAndEngine fresh = Start(dir, EngineConfig{});
  ASSERT_NE(fresh.engine, nullptr);
  Generate(*fresh.engine, request);
  // It committed its 4 full blocks of 16 for a later request without prompt logprobs.
  EXPECT_EQ(Generate(*fresh.engine, greedy).usage.cached_tokens, 64);
}

TEST(PromptLogprobsTest, UnchangedUnderPreemption) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  ModelAndEngine solo_run = Start(dir, EngineConfig{});
  ASSERT_NE(solo_run.engine, nullptr);
  const int32_t vocab = solo_run.model->config().vocab_size;
  std::vector<GenerationRequest> requests;
  for (int32_t i = 0; i < 12; ++i) {
    GenerationRequest r = PromptOnly(Prompt(30 + 5 * i, vocab, i), 3);
    r.max_tokens = 6 + i;
    r.ignore_eos = true;
    requests.push_back(r);
  }
  std::vector<Output> solo;
  for (const GenerationRequest& r : requests) solo.push_back(Generate(*solo_run.engine, r));
  EngineConfig config;
  config.max_step_tokens = 24;
  // 8 blocks of 16 for 12 sequences of up to 100 tokens.
  config.kv_cache_bytes = solo_run.model->KvBytesPerToken() * 16 * 8;
  ModelAndEngine tight = Start(dir, config);
  ASSERT_NE(tight.engine, nullptr);
  Engine* engine = tight.engine.get();
  std::vector<std::shared_ptr<ResponseStream>> streams;
  for (const GenerationRequest& r : requests)
    streams.push_back(std::get<std::shared_ptr<ResponseStream>>(engine->Submit(r)));
  for (size_t i = 0; i < streams.size(); ++i) {
    const Output out = Collect(streams[i]);
    ExpectIdentical(out.prompt_logprobs, solo[i].prompt_logprobs, "request " + std::to_string(i));
    EXPECT_EQ(out.samples[0], solo[i].samples[0]) << i;
  }
  engine->Shutdown(true);
  EXPECT_GT(engine->Stats().preemptions, 0);
  EXPECT_EQ(engine->Stats().kv_blocks_used, 0);
}

// Penalties, logit_bias, temperature and min_tokens shape the sampled tokens, never the prompt
// logprobs (the raw model's, as vLLM v1): the same values as a plain greedy request. The
// generated tokens of a request are those it makes without prompt logprobs; n = 2 delivers them
// once.
TEST(PromptLogprobsTest, LogitsProcessorsDoNotApplyAndGenerationIsUnchanged) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  ModelAndEngine run = Start(dir, EngineConfig{});
  ASSERT_NE(run.engine, nullptr);
  const std::vector<int32_t> prompt = {1, 80, 147, 201, 282, 57, 80, 147, 201, 282, 57};
  const Output plain = Generate(*run.engine, PromptOnly(prompt, 4));
  ASSERT_EQ(plain.prompt_logprobs.size(), prompt.size() - 1);

  GenerationRequest processed = PromptOnly(prompt, 4);
  processed.max_tokens = 12;
  processed.n = 2;
  SamplingParams& s = processed.sampling;
  s.temperature = 0.7f;
  s.seed = 5;
  s.repetition_penalty = 1.5f;
  s.presence_penalty = 1.0f;
  s.frequency_penalty = 0.5f;
  s.min_tokens = 3;
  s.logit_bias = {{prompt[3], 40.0f}, {prompt[5], -40.0f}};
  const Output out = Generate(*run.engine, processed);
  EXPECT_EQ(out.num_prompt_logprob_events, 1);
  ExpectIdentical(out.prompt_logprobs, plain.prompt_logprobs, "with processors");
  GenerationRequest without = processed;
  without.prompt_logprobs = -1;
  const Output reference = Generate(*run.engine, without);
  EXPECT_EQ(out.samples, reference.samples);
  EXPECT_EQ(reference.num_prompt_logprob_events, 0);
  // A one-token prompt has no prompt logprobs, but still gets the (empty) list once.
  const Output one = Generate(*run.engine, PromptOnly({1}, 2));
  EXPECT_EQ(one.num_prompt_logprob_events, 1);
  EXPECT_TRUE(one.prompt_logprobs.empty());
  EXPECT_EQ(one.finish[0], FinishReason::kLength);
}

TEST(PromptLogprobsTest, ValidateNamesTheField) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  ModelAndEngine run = Start(dir, EngineConfig{});
  ASSERT_NE(run.engine, nullptr);
  auto refused = [&](GenerationRequest r) {
    auto result = run.engine->Submit(r);
    EXPECT_TRUE(std::holds_alternative<SubmitError>(result));
    return std::holds_alternative<SubmitError>(result) ? std::get<SubmitError>(result).param : "";
  };
  EXPECT_EQ(refused(PromptOnly({1, 2, 3}, kMaxTopLogprobs + 1)), "prompt_logprobs");
  EXPECT_EQ(refused(PromptOnly({1, 2, 3}, -2)), "prompt_logprobs");
  GenerationRequest negative = PromptOnly({1, 2, 3}, 0);
  negative.max_tokens = -1;
  EXPECT_EQ(refused(negative), "max_tokens");
  // max_tokens 0 with min_tokens is refused; without prompt logprobs it only computes the prompt.
  GenerationRequest min_tokens = PromptOnly({1, 2, 3}, 0);
  min_tokens.sampling.min_tokens = 1;
  EXPECT_EQ(refused(min_tokens), "min_tokens");
  GenerationRequest prefill_only = PromptOnly({1, 2, 3}, -1);
  const Output out = Generate(*run.engine, prefill_only);
  EXPECT_EQ(out.finish[0], FinishReason::kLength);
  EXPECT_TRUE(out.samples[0].empty());
  EXPECT_EQ(out.num_prompt_logprob_events, 0);
}

}  // namespace
}  // namespace ember
