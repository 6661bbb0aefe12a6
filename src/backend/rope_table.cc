#include "backend/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ember {
namespace {

// YaRN: the rotary dimension at which a frequency completes `rotations` turns over the original
// context (transformers' find_correction_dim, in double as Python computes it).
double YarnCorrectionDim(double rotations, int32_t dim, double base, double original_len) {
  return dim * std::log(original_len / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

void ApplyYarn(const RopeSpec& spec, const std::vector<float>& pos_freq, std::vector<float>& inv) {
  const int32_t dim = spec.rotary_dim;
  double low = YarnCorrectionDim(spec.beta_fast, dim, spec.theta, spec.original_max_positions);
  double high = YarnCorrectionDim(spec.beta_slow, dim, spec.theta, spec.original_max_positions);
  if (spec.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  // The ramp in float32 (a torch.float32 tensor against Python floats).
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const float factor = static_cast<float>(spec.factor);
  for (size_t i = 0; i < inv.size(); ++i) {
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;  // weight of the unscaled frequency
    const float interpolated = 1.0f / (factor * pos_freq[i]);
    inv[i] = interpolated * (1.0f - extrapolation) + inv[i] * extrapolation;
  }
}

}  // namespace

std::vector<float> RopeInvFreq(const RopeSpec& spec) {
  const int32_t half = spec.rotary_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half)), pos_freq(inv.size());
  const float base = static_cast<float>(spec.theta);
  for (int32_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(spec.rotary_dim);
    const float pw = static_cast<float>(std::pow(static_cast<double>(base),
                                                 static_cast<double>(exponent)));
    pos_freq[static_cast<size_t>(i)] = pw;
    inv[static_cast<size_t>(i)] = 1.0f / pw;
  }
  if (spec.type == RopeSpec::Type::kLinear) {
    for (float& f : inv) f /= static_cast<float>(spec.factor);
  } else if (spec.type == RopeSpec::Type::kLlama3) {
    const float factor = static_cast<float>(spec.factor);
    const float low = static_cast<float>(spec.low_freq_factor);
    const float high = static_cast<float>(spec.high_freq_factor);
    const float old_len = static_cast<float>(spec.original_max_positions);
    const float low_wavelen = old_len / low;
    const float high_wavelen = old_len / high;
    for (float& f : inv) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const float smooth = (old_len / wavelen - low) / (high - low);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
  } else if (spec.type == RopeSpec::Type::kYarn) {
    ApplyYarn(spec, pos_freq, inv);
  }
  for (size_t i = 0; i < spec.freq_factors.size() && i < inv.size(); ++i)
    inv[i] /= spec.freq_factors[i];
  return inv;
}

Result<RopeTable> BuildRopeTable(const RopeSpec& spec) {
  if (spec.head_dim <= 0 || spec.rotary_dim <= 0 || spec.rotary_dim > spec.head_dim ||
      spec.rotary_dim % 2 != 0)
    return Status::Error("RopeSpec: rotary_dim " + std::to_string(spec.rotary_dim) +
                         " must be even and in (0, head_dim " + std::to_string(spec.head_dim) +
                         "]");
  if (spec.max_positions <= 0)
    return Status::Error("RopeSpec: max_positions must be > 0");
  if (spec.theta <= 0) return Status::Error("RopeSpec: theta must be > 0");
  if (!spec.freq_factors.empty()) {
    if (spec.freq_factors.size() != static_cast<size_t>(spec.rotary_dim / 2))
      return Status::Error("RopeSpec: freq_factors has " + std::to_string(spec.freq_factors.size()) +
                           " entries, expected rotary_dim / 2 = " +
                           std::to_string(spec.rotary_dim / 2));
    for (float f : spec.freq_factors)
      if (!(f > 0)) return Status::Error("RopeSpec: freq_factors must be > 0");
  }
  if (spec.type != RopeSpec::Type::kDefault && spec.factor <= 0)
    return Status::Error("RopeSpec: factor must be > 0");
  if (spec.type == RopeSpec::Type::kLlama3 &&
      (spec.high_freq_factor == spec.low_freq_factor || spec.original_max_positions <= 0))
    return Status::Error("RopeSpec: llama3 needs high_freq_factor != low_freq_factor and "
                         "original_max_positions > 0");
  if (spec.type == RopeSpec::Type::kYarn &&
      (spec.original_max_positions <= 0 || spec.beta_fast <= 0 || spec.beta_slow <= 0))
    return Status::Error("RopeSpec: yarn needs original_max_positions, beta_fast and beta_slow > 0");
  if (!(spec.attention_factor > 0)) return Status::Error("RopeSpec: attention_factor must be > 0");
  const std::vector<float> inv = RopeInvFreq(spec);
  const size_t half = inv.size();
  const float scale = static_cast<float>(spec.attention_factor);
  RopeTable table;
  table.cos.resize(static_cast<size_t>(spec.max_positions) * half);
  table.sin.resize(table.cos.size());
  for (int32_t pos = 0; pos < spec.max_positions; ++pos) {
    for (size_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv[i];  // f32 product, as HF
      const size_t at = static_cast<size_t>(pos) * half + i;
      table.cos[at] = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
      table.sin[at] = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
    }
  }
  return table;
}

}  // namespace ember
