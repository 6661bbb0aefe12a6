// Rope cos/sin tables computed on the host the way Hugging Face does (float32 inverse
// frequencies, float32 angle = position * inv_freq, then cos/sin), for the three RopeSpec types.
// Pure functions; thread-safe.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "util/status.h"

namespace ember::cuda {

// inv_freq [rotary_dim / 2] after the spec's scaling (kLinear: / factor; kLlama3: banded).
std::vector<float> RopeInvFreq(const RopeSpec& spec);

struct RopeTable {
  std::vector<float> cos, sin;  // each [max_positions, rotary_dim / 2]
};
// Errors name the bad RopeSpec field.
Result<RopeTable> BuildRopeTable(const RopeSpec& spec);

}  // namespace ember::cuda
