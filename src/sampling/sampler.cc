#include "sampling/sampler.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "backend/threshold_sampling.h"
#include "sampling/distribution_filters.h"
#include "sampling/logit_edits.h"
#include "sampling/processors.h"
#include "sampling/weighted_row.h"
#include "util/check.h"
#include "util/parallel.h"

namespace ember {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kXtcStream = 0x58544321u;  // "XTC!": separates XTC's stream from the draws

// SplitMix64's output function (Steele et al.): a bijective 64-bit mixer.
uint64_t SplitMix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Scratch reused across calls on one thread, so a step over a large batch does not allocate.
struct Scratch {
  WeightedRow row;
  std::vector<float> raw_logits;  // [vocab_size] copy of the row, only when logprobs are wanted
  std::vector<LogitEdit> edits;   // the row's logits processors
  std::vector<KeptToken> kept;    // typical_p / XTC: the kept tokens as a list (id order)
  std::vector<int32_t> kept_ids;
};
thread_local Scratch t_scratch;

}  // namespace

uint64_t MixSeed(uint64_t seed, uint64_t sample_index) {
  return SplitMix64(seed ^ SplitMix64(sample_index));
}

SamplerState::SamplerState(const SamplingParams& params, uint64_t sample_index,
                           std::span<const int32_t> prompt_ids, std::span<const int32_t> stop_ids)
    : track_prompt_(params.repetition_penalty != 1.0f), track_output_(params.has_penalties()) {
  if (params.seed) {
    rng_key_ = MixSeed(*params.seed, sample_index);
  } else {
    std::random_device device;
    rng_key_ = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
  if (track_prompt_) {
    for (int32_t id : prompt_ids) Track(id, 0);
  }
  if (params.min_tokens > 0) min_tokens_mask_ids_.assign(stop_ids.begin(), stop_ids.end());
  if (params.has_dry()) {
    track_dry_ = true;
    dry_last_n_ = params.dry_penalty_last_n;
    for (int32_t id : prompt_ids) RecordDry(id);
  }
}

void SamplerState::RecordDry(int32_t token_id) {
  dry_history_.push_back(token_id);
  // Trimmed once the history is twice the window: amortised O(1) per token.
  const auto last_n = static_cast<size_t>(dry_last_n_);
  if (dry_last_n_ > 0 && dry_history_.size() >= 2 * last_n + 64)
    dry_history_.erase(dry_history_.begin(), dry_history_.end() - static_cast<ptrdiff_t>(last_n));
}

std::span<const int32_t> SamplerState::dry_window() const {
  std::span<const int32_t> all(dry_history_);
  if (dry_last_n_ > 0 && all.size() > static_cast<size_t>(dry_last_n_))
    return all.last(static_cast<size_t>(dry_last_n_));
  return all;
}

double SamplerState::XtcUniform() const {
  const uint64_t position = static_cast<uint64_t>(num_output_tokens_);
  const uint64_t bits = SplitMix64(SplitMix64(rng_key_ ^ kXtcStream) + kGolden * position);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

void SamplerState::Track(int32_t token_id, int32_t output_increment) {
  auto [it, inserted] = slot_of_id_.try_emplace(token_id, static_cast<int32_t>(seen_ids_.size()));
  if (inserted) {
    seen_ids_.push_back(token_id);
    output_counts_.push_back(0);
  }
  output_counts_[static_cast<size_t>(it->second)] += output_increment;
}

void SamplerState::Accept(int32_t token_id) {
  ++num_output_tokens_;
  if (track_output_) Track(token_id, 1);
  if (track_dry_) RecordDry(token_id);
}

double SamplerState::NextUniform() {
  // Counter-based: draw i is a pure function of (key, i), so a state can be replayed or
  // skipped ahead and never depends on what other sequences drew. 53 bits -> [0, 1).
  const uint64_t bits = SplitMix64(rng_key_ + kGolden * rng_counter_++);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

namespace {

// typical_p, then XTC (when triggered), over the row's kept tokens as an explicit list in id
// order; the draw walks that order.
int32_t DrawFiltered(const SamplingParams& params, bool xtc, double u, Scratch& scratch) {
  const std::span<const float> weights = scratch.row.weights();
  scratch.row.KeptIdsByIdOrder(&scratch.kept_ids);
  scratch.kept.clear();
  for (int32_t id : scratch.kept_ids)
    scratch.kept.push_back({id, weights[static_cast<size_t>(id)]});
  ApplyTypicalP(scratch.kept, params.typical_p);
  if (xtc) ApplyXtc(scratch.kept, params.xtc_threshold);
  return DrawKept(scratch.kept, u);
}

}  // namespace

bool BackendCanSample(const SamplingParams& params) {
  return !params.wants_logprobs() && (params.is_greedy() || !params.has_host_only_filters());
}

SampleOutput Sample(std::span<float> logits, const SamplingParams& params, SamplerState& state,
                    std::span<const uint8_t> allowed) {
  CHECK(!logits.empty());
  Scratch& scratch = t_scratch;
  SampleOutput out;

  // Logprobs come from the RAW logits, before any processing: vLLM v1's default
  // (logprobs_mode = "raw_logprobs"). Only computed when requested: it costs a copy and a pass.
  if (params.wants_logprobs()) scratch.raw_logits.assign(logits.begin(), logits.end());

  // Logits processors, in vLLM order (bias on the raw logits, then penalties, then min_tokens),
  // as the edit list a backend applies for the rows it samples (logit_edits.h): one reference.
  scratch.edits.clear();
  AppendLogitEdits(params, state, /*row=*/0, scratch.edits);
  if (!scratch.edits.empty()) {
    const Status st =
        ApplyLogitEditsToRows(logits, static_cast<int64_t>(logits.size()), scratch.edits);
    CHECK(st.ok()) << st.message();  // ids were validated with the request
  }
  // A token constraint (structured output): what it does not allow is out.
  if (!allowed.empty()) {
    CHECK_EQ(allowed.size(), logits.size());
    for (size_t i = 0; i < logits.size(); ++i)
      if (allowed[i] == 0) logits[i] = -std::numeric_limits<float>::infinity();
  }

  // Top-k / top-p / min-p always keep the argmax, so greedy ignores them and draws nothing.
  if (params.is_greedy()) {
    out.token_id = Argmax(logits);
  } else {
    const double u = state.NextUniform();  // drawn even on the fallback: one per sampled token
    if (params.has_top_n_sigma()) ApplyTopNSigma(logits, params.top_n_sigma);
    if (scratch.row.Build(logits, params.temperature)) {
      // HF order: top-k, then top-p on the renormalised top-k set, then min-p.
      scratch.row.ApplyTopK(params.top_k);
      scratch.row.ApplyTopP(params.top_p);
      scratch.row.ApplyMinP(params.min_p);
      const bool xtc = params.has_xtc() && state.XtcUniform() < params.xtc_probability;
      out.token_id = params.has_typical_p() || xtc ? DrawFiltered(params, xtc, u, scratch)
                                                    : scratch.row.Draw(u);
    } else {
      out.token_id = Argmax(logits);  // no finite maximum (a broken model output)
    }
  }

  if (params.wants_logprobs()) {
    SampleOutput raw = TokenLogprobs(scratch.raw_logits, out.token_id, params.top_logprobs);
    out.logprob = raw.logprob;
    out.top_logprobs = std::move(raw.top_logprobs);
  }
  return out;
}

SampleOutput TokenLogprobs(std::span<const float> logits, int32_t token_id, int32_t num_top) {
  CHECK(token_id >= 0 && static_cast<size_t>(token_id) < logits.size()) << "token " << token_id;
  const double log_sum_exp = LogSumExp(logits);
  SampleOutput out;
  out.token_id = token_id;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(token_id)] - log_sum_exp);
  out.top_logprobs = TopLogprobs(logits, log_sum_exp, num_top);
  return out;
}

void SampleRows(std::span<float> logits, int32_t vocab_size,
                std::span<const SamplingParams* const> params,
                std::span<SamplerState* const> states, std::span<SampleOutput> out,
                std::span<const uint8_t> skip,
                std::span<const TokenMask* const> masks) {
  const size_t num_rows = out.size();
  CHECK(masks.empty() || masks.size() == num_rows);
  CHECK_EQ(params.size(), num_rows);
  CHECK_EQ(states.size(), num_rows);
  CHECK(skip.empty() || skip.size() == num_rows);
  CHECK_EQ(logits.size(), num_rows * static_cast<size_t>(vocab_size));
  const auto row_size = static_cast<size_t>(vocab_size);
  std::vector<size_t> rows;
  for (size_t row = 0; row < num_rows; ++row)
    if (skip.empty() || skip[row] == 0) rows.push_back(row);
  // Each row's result is the same on any thread (per-sequence RNG).
  ForEachOnThreads(rows.size(), std::thread::hardware_concurrency(), [&](size_t i) {
    const size_t row = rows[i];
    const TokenMask* mask = masks.empty() ? nullptr : masks[row];
    if (mask != nullptr && mask->num_allowed == 0) {
      out[row] = SampleOutput{};  // token_id -1: nothing may come next
      return;
    }
    CHECK(mask == nullptr || mask->form == TokenMask::Form::kBytes) << "row " << row;
    out[row] = Sample(logits.subspan(row * row_size, row_size), *params[row], *states[row],
                      mask != nullptr ? std::span<const uint8_t>(mask->allowed)
                                      : std::span<const uint8_t>());
  });
}

}  // namespace ember
