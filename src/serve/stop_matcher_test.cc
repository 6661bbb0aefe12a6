// StopStringMatcher: stop strings split across pieces are found, never leak, and the released
// text is exactly the prefix before the earliest stop string; pieces of whole UTF-8 characters
// give deltas of whole UTF-8 characters.
#include "serve/stop_matcher.h"

#include <random>

#include <gtest/gtest.h>

namespace ember::serve {
namespace {

bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

struct FeedResult {
  std::string text;
  bool stopped = false;
};

FeedResult Feed(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  FeedResult run;
  for (const std::string& p : pieces) {
    TextDelta d = m.Push(p);
    EXPECT_TRUE(IsValidUtf8(d.text)) << "delta splits a character: " << d.text;
    run.text += d.text;
    if (d.stopped) {
      run.stopped = true;
      break;
    }
  }
  if (!run.stopped) run.text += m.Finish();
  return run;
}

TEST(StopStringMatcherTest, NoStopStringsPassesEverythingThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.Push("Hello").text, "Hello");
  EXPECT_EQ(m.Push(" world").text, " world");
  EXPECT_EQ(m.Finish(), "");
}

TEST(StopStringMatcherTest, StopSplitAcrossPiecesDoesNotLeak) {
  StopStringMatcher m({"</end>"});
  TextDelta a = m.Push("The cat</");
  EXPECT_EQ(a.text, "The cat");  // "</" could start the stop string: held back
  EXPECT_FALSE(a.stopped);
  TextDelta b = m.Push("en");
  EXPECT_EQ(b.text, "");
  TextDelta c = m.Push("d> and more");
  EXPECT_EQ(c.text, "");
  EXPECT_TRUE(c.stopped);
  TextDelta d = m.Push("x");
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
}

TEST(StopStringMatcherTest, FalseStartIsReleased) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.Push("ST").text, "");
  EXPECT_EQ(m.num_held_bytes(), 2u);
  EXPECT_EQ(m.Push("x").text, "STx");
  EXPECT_EQ(m.Push("STO").text, "");
  EXPECT_EQ(m.Finish(), "STO");  // generation ended: the held prefix is output
}

TEST(StopStringMatcherTest, EarliestOfSeveralStopsWins) {
  StopStringMatcher m({"world", "lo w"});
  TextDelta d = m.Push("Hello world");
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "Hel");
  EXPECT_EQ(m.matched(), "lo w");  // the earliest match, not the first listed
}

TEST(StopStringMatcherTest, MatchedIsEmptyUntilAStopStringMatches) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.Push("abc EN").text, "abc ");
  EXPECT_EQ(m.matched(), "");
  EXPECT_TRUE(m.Push("D").stopped);
  EXPECT_EQ(m.matched(), "END");
}

TEST(StopStringMatcherTest, OverlappingPrefixesHoldTheLongestCandidate) {
  StopStringMatcher m({"aab"});
  EXPECT_EQ(m.Push("a").text, "");
  EXPECT_EQ(m.Push("a").text, "");
  EXPECT_EQ(m.Push("a").text, "a");  // "aaa": only "aa" can still start "aab"
  TextDelta d = m.Push("b");
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
}

TEST(StopStringMatcherTest, MultibyteStopStringKeepsCharactersWhole) {
  StopStringMatcher m({"猫が"});
  TextDelta a = m.Push("子猫");
  EXPECT_EQ(a.text, "子");
  TextDelta b = m.Push("は");
  EXPECT_EQ(b.text, "猫は");
  TextDelta c = m.Push("猫");
  TextDelta e = m.Push("が鳴く");
  EXPECT_EQ(c.text + e.text, "");
  EXPECT_TRUE(e.stopped);
}

// Random texts over a small alphabet (ASCII + multibyte), random piece boundaries at character
// boundaries, random stop strings: the output always equals the prefix before the first match.
TEST(StopStringMatcherTest, RandomSplitsMatchTheReference) {
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "é", "猫", "🙂"};
  std::mt19937 rng(1234);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::string> chars;
    const size_t len = 1 + pick(40);
    for (size_t i = 0; i < len; ++i) chars.push_back(alphabet[pick(alphabet.size())]);
    std::vector<std::string> stops;
    const size_t num_stops = pick(4);
    for (size_t s = 0; s < num_stops; ++s) {
      std::string stop;
      const size_t stop_len = 1 + pick(4);
      for (size_t i = 0; i < stop_len; ++i) stop += alphabet[pick(alphabet.size())];
      stops.push_back(stop);
    }
    std::string text;
    std::vector<std::string> pieces;
    for (size_t i = 0; i < chars.size();) {
      const size_t take = 1 + pick(3);
      std::string piece;
      for (size_t k = 0; k < take && i < chars.size(); ++k, ++i) piece += chars[i];
      pieces.push_back(piece);
      text += piece;
    }
    size_t first = std::string::npos;
    for (const std::string& s : stops) first = std::min(first, text.find(s));
    StopStringMatcher m(stops);
    FeedResult run = Feed(m, pieces);
    EXPECT_EQ(run.stopped, first != std::string::npos) << text;
    EXPECT_EQ(run.text, text.substr(0, first)) << text;
  }
}

}  // namespace
}  // namespace ember::serve
