// Scheduler tests over the real KV bookkeeping, with the model simulated: a step "computes" the
// scheduled rows and appends a fake sampled token. Checks chunked prefill, the token budget,
// FIFO admission, preemption of the newest sequence, n-sample siblings and block accounting.
#include "engine/scheduler.h"

#include "engine/state_slots.h"
#include "kv/state_checkpoints.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>

namespace ember {
namespace {

class SchedulerHarness {
 public:
  SchedulerHarness(int32_t num_blocks, int32_t block_size, SchedulerConfig config)
      : kv_(kv::KvCacheConfig{block_size, num_blocks, true}), scheduler_(config, &kv_) {}

  Sequence* Add(int32_t prompt_len, int32_t sample_index = 0,
                std::shared_ptr<RequestState> request = nullptr, int32_t first_token = 0) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id_++;
    seq->sample_index = sample_index;
    seq->request = request ? request : std::make_shared<RequestState>();
    seq->tokens.resize(prompt_len);
    std::iota(seq->tokens.begin(), seq->tokens.end(), first_token);
    seq->prompt_len = prompt_len;
    scheduler_.AddWaiting(seq.get());
    seqs_.push_back(std::move(seq));
    return seqs_.back().get();
  }

  // Schedules one step and simulates the forward + sampling.
  StepPlan Step() {
    StepPlan plan = scheduler_.Schedule();
    for (const ScheduledSequence& s : plan.scheduled) {
      Sequence* seq = s.seq;
      EXPECT_EQ(kv_.NumBlocksNeeded(seq->id, seq->num_computed_tokens + s.num_new_tokens), 0);
      seq->num_computed_tokens += s.num_new_tokens;
      kv_.CommitComputed(seq->id, seq->tokens, seq->num_computed_tokens, 0);
      if (seq->sample_index == 0 && seq->num_computed_tokens >= seq->prompt_len)
        seq->request->prompt_prefilled = true;
      if (s.samples) seq->tokens.push_back(1000 + seq->num_generated());
    }
    EXPECT_EQ(kv_.CheckInvariants(), "");
    return plan;
  }

  void Finish(Sequence* seq) { scheduler_.Remove(seq); }

  kv::KvCacheManager kv_;
  Scheduler scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  kv::SeqId next_id_ = 1;
};

TEST(SchedulerTest, ChunksLongPromptsUnderTheTokenBudget) {
  SchedulerHarness h(64, 16, SchedulerConfig{8, 32});
  Sequence* a = h.Add(70);
  StepPlan p1 = h.Step();
  ASSERT_EQ(p1.scheduled.size(), 1u);
  EXPECT_EQ(p1.scheduled[0].num_new_tokens, 32);
  EXPECT_FALSE(p1.scheduled[0].samples);
  Sequence* b = h.Add(5);
  StepPlan p2 = h.Step();  // a continues (32), b gets nothing: budget spent
  ASSERT_EQ(p2.scheduled.size(), 1u);
  EXPECT_EQ(p2.num_tokens, 32);
  StepPlan p3 = h.Step();  // a's last 6 tokens + b's 5
  ASSERT_EQ(p3.scheduled.size(), 2u);
  EXPECT_EQ(p3.scheduled[0].num_new_tokens, 6);
  EXPECT_TRUE(p3.scheduled[0].samples);
  EXPECT_EQ(p3.scheduled[1].seq, b);
  EXPECT_TRUE(p3.scheduled[1].samples);
  StepPlan p4 = h.Step();  // both decode one token each
  ASSERT_EQ(p4.scheduled.size(), 2u);
  EXPECT_EQ(p4.num_tokens, 2);
  EXPECT_EQ(a->num_generated(), 2);
}

TEST(SchedulerTest, AdmitsFifoAndRespectsMaxRunning) {
  SchedulerHarness h(64, 4, SchedulerConfig{2, 100});
  Sequence* a = h.Add(3);
  Sequence* b = h.Add(3, 0, nullptr, 100);
  Sequence* c = h.Add(3, 0, nullptr, 200);
  StepPlan p = h.Step();
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[0].seq, a);
  EXPECT_EQ(p.scheduled[1].seq, b);
  h.Finish(a);
  p = h.Step();
  ASSERT_EQ(p.scheduled.size(), 2u);
  EXPECT_EQ(p.scheduled[1].seq, c);
}

TEST(SchedulerTest, PreemptsNewestWhenBlocksRunOutAndRecomputesLater) {
  // 6 blocks of 4 slots. Two sequences of 8-token prompts take 2 blocks each; decoding grows them.
  SchedulerHarness h(6, 4, SchedulerConfig{8, 64});
  Sequence* a = h.Add(8, 0, nullptr, 0);
  Sequence* b = h.Add(8, 0, nullptr, 100);
  h.Step();                    // both prefilled, 4 blocks used (+1 each for the sampled token)
  bool preempted = false;
  for (int i = 0; i < 12 && !preempted; ++i) {
    StepPlan p = h.Step();
    for (Sequence* v : p.preempted) {
      EXPECT_EQ(v, b);  // the newest goes
      preempted = true;
    }
  }
  ASSERT_TRUE(preempted);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_FALSE(b->started);
  EXPECT_EQ(h.scheduler_.waiting().front(), b);
  int32_t a_generated = a->num_generated();
  h.Finish(a);                 // frees space: b restarts and recomputes its tokens
  StepPlan p = h.Step();
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_EQ(p.scheduled[0].seq, b);
  EXPECT_GT(a_generated, 0);
  h.Finish(b);
  EXPECT_EQ(h.kv_.NumUsedBlocks(), 0);
  EXPECT_EQ(h.kv_.CheckInvariants(), "");
}

TEST(SchedulerTest, SiblingsWaitForThePromptAndReuseItsBlocks) {
  SchedulerHarness h(32, 4, SchedulerConfig{8, 64});
  auto request = std::make_shared<RequestState>();
  Sequence* s0 = h.Add(10, 0, request);
  Sequence* s1 = h.Add(10, 1, request);
  StepPlan p1 = h.Step();
  ASSERT_EQ(p1.scheduled.size(), 1u);  // the sibling waits for sample 0's prefill
  EXPECT_EQ(p1.scheduled[0].seq, s0);
  StepPlan p2 = h.Step();
  ASSERT_EQ(p2.scheduled.size(), 2u);
  EXPECT_EQ(p2.scheduled[1].seq, s1);
  EXPECT_EQ(s1->num_computed_tokens, 10);      // 8 from the prefix cache + 2 computed
  EXPECT_EQ(p2.scheduled[1].num_new_tokens, 2);
}

TEST(SchedulerTest, WaitingSequenceThatDoesNotFitBlocksTheQueue) {
  SchedulerHarness h(4, 4, SchedulerConfig{8, 64});
  Sequence* a = h.Add(12);  // 3 blocks
  h.Add(8, 0, nullptr, 100);  // needs 2 blocks: does not fit while a runs
  Sequence* c = h.Add(1, 0, nullptr, 200);  // would fit, but FIFO keeps it behind b
  StepPlan p = h.Step();
  ASSERT_EQ(p.scheduled.size(), 1u);
  EXPECT_EQ(p.scheduled[0].seq, a);
  EXPECT_FALSE(c->started);
  EXPECT_EQ(h.kv_.CheckInvariants(), "");
}

// A sequence that needs its prompt rows' logits takes no prefix hit, and its chunks (with those
// of another such sequence) stay within max_prompt_logits_rows a step while others use the rest
// of the budget; with max_tokens 0 its last chunk samples nothing.
TEST(SchedulerTest, PromptLogitsRowsAreBoundedAndTakeNoPrefixHit) {
  SchedulerHarness h(64, 4, SchedulerConfig{8, 32, 10});
  Sequence* cached = h.Add(12);  // fills the prefix cache with ids 0..11
  h.Step();
  h.Finish(cached);
  auto request = std::make_shared<RequestState>();
  request->request.max_tokens = 0;
  Sequence* a = h.Add(12, 0, request);
  a->needs_prompt_logits = true;
  Sequence* b = h.Add(12, 0, nullptr);  // the same ids: a hit on 8 of them
  StepPlan p1 = h.Step();
  ASSERT_EQ(p1.scheduled.size(), 2u);
  EXPECT_EQ(p1.scheduled[0].seq, a);
  EXPECT_EQ(p1.scheduled[0].num_new_tokens, 10);  // the bound, not the 32-token budget
  EXPECT_EQ(p1.scheduled[1].seq, b);
  EXPECT_EQ(p1.scheduled[1].num_new_tokens, 4);  // 12 - the 8 cached
  Sequence* c = h.Add(20, 0, nullptr, 500);
  c->needs_prompt_logits = true;
  StepPlan p2 = h.Step();  // a's last 2 rows, c gets the 8 left of the bound
  ASSERT_EQ(p2.scheduled.size(), 3u);
  EXPECT_EQ(p2.scheduled[0].num_new_tokens, 2);
  EXPECT_FALSE(p2.scheduled[0].samples);  // max_tokens 0
  EXPECT_EQ(p2.scheduled[2].seq, c);
  EXPECT_EQ(p2.scheduled[2].num_new_tokens, 8);
  EXPECT_EQ(h.scheduler_.prefix_hit_tokens(), 8);  // b's only
}

// A hybrid model with state checkpoints: chunks never cross a checkpoint point (the interval's
// multiples, the end of the prompt's last full block) and those ending at one save the state; a
// later prompt sharing the prefix is admitted at the checkpointed block and restores it.
TEST(SchedulerTest, StateCheckpointPointsCutChunksAndHitsRestore) {
  SchedulerHarness h(64, 16, SchedulerConfig{8, 512});
  StateSlots slots(8);
  kv::StateCheckpoints ckpt(9, 4, 100, &h.kv_.prefix_cache(), 64);
  h.kv_.set_prefix_end_filter(&ckpt);
  h.scheduler_.set_state_slots(&slots);
  h.scheduler_.set_state_checkpoints(&ckpt, 32);
  Sequence* a = h.Add(90);  // points: 32, 64, and 80 (the last full block's end)
  std::vector<int32_t> chunks;
  std::vector<bool> saves;
  while (a->num_computed_tokens < a->prompt_len) {
    const kv::SeqId id = a->id;
    StepPlan p = h.Step();
    ASSERT_EQ(p.scheduled.size(), 1u);
    chunks.push_back(p.scheduled[0].num_new_tokens);
    saves.push_back(p.scheduled[0].saves_state);
    if (p.scheduled[0].saves_state) {  // what StepBuilder and the postprocessor do
      const int32_t slot = ckpt.Reserve();
      ckpt.Commit(slot, *h.kv_.ChainEnd(id, a->num_computed_tokens / 16));
    }
  }
  EXPECT_EQ(chunks, (std::vector<int32_t>{32, 32, 16, 10}));
  EXPECT_EQ(saves, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(a->restore_state_from, -1);
  // Shares 70 tokens: hits the checkpoint at 64 (not 80: block 4 differs).
  Sequence* b = h.Add(100);
  for (int32_t i = 70; i < 100; ++i) b->tokens[static_cast<size_t>(i)] = 5000 + i;
  h.Step();
  EXPECT_EQ(b->num_cached_prompt_tokens, 64);
  EXPECT_GE(b->restore_state_from, 9);  // StepBuilder takes it into the step
  const kv::BlockRef end_of_64 = h.kv_.prefix_cache().Ref(h.kv_.BlockTable(a->id)[3]);
  EXPECT_EQ(ckpt.Find(end_of_64), b->restore_state_from);
  EXPECT_EQ(h.kv_.BlockTable(b->id)[3], end_of_64.block_id);  // shares a's blocks
  EXPECT_GE(b->state_slot, 0);
  h.Finish(a);
  h.Finish(b);
  EXPECT_EQ(b->restore_state_from, -1);
  EXPECT_EQ(slots.num_free(), 8);
}

}  // namespace
}  // namespace ember
