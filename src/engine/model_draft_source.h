// ModelDraftSource: speculative decoding's `draft` source (--spec-method draft --draft-model DIR)
// and its `mtp` source (below): a second, smaller Model of the same vocabulary proposes each sequence's next tokens greedily
// (the argmax of its logits, k steps). Verification stays exact (speculator.h): what it proposes
// changes only how many tokens a target step yields, never which.
//
// State: the draft model's own KV pool (Model::AllocateKvCache, sized by --draft-kv-cache-bytes)
// and a private KvCacheManager over it (no prefix caching) with one block table per sequence,
// plus the tokens each sequence's draft KV holds. Proposing for a step (ProposeAll):
//   1. drops the state of sequences no longer running (finished, cancelled, preempted);
//   2. per job keeps the longest prefix its draft KV shares with the sequence's tokens (a
//      rejection truncates: KvCacheManager::Truncate) and grows its table for tokens + k - 1;
//   3. feeds the tokens the draft has not seen (prompt, accepted tokens): while they exceed
//      max_step_tokens over all jobs, in chunks of that many rows (never a job's last token);
//   4. k rounds, all jobs in one forward per round: the first feeds each job's unseen tokens
//      (usually the target's last token and the draft it did not feed), each later one the
//      previous draft; a job's draft is the argmax after its last row, computed where the
//      logits are (RowOutput::kArgmax). So a step costs the draft k forwards.
//
// `mtp` (--spec-method mtp): the model is the target checkpoint's multi-token-prediction module
// (Model::is_mtp_module, ModelLoadOptions::mtp_module), which predicts token i + 2 from token
// i + 1 and the target's hidden state h_i at position i. The same steps run on the sequence's
// tokens shifted by one: its row at position i feeds token i + 1 with h_i (StepOutputs::
// mtp_hidden), so the first round's last row (the target's last token, with the hidden state of
// the position before it) makes the first draft. The target's hidden states come from the
// engine (ObserveHidden, after every step: the rows of positions this source has not fed yet
// are kept, hidden_size floats each: the prompt's until the first draft, and every row of a
// sequence while it does not draft — paused, or backed off by --spec-max-batch — up to
// Options::max_held_hidden_rows, past which the oldest are dropped; catching idle sequences up
// instead is a follow-up). With one MTP module, drafts after the first
// chain the module on itself as vLLM does: round r feeds draft r with the module's own last
// hidden state (before its final norm) of round r - 1. Those chained rows are not the target's
// hidden states, so after the rounds the module's KV keeps only the first round's rows (the
// rest is overwritten later). A position whose hidden state is not there (the engine never
// computed it: a prefix-cache hit; dropped past max_held_hidden_rows; or dropped after being fed,
// and the module's state was dropped since: a full pool, a failed forward) feeds zeros: worse drafts, never other outputs
// (missing_hidden counts them).
//
// A job whose table cannot grow (the pool is full even after dropping the state of sequences
// not drafting now), or that would pass the draft's context, gets no proposal; a failed forward
// drops every state and proposes nothing (logged). Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/draft_source.h"
#include "engine/engine_config.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "util/status.h"

namespace ember {

class ModelDraftSource : public DraftSource {
 public:
  struct Options {
    int64_t kv_cache_bytes = 0;  // the draft's pool; 0: kDefaultDraftKvCacheBytes
    int32_t block_size = 16;
    int32_t max_step_tokens = 512;  // rows per catch-up forward
    // mtp: the most target hidden rows held per sequence (ObserveHidden); older unfed ones are
    // dropped past it (fed as zeros later). Bounds the memory of sequences that do not draft.
    int32_t max_held_hidden_rows = 4096;
  };
  // Takes the loaded draft model (an MTP module: the `mtp` source); refuses one whose vocabulary
  // size differs from the target's (naming both) or whose pool would hold no block. Allocates
  // the draft's KV pool.
  static Result<std::unique_ptr<ModelDraftSource>> Create(std::unique_ptr<Model> draft,
                                                          int32_t target_vocab_size,
                                                          const Options& options);

  std::string name() const override { return mtp_ ? "mtp" : "draft"; }
  void Propose(kv::SeqId seq, std::span<const int32_t> tokens, int32_t max_tokens,
               std::vector<int32_t>* out) override;
  void ProposeAll(std::span<const DraftJob> jobs, std::span<const kv::SeqId> running) override;
  bool wants_hidden_states() const override { return mtp_; }
  void ObserveHidden(kv::SeqId seq, int32_t first_pos, std::span<const float> rows) override;

  int32_t num_blocks() const { return kv_.num_blocks(); }
  int64_t kv_cache_bytes() const { return kv_cache_bytes_; }
  int32_t num_tracked() const { return static_cast<int32_t>(fed_.size()); }
  int32_t used_blocks() const { return kv_.NumUsedBlocks(); }
  int64_t forwards() const { return forwards_; }        // draft model launches
  int64_t fed_tokens() const { return fed_tokens_; }    // rows they computed
  int64_t missing_hidden() const { return missing_hidden_; }  // mtp rows fed zeros
  const Model& model() const { return *model_; }

 private:
  ModelDraftSource(std::unique_ptr<Model> model, const Options& options, int32_t num_blocks,
                   int64_t kv_cache_bytes);
  // Step 2 for one job: false when it gets no proposal (its state is dropped).
  bool Prepare(const DraftJob& job, std::span<const DraftJob> jobs);
  void Drop(kv::SeqId seq);
  // Step 3: while the jobs' unseen tokens exceed max_step_tokens, feeds chunks of them (never a
  // job's last token) without using the logits.
  Status CatchUp(std::span<const DraftJob* const> active);
  // Step 4.
  Status DraftRounds(std::span<const DraftJob* const> active);
  // One forward: row group i feeds rows[i] to seqs[i] at its fed position; *ids gets the argmax
  // after each group's last row.
  Status Run(std::span<const kv::SeqId> seqs, std::span<const std::vector<int32_t>> rows,
             std::vector<int32_t>* ids, bool chained = false);
  // mtp: the hidden states of a Run's rows (StepOutputs::mtp_hidden): the target's (hidden_) for
  // the sequence's tokens, or with `chained` (one row per group) the module's own last row of
  // the previous Run (last_hidden_).
  void GatherHidden(std::span<const kv::SeqId> seqs, std::span<const std::vector<int32_t>> rows,
                    bool chained);
  // mtp: after the rounds, each job keeps only the first round's rows (the target's hidden
  // states) and the target's hidden states it will not feed again are dropped.
  void KeepTargetRows(std::span<const DraftJob* const> active);

  std::unique_ptr<Model> model_;
  const Options options_;
  const int64_t kv_cache_bytes_;
  kv::KvCacheManager kv_;
  std::unordered_map<kv::SeqId, std::vector<int32_t>> fed_;  // tokens in each sequence's draft KV
  int64_t forwards_ = 0, fed_tokens_ = 0;
  // mtp: the module's input, and per sequence the target's hidden states of positions
  // [base, base + rows / hidden_size) not yet fed (ObserveHidden).
  const bool mtp_;
  const size_t dim_;  // hidden_size
  struct TargetHidden {
    int32_t base = 0;
    std::vector<float> rows;
  };
  std::unordered_map<kv::SeqId, TargetHidden> hidden_;
  std::unordered_map<kv::SeqId, std::vector<float>> last_hidden_;  // per group of the last Run
  std::vector<float> step_hidden_, final_hidden_;  // a Run's mtp_hidden and final_hidden
  int64_t missing_hidden_ = 0;
};

// kDraft's and kMtp's source as the app and the benchmarks make it: loads config.draft_model
// (kMtp: the MTP module of `target_dir`, ModelLoadOptions::mtp_module) with `opts` (the target's
// backend and device options) and sizes its pool by config.draft_kv_cache_bytes. The tokenizers'
// comparison is the caller's (the engine has none).
Result<std::unique_ptr<DraftSource>> LoadDraftSource(const SpeculationConfig& config,
                                                     const ModelLoadOptions& opts,
                                                     int32_t target_vocab_size,
                                                     const std::string& target_dir = "");

}  // namespace ember
