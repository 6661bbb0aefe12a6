// Exact decimal arithmetic on the numbers of a JSON Schema's numeric keywords, for a fractional
// `multipleOf` (json_schema.cc): the keyword's value as p / 10^scale, and the bounds scaled by
// 10^scale and rounded to integers (ceil for a lower bound, floor for an upper one), so that
// "x is a multiple within the bounds" becomes "x * 10^scale is an integer n with p | n and n in
// [lo, hi]" (schema_regexes.h's ScaledDecimalRangeRegex, RegexDfa::DecimalMultiples). A number
// is read from its shortest round-trip spelling (what the client wrote: 0.01 is 1 / 10^2, not
// the double's binary expansion). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "sampling/schema_regexes.h"

namespace ember {

// A positive decimal p / 10^scale with p not divisible by 10 (scale may be <= 0: an integer).
struct DecimalRatio {
  int64_t p = 0;
  int scale = 0;
};

// `value` (a positive JSON number) as p / 10^scale; nullopt when its spelling has more than 18
// significant digits or an exponent beyond ±340 (never from a double).
std::optional<DecimalRatio> DecimalRatioOf(const nlohmann::ordered_json& value);

// ceil(x * 10^scale) (lower) or floor(x * 10^scale) (upper), x read as its shortest spelling;
// with `exclusive`, the integers strictly inside: floor + 1 / ceil - 1. |x| < 10^18 and
// scale <= 16 (the caller bounds them).
ScaledInt ScaledBound(double x, int scale, bool lower, bool exclusive);

}  // namespace ember
