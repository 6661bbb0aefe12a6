// Speculative decoding's parts without a model: the ngram lookup, the per-sequence adaptive draft
// length, the speculator's choice of who drafts (back-off, room under max_tokens, cool-down), the
// scheduler's 1 + k rows and their blocks, and the law of a verified sampled row (a draft kept
// with probability p(d), the other tokens then following p without d, renormalised).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>

#include "engine/draft_source.h"
#include "engine/replay_draft_source.h"
#include "engine/scheduler.h"
#include "engine/spec_adapt.h"
#include "engine/speculator.h"
#include "sampling/sampler.h"

namespace ember {
namespace {

std::vector<int32_t> Propose(std::vector<int32_t> history, int32_t max_tokens) {
  std::vector<int32_t> out;
  ProposeFromHistory(history, 1, 3, max_tokens, &out);
  return out;
}

TEST(NgramDraftTest, ProposesWhatFollowedTheLongestRecentMatch) {
  // "7 8 9" occurred at 1..3 followed by 4 5; the suffix 7 8 9 matches there.
  EXPECT_EQ(Propose({1, 7, 8, 9, 4, 5, 6, 7, 8, 9}, 2), (std::vector<int32_t>{4, 5}));
  // Up to what exists: the follower runs into the suffix itself.
  EXPECT_EQ(Propose({1, 7, 8, 9, 4, 5, 6, 7, 8, 9}, 10),
            (std::vector<int32_t>{4, 5, 6, 7, 8, 9}));
  // The most recent occurrence wins: 3 was followed by 4, later by 5.
  EXPECT_EQ(Propose({3, 4, 0, 3, 5, 1, 3}, 1), (std::vector<int32_t>{5}));
  // A longer match is preferred to a more recent shorter one: "1 2" then 9; "2" alone then 8.
  EXPECT_EQ(Propose({1, 2, 9, 2, 8, 1, 2}, 1), (std::vector<int32_t>{9}));
  // No earlier occurrence of even one token: nothing.
  EXPECT_TRUE(Propose({1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(Propose({5}, 4).empty());
  EXPECT_TRUE(Propose({5, 5}, 0).empty());
  // A run of one token proposes more of it (the earliest occurrence has the most followers).
  EXPECT_EQ(Propose({6, 6, 6, 6}, 3), (std::vector<int32_t>{6}));
  EXPECT_EQ(Propose({6, 6, 6, 6, 6}, 3), (std::vector<int32_t>{6, 6}));
  EXPECT_EQ(Propose({2, 6, 6, 6, 6, 6, 6}, 3), (std::vector<int32_t>{6, 6, 6}));
}

// The benchmarks' replay draft: the recorded continuation from where the history is, with each
// token wrong (the next id) at the chosen rate, the same tokens on every call; nothing for a
// history that left the recording.
TEST(ReplayDraftTest, ProposesTheRecordingWithErrorsAtTheChosenRate) {
  std::vector<int32_t> continuation(4000);
  std::iota(continuation.begin(), continuation.end(), 10);
  const std::vector<int32_t> prompt = {1, 2, 3};
  for (const double acceptance : {1.0, 0.7, 0.0}) {
    ReplayDraftSource source({{prompt, continuation}}, 5000, {0, acceptance});
    std::vector<int32_t> history = prompt, out, again;
    int64_t wrong = 0;
    for (size_t j = 0; j < continuation.size(); j += 4) {
      source.Propose(0, history, 4, &out);
      source.Propose(0, history, 4, &again);
      ASSERT_EQ(out.size(), 4u);
      EXPECT_EQ(out, again);
      for (size_t i = 0; i < 4; ++i) {
        const int32_t want = continuation[j + i];
        EXPECT_TRUE(out[i] == want || out[i] == want + 1);
        wrong += out[i] != want;
      }
      history.insert(history.end(), continuation.begin() + static_cast<std::ptrdiff_t>(j),
                     continuation.begin() + static_cast<std::ptrdiff_t>(j + 4));
    }
    EXPECT_NEAR(static_cast<double>(wrong) / 4000.0, 1.0 - acceptance, 0.03) << acceptance;
  }
  ReplayDraftSource every_third({{prompt, continuation}}, 5000, {3, 1.0});
  std::vector<int32_t> out;
  every_third.Propose(0, prompt, 6, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{10, 11, 13, 13, 14, 16}));
  every_third.Propose(0, std::vector<int32_t>{1, 2, 3, 99}, 4, &out);
  EXPECT_TRUE(out.empty());
}

TEST(SpecAdaptTest, DraftLengthFollowsTheAcceptanceRatePausesWhenUseless) {
  SpecAdapt a(5);
  EXPECT_EQ(a.draft_len(), 5);
  for (int i = 0; i < 10; ++i) a.Record(5, 5);
  EXPECT_EQ(a.draft_len(), 5);  // p = 1: capped at K
  // One token kept, the next rejected: p = 1/2; 0.5^2 >= kMinKeep > 0.5^3.
  for (int i = 0; i < 40; ++i) a.Record(a.draft_len(), 1);
  EXPECT_EQ(a.draft_len(), 2);
  // p = 2/3: (2/3)^3 = 0.30 >= kMinKeep > (2/3)^4 = 0.198.
  for (int i = 0; i < 40; ++i) a.Record(3, 2);
  EXPECT_EQ(a.draft_len(), 3);
  // p = 3/4 reaches K again: (3/4)^5 = 0.237.
  for (int i = 0; i < 40; ++i) a.Record(4, 3);
  EXPECT_EQ(a.draft_len(), 5);
  // A full acceptance of every draft counts no rejection: the estimate only rises.
  a.Record(5, 5);
  EXPECT_EQ(a.draft_len(), 5);
  // A good source's few misses in a row do not pause it (the estimate stays above 1/2).
  for (int i = 0; i < SpecAdapt::kMaxMisses; ++i) a.Record(a.draft_len(), 0);
  EXPECT_FALSE(a.paused());
  a = SpecAdapt(5);
  for (int i = 0; i < SpecAdapt::kMaxMisses; ++i) a.Record(1, 0);
  EXPECT_TRUE(a.paused());
  for (int i = 0; i < SpecAdapt::kMinPause; ++i) a.Tick();
  EXPECT_FALSE(a.paused());
  // A second useless stretch pauses twice as long.
  for (int i = 0; i < SpecAdapt::kMaxMisses; ++i) a.Record(1, 0);
  for (int i = 0; i < SpecAdapt::kMinPause; ++i) a.Tick();
  EXPECT_TRUE(a.paused());
  for (int i = 0; i < SpecAdapt::kMinPause; ++i) a.Tick();
  EXPECT_FALSE(a.paused());
  // Nothing to propose for long enough pauses too.
  SpecAdapt b(4);
  for (int i = 0; i < SpecAdapt::kMaxEmpty - 1; ++i) b.RecordEmpty();
  EXPECT_FALSE(b.paused());
  b.RecordEmpty();
  EXPECT_TRUE(b.paused());
}

// A source that always proposes 1, 2, 3, ... (up to the room it is given).
class CountingSource : public DraftSource {
 public:
  std::string name() const override { return "counting"; }
  void Propose(kv::SeqId, std::span<const int32_t>, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    out->resize(static_cast<size_t>(max_tokens));
    std::iota(out->begin(), out->end(), 1);
    ++calls;
  }
  int calls = 0;
};

std::unique_ptr<Sequence> DecodingSequence(int32_t max_tokens, int32_t generated, int32_t k) {
  auto seq = std::make_unique<Sequence>();
  seq->request = std::make_shared<RequestState>();
  seq->request->request.max_tokens = max_tokens;
  seq->tokens.assign(static_cast<size_t>(4 + generated), 9);
  seq->prompt_len = 4;
  seq->num_computed_tokens = seq->num_tokens() - 1;
  seq->started = true;
  seq->speculates = true;
  seq->spec = SpecAdapt(k);
  return seq;
}

TEST(SpeculatorTest, DraftsWithinMaxTokensAndBacksOffOnLargeBatches) {
  EngineStats counters;
  auto source = std::make_unique<CountingSource>();
  CountingSource* counting = source.get();
  SpeculationConfig config;
  config.max_batch = 2;
  config.invariant_steps = true;  // --batch-invariant auto
  Speculator speculator(config, std::move(source), &counters);
  auto a = DecodingSequence(100, 3, 4);
  auto b = DecodingSequence(6, 3, 4);   // 3 tokens left: 2 drafts + the token after them
  auto c = DecodingSequence(100, 3, 4);
  c->speculates = false;                // the request turned it off
  std::vector<Sequence*> running = {a.get(), b.get(), c.get()};
  speculator.Propose(std::span<Sequence* const>(running).first(2));
  EXPECT_EQ(a->draft, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(b->draft, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(a->wants_drafts);
  EXPECT_TRUE(speculator.StepInvariant(2, true));  // drafting may run: the step is batch-invariant
  EXPECT_TRUE(speculator.StepInvariant(2, false));
  // Three running sequences: more than max_batch, nobody drafts (and all may overlap), and the
  // step takes the backend's fastest products.
  speculator.Propose(running);
  for (Sequence* s : running) {
    EXPECT_TRUE(s->draft.empty());
    EXPECT_FALSE(s->wants_drafts);
  }
  EXPECT_FALSE(speculator.StepInvariant(3, false));
  // A step that verifies drafts is invariant whatever was admitted into it since; a lone
  // sequence that does not speculate still runs a step where drafting may run (a request's
  // tokens must not depend on whether others draft).
  EXPECT_TRUE(speculator.StepInvariant(3, true));
  EXPECT_TRUE(speculator.StepInvariant(1, false));
  // A sequence held by a step in flight (its last token not known yet) does not draft now.
  a->steps_in_flight = 1;
  const int calls = counting->calls;
  speculator.Propose(std::span<Sequence* const>(running).first(1));
  EXPECT_TRUE(a->draft.empty());
  EXPECT_TRUE(a->wants_drafts);
  EXPECT_EQ(counting->calls, calls);
  speculator.Record(a.get(), 4, 1);
  EXPECT_EQ(counters.spec_draft_tokens, 4);
  EXPECT_EQ(counters.spec_accepted_tokens, 1);
  EXPECT_EQ(a->rejected_drafts, 3);
  EXPECT_EQ(a->spec.draft_len(), 2);
}

// Without invariant_steps (`--batch-invariant on` or `off`: the backend's own mode in every step)
// and without a source, no step asks for batch invariance.
TEST(SpeculatorTest, StepInvarianceOnlyWhereAskedAndSpeculating) {
  EngineStats counters;
  auto seq = DecodingSequence(100, 3, 4);
  std::vector<Sequence*> running = {seq.get()};
  SpeculationConfig config;
  config.max_batch = 4;
  Speculator plain(config, std::make_unique<CountingSource>(), &counters);
  plain.Propose(running);
  EXPECT_FALSE(plain.StepInvariant(1, true));
  config.invariant_steps = true;
  Speculator off(config, nullptr, &counters);
  off.Propose(running);
  EXPECT_FALSE(off.StepInvariant(1, false));
}

// kDraft: the config checks pass with --draft-model and refuse it without; the source itself is
// the caller's (ModelDraftSource, loaded with its model): CreateDraftSource refuses by name.
TEST(SpeculatorTest, DraftMethodNeedsADraftModelFromTheCaller) {
  SpeculationConfig config;
  config.method = SpeculationConfig::Method::kDraft;
  Status no_model = CheckSpeculationConfig(config);
  ASSERT_FALSE(no_model.ok());
  EXPECT_NE(no_model.message().find("needs --draft-model"), std::string::npos) << no_model.message();
  config.draft_model = "/models/small";
  EXPECT_TRUE(CheckSpeculationConfig(config).ok());
  config.draft_kv_cache_bytes = -1;
  EXPECT_FALSE(CheckSpeculationConfig(config).ok());
  config.draft_kv_cache_bytes = 0;
  auto source = CreateDraftSource(config);
  ASSERT_FALSE(source.ok());
  EXPECT_NE(source.message().find("--spec-method draft"), std::string::npos) << source.message();
  EXPECT_NE(source.message().find("/models/small"), std::string::npos) << source.message();
  config.method = SpeculationConfig::Method::kNgram;
  EXPECT_FALSE(CreateDraftSource(config).ok());  // --draft-model without draft
  config.draft_model.clear();
  config.num_spec_tokens = 0;
  EXPECT_FALSE(CreateDraftSource(config).ok());
  config.num_spec_tokens = 4;
  auto ngram = CreateDraftSource(config);
  ASSERT_TRUE(ngram.ok()) << ngram.message();
  EXPECT_EQ((*ngram)->name(), "ngram");
  config.method = SpeculationConfig::Method::kNone;
  auto none = CreateDraftSource(config);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(SchedulerDraftTest, DraftsGetRowsAndBlocksWithinBudgetWithoutPreempting) {
  kv::KvCacheManager kv(kv::KvCacheConfig{4, 6, true});
  Scheduler scheduler(SchedulerConfig{8, 6}, &kv);
  auto a = DecodingSequence(100, 1, 8);
  a->id = 1;
  a->started = false;
  a->num_computed_tokens = 0;
  scheduler.AddWaiting(a.get());
  StepPlan prefill = scheduler.Schedule();  // 5 tokens: the prompt + 1 "generated"
  ASSERT_EQ(prefill.scheduled.size(), 1u);
  a->num_computed_tokens += prefill.scheduled[0].num_new_tokens - 1;  // last token uncomputed
  a->draft = {1, 2, 3, 4, 5, 6, 7};
  StepPlan step = scheduler.Schedule();
  ASSERT_EQ(step.scheduled.size(), 1u);
  EXPECT_EQ(step.scheduled[0].num_draft, 5);  // 6-token budget: the last token + 5 drafts
  EXPECT_EQ(step.scheduled[0].num_new_tokens, 6);
  EXPECT_TRUE(step.scheduled[0].samples);
  EXPECT_EQ(kv.NumBlocksNeeded(a->id, a->num_computed_tokens + 6), 0);
  EXPECT_EQ(kv.BlockTable(a->id).size(), 3u);  // 10 slots
  // After verification kept 1 draft: 6 tokens, blocks past them released, none leaked.
  kv.Truncate(a->id, 7);
  EXPECT_EQ(kv.BlockTable(a->id).size(), 2u);
  EXPECT_EQ(kv.NumUsedBlocks(), 2);
  EXPECT_EQ(kv.CheckInvariants(), "");
  scheduler.Remove(a.get());
  EXPECT_EQ(kv.NumUsedBlocks(), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

TEST(SchedulerDraftTest, DraftsNeverTakeTheBlocksOfLaterSequences) {
  kv::KvCacheManager kv(kv::KvCacheConfig{4, 3, true});
  Scheduler scheduler(SchedulerConfig{8, 64}, &kv);
  auto a = DecodingSequence(100, 0, 8), b = DecodingSequence(100, 0, 8);
  a->id = 1;
  b->id = 2;
  for (Sequence* s : {a.get(), b.get()}) {
    s->started = false;
    s->num_computed_tokens = 0;
    s->tokens.resize(3);
    s->prompt_len = 3;
    scheduler.AddWaiting(s);
  }
  StepPlan prefill = scheduler.Schedule();
  ASSERT_EQ(prefill.scheduled.size(), 2u);
  for (Sequence* s : {a.get(), b.get()}) {
    s->num_computed_tokens = 3;
    s->tokens.push_back(5);  // a sampled token: 4 tokens, 1 block each, 1 block free
  }
  a->draft = {1, 2, 3, 4, 5, 6};
  StepPlan step = scheduler.Schedule();
  ASSERT_EQ(step.scheduled.size(), 2u);
  EXPECT_EQ(step.scheduled[0].num_draft, 0);  // b needs the one free block
  EXPECT_EQ(scheduler.num_preemptions(), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

// The law of one verified sampled row: ordinary sampling (processors, temperature, top-k, top-p)
// then "keep the draft when the token equals it". Over many seeds: the draft is kept with
// probability p(d) and, when it is not, the token follows p with d removed and renormalised
// (chi-square), computed here from the definition, not from the sampler.
TEST(SpecSamplingLawTest, KeepsDraftWithPdAndOtherwiseFollowsPWithoutD) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.2f, 0.9f, 0.5f, 0.3f, 0.0f, -0.4f, -1.0f,
                                     -3.0f};
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 8;
  params.top_p = 0.95f;
  // p from the definition: softmax(logits / T), top-k, then the smallest prefix reaching top_p.
  std::vector<double> p(logits.size(), 0.0);
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += std::exp(logits[i] / params.temperature);
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp(logits[i] / params.temperature) / total;
  for (size_t i = static_cast<size_t>(params.top_k); i < p.size(); ++i) p[i] = 0.0;
  double kept_mass = std::accumulate(p.begin(), p.end(), 0.0), running = 0.0;
  size_t cut = p.size();
  for (size_t i = 0; i < p.size(); ++i) {
    running += p[i];
    if (running >= params.top_p * kept_mass) {
      cut = i + 1;
      break;
    }
  }
  for (size_t i = cut; i < p.size(); ++i) p[i] = 0.0;
  const double norm = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= norm;

  const int32_t draft = 1;
  const int n = 40000;
  int kept = 0;
  std::map<int32_t, int> rejected;
  for (int s = 0; s < n; ++s) {
    params.seed = static_cast<uint64_t>(s) * 7919u + 13u;
    SamplerState state(params, 0, {});
    std::vector<float> row = logits;
    const int32_t token = Sample(row, params, state).token_id;
    if (token == draft) {
      ++kept;
    } else {
      ++rejected[token];
    }
  }
  const double pd = p[draft];
  const double sigma = std::sqrt(pd * (1 - pd) / n);
  EXPECT_NEAR(static_cast<double>(kept) / n, pd, 4.5 * sigma);
  const int num_rejected = n - kept;
  double chi2 = 0.0;
  int cells = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (static_cast<int32_t>(t) == draft) continue;
    const int observed = rejected.count(static_cast<int32_t>(t)) ? rejected[static_cast<int32_t>(t)] : 0;
    if (p[t] == 0.0) {
      EXPECT_EQ(observed, 0) << "token " << t << " is outside top-k / top-p";
      continue;
    }
    const double expected = num_rejected * p[t] / (1.0 - pd);
    chi2 += (observed - expected) * (observed - expected) / expected;
    ++cells;
  }
  // Critical values of chi-square at 0.001 for cells - 1 degrees of freedom (here 4..7).
  const double critical[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12};
  ASSERT_GE(cells, 2);
  EXPECT_LT(chi2, critical[cells - 1]) << "cells " << cells;
}

}  // namespace
}  // namespace ember
