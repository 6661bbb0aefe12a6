// Sample(): greedy, seeded determinism, batch independence, allowed sets and frequencies,
// logprobs against a double-precision reference, min_tokens, and validation messages.
#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include "sampling/logit_edits.h"
#include "sampling/processors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

namespace ember {
namespace {

constexpr int32_t kVocab = 1000;

std::vector<float> RandomLogits(uint32_t seed, int32_t vocab = kVocab, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) x = dist(gen);
  return logits;
}

// Runs `steps` decode steps where the logits of step i depend only on i.
std::vector<int32_t> Generate(const SamplingParams& params, uint64_t sample_index, int steps) {
  SamplerState state(params, sample_index, {});
  std::vector<int32_t> tokens;
  for (int i = 0; i < steps; ++i) {
    std::vector<float> logits = RandomLogits(1000u + static_cast<uint32_t>(i), kVocab, 1.0f);
    tokens.push_back(Sample(logits, params, state).token_id);
    state.Accept(tokens.back());
  }
  return tokens;
}

TEST(SamplerTest, GreedyIsArgmaxAndIgnoresSeed) {
  for (uint32_t row = 0; row < 20; ++row) {
    std::vector<float> logits = RandomLogits(row);
    const auto expected =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    for (uint64_t seed : {1ull, 2ull}) {
      SamplingParams params;
      params.temperature = 0.0f;
      params.top_k = 5;
      params.top_p = 0.5f;
      params.seed = seed;
      SamplerState state(params, 0, {});
      std::vector<float> copy = logits;
      EXPECT_EQ(Sample(copy, params, state).token_id, expected);
      EXPECT_EQ(state.rng_counter(), 0u) << "greedy must not draw";
    }
  }
}

TEST(SamplerTest, GreedyAppliesBiasAndPenaltiesFirst) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.logit_bias = {{2, 10.0f}};
  std::vector<float> logits = {5.0f, 1.0f, 0.0f};
  SamplerState state(params, 0, {});
  EXPECT_EQ(Sample(logits, params, state).token_id, 2);

  SamplingParams penalised;
  penalised.temperature = 0.0f;
  penalised.repetition_penalty = 4.0f;
  const std::vector<int32_t> prompt = {0};
  SamplerState penalised_state(penalised, 0, prompt);
  std::vector<float> row = {4.0f, 3.0f, 0.0f};  // id 0 -> 1.0 after the penalty
  EXPECT_EQ(Sample(row, penalised, penalised_state).token_id, 1);

  SamplingParams frequency;
  frequency.temperature = 0.0f;
  frequency.frequency_penalty = 1.5f;
  SamplerState frequency_state(frequency, 0, prompt);  // prompt does not count for frequency
  std::vector<float> first = {4.0f, 3.0f, 0.0f};
  EXPECT_EQ(Sample(first, frequency, frequency_state).token_id, 0);
  frequency_state.Accept(0);
  std::vector<float> second = {4.0f, 3.0f, 0.0f};  // id 0 -> 2.5 < 3
  EXPECT_EQ(Sample(second, frequency, frequency_state).token_id, 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedsDiffer) {
  SamplingParams params;
  params.seed = 1234;
  const auto a = Generate(params, 0, 64);
  EXPECT_EQ(a, Generate(params, 0, 64));
  EXPECT_NE(a, Generate(params, 1, 64)) << "sample index must change the stream";
  params.seed = 1235;
  EXPECT_NE(a, Generate(params, 0, 64));
  SamplingParams unseeded;
  EXPECT_NE(Generate(unseeded, 0, 64), Generate(unseeded, 0, 64));
}

TEST(SamplerTest, ExactlyOneDrawPerSampledToken) {
  SamplingParams params;
  params.seed = 5;
  params.top_k = 10;
  SamplerState state(params, 0, {});
  for (int i = 0; i < 7; ++i) {
    std::vector<float> logits = RandomLogits(static_cast<uint32_t>(i));
    state.Accept(Sample(logits, params, state).token_id);
  }
  EXPECT_EQ(state.rng_counter(), 7u);
  EXPECT_EQ(state.num_output_tokens(), 7);
}

TEST(SamplerTest, BrokenRowsDegradeToArgmaxAndStillDrawOnce) {
  SamplingParams params;
  params.seed = 1;
  SamplerState state(params, 0, {});
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> with_inf = {0.0f, inf, 1.0f};
  EXPECT_EQ(Sample(with_inf, params, state).token_id, 1);
  std::vector<float> all_masked = {-inf, -inf};
  EXPECT_EQ(Sample(all_masked, params, state).token_id, 0);
  EXPECT_EQ(state.rng_counter(), 2u);
  std::vector<float> with_nan = {NAN, 0.0f, NAN, -50.0f};
  for (int i = 0; i < 20; ++i) {
    std::vector<float> row = with_nan;
    const int32_t token = Sample(row, params, state).token_id;
    EXPECT_TRUE(token == 1 || token == 3) << token;  // NaN logits get probability 0
  }
}

TEST(SamplerTest, SeededRowIsIndependentOfBatchComposition) {
  SamplingParams seeded;
  seeded.seed = 99;
  seeded.top_p = 0.9f;
  const auto alone = Generate(seeded, 0, 32);

  // The same sequence inside batches of varying size and neighbours, sampled in parallel.
  SamplingParams other;
  other.temperature = 1.5f;
  other.top_k = 50;
  SamplerState target(seeded, 0, {});
  std::vector<SamplerState> neighbours;
  for (int i = 0; i < 7; ++i)
    neighbours.emplace_back(other, static_cast<uint64_t>(i), std::span<const int32_t>{});
  std::vector<int32_t> batched;
  for (int step = 0; step < 32; ++step) {
    const int num_rows = 1 + step % 8;
    const int target_row = step % num_rows;
    std::vector<float> logits;
    std::vector<const SamplingParams*> params;
    std::vector<SamplerState*> states;
    for (int row = 0; row < num_rows; ++row) {
      const bool is_target = row == target_row;
      const auto row_logits = is_target
                                  ? RandomLogits(1000u + static_cast<uint32_t>(step), kVocab, 1.0f)
                                  : RandomLogits(static_cast<uint32_t>(step * 31 + row));
      logits.insert(logits.end(), row_logits.begin(), row_logits.end());
      params.push_back(is_target ? &seeded : &other);
      states.push_back(is_target ? &target : &neighbours[static_cast<size_t>(row % 7)]);
    }
    std::vector<SampleOutput> out(static_cast<size_t>(num_rows));
    SampleRows(logits, kVocab, params, states, out);
    for (int row = 0; row < num_rows; ++row) {
      states[static_cast<size_t>(row)]->Accept(out[static_cast<size_t>(row)].token_id);
    }
    batched.push_back(out[static_cast<size_t>(target_row)].token_id);
  }
  EXPECT_EQ(batched, alone);
}

// Samples `draws` times from `probs` with different seeds; returns token -> count.
std::map<int32_t, int> Histogram(const std::vector<double>& probs, SamplingParams params,
                                 int draws) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) {
    params.seed = static_cast<uint64_t>(i);
    SamplerState state(params, 0, {});
    std::vector<float> logits;
    for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
    ++counts[Sample(logits, params, state).token_id];
  }
  return counts;
}

void ExpectFrequencies(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& want,
                       int draws) {
  for (const auto& [id, count] : counts) {
    ASSERT_TRUE(want.count(id)) << "token " << id << " must have been filtered out";
  }
  for (const auto& [id, p] : want) {
    const auto it = counts.find(id);
    const double got = it == counts.end() ? 0.0 : static_cast<double>(it->second) / draws;
    // 10k draws: the standard error is <= 0.005; allow ~4 sigma.
    EXPECT_NEAR(got, p, 0.02) << "token " << id;
  }
}

const std::vector<double> kProbs = {0.1, 0.4, 0.2, 0.3, 0.0001};
constexpr int kDraws = 10000;

TEST(SamplerTest, PlainSamplingMatchesProbabilities) {
  SamplingParams params;
  ExpectFrequencies(Histogram(kProbs, params, kDraws),
                    {{0, 0.1}, {1, 0.4}, {2, 0.2}, {3, 0.3}, {4, 0.0001}}, kDraws);
}

TEST(SamplerTest, TopKOnlyAllowsTopTokensRenormalised) {
  SamplingParams params;
  params.top_k = 2;
  ExpectFrequencies(Histogram(kProbs, params, kDraws), {{1, 4.0 / 7}, {3, 3.0 / 7}}, kDraws);
}

TEST(SamplerTest, TopPOnlyAllowsNucleus) {
  SamplingParams params;
  params.top_p = 0.8f;
  ExpectFrequencies(Histogram(kProbs, params, kDraws),
                    {{1, 0.4 / 0.9}, {3, 0.3 / 0.9}, {2, 0.2 / 0.9}}, kDraws);
}

TEST(SamplerTest, MinPOnlyAllowsTokensNearTheTop) {
  SamplingParams params;
  params.min_p = 0.6f;  // threshold 0.24
  ExpectFrequencies(Histogram(kProbs, params, kDraws), {{1, 4.0 / 7}, {3, 3.0 / 7}}, kDraws);
}

TEST(SamplerTest, TemperatureSharpens) {
  SamplingParams params;
  params.temperature = 0.5f;  // probs ~ p^2: 0.01, 0.16, 0.04, 0.09, 1e-8 (total ~0.3)
  ExpectFrequencies(Histogram(kProbs, params, kDraws),
                    {{0, 0.01 / 0.3}, {1, 0.16 / 0.3}, {2, 0.04 / 0.3}, {3, 0.09 / 0.3}, {4, 0.0}},
                    kDraws);
}

TEST(SamplerTest, LogprobsAreRawLogSoftmax) {
  std::vector<float> logits = RandomLogits(3, 5000, 5.0f);
  const std::vector<float> raw = logits;
  double max = *std::max_element(raw.begin(), raw.end());
  double sum = 0.0;
  for (float x : raw) sum += std::exp(static_cast<double>(x) - max);
  const double lse = max + std::log(sum);

  SamplingParams params;
  params.seed = 3;
  params.temperature = 0.7f;
  params.top_k = 40;
  params.logit_bias = {{17, 50.0f}};  // processing must not change the reported logprobs
  params.top_logprobs = 20;
  SamplerState state(params, 0, {});
  const SampleOutput out = Sample(logits, params, state);
  EXPECT_EQ(out.token_id, 17);  // +50 makes it overwhelmingly likely
  EXPECT_NEAR(out.logprob, raw[17] - lse, 1e-4);
  ASSERT_EQ(out.top_logprobs.size(), 20u);
  for (size_t i = 0; i < out.top_logprobs.size(); ++i) {
    const TokenLogprob& entry = out.top_logprobs[i];
    EXPECT_NEAR(entry.logprob, raw[static_cast<size_t>(entry.token_id)] - lse, 1e-4);
    if (i > 0) {
      EXPECT_GE(out.top_logprobs[i - 1].logprob, entry.logprob);
    }
  }
  std::vector<float> sorted = raw;
  std::sort(sorted.rbegin(), sorted.rend());
  EXPECT_FLOAT_EQ(raw[static_cast<size_t>(out.top_logprobs[0].token_id)], sorted[0]);
  EXPECT_FLOAT_EQ(raw[static_cast<size_t>(out.top_logprobs[19].token_id)], sorted[19]);

  params.top_logprobs = 0;  // chosen token only
  std::vector<float> again = raw;
  SamplerState state2(params, 0, {});
  const SampleOutput chosen_only = Sample(again, params, state2);
  EXPECT_TRUE(chosen_only.top_logprobs.empty());
  EXPECT_NEAR(chosen_only.logprob, raw[static_cast<size_t>(chosen_only.token_id)] - lse, 1e-4);
}

TEST(SamplerTest, MinTokensMasksStopIds) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.min_tokens = 2;
  const std::vector<int32_t> stop_ids = {0, 1};  // e.g. EOS + a request stop id
  SamplerState state(params, 0, {}, stop_ids);
  auto step = [&] {
    std::vector<float> logits = {9.0f, 8.0f, 1.0f};
    const int32_t token = Sample(logits, params, state).token_id;
    state.Accept(token);
    return token;
  };
  EXPECT_EQ(step(), 2);
  EXPECT_EQ(step(), 2);
  EXPECT_EQ(step(), 0);  // min_tokens reached: EOS allowed again

  SamplerState no_stop_ids(params, 0, {}, {});  // ignore_eos and no stop ids: nothing masked
  std::vector<float> logits = {9.0f, 8.0f, 1.0f};
  EXPECT_EQ(Sample(logits, params, no_stop_ids).token_id, 0);
}

Status Check(void (*edit)(SamplingParams&)) {
  SamplingParams params;
  edit(params);
  return params.Validate(kVocab);
}

TEST(SamplingParamsTest, DefaultsAreValid) {
  EXPECT_TRUE(SamplingParams().Validate(kVocab).ok());
  EXPECT_FALSE(SamplingParams().is_greedy());
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_TRUE(greedy.is_greedy());
  EXPECT_TRUE(greedy.Validate(kVocab).ok());
}

TEST(SamplingParamsTest, ValidationMessagesNameTheField) {
  EXPECT_EQ(Check([](SamplingParams& p) { p.top_p = 1.5f; }).message(),
            "top_p: must be in (0, 1], got 1.5");
  EXPECT_EQ(Check([](SamplingParams& p) { p.top_p = 0.0f; }).message(),
            "top_p: must be in (0, 1], got 0");
  EXPECT_EQ(Check([](SamplingParams& p) { p.temperature = 2.5f; }).message(),
            "temperature: must be in [0, 2], got 2.5");
  EXPECT_EQ(Check([](SamplingParams& p) { p.temperature = NAN; }).message(),
            "temperature: must be finite and in [0, 2], got nan");
  EXPECT_EQ(Check([](SamplingParams& p) { p.min_p = -0.1f; }).message().rfind("min_p: ", 0), 0u);
  EXPECT_EQ(Check([](SamplingParams& p) { p.top_k = -2; }).message(),
            "top_k: must be -1 or 0 (off) or >= 1, got -2");
  EXPECT_EQ(Check([](SamplingParams& p) { p.repetition_penalty = 0.0f; }).message(),
            "repetition_penalty: must be in (0, 10], got 0");
  EXPECT_EQ(Check([](SamplingParams& p) { p.repetition_penalty = INFINITY; })
                .message()
                .rfind("repetition_penalty: ", 0),
            0u);
  EXPECT_EQ(Check([](SamplingParams& p) { p.presence_penalty = 2.5f; }).message(),
            "presence_penalty: must be in [-2, 2], got 2.5");
  EXPECT_EQ(Check([](SamplingParams& p) { p.frequency_penalty = -3.0f; }).message(),
            "frequency_penalty: must be in [-2, 2], got -3");
  EXPECT_EQ(Check([](SamplingParams& p) {
              p.logit_bias = {{5, 101.0f}};
            }).message(),
            "logit_bias[5]: must be in [-100, 100], got 101");
  EXPECT_EQ(Check([](SamplingParams& p) {
              p.logit_bias = {{1000, 1.0f}};
            }).message(),
            "logit_bias[1000]: token id must be in [0, 1000), got 1000");
  EXPECT_EQ(Check([](SamplingParams& p) { p.top_logprobs = 21; }).message(),
            "top_logprobs: must be in [0, 20] (or -1: off), got 21");
  EXPECT_EQ(Check([](SamplingParams& p) { p.min_tokens = -1; }).message(),
            "min_tokens: must be >= 0, got -1");
  EXPECT_TRUE(Check([](SamplingParams& p) {
                p.top_k = -1;
                p.top_p = 1.0f;
                p.min_p = 1.0f;
                p.temperature = 2.0f;
                p.top_logprobs = 20;
                p.logit_bias = {{999, -100.0f}};
              }).ok());
}

// A bias for every id of a 152k vocabulary (a valid request), in the order a parsed JSON object
// yields its keys ("0", "1", "10", "100", ...): it validates, a bad entry at its end is named,
// and the step's edits are one kAdd per entry, in id order, adding what ApplyLogitBias adds.
TEST(LogitBiasTest, FullVocabularyBiasList) {
  constexpr int32_t kFullVocab = 152064;
  std::vector<std::string> keys;
  for (int32_t id = 0; id < kFullVocab; ++id) keys.push_back(std::to_string(id));
  std::sort(keys.begin(), keys.end());
  SamplingParams params;
  for (size_t i = 0; i < keys.size(); ++i)
    params.logit_bias.emplace_back(std::stoi(keys[i]), static_cast<float>(i % 200) - 100.0f);
  params.logit_bias.emplace_back(7, 0.5f);  // a repeated id: its entries add up in request order
  ASSERT_TRUE(params.Validate(kFullVocab).ok());
  SamplingParams bad = params;
  bad.logit_bias.emplace_back(kFullVocab, 1.0f);
  EXPECT_EQ(bad.Validate(kFullVocab).message(),
            "logit_bias[152064]: token id must be in [0, 152064), got 152064");

  SamplerState state(params, 0, {});
  std::vector<LogitEdit> edits;
  AppendLogitEdits(params, state, /*row=*/0, edits);
  ASSERT_EQ(edits.size(), params.logit_bias.size());
  for (size_t i = 1; i < edits.size(); ++i) ASSERT_LE(edits[i - 1].token, edits[i].token);
  SamplingParams sorted = params;
  sorted.SortLogitBias();
  ASSERT_TRUE(std::is_sorted(sorted.logit_bias.begin(), sorted.logit_bias.end(),
                             [](const auto& a, const auto& b) { return a.first < b.first; }));
  std::vector<LogitEdit> sorted_edits;
  AppendLogitEdits(sorted, state, /*row=*/0, sorted_edits);
  ASSERT_EQ(sorted_edits.size(), edits.size());
  for (size_t i = 0; i < edits.size(); ++i) {
    ASSERT_EQ(sorted_edits[i].token, edits[i].token) << i;
    ASSERT_EQ(sorted_edits[i].value, edits[i].value) << i;
  }
  // The repeated id keeps its request order: its catalogue value first, then 0.5.
  const auto seven = std::find_if(edits.begin(), edits.end(), [](const auto& e) { return e.token == 7; });
  ASSERT_NE(seven, edits.end());
  EXPECT_EQ((seven + 1)->token, 7);
  EXPECT_EQ((seven + 1)->value, 0.5f);
  std::vector<float> by_edits(kFullVocab, 1.0f), by_bias(kFullVocab, 1.0f);
  for (const LogitEdit& e : edits) by_edits[static_cast<size_t>(e.token)] += e.value;
  ApplyLogitBias(by_bias, params.logit_bias);
  EXPECT_EQ(by_edits, by_bias);
}

}  // namespace
}  // namespace ember

namespace ember {
namespace {

// llama.cpp's samplers through Sample(): where they sit in the order, their statistics, seeds.

// XTC with probability 0.3 and threshold 0.25 on p = 0.4, 0.3, 0.2, 0.1: when triggered (30%)
// token 0 is removed and 1, 2, 3 are drawn as 0.5, 1/3, 1/6; else the plain distribution.
TEST(LlamaSamplersTest, XtcTriggersWithItsProbability) {
  SamplingParams params;
  params.xtc_probability = 0.3f;
  params.xtc_threshold = 0.25f;
  constexpr int kXtcDraws = 20000;
  const auto counts = Histogram({0.4, 0.3, 0.2, 0.1}, params, kXtcDraws);
  // 20k draws: the standard error is <= 0.0035; 0.015 is ~4 sigma.
  const auto frequency = [&](int32_t id) {
    const auto it = counts.find(id);
    return it == counts.end() ? 0.0 : static_cast<double>(it->second) / kXtcDraws;
  };
  EXPECT_NEAR(frequency(0), 0.7 * 0.4, 0.015);
  EXPECT_NEAR(frequency(1), 0.7 * 0.3 + 0.3 * 0.5, 0.015);
  EXPECT_NEAR(frequency(2), 0.7 * 0.2 + 0.3 / 3, 0.015);
  EXPECT_NEAR(frequency(3), 0.7 * 0.1 + 0.3 / 6, 0.015);
  // The trigger alone, over positions of one sequence: 30% of them.
  SamplerState state(params, 0, {});
  int triggered = 0;
  for (int i = 0; i < kXtcDraws; ++i) {
    triggered += state.XtcUniform() < params.xtc_probability;
    state.Accept(0);
  }
  EXPECT_NEAR(static_cast<double>(triggered) / kXtcDraws, 0.3, 0.015);
}

TEST(LlamaSamplersTest, XtcAlwaysRemovesTheTopWithProbabilityOne) {
  SamplingParams params;
  params.xtc_probability = 1.0f;
  params.xtc_threshold = 0.25f;
  ExpectFrequencies(Histogram({0.4, 0.3, 0.2, 0.1}, params, kDraws),
                    {{1, 0.5}, {2, 1.0 / 3}, {3, 1.0 / 6}}, kDraws);
}

// typical_p 0.5 on p = 1/2, 1/4, 1/8, 1/8 keeps ids 0 and 1 (distribution_filters_test.cc).
TEST(LlamaSamplersTest, TypicalPKeepsTheTypicalSetRenormalised) {
  SamplingParams params;
  params.typical_p = 0.5f;
  ExpectFrequencies(Histogram({0.5, 0.25, 0.125, 0.125}, params, kDraws),
                    {{0, 2.0 / 3}, {1, 1.0 / 3}}, kDraws);
  params.typical_p = 0.2f;  // only id 1
  ExpectFrequencies(Histogram({0.5, 0.25, 0.125, 0.125}, params, kDraws), {{1, 1.0}}, kDraws);
}

// Logits ln p; top-n-sigma 1 on ln(0.4), ln(0.3), ln(0.2), ln(0.1), ln(0.0001): mean -3.08,
// sigma 2.95, floor -0.92 - 2.95: keeps 0.4, 0.3, 0.2, 0.1 (>= -3.87), drops 1e-4 (-9.2).
TEST(LlamaSamplersTest, TopNSigmaDropsTheTail) {
  SamplingParams params;
  params.top_n_sigma = 1.0f;
  ExpectFrequencies(Histogram({0.4, 0.3, 0.2, 0.1, 0.0001}, params, kDraws),
                    {{0, 0.4}, {1, 0.3}, {2, 0.2}, {3, 0.1}}, kDraws);
  params.top_n_sigma = 0.2f;  // floor -0.92 - 0.59 = -1.51: 0.4 (-0.92) and 0.3 (-1.20)
  ExpectFrequencies(Histogram({0.4, 0.3, 0.2, 0.1, 0.0001}, params, kDraws),
                    {{0, 4.0 / 7}, {1, 3.0 / 7}}, kDraws);
}

TEST(LlamaSamplersTest, SeededAndBatchIndependentWithEverySamplerOn) {
  SamplingParams params;
  params.seed = 42;
  params.top_n_sigma = 2.0f;
  params.typical_p = 0.9f;
  params.xtc_probability = 0.5f;
  params.xtc_threshold = 0.05f;
  params.dry_multiplier = 0.8f;
  params.dry_breaker_ids = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{7});
  const std::vector<int32_t> a = Generate(params, 0, 64);
  EXPECT_EQ(a, Generate(params, 0, 64));
  EXPECT_NE(a, Generate(params, 1, 64));
  // In a batch with other rows (SampleRows on threads): the same tokens.
  SamplingParams other;
  other.seed = 7;
  SamplerState mine(params, 0, {}), theirs(other, 0, {});
  std::vector<int32_t> batched;
  for (int i = 0; i < 64; ++i) {
    std::vector<float> logits = RandomLogits(1000u + static_cast<uint32_t>(i), kVocab, 1.0f);
    const std::vector<float> second = RandomLogits(5u + static_cast<uint32_t>(i));
    logits.insert(logits.begin(), second.begin(), second.end());
    const SamplingParams* ps[] = {&other, &params};
    SamplerState* ss[] = {&theirs, &mine};
    std::vector<SampleOutput> out(2);
    SampleRows(logits, kVocab, ps, ss, out);
    theirs.Accept(out[0].token_id);
    mine.Accept(out[1].token_id);
    batched.push_back(out[1].token_id);
  }
  EXPECT_EQ(batched, a);
}

TEST(LlamaSamplersTest, HostOnlyFiltersKeepSampledRowsOffTheBackend) {
  SamplingParams p;
  EXPECT_TRUE(BackendCanSample(p));
  p.dry_multiplier = 1.0f;  // DRY is an edit list: a backend applies it
  EXPECT_TRUE(BackendCanSample(p));
  for (auto set : {+[](SamplingParams& q) { q.typical_p = 0.9f; },
                   +[](SamplingParams& q) { q.xtc_probability = 0.1f; },
                   +[](SamplingParams& q) { q.top_n_sigma = 1.0f; }}) {
    SamplingParams q;
    set(q);
    EXPECT_FALSE(BackendCanSample(q));
    q.temperature = 0.0f;  // greedy: argmax after the processors, as on the backend
    q.typical_p = 1.0f;
    q.xtc_probability = 0.0f;
    EXPECT_TRUE(BackendCanSample(q));
  }
}

TEST(LlamaSamplersTest, ValidationNamesTheField) {
  const auto message = [](void (*set)(SamplingParams&)) {
    SamplingParams p;
    set(p);
    return p.Validate(kVocab).message();
  };
  EXPECT_EQ(message([](SamplingParams& p) { p.xtc_threshold = 0.6f; }),
            "xtc_threshold: must be in [0, 0.5], got 0.6");
  EXPECT_EQ(message([](SamplingParams& p) { p.xtc_probability = 1.5f; }),
            "xtc_probability: must be in [0, 1], got 1.5");
  EXPECT_EQ(message([](SamplingParams& p) { p.typical_p = 0.0f; }),
            "typical_p: must be in (0, 1], got 0");
  EXPECT_EQ(message([](SamplingParams& p) { p.top_n_sigma = -2.0f; }),
            "top_n_sigma: must be > 0 (or 0 / -1: off), got -2");
  EXPECT_EQ(message([](SamplingParams& p) { p.dry_multiplier = -1.0f; }),
            "dry_multiplier: must be in [0, 100], got -1");
  EXPECT_EQ(message([](SamplingParams& p) { p.dry_base = 0.5f; }),
            "dry_base: must be in [1, 10], got 0.5");
  EXPECT_EQ(message([](SamplingParams& p) { p.dry_allowed_length = 0; }),
            "dry_allowed_length: must be >= 1, got 0");
  EXPECT_EQ(message([](SamplingParams& p) { p.dry_penalty_last_n = -2; }),
            "dry_penalty_last_n: must be >= 0 (0: off) or -1 (the whole sequence), got -2");
  EXPECT_EQ(message([](SamplingParams& p) { p.dry_sequence_breakers = {"a", ""}; }),
            "dry_sequence_breakers[1]: must be a string of 1 to 64 bytes, got 0");
  EXPECT_EQ(message([](SamplingParams& p) {
              p.temperature = 0.0f;
              p.xtc_probability = 0.5f;
            }).rfind("xtc_probability: needs temperature > 0", 0),
            0u);
  EXPECT_EQ(message([](SamplingParams& p) {
              p.temperature = 0.0f;
              p.typical_p = 0.5f;
            }).rfind("typical_p: needs temperature > 0", 0),
            0u);
}

}  // namespace
}  // namespace ember
