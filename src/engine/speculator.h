// Speculator: speculative decoding's engine-side policy. Before each step is scheduled it asks
// its DraftSource for every running sequence that may draft, in one call (Propose ->
// DraftSource::ProposeAll: Sequence::draft; the source also learns which sequences run); after a
// step verified a sequence's drafts the postprocessor reports what was kept (Record), which
// adapts that sequence's draft length (SpecAdapt) and adds to the counters.
//
// Who may draft: a sequence whose request allows it (Sequence::speculates), not in a cool-down,
// decoding (exactly its last token uncomputed, known: no step in flight holds it), with room left
// under max_tokens for the drafts plus one more token, while the batch is small enough
// (SpeculationConfig::max_batch running sequences at most; above it the step is compute-bound and
// drafts would slow every row, so nobody drafts).
//
// Verification (StepBuilder, StepPostprocessor): a sequence with k drafts computes 1 + k rows;
// row j's logits are sampled on the host with the sequence's own state after the tokens before
// it were accepted, exactly as ordinary decoding would sample that position, and the draft d_j is
// kept when the sampled token equals it; the first token that differs (or the token after the
// last draft) ends the step's tokens. For a greedy row this is the argmax; for a sampled row it is
// standard rejection sampling with a point-mass draft (kept with probability p(d), otherwise a
// token from p without d, renormalised) realised with the one uniform ordinary decoding draws for
// that position, so seeded outputs are token-identical with and without speculation.
// Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/draft_source.h"
#include "engine/engine_config.h"
#include "engine/sequence.h"
#include "util/status.h"

namespace ember {

// The configured source: null for kNone, an error naming what is not supported. kDraft and kMtp
// are errors here: their model is loaded by the caller (LoadDraftSource, model_draft_source.h)
// and passed to Engine::Create.
Result<std::unique_ptr<DraftSource>> CreateDraftSource(const SpeculationConfig& config);
// The config's checks without making a source (kDraft: needs draft_model).
Status CheckSpeculationConfig(const SpeculationConfig& config);

class Speculator {
 public:
  // `source` null: speculation off. `counters` must outlive this (spec_* counts).
  Speculator(const SpeculationConfig& config, std::unique_ptr<DraftSource> source,
             EngineStats* counters)
      : config_(config), source_(std::move(source)), counters_(counters) {}

  bool enabled() const { return source_ != nullptr; }
  // Before a step is scheduled: each running sequence's drafts and wants_drafts.
  void Propose(std::span<Sequence* const> running);
  // Whether a step must be batch-invariant (BatchPlan::batch_invariant): with invariant_steps
  // and speculation on, a step that verifies drafts, and every step while at most max_batch
  // sequences run (`running`: after the step's admissions), whether or not one drafts in it, so
  // a request's tokens do not depend on its drafts' timing.
  bool StepInvariant(size_t running, bool verifies_drafts) const {
    return config_.invariant_steps && enabled() &&
           (verifies_drafts || running <= static_cast<size_t>(config_.max_batch));
  }
  // Whether steps must copy their rows' hidden states for the source (DraftSource::
  // wants_hidden_states), and the rows of a sequence after a step (ObserveHidden).
  bool wants_hidden_states() const { return enabled() && source_->wants_hidden_states(); }
  void ObserveHidden(const Sequence& seq, int32_t first_pos, std::span<const float> rows) {
    if (seq.speculates) source_->ObserveHidden(seq.id, first_pos, rows);
  }
  // A step verified `drafted` tokens of seq and kept `accepted` of them.
  void Record(Sequence* seq, int32_t drafted, int32_t accepted);

 private:
  // Drafts this sequence may take now (0: none).
  int32_t DraftRoom(const Sequence& seq) const;

  const SpeculationConfig config_;
  std::unique_ptr<DraftSource> source_;
  EngineStats* counters_;
  // Propose's scratch (kept to reuse their capacity).
  std::vector<DraftJob> jobs_;
  std::vector<Sequence*> drafting_;
  std::vector<kv::SeqId> running_ids_;
};

}  // namespace ember
