// DraftSource: proposes the tokens a sequence is likely to generate next, for speculative decoding
// (speculator.h verifies them in the batch). One interface for every source: `ngram` (prompt
// lookup: the sequence's own history, no weights; below), `draft` (a small model of the same
// vocabulary, model_draft_source.h) and `mtp` (the target checkpoint's multi-token-prediction
// module, the same class; it also reads the target's hidden states). A source sees
// only a sequence's known tokens (prompt + accepted output, no placeholder) and returns at most
// `max_tokens` proposals; proposing nothing is always allowed. Its proposals never change the
// output (verification keeps exactly the target's tokens), only how many tokens a step yields.
// Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace ember {

// One sequence's proposal request in a step (DraftSource::ProposeAll).
struct DraftJob {
  kv::SeqId seq = 0;
  std::span<const int32_t> tokens;  // prompt + accepted output
  int32_t max_tokens = 0;           // >= 1
  std::vector<int32_t>* out = nullptr;
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual std::string name() const = 0;
  // Appends up to max_tokens proposed continuations of `tokens` to *out (cleared first).
  virtual void Propose(kv::SeqId seq, std::span<const int32_t> tokens, int32_t max_tokens,
                       std::vector<int32_t>* out) = 0;
  // One step's proposals for every sequence that drafts now; `running` names every running
  // sequence (drafting or not): a source with per-sequence state may drop the state of any other
  // id (finished, cancelled, preempted). Default: Propose for each job, in order.
  virtual void ProposeAll(std::span<const DraftJob> jobs, std::span<const kv::SeqId> running);
  // A source that conditions on the target's hidden states (`mtp`) says so: the engine then
  // copies every step row's last hidden state before the final norm (StepOutputs::final_hidden;
  // such steps are never deferred) and, after each step, hands a drafting sequence's rows to
  // ObserveHidden: `rows` [n, hidden_size] at positions first_pos on, computed whether or not
  // their tokens are kept (a rejected position is computed again by a later step, whose rows
  // replace these).
  virtual bool wants_hidden_states() const { return false; }
  virtual void ObserveHidden(kv::SeqId /*seq*/, int32_t /*first_pos*/,
                             std::span<const float> /*rows*/) {}
};

// Prompt lookup ("ngram"): the longest suffix of the history, from max_ngram tokens down to
// min_ngram, that occurred earlier in the history; the tokens that followed that occurrence are
// the proposal (as many as exist, up to max_tokens). Of several occurrences, the most recent one
// followed by max_tokens tokens, else the one followed by the most (the earliest: inside a run of
// one token the latest occurrence is followed by one token only). Stateless; O(history *
// max_ngram) per call.
class NgramDraftSource : public DraftSource {
 public:
  NgramDraftSource(int32_t min_ngram, int32_t max_ngram);
  std::string name() const override { return "ngram"; }
  void Propose(kv::SeqId seq, std::span<const int32_t> tokens, int32_t max_tokens,
               std::vector<int32_t>* out) override;

 private:
  int32_t min_ngram_, max_ngram_;
};

// The n-gram lookup itself (NgramDraftSource's rule), for tests and other sources.
void ProposeFromHistory(std::span<const int32_t> tokens, int32_t min_ngram, int32_t max_ngram,
                        int32_t max_tokens, std::vector<int32_t>* out);

}  // namespace ember
