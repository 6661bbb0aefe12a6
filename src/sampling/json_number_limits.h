// The digit limits of every JSON number Ember's constraints let a model write (JSON mode and
// JSON Schema alike): at most 18 integer digits, 16 fraction digits and a two-digit exponent.
// Every such number is a finite double (parsers such as serde_json refuse 1e999, and JavaScript
// reads it as Infinity), and a model cannot pad a number forever.
#pragma once

namespace ember {

inline constexpr int kJsonMaxIntegerDigits = 18;
inline constexpr int kJsonMaxFractionDigits = 16;
inline constexpr int kJsonMaxExponentDigits = 2;

}  // namespace ember
