// Rope cos/sin tables computed on the host the way Hugging Face does (float32 inverse
// frequencies, float32 angle = position * inv_freq, then cos/sin times the spec's attention
// factor), for every RopeSpec type. Both backends build their tables here. Pure functions;
// thread-safe.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "util/status.h"

namespace ember {

// inv_freq [rotary_dim / 2] after the spec's scaling (kLinear: / factor; kLlama3: banded;
// kYarn: interpolated below the correction range, extrapolated above it, ramped between), then
// divided by freq_factors when given.
std::vector<float> RopeInvFreq(const RopeSpec& spec);

struct RopeTable {
  std::vector<float> cos, sin;  // each [max_positions, rotary_dim / 2], times attention_factor
};
// Errors name the bad RopeSpec field.
Result<RopeTable> BuildRopeTable(const RopeSpec& spec);

}  // namespace ember
