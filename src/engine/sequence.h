// Sequence: one token stream being generated (a request with n samples owns n of them).
// `num_computed_tokens` catches up with `tokens.size()`: there are no prefill/decode phases, a
// sequence simply has uncomputed tokens (a prompt chunk, or its last sampled token). Owned and
// mutated by the engine thread only. While a step is in flight (Engine: overlapped steps) the
// token it samples for the sequence is a placeholder in `tokens`, -1 - r (the step's logits row
// r): the next step may compute it as a fed token (BatchPlan) before the host knows it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/pooling.h"
#include "engine/request.h"
#include "engine/response_stream.h"
#include "engine/spec_adapt.h"
#include "kv/kv_cache_manager.h"
#include "sampling/sampler.h"
#include "util/sha256.h"

namespace ember {

// Shared by the samples of one request.
struct RequestState {
  uint64_t request_id = 0;
  GenerationRequest request;
  std::shared_ptr<ResponseStream> stream;
  std::vector<int32_t> stop_ids;        // eos ids (unless ignore_eos) + request stop ids
  int32_t num_unfinished = 0;           // samples still running
  bool prompt_prefilled = false;        // sample 0 computed the whole prompt (siblings may start)
  bool admitted = false;                // left the queue (a sample ran, or it ended)
  RequestUsage usage;
  // Its LoRA adapter's slot in the model's LoraSet (-1: none), held while this state lives: the
  // lease releases the slot when the last sequence lets go of the state.
  int32_t lora_slot = -1;
  std::shared_ptr<void> lora_lease;
};

struct Sequence {
  kv::SeqId id = 0;
  int32_t sample_index = 0;
  std::shared_ptr<RequestState> request;
  std::vector<int32_t> tokens;         // prompt followed by generated tokens
  int32_t prompt_len = 0;
  int32_t num_computed_tokens = 0;     // tokens whose K/V is in the cache
  int32_t num_cached_prompt_tokens = 0;  // of the prompt, served by the prefix cache (1st start)
  bool started = false;                // holds KV blocks (AcquireCachedPrefix done)
  int32_t state_slot = -1;  // its recurrent-state slot while started (state_slots.h), or -1
  // Admitted with a cached prefix of a hybrid model: the checkpoint slot (kv/state_checkpoints.h)
  // copied into state_slot before its first rows (StepBuilder moves it into the step), or -1.
  int32_t restore_state_from = -1;
  bool ever_started = false;
  std::unique_ptr<SamplerState> sampler;
  std::unique_ptr<TokenConstraint> constraint;  // the request's, cloned (structured output)
  FinishReason finish = FinishReason::kNone;
  int32_t steps_in_flight = 0;  // launched steps with rows of this sequence, not yet completed
  bool last_token_pending = false;  // its placeholder is its max_tokens-th token: no more rows
  // Sample 0 of a request with prompt logprobs, until its prompt is computed: each prefill chunk
  // has a logits row (kCopy) for every prompt row, it takes no prefix-cache hit (it needs every
  // row's logits) and its chunks are bounded (SchedulerConfig::max_prompt_logits_rows).
  bool needs_prompt_logits = false;
  std::vector<PromptLogprob> prompt_logprobs;  // [prompt_len - 1]; entry i: position i + 1's
  bool prompt_logprobs_ready = false;          // complete, not yet sent with an event
  // An embedding request's pooled rows so far (GenerationRequest::pooling); reset on preemption.
  PoolingAccumulator pooled;
  // Speculative decoding (speculator.h). `speculates`: the engine and the request allow it.
  // `draft`: the tokens proposed for the next step (the Scheduler may take fewer), re-proposed
  // before each step. `wants_drafts`: the speculator would draft for it now (not paused, the
  // batch not backing off), so its steps are never deferred (drafting needs its last token).
  bool speculates = false;
  SpecAdapt spec;
  std::vector<int32_t> draft;
  bool wants_drafts = false;
  int32_t accepted_drafts = 0, rejected_drafts = 0;  // over its verifications (usage)
  // Jump-forward (StepPostprocessor::JumpForward): it may append the tokens its constraint
  // forces (a constraint, no logprobs, the engine allows it); how many it appended (usage).
  bool jumps_forward = false;
  int32_t forced_tokens = 0;
  // The prompt cache below the pool (engine/prompt_tier.h): chain key of each full block so far
  // (entry i names blocks 0..i), how many leading blocks are stored or queued on disk, and how
  // many leading blocks of its current block table were tagged for the RAM tier (reset when its
  // blocks are freed: Scheduler::FreeSequence).
  std::vector<Sha256Digest> tier_keys;
  int32_t tier_blocks_stored = 0;
  int32_t tier_blocks_tagged = 0;
  // A hybrid model resumed from a tier's state checkpoint (PromptTier::ExtendCachedPrefix): the
  // recurrent state at its computed prefix's end, written into state_slot before its first rows
  // (StepBuilder moves it into the step); empty otherwise (and whenever its blocks are freed).
  std::vector<uint8_t> tier_state;

  bool embeds() const { return request->request.pooling.kind != PoolingKind::kNone; }

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_generated() const { return num_tokens() - prompt_len; }
  int32_t num_uncomputed() const { return num_tokens() - num_computed_tokens; }
};

}  // namespace ember
