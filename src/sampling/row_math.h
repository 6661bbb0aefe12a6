// Row math the compiler vectorises (the sampling library builds with -fno-trapping-math so that
// GCC if-converts the selects): RowMax, and ExpNonPositive, exp(x) for x <= 0 by Cephes' expf
// polynomial (about 1 ulp, no libm call per element). Pure functions; thread-safe.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

namespace ember {

// The largest element, ignoring NaN; -inf for an empty or all-NaN/-inf row.
inline float RowMax(std::span<const float> row) {
  constexpr size_t kLanes = 16;
  float lanes[kLanes];
  for (float& lane : lanes) lane = -std::numeric_limits<float>::infinity();
  const float* x = row.data();
  size_t i = 0;
  for (; i + kLanes <= row.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] = lanes[j] < x[i + j] ? x[i + j] : lanes[j];
  }
  float max = -std::numeric_limits<float>::infinity();
  for (float lane : lanes) max = max < lane ? lane : max;
  for (; i < row.size(); ++i) max = max < x[i] ? x[i] : max;
  return max;
}

// exp(x) for x <= 0. Exactly 1 at x == 0; 0 for x < -87 or NaN (never a denormal).
inline float ExpNonPositive(float x) {
  const bool in_range = x >= -87.0f;  // false for NaN
  x = in_range ? std::min(x, 0.0f) : 0.0f;
  // x = n * ln2 + r with |r| <= ln2 / 2; ln2 split in two for an exact n * ln2_hi.
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return in_range ? y * scale : 0.0f;
}

}  // namespace ember
