#include "engine/model_draft_source.h"

#include <algorithm>

#include "model/gguf_model.h"  // IsGgufFile
#include "util/check.h"
#include "util/log.h"
#include "util/mapped_file.h"  // ReadFileToString

namespace ember {

Result<std::unique_ptr<ModelDraftSource>> ModelDraftSource::Create(std::unique_ptr<Model> draft,
                                                                   int32_t target_vocab_size,
                                                                   const Options& options) {
  CHECK(draft != nullptr);
  const int32_t vocab = draft->config().vocab_size;
  if (vocab != target_vocab_size)
    return Status::Error("--draft-model: its vocabulary has " + std::to_string(vocab) +
                         " tokens, the target's " + std::to_string(target_vocab_size) +
                         " (a draft model must share the target's tokenizer)");
  if (options.kv_cache_bytes < 0) return Status::Error("--draft-kv-cache-bytes: must be >= 0");
  if (options.block_size < 1 || options.max_step_tokens < 1 || options.max_held_hidden_rows < 1)
    return Status::Error(
        "draft model: block_size, max_step_tokens and max_held_hidden_rows must be >= 1");
  const int64_t bytes = options.kv_cache_bytes > 0
                            ? options.kv_cache_bytes
                            : SpeculationConfig::kDefaultDraftKvCacheBytes;
  const int32_t num_blocks =
      kv::NumBlocksForBytes(bytes, draft->KvBytesPerToken(), options.block_size);
  if (num_blocks < 1)
    return Status::Error("--draft-kv-cache-bytes: " + std::to_string(bytes) +
                         " bytes hold no KV block of the draft model (" +
                         std::to_string(draft->KvBytesPerToken() * options.block_size) +
                         " bytes each)");
  EMBER_RETURN_IF_ERROR(draft->AllocateKvCache(num_blocks, options.block_size));
  const int64_t used = int64_t{num_blocks} * options.block_size * draft->KvBytesPerToken();
  LOG_INFO << (draft->is_mtp_module() ? "mtp module: " : "draft model: ")
           << draft->config().model_type << ", "
           << draft->NumParameters() << " parameters; its KV pool " << num_blocks
           << " blocks (" << int64_t{num_blocks} * options.block_size << " tokens, " << used
           << " bytes of --draft-kv-cache-bytes " << bytes << ")";
  return std::unique_ptr<ModelDraftSource>(
      new ModelDraftSource(std::move(draft), options, num_blocks, used));
}

ModelDraftSource::ModelDraftSource(std::unique_ptr<Model> model, const Options& options,
                                   int32_t num_blocks, int64_t kv_cache_bytes)
    : model_(std::move(model)),
      options_(options),
      kv_cache_bytes_(kv_cache_bytes),
      kv_(kv::KvCacheConfig{options.block_size, num_blocks, /*enable_prefix_caching=*/false}),
      mtp_(model_->is_mtp_module()),
      dim_(static_cast<size_t>(model_->config().hidden_size)) {}

void ModelDraftSource::Propose(kv::SeqId seq, std::span<const int32_t> tokens, int32_t max_tokens,
                               std::vector<int32_t>* out) {
  const DraftJob job{seq, tokens, max_tokens, out};
  std::vector<kv::SeqId> running;
  running.reserve(fed_.size() + 1);
  for (const auto& [id, fed] : fed_) running.push_back(id);
  running.push_back(seq);
  ProposeAll(std::span<const DraftJob>(&job, 1), running);
}

void ModelDraftSource::Drop(kv::SeqId seq) {
  kv_.Free(seq);
  fed_.erase(seq);
  last_hidden_.erase(seq);
}

bool ModelDraftSource::Prepare(const DraftJob& job, std::span<const DraftJob> jobs) {
  const auto size = static_cast<int32_t>(job.tokens.size());
  const int32_t slots = size + job.max_tokens - 1;  // tokens, then every draft but the last
  if (size < 1 || job.max_tokens < 1 || slots > model_->config().max_position_embeddings) {
    Drop(job.seq);
    return false;
  }
  std::vector<int32_t>& fed = fed_[job.seq];
  // The draft's KV stays valid over the prefix it shares with the tokens; the last token is fed
  // again in the first round (its logits make the first draft).
  const auto shared = static_cast<int32_t>(
      std::mismatch(fed.begin(), fed.end(), job.tokens.begin(), job.tokens.end()).first -
      fed.begin());
  const int32_t keep = std::min(shared, size - 1);
  fed.resize(static_cast<size_t>(keep));
  kv_.Truncate(job.seq, keep);
  if (kv_.Allocate(job.seq, slots)) return true;
  // Make room: drop sequences that do not draft in this step.
  std::vector<kv::SeqId> idle;
  for (const auto& [id, tokens] : fed_) {
    const bool drafting = std::any_of(jobs.begin(), jobs.end(),
                                      [id = id](const DraftJob& j) { return j.seq == id; });
    if (!drafting) idle.push_back(id);
  }
  for (kv::SeqId id : idle) Drop(id);
  if (kv_.Allocate(job.seq, slots)) return true;
  Drop(job.seq);
  return false;
}

void ModelDraftSource::ProposeAll(std::span<const DraftJob> jobs,
                                  std::span<const kv::SeqId> running) {
  std::vector<kv::SeqId> stale;
  for (const auto& [id, fed] : fed_)
    if (std::find(running.begin(), running.end(), id) == running.end()) stale.push_back(id);
  for (kv::SeqId id : stale) Drop(id);
  std::erase_if(hidden_, [&](const auto& entry) {
    return std::find(running.begin(), running.end(), entry.first) == running.end();
  });
  // mtp: the module's row at position i feeds token i + 1 (its hidden state is the target's h_i).
  std::vector<DraftJob> shifted;
  if (mtp_) {
    for (const DraftJob& job : jobs)
      shifted.push_back({job.seq, job.tokens.empty() ? job.tokens : job.tokens.subspan(1),
                         job.max_tokens, job.out});
    jobs = shifted;
  }
  std::vector<const DraftJob*> active;
  for (const DraftJob& job : jobs) {
    job.out->clear();
    if (Prepare(job, jobs)) active.push_back(&job);
  }
  if (active.empty()) return;
  Status st = CatchUp(active);
  if (st.ok()) st = DraftRounds(active);
  if (st.ok() && mtp_) KeepTargetRows(active);
  if (!st.ok()) {
    LOG_ERROR << name() << " drafts: " << st.message() << " (no drafts this step)";
    for (const DraftJob* job : active) {
      job->out->clear();
      Drop(job->seq);
    }
  }
}

Status ModelDraftSource::CatchUp(std::span<const DraftJob* const> active) {
  std::vector<kv::SeqId> seqs;
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> ids;
  while (true) {
    // What the first round would feed (every job's unseen tokens): one forward when it fits.
    int64_t pending = 0;
    for (const DraftJob* job : active)
      pending += static_cast<int64_t>(job->tokens.size() - fed_[job->seq].size());
    if (pending <= options_.max_step_tokens) return Status::Ok();
    seqs.clear();
    rows.clear();
    int32_t budget = options_.max_step_tokens;
    for (const DraftJob* job : active) {
      const auto done = static_cast<int32_t>(fed_[job->seq].size());
      const int32_t take = std::min(static_cast<int32_t>(job->tokens.size()) - 1 - done, budget);
      if (take <= 0) continue;
      seqs.push_back(job->seq);
      rows.emplace_back(job->tokens.begin() + done, job->tokens.begin() + done + take);
      budget -= take;
      if (budget == 0) break;
    }
    if (seqs.empty()) return Status::Ok();
    EMBER_RETURN_IF_ERROR(Run(seqs, rows, &ids));
  }
}

Status ModelDraftSource::DraftRounds(std::span<const DraftJob* const> active) {
  std::vector<kv::SeqId> seqs;
  std::vector<std::vector<int32_t>> rows;
  std::vector<int32_t> ids;
  for (int32_t round = 0;; ++round) {
    seqs.clear();
    rows.clear();
    std::vector<const DraftJob*> drafting;
    for (const DraftJob* job : active) {
      if (round >= job->max_tokens) continue;
      seqs.push_back(job->seq);
      if (round == 0) {  // the tokens CatchUp left: at least the last one
        const size_t fed = fed_[job->seq].size();
        rows.emplace_back(job->tokens.begin() + static_cast<std::ptrdiff_t>(fed), job->tokens.end());
      } else {
        rows.push_back({job->out->back()});
      }
      drafting.push_back(job);
    }
    if (seqs.empty()) return Status::Ok();
    EMBER_RETURN_IF_ERROR(Run(seqs, rows, &ids, /*chained=*/round > 0));
    for (size_t i = 0; i < drafting.size(); ++i) drafting[i]->out->push_back(ids[i]);
  }
}

Status ModelDraftSource::Run(std::span<const kv::SeqId> seqs,
                             std::span<const std::vector<int32_t>> rows,
                             std::vector<int32_t>* ids, bool chained) {
  BatchPlan plan;
  plan.block_size = options_.block_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int32_t>& fed = fed_[seqs[i]];
    plan.AddSequence(rows[i], static_cast<int32_t>(fed.size()), kv_.BlockTable(seqs[i]),
                     /*want_logits=*/true);
  }
  const size_t n = seqs.size();
  const std::vector<RowOutput> kinds(n, RowOutput::kArgmax);
  const std::vector<RowSampling> sampling(n);
  ids->assign(n, -1);
  StepOutputs outputs;
  outputs.logits = model_->HostLogitsBuffer(n * static_cast<size_t>(model_->config().vocab_size));
  outputs.row_kinds = kinds;
  outputs.sampling = sampling;
  outputs.ids = *ids;
  if (mtp_) {
    GatherHidden(seqs, rows, chained);
    final_hidden_.assign(static_cast<size_t>(plan.num_tokens()) * dim_, 0.0f);
    outputs.mtp_hidden = step_hidden_;
    outputs.final_hidden = final_hidden_;
  }
  EMBER_RETURN_IF_ERROR(model_->Forward(plan, outputs));
  ++forwards_;
  fed_tokens_ += plan.num_tokens();
  for (size_t i = 0; mtp_ && i < seqs.size(); ++i) {  // each group's last row, for the next round
    const auto last = static_cast<ptrdiff_t>(
        (static_cast<size_t>(plan.seqs[i].query_start + plan.seqs[i].query_len) - 1) * dim_);
    last_hidden_[seqs[i]].assign(final_hidden_.begin() + last,
                                 final_hidden_.begin() + last + static_cast<ptrdiff_t>(dim_));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int32_t>& fed = fed_[seqs[i]];
    fed.insert(fed.end(), rows[i].begin(), rows[i].end());
  }
  return Status::Ok();
}

void ModelDraftSource::ObserveHidden(kv::SeqId seq, int32_t first_pos,
                                     std::span<const float> rows) {
  if (!mtp_ || rows.empty()) return;
  TargetHidden& h = hidden_[seq];
  const auto n = static_cast<int32_t>(rows.size() / dim_);
  const int32_t skip = std::max(0, h.base - first_pos);  // positions already fed
  if (skip >= n) return;
  // These rows are the newest of their positions: any kept after them are stale (rejected).
  const auto at = static_cast<size_t>(first_pos + skip - h.base);
  h.rows.resize((at + static_cast<size_t>(n - skip)) * dim_, 0.0f);  // a gap stays zeros
  std::copy(rows.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(skip) * dim_), rows.end(),
            h.rows.begin() + static_cast<ptrdiff_t>(at * dim_));
  const auto held = static_cast<int64_t>(h.rows.size() / dim_);
  if (held > options_.max_held_hidden_rows) {  // the oldest go: fed as zeros if ever needed
    const int64_t drop = held - options_.max_held_hidden_rows;
    h.rows.erase(h.rows.begin(), h.rows.begin() + static_cast<ptrdiff_t>(drop) *
                                                      static_cast<ptrdiff_t>(dim_));
    h.base += static_cast<int32_t>(drop);
  }
}

void ModelDraftSource::GatherHidden(std::span<const kv::SeqId> seqs,
                                    std::span<const std::vector<int32_t>> rows, bool chained) {
  step_hidden_.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (chained) {
      const std::vector<float>& last = last_hidden_[seqs[i]];
      CHECK_EQ(rows[i].size(), 1u);
      CHECK_EQ(last.size(), dim_);
      step_hidden_.insert(step_hidden_.end(), last.begin(), last.end());
      continue;
    }
    const TargetHidden& h = hidden_[seqs[i]];
    const auto first = static_cast<int32_t>(fed_[seqs[i]].size());
    for (size_t r = 0; r < rows[i].size(); ++r) {
      const int64_t at = int64_t{first} + static_cast<int64_t>(r) - h.base;
      if (at < 0 || static_cast<size_t>(at + 1) * dim_ > h.rows.size()) {
        ++missing_hidden_;
        step_hidden_.insert(step_hidden_.end(), dim_, 0.0f);
        continue;
      }
      const auto begin = h.rows.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(at) * dim_);
      step_hidden_.insert(step_hidden_.end(), begin, begin + static_cast<ptrdiff_t>(dim_));
    }
  }
}

void ModelDraftSource::KeepTargetRows(std::span<const DraftJob* const> active) {
  for (const DraftJob* job : active) {
    std::vector<int32_t>& fed = fed_[job->seq];
    fed.resize(job->tokens.size());  // the first round's rows: the target's hidden states
    // The next step feeds again from fed.size() - 1 at the earliest (Prepare keeps the shared
    // prefix less the last token).
    TargetHidden& h = hidden_[job->seq];
    const int32_t base = std::max(h.base, static_cast<int32_t>(fed.size()) - 1);
    const size_t drop = std::min(h.rows.size(), static_cast<size_t>(base - h.base) * dim_);
    h.rows.erase(h.rows.begin(), h.rows.begin() + static_cast<ptrdiff_t>(drop));
    h.base = base;
  }
}

Result<std::unique_ptr<DraftSource>> LoadDraftSource(const SpeculationConfig& config,
                                                     const ModelLoadOptions& opts,
                                                     int32_t target_vocab_size,
                                                     const std::string& target_dir) {
  using Method = SpeculationConfig::Method;
  const bool mtp = config.method == Method::kMtp;
  if (mtp ? target_dir.empty() : config.method != Method::kDraft || config.draft_model.empty())
    return Status::Error(
        "LoadDraftSource: needs --spec-method draft and --draft-model, or mtp and the target");
  // The target's load options, but its per-layer KV overrides name the target's layers: the
  // draft keeps only the default dtype.
  ModelLoadOptions draft_opts = opts;
  draft_opts.kv_cache.layers.clear();
  draft_opts.mtp_module = mtp;
  const std::string& dir = mtp ? target_dir : config.draft_model;
  auto model = Model::Load(dir, draft_opts);
  if (!model.ok())
    return Status::Error((mtp ? "--spec-method mtp: " : "--draft-model " + dir + ": ") +
                         model.message());
  ModelDraftSource::Options options;
  options.kv_cache_bytes = config.draft_kv_cache_bytes;
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<ModelDraftSource> source,
                         ModelDraftSource::Create(std::move(*model), target_vocab_size, options));
  return std::unique_ptr<DraftSource>(std::move(source));
}

}  // namespace ember
