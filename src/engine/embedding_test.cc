// Embedding requests (GenerationRequest::pooling) on the CPU backend: the pooling math
// (pooling.h) on hand-made rows, and the engine's hidden-state rows against transformers' final
// hidden states (golden_hidden.safetensors: `hidden.<sequence>` [len, hidden] float32) pooled in
// double here: last-token, mean and CLS pooling, with and without L2 normalization, alone,
// batched together, chunked, mixed with generating requests (whose greedy tokens stay the
// golden's), after a prefix-cache fill and across a preemption.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/pooling.h"
#include "model/safetensors.h"
#include "util/testing.h"

namespace ember {
namespace {

using testing::ModelDir;

// ---- pooling math ----

TEST(PoolingTest, PooledPositionsPerKindAndChunk) {
  // A prompt of 10 rows computed in chunks [0, 4), [4, 8), [8, 10).
  EXPECT_EQ(PooledPositions(PoolingKind::kLastToken, 10, 0, 4).size(), 0);
  EXPECT_EQ(PooledPositions(PoolingKind::kLastToken, 10, 8, 2).begin, 9);
  EXPECT_EQ(PooledPositions(PoolingKind::kLastToken, 10, 8, 2).size(), 1);
  EXPECT_EQ(PooledPositions(PoolingKind::kMean, 10, 4, 4).begin, 4);
  EXPECT_EQ(PooledPositions(PoolingKind::kMean, 10, 4, 4).size(), 4);
  EXPECT_EQ(PooledPositions(PoolingKind::kCls, 10, 0, 4).size(), 1);
  EXPECT_EQ(PooledPositions(PoolingKind::kCls, 10, 0, 4).begin, 0);
  EXPECT_EQ(PooledPositions(PoolingKind::kCls, 10, 4, 4).size(), 0);
  EXPECT_EQ(PooledPositions(PoolingKind::kNone, 10, 0, 10).size(), 0);
  EXPECT_TRUE(PoolingReadsEarlyRows(PoolingKind::kMean));
  EXPECT_TRUE(PoolingReadsEarlyRows(PoolingKind::kCls));
  EXPECT_FALSE(PoolingReadsEarlyRows(PoolingKind::kLastToken));
}

TEST(PoolingTest, AccumulatorMeanLastAndNormalize) {
  PoolingAccumulator mean;
  mean.Add(std::vector<float>{1, 2, 3, 4}, 2);  // rows (1, 2) and (3, 4)
  mean.Add(std::vector<float>{5, 6}, 2);
  EXPECT_EQ(mean.num_rows(), 3);
  EXPECT_EQ(mean.Finish({PoolingKind::kMean, false}), (std::vector<float>{3, 4}));
  const std::vector<float> unit = mean.Finish({PoolingKind::kMean, true});
  EXPECT_FLOAT_EQ(unit[0], 0.6f);
  EXPECT_FLOAT_EQ(unit[1], 0.8f);
  mean.Reset();
  EXPECT_TRUE(mean.Finish({PoolingKind::kMean, true}).empty());

  PoolingAccumulator last;
  last.Add(std::vector<float>{-3, 0, 4}, 3);
  EXPECT_EQ(last.Finish({PoolingKind::kLastToken, false}), (std::vector<float>{-3, 0, 4}));
  const std::vector<float> last_unit = last.Finish({PoolingKind::kLastToken, true});
  EXPECT_FLOAT_EQ(last_unit[0], -0.6f);
  EXPECT_FLOAT_EQ(last_unit[2], 0.8f);
}

TEST(PoolingTest, TruncateRenormalizesAndZeroStaysZero) {
  const std::vector<float> v = {0.6f, 0.0f, 0.8f * 0.6f, 0.8f * 0.8f};  // unit norm
  const std::vector<float> two = TruncateEmbedding(v, 2);
  EXPECT_EQ(two, (std::vector<float>{1.0f, 0.0f}));
  EXPECT_EQ(TruncateEmbedding(v, 4).size(), 4u);
  std::vector<float> zero = {0, 0, 0};
  L2Normalize(zero);
  EXPECT_EQ(zero, (std::vector<float>{0, 0, 0}));
}

// ---- engine rows against the golden hidden states ----

// The CPU backend (float32) against transformers' float32 hidden states: every element of a
// normalized embedding within kAbsTolerance, an unnormalized one within kRelTolerance times the
// vector's largest magnitude. The largest error seen over these fixtures is 9.3e-7 (gemma3,
// last token), a twentieth of the tolerance.
constexpr double kAbsTolerance = 2e-5;
constexpr double kRelTolerance = 2e-5;

// The reference: the golden rows pooled in double.
std::vector<double> ReferencePool(const float* rows, int64_t len, int64_t dim, PoolingSpec spec) {
  std::vector<double> out(static_cast<size_t>(dim), 0.0);
  int64_t first = 0, end = len;
  if (spec.kind == PoolingKind::kLastToken) first = len - 1;
  if (spec.kind == PoolingKind::kCls) end = 1;
  for (int64_t r = first; r < end; ++r)
    for (int64_t j = 0; j < dim; ++j) out[static_cast<size_t>(j)] += rows[r * dim + j];
  for (double& x : out) x /= static_cast<double>(end - first);
  if (spec.normalize) {
    double sq = 0.0;
    for (double x : out) sq += x * x;
    for (double& x : out) x /= std::sqrt(sq);
  }
  return out;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, bool normalized,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_abs = 0.0;
  for (double x : want) max_abs = std::max(max_abs, std::abs(x));
  const double tolerance = normalized ? kAbsTolerance : kRelTolerance * max_abs;
  for (size_t j = 0; j < got.size(); ++j)
    ASSERT_NEAR(got[j], want[j], tolerance) << what << ", element " << j;
}

struct Embedded {
  std::vector<float> embedding;
  FinishReason finish = FinishReason::kNone;
  int32_t num_events = 0;
  RequestUsage usage;
};

Embedded Collect(const std::shared_ptr<ResponseStream>& stream) {
  Embedded out;
  std::vector<TokenEvent> events;
  while (stream->Next(&events)) {
    for (TokenEvent& e : events) {
      ++out.num_events;
      EXPECT_EQ(e.token_id, -1);
      out.embedding = std::move(e.embedding);
      out.finish = e.finish;
    }
    events.clear();
  }
  out.usage = stream->usage();
  return out;
}

GenerationRequest EmbedRequest(std::vector<int32_t> prompt, PoolingSpec spec) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = 0;
  r.pooling = spec;
  return r;
}

std::shared_ptr<ResponseStream> SubmitOrFail(Engine& engine, const GenerationRequest& r) {
  auto result = engine.Submit(r);
  if (auto* error = std::get_if<SubmitError>(&result)) {
    ADD_FAILURE() << "submit refused: " << error->message;
    return nullptr;
  }
  return std::get<std::shared_ptr<ResponseStream>>(result);
}

const PoolingSpec kSpecs[] = {{PoolingKind::kLastToken, true},
                              {PoolingKind::kLastToken, false},
                              {PoolingKind::kMean, true},
                              {PoolingKind::kMean, false},
                              {PoolingKind::kCls, true}};

struct Golden {
  nlohmann::json json;
  std::unique_ptr<WeightStore> hidden;
};

Golden LoadGolden(const std::string& dir) {
  Golden g;
  std::ifstream in(dir + "/golden.json");
  g.json = nlohmann::json::parse(in);
  auto hidden = WeightStore::OpenFile(dir + "/golden_hidden.safetensors");
  EXPECT_TRUE(hidden.ok()) << hidden.message();
  if (hidden.ok()) g.hidden = std::move(hidden).value();
  return g;
}

// Every sequence x every pooling, all submitted at once (batched), with generating requests of
// the same sequences mixed in (their greedy tokens must stay the golden's), in steps of
// `step_tokens` rows (chunked prefill when small).
void CheckGoldenBatch(const std::string& name, int32_t step_tokens) {
  const std::string dir = ModelDir(name);
  auto model = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  EngineConfig config;
  config.max_step_tokens = step_tokens;
  auto engine = Engine::Create(model->get(), config);
  ASSERT_TRUE(engine.ok()) << engine.message();
  Golden golden = LoadGolden(dir);
  ASSERT_NE(golden.hidden, nullptr);
  const int64_t dim = (*model)->config().hidden_size;
  struct Pending {
    std::string what;
    std::shared_ptr<ResponseStream> stream;
    std::vector<double> want;
    bool normalized;
    std::vector<int32_t> greedy;  // generating requests: the golden continuation
  };
  std::vector<Pending> pending;
  for (const auto& [seq_name, ids] : golden.json["sequences"].items()) {
    const std::vector<int32_t> prompt = ids.get<std::vector<int32_t>>();
    auto ref = golden.hidden->Get("hidden." + seq_name);
    ASSERT_TRUE(ref.ok()) << ref.message();
    ASSERT_EQ(ref->nbytes, prompt.size() * static_cast<size_t>(dim) * 4);
    const auto* rows = static_cast<const float*>(ref->data);
    for (const PoolingSpec& spec : kSpecs) {
      pending.push_back(
          {seq_name + "/" + PoolingKindName(spec.kind) + (spec.normalize ? "+norm" : ""),
           SubmitOrFail(**engine, EmbedRequest(prompt, spec)),
           ReferencePool(rows, static_cast<int64_t>(prompt.size()), dim, spec),
           spec.normalize,
           {}});
    }
    if (!golden.json["greedy"].contains(seq_name)) continue;
    GenerationRequest gen;
    gen.prompt_ids = prompt;
    gen.max_tokens = 8;
    gen.sampling.temperature = 0.0f;
    gen.ignore_eos = true;
    std::vector<int32_t> greedy = golden.json["greedy"][seq_name].get<std::vector<int32_t>>();
    greedy.resize(8);
    pending.push_back({seq_name + "/greedy", SubmitOrFail(**engine, gen), {}, false, greedy});
  }
  for (Pending& p : pending) {
    ASSERT_NE(p.stream, nullptr) << p.what;
    if (!p.greedy.empty()) {
      std::vector<int32_t> tokens;
      std::vector<TokenEvent> events;
      while (p.stream->Next(&events)) {
        for (const TokenEvent& e : events)
          if (e.token_id >= 0) tokens.push_back(e.token_id);
        events.clear();
      }
      EXPECT_EQ(tokens, p.greedy) << name << " " << p.what;
      continue;
    }
    const Embedded out = Collect(p.stream);
    EXPECT_EQ(out.num_events, 1) << p.what;
    EXPECT_EQ(out.finish, FinishReason::kStop) << p.what;
    EXPECT_EQ(out.usage.completion_tokens, 0) << p.what;
    ExpectNear(out.embedding, p.want, p.normalized, name + " " + p.what);
  }
}

// The model seam itself: a plan whose last row is an LM-head row (its logits copied) and whose
// every row is also a hidden-state row: the hidden rows are transformers' final hidden states,
// the logits row is its logits; a malformed request of hidden rows is an error, not a crash.
TEST(EmbeddingModelTest, ForwardReturnsHiddenRowsBesideLogitsRows) {
  const std::string dir = ModelDir("qwen3");
  EMBER_REQUIRE_DIR(dir);
  auto model = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  Model& m = **model;
  ASSERT_TRUE(m.AllocateKvCache(8, 16).ok());
  Golden golden = LoadGolden(dir);
  const std::vector<int32_t> prompt = golden.json["sequences"]["short"].get<std::vector<int32_t>>();
  const auto len = static_cast<int32_t>(prompt.size());
  const int32_t dim = m.config().hidden_size, vocab = m.config().vocab_size;
  BatchPlan plan;
  plan.block_size = 16;
  plan.AddSequence(prompt, 0, {0, 1}, /*want_logits=*/true);  // the LM-head row: the last
  for (int32_t r = 0; r < len; ++r) plan.logits_rows.push_back(r);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<float> hidden(static_cast<size_t>(len) * dim, 0.0f);
  StepOutputs outputs{logits, {}, {}, {}};
  outputs.hidden_rows = len;
  outputs.hidden = hidden;
  Status st = m.Forward(plan, outputs);
  ASSERT_TRUE(st.ok()) << st.message();
  auto want_hidden = golden.hidden->Get("hidden.short");
  ASSERT_TRUE(want_hidden.ok());
  const auto* want = static_cast<const float*>(want_hidden->data);
  double max_abs = 0.0;
  for (size_t j = 0; j < hidden.size(); ++j) max_abs = std::max(max_abs, std::abs(double{want[j]}));
  for (size_t j = 0; j < hidden.size(); ++j)
    ASSERT_NEAR(hidden[j], want[j], kRelTolerance * max_abs) << "element " << j;
  auto golden_logits = WeightStore::OpenFile(dir + "/golden_logits.safetensors");
  ASSERT_TRUE(golden_logits.ok());
  auto want_logits = (*golden_logits)->Get("logits.short");
  ASSERT_TRUE(want_logits.ok());
  const float* last = static_cast<const float*>(want_logits->data) + (len - 1) * vocab;
  for (int32_t j = 0; j < vocab; ++j) ASSERT_NEAR(logits[j], last[j], 1e-3) << "logit " << j;

  StepOutputs too_many = outputs;
  too_many.hidden_rows = len + 2;
  EXPECT_FALSE(m.Forward(plan, too_many).ok());
  StepOutputs short_span = outputs;
  short_span.hidden = std::span<float>(hidden).first(hidden.size() - 1);
  EXPECT_FALSE(m.Forward(plan, short_span).ok());
  std::vector<RowOutput> kinds = {RowOutput::kArgmax};
  std::vector<RowSampling> sampling(1);
  std::vector<int32_t> ids(1);
  StepOutputs deferred{logits, kinds, sampling, ids};
  deferred.defer_ids = true;
  deferred.hidden_rows = len;
  deferred.hidden = hidden;
  EXPECT_FALSE(m.Forward(plan, deferred).ok());
}

class EmbeddingGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EmbeddingGoldenTest, BatchedAndMixedMatchTheGoldenHiddenStates) {
  EMBER_REQUIRE_DIR(ModelDir(GetParam()));
  CheckGoldenBatch(GetParam(), 512);
}

TEST_P(EmbeddingGoldenTest, ChunkedPrefillMatchesTheGoldenHiddenStates) {
  EMBER_REQUIRE_DIR(ModelDir(GetParam()));
  CheckGoldenBatch(GetParam(), 7);
}

INSTANTIATE_TEST_SUITE_P(Families, EmbeddingGoldenTest,
                         ::testing::Values("llama3", "qwen3", "gemma3"));

std::vector<int32_t> Tokens(const std::shared_ptr<ResponseStream>& stream);

// A cached prefix: last-token pooling takes the hit and gives the same bits (the CPU backend is
// batch-invariant); mean pooling takes none (it needs every row) and gives the same bits too.
TEST(EmbeddingEngineTest, PrefixCacheHitsPoolTheSameBits) {
  const std::string dir = ModelDir("qwen3");
  EMBER_REQUIRE_DIR(dir);
  auto model = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  auto engine = Engine::Create(model->get(), EngineConfig{});
  ASSERT_TRUE(engine.ok()) << engine.message();
  Golden golden = LoadGolden(dir);
  const std::vector<int32_t> prompt = golden.json["sequences"]["long"].get<std::vector<int32_t>>();
  for (PoolingKind kind : {PoolingKind::kLastToken, PoolingKind::kMean}) {
    SCOPED_TRACE(PoolingKindName(kind));
    auto fresh = Model::Load(dir, ModelLoadOptions{});
    ASSERT_TRUE(fresh.ok());
    auto cold_engine = Engine::Create(fresh->get(), EngineConfig{});
    ASSERT_TRUE(cold_engine.ok());
    const Embedded cold = Collect(SubmitOrFail(**cold_engine, EmbedRequest(prompt, {kind, true})));
    ASSERT_EQ(cold.usage.cached_tokens, 0);
    // A generating request commits the prompt's full blocks; then the embedding request.
    GenerationRequest gen;
    gen.prompt_ids = prompt;
    gen.max_tokens = 2;
    gen.sampling.temperature = 0.0f;
    EXPECT_EQ(Tokens(SubmitOrFail(**engine, gen)).size(), 2u);
    const Embedded warm = Collect(SubmitOrFail(**engine, EmbedRequest(prompt, {kind, true})));
    if (kind == PoolingKind::kLastToken) {
      EXPECT_GT(warm.usage.cached_tokens, 0);
    } else {
      EXPECT_EQ(warm.usage.cached_tokens, 0);
    }
    EXPECT_EQ(warm.embedding, cold.embedding);
  }
}

// Drains a generating request's stream; returns its tokens.
std::vector<int32_t> Tokens(const std::shared_ptr<ResponseStream>& stream) {
  std::vector<int32_t> tokens;
  std::vector<TokenEvent> events;
  while (stream->Next(&events)) {
    for (const TokenEvent& e : events)
      if (e.token_id >= 0) tokens.push_back(e.token_id);
    events.clear();
  }
  return tokens;
}

// A KV pool of 6 blocks, 8-row steps, two long generations and four mean-pooled embedding
// requests: sequences are preempted (the newest first: embedding requests mid-prompt) and
// recompute their prompts; each pooled vector is the same bits as alone (no row pooled twice).
// Whether a run preempts depends on when the engine thread takes the requests (on a loaded
// machine the first generation may finish before the second arrives), so the run is repeated,
// up to 5 times, until one has preempted; every run's vectors must match.
TEST(EmbeddingEngineTest, PreemptedRequestsPoolEachRowOnce) {
  const std::string dir = ModelDir("llama3");
  EMBER_REQUIRE_DIR(dir);
  auto model = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  Golden golden = LoadGolden(dir);
  const std::vector<int32_t> prompt = golden.json["sequences"]["long"].get<std::vector<int32_t>>();
  auto alone_engine = Engine::Create(model->get(), EngineConfig{});
  ASSERT_TRUE(alone_engine.ok());
  const Embedded alone =
      Collect(SubmitOrFail(**alone_engine, EmbedRequest(prompt, {PoolingKind::kMean, false})));
  alone_engine->reset();

  int64_t preemptions = 0;
  for (int attempt = 0; attempt < 5 && preemptions == 0; ++attempt) {
    SCOPED_TRACE("run " + std::to_string(attempt));
    auto small = Model::Load(dir, ModelLoadOptions{});  // a model's KV pool is allocated once
    ASSERT_TRUE(small.ok());
    EngineConfig config;
    config.max_step_tokens = 8;
    config.kv_cache_bytes = (*small)->KvBytesPerToken() * 16 * 6;  // 6 blocks: 96 tokens
    config.enable_prefix_caching = false;
    auto engine = Engine::Create(small->get(), config);
    ASSERT_TRUE(engine.ok()) << engine.message();
    std::vector<std::shared_ptr<ResponseStream>> generations, embeddings;
    for (int i = 0; i < 2; ++i) {
      GenerationRequest gen;
      gen.prompt_ids.assign(prompt.begin() + i, prompt.begin() + i + 8);
      gen.max_tokens = 56;  // 64 tokens: 4 blocks each, 8 for both
      gen.ignore_eos = true;
      gen.sampling.temperature = 0.0f;
      generations.push_back(SubmitOrFail(**engine, gen));
    }
    for (int i = 0; i < 4; ++i)
      embeddings.push_back(
          SubmitOrFail(**engine, EmbedRequest(prompt, {PoolingKind::kMean, false})));
    for (auto& stream : embeddings) {
      ASSERT_NE(stream, nullptr);
      EXPECT_EQ(Collect(stream).embedding, alone.embedding);
    }
    for (auto& stream : generations) EXPECT_EQ(Tokens(stream).size(), 56u);
    (*engine)->Shutdown(true);  // publishes the final stats
    preemptions = (*engine)->Stats().preemptions;
  }
  EXPECT_GT(preemptions, 0) << "no run preempted: the test did not reach its case";
}

TEST(EmbeddingEngineTest, RefusesGenerationFieldsNamingThem) {
  const std::string dir = ModelDir("qwen3");
  EMBER_REQUIRE_DIR(dir);
  auto model = Model::Load(dir, ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  auto engine = Engine::Create(model->get(), EngineConfig{});
  ASSERT_TRUE(engine.ok()) << engine.message();
  const auto refused_param = [&](GenerationRequest r) {
    auto result = (*engine)->Submit(std::move(r));
    auto* error = std::get_if<SubmitError>(&result);
    return error == nullptr ? std::string("(accepted)") : error->param;
  };
  GenerationRequest r = EmbedRequest({1, 2, 3}, {PoolingKind::kLastToken, true});
  r.max_tokens = 4;
  EXPECT_EQ(refused_param(r), "max_tokens");
  r = EmbedRequest({1, 2, 3}, {PoolingKind::kLastToken, true});
  r.n = 2;
  EXPECT_EQ(refused_param(r), "n");
  r = EmbedRequest({1, 2, 3}, {PoolingKind::kMean, true});
  r.prompt_logprobs = 0;
  EXPECT_EQ(refused_param(r), "prompt_logprobs");
  // The whole served context is allowed (nothing is generated); one more token is not.
  r = EmbedRequest(std::vector<int32_t>(static_cast<size_t>((*engine)->context_length()) + 1, 1),
                   {PoolingKind::kLastToken, true});
  EXPECT_EQ(refused_param(r), "prompt");
}

}  // namespace
}  // namespace ember
