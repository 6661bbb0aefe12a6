// LiveSequences: the engine's sequences from a request's arrival to their end. It makes a
// request's n sequences (Add), ends them (Finish: out of the scheduler, usage into the request,
// the stream closed once every sample ended), and keeps an ended sequence's object while a
// launched step still has rows of it (Release frees it when that step lets go). Engine thread
// only; the queued-request count it decrements is shared with Engine::Submit (an atomic).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/engine_config.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"

namespace ember {

// A sequence's next event; the first one after its prompt logprobs are complete carries them.
TokenEvent NextEvent(Sequence* seq);

class LiveSequences {
 public:
  // The pointers must outlive this. It adds requests_submitted, prompt_tokens, generated_tokens,
  // requests_finished and requests_cancelled to `counters` (the engine's running totals).
  // num_spec_tokens > 0: speculation is on; a request that allows it drafts up to that many.
  // jump_forward: constrained samples without logprobs jump forward (EngineConfig).
  LiveSequences(Scheduler* scheduler, std::atomic<int32_t>* num_queued, EngineStats* counters,
                int32_t num_spec_tokens = 0, bool jump_forward = false)
      : scheduler_(scheduler),
        num_queued_(num_queued),
        counters_(counters),
        num_spec_tokens_(num_spec_tokens),
        jump_forward_(jump_forward) {}

  bool empty() const { return live_.empty(); }
  // The request's n sequences, waiting in the scheduler.
  void Add(const std::shared_ptr<RequestState>& state);
  // The request left the queue (counted once, by its first sample that runs or ends).
  void MarkAdmitted(RequestState& state);
  // Ends the sequence with a last event carrying only `reason` (no token), then Finish.
  void EndWithoutToken(Sequence* seq, FinishReason reason);
  // Ends the sequence (its last event already pushed): frees its blocks, accounts its usage.
  void Finish(Sequence* seq, FinishReason reason);
  // A step no longer holds these sequences (Sequence::steps_in_flight).
  void Release(std::span<const ScheduledSequence> scheduled);
  void CancelAll();      // cancels every live sequence's stream (ReapCancelled then ends them)
  void ReapCancelled();  // ends the sequences whose stream a caller cancelled
  // Closes the streams of requests whose last sample ended (after Stats() include them).
  void CloseEndedStreams();

 private:
  Scheduler* scheduler_;
  std::atomic<int32_t>* num_queued_;
  EngineStats* counters_;
  int32_t num_spec_tokens_;
  bool jump_forward_;
  std::unordered_map<kv::SeqId, std::unique_ptr<Sequence>> live_;
  kv::SeqId next_seq_id_ = 1;
  // Ended sequences that a step in flight still has rows of (destroyed once it completes).
  std::vector<std::unique_ptr<Sequence>> retired_;
  std::vector<std::shared_ptr<ResponseStream>> streams_to_close_;  // ended since the last close
};

}  // namespace ember
