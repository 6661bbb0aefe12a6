#include "engine/scheduler.h"

#include <algorithm>
#include <limits>

#include "engine/prompt_tier.h"
#include "engine/state_slots.h"
#include "kv/state_checkpoints.h"
#include "util/check.h"

namespace ember {

bool Scheduler::WaitsForSibling(const Sequence* seq) {
  return seq->sample_index > 0 && !seq->request->prompt_prefilled;
}

int32_t Scheduler::NextCheckpoint(const Sequence* seq) const {
  int32_t next = std::numeric_limits<int32_t>::max();
  if (checkpoints_ == nullptr) return next;
  const int32_t done = seq->num_computed_tokens;
  if (checkpoint_interval_ > 0) next = (done / checkpoint_interval_ + 1) * checkpoint_interval_;
  const int32_t bs = kv_->block_size();
  const int32_t prompt_end = (seq->prompt_len - 1) / bs * bs;  // the last full block's end
  if (prompt_end > done) next = std::min(next, prompt_end);
  return next;
}

bool Scheduler::IsCheckpoint(const Sequence* seq, int32_t end) const {
  if (checkpoints_ == nullptr || end <= 0 || end % kv_->block_size() != 0) return false;
  return (checkpoint_interval_ > 0 && end % checkpoint_interval_ == 0) ||
         end == (seq->prompt_len - 1) / kv_->block_size() * kv_->block_size();
}

int32_t Scheduler::ChunkRows(const Sequence* seq, int32_t budget,
                             int32_t* prompt_rows_left) const {
  int32_t num_new = std::min(seq->num_uncomputed(), budget);
  // A chunk ends at the next checkpoint point, so the state there exists to be saved.
  const int64_t to_checkpoint = int64_t{NextCheckpoint(seq)} - seq->num_computed_tokens;
  num_new = static_cast<int32_t>(std::min<int64_t>(num_new, to_checkpoint));
  if (seq->needs_prompt_logits) {
    num_new = std::min(num_new, *prompt_rows_left);
    *prompt_rows_left -= num_new;
  }
  return num_new;
}

ScheduledSequence Scheduler::Scheduled(Sequence* seq, int32_t num_new) const {
  const int32_t end = seq->num_computed_tokens + num_new;
  const bool reaches_end = end == seq->num_tokens();
  ScheduledSequence s{seq, num_new, reaches_end && seq->request->request.max_tokens > 0};
  s.saves_state = IsCheckpoint(seq, end);
  return s;
}

void Scheduler::TakeCheckpoint(Sequence* seq) {
  seq->restore_state_from = -1;
  // Resumed from a prompt-cache tier's checkpoint: its bytes are written into the slot instead.
  if (checkpoints_ == nullptr || seq->num_computed_tokens == 0 || !seq->tier_state.empty()) return;
  const int32_t num_blocks = seq->num_computed_tokens / kv_->block_size();
  const std::optional<kv::BlockRef> end = kv_->ChainEnd(seq->id, num_blocks);
  CHECK(end.has_value()) << "seq " << seq->id << " hit " << num_blocks << " blocks without a chain";
  const int32_t slot = checkpoints_->Find(*end);
  CHECK_GE(slot, 0) << "seq " << seq->id << " hit a prefix without its state checkpoint";
  checkpoints_->Touch(slot);
  seq->restore_state_from = slot;
}

int32_t Scheduler::TakeDrafts(Sequence* seq, int32_t num_new, int32_t budget,
                              int32_t reserve_blocks) {
  if (seq->draft.empty() || num_new != 1 || seq->num_uncomputed() != 1) return 0;
  if (IsCheckpoint(seq, seq->num_computed_tokens + num_new)) return 0;
  const int32_t num_draft = std::min(static_cast<int32_t>(seq->draft.size()), budget - 1);
  if (num_draft <= 0) return 0;
  const int32_t end = seq->num_computed_tokens + 1 + num_draft;
  if (kv_->NumFreeBlocks() - kv_->NumBlocksNeeded(seq->id, end) < reserve_blocks) return 0;
  return kv_->Allocate(seq->id, end) ? num_draft : 0;
}

void Scheduler::FreeSequence(Sequence* seq) {
  kv_->Free(seq->id);
  seq->tier_blocks_tagged = 0;
  seq->tier_state.clear();
  if (slots_ != nullptr) slots_->Release(seq->state_slot);
  seq->state_slot = -1;
  seq->restore_state_from = -1;
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
    const bool starts = !seq->started;
    if (starts) {
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
    if (starts) TakeCheckpoint(seq);
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
