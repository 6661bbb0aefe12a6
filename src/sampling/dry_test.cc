// DRY: penalties for constructed repeats, computed by hand from the definition in dry.h; the
// breaker rules; the window; the edit list's order; breaker ids from token texts.
#include "sampling/dry.h"

#include <gtest/gtest.h>

#include <cfloat>

#include "sampling/logit_edits.h"
#include "sampling/sampler.h"

namespace ember {
namespace {

using Penalties = std::vector<std::pair<int32_t, float>>;

SamplingParams Dry(float multiplier, float base, int32_t allowed_length) {
  SamplingParams p;
  p.dry_multiplier = multiplier;
  p.dry_base = base;
  p.dry_allowed_length = allowed_length;
  return p;
}

Penalties PenaltiesOf(const std::vector<int32_t>& window, const SamplingParams& p,
              const std::vector<int32_t>& breakers = {}) {
  Penalties out;
  DryPenalties(window, p, breakers, &out);
  return out;
}

TEST(DryTest, RepeatOfThreePenalisesTheTokenThatWouldContinueIt) {
  // ... 1 2 3 | 4 ... 1 2 3: "1 2 3" repeats (L = 3) and 4 followed it: 1 * 2^(3 - 2) = 2.
  EXPECT_EQ(PenaltiesOf({1, 2, 3, 4, 1, 2, 3}, Dry(1.0f, 2.0f, 2)), (Penalties{{4, 2.0f}}));
  // allowed_length 3: 2^0; 4: the repeat is allowed.
  EXPECT_EQ(PenaltiesOf({1, 2, 3, 4, 1, 2, 3}, Dry(0.5f, 2.0f, 3)), (Penalties{{4, 0.5f}}));
  EXPECT_TRUE(PenaltiesOf({1, 2, 3, 4, 1, 2, 3}, Dry(1.0f, 2.0f, 4)).empty());
  // No earlier occurrence of the last token: nothing.
  EXPECT_TRUE(PenaltiesOf({1, 2, 3, 4, 5}, Dry(1.0f, 2.0f, 1)).empty());
}

TEST(DryTest, EachCandidateTakesItsLongestMatch) {
  // Token 1 follows "7 8" (L = 2); token 2 follows "9 7 8" (L = 3). multiplier 0.8, base 1.75,
  // allowed 2: 1 -> 0.8, 2 -> 0.8 * 1.75 = 1.4.
  const Penalties got = PenaltiesOf({7, 8, 1, 9, 7, 8, 2, 9, 7, 8}, Dry(0.8f, 1.75f, 2));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, 1);
  EXPECT_FLOAT_EQ(got[0].second, 0.8f);
  EXPECT_EQ(got[1].first, 2);
  EXPECT_FLOAT_EQ(got[1].second, 1.4f);
  // A run of one token: "5 5 5 5" — after position i the match is i + 1 long, capped by the
  // window; the longest (L = 4, at i = 3) wins for candidate 5: 2^(4 - 2) = 4.
  EXPECT_EQ(PenaltiesOf({5, 5, 5, 5, 5}, Dry(1.0f, 2.0f, 2)), (Penalties{{5, 4.0f}}));
}

TEST(DryTest, BreakersCutMatchesAndAreNeverPenalised) {
  // Breaker 1 bounds the match to the two tokens after it: L = 2 -> 2^0.
  EXPECT_EQ(PenaltiesOf({1, 2, 3, 4, 1, 2, 3}, Dry(1.0f, 2.0f, 2), {1}), (Penalties{{4, 1.0f}}));
  // The last token is a breaker: nothing.
  EXPECT_TRUE(PenaltiesOf({1, 2, 3, 4, 1, 2, 3}, Dry(1.0f, 2.0f, 1), {3}).empty());
  // The candidate is a breaker: not penalised.
  EXPECT_TRUE(PenaltiesOf({5, 6, 9, 5, 6}, Dry(1.0f, 2.0f, 2), {9}).empty());
}

TEST(DryTest, HugeRepeatsAreCappedFinite) {
  std::vector<int32_t> window(400, 3);
  const Penalties got = PenaltiesOf(window, Dry(100.0f, 10.0f, 1));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].second, FLT_MAX);
}

TEST(DryTest, WindowIsTheLastNTokensOfPromptAndOutput) {
  SamplingParams p = Dry(1.0f, 2.0f, 2);
  p.dry_penalty_last_n = 4;
  SamplerState state(p, 0, std::vector<int32_t>{1, 2, 3, 4});
  for (int32_t id : {1, 2, 3}) state.Accept(id);
  EXPECT_EQ(std::vector<int32_t>(state.dry_window().begin(), state.dry_window().end()),
            (std::vector<int32_t>{4, 1, 2, 3}));
  // The repeat of "1 2 3" lies outside the window: nothing.
  Penalties out;
  DryPenalties(state.dry_window(), p, {}, &out);
  EXPECT_TRUE(out.empty());
  // -1: the whole sequence, prompt included.
  p.dry_penalty_last_n = -1;
  SamplerState all(p, 0, std::vector<int32_t>{1, 2, 3, 4});
  for (int32_t id : {1, 2, 3}) all.Accept(id);
  DryPenalties(all.dry_window(), p, {}, &out);
  EXPECT_EQ(out, (Penalties{{4, 2.0f}}));
  // Many tokens through a small window keep it exact (the history is trimmed now and then).
  p.dry_penalty_last_n = 3;
  SamplerState trimmed(p, 0, {});
  for (int32_t i = 0; i < 1000; ++i) trimmed.Accept(i);
  EXPECT_EQ(std::vector<int32_t>(trimmed.dry_window().begin(), trimmed.dry_window().end()),
            (std::vector<int32_t>{997, 998, 999}));
  // 0: off (llama.cpp's meaning); no history is kept.
  p.dry_penalty_last_n = 0;
  EXPECT_FALSE(p.has_dry());
  SamplerState off(p, 0, std::vector<int32_t>{1, 2, 3});
  EXPECT_TRUE(off.dry_window().empty());
}

TEST(DryTest, EditsSubtractAfterTheFrequencyPenalty) {
  SamplingParams p = Dry(1.0f, 2.0f, 2);
  p.frequency_penalty = 0.5f;
  p.logit_bias = {{4, 1.0f}, {9, -2.0f}};
  SamplerState state(p, 0, std::vector<int32_t>{1, 2, 3, 4});
  for (int32_t id : {1, 2, 3}) state.Accept(id);
  std::vector<LogitEdit> edits;
  AppendLogitEdits(p, state, 0, edits);
  // Token 4 is only in the prompt (no frequency edit): its bias, then DRY's 2.
  std::vector<LogitEdit> of4;
  for (const LogitEdit& e : edits)
    if (e.token == 4) of4.push_back(e);
  ASSERT_EQ(of4.size(), 2u);
  EXPECT_EQ(of4[0].op, LogitEditOp::kAdd);
  EXPECT_EQ(of4[1].op, LogitEditOp::kSubtract);
  EXPECT_EQ(of4[1].value, 2.0f);
  // Applied through Sample (greedy): token 4 leads by 1.5 before DRY and loses after it.
  std::vector<float> logits(10, 0.0f);
  logits[4] = 0.5f;  // + bias 1 = 1.5; - DRY 2 = -0.5
  logits[7] = 1.0f;
  p.temperature = 0.0f;
  EXPECT_EQ(Sample(logits, p, state).token_id, 7);
}

TEST(DryTest, BreakerIdsAreTheTokensContainingABreaker) {
  const std::vector<std::string> texts = {"a", "b\n", ":", "x:y", "plain", "\"q"};
  const TokenTextFn text = [&](int32_t id) -> std::optional<std::string_view> {
    if (id == 6) return std::nullopt;
    return texts[static_cast<size_t>(id)];
  };
  const std::vector<std::string> breakers = SamplingParams::DefaultDrySequenceBreakers();
  EXPECT_EQ(DryBreakerIds(breakers, 7, text), (std::vector<int32_t>{1, 2, 3, 5}));
  SamplingParams p = Dry(1.0f, 2.0f, 2);
  ResolveDryBreakers(&p, 7, text);
  ASSERT_NE(p.dry_breaker_ids, nullptr);
  EXPECT_EQ(*p.dry_breaker_ids, (std::vector<int32_t>{1, 2, 3, 5}));
  SamplingParams off;  // DRY off: nothing resolved
  ResolveDryBreakers(&off, 7, text);
  EXPECT_EQ(off.dry_breaker_ids, nullptr);
}

}  // namespace
}  // namespace ember
