#include "engine/live_sequences.h"

#include "engine/clock.h"

namespace ember {

TokenEvent NextEvent(Sequence* seq) {
  TokenEvent event;
  event.sample_index = seq->sample_index;
  if (seq->prompt_logprobs_ready) {
    event.prompt_logprobs = std::move(seq->prompt_logprobs);
    seq->prompt_logprobs.clear();
    seq->prompt_logprobs_ready = false;
  }
  return event;
}

void LiveSequences::Add(const std::shared_ptr<RequestState>& state) {
  ++counters_->requests_submitted;
  counters_->prompt_tokens += state->usage.prompt_tokens;
  for (int32_t i = 0; i < state->request.n; ++i) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_seq_id_++;
    seq->sample_index = i;
    seq->request = state;
    seq->tokens = state->request.prompt_ids;
    seq->prompt_len = seq->num_tokens();
    seq->sampler = std::make_unique<SamplerState>(state->request.sampling, static_cast<uint64_t>(i),
                                                  seq->tokens, state->stop_ids);
    if (state->request.constraint) seq->constraint = state->request.constraint->Clone();
    // Jump-forward leaves out samples with logprobs: each of their tokens reports its own row's.
    if (jump_forward_ && seq->constraint && !state->request.sampling.wants_logprobs()) {
      seq->jumps_forward = true;
      state->usage.jump_forward = true;
    }
    if (num_spec_tokens_ > 0 && state->request.speculate && state->request.max_tokens > 0) {
      seq->speculates = true;
      seq->spec = SpecAdapt(num_spec_tokens_);
      state->usage.speculative = true;
    }
    if (i == 0 && state->request.prompt_logprobs >= 0) {
      seq->needs_prompt_logits = true;
      seq->prompt_logprobs.resize(static_cast<size_t>(seq->prompt_len - 1));
    }
    scheduler_->AddWaiting(seq.get());
    live_.emplace(seq->id, std::move(seq));
  }
}

void LiveSequences::MarkAdmitted(RequestState& state) {
  if (state.admitted) return;
  state.admitted = true;
  num_queued_->fetch_sub(1);
}

void LiveSequences::EndWithoutToken(Sequence* seq, FinishReason reason) {
  TokenEvent event = NextEvent(seq);
  event.finish = reason;
  event.time_ns = NowNs();
  seq->request->stream->Push(std::move(event));
  Finish(seq, reason);
}

void LiveSequences::Finish(Sequence* seq, FinishReason reason) {
  // A token still being chosen by a step in flight is not the sequence's: it ends before it.
  while (!seq->tokens.empty() && seq->tokens.back() < 0) seq->tokens.pop_back();
  seq->finish = reason;
  scheduler_->Remove(seq);
  RequestState& state = *seq->request;
  MarkAdmitted(state);
  if (seq->sample_index == 0) {
    state.prompt_prefilled = true;  // let siblings start even if sample 0 ended early
    state.usage.cached_tokens = seq->num_cached_prompt_tokens;
  }
  state.usage.completion_tokens += seq->num_generated();
  state.usage.accepted_prediction_tokens += seq->accepted_drafts;
  state.usage.rejected_prediction_tokens += seq->rejected_drafts;
  state.usage.forced_tokens += seq->forced_tokens;
  counters_->generated_tokens += seq->num_generated();
  if (--state.num_unfinished == 0) {
    state.stream->SetUsage(state.usage);
    streams_to_close_.push_back(state.stream);  // closed after the stats are published
    ++counters_->requests_finished;
    if (reason == FinishReason::kCancelled) ++counters_->requests_cancelled;
  }
  auto it = live_.find(seq->id);
  // A launched step still has rows of it (their K/V goes to blocks it no longer owns, ahead of
  // any later step in the device's order): keep the object until that step completes.
  if (seq->steps_in_flight > 0) retired_.push_back(std::move(it->second));
  live_.erase(it);  // destroys seq unless retired
}

void LiveSequences::Release(std::span<const ScheduledSequence> scheduled) {
  for (const ScheduledSequence& s : scheduled) --s.seq->steps_in_flight;
  std::erase_if(retired_, [](const auto& seq) { return seq->steps_in_flight == 0; });
}

void LiveSequences::CancelAll() {
  for (auto& [id, seq] : live_) seq->request->stream->Cancel();
}

void LiveSequences::ReapCancelled() {
  std::vector<Sequence*> cancelled;
  for (auto& [id, seq] : live_) {
    if (seq->request->stream->cancelled()) cancelled.push_back(seq.get());
  }
  for (Sequence* seq : cancelled) EndWithoutToken(seq, FinishReason::kCancelled);
}

void LiveSequences::CloseEndedStreams() {
  for (const std::shared_ptr<ResponseStream>& stream : streams_to_close_) stream->Close();
  streams_to_close_.clear();
}

}  // namespace ember
