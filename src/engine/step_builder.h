// StepBuilder: the ONE place where a step's rows are decided. It turns the scheduler's StepPlan
// into a StepBatch: the BatchPlan (each scheduled sequence's new tokens, decode steps padded to a
// graph bucket, the logits rows of prompt-logprobs positions, the hidden-state rows that
// embedding requests pool), whether the step may launch before
// the step in flight has delivered its ids (deferred), and per logits row what comes back
// (RowOutput kArgmax / kSample / kCopy) with the processors and grammar masks that apply (where
// the backend makes the token, as LogitEdits and packed-bit RowMasks; as TokenMasks where the
// host samples). It reads the sequences' states and draws their sampling uniforms; it changes
// nothing else, except for a
// hybrid model's state checkpoints (AddStateCopies: it takes a sequence's pending restore into
// the step and reserves the checkpoint slots of the step's saves). A sequence
// with drafts (speculator.h) gets its last token and its drafts as rows, its first of them as its
// sampled row (decided as any other) and the draft rows as kCopy logits rows after the padding
// (DraftRows): the postprocessor samples those on the host, in order, as it verifies them; on a
// model with recurrent layers it also names the slots where the backend keeps the sequence's
// state after each of those rows (SequenceSlice::snapshot_slot), to roll back rejected drafts.
// Engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/batch_plan.h"
#include "backend/logit_edit.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "kv/state_checkpoints.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "util/worker_pool.h"

namespace ember {

// One step from its build to its completion. Logits rows: first one per sampled sequence (in
// scheduled order: rows [0, real_rows)), then a decode step's padding rows, then the draft rows
// (draft_rows), then the prompt-logprobs rows (prompt_rows), then the hidden-state rows
// (hidden_runs). A StepBatch may be
// moved while in flight: the spans the backend holds point into its vectors' heap buffers, which a
// move keeps.
struct StepBatch {
  std::vector<ScheduledSequence> scheduled;  // the StepPlan's, in row order
  BatchPlan batch;
  int32_t real_rows = 0;     // sampled rows: one per scheduled sequence with `samples`
  bool decode_only = false;  // every row a decode row (one new token per sequence)
  bool deferred = false;     // launched before the step in flight's ids are read; ids come
                             // through ModelRunner::WaitIds (no kCopy row, no host state needed)

  // [rows] what each logits row delivers, and what the backend needs to make its token.
  std::vector<RowOutput> kinds;
  std::vector<RowSampling> sampling;  // kSample rows' parameters and uniform draw
  std::vector<LogitEdit> edits;       // kArgmax/kSample rows' processors and masks (kMask)
  std::vector<int32_t> ids;           // kArgmax/kSample rows' tokens, filled by the step
  std::span<float> logits;            // kCopy rows (never in a deferred step)
  // [real_rows] the host sampler's inputs for the kCopy sampled rows.
  std::vector<const SamplingParams*> row_params;
  std::vector<SamplerState*> row_states;
  // Constrained rows (never in a deferred step): their masks, built before the launch (a mask
  // depends only on the tokens already accepted). row_masks[r]: the host applies it to sampled
  // row r; null: none, or the backend applies it (as kMask edits in `edits`, or as its bits in
  // `token_masks`, which point into `masks`). Empty: no constrained row.
  std::vector<TokenMask> masks;
  std::vector<const TokenMask*> row_masks;
  std::vector<RowMask> token_masks;  // kArgmax/kSample rows' masks as bits, applied after edits
  // Prompt-logprobs rows (never in a deferred step): per sequence that needs them, positions
  // [first_pos, first_pos + num_rows), whose logits are the kCopy rows from first_row on.
  struct PromptRows {
    size_t scheduled_index = 0;
    int32_t first_pos = 0, num_rows = 0, first_row = 0;
  };
  std::vector<PromptRows> prompt_rows;
  // Draft rows (never in a deferred step), in scheduled order: a sequence verifying k drafts has
  // its sampled row (the logits after its last token: verifies tokens[0]) and k kCopy rows from
  // first_row on, row first_row + j holding the logits after tokens[j] (verifies tokens[j + 1];
  // the last gives the token after every draft).
  struct DraftRows {
    size_t scheduled_index = 0;
    int32_t first_row = 0;
    std::vector<int32_t> tokens;  // the drafts
  };
  std::vector<DraftRows> draft_rows;
  // Hidden-state rows (embedding requests; never in a deferred step): the plan's last
  // num_hidden_rows logits rows, which take no LM head. Per sequence that pools rows of this
  // step, hidden rows [first_row, first_row + num_rows) (counted among the hidden rows) are its
  // positions from first_pos on; `hidden` [num_hidden_rows, hidden_size] receives them.
  struct HiddenRows {
    size_t scheduled_index = 0;
    int32_t first_pos = 0, num_rows = 0, first_row = 0;
  };
  std::vector<HiddenRows> hidden_runs;
  int32_t num_hidden_rows = 0;
  std::vector<float> hidden;
  // With a source that reads hidden states (StepBuilder::set_capture_final_hidden; never in a
  // deferred step): every plan row's last hidden state before the final norm, [num_tokens,
  // hidden_size] (StepOutputs::final_hidden).
  std::vector<float> final_hidden;

  // Recurrent-state copies (a hybrid model with state checkpoints, kv/state_checkpoints.h), in
  // backend slots: before the forward each restore copies a checkpoint into a sequence admitted
  // with a cached prefix; after it each save copies a sequence's state at a checkpoint point
  // into the checkpoint slot reserved for it, committed to its block at completion (or released).
  struct StateCopy {
    int32_t src = 0, dst = 0;
  };
  std::vector<StateCopy> state_restores;
  // A sequence resumed from a prompt-cache tier's state checkpoint (Sequence::tier_state): its
  // bytes, written into its slot before the forward (Backend::CopyStateSlotFromHost).
  struct StateUpload {
    int32_t slot = 0;
    std::vector<uint8_t> state;
  };
  std::vector<StateUpload> state_uploads;
  // A seed (before_forward) is copied before the forward, right after its sequence's state
  // upload: the state a tier restored becomes the pool's checkpoint at the resume point too
  // (`end`: the sequence's computed tokens before the step), so the same prefix hits in the pool
  // next time.
  struct StateSave {
    size_t scheduled_index = 0;
    int32_t end = 0;  // the sequence's computed tokens after the step (a block boundary)
    StateCopy copy;
    bool resolved = false;  // committed or released
    bool before_forward = false;
  };
  std::vector<StateSave> state_saves;

  // Set at launch (StepPostprocessor::Launched), per scheduled sequence.
  std::vector<int32_t> computed_end;  // num_computed_tokens after the step
  std::vector<int32_t> token_index;   // where its sampled token goes in tokens, or -1

  StepOutputs outputs() {
    StepOutputs out{logits, kinds, sampling, ids, edits};
    out.token_masks = token_masks;
    out.defer_ids = deferred;
    out.hidden_rows = num_hidden_rows;
    out.hidden = hidden;
    out.final_hidden = final_hidden;
    return out;
  }
};

class StepBuilder {
 public:
  // All pointers must outlive the builder. It adds decode_steps, decode_rows,
  // decode_padding_rows and masked_rows_* to `counters` (the engine's running totals). `helpers`
  // build a step's masks (shared with the postprocessor: both run on the engine thread).
  StepBuilder(const EngineConfig& config, ModelRunner* runner, kv::KvCacheManager* kv,
              EngineStats* counters, WorkerPool* helpers)
      : config_(config), runner_(runner), kv_(kv), counters_(counters), helpers_(helpers) {}
  // A hybrid model with state checkpoints: steps carry their restores and saves (StepBatch).
  void set_state_checkpoints(kv::StateCheckpoints* checkpoints) { checkpoints_ = checkpoints; }
  // Speculation on a model with recurrent layers: `groups` runs of `per_sequence` consecutive
  // snapshot slots from `first_slot` on; the g-th sequence verifying drafts in a step gets run g
  // as its SequenceSlice::snapshot_slot (the postprocessor rolls back from it). One step with
  // drafts at a time: it completes before the next one launches (MayDefer), so runs are reused.
  void set_state_snapshots(int32_t first_slot, int32_t per_sequence, int32_t groups) {
    snapshot_first_ = first_slot;
    snapshot_per_sequence_ = per_sequence;
    snapshot_groups_ = groups;
  }
  // A draft source that reads the target's hidden states (mtp): every step copies them
  // (StepBatch::final_hidden) and is never deferred.
  void set_capture_final_hidden(bool capture) { capture_final_hidden_ = capture; }

  // The step's rows and whether it may be deferred. Reads only what the step in flight cannot
  // change (its sampled tokens pass through as fed placeholders). From here on the step holds
  // its sequences (Sequence::steps_in_flight) until it completes or fails.
  StepBatch Build(const StepPlan& plan);
  // What each logits row delivers: its kind, its processors and mask, its sampling draw. These
  // read the sequences' accepted tokens, so a step that is not deferred must be given them only
  // after the step in flight has completed.
  void DecideRowOutputs(StepBatch& step);

 private:
  void AddSequenceRows(StepBatch& step);
  // The step's state restores (taken from its sequences) and saves (checkpoint slots reserved).
  void AddStateCopies(StepBatch& step);
  void AddDraftRows(StepBatch& step);
  void AddPromptRows(StepBatch& step);
  void AddHiddenRows(StepBatch& step);
  bool MayDefer(const StepBatch& step) const;
  bool BackendSamples() const;
  void BuildMasks(StepBatch& step);
  void DecideSampledRow(const ScheduledSequence& s, size_t row, StepBatch& step);

  const EngineConfig config_;
  ModelRunner* runner_;
  kv::KvCacheManager* kv_;
  EngineStats* counters_;
  WorkerPool* helpers_;
  kv::StateCheckpoints* checkpoints_ = nullptr;
  int32_t snapshot_first_ = -1, snapshot_per_sequence_ = 0, snapshot_groups_ = 0;
  bool capture_final_hidden_ = false;
  std::vector<int32_t> chunk_;  // scratch: one sequence's new tokens
};

}  // namespace ember
