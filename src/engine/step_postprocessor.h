// StepPostprocessor: the ONE place where a step's tokens are accepted. At launch it marks the
// step's rows computed and puts a placeholder where each sampled token goes (Launched); when the
// step completes it reads the backend's ids (waiting for a deferred step's) or samples the kCopy
// rows on the host, computes prompt logprobs, pools embedding requests' hidden-state rows, commits
// the computed KV blocks to the prefix cache, accepts each token into its sequence, sampler and
// output constraint, checks the stop conditions, streams the TokenEvents (an embedding request's
// pooled vector) and ends finished sequences (LiveSequences). A sequence that verified drafts
// (speculator.h) takes its tokens row by row (VerifyDrafts): each row sampled on the host with the
// state its earlier tokens left, kept while it equals the draft; then its computed end is rolled
// back to what was kept, the blocks past it are released (KvCacheManager::Truncate) and only then
// are its blocks committed, so no rejected token reaches the prefix cache; on a model with
// recurrent layers its state slot takes the snapshot the backend kept after its last kept row
// (RollBackState), so no rejected token stays in its recurrent state either. Then each sequence
// that took a token and may jump forward (Sequence::jumps_forward) appends the tokens its
// constraint forces (JumpForward): they are uncomputed tokens, which the scheduler gives to the
// sequence's next step as one chunk whose last row samples. Engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine_config.h"
#include "engine/live_sequences.h"
#include "engine/model_runner.h"
#include "engine/speculator.h"
#include "engine/prompt_tier.h"
#include "engine/step_builder.h"
#include "kv/kv_cache_manager.h"
#include "sampling/sampler.h"

namespace ember {

class StepPostprocessor {
 public:
  // Jump-forward's cap on the tokens one sequence appends after one step (within a step's token
  // budget: the scheduler cuts a longer run of uncomputed tokens into chunks anyway).
  static constexpr int32_t kMaxForcedTokens = 64;

  // The pointers must outlive this. It adds finish_ns, sampled_seq_steps and sampled_tokens to
  // `counters` (the engine's totals); `speculator` records verifications; `helpers` follow the
  // jump-forward chains (shared with the builder: both run on the engine thread).
  StepPostprocessor(ModelRunner* runner, kv::KvCacheManager* kv, LiveSequences* sequences,
                    Speculator* speculator, EngineStats* counters, WorkerPool* helpers)
      : runner_(runner),
        kv_(kv),
        sequences_(sequences),
        speculator_(speculator),
        counters_(counters),
        helpers_(helpers) {}

  // The prompt cache below the pool (prompt_tier.h): computed blocks are written through to it.
  void set_prompt_tier(PromptTier* tier) { tier_ = tier; }
  // A hybrid model with state checkpoints: a step's saves are committed to their blocks here.
  void set_state_checkpoints(kv::StateCheckpoints* checkpoints) { checkpoints_ = checkpoints; }

  // After a successful launch: the step's rows count as computed (the next step is planned
  // before this one completes); each sampled row's token is a placeholder -1 - r (its logits
  // row r) until Complete replaces it.
  void Launched(StepBatch& step);
  // Reads the step's tokens, commits its KV blocks, streams the tokens, ends finished sequences,
  // and lets go of its sequences.
  void Complete(StepBatch& step);
  // A step whose launch or ids failed: its sequences end with an error (their K/V is not trusted).
  void Fail(const StepBatch& step);

 private:
  // The kCopy sampled rows, sampled on the host in parallel across rows (per-sequence RNG:
  // order-independent), into row_outputs_.
  void SampleOnHost(const StepBatch& step);
  void ComputePromptLogprobs(const StepBatch& step);
  // The hidden-state rows into their sequences' PoolingAccumulator.
  void PoolHiddenRows(const StepBatch& step);
  // Each speculating sequence's rows of StepBatch::final_hidden to the draft source
  // (Speculator::ObserveHidden).
  void ObserveHidden(const StepBatch& step);
  // Ends an embedding request whose prompt is computed with its pooled vector (finish kStop).
  void EmitEmbedding(Sequence* seq);
  // Scheduled sequence i's rows up to computed_end are computed: commits its blocks, notes its
  // prompt's progress. Returns whether its prompt is now computed.
  bool CommitComputed(const StepBatch& step, size_t i, int32_t computed_end);
  // Scheduled sequence i's state saves (after its blocks are committed): each checkpoint joins
  // the cached block at its end, or its slot goes back when that block is not in the chain.
  void CommitStateSaves(StepBatch& step, size_t i);
  // Every save of the step not yet committed goes back (the step failed, its sequence ended).
  void ReleaseStateSaves(const StepBatch& step);
  // Sampled row `row`'s token: the backend's id, or what the host sampled (kCopy).
  SampleOutput TakeRowOutput(const StepBatch& step, size_t row);
  // Scheduled sequence i's sampled token (row `row`) joins it; ends it on a stop condition.
  void AcceptToken(const StepBatch& step, size_t i, size_t row);
  // Scheduled sequence i verified `run`'s drafts (its sampled row `row`, then run's rows): the
  // tokens it keeps join it; rolls back, truncates and commits its blocks; streams the tokens.
  void VerifyDrafts(StepBatch& step, size_t i, size_t row, const StepBatch::DraftRows& run);
  // Logits row `logits_row` sampled with the sequence's current state (and constraint mask), as
  // the host samples a kCopy row. token_id -1: the constraint allows nothing.
  SampleOutput SampleRow(StepBatch& step, size_t logits_row, Sequence* seq);
  // Verified sequence i kept `rows` of its rows: its state slot takes the state after row
  // rows - 1 (SequenceSlice::snapshot_slot; nothing when it kept every row or has no
  // snapshots). False when the copy failed.
  bool RollBackState(const StepBatch& step, size_t i, int32_t rows);
  // `out` (a token, >= 0) becomes the sequence's token at `index`: tokens, sampler, constraint;
  // returns its event, finish set by StopReason.
  TokenEvent RecordToken(Sequence* seq, int32_t index, SampleOutput out);
  // Streams the event; ends the sequence when the event finishes it.
  void Emit(Sequence* seq, TokenEvent event);
  // Jump-forward: each of the step's sequences that took a token, may jump forward and has not
  // ended appends the chain of tokens its constraint forces (TokenConstraint::ForcedToken: the
  // only allowed one), at most kMaxForcedTokens and never past max_tokens nor a stop id, and
  // streams them. The chains are found on helper threads (each advances its own constraint).
  void JumpForward(const StepBatch& step);
  // constraint_done: the sequence's constraint is complete after `token`.
  FinishReason StopReason(const Sequence& seq, int32_t index, int32_t token, bool constraint_broken,
                          bool constraint_done, bool* stop_token) const;

  ModelRunner* runner_;
  kv::KvCacheManager* kv_;
  LiveSequences* sequences_;
  Speculator* speculator_;
  EngineStats* counters_;
  WorkerPool* helpers_;
  PromptTier* tier_ = nullptr;
  kv::StateCheckpoints* checkpoints_ = nullptr;
  std::vector<SampleOutput> row_outputs_;  // [real_rows] host-sampled rows' tokens
  std::vector<uint8_t> host_skip_;         // [real_rows] rows the host sampler leaves alone
};

}  // namespace ember
