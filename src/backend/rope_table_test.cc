// The rope table builder (both backends' tables) against independent double-precision formulas:
// default, linear, llama3 and YaRN inverse frequencies, and the attention factor on cos/sin.
#include "backend/rope_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ember {
namespace {

TEST(RopeTableTest, InvFreqMatchesFormula) {
  RopeSpec spec;
  spec.head_dim = 128;
  spec.rotary_dim = 128;
  spec.theta = 500000.0;
  spec.max_positions = 16;
  for (auto type : {RopeSpec::Type::kDefault, RopeSpec::Type::kLinear, RopeSpec::Type::kLlama3}) {
    spec.type = type;
    spec.factor = type == RopeSpec::Type::kDefault ? 1.0 : 8.0;
    const std::vector<float> inv = RopeInvFreq(spec);
    ASSERT_EQ(inv.size(), 64u);
    for (size_t i = 0; i < inv.size(); ++i) {
      double f = 1.0 / std::pow(spec.theta, 2.0 * static_cast<double>(i) / spec.rotary_dim);
      if (type == RopeSpec::Type::kLinear) f /= spec.factor;
      if (type == RopeSpec::Type::kLlama3) {
        const double wavelen = 2 * std::numbers::pi / f;
        const double low_wl = spec.original_max_positions / spec.low_freq_factor;
        const double high_wl = spec.original_max_positions / spec.high_freq_factor;
        if (wavelen > low_wl) {
          f /= spec.factor;
        } else if (wavelen >= high_wl) {
          const double smooth = (spec.original_max_positions / wavelen - spec.low_freq_factor) /
                                (spec.high_freq_factor - spec.low_freq_factor);
          f = (1 - smooth) * f / spec.factor + smooth * f;
        }
      }
      EXPECT_NEAR(inv[i], f, 2e-6 * f) << "type " << static_cast<int>(type) << " i " << i;
    }
  }
  spec.rotary_dim = 7;
  EXPECT_FALSE(BuildRopeTable(spec).ok());
}

// YaRN (transformers' _compute_yarn_parameters): frequencies below the correction range are
// divided by the factor, those above kept, a linear ramp between; gpt-oss's parameters, with and
// without truncation of the range.
TEST(RopeTableTest, YarnMatchesFormula) {
  RopeSpec spec;
  spec.type = RopeSpec::Type::kYarn;
  spec.head_dim = 64;
  spec.rotary_dim = 64;
  spec.theta = 150000.0;
  spec.factor = 32.0;
  spec.original_max_positions = 4096;
  spec.beta_fast = 32.0;
  spec.beta_slow = 1.0;
  spec.attention_factor = 0.1 * std::log(32.0) + 1.0;
  spec.max_positions = 64;
  for (bool truncate : {false, true}) {
    spec.truncate = truncate;
    const int dim = spec.rotary_dim;
    auto correction = [&](double rotations) {
      return dim * std::log(spec.original_max_positions / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(spec.theta));
    };
    double low = correction(spec.beta_fast), high = correction(spec.beta_slow);
    if (truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1.0);
    const std::vector<float> inv = RopeInvFreq(spec);
    ASSERT_EQ(inv.size(), 32u);
    int interpolated = 0, kept = 0;
    for (size_t i = 0; i < inv.size(); ++i) {
      const double base = 1.0 / std::pow(spec.theta, 2.0 * static_cast<double>(i) / dim);
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double f = base / spec.factor * ramp + base * (1 - ramp);
      interpolated += ramp == 1.0;
      kept += ramp == 0.0;
      EXPECT_NEAR(inv[i], f, 3e-6 * f) << "truncate " << truncate << " i " << i;
    }
    EXPECT_GT(interpolated, 0);
    EXPECT_GT(kept, 0);
    auto table = BuildRopeTable(spec);
    ASSERT_TRUE(table.ok()) << table.message();
    const size_t half = inv.size();
    for (int32_t pos : {0, 1, 63})
      for (size_t i : {size_t{0}, size_t{17}, half - 1}) {
        const double angle = static_cast<float>(pos) * inv[i];
        EXPECT_NEAR(table->cos[pos * half + i], std::cos(angle) * spec.attention_factor, 1e-6);
        EXPECT_NEAR(table->sin[pos * half + i], std::sin(angle) * spec.attention_factor, 1e-6);
      }
  }
  spec.original_max_positions = 0;
  EXPECT_FALSE(BuildRopeTable(spec).ok());
}

}  // namespace
}  // namespace ember
