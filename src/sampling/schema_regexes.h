// Regular expressions (regex_syntax.h's subset, matched whole) for the JSON Schema keywords that
// structured output enforces through a DFA: string `format`s and numeric ranges. Every regex is
// sound (what it matches is valid for the keyword) and may be narrower than the keyword (the
// documented approximations below: output is always valid, some valid values are never written).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ember {

// The regex of a string `format`, nullopt for a format that is not supported. Supported, with
// their approximations:
//   date       YYYY-MM-DD with the month's day count (February 29 is never written)
//   time       HH:MM:SS[.f{1,9}] with an offset, Z or ±HH:MM (RFC 3339 full-time)
//   date-time  date "T" time
//   uuid       8-4-4-4-12 hex digits
//   email      dot-atom local part @ dot-separated host labels (no quoted local parts, no IP hosts)
//   ipv4       dotted quad, no leading zeros
//   ipv6       the full eight-group form (no "::" compression, no embedded IPv4)
//   uri        scheme "://" host [":" port] path [?query] [#fragment] (no userinfo, no IP literals)
std::optional<std::string> FormatRegex(std::string_view format);
// The names FormatRegex supports, for error messages.
const char* SupportedFormats();

// Numbers are written within the digit limits of json_number_limits.h (every value a finite
// double; a model cannot pad a number forever).
//
// Integers in [lo, hi] (nullopt: unbounded on that side) as canonical JSON integers (no leading
// zeros, no "-0", no fraction or exponent). |bounds| must be below 10^18.
std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi);
// JSON numbers in [lo, hi] (integer bounds): the integers of IntegerRangeRegex, and decimals
// I.F (no exponent) whose integer part's whole unit interval lies within the bounds.
std::string NumberRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi);
// Any number within the digit limits (`type: number` without bounds).
std::string UnboundedNumberRegex();

// An integer n standing for the number n / 10^scale (|n| < 10^34: 18 integer digits and 16
// fraction digits).
using ScaledInt = __int128;
// JSON numbers without exponent whose value is n / 10^scale for an integer n in [lo, hi]
// (nullopt: unbounded on that side), exactly, in every spelling within the digit limits: the
// integer part, then optionally "." and digits of which those past the scale-th are zeros (1.5,
// 1.50); zero only unsigned ("0", "0.00"). scale in [1, kJsonMaxFractionDigits]. Together with
// RegexDfa::DecimalMultiples: a fractional multipleOf with its bounds. "" when empty.
std::string ScaledDecimalRangeRegex(std::optional<ScaledInt> lo, std::optional<ScaledInt> hi,
                                    int scale);

}  // namespace ember
