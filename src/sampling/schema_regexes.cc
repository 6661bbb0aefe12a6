#include "sampling/schema_regexes.h"

#include <string>
#include <vector>

#include "sampling/json_number_limits.h"

namespace ember {

namespace {

constexpr const char* kDate =
    R"(\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8])))";
constexpr const char* kTime =
    R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
constexpr const char* kUriChar = R"((?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2}))";
constexpr const char* kUriQueryChar = R"((?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2}))";
constexpr const char* kLabel = R"([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
constexpr const char* kOctet = R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
constexpr const char* kAtext = R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-])";

std::string Repeat(char c, size_t n) {
  return std::string(n, c);
}

// Equal-length decimal strings lo <= hi: the strings of that length between them.
std::string SameLength(const std::string& lo, const std::string& hi) {
  if (lo == hi) return lo;
  if (lo.size() == 1) return std::string("[") + lo[0] + "-" + hi[0] + "]";
  if (lo[0] == hi[0]) return lo.substr(0, 1) + "(?:" + SameLength(lo.substr(1), hi.substr(1)) + ")";
  const size_t rest = lo.size() - 1;
  const bool lo_zeros = lo.substr(1) == Repeat('0', rest);
  const bool hi_nines = hi.substr(1) == Repeat('9', rest);
  std::vector<std::string> parts;
  char mid_lo = lo[0], mid_hi = hi[0];
  if (!lo_zeros) {
    parts.push_back(lo.substr(0, 1) + "(?:" + SameLength(lo.substr(1), Repeat('9', rest)) + ")");
    ++mid_lo;
  }
  if (!hi_nines) --mid_hi;
  if (mid_lo <= mid_hi)
    parts.push_back(std::string("[") + mid_lo + "-" + mid_hi + "]\\d{" + std::to_string(rest) +
                    "}");
  if (!hi_nines)
    parts.push_back(hi.substr(0, 1) + "(?:" + SameLength(Repeat('0', rest), hi.substr(1)) + ")");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "|") + p;
  return "(?:" + out + ")";
}

constexpr int64_t kUnbounded = -1;
constexpr size_t kMaxIntegerDigits = kJsonMaxIntegerDigits;
// A dot and 1 to kJsonMaxFractionDigits digits.
std::string Fraction() { return "\\.\\d{1," + std::to_string(kJsonMaxFractionDigits) + "}"; }

std::string JoinAlternatives(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out.push_back('|');
    out.append(p);
  }
  return out;
}

// Non-negative integers in [lo, hi] (hi kUnbounded: no upper bound), "" when empty.
std::string Magnitudes(int64_t lo, int64_t hi) {
  if (hi != kUnbounded && hi < lo) return "";
  std::vector<std::string> parts;
  const std::string los = std::to_string(lo);
  const size_t max_len = hi != kUnbounded ? std::to_string(hi).size() : los.size();
  for (size_t len = los.size(); len <= max_len; ++len) {
    std::string first = los;
    if (len != los.size()) first = std::string(1, '1').append(len - 1, '0');
    std::string last = Repeat('9', len);
    if (hi != kUnbounded && len == max_len) last = std::to_string(hi);
    parts.push_back(SameLength(first, last));
  }
  if (hi == kUnbounded && los.size() < kMaxIntegerDigits) {
    parts.push_back("[1-9]\\d{" + std::to_string(los.size()) + "," +
                    std::to_string(kMaxIntegerDigits - 1) + "}");
  }
  return "(?:" + JoinAlternatives(parts) + ")";
}

// The integers in [lo, hi], "" when empty.
std::string Integers(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> parts;
  if (!hi || *hi >= 0) {
    const std::string m = Magnitudes(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : kUnbounded);
    if (!m.empty()) parts.push_back(m);
  }
  if (!lo || *lo < 0) {
    const int64_t least = hi && *hi < 0 ? -*hi : 1;
    const std::string m = Magnitudes(least, lo ? -*lo : kUnbounded);
    if (!m.empty()) parts.push_back("-" + m);
  }
  return parts.empty() ? "" : "(?:" + JoinAlternatives(parts) + ")";
}

// Fraction digits t (after the dot) whose first a.size() digits, padded with zeros, lie in
// [a, b] (digit strings of one length) and whose later ones, at most `tail`, are zeros. With
// `nonempty`, t has a digit. "" matches the empty t only.
std::string FractionDigits(const std::string& a, const std::string& b, bool nonempty, int tail) {
  const std::string zeros_after = tail > 0 ? "0{0," + std::to_string(tail) + "}" : "";
  if (a.empty()) return zeros_after;
  const size_t n = a.size();
  const bool from_zero = a == Repeat('0', n);
  if (from_zero && b == Repeat('9', n))
    return "\\d{" + std::string(nonempty ? "1" : "0") + "," + std::to_string(n) + "}" + zeros_after;
  auto then = [&](const std::string& head, const std::string& lo, const std::string& hi) {
    const std::string rest = FractionDigits(lo, hi, false, tail);
    return rest.empty() ? head : head + "(?:" + rest + ")";
  };
  std::vector<std::string> parts;
  const std::string a_rest = a.substr(1), b_rest = b.substr(1);
  if (a[0] == b[0]) {
    parts.push_back(then(a.substr(0, 1), a_rest, b_rest));
  } else {
    parts.push_back(then(a.substr(0, 1), a_rest, Repeat('9', n - 1)));
    if (a[0] + 1 <= b[0] - 1)
      parts.push_back(then(std::string("[") + char(a[0] + 1) + "-" + char(b[0] - 1) + "]",
                           Repeat('0', n - 1), Repeat('9', n - 1)));
    parts.push_back(then(b.substr(0, 1), Repeat('0', n - 1), b_rest));
  }
  const std::string body = "(?:" + JoinAlternatives(parts) + ")";
  return from_zero && !nonempty ? body + "?" : body;
}

// An integer part's spelling followed by a fraction in [a, b] (as FractionDigits; none at all
// where a is zero).
std::string WithFraction(const std::string& integer, const std::string& a, const std::string& b,
                         int tail) {
  const std::string dot = "(?:\\." + FractionDigits(a, b, true, tail) + ")";
  return integer + dot + (a == Repeat('0', a.size()) ? "?" : "");
}

// Non-negative n / 10^scale for n in [lo, hi] (hi nullopt: unbounded), "" when empty.
std::string ScaledMagnitudes(ScaledInt lo, std::optional<ScaledInt> hi, int scale) {
  ScaledInt unit = 1;
  for (int i = 0; i < scale; ++i) unit *= 10;
  const ScaledInt largest = ScaledInt{999999999999999999} * unit + (unit - 1);  // 18 digits
  if (lo > largest || (hi && *hi < lo)) return "";
  const bool unbounded = !hi || *hi >= largest;  // Magnitudes' short form for the digit limit
  if (unbounded) hi = largest;
  const int tail = kJsonMaxFractionDigits - scale;
  const auto digits = [scale](ScaledInt fraction) {
    std::string out(static_cast<size_t>(scale), '0');
    for (int i = scale - 1; i >= 0; --i, fraction /= 10)
      out[static_cast<size_t>(i)] = static_cast<char>('0' + static_cast<int>(fraction % 10));
    return out;
  };
  const auto lo_int = static_cast<int64_t>(lo / unit), hi_int = static_cast<int64_t>(*hi / unit);
  const std::string lo_frac = digits(lo % unit), hi_frac = digits(*hi % unit);
  const std::string zeros = Repeat('0', static_cast<size_t>(scale)),
                    nines = Repeat('9', static_cast<size_t>(scale));
  if (lo_int == hi_int) return WithFraction(std::to_string(lo_int), lo_frac, hi_frac, tail);
  std::vector<std::string> parts = {WithFraction(std::to_string(lo_int), lo_frac, nines, tail)};
  if (const std::string mid = Magnitudes(lo_int + 1, unbounded ? kUnbounded : hi_int - 1); !mid.empty())
    parts.push_back(WithFraction(mid, zeros, nines, tail));
  if (!unbounded) parts.push_back(WithFraction(std::to_string(hi_int), zeros, hi_frac, tail));
  return "(?:" + JoinAlternatives(parts) + ")";
}

}  // namespace

std::string ScaledDecimalRangeRegex(std::optional<ScaledInt> lo, std::optional<ScaledInt> hi,
                                    int scale) {
  std::vector<std::string> parts;
  if (!hi || *hi >= 0) {
    const std::string m = ScaledMagnitudes(lo && *lo > 0 ? *lo : 0, hi, scale);
    if (!m.empty()) parts.push_back(m);
  }
  if (!lo || *lo < 0) {  // -m for m in [max(1, -hi), -lo]: no "-0"
    const ScaledInt least = hi && *hi < 0 ? -*hi : 1;
    const std::string m =
        ScaledMagnitudes(least, lo ? std::optional<ScaledInt>(-*lo) : std::nullopt, scale);
    if (!m.empty()) parts.push_back("-" + m);
  }
  return JoinAlternatives(parts);
}

std::optional<std::string> FormatRegex(std::string_view format) {
  const std::string label = kLabel, atext = kAtext;
  if (format == "date") return std::string(kDate);
  if (format == "time") return std::string(kTime);
  if (format == "date-time") return std::string(kDate) + "T" + kTime;
  if (format == "uuid") {
    const std::string h = "[0-9a-fA-F]";
    return h + "{8}-" + h + "{4}-" + h + "{4}-" + h + "{4}-" + h + "{12}";
  }
  if (format == "email") return atext + "+(?:\\." + atext + "+)*@(?:" + label + "\\.)+" + label;
  if (format == "ipv4") return std::string("(?:") + kOctet + "\\.){3}" + kOctet;
  if (format == "ipv6") return "(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}";
  if (format == "uri") {
    return std::string(
               "[A-Za-z][A-Za-z0-9+.-]*://(?:[A-Za-z0-9._~-]|%[0-9A-Fa-f]{2})+(?::\\d{1,5})?(?:/") +
           kUriChar + "*)*(?:\\?" + kUriQueryChar + "*)?(?:#" + kUriQueryChar + "*)?";
  }
  return std::nullopt;
}

const char* SupportedFormats() {
  return "date-time, date, time, uuid, email, ipv4, ipv6, uri";
}

std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  return Integers(lo, hi);
}

std::string UnboundedNumberRegex() {
  return "-?(?:0|[1-9]\\d{0," + std::to_string(kJsonMaxIntegerDigits - 1) + "})(?:" + Fraction() +
         ")?(?:[eE][+-]?\\d{1," + std::to_string(kJsonMaxExponentDigits) + "})?";
}

std::string NumberRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> parts;
  if (const std::string ints = Integers(lo, hi); !ints.empty()) parts.push_back(ints);
  // I.F with I >= 0: [I, I + 1) within the bounds: lo <= I and I + 1 <= hi.
  if (!hi || *hi >= 1) {
    const std::string m = Magnitudes(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi - 1 : kUnbounded);
    if (!m.empty()) parts.push_back(m + Fraction());
  }
  // -I.F: (-(I + 1), -I] within the bounds: lo <= -(I + 1) and -I <= hi; I = 0 is "-0.F".
  if (!lo || *lo <= -1) {
    const int64_t least = hi && *hi < 0 ? -*hi : 0;
    const std::string m = Magnitudes(least, lo ? -*lo - 1 : kUnbounded);
    if (!m.empty()) parts.push_back("-" + m + Fraction());
  }
  return JoinAlternatives(parts);
}

}  // namespace ember
