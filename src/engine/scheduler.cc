#include "engine/scheduler.h"

#include <algorithm>

#include "engine/prompt_tier.h"
#include "engine/state_slots.h"

namespace ember {

bool Scheduler::WaitsForSibling(const Sequence* seq) {
  return seq->sample_index > 0 && !seq->request->prompt_prefilled;
}

int32_t Scheduler::ChunkRows(const Sequence* seq, int32_t budget, int32_t* prompt_rows_left) {
  int32_t num_new = std::min(seq->num_uncomputed(), budget);
  if (seq->needs_prompt_logits) {
    num_new = std::min(num_new, *prompt_rows_left);
    *prompt_rows_left -= num_new;
  }
  return num_new;
}

ScheduledSequence Scheduler::Scheduled(Sequence* seq, int32_t num_new) {
  const bool reaches_end = seq->num_computed_tokens + num_new == seq->num_tokens();
  return {seq, num_new, reaches_end && seq->request->request.max_tokens > 0};
}

int32_t Scheduler::TakeDrafts(Sequence* seq, int32_t num_new, int32_t budget,
                              int32_t reserve_blocks) {
  if (seq->draft.empty() || num_new != 1 || seq->num_uncomputed() != 1) return 0;
  const int32_t num_draft = std::min(static_cast<int32_t>(seq->draft.size()), budget - 1);
  if (num_draft <= 0) return 0;
  const int32_t end = seq->num_computed_tokens + 1 + num_draft;
  if (kv_->NumFreeBlocks() - kv_->NumBlocksNeeded(seq->id, end) < reserve_blocks) return 0;
  return kv_->Allocate(seq->id, end) ? num_draft : 0;
}

void Scheduler::FreeSequence(Sequence* seq) {
  kv_->Free(seq->id);
  seq->tier_blocks_tagged = 0;
  if (slots_ != nullptr) slots_->Release(seq->state_slot);
  seq->state_slot = -1;
  seq->started = false;
}

void Scheduler::Preempt(Sequence* seq) {
  FreeSequence(seq);
  seq->num_computed_tokens = 0;
  seq->draft.clear();
  seq->pooled.Reset();  // its prompt's rows are computed (and pooled) again
  ++num_preemptions_;
}

void Scheduler::Remove(Sequence* seq) {
  FreeSequence(seq);
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  Budget budget{config_.max_step_tokens, config_.max_prompt_logits_rows};
  ScheduleRunning(plan, budget);
  // Victims come from the newest end, never from the already-scheduled older sequences.
  if (!plan.preempted.empty()) return plan;  // under memory pressure admit nothing new
  AdmitWaiting(plan, budget);
  return plan;
}

// 1. Running sequences, oldest first. Preempt from the newest end when blocks run out.
void Scheduler::ScheduleRunning(StepPlan& plan, Budget& budget) {
  for (size_t i = 0; i < running_.size() && budget.tokens > 0;) {
    Sequence* seq = running_[i];
    int32_t num_new =
        seq->last_token_pending ? 0 : ChunkRows(seq, budget.tokens, &budget.prompt_rows);
    if (num_new == 0) {
      ++i;
      continue;
    }
    // Drafts leave a block for each sequence after this one (none is preempted for them).
    const int32_t num_draft = TakeDrafts(seq, num_new, budget.tokens,
                                         static_cast<int32_t>(running_.size() - i - 1));
    bool allocated = false;
    while (!(allocated = kv_->Allocate(seq->id, seq->num_computed_tokens + num_new))) {
      Sequence* victim = running_.back();
      running_.pop_back();
      Preempt(victim);
      plan.preempted.push_back(victim);
      waiting_.push_front(victim);
      if (victim == seq) break;
    }
    if (!allocated) break;  // `seq` itself was preempted: it was the newest
    ScheduledSequence scheduled = Scheduled(seq, num_new);
    scheduled.num_draft = num_draft;
    scheduled.num_new_tokens += num_draft;
    plan.scheduled.push_back(scheduled);
    plan.num_tokens += scheduled.num_new_tokens;
    budget.tokens -= scheduled.num_new_tokens;
    ++i;
  }
}

// 2. Admit waiting sequences in FIFO order while they fit.
void Scheduler::AdmitWaiting(StepPlan& plan, Budget& budget) {
  while (!waiting_.empty() && budget.tokens > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_running) {
    Sequence* seq = waiting_.front();
    if (WaitsForSibling(seq)) break;
    // A sequence that needs every prompt row's logits, or early rows' hidden states (mean / CLS
    // pooling), computes them all: no cached prefix (Allocate below starts it with an empty block
    // table).
    const bool looks_up_prefix =
        !seq->needs_prompt_logits && !PoolingReadsEarlyRows(seq->request->request.pooling.kind);
    if (!seq->started) {
      seq->num_computed_tokens =
          looks_up_prefix ? kv_->AcquireCachedPrefix(seq->id, seq->tokens,
                                                     seq->request->request.cache_namespace)
                          : 0;
      if (looks_up_prefix && tier_ != nullptr) {  // blocks the pool missed, from below it
        seq->num_computed_tokens =
            tier_->ExtendCachedPrefix(*seq, seq->num_computed_tokens, *kv_, budget.tokens);
      }
      seq->started = true;
      if (slots_ != nullptr) seq->state_slot = slots_->Acquire();
    }
    int32_t prompt_rows_after = budget.prompt_rows;
    const int32_t num_new = ChunkRows(seq, budget.tokens, &prompt_rows_after);
    // No prompt-logits rows left this step (it waits for the next), or no blocks: drop the
    // prefix references; retry on a later step.
    if (num_new == 0 || !kv_->Allocate(seq->id, seq->num_computed_tokens + num_new)) {
      FreeSequence(seq);
      seq->num_computed_tokens = 0;
      break;
    }
    budget.prompt_rows = prompt_rows_after;
    if (!seq->ever_started) NoteFirstAdmission(seq, looks_up_prefix);
    waiting_.pop_front();
    running_.push_back(seq);
    plan.scheduled.push_back(Scheduled(seq, num_new));
    plan.num_tokens += num_new;
    budget.tokens -= num_new;
  }
}

// The request's prefix-cache outcome, counted on its first admission only.
void Scheduler::NoteFirstAdmission(Sequence* seq, bool looked_up_prefix) {
  seq->num_cached_prompt_tokens = seq->num_computed_tokens;
  if (looked_up_prefix) {
    prefix_query_tokens_ += seq->prompt_len;
    prefix_hit_tokens_ += seq->num_computed_tokens;
  }
  seq->ever_started = true;
}

}  // namespace ember
