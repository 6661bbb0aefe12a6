#include "engine/step_builder.h"

#include <algorithm>

#include "sampling/logit_edits.h"
#include "util/check.h"

namespace ember {

namespace {

// A constrained row whose token the backend makes sends its mask in the smaller form: as kMask
// edits (16 bytes a masked id) when at most this many ids are masked, else as packed bits (4
// bytes per 32 ids, however few it allows: 16 KB at a 128k vocabulary). So the edits serve only
// masks that allow nearly everything (fewer than vocab / 128 masked); JSON structure, enums,
// numbers and bounded strings allow few tokens and go as bits. Either way the row's logits stay
// where they are, and listing a few masked ids from the bits is as cheap as copying the bits.
int64_t MaxMaskEdits(int32_t vocab_size) {
  return static_cast<int64_t>((static_cast<size_t>(vocab_size) + 31) / 32 * sizeof(uint32_t) /
                              sizeof(LogitEdit));
}

// A token mask (with its `masked` ids listed) as kMask edits of `row`, after the row's processor
// edits (from first_edit on): each of those edits whose element is masked turns into a kMask (an
// element's edits stay adjacent), every other masked element gets one.
void AppendMaskEdits(const TokenMask& mask, int32_t row, size_t first_edit,
                     std::vector<LogitEdit>& edits) {
  std::vector<int32_t> edited;
  for (size_t i = first_edit; i < edits.size(); ++i) {
    edited.push_back(edits[i].token);
    if (!mask.Allows(edits[i].token)) edits[i].op = LogitEditOp::kMask;
  }
  std::sort(edited.begin(), edited.end());
  for (int32_t id : mask.masked)
    if (!std::binary_search(edited.begin(), edited.end(), id))
      edits.push_back(LogitEdit{row, id, LogitEditOp::kMask, 0.0f});
}

// Whether the backend makes this row's token (argmax, or a draw where the backend samples): no
// logprobs wanted. A constrained row's mask then goes along (kMask edits or packed bits).
bool BackendMakesToken(const Sequence& seq, bool backend_samples) {
  const SamplingParams& p = seq.request->request.sampling;
  return BackendCanSample(p) && (p.is_greedy() || backend_samples);
}

// Whether the backend makes this row's token from state the host already has, so the step may
// launch before the previous step's tokens are known: no processor that depends on the tokens
// (penalties, DRY; the min_tokens mask while it applies: the state's count may lag by the one
// token in flight, and once it reaches min_tokens the true count has too), and no speculation
// wanted (a sequence drafts only from known tokens, so its steps complete before the next is
// built).
bool FedRowOk(const Sequence& seq, bool backend_samples) {
  const SamplingParams& p = seq.request->request.sampling;
  return seq.constraint == nullptr && !seq.wants_drafts &&
         BackendMakesToken(seq, backend_samples) &&
         !p.has_penalties() && !p.has_dry() &&
         (p.min_tokens == 0 || seq.sampler->num_output_tokens() >= p.min_tokens);
}

// Whether a verifying sequence's draft rows take their tokens from the backend (kArgmax) rather
// than copying their logits to the host: a greedy row the backend decides (BackendMakesToken)
// with no processor at all at any of the drafts' positions (no constraint, logit bias,
// penalties, DRY or min_tokens mask), so row j's token is the argmax of its logits, as ordinary
// decoding would take it on the backend there. A 128k vocabulary's logits are 0.5 MB a row.
bool DraftRowsOnBackend(const Sequence& seq) {
  const SamplingParams& p = seq.request->request.sampling;
  return p.is_greedy() && seq.constraint == nullptr && BackendMakesToken(seq, false) &&
         p.logit_bias.empty() && !p.has_penalties() && !p.has_dry() &&
         (p.min_tokens == 0 || seq.sampler->num_output_tokens() >= p.min_tokens);
}

}  // namespace

StepBatch StepBuilder::Build(const StepPlan& plan) {
  StepBatch step;
  step.scheduled = plan.scheduled;
  AddSequenceRows(step);
  AddStateCopies(step);
  // A decode step (one sampled row per sequence) is padded to its graph bucket's row count.
  const BatchPlan& batch = step.batch;
  step.real_rows = static_cast<int32_t>(batch.logits_rows.size());
  step.decode_only = batch.num_tokens() == batch.num_seqs() && step.real_rows == batch.num_seqs() &&
                     std::none_of(step.scheduled.begin(), step.scheduled.end(), [](const auto& s) {
                       return s.seq->needs_prompt_logits || s.seq->embeds();
                     });
  if (step.decode_only) {
    ++counters_->decode_steps;
    counters_->decode_rows += step.real_rows;
    counters_->decode_padding_rows += runner_->PadToGraphBucket(step.batch);
  }
  AddDraftRows(step);
  AddPromptRows(step);
  AddHiddenRows(step);
  if (capture_final_hidden_)
    step.final_hidden.assign(static_cast<size_t>(batch.num_tokens()) *
                                 static_cast<size_t>(runner_->model().config().hidden_size),
                             0.0f);
  step.deferred = MayDefer(step);
  return step;
}

// Each scheduled sequence's new tokens, at its computed position, over its block table; a
// sampled sequence's last row is a logits row. A sequence with drafts: its last token and its
// drafts, the last token's row its sampled row (decided as any sampled row: its processors and
// mask read only accepted tokens); the draft rows come in AddDraftRows.
void StepBuilder::AddSequenceRows(StepBatch& step) {
  step.batch.block_size = config_.block_size;
  for (const ScheduledSequence& s : step.scheduled) {
    Sequence* seq = s.seq;
    ++seq->steps_in_flight;  // from here on the step holds it (Complete / Fail let go)
    // Placeholders (-1 - r) of the step in flight pass through as fed tokens: it is the model's
    // previous Forward.
    const int32_t num_known = s.num_new_tokens - s.num_draft;
    chunk_.assign(seq->tokens.begin() + seq->num_computed_tokens,
                  seq->tokens.begin() + seq->num_computed_tokens + num_known);
    if (s.num_draft == 0) {
      step.batch.AddSequence(chunk_, seq->num_computed_tokens, kv_->BlockTable(seq->id),
                             s.samples);
      step.batch.seqs.back().state_slot = std::max(seq->state_slot, 0);
      step.batch.seqs.back().lora_slot = seq->request->lora_slot;
      continue;
    }
    CHECK(s.samples && num_known == 1 && !seq->draft.empty());
    chunk_.insert(chunk_.end(), seq->draft.begin(), seq->draft.begin() + s.num_draft);
    step.batch.AddSequence(chunk_, seq->num_computed_tokens, kv_->BlockTable(seq->id), false);
    step.batch.seqs.back().state_slot = std::max(seq->state_slot, 0);
    step.batch.seqs.back().lora_slot = seq->request->lora_slot;
    step.batch.logits_rows.push_back(step.batch.seqs.back().query_start);
  }
}

// A sequence admitted with a cached prefix restores the checkpoint at its end (a pool slot's, or
// the bytes a prompt-cache tier read: Sequence::tier_state, which are also seeded into a
// checkpoint slot for the block they were read for); a chunk that ends at a checkpoint point
// saves the state it leaves (when no checkpoint slot can be had, every one pending, it saves
// nothing: a later prompt hits a shorter prefix).
void StepBuilder::AddStateCopies(StepBatch& step) {
  if (checkpoints_ == nullptr) return;
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const ScheduledSequence& s = step.scheduled[i];
    Sequence* seq = s.seq;
    if (seq->state_slot < 0) continue;
    if (!seq->tier_state.empty()) {
      step.state_uploads.push_back({seq->state_slot, std::move(seq->tier_state)});
      seq->tier_state.clear();
      if (const int32_t slot = checkpoints_->Reserve(); slot >= 0)
        step.state_saves.push_back(
            {i, seq->num_computed_tokens, {seq->state_slot, slot}, false, /*before_forward=*/true});
    }
    if (seq->restore_state_from >= 0) {
      step.state_restores.push_back({seq->restore_state_from, seq->state_slot});
      seq->restore_state_from = -1;
    }
    if (!s.saves_state) continue;
    const int32_t slot = checkpoints_->Reserve();
    if (slot < 0) continue;
    step.state_saves.push_back(
        {i, seq->num_computed_tokens + s.num_new_tokens, {seq->state_slot, slot}, false});
  }
}

// A sequence verifying drafts: one logits row per draft (kCopy, or kArgmax where
// DraftRowsOnBackend), after the sampled and padding rows
// (the sampled rows keep rows 0..real_rows-1); with recurrent layers, its snapshot slots.
void StepBuilder::AddDraftRows(StepBatch& step) {
  BatchPlan& batch = step.batch;
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const ScheduledSequence& s = step.scheduled[i];
    if (s.num_draft == 0) continue;
    if (snapshot_first_ >= 0) {
      const auto group = static_cast<int32_t>(step.draft_rows.size());
      CHECK(group < snapshot_groups_ && s.num_draft <= snapshot_per_sequence_)
          << "drafting sequence " << group << " with " << s.num_draft << " drafts: only "
          << snapshot_groups_ << " snapshot runs of " << snapshot_per_sequence_;
      batch.seqs[i].snapshot_slot = snapshot_first_ + group * snapshot_per_sequence_;
    }
    StepBatch::DraftRows run;
    run.scheduled_index = i;
    run.first_row = static_cast<int32_t>(batch.logits_rows.size());
    run.tokens.assign(s.seq->draft.begin(), s.seq->draft.begin() + s.num_draft);
    for (int32_t r = 1; r <= s.num_draft; ++r)
      batch.logits_rows.push_back(batch.seqs[i].query_start + r);
    step.draft_rows.push_back(std::move(run));
  }
}

// Every prompt row of a sequence that needs prompt logprobs gets a logits row, after the sampled
// and padding rows (so the sampled rows keep rows 0..real_rows-1), except the prompt's last row:
// its logits are the sampled row's (or unused, with max_tokens 0). The scheduler bounded these
// rows (SchedulerConfig::max_prompt_logits_rows).
void StepBuilder::AddPromptRows(StepBatch& step) {
  BatchPlan& batch = step.batch;
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const Sequence& seq = *step.scheduled[i].seq;
    if (!seq.needs_prompt_logits) continue;
    const int32_t first_pos = seq.num_computed_tokens;
    const int32_t end = std::min(first_pos + step.scheduled[i].num_new_tokens, seq.prompt_len - 1);
    if (end <= first_pos) continue;
    StepBatch::PromptRows run;
    run.scheduled_index = i;
    run.first_pos = first_pos;
    run.num_rows = end - first_pos;
    run.first_row = static_cast<int32_t>(batch.logits_rows.size());
    for (int32_t r = 0; r < run.num_rows; ++r)
      batch.logits_rows.push_back(batch.seqs[i].query_start + r);
    step.prompt_rows.push_back(run);
  }
}

// The rows whose final hidden states an embedding request pools (PooledPositions: its last
// prompt row, or every row for mean pooling), after every other logits row: they take no LM head.
void StepBuilder::AddHiddenRows(StepBatch& step) {
  BatchPlan& batch = step.batch;
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const Sequence& seq = *step.scheduled[i].seq;
    if (!seq.embeds()) continue;
    const PositionRange pooled =
        PooledPositions(seq.request->request.pooling.kind, seq.prompt_len,
                        seq.num_computed_tokens, step.scheduled[i].num_new_tokens);
    if (pooled.size() == 0) continue;
    StepBatch::HiddenRows run;
    run.scheduled_index = i;
    run.first_pos = pooled.begin;
    run.num_rows = pooled.size();
    run.first_row = step.num_hidden_rows;
    const int32_t first_plan_row =
        batch.seqs[i].query_start + (pooled.begin - seq.num_computed_tokens);
    for (int32_t r = 0; r < run.num_rows; ++r) batch.logits_rows.push_back(first_plan_row + r);
    step.num_hidden_rows += run.num_rows;
    step.hidden_runs.push_back(run);
  }
  step.hidden.assign(static_cast<size_t>(step.num_hidden_rows) *
                         static_cast<size_t>(runner_->model().config().hidden_size),
                     0.0f);
}

bool StepBuilder::BackendSamples() const {
  return runner_->prefers_backend_sampling() ||
         config_.backend_sampling == EngineConfig::BackendSampling::kAlways;
}

// A step may launch before the step in flight's ids are read when every sampled row's token is
// made by the backend from state the host already has (FedRowOk), no logits or hidden states come
// to the host and no embedding request has rows in it.
bool StepBuilder::MayDefer(const StepBatch& step) const {
  if (!config_.overlap_steps || !step.prompt_rows.empty() || !step.draft_rows.empty() ||
      !step.final_hidden.empty())
    return false;
  const bool backend_samples = BackendSamples();
  // An embedding request's step completes before the next is scheduled, so a preemption never
  // meets its pooled rows half-accounted.
  return std::all_of(step.scheduled.begin(), step.scheduled.end(), [&](const auto& s) {
    return !s.seq->embeds() && (!s.samples || FedRowOk(*s.seq, backend_samples));
  });
}

// Rows that want no logprobs get their token from the backend: their processors (bias,
// penalties, min_tokens mask) as a sparse edit list applied where the logits are, then the
// argmax, or a draw with the sequence's next uniform where the backend prefers it. Logprobs rows
// (and sampled rows on a backend that prefers the host) copy their logits to the host sampler.
void StepBuilder::DecideRowOutputs(StepBatch& step) {
  // The hidden-state rows (the last ones) take no LM head: no logits, no kind.
  const size_t num_rows = step.batch.logits_rows.size() - static_cast<size_t>(step.num_hidden_rows);
  step.logits = runner_->LogitsBuffer(num_rows);
  // Padding rows (past real_rows): an argmax nobody reads.
  step.kinds.assign(num_rows, RowOutput::kArgmax);
  std::fill(step.kinds.begin(), step.kinds.begin() + step.real_rows, RowOutput::kCopy);
  for (const StepBatch::PromptRows& run : step.prompt_rows)
    std::fill_n(step.kinds.begin() + run.first_row, run.num_rows, RowOutput::kCopy);
  for (const StepBatch::DraftRows& run : step.draft_rows)
    std::fill_n(step.kinds.begin() + run.first_row, run.tokens.size(),
                DraftRowsOnBackend(*step.scheduled[run.scheduled_index].seq) ? RowOutput::kArgmax
                                                                              : RowOutput::kCopy);
  step.sampling.assign(num_rows, RowSampling{});
  step.ids.assign(num_rows, 0);
  BuildMasks(step);
  for (const ScheduledSequence& s : step.scheduled) {
    if (!s.samples) continue;
    const size_t row = step.row_params.size();
    step.row_params.push_back(&s.seq->request->request.sampling);
    step.row_states.push_back(s.seq->sampler.get());
    DecideSampledRow(s, row, step);
  }
}

// Sampled row `row` of sequence s: kCopy (the host samples it, with its mask) unless the backend
// makes its token; then kArgmax or kSample with the row's processors as edits and its mask
// after them (kMask edits, or bits: BuildMasks built it in the form MaxMaskEdits picks). A
// constrained row whose mask allows nothing stays kCopy (the host ends it).
void StepBuilder::DecideSampledRow(const ScheduledSequence& s, size_t row, StepBatch& step) {
  const SamplingParams& p = s.seq->request->request.sampling;
  const TokenMask* mask = step.row_masks.empty() ? nullptr : step.row_masks[row];
  const bool backend = BackendMakesToken(*s.seq, BackendSamples());
  if (mask != nullptr && (!backend || mask->num_allowed == 0)) ++counters_->masked_rows_host;
  if (!backend || (mask != nullptr && mask->num_allowed == 0)) return;
  if (p.is_greedy()) {
    step.kinds[row] = RowOutput::kArgmax;
  } else {
    step.kinds[row] = RowOutput::kSample;
    step.sampling[row] = {p.temperature, p.top_k, p.top_p, p.min_p, s.seq->sampler->NextUniform()};
  }
  const size_t first_edit = step.edits.size();
  AppendLogitEdits(p, *s.seq->sampler, static_cast<int32_t>(row), step.edits);
  if (mask == nullptr) return;
  CHECK(mask->form == TokenMask::Form::kBits) << "row " << row;
  if (mask->masked_listed()) {
    AppendMaskEdits(*mask, static_cast<int32_t>(row), first_edit, step.edits);
    ++counters_->masked_rows_edits;
  } else {
    step.token_masks.push_back(RowMask{static_cast<int32_t>(row), mask->bits});
    ++counters_->masked_rows_bits;
  }
  step.row_masks[row] = nullptr;  // the backend applies it
}

// The masks of the step's constrained rows (the tokens they may take next), built before the
// launch on the helper threads, each in its consumer's form: packed bits (with the masked ids
// listed when MaxMaskEdits allows) where the backend makes the row's token, 0/1 bytes where the
// host samples it. A state seen before costs a copy (MaskCache in json_constraint.h; as bits, a
// 16 KB copy at a 128k vocabulary). row_masks[r] points to row r's.
void StepBuilder::BuildMasks(StepBatch& step) {
  struct Job {
    const TokenConstraint* constraint;
    TokenMask::Form form;
  };
  std::vector<Job> jobs;
  const bool backend_samples = BackendSamples();
  for (const ScheduledSequence& s : step.scheduled) {
    if (!s.samples || s.seq->constraint == nullptr) continue;
    jobs.push_back({s.seq->constraint.get(), BackendMakesToken(*s.seq, backend_samples)
                                                 ? TokenMask::Form::kBits
                                                 : TokenMask::Form::kBytes});
  }
  if (jobs.empty()) return;
  CHECK(!step.deferred);
  step.masks.resize(jobs.size());
  const int64_t max_edits = MaxMaskEdits(runner_->vocab_size());
  helpers_->ForEach(jobs.size(), [&](size_t i) {
    step.masks[i].Build(*jobs[i].constraint, jobs[i].form, max_edits);
  });
  step.row_masks.assign(static_cast<size_t>(step.real_rows), nullptr);
  size_t row = 0, m = 0;
  for (const ScheduledSequence& s : step.scheduled) {
    if (!s.samples) continue;
    const size_t r = row++;
    if (s.seq->constraint != nullptr) step.row_masks[r] = &step.masks[m++];
  }
}

}  // namespace ember
