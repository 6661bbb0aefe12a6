#include "engine/step_postprocessor.h"

#include <algorithm>
#include <thread>

#include "engine/clock.h"
#include "sampling/processors.h"
#include "util/check.h"
#include "util/log.h"
#include "util/parallel.h"

namespace ember {

void StepPostprocessor::Launched(StepBatch& step) {
  step.computed_end.reserve(step.scheduled.size());
  step.token_index.reserve(step.scheduled.size());
  int32_t row = 0;
  for (const ScheduledSequence& s : step.scheduled) {
    Sequence* seq = s.seq;
    seq->num_computed_tokens += s.num_new_tokens;
    step.computed_end.push_back(seq->num_computed_tokens);
    if (!s.samples) {
      step.token_index.push_back(-1);
      continue;
    }
    step.token_index.push_back(seq->num_tokens());
    seq->tokens.push_back(-1 - row++);
    if (seq->num_generated() >= seq->request->request.max_tokens) seq->last_token_pending = true;
  }
}

void StepPostprocessor::Fail(const StepBatch& step) {
  for (const ScheduledSequence& s : step.scheduled) {
    if (s.seq->finish != FinishReason::kNone) continue;  // ended while it was being planned
    sequences_->EndWithoutToken(s.seq, FinishReason::kError);
  }
  ReleaseStateSaves(step);
  sequences_->Release(step.scheduled);
}

void StepPostprocessor::Complete(StepBatch& step) {
  if (step.deferred) {
    Status st = runner_->WaitIds(step.decode_only);
    if (!st.ok()) {
      LOG_ERROR << "forward step failed: " << st.message();
      Fail(step);
      return;
    }
  }
  const int64_t finish_start = NowNs();
  if (!step.deferred) {
    SampleOnHost(step);
    ComputePromptLogprobs(step);
    PoolHiddenRows(step);
    ObserveHidden(step);
  }
  size_t row = 0, next_draft = 0;
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const ScheduledSequence& s = step.scheduled[i];
    const size_t r = row;
    if (s.samples) ++row;
    const StepBatch::DraftRows* drafts = nullptr;
    if (next_draft < step.draft_rows.size() && step.draft_rows[next_draft].scheduled_index == i)
      drafts = &step.draft_rows[next_draft++];
    if (s.seq->finish != FinishReason::kNone) continue;  // ended while this step was in flight
    if (drafts != nullptr) {
      VerifyDrafts(step, i, r, *drafts);
      continue;
    }
    const bool prompt_done = CommitComputed(step, i, step.computed_end[i]);
    CommitStateSaves(step, i);
    if (s.samples) {
      AcceptToken(step, i, r);
    } else if (s.seq->embeds() && prompt_done) {
      EmitEmbedding(s.seq);
    } else if (s.seq->request->request.max_tokens == 0 && prompt_done) {  // prompt-only request
      sequences_->EndWithoutToken(s.seq, FinishReason::kLength);
    }
  }
  if (!step.deferred) JumpForward(step);  // a deferred step has no constrained row
  ReleaseStateSaves(step);
  sequences_->Release(step.scheduled);
  counters_->finish_ns += NowNs() - finish_start;
}

void StepPostprocessor::SampleOnHost(const StepBatch& step) {
  const auto real_rows = static_cast<size_t>(step.real_rows);
  row_outputs_.assign(real_rows, SampleOutput{});
  host_skip_.assign(real_rows, 0);
  for (size_t r = 0; r < real_rows; ++r) host_skip_[r] = step.kinds[r] != RowOutput::kCopy;
  const int32_t vocab = runner_->vocab_size();
  SampleRows(step.logits.first(real_rows * static_cast<size_t>(vocab)), vocab, step.row_params,
             step.row_states, row_outputs_, host_skip_, step.row_masks);
}

// The logits row of prompt position p gives the logprob of the prompt token at p + 1, as a
// generated token's is computed (TokenLogprobs on the raw row: no processor ever touched a
// kCopy prompt row), rows in parallel.
void StepPostprocessor::ComputePromptLogprobs(const StepBatch& step) {
  struct Row {
    Sequence* seq;
    int32_t pos;
    size_t logits_row;
  };
  std::vector<Row> rows;
  for (const StepBatch::PromptRows& run : step.prompt_rows) {
    Sequence* seq = step.scheduled[run.scheduled_index].seq;
    if (seq->finish != FinishReason::kNone) continue;
    for (int32_t r = 0; r < run.num_rows; ++r)
      rows.push_back({seq, run.first_pos + r, static_cast<size_t>(run.first_row + r)});
  }
  const auto vocab = static_cast<size_t>(runner_->vocab_size());
  ForEachOnThreads(rows.size(), std::thread::hardware_concurrency(), [&](size_t i) {
    const Row& row = rows[i];
    const std::span<const float> logits = step.logits.subspan(row.logits_row * vocab, vocab);
    const int32_t token = row.seq->tokens[static_cast<size_t>(row.pos) + 1];
    SampleOutput raw = TokenLogprobs(logits, token, row.seq->request->request.prompt_logprobs);
    PromptLogprob& out = row.seq->prompt_logprobs[static_cast<size_t>(row.pos)];
    out.logprob = raw.logprob;
    out.rank = LogprobRank(logits, token);
    out.top_logprobs = std::move(raw.top_logprobs);
  });
}

// Each embedding request's hidden-state rows of this step join its pooled rows (in position
// order: its chunks complete in order, a step with hidden rows is never deferred).
void StepPostprocessor::PoolHiddenRows(const StepBatch& step) {
  const int32_t dim = runner_->model().config().hidden_size;
  for (const StepBatch::HiddenRows& run : step.hidden_runs) {
    Sequence* seq = step.scheduled[run.scheduled_index].seq;
    if (seq->finish != FinishReason::kNone) continue;
    seq->pooled.Add(std::span<const float>(step.hidden).subspan(
                        static_cast<size_t>(run.first_row) * static_cast<size_t>(dim),
                        static_cast<size_t>(run.num_rows) * static_cast<size_t>(dim)),
                    dim);
  }
}

void StepPostprocessor::ObserveHidden(const StepBatch& step) {
  if (step.final_hidden.empty()) return;
  const auto dim = static_cast<size_t>(runner_->model().config().hidden_size);
  for (size_t i = 0; i < step.scheduled.size(); ++i) {
    const Sequence& seq = *step.scheduled[i].seq;
    if (seq.finish != FinishReason::kNone) continue;
    const SequenceSlice& slice = step.batch.seqs[i];
    speculator_->ObserveHidden(
        seq, step.batch.positions[static_cast<size_t>(slice.query_start)],
        std::span<const float>(step.final_hidden)
            .subspan(static_cast<size_t>(slice.query_start) * dim,
                     static_cast<size_t>(slice.query_len) * dim));
  }
}

// An embedding request's prompt is computed: its one event carries the pooled vector.
void StepPostprocessor::EmitEmbedding(Sequence* seq) {
  TokenEvent event = NextEvent(seq);
  event.embedding = seq->pooled.Finish(seq->request->request.pooling);
  CHECK(!event.embedding.empty()) << "embedding request " << seq->request->request_id
                                  << " computed its prompt without pooling a row";
  event.finish = FinishReason::kStop;
  event.time_ns = NowNs();
  seq->request->stream->Push(std::move(event));
  sequences_->Finish(seq, FinishReason::kStop);
}

void StepPostprocessor::CommitStateSaves(StepBatch& step, size_t i) {
  Sequence* seq = step.scheduled[i].seq;
  for (StepBatch::StateSave& save : step.state_saves) {
    if (save.scheduled_index != i || save.resolved) continue;
    save.resolved = true;
    const int32_t num_blocks = save.end / kv_->block_size();
    const std::optional<kv::BlockRef> end = kv_->ChainEnd(seq->id, num_blocks);
    if (end.has_value()) {
      checkpoints_->Commit(save.copy.dst, *end);
      // Down to the disk tier beside its block (Find: this slot, or the one committed first).
      if (tier_ != nullptr) tier_->OnCheckpoint(*seq, num_blocks, checkpoints_->Find(*end));
    } else {
      checkpoints_->Release(save.copy.dst);
    }
  }
}

void StepPostprocessor::ReleaseStateSaves(const StepBatch& step) {
  for (const StepBatch::StateSave& save : step.state_saves)
    if (!save.resolved) checkpoints_->Release(save.copy.dst);
}

bool StepPostprocessor::CommitComputed(const StepBatch& step, size_t i, int32_t computed_end) {
  Sequence* seq = step.scheduled[i].seq;
  RequestState& state = *seq->request;
  // Blocks of a sequence preempted since the launch are gone; it recomputes them.
  if (seq->started) {
    kv_->CommitComputed(seq->id, seq->tokens, computed_end, state.request.cache_namespace);
    if (tier_ != nullptr) tier_->CommitComputed(*seq, computed_end, *kv_);
  }
  sequences_->MarkAdmitted(state);
  const bool prompt_done = computed_end >= seq->prompt_len;
  if (seq->sample_index == 0 && prompt_done) state.prompt_prefilled = true;
  if (seq->needs_prompt_logits && prompt_done) {
    seq->needs_prompt_logits = false;
    seq->prompt_logprobs_ready = true;  // sent with the next event
  }
  return prompt_done;
}

SampleOutput StepPostprocessor::TakeRowOutput(const StepBatch& step, size_t row) {
  SampleOutput out;
  if (step.kinds[row] != RowOutput::kCopy) {
    out.token_id = step.ids[row];
  } else {
    out = std::move(row_outputs_[row]);
  }
  return out;
}

void StepPostprocessor::AcceptToken(const StepBatch& step, size_t i, size_t row) {
  Sequence* seq = step.scheduled[i].seq;
  SampleOutput out = TakeRowOutput(step, row);
  ++counters_->sampled_seq_steps;
  if (out.token_id < 0) {  // its token constraint allowed nothing
    LOG_WARN << "request " << seq->request->request_id
             << ": the output constraint allows no token";
    sequences_->EndWithoutToken(seq, FinishReason::kError);
    return;
  }
  ++counters_->sampled_tokens;
  Emit(seq, RecordToken(seq, step.token_index[i], std::move(out)));
}

// Row j of the verification is sampled with the state after tokens 0..j-1 were recorded (as
// ordinary decoding would sample that position: same processors, mask and uniform draw); draft j
// is kept when the token equals it. The first token that differs, the token after the last
// draft, a stop, or a row the constraint blocks ends the step's tokens.
void StepPostprocessor::VerifyDrafts(StepBatch& step, size_t i, size_t row,
                                     const StepBatch::DraftRows& run) {
  Sequence* seq = step.scheduled[i].seq;
  const auto k = static_cast<int32_t>(run.tokens.size());
  const int32_t first_index = step.token_index[i];  // the placeholder Launched put
  std::vector<TokenEvent> events;
  int32_t accepted = 0;
  bool blocked = false, rolled_back = true;
  for (int32_t j = 0; j <= k; ++j) {
    const auto draft_row = static_cast<size_t>(run.first_row + j - 1);
    SampleOutput out = j == 0 ? TakeRowOutput(step, row)
                       : step.kinds[draft_row] != RowOutput::kCopy  // DraftRowsOnBackend
                           ? TakeRowOutput(step, draft_row)
                           : SampleRow(step, draft_row, seq);
    if (out.token_id < 0) {
      blocked = true;
      break;
    }
    const int32_t token = out.token_id;
    if (j > 0) seq->tokens.push_back(token);
    events.push_back(RecordToken(seq, first_index + j, std::move(out)));
    const bool kept = j < k && token == run.tokens[static_cast<size_t>(j)];
    accepted += kept ? 1 : 0;
    if (!kept || events.back().finish != FinishReason::kNone) break;
  }
  const auto emitted = static_cast<int32_t>(events.size());
  ++counters_->sampled_seq_steps;
  counters_->sampled_tokens += emitted;
  speculator_->Record(seq, k, accepted);
  // Valid K/V: the last token's row and the rows of the emitted tokens but the last (each equals
  // its draft); the rows of rejected drafts are dropped with the blocks past the new end.
  const int32_t computed_end = step.computed_end[i] - (k + 1 - emitted);
  if (seq->started && emitted > 0) {  // none emitted: it ends below (blocked at row 0)
    seq->num_computed_tokens = computed_end;
    // Exactly the last emitted token is uncomputed.
    CHECK_EQ(computed_end, seq->num_tokens() - 1)
        << "seq " << seq->id << " verified " << k << " drafts, emitted " << emitted;
    kv_->Truncate(seq->id, seq->num_tokens());
    rolled_back = RollBackState(step, i, emitted);
  }
  CommitComputed(step, i, computed_end);
  for (TokenEvent& event : events) Emit(seq, std::move(event));
  if (blocked) {
    LOG_WARN << "request " << seq->request->request_id
             << ": the output constraint allows no token";
    sequences_->EndWithoutToken(seq, FinishReason::kError);
  } else if (!rolled_back && seq->finish == FinishReason::kNone) {
    sequences_->EndWithoutToken(seq, FinishReason::kError);
  }
}

bool StepPostprocessor::RollBackState(const StepBatch& step, size_t i, int32_t rows) {
  const SequenceSlice& slice = step.batch.seqs[i];
  if (slice.snapshot_slot < 0 || rows >= slice.query_len) return true;
  const Sequence* seq = step.scheduled[i].seq;
  CHECK_EQ(slice.state_slot, seq->state_slot) << "seq " << seq->id << " changed state slots";
  Status st = runner_->CopyStateSlot(slice.snapshot_slot + rows - 1, seq->state_slot);
  if (st.ok()) return true;
  LOG_ERROR << "request " << seq->request->request_id
            << ": rolling back its recurrent state failed: " << st.message();
  return false;
}

SampleOutput StepPostprocessor::SampleRow(StepBatch& step, size_t logits_row, Sequence* seq) {
  const auto vocab = static_cast<size_t>(runner_->vocab_size());
  TokenMask mask;
  if (seq->constraint != nullptr) {
    mask.Build(*seq->constraint, TokenMask::Form::kBytes);
    if (mask.num_allowed == 0) return SampleOutput{};
  }
  return Sample(step.logits.subspan(logits_row * vocab, vocab), seq->request->request.sampling,
                *seq->sampler, mask.allowed);
}

TokenEvent StepPostprocessor::RecordToken(Sequence* seq, int32_t index, SampleOutput out) {
  seq->tokens[static_cast<size_t>(index)] = out.token_id;
  seq->sampler->Accept(out.token_id);
  const bool constraint_broken =
      seq->constraint != nullptr && !seq->constraint->Accept(out.token_id);
  if (constraint_broken) {
    LOG_WARN << "request " << seq->request->request_id << ": token " << out.token_id
             << " broke the output constraint (non-finite logits?)";
  }
  TokenEvent event = NextEvent(seq);
  event.token_id = out.token_id;
  event.logprob = out.logprob;
  event.top_logprobs = std::move(out.top_logprobs);
  event.finish = StopReason(*seq, index, out.token_id, constraint_broken,
                            seq->constraint != nullptr && seq->constraint->Done(),
                            &event.stop_token);
  event.time_ns = NowNs();
  return event;
}

// Why a forced token equals what token-by-token decoding samples there: the row that would
// sample it is masked to that one token, so greedy takes it (the argmax of one finite logit) and
// a sampled row draws it whatever its uniform. What that row would change besides the token is
// replayed: the sampler records it (penalty counts, DRY window, output count: XTC's position) and
// a sampled row's one uniform draw is consumed, so every later draw is the one it would have
// been. Not forced: a stop id (its logit is -inf while min_tokens is not reached, the only kMask
// edit a processor makes) and anything past max_tokens. The forced tokens' K/V is computed by
// the next step as a chunk, whose last row gives the logits ordinary decoding would (the CPU
// backend is batch- and chunk-invariant; CUDA with --batch-invariant on, as for speculation).
void StepPostprocessor::JumpForward(const StepBatch& step) {
  std::vector<Sequence*> seqs;
  for (const ScheduledSequence& s : step.scheduled) {
    Sequence* seq = s.seq;
    // It took its token this step (verified drafts leave the last one uncomputed too).
    if (s.samples && seq->jumps_forward && seq->finish == FinishReason::kNone &&
        seq->num_uncomputed() == 1)
      seqs.push_back(seq);
  }
  if (seqs.empty()) return;
  std::vector<std::vector<int32_t>> chains(seqs.size());
  helpers_->ForEach(seqs.size(), [&](size_t i) {
    Sequence* seq = seqs[i];
    const RequestState& state = *seq->request;
    const int32_t room =
        std::min(kMaxForcedTokens, state.request.max_tokens - seq->num_generated());
    std::vector<int32_t>& chain = chains[i];
    while (static_cast<int32_t>(chain.size()) < room && !seq->constraint->Done()) {
      const int32_t id = seq->constraint->ForcedToken();
      if (id < 0 || std::find(state.stop_ids.begin(), state.stop_ids.end(), id) !=
                        state.stop_ids.end())
        break;
      const bool accepted = seq->constraint->Accept(id);
      CHECK(accepted) << "the constraint refused the one token it allows, " << id;
      chain.push_back(id);
    }
  });
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence* seq = seqs[i];
    const bool greedy = seq->request->request.sampling.is_greedy();
    for (size_t j = 0; j < chains[i].size(); ++j) {
      const int32_t id = chains[i][j];
      seq->tokens.push_back(id);
      seq->sampler->Accept(id);
      if (!greedy) seq->sampler->NextUniform();  // the draw its sampled row would have made
      ++seq->forced_tokens;
      ++counters_->forced_tokens;
      TokenEvent event = NextEvent(seq);
      event.token_id = id;
      const bool last = j + 1 == chains[i].size();
      event.finish = StopReason(*seq, seq->num_tokens() - 1, id, /*constraint_broken=*/false,
                                last && seq->constraint->Done(), &event.stop_token);
      event.time_ns = NowNs();
      CHECK(last || event.finish == FinishReason::kNone);
      Emit(seq, std::move(event));
    }
  }
}

void StepPostprocessor::Emit(Sequence* seq, TokenEvent event) {
  const FinishReason finish = event.finish;
  seq->request->stream->Push(std::move(event));
  if (finish != FinishReason::kNone) sequences_->Finish(seq, finish);
}

// Why the sequence ends with the token at `index` (kNone: it goes on). *stop_token: the token is
// a stop id.
FinishReason StepPostprocessor::StopReason(const Sequence& seq, int32_t index, int32_t token,
                                           bool constraint_broken, bool constraint_done,
                                           bool* stop_token) const {
  const RequestState& state = *seq.request;
  *stop_token = false;
  if (constraint_broken) return FinishReason::kError;
  if (std::find(state.stop_ids.begin(), state.stop_ids.end(), token) != state.stop_ids.end()) {
    *stop_token = true;
    return FinishReason::kStop;
  }
  if (constraint_done) return FinishReason::kStop;  // the structured output is complete
  if (index + 1 - seq.prompt_len >= state.request.max_tokens) return FinishReason::kLength;
  return FinishReason::kNone;
}

}  // namespace ember
