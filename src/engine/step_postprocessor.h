// StepPostprocessor: the ONE place where a step's tokens are accepted. At launch it marks the
// step's rows computed and puts a placeholder where each sampled token goes (Launched); when the
// step completes it reads the backend's ids (waiting for a deferred step's) or samples the kCopy
// rows on the host, computes prompt logprobs, pools embedding requests' hidden-state rows, commits
// the computed KV blocks to the prefix cache, accepts each token into its sequence, sampler and
// output constraint, checks the stop conditions, streams the TokenEvents (an embedding request's
// pooled vector) and ends finished sequences (LiveSequences). Engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine_config.h"
#include "engine/live_sequences.h"
#include "engine/model_runner.h"
#include "engine/prompt_tier.h"
#include "engine/step_builder.h"
#include "kv/kv_cache_manager.h"
#include "sampling/sampler.h"

namespace ember {

class StepPostprocessor {
 public:
  // The pointers must outlive this. It adds finish_ns to `counters` (the engine's totals).
  StepPostprocessor(ModelRunner* runner, kv::KvCacheManager* kv, LiveSequences* sequences,
                    EngineStats* counters)
      : runner_(runner), kv_(kv), sequences_(sequences), counters_(counters) {}

  // The prompt cache below the pool (prompt_tier.h): computed blocks are written through to it.
  void set_prompt_tier(PromptTier* tier) { tier_ = tier; }

  // After a successful launch: the step's rows count as computed (the next step is planned
  // before this one completes); each sampled row's token is a placeholder -1 - r (its logits
  // row r) until Complete replaces it.
  void Launched(StepBatch& step);
  // Reads the step's tokens, commits its KV blocks, streams the tokens, ends finished sequences,
  // and lets go of its sequences.
  void Complete(StepBatch& step);
  // A step whose launch or ids failed: its sequences end with an error (their K/V is not trusted).
  void Fail(const StepBatch& step);

 private:
  // The kCopy sampled rows, sampled on the host in parallel across rows (per-sequence RNG:
  // order-independent), into row_outputs_.
  void SampleOnHost(const StepBatch& step);
  void ComputePromptLogprobs(const StepBatch& step);
  // The hidden-state rows into their sequences' PoolingAccumulator.
  void PoolHiddenRows(const StepBatch& step);
  // Ends an embedding request whose prompt is computed with its pooled vector (finish kStop).
  void EmitEmbedding(Sequence* seq);
  // Scheduled sequence i's rows are computed: commits its blocks, notes its prompt's progress.
  // Returns whether its prompt is now computed.
  bool CommitComputed(const StepBatch& step, size_t i);
  // Scheduled sequence i's sampled token (row `row`) joins it; ends it on a stop condition.
  void AcceptToken(const StepBatch& step, size_t i, size_t row);
  FinishReason StopReason(const Sequence& seq, int32_t index, int32_t token, bool constraint_broken,
                          bool* stop_token) const;

  ModelRunner* runner_;
  kv::KvCacheManager* kv_;
  LiveSequences* sequences_;
  EngineStats* counters_;
  PromptTier* tier_ = nullptr;
  std::vector<SampleOutput> row_outputs_;  // [real_rows] host-sampled rows' tokens
  std::vector<uint8_t> host_skip_;         // [real_rows] rows the host sampler leaves alone
};

}  // namespace ember
