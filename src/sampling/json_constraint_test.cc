// JSON mode: the byte scanner accepts exactly the JSON objects (valid and invalid documents fed
// byte by byte), and the token constraint allows exactly the tokens whose bytes the scanner
// accepts, over a small vocabulary that spells documents in pieces.
#include "sampling/json_constraint.h"

#include "sampling/constraint_walk.h"
#include "sampling/json_number_limits.h"
#include "sampling/token_mask.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace ember {
namespace {

// Whether `text` is accepted as a prefix, and whether it completes an object.
struct Scan {
  bool prefix_ok;
  bool done;
};
Scan ScanText(const std::string& text) {
  JsonScanner s;
  for (char c : text)
    if (!s.Step(static_cast<uint8_t>(c))) return {false, false};
  return {true, s.Done()};
}

TEST(JsonScannerTest, AcceptsObjects) {
  for (const std::string doc :
       {"{}", "{\n}", "{\"a\":1}", "{\"a\" : [1, -0, 2.5, -3e+7, 4E-2, 0.0e1]}",
        "{\"k\":{\"n\":{\"m\":[[], {}, [{}]]}}}", "{\"t\":true,\"f\":false,\"z\":null}",
        "{\"s\":\"esc \\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9\\uD83D\"}",
        "{\"utf8\":\"é 中 👍 \xF4\x8F\xBF\xBF\"}", "{\"\":\"\"}"}) {
    const Scan s = ScanText(doc);
    EXPECT_TRUE(s.prefix_ok && s.done) << doc;
  }
}

TEST(JsonScannerTest, RefusesWhatIsNotAnObject) {
  for (const std::string doc :
       {"[]", "1", "\"s\"", "true", "{,}", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\":01}",
        "{\"a\":1.}", "{\"a\":.5}", "{\"a\":1e}", "{\"a\":-}", "{\"a\":+1}", "{\"a\":tru}",
        "{\"a\":True}", "{\"a\":[1,]}", "{\"a\":[1 2]}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12G4\"}", "{\"a\":\"\xC0\x80\"}", "{\"a\":\"\xED\xA0\x80\"}",
        "{\"a\":\"\xF4\x90\x80\x80\"}", "{\"a\":\"\x80\"}", "{\"a\":1]", "{} ", "{}{}",
        "{'a':1}", "{a:1}", " {}"}) {
    const Scan s = ScanText(doc);
    EXPECT_FALSE(s.prefix_ok && s.done) << doc;
  }
  // Prefixes of valid documents are accepted without being done.
  for (const std::string prefix : {"{", "{\"a", "{\"a\":[1", "{\"a\":1", "{\"a\":\"\xE4\xB8"}) {
    const Scan s = ScanText(prefix);
    EXPECT_TRUE(s.prefix_ok && !s.done) << prefix;
  }
}

TEST(JsonScannerTest, LimitsDepthAndWhitespace) {
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonScanner::kMaxDepth; ++i) deep += "[";
  EXPECT_TRUE(ScanText(deep).prefix_ok);
  EXPECT_FALSE(ScanText(deep + "[").prefix_ok);
  // Whitespace runs: none, one space, or a newline and at most kMaxIndent spaces/tabs.
  const std::string indent(kMaxIndent, ' ');
  EXPECT_TRUE(ScanText("{\n" + indent + "\"a\": 1,\n\t\"b\":\n  [ 1 ]\n}").done);
  EXPECT_TRUE(ScanText("{ \"a\" : 1 }").done);
  EXPECT_FALSE(ScanText("{\n" + indent + " }").prefix_ok);
  EXPECT_FALSE(ScanText("{  }").prefix_ok);
  EXPECT_FALSE(ScanText("{\n\n}").prefix_ok);
  EXPECT_FALSE(ScanText("{ \n}").prefix_ok);
  EXPECT_FALSE(ScanText("{\r\n}").prefix_ok);
  EXPECT_TRUE(ScanText("{\"" + indent + indent + "\":1}").done);  // inside a string: no limit
}

// Numbers stay within the digit limits (json_number_limits.h): every one is a finite double, and
// a model cannot write digits forever.
TEST(JsonScannerTest, LimitsNumberDigits) {
  const std::string int_max(kJsonMaxIntegerDigits, '9');
  const std::string frac_max(kJsonMaxFractionDigits, '5');
  const std::string exp_max(kJsonMaxExponentDigits, '9');
  EXPECT_TRUE(ScanText("{\"a\":-" + int_max + "." + frac_max + "e-" + exp_max + "}").done);
  EXPECT_TRUE(ScanText("{\"a\":[" + int_max + ", 0." + frac_max + ", 1E+" + exp_max + "]}").done);
  EXPECT_FALSE(ScanText("{\"a\":" + int_max + "9").prefix_ok);
  EXPECT_FALSE(ScanText("{\"a\":-" + int_max + "9").prefix_ok);
  EXPECT_FALSE(ScanText("{\"a\":1." + frac_max + "5").prefix_ok);
  EXPECT_FALSE(ScanText("{\"a\":1e" + exp_max + "9").prefix_ok);
  EXPECT_FALSE(ScanText("{\"a\":1e+999}").prefix_ok);
  // Each part counts its own digits; the state key tells them apart (a mask cache must not mix
  // "9 digits so far" with "18").
  EXPECT_TRUE(ScanText("{\"a\":" + int_max + "." + frac_max + "e" + exp_max + "}").done);
  JsonScanner one, many;
  for (char c : std::string("{\"a\":1")) one.Step(static_cast<uint8_t>(c));
  for (char c : "{\"a\":" + int_max) many.Step(static_cast<uint8_t>(c));
  std::string key_one, key_many;
  one.AppendKey(&key_one);
  many.AppendKey(&key_many);
  EXPECT_NE(key_one, key_many);
}

// A vocabulary of pieces: Allowed() must equal "every byte of the piece scans", and a random walk
// through allowed tokens must only ever build valid prefixes until the object closes.
TEST(JsonObjectConstraintTest, AllowsExactlyTheTokensThatScan) {
  std::vector<std::optional<std::string>> pieces = {
      std::nullopt, "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "key", "\":", "\": \"",
      "1", "-", ".", "5e", "+", "0", "true", "nul", "l", "\\", "n", "u00", "é", "\xE4", "\xB8",
      "\xAD", "{\"", "\"}", "}}", "]}", "x\"y", std::string(), "  ", "\t"};
  // Every printable ASCII byte alone too, so a walk can always go on (as in a real vocabulary).
  for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(std::string(1, c));
  auto texts = TokenTexts::Build(pieces);
  JsonObjectConstraint c(texts);
  EXPECT_EQ(c.vocab_size(), static_cast<int32_t>(pieces.size()));
  std::mt19937 rng(7);
  std::vector<uint8_t> allowed;
  int completed = 0;
  for (int trial = 0; trial < 200; ++trial) {
    JsonObjectConstraint walk(texts);
    const std::string text = testing::CheckedWalk(
        walk, pieces, [](const std::string& t) { return ScanText(t).prefix_ok; },
        [&](const std::vector<int32_t>& ids) { return ids[rng() % ids.size()]; }, 200);
    const Scan s = ScanText(text);
    EXPECT_TRUE(s.prefix_ok) << text;
    EXPECT_EQ(s.done, walk.Done()) << text;
    completed += walk.Done();
  }
  EXPECT_GT(completed, 0);
  JsonObjectConstraint fresh(texts);
  EXPECT_FALSE(fresh.Accept(2));  // "}" cannot start
  EXPECT_FALSE(JsonObjectConstraint(texts).Accept(0));  // no text
  auto clone = c.Clone();
  EXPECT_TRUE(clone->Accept(1));
  EXPECT_FALSE(c.Done());
}

// ForcedToken (jump-forward) is the one allowed token, and -1 where several are: over a
// vocabulary without whitespace, "{" is forced at the start and ":" after a key; a random walk
// agrees with Allowed() at every step, the walk's own clone included.
TEST(JsonObjectConstraintTest, ForcedTokenIsTheOnlyAllowedOne) {
  const std::vector<std::optional<std::string>> pieces = {"{", "}", "\"", "a", ":", "1", "a\""};
  auto texts = TokenTexts::Build(pieces);
  JsonObjectConstraint c(texts);
  EXPECT_EQ(c.ForcedToken(), 0);
  ASSERT_TRUE(c.Accept(0));
  EXPECT_EQ(c.ForcedToken(), -1);  // "}" or "\""
  ASSERT_TRUE(c.Accept(2));
  ASSERT_TRUE(c.Accept(6));        // {"a"
  EXPECT_EQ(c.ForcedToken(), 4);   // ":"
  std::mt19937 rng(3);
  std::vector<uint8_t> allowed;
  int forced = 0;
  for (int trial = 0; trial < 50; ++trial) {
    JsonObjectConstraint walk(texts);
    for (int step = 0; step < 40 && !walk.Done(); ++step) {
      const int64_t count = walk.Allowed(allowed);
      ASSERT_GT(count, 0);
      std::vector<int32_t> ids;
      for (size_t id = 0; id < allowed.size(); ++id)
        if (allowed[id]) ids.push_back(static_cast<int32_t>(id));
      EXPECT_EQ(walk.ForcedToken(), count == 1 ? ids[0] : -1);
      EXPECT_EQ(walk.Clone()->ForcedToken(), walk.ForcedToken());
      forced += count == 1;
      ASSERT_TRUE(walk.Accept(ids[rng() % ids.size()]));
    }
  }
  EXPECT_GT(forced, 50);
  JsonObjectConstraint done(texts);
  for (int32_t id : {0, 1}) ASSERT_TRUE(done.Accept(id));
  EXPECT_EQ(done.ForcedToken(), -1);  // nothing may follow
}

// Masks go to bits and back a word at a time: every size (tails included) round-trips.
TEST(MaskCacheTest, PackAndUnpackRoundTrip) {
  std::mt19937 rng(11);
  for (size_t size : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 128256}) {
    std::vector<uint8_t> mask(size);
    for (uint8_t& m : mask) m = rng() % 3 == 0;
    std::vector<uint64_t> bits;
    PackMask(mask, &bits);
    ASSERT_EQ(bits.size(), (size + 63) / 64);
    for (size_t id = 0; id < size; ++id) ASSERT_EQ((bits[id / 64] >> (id % 64)) & 1, mask[id]) << id;
    std::vector<uint8_t> back(3, 7);
    UnpackMask(bits, size, &back);
    EXPECT_EQ(back, mask) << size;
    // The 32-bit words a backend takes: packed from the bytes, or copied from the 64-bit words.
    std::vector<uint32_t> words, copied(5, 9);
    PackAllowedBits(mask, &words);
    ASSERT_EQ(words.size(), (size + 31) / 32);
    for (size_t id = 0; id < size; ++id)
      ASSERT_EQ((words[id / 32] >> (id % 32)) & 1, mask[id]) << id;
    if (size % 32 != 0) {
      EXPECT_EQ(words.back() >> (size % 32), 0u) << size;
    }
    MaskWords32(bits, size, &copied);
    EXPECT_EQ(copied, words) << size;
    MaskCache cache;
    cache.Insert("k", mask, 5);
    EXPECT_EQ(cache.Find("k", &back), 5);
    EXPECT_EQ(back, mask);
    EXPECT_EQ(cache.FindBits("k", &copied), 5);
    EXPECT_EQ(copied, words);
    EXPECT_EQ(cache.Find("other", &back), -1);
    EXPECT_EQ(cache.FindBits("other", &copied), -1);
  }
}

// TokenMask in both forms over the same constraint states: the bytes and the bits are the same
// set (Allows agrees), and kBits lists the masked ids, ascending, only up to max_listed.
TEST(TokenMaskTest, BytesAndBitsAgreeAndShortListsAreListed) {
  std::vector<std::optional<std::string>> pieces = {std::nullopt, "{", "}", "\"", "a", ":", " "};
  for (char c = 0x21; c < 0x7F; ++c) pieces.emplace_back(std::string(1, c) + "b");
  auto texts = TokenTexts::Build(pieces);
  JsonObjectConstraint walk(texts);
  const int32_t vocab = walk.vocab_size();
  for (int32_t id : {1, 3, 4}) {  // {"a: then inside a string, most pieces allowed
    ASSERT_TRUE(walk.Accept(id));
    for (const int64_t max_listed : {int64_t{0}, int64_t{8}, int64_t{vocab}}) {
      TokenMask bytes, bits;
      bytes.Build(walk, TokenMask::Form::kBytes);
      bits.Build(walk, TokenMask::Form::kBits, max_listed);
      ASSERT_EQ(bits.num_allowed, bytes.num_allowed);
      ASSERT_EQ(bytes.allowed.size(), static_cast<size_t>(vocab));
      ASSERT_EQ(bits.bits.size(), static_cast<size_t>((vocab + 31) / 32));
      std::vector<int32_t> masked;
      for (int32_t t = 0; t < vocab; ++t) {
        EXPECT_EQ(bits.Allows(t), bytes.Allows(t)) << t;
        if (!bytes.Allows(t)) masked.push_back(t);
      }
      const bool listed = static_cast<int64_t>(masked.size()) <= max_listed;
      EXPECT_EQ(bits.masked_listed(), listed);
      EXPECT_EQ(bits.masked, listed ? masked : std::vector<int32_t>{});
      EXPECT_FALSE(bytes.masked_listed());
    }
  }
}

}  // namespace
}  // namespace ember
