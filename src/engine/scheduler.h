// Scheduler: picks each step's work under a token budget (vLLM v1 style, no phases). Running
// sequences go first, oldest first: each gets its uncomputed tokens (1 when decoding, a prompt
// chunk when prefilling) as the budget allows. When KV blocks run out, the newest running
// sequence is preempted (its blocks freed; it is recomputed later from its tokens). Waiting
// sequences are then admitted in FIFO order while their KV fits and the batch has room. A decoding
// sequence with drafts (Sequence::draft, speculator.h) gets 1 + k rows, k cut to the budget; its
// drafts never preempt anyone (no blocks for them: it decodes one token as usual). A hybrid model
// with state checkpoints: chunks end at checkpoint points (set_state_checkpoints).
// Integers only: no tensors, no model; engine-thread only; unit-tested with a simulated cache.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/sequence.h"
#include "kv/kv_cache_manager.h"

namespace ember {

struct SchedulerConfig {
  int32_t max_running = 64;        // sequences in one batch
  int32_t max_step_tokens = 512;   // rows in one forward step (chunked prefill budget)
  // Rows of one step whose logits are kept for prompt logprobs (Sequence::needs_prompt_logits):
  // such a sequence's prefill chunk is cut to what is left of this, so a long prompt prefills in
  // several steps instead of holding every row's logits at once (the engine sizes it by bytes).
  int32_t max_prompt_logits_rows = 512;
};

struct ScheduledSequence {
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;  // rows this step, starting at seq->num_computed_tokens
  // This chunk reaches the end: sample a token after the step (never for max_tokens 0: that
  // sample ends once its prompt is computed).
  bool samples = false;
  // Of those rows, the last num_draft are seq->draft's first num_draft tokens (verified this
  // step); the token before them is the sequence's last (uncomputed) token.
  int32_t num_draft = 0;
  // A hybrid model with state checkpoints: this chunk ends at a checkpoint point (its end a
  // multiple of the interval, or the prompt's last full block), so the sequence's state after
  // the step is saved (StepBuilder reserves a checkpoint slot, the engine copies it).
  bool saves_state = false;
};

struct StepPlan {
  std::vector<ScheduledSequence> scheduled;  // in row order
  std::vector<Sequence*> preempted;          // sequences preempted while planning this step
  int32_t num_tokens = 0;
  bool empty() const { return scheduled.empty(); }
};

class PromptTier;
class StateSlots;
namespace kv {
class StateCheckpoints;
}

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvCacheManager* kv) : config_(config), kv_(kv) {}
  // The prompt cache below the pool (prompt_tier.h): admission extends a pool hit from it.
  void set_prompt_tier(PromptTier* tier) { tier_ = tier; }
  // A model with recurrent layers: a started sequence holds a state slot (state_slots.h) beside
  // its blocks, taken when it starts and given back wherever its blocks are freed.
  void set_state_slots(StateSlots* slots) { slots_ = slots; }
  // A hybrid model with recurrent-state checkpoints (kv/state_checkpoints.h): a chunk never
  // crosses a checkpoint point (a multiple of `interval` tokens, 0: none, or the end of the
  // prompt's last full block), and a sequence admitted with a cached prefix restores the
  // checkpoint at its end (Sequence::restore_state_from). The KV manager's prefix lookups end
  // only at checkpointed blocks (its PrefixEndFilter).
  void set_state_checkpoints(kv::StateCheckpoints* checkpoints, int32_t interval) {
    checkpoints_ = checkpoints;
    checkpoint_interval_ = interval;
  }

  void AddWaiting(Sequence* seq) { waiting_.push_back(seq); }
  // Plans the next step (allocating KV blocks for it). Empty when nothing can run.
  StepPlan Schedule();
  // Drops a sequence wherever it is (finished or cancelled) and frees its blocks.
  void Remove(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prompt tokens of newly admitted sequences, and how many of them the prefix cache served
  // (counted once per sequence, not per admission retry or restart after preemption).
  int64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

 private:
  // What is left of a step's rows, and of its prompt-logprobs rows.
  struct Budget {
    int32_t tokens = 0;
    int32_t prompt_rows = 0;
  };
  void ScheduleRunning(StepPlan& plan, Budget& budget);
  void AdmitWaiting(StepPlan& plan, Budget& budget);
  void NoteFirstAdmission(Sequence* seq, bool looked_up_prefix);
  void Preempt(Sequence* seq);
  // Frees seq's KV blocks and its state slot (it is no longer started).
  void FreeSequence(Sequence* seq);
  // Siblings (sample_index > 0) wait until sample 0 finished the prompt, so they reuse its blocks.
  static bool WaitsForSibling(const Sequence* seq);
  // Rows of `seq` to compute this step within `budget` (and, when it needs its prompt rows'
  // logits, within *prompt_rows_left, which it then uses up).
  int32_t ChunkRows(const Sequence* seq, int32_t budget, int32_t* prompt_rows_left) const;
  ScheduledSequence Scheduled(Sequence* seq, int32_t num_new) const;
  // With state checkpoints: the first checkpoint point after seq's computed tokens (INT32_MAX:
  // none), and whether `end` is one.
  int32_t NextCheckpoint(const Sequence* seq) const;
  bool IsCheckpoint(const Sequence* seq, int32_t end) const;
  // A sequence just started with a cached prefix: the checkpoint slot it restores from.
  void TakeCheckpoint(Sequence* seq);
  // Drafts seq verifies this step (num_new: its rows without drafts): blocks for them taken now,
  // leaving at least reserve_blocks free; 0 when it has none, the budget has no room, the
  // blocks are short, or its last token's row ends at a state checkpoint point (the checkpoint
  // copies the state slot after the step's rows, which must not hold unverified drafts).
  int32_t TakeDrafts(Sequence* seq, int32_t num_new, int32_t budget, int32_t reserve_blocks);

  SchedulerConfig config_;
  kv::KvCacheManager* kv_;
  PromptTier* tier_ = nullptr;
  StateSlots* slots_ = nullptr;
  kv::StateCheckpoints* checkpoints_ = nullptr;
  int32_t checkpoint_interval_ = 0;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order: oldest first
  int64_t num_preemptions_ = 0;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace ember
