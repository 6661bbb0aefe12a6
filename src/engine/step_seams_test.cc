// The step's three seams without the engine thread: StepBuilder decides the rows, ModelRunner
// runs them on the CPU backend (with decode graph buckets, so padding is exercised), and
// StepPostprocessor accepts the tokens. Asserts the row decisions the engine relies on: decode
// steps padded to their bucket, greedy rows made by the backend and deferrable, rows that need
// the host (logprobs, prompt logprobs) copied and never deferred.
#include <gtest/gtest.h>

#include <atomic>
#include <optional>

#include "engine/engine_limits.h"
#include "engine/live_sequences.h"
#include "engine/model_runner.h"
#include "engine/step_builder.h"
#include "engine/step_postprocessor.h"
#include "util/testing.h"

namespace ember {
namespace {

constexpr int32_t kNumBlocks = 64;

class StepSeamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::FixturesDir() + "/models/tinystories-656k";
    EMBER_REQUIRE_DIR(dir);
    ModelLoadOptions options;
    options.cpu_decode_graph_buckets = {1, 2, 4, 8};
    auto loaded = Model::Load(dir, options);
    ASSERT_TRUE(loaded.ok()) << loaded.message();
    model_ = std::move(loaded).value();
    config_.max_running = 8;
    config_.max_step_tokens = 256;
    auto runner = ModelRunner::Create(model_.get(), config_, kNumBlocks);
    ASSERT_TRUE(runner.ok()) << runner.message();
    runner_.emplace(std::move(runner).value());
    kv_.emplace(kv::KvCacheConfig{config_.block_size, kNumBlocks, true});
    scheduler_.emplace(SchedulerConfig{config_.max_running, config_.max_step_tokens,
                                       PromptLogitsRows(config_, model_->config().vocab_size)},
                       &*kv_);
    sequences_.emplace(&*scheduler_, &num_queued_, &counters_);
    builder_.emplace(config_, &*runner_, &*kv_, &counters_, &helpers_);
    postprocessor_.emplace(&*runner_, &*kv_, &*sequences_, &speculator_, &counters_, &helpers_);
  }

  std::shared_ptr<RequestState> Add(GenerationRequest request) {
    auto state = std::make_shared<RequestState>();
    state->stream = std::make_shared<ResponseStream>(request.n);
    state->num_unfinished = request.n;
    state->request = std::move(request);
    num_queued_.fetch_add(1);
    sequences_->Add(state);
    return state;
  }

  // One step through the three seams, completed at once (as the engine does without overlap).
  StepBatch RunStep() {
    StepBatch step = builder_->Build(scheduler_->Schedule());
    builder_->DecideRowOutputs(step);
    Status st = runner_->Launch(step.batch, step.outputs(), step.decode_only);
    EXPECT_TRUE(st.ok()) << st.message();
    postprocessor_->Launched(step);
    postprocessor_->Complete(step);
    return step;
  }

  std::unique_ptr<Model> model_;
  EngineConfig config_;
  EngineStats counters_;
  WorkerPool helpers_{2};
  std::atomic<int32_t> num_queued_{0};
  std::optional<ModelRunner> runner_;
  std::optional<kv::KvCacheManager> kv_;
  std::optional<Scheduler> scheduler_;
  std::optional<LiveSequences> sequences_;
  std::optional<StepBuilder> builder_;
  Speculator speculator_{SpeculationConfig{}, nullptr, &counters_};  // off
  std::optional<StepPostprocessor> postprocessor_;
};

GenerationRequest Greedy(int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_ids = {5, 17, 42, 99, 7};
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

TEST_F(StepSeamsTest, GreedyDecodeStepIsPaddedToItsGraphBucketAndDeferred) {
  for (int i = 0; i < 3; ++i) Add(Greedy(4));
  const StepBatch prefill = RunStep();
  EXPECT_FALSE(prefill.decode_only);
  EXPECT_EQ(prefill.batch.num_tokens(), 15);
  EXPECT_EQ(prefill.real_rows, 3);
  EXPECT_TRUE(prefill.deferred);  // every row's token is the backend's argmax
  EXPECT_EQ(prefill.kinds, std::vector<RowOutput>(3, RowOutput::kArgmax));

  const StepBatch decode = RunStep();
  EXPECT_TRUE(decode.decode_only);
  EXPECT_EQ(decode.real_rows, 3);
  EXPECT_EQ(decode.batch.num_seqs(), 4);  // one padding row: bucket 4
  EXPECT_EQ(decode.kinds, std::vector<RowOutput>(4, RowOutput::kArgmax));
  EXPECT_TRUE(decode.deferred);
  EXPECT_EQ(counters_.decode_steps, 1);
  EXPECT_EQ(counters_.decode_rows, 3);
  EXPECT_EQ(counters_.decode_padding_rows, 1);
  EXPECT_EQ(runner_->counters().steps, 2);
  EXPECT_EQ(runner_->counters().computed_tokens, 15 + 4);
  for (const ScheduledSequence& s : decode.scheduled) {
    EXPECT_EQ(s.seq->num_generated(), 2);
    EXPECT_EQ(s.seq->num_computed_tokens, 6);
    for (int32_t token : s.seq->tokens) EXPECT_GE(token, 0);  // no placeholder left
  }
}

TEST_F(StepSeamsTest, RowsTheHostNeedsAreCopiedAndTheStepIsNotDeferred) {
  Add(Greedy(2));
  GenerationRequest with_logprobs = Greedy(2);
  with_logprobs.sampling.top_logprobs = 2;
  Add(with_logprobs);
  GenerationRequest with_prompt_logprobs = Greedy(2);
  with_prompt_logprobs.prompt_logprobs = 1;
  auto prompt_state = Add(with_prompt_logprobs);

  const StepBatch step = RunStep();
  EXPECT_FALSE(step.deferred);
  EXPECT_FALSE(step.decode_only);
  ASSERT_EQ(step.real_rows, 3);
  // Sampled rows first (argmax; copied for the logprobs row), then the 4 prompt rows of the
  // third request (positions 0..3: the last prompt row's logits are its sampled row's).
  const std::vector<RowOutput> kinds = {RowOutput::kArgmax, RowOutput::kCopy, RowOutput::kArgmax,
                                        RowOutput::kCopy,   RowOutput::kCopy, RowOutput::kCopy,
                                        RowOutput::kCopy};
  EXPECT_EQ(step.kinds, kinds);
  ASSERT_EQ(step.prompt_rows.size(), 1u);
  EXPECT_EQ(step.prompt_rows[0].scheduled_index, 2u);
  EXPECT_EQ(step.prompt_rows[0].first_row, 3);
  EXPECT_EQ(step.prompt_rows[0].num_rows, 4);

  // The postprocessor sent the prompt logprobs with the first token, and the logprobs row's
  // token carries its top logprobs.
  std::vector<TokenEvent> events;
  ASSERT_TRUE(prompt_state->stream->Next(&events, std::chrono::milliseconds(0)));
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].prompt_logprobs.has_value());
  ASSERT_EQ(events[0].prompt_logprobs->size(), 4u);
  EXPECT_EQ((*events[0].prompt_logprobs)[0].top_logprobs.size(), 1u);
  EXPECT_LT((*events[0].prompt_logprobs)[0].logprob, 0.0f);
  EXPECT_EQ(step.scheduled[1].seq->num_generated(), 1);
}

}  // namespace
}  // namespace ember
