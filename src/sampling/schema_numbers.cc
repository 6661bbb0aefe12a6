#include "sampling/schema_numbers.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string_view>

#include "sampling/json_number_limits.h"
#include "util/check.h"

namespace ember {

namespace {

using json = nlohmann::ordered_json;

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

Status Refuse(const std::string& path, const std::string& what) {
  return Status::Error(path + ": " + what);
}

// multipleOf as p / 10^scale (scale <= 0: an integer); {1, 0} without it.
Result<DecimalRatio> MultipleOf(const json& s, const std::string& path) {
  const auto it = s.find("multipleOf");
  if (it == s.end()) return DecimalRatio{1, 0};
  std::optional<DecimalRatio> m;
  if (it->is_number() && it->get<double>() > 0) m = DecimalRatioOf(*it);
  if (!m) return Refuse(path + ".multipleOf", "must be a positive number");
  for (; m->scale < 0 && m->p <= RegexDfa::kMaxDivisor; ++m->scale) m->p *= 10;
  if (m->p > RegexDfa::kMaxDivisor || m->scale > kJsonMaxFractionDigits || m->scale < 0) {
    return Refuse(path + ".multipleOf",
                       "supported: integers from 1 to " + std::to_string(RegexDfa::kMaxDivisor) +
                           " and decimals p / 10^k with p <= " +
                           std::to_string(RegexDfa::kMaxDivisor) + " and k <= " +
                           std::to_string(kJsonMaxFractionDigits) +
                           " (0.01, 2.5; a value such as 1/3 has no exact decimal)");
  }
  return *m;
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

// minimum / maximum / exclusiveMinimum / exclusiveMaximum and multipleOf as an automaton over the
// number's text (schema_regexes.h), and the digit limits for every number. Exact for integers
// and for numbers with a fractional multipleOf p / 10^k (bounds scaled by 10^k: the values are
// n / 10^k, written without exponent); otherwise number bounds are rounded inward to integers
// (the documented approximation: decimals only where their whole unit interval fits) and an
// integer multipleOf writes integers.
Result<std::shared_ptr<const RegexDfa>> NumberKeywordsDfa(const json& s, bool integer,
                                                          const std::string& path) {
  constexpr double kLimit = 1e18;
  EMBER_ASSIGN_OR_RETURN(DecimalRatio multiple, MultipleOf(s, path));
  if (multiple.scale > 0 && integer) {  // integers n with n * 10^k divisible by p
    int64_t ten_k = 1;
    for (int i = 0; i < multiple.scale; ++i) ten_k *= 10;
    multiple = DecimalRatio{multiple.p / std::gcd(multiple.p, ten_k), 0};
  }
  const bool decimal = multiple.scale > 0;
  integer = integer || (s.contains("multipleOf") && !decimal);
  std::optional<ScaledInt> lo, hi;  // in units of 10^-scale
  bool any = false;
  for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    const auto it = s.find(key);
    if (it == s.end() || it->is_boolean()) continue;  // draft 4's boolean exclusive* below
    if (!it->is_number()) return Refuse(path + "." + key, "must be a number");
    any = true;
    const std::string_view name(key);
    const bool lower = name == "minimum" || name == "exclusiveMinimum";
    const std::string other = std::string("exclusive") + (lower ? "Minimum" : "Maximum");
    const bool exclusive = name.starts_with("exclusive") ||
                           (s.contains(other) && s[other].is_boolean() && s[other].get<bool>());
    const double x = it->get<double>();
    if (lower ? x < -kLimit : x > kLimit) continue;  // no bound within reach
    if (std::fabs(x) > kLimit)
      return Refuse(path + "." + key, "bounds beyond ±10^18 are not supported");
    const ScaledInt bound = ScaledBound(x, multiple.scale, lower, exclusive);
    if (lower) lo = lo ? std::max(*lo, bound) : bound;
    if (!lower) hi = hi ? std::min(*hi, bound) : bound;
  }
  const std::string where = !any ? path : path + "." + (lo ? "minimum" : "maximum");
  if (!lo && !hi && !s.contains("multipleOf")) {  // the digit limits alone (schema_regexes.h)
    const std::string regex = integer ? IntegerRangeRegex(lo, hi) : UnboundedNumberRegex();
    return CompileRegex(regex, RegexMatch::kWhole, where);
  }
  if (lo && hi && *lo > *hi)
    return Refuse(where, "no " + std::string(integer ? "integer" : "value") +
                                  " lies within the bounds" +
                                  (integer || decimal ? "" : " (number bounds are rounded inward "
                                                             "to integers)"));
  std::string regex;
  if (decimal) {
    regex = ScaledDecimalRangeRegex(lo, hi, multiple.scale);
  } else {
    const auto narrow = [](const std::optional<ScaledInt>& v) {
      return v ? std::optional<int64_t>(static_cast<int64_t>(*v)) : std::nullopt;
    };
    regex = integer ? IntegerRangeRegex(narrow(lo), narrow(hi)) : NumberRangeRegex(narrow(lo), narrow(hi));
  }
  if (regex.empty()) return Refuse(where, "no value within the digit limits lies within the bounds");
  EMBER_ASSIGN_OR_RETURN(auto dfa, CompileRegex(regex, RegexMatch::kWhole, where));
  if (multiple.p > 1) {
    const std::string at = path + ".multipleOf";
    std::shared_ptr<const RegexDfa> multiples;
    if (decimal) {
      EMBER_ASSIGN_OR_RETURN(multiples, RegexDfa::DecimalMultiples(multiple.p, multiple.scale, at));
    } else {
      multiples = RegexDfa::Multiples(multiple.p);
    }
    EMBER_ASSIGN_OR_RETURN(dfa, RegexDfa::Intersect(*dfa, *multiples, at));
  }
  return dfa;
}

}  // namespace ember
