// The regex engine of structured output: the ECMA-262 subset matches what ECMAScript matches (a
// table of cases, whole and search), refuses what it does not support naming the construct,
// bounds hostile patterns, accepts only valid UTF-8; the numeric-range and format regexes are
// exact (integers, checked exhaustively) or sound (decimals, formats); and a regex constraint's
// token walks write only matches, ending through an end id where the match may go on.
#include "sampling/regex_dfa.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "sampling/constraint_walk.h"
#include "sampling/regex_constraint.h"
#include "sampling/schema_regexes.h"

namespace ember {
namespace {

std::shared_ptr<const RegexDfa> Dfa(const std::string& pattern, RegexMatch m = RegexMatch::kWhole) {
  auto dfa = CompileRegex(pattern, m, "re");
  EXPECT_TRUE(dfa.ok()) << pattern << ": " << dfa.message();
  return dfa.ok() ? *dfa : nullptr;
}

struct Case {
  const char* pattern;
  const char* text;
  bool whole, search;
};

TEST(RegexDfaTest, MatchesLikeEcmaScript) {
  const Case cases[] = {
      {"abc", "abc", true, true},
      {"abc", "xabcx", false, true},
      {"^abc", "xabc", false, false},
      {"^abc", "abcx", false, true},
      {"abc$", "xabc", false, true},
      {"^abc$", "abc", true, true},
      {"^a|b$", "ax", false, true},
      {"^a|b$", "xb", false, true},
      {"^a|b$", "xa", false, false},
      {"a|bc|", "", true, true},
      {"(?:ab)+c?", "ababc", true, true},
      {"(ab)*", "", true, true},
      {"(?<year>\\d{4})-\\d\\d", "2024-05", true, true},
      {"a{2,3}", "aaaa", false, true},
      {"^a{2,3}$", "aaaa", false, false},
      {"a{2,}", "aaaaaaa", true, true},
      {"a{2}", "a", false, false},
      {"a+?b*?", "aab", true, true},
      {"[a-c]+", "abcab", true, true},
      {"[^a-c]", "d", true, true},
      {"[^a-c]", "b", false, false},
      {"[^a]", "é", true, true},
      {"[\\d\\s]+", "1 2\t3", true, true},
      {"\\w+", "ab_9", true, true},
      {"\\W", "é", true, true},
      {"\\S", "中", true, true},
      {"\\s", "\u3000", true, true},
      {"\\D", "5", false, false},
      {".", "\n", false, false},
      {".", "👍", true, true},
      {"..", "👍", false, false},  // one code point, not two UTF-16 units
      {"\\u00e9", "é", true, true},
      {"\\u{1F44D}", "👍", true, true},
      {"\\uD83D\\uDC4D", "👍", true, true},
      {"\\x41\\t\\n\\r\\/\\.", "A\t\n\r/.", true, true},
      {"[\\-a]+", "-a-", true, true},
      {"[a-]", "-", true, true},
      {"[\\b]", "\b", true, true},
      {"a.c", "a\rc", false, false},
      {"[.]", "x", false, false},
      {"\\$\\^\\(\\)\\[\\]\\{\\}\\|\\?\\*\\+", "$^()[]{}|?*+", true, true},
      {"[à-ÿ]+", "éü", true, true},
      {"\\d{3}-\\d{4}", "555-1234", true, true},
      {"", "anything", false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.pattern) + " ~ " + c.text);
    auto whole = Dfa(c.pattern, RegexMatch::kWhole);
    auto search = Dfa(c.pattern, RegexMatch::kSearch);
    ASSERT_NE(whole, nullptr);
    ASSERT_NE(search, nullptr);
    EXPECT_EQ(whole->Matches(c.text), c.whole);
    EXPECT_EQ(search->Matches(c.text), c.search);
  }
}

TEST(RegexDfaTest, AcceptsOnlyValidUtf8) {
  auto any = Dfa("[^]*|[\\s\\S]*");
  ASSERT_NE(any, nullptr);
  EXPECT_TRUE(any->Matches("aé中👍\x7F"));
  for (const std::string bad : {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xE4\xB8",
                                "\xF0\x8F\xBF\xBF", "\xFF"})
    EXPECT_FALSE(any->Matches(bad)) << bad.size();
}

TEST(RegexDfaTest, RefusesUnsupportedConstructsNamingThem) {
  const std::pair<const char*, const char*> cases[] = {
      {"(a)\\1", "backreferences"},
      {"(?<n>a)\\k<n>", "backreferences"},
      {"a(?=b)", "lookaround"},
      {"(?!a)b", "lookaround"},
      {"(?<=a)b", "lookaround"},
      {"(?<!a)b", "lookaround"},
      {"\\bword", "word boundaries"},
      {"a^b", "'^' is supported only"},
      {"a$b", "'$' is supported only"},
      {"(^a)", "'^' is supported only"},
      {"\\p{L}", "Unicode property"},
      {"a{1001}", "above 1000"},
      {"a{3,2}", "n > m"},
      {"*a", "nothing to repeat"},
      {"a**", "after a quantifier"},
      {"(ab", "unterminated group"},
      {"ab)", "unexpected ')'"},
      {"[ab", "unterminated class"},
      {"[b-a]", "out of order"},
      {"\\uD800", "lone surrogate"},
      {"a{", "'{'"},
      {"\\q", "unknown escape"},
      {"(?i)a", "unknown group"},
      {"[]", "no string matches"},
  };
  for (const auto& [pattern, what] : cases) {
    auto dfa = CompileRegex(pattern, RegexMatch::kWhole, "guided_regex");
    ASSERT_FALSE(dfa.ok()) << pattern;
    EXPECT_EQ(dfa.message().rfind("guided_regex: ", 0), 0u) << dfa.message();
    EXPECT_NE(dfa.message().find(what), std::string::npos) << pattern << ": " << dfa.message();
  }
}

TEST(RegexDfaTest, HostilePatternsHitANamedLimit) {
  // The classic exponential DFA, nested counted repetition, and a long pattern.
  for (const std::string& pattern :
       {std::string("(a|b)*a(a|b){20}"), std::string("((a{100}){100}){100}"),
        std::string(RegexSyntax::kMaxPatternBytes + 1, 'a'),
        std::string("([\\s\\S]{0,1000}x){0,1000}")}) {
    auto dfa = CompileRegex(pattern, RegexMatch::kSearch, "p");
    ASSERT_FALSE(dfa.ok()) << pattern.substr(0, 40);
    EXPECT_NE(dfa.message().find("limit"), std::string::npos) << dfa.message();
  }
  auto ok = CompileRegex("(a|b)*a(a|b){5}", RegexMatch::kWhole, "p");
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_TRUE((*ok)->Matches("bbbabbbbb"));
  EXPECT_FALSE((*ok)->Matches("bbbbbbbbb"));
}

TEST(RegexDfaTest, IntersectionAndTerminalStates) {
  auto a = Dfa("[a-z]+\\d*");
  auto b = Dfa("[\\s\\S]{2,3}");
  auto both = RegexDfa::Intersect(*a, *b, "x");
  ASSERT_TRUE(both.ok()) << both.message();
  EXPECT_TRUE((*both)->Matches("ab"));
  EXPECT_TRUE((*both)->Matches("a12"));
  EXPECT_FALSE((*both)->Matches("a"));
  EXPECT_FALSE((*both)->Matches("abcd"));
  auto none = RegexDfa::Intersect(*Dfa("a+"), *Dfa("b+"), "x");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.message(), "x: no string matches the pattern");
  auto choice = Dfa("yes|no|nope");
  int32_t s = choice->start();
  for (char c : std::string("no")) s = choice->Next(s, static_cast<uint8_t>(c));
  EXPECT_TRUE(choice->Accepting(s));
  EXPECT_FALSE(choice->Terminal(s));  // "nope" may follow
  for (char c : std::string("pe")) s = choice->Next(s, static_cast<uint8_t>(c));
  EXPECT_TRUE(choice->Terminal(s));
}

TEST(RegexDfaTest, MultiplesAreExact) {
  for (int64_t k : {1, 2, 3, 7, 10, 25, 1000}) {
    auto dfa = RegexDfa::Multiples(k);
    for (int64_t n = -3000; n <= 3000; ++n)
      ASSERT_EQ(dfa->Matches(std::to_string(n)), n % k == 0) << k << " " << n;
    EXPECT_FALSE(dfa->Matches("-0"));
    EXPECT_FALSE(dfa->Matches("00"));
    EXPECT_FALSE(dfa->Matches(""));
    EXPECT_TRUE(dfa->Matches(std::to_string(k) + "000000000000000000000"));
  }
}

// n / 10^scale spelled with exactly `digits` fraction digits (fewer than scale only where the
// dropped ones are zeros; more: trailing zeros); 0 digits: no dot.
std::string Spelled(int64_t n, int scale, int digits) {
  int64_t unit = 1;
  for (int i = 0; i < scale; ++i) unit *= 10;
  const int64_t m = n < 0 ? -n : n;
  std::string frac = std::to_string(unit + m % unit).substr(1);  // scale digits
  frac.resize(static_cast<size_t>(digits), '0');
  std::string out = n < 0 ? "-" : "";
  out.append(std::to_string(m / unit));
  if (digits > 0) out.append(".").append(frac);
  return out;
}

// The fewest fraction digits that spell n / 10^scale exactly.
int FewestDigits(int64_t n, int scale) {
  int digits = scale;
  for (int64_t m = n < 0 ? -n : n; digits > 0 && m % 10 == 0; m /= 10) --digits;
  return digits;
}

TEST(RegexDfaTest, DecimalMultiplesAreExact) {
  for (const auto& [p, scale] : std::vector<std::pair<int64_t, int>>{
           {1, 1}, {5, 1}, {25, 1}, {3, 2}, {25, 2}, {7, 3}, {1000, 2}}) {
    SCOPED_TRACE(std::to_string(p) + " / 10^" + std::to_string(scale));
    auto dfa = RegexDfa::DecimalMultiples(p, scale, "m");
    ASSERT_TRUE(dfa.ok()) << dfa.message();
    for (int64_t n = -3000; n <= 3000; ++n) {
      const bool multiple = n % p == 0;
      for (int digits = FewestDigits(n, scale); digits <= scale + 2; ++digits)
        ASSERT_EQ((*dfa)->Matches(Spelled(n, scale, digits)), multiple) << Spelled(n, scale, digits);
      // A nonzero digit past the scale: not a multiple of 10^-scale.
      ASSERT_FALSE((*dfa)->Matches(Spelled(n, scale, scale) + "1")) << n;
    }
    EXPECT_FALSE((*dfa)->Matches("1."));
    EXPECT_FALSE((*dfa)->Matches(".5"));
    EXPECT_FALSE((*dfa)->Matches("1e1"));
  }
  auto big = RegexDfa::DecimalMultiples(997, 16, "schema.multipleOf");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.message(), "schema.multipleOf: the multiples of 997 / 10^16 need more than 10000 "
                           "automaton states");
}

// Scaled decimal ranges are exact: every n / 10^scale in a window, in each spelling, matches iff
// n lies within the bounds.
TEST(SchemaRegexesTest, ScaledDecimalRangesAreExact) {
  using Bound = std::optional<ScaledInt>;
  const Bound bounds[] = {std::nullopt, -1000, -101, -100, -99, -10, -1, 0, 1, 7, 10, 99, 100, 101, 999};
  for (int scale : {1, 2}) {
    for (const Bound& lo : bounds) {
      for (const Bound& hi : bounds) {
        if (lo && hi && *lo > *hi) continue;
        const std::string re = ScaledDecimalRangeRegex(lo, hi, scale);
        auto dfa = Dfa(re);
        ASSERT_NE(dfa, nullptr) << re;
        for (int64_t n = -1200; n <= 1200; ++n) {
          const bool in = (!lo || n >= *lo) && (!hi || n <= *hi);
          for (int digits = FewestDigits(n, scale); digits <= scale + 1; ++digits)
            ASSERT_EQ(dfa->Matches(Spelled(n, scale, digits)), in) << re << " " << Spelled(n, scale, digits);
          ASSERT_FALSE(dfa->Matches(Spelled(n, scale, scale) + "1")) << re << " " << n;
        }
        EXPECT_FALSE(dfa->Matches("-0"));
        EXPECT_FALSE(dfa->Matches("-0.0"));
        EXPECT_FALSE(dfa->Matches("00.1"));
        EXPECT_FALSE(dfa->Matches("1e0"));
      }
    }
  }
  // 16 fraction digits in all; 18 integer digits.
  auto dfa = Dfa(ScaledDecimalRangeRegex(std::nullopt, std::nullopt, 2));
  EXPECT_TRUE(dfa->Matches("0.1200000000000000"));
  EXPECT_FALSE(dfa->Matches("0.12000000000000000"));
  EXPECT_TRUE(dfa->Matches("999999999999999999.99"));
  EXPECT_FALSE(dfa->Matches("1000000000000000000"));
}

// Integer ranges are exact: every n in a window matches iff it lies within the bounds.
TEST(SchemaRegexesTest, IntegerRangesAreExact) {
  using Bound = std::optional<int64_t>;
  const Bound bounds[] = {std::nullopt, -1000, -101, -100, -99, -10, -9,  -1, 0, 1, 7, 9,
                          10,           19,    99,   100,  101, 999, 1000};
  for (const Bound& lo : bounds) {
    for (const Bound& hi : bounds) {
      if (lo && hi && *lo > *hi) continue;
      const std::string re = IntegerRangeRegex(lo, hi);
      auto dfa = Dfa(re);
      ASSERT_NE(dfa, nullptr) << re;
      for (int64_t n = -1200; n <= 1200; ++n) {
        const bool in = (!lo || n >= *lo) && (!hi || n <= *hi);
        ASSERT_EQ(dfa->Matches(std::to_string(n)), in) << re << " " << n;
      }
      EXPECT_FALSE(dfa->Matches("-0"));
      EXPECT_FALSE(dfa->Matches("01"));
      EXPECT_FALSE(dfa->Matches("1.0"));
    }
  }
  // At most 18 digits: finite doubles, bounded output.
  EXPECT_TRUE(Dfa(IntegerRangeRegex(std::nullopt, std::nullopt))->Matches("-123456789012345678"));
  EXPECT_FALSE(Dfa(IntegerRangeRegex(std::nullopt, std::nullopt))->Matches("1234567890123456789"));
  EXPECT_TRUE(Dfa(IntegerRangeRegex(0, std::nullopt))->Matches("123456789012345678"));
  EXPECT_FALSE(Dfa(IntegerRangeRegex(0, std::nullopt))->Matches("1234567890123456789"));
  auto any = Dfa(UnboundedNumberRegex());
  for (const char* ok : {"0", "-0.5", "1e10", "1.25E-07", "123456789012345678.0123456789012345"})
    EXPECT_TRUE(any->Matches(ok)) << ok;
  for (const char* bad : {"01", "1e999", ".5", "1.", "-", "1e", "1234567890123456789"})
    EXPECT_FALSE(any->Matches(bad)) << bad;
}

// Decimals are sound: whatever matches lies within the bounds; integers stay exact.
TEST(SchemaRegexesTest, NumberRangesAreSound) {
  using Bound = std::optional<int64_t>;
  const Bound bounds[] = {std::nullopt, -12, -1, 0, 1, 2, 10, 11};
  for (const Bound& lo : bounds) {
    for (const Bound& hi : bounds) {
      if (lo && hi && *lo > *hi) continue;
      const std::string re = NumberRangeRegex(lo, hi);
      auto dfa = Dfa(re);
      ASSERT_NE(dfa, nullptr) << re;
      for (int tenths = -150; tenths <= 150; ++tenths) {
        const double x = tenths / 10.0;
        std::string text = tenths < 0 ? "-" : "";
        text.append(std::to_string(std::abs(tenths) / 10)).push_back('.');
        text.push_back(static_cast<char>('0' + std::abs(tenths) % 10));
        const bool in = (!lo || x >= double(*lo)) && (!hi || x <= double(*hi));
        if (dfa->Matches(text)) {
          EXPECT_TRUE(in) << re << " " << text;
        }
        // A decimal strictly inside [ceil(lo), floor(hi) - 1] + its unit interval is written.
        const bool interior = (!lo || x >= double(*lo)) && (!hi || x < double(*hi)) &&
                              (!lo || std::floor(x) >= double(*lo)) &&
                              (!hi || std::ceil(x) <= double(*hi)) && tenths % 10 != 0;
        if (interior && x >= 0) {
          EXPECT_TRUE(dfa->Matches(text)) << re << " " << text;
        }
      }
      EXPECT_FALSE(dfa->Matches("1e3"));
    }
  }
}

TEST(SchemaRegexesTest, FormatsAcceptTypicalValuesAndRefuseInvalidOnes) {
  const std::pair<const char*, std::vector<std::pair<std::string, bool>>> cases[] = {
      {"date",
       {{"2024-02-28", true},
        {"2024-12-31", true},
        {"2024-02-30", false},
        {"2024-04-31", false},
        {"2024-13-01", false},
        {"24-01-01", false}}},
      {"time",
       {{"23:59:59Z", true},
        {"08:30:00.123+02:00", true},
        {"24:00:00Z", false},
        {"12:00:00", false},
        {"12:60:00Z", false}}},
      {"date-time", {{"2024-05-01T12:00:00Z", true}, {"2024-05-01 12:00:00Z", false}}},
      {"uuid", {{"123e4567-e89b-12d3-a456-426614174000", true}, {"123e4567e89b12d3", false}}},
      {"email",
       {{"a.b+c@example.co.uk", true},
        {".a@example.com", false},
        {"a@b", false},
        {"a@@b.com", false},
        {"a b@c.com", false}}},
      {"ipv4", {{"192.168.0.1", true}, {"256.1.1.1", false}, {"01.1.1.1", false}}},
      {"ipv6", {{"2001:0db8:0000:0000:0000:ff00:0042:8329", true}, {"2001:db8::1", false}}},
      {"uri",
       {{"https://example.com/a/b?x=1#top", true},
        {"http://h:8080", true},
        {"example.com", false},
        {"http://a b", false},
        {"https://x/%zz", false}}},
  };
  for (const auto& [format, values] : cases) {
    const auto re = FormatRegex(format);
    ASSERT_TRUE(re.has_value()) << format;
    auto dfa = Dfa(*re);
    ASSERT_NE(dfa, nullptr) << format;
    for (const auto& [value, ok] : values)
      EXPECT_EQ(dfa->Matches(value), ok) << format << " " << value;
  }
  EXPECT_FALSE(FormatRegex("hostname").has_value());
}

// A regex constraint over a small vocabulary: Allowed() is exactly "the text stays a prefix of a
// match" (plus the end id where a match may end), walks end as matches.
TEST(RegexConstraintTest, WalksWriteMatchesAndEndThroughEndIds) {
  // "\xC3" "\xA9" spell "é" byte by byte, as byte-level vocabularies can.
  testing::Pieces pieces = {std::nullopt, "a", "b", "ab", "-", "1", "12", "x", "é", "\xC3", "\xA9"};
  auto texts = TokenTexts::Build(pieces);
  const std::string pattern = "(ab|a)+-\\d{1,2}é?";
  auto dfa = Dfa(pattern);
  ASSERT_NE(dfa, nullptr);
  auto prefix_ok = [&](const std::string& t) {
    int32_t s = dfa->start();
    for (char c : t)
      if ((s = dfa->Next(s, static_cast<uint8_t>(c))) == RegexDfa::kDead) return false;
    return true;
  };
  std::mt19937 rng(3);
  int ended_by_id = 0, ended_alone = 0;
  for (int trial = 0; trial < 200; ++trial) {
    auto walk = MakeRegexConstraint(texts, dfa, {0});
    std::string text;
    std::vector<uint8_t> allowed;
    for (int step = 0; step < 40 && !walk->Done(); ++step) {
      const int64_t count = walk->Allowed(allowed);
      ASSERT_GT(count, 0) << text;
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < static_cast<int32_t>(pieces.size()); ++id) {
        const bool text_ok = id != 0 && prefix_ok(text + *pieces[static_cast<size_t>(id)]);
        const bool end_ok = id == 0 && dfa->Matches(text);
        EXPECT_EQ(allowed[static_cast<size_t>(id)], text_ok || end_ok) << text << " " << id;
        if (allowed[static_cast<size_t>(id)]) ids.push_back(id);
      }
      const int32_t id = ids[rng() % ids.size()];
      ASSERT_TRUE(walk->Accept(id));
      if (id == 0) {
        ++ended_by_id;
      } else {
        text += *pieces[static_cast<size_t>(id)];
        if (walk->Done()) ++ended_alone;
      }
    }
    if (walk->Done()) {
      EXPECT_TRUE(dfa->Matches(text)) << text;
    }
  }
  EXPECT_GT(ended_by_id, 10);
  EXPECT_GT(ended_alone, 10);  // "-12é" ends the match: nothing may follow
}

}  // namespace
}  // namespace ember
