// The numeric keywords of a JSON Schema — minimum / maximum / exclusiveMinimum /
// exclusiveMaximum (draft 4's boolean exclusive* too) and multipleOf — as one automaton over the
// number's JSON text (json_schema.cc runs it as the number's leaf). Exact for integers, and for
// numbers with a fractional multipleOf p / 10^k (0.01 = 1 / 10^2, 2.5 = 25 / 10^1): the bounds
// are scaled by 10^k and rounded to integers (ceil for a lower bound, floor for an upper one),
// so "x is a multiple within the bounds" is "x * 10^k is an integer n with p | n, n in [lo, hi]"
// (schema_regexes.h's ScaledDecimalRangeRegex ∩ RegexDfa::DecimalMultiples), written without
// exponent. Otherwise number bounds are rounded inward to integers (decimals only where their
// whole unit interval fits) and an integer multipleOf writes integers. A number is read from its
// shortest round-trip spelling (what the client wrote: 0.01 is 1 / 10^2, not the double's binary
// expansion), so the arithmetic is decimal. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "sampling/regex_dfa.h"
#include "sampling/schema_regexes.h"
#include "util/status.h"

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
// with `exclusive`, the integers strictly inside: floor + 1 / ceil - 1. |x| <= 10^18 and
// scale <= 16 (the caller bounds them).
ScaledInt ScaledBound(double x, int scale, bool lower, bool exclusive);

// The automaton of the numeric keywords of `s` (a number or integer schema; the digit limits of
// json_number_limits.h alone without them); errors name `path` and the keyword: a multipleOf
// other than an integer 1..kMaxDivisor or a decimal p / 10^k (p <= kMaxDivisor, k <= 16), bounds
// beyond ±10^18, bounds no value lies within, automata past RegexDfa::kMaxStates.
Result<std::shared_ptr<const RegexDfa>> NumberKeywordsDfa(const nlohmann::ordered_json& s,
                                                          bool integer, const std::string& path);

}  // namespace ember
