#include "engine/speculator.h"

#include <algorithm>

namespace ember {

Status CheckSpeculationConfig(const SpeculationConfig& config) {
  using Method = SpeculationConfig::Method;
  if (config.method != Method::kDraft && config.method != Method::kMtp)
    return CreateDraftSource(config).status();
  SpeculationConfig ngram = config;  // the same checks, less the draft model's loading
  ngram.method = Method::kNgram;
  ngram.draft_model.clear();
  if (config.method == Method::kMtp && !config.draft_model.empty())
    return Status::Error("--draft-model is only used with --spec-method draft (mtp drafts with "
                         "the model's own multi-token-prediction module)");
  EMBER_RETURN_IF_ERROR(CreateDraftSource(ngram).status());
  if (config.method == Method::kMtp) return Status::Ok();
  if (config.draft_model.empty())
    return Status::Error("--spec-method draft needs --draft-model DIR (the draft checkpoint)");
  return Status::Ok();
}

Result<std::unique_ptr<DraftSource>> CreateDraftSource(const SpeculationConfig& config) {
  using Method = SpeculationConfig::Method;
  if (config.method != Method::kDraft && !config.draft_model.empty())
    return Status::Error("--draft-model is only used with --spec-method draft");
  if (config.method == Method::kNone) return std::unique_ptr<DraftSource>();
  if (config.num_spec_tokens < 1 || config.num_spec_tokens > 64)
    return Status::Error("--num-spec-tokens: must be in [1, 64], got " +
                         std::to_string(config.num_spec_tokens));
  if (config.draft_kv_cache_bytes < 0)
    return Status::Error("--draft-kv-cache-bytes: must be >= 0 (0: the default)");
  if (config.method == Method::kDraft) {
    if (config.draft_model.empty())
      return Status::Error("--spec-method draft needs --draft-model DIR (the draft checkpoint)");
    // The draft model is loaded by the caller (app/common.cc: ModelDraftSource::Create) and
    // handed to Engine::Create; the engine cannot make it from a config alone.
    return Status::Error("--spec-method draft: the draft model " + config.draft_model +
                         " must be loaded by the caller (ModelDraftSource)");
  }
  if (config.method == Method::kMtp)  // loaded by the caller like kDraft (LoadDraftSource)
    return Status::Error("--spec-method mtp: the model's multi-token-prediction module must be "
                         "loaded by the caller (LoadDraftSource)");
  if (config.ngram_min < 1 || config.ngram_min > config.ngram_max)
    return Status::Error("speculation: the ngram lengths must satisfy 1 <= min <= max");
  return std::unique_ptr<DraftSource>(
      std::make_unique<NgramDraftSource>(config.ngram_min, config.ngram_max));
}

int32_t Speculator::DraftRoom(const Sequence& seq) const {
  if (seq.steps_in_flight > 0 || seq.last_token_pending || seq.num_uncomputed() != 1 ||
      !seq.started || seq.finish != FinishReason::kNone)
    return 0;
  // Room for the drafts and the token after them within max_tokens.
  const int32_t left = seq.request->request.max_tokens - seq.num_generated();
  return std::min(seq.spec.draft_len(), left - 1);
}

void Speculator::Propose(std::span<Sequence* const> running) {
  const bool back_off = static_cast<int32_t>(running.size()) > config_.max_batch;
  jobs_.clear();
  drafting_.clear();
  running_ids_.clear();
  for (Sequence* seq : running) {
    seq->draft.clear();
    seq->wants_drafts = false;
    running_ids_.push_back(seq->id);
    if (!enabled() || !seq->speculates || back_off) continue;
    if (seq->spec.paused()) {
      seq->spec.Tick();
      continue;
    }
    seq->wants_drafts = true;
    const int32_t room = DraftRoom(*seq);
    if (room <= 0) continue;
    jobs_.push_back(DraftJob{seq->id, seq->tokens, room, &seq->draft});
    drafting_.push_back(seq);
  }
  if (!enabled()) return;
  source_->ProposeAll(jobs_, running_ids_);
  for (Sequence* seq : drafting_)
    if (seq->draft.empty()) seq->spec.RecordEmpty();
}

void Speculator::Record(Sequence* seq, int32_t drafted, int32_t accepted) {
  seq->spec.Record(drafted, accepted);
  seq->accepted_drafts += accepted;
  seq->rejected_drafts += drafted - accepted;
  ++counters_->spec_verify_steps;
  counters_->spec_draft_tokens += drafted;
  counters_->spec_accepted_tokens += accepted;
}

}  // namespace ember
