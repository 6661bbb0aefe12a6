// The sampler: turns one row of logits into one token for one sequence, with optional logprobs.
// Order (vLLM / HF semantics, llama.cpp's samplers placed among them):
//   1. logprobs are taken from the RAW logits first (vLLM v1 default "raw_logprobs");
//   2. logits processors, as one edit list (logit_edits.h): logit_bias is added; repetition
//      penalty (every id seen in prompt or output: logit > 0 ? logit / p : logit * p); frequency
//      / presence penalties on OUTPUT counts (logit -= freq * count + pres * (count > 0)); the
//      DRY penalty (dry.h); stop / EOS ids masked while fewer than min_tokens were accepted;
//   3. a token constraint's mask;
//   4. greedy requests take the argmax here (ties -> lowest id, no RNG);
//   5. top-n-sigma on the logits (distribution_filters.h; it never removes the argmax);
//   6. temperature, then top-k, top-p (smallest prefix of the sorted distribution whose mass
//      reaches p, the top token always kept), min-p (drop p < min_p * p_max) — HF's order;
//   7. typical_p, then XTC (when its per-position draw < xtc_probability), each on the
//      probabilities of the tokens still kept, renormalised (distribution_filters.h);
//   8. one inverse-CDF draw over the kept tokens ordered by (prob desc, id asc) — by id when
//      typical_p or XTC ran (their kept set is an explicit list; the distribution is the same).
//
// Determinism: each sequence owns a SamplerState whose counter-based RNG makes exactly one
// uniform draw per sampled token, so a seeded request yields the same tokens alone or in any
// batch. XTC's trigger is a second stream, a pure function of (key, number of output tokens so
// far), which does not advance the counter. Thread-safety: Sample() on distinct (logits, state)
// pairs may run concurrently (scratch buffers are thread_local); one SamplerState must not be
// used by two threads at once.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "sampling/sampling_params.h"
#include "sampling/token_constraint.h"
#include "sampling/token_mask.h"

namespace ember {

struct TokenLogprob {
  int32_t token_id;
  float logprob;
};

struct SampleOutput {
  int32_t token_id = -1;
  float logprob = 0.0f;                    // of the chosen token (raw distribution), if requested
  std::vector<TokenLogprob> top_logprobs;  // if requested: desc by logprob, ties by lower id
};

// Per-sequence state: RNG + token counts for penalties. Owned by the engine's Sequence; copyable
// (a forked sequence for n > 1 should be constructed with its own sample_index instead).
class SamplerState {
 public:
  // RNG key: params.seed mixed with sample_index (MixSeed below), or std::random_device when
  // params.seed is unset. prompt_ids are remembered only if a repetition penalty is active.
  // stop_ids (every id that ends the sequence: the model's EOS ids unless ignore_eos, plus the
  // request's stop ids) are masked to -inf while fewer than params.min_tokens tokens have been
  // accepted.
  SamplerState(const SamplingParams& params, uint64_t sample_index,
               std::span<const int32_t> prompt_ids, std::span<const int32_t> stop_ids = {});

  void Accept(int32_t token_id);  // records an output token (penalty counts, output length)

  // The next uniform double in [0, 1); advances the counter. Exactly one per sampled token.
  double NextUniform();

  int64_t num_output_tokens() const { return num_output_tokens_; }
  uint64_t rng_key() const { return rng_key_; }
  uint64_t rng_counter() const { return rng_counter_; }

  // Penalty bookkeeping: each id seen in the prompt (when tracked) or output, with its OUTPUT
  // count (0 for prompt-only ids). Parallel vectors, one entry per distinct id.
  std::span<const int32_t> seen_ids() const { return seen_ids_; }
  std::span<const int32_t> output_counts() const { return output_counts_; }
  // Ids masked while num_output_tokens() < params.min_tokens (stop ids + EOS ids).
  std::span<const int32_t> min_tokens_mask_ids() const { return min_tokens_mask_ids_; }

  // DRY's window (dry.h): the last dry_penalty_last_n tokens of prompt + output (all of them for
  // -1); empty when DRY is off.
  std::span<const int32_t> dry_window() const;
  // XTC's trigger draw for the next token, in [0, 1): a pure function of the RNG key and
  // num_output_tokens() (independent of the counter, so the same position draws the same value
  // when it is sampled again, as speculative verification does).
  double XtcUniform() const;

 private:
  void Track(int32_t token_id, int32_t output_increment);
  void RecordDry(int32_t token_id);

  bool track_prompt_ = false;
  bool track_output_ = false;
  uint64_t rng_key_ = 0;
  uint64_t rng_counter_ = 0;
  int64_t num_output_tokens_ = 0;
  std::vector<int32_t> min_tokens_mask_ids_;
  std::vector<int32_t> seen_ids_;
  std::vector<int32_t> output_counts_;
  std::unordered_map<int32_t, int32_t> slot_of_id_;  // token id -> index into the vectors above
  // DRY: prompt + output tokens (trimmed to the last dry_last_n_ now and then), when DRY is on.
  bool track_dry_ = false;
  int32_t dry_last_n_ = -1;
  std::vector<int32_t> dry_history_;
};

// True when a backend may make this row's token where the logits live: the row's processors as
// edits (logit_edits.h, Backend::ApplyLogitEdits; DRY included), then the plain argmax for a
// greedy request (Backend::ArgmaxRows, same tie rule) or a draw with the state's next uniform
// (Backend::SampleRows, same semantics) — the same token Sample() picks. False for requests that
// want logprobs (taken from the raw row, which Sample() needs on the host) and for sampled
// requests with top-n-sigma, typical_p or XTC (host-only filters; a greedy one ignores them).
bool BackendCanSample(const SamplingParams& params);

// The documented seed mix for sample `sample_index` of a request seeded with `seed`:
// SplitMix64(seed ^ SplitMix64(sample_index)). Distinct indices give unrelated streams.
uint64_t MixSeed(uint64_t seed, uint64_t sample_index);

// Samples one token from `logits` ([vocab_size], modified in place as scratch). `params` must
// have passed Validate(logits.size()); `state` must have been built from the same params.
// `allowed` (empty, or [vocab_size]): a token constraint's mask (token_constraint.h); ids with
// allowed[id] == 0 are set to -inf after the processors (the logprobs stay raw).
SampleOutput Sample(std::span<float> logits, const SamplingParams& params, SamplerState& state,
                    std::span<const uint8_t> allowed = {});

// The raw logprobs of `token_id` in one row of logits: log_softmax(logits)[token_id] (float, from
// a log-sum-exp accumulated in double) and the row's top `num_top` entries (TopLogprobs, none
// when num_top <= 0). What Sample() reports for the token it draws; the engine's prompt logprobs
// use it for prompt tokens, so both are one computation. token_id must be in the row.
SampleOutput TokenLogprobs(std::span<const float> logits, int32_t token_id, int32_t num_top);

// Convenience for the engine: samples rows [num_rows, vocab_size] of a row-major buffer in
// parallel (threads started per call when two or more rows need sampling). params[i] / states[i]
// belong to row i; results go to out[i]. Rows with skip[i] != 0 (when skip is given) are left
// alone: their logits need not be valid. masks[i] (when given and not null) is row i's token
// mask, built as TokenMask::Form::kBytes: a row it allows no token gets token_id -1.
void SampleRows(std::span<float> logits, int32_t vocab_size,
                std::span<const SamplingParams* const> params,
                std::span<SamplerState* const> states, std::span<SampleOutput> out,
                std::span<const uint8_t> skip = {},
                std::span<const TokenMask* const> masks = {});

}  // namespace ember
