#include "sampling/schema_decimal.h"

#include <cstdlib>
#include <string_view>

#include "util/check.h"

namespace ember {

namespace {

// A JSON number's spelling as digits * 10^exponent (sign dropped): "0.0125" is 125e-4.
struct Spelled {
  bool negative = false;
  std::string digits;  // no leading zeros ("" for zero)
  int exponent = 0;
};

std::optional<Spelled> Spell(std::string_view text) {
  Spelled out;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') out.negative = true, ++i;
  bool dot = false;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') {
      dot = true;
      continue;
    }
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    if (dot) --out.exponent;
    if (!out.digits.empty() || text[i] != '0') out.digits.push_back(text[i]);
  }
  if (i < text.size()) {
    const std::string e(text.substr(i + 1));
    if (e.empty() || e.size() > 5) return std::nullopt;
    out.exponent += std::atoi(e.c_str());
  }
  while (!out.digits.empty() && out.digits.back() == '0') out.digits.pop_back(), ++out.exponent;
  return out;
}

ScaledInt Pow10(int e) {
  ScaledInt v = 1;
  for (int i = 0; i < e; ++i) v *= 10;
  return v;
}

// floor (or ceil) of |digits * 10^exponent| as an integer.
ScaledInt Rounded(const Spelled& s, bool up) {
  ScaledInt n = 0;
  if (s.exponent >= 0) {
    for (char c : s.digits) n = n * 10 + (c - '0');
    return n * Pow10(s.exponent);
  }
  const auto keep = static_cast<int>(s.digits.size()) + s.exponent;  // integer digits
  bool rest = false;
  for (int i = 0; i < static_cast<int>(s.digits.size()); ++i) {
    if (i < keep) n = n * 10 + (s.digits[static_cast<size_t>(i)] - '0');
    else rest |= s.digits[static_cast<size_t>(i)] != '0';
  }
  return n + (up && rest ? 1 : 0);
}

}  // namespace

std::optional<DecimalRatio> DecimalRatioOf(const nlohmann::ordered_json& value) {
  if (!value.is_number()) return std::nullopt;
  const std::optional<Spelled> s = Spell(value.dump());
  if (!s || s->negative || s->digits.empty() || s->digits.size() > 18 || s->exponent < -340 ||
      s->exponent > 340) {
    return std::nullopt;
  }
  DecimalRatio r;
  r.p = std::atoll(s->digits.c_str());
  r.scale = -s->exponent;
  return r;
}

ScaledInt ScaledBound(double x, int scale, bool lower, bool exclusive) {
  CHECK(scale >= 0 && scale <= 16);
  std::optional<Spelled> s = Spell(nlohmann::ordered_json(x).dump());
  CHECK(s.has_value());
  s->exponent += scale;
  // floor(v) and ceil(v) of v = x * 10^scale; |x|'s rounding flips for negative x.
  const ScaledInt down = s->negative ? -Rounded(*s, true) : Rounded(*s, false);
  const ScaledInt up = s->negative ? -Rounded(*s, false) : Rounded(*s, true);
  if (lower) return exclusive ? down + 1 : up;
  return exclusive ? up - 1 : down;
}

}  // namespace ember
