#include "util/json_bounds.h"

#include <gtest/gtest.h>

#include <string>

namespace ember {
namespace {

std::string Nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
}

TEST(JsonNestingDepth, CountsContainersOutsideStrings) {
  EXPECT_EQ(JsonNestingDepth("1"), 0);
  EXPECT_EQ(JsonNestingDepth("[]"), 1);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": []}], "c": {}})"), 4);
  // Brackets inside strings do not count, escaped quotes do not end a string.
  EXPECT_EQ(JsonNestingDepth(R"(["[[[[", "\"[[[", "\\", [1]])"), 2);
  EXPECT_EQ(JsonNestingDepth(R"({"k\\": "]]]]{{{{"})"), 1);
}

TEST(JsonNestingDepth, StopsPastTheLimit) {
  const std::string deep = Nested(20000);
  EXPECT_EQ(JsonNestingDepth(deep), 20000);
  EXPECT_EQ(JsonNestingDepth(deep, 64), 65);
  EXPECT_TRUE(CheckJsonDepth(Nested(64), 64).ok());
  const Status st = CheckJsonDepth(deep, 64, "the request body");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "the request body: nests deeper than 64 arrays/objects");
}

TEST(ParseJsonBounded, RefusesDeepInputWithoutRecursing) {
  for (const std::string& deep :
       {Nested(20000), Nested(20000, '{', '}'), "{\"a\":" + Nested(20000) + "}"}) {
    EXPECT_EQ(ParseJsonBounded(deep, 64).message(), "nests deeper than 64 arrays/objects");
    EXPECT_EQ(ParseOrderedJsonBounded(deep, 64).message(), "nests deeper than 64 arrays/objects");
  }
  auto ok = ParseJsonBounded(Nested(64), 64);
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(JsonValueDepth(*ok), 64);
}

TEST(ParseJsonBounded, ParsesLikeNlohmann) {
  const std::string text =
      R"({"z": [1, 2.5, -3, true, null, "s\u00e9"], "a": {"y": {}, "b": []}, "m": 18446744073709551615})";
  auto plain = ParseJsonBounded(text, 8);
  ASSERT_TRUE(plain.ok()) << plain.message();
  EXPECT_EQ(*plain, nlohmann::json::parse(text));
  auto ordered = ParseOrderedJsonBounded(text, 8);
  ASSERT_TRUE(ordered.ok()) << ordered.message();
  EXPECT_EQ(*ordered, nlohmann::ordered_json::parse(text));
  EXPECT_EQ(ordered->begin().key(), "z");  // client order kept
  EXPECT_EQ(ordered->dump(), nlohmann::ordered_json::parse(text).dump());
}

TEST(ParseJsonBounded, RepeatedKeysKeepFirstPlaceAndLastValue) {
  const std::string text = R"({"b": 1, "a": {"x": 1, "x": [2]}, "b": 3, "c": 4})";
  auto ordered = ParseOrderedJsonBounded(text, 8);
  ASSERT_TRUE(ordered.ok()) << ordered.message();
  EXPECT_EQ(ordered->dump(), nlohmann::ordered_json::parse(text).dump());
  EXPECT_EQ(ordered->dump(), R"({"b":3,"a":{"x":[2]},"c":4})");
}

TEST(ParseJsonBounded, RefusesInvalidJson) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "1e999", "[1] 2", "\"\\x\""}) {
    auto r = ParseOrderedJsonBounded(bad, 8);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(r.message().starts_with("invalid JSON")) << r.message();
  }
}

// A full-vocabulary logit_bias object (152k keys) keeps its order and every key; this parse is
// linear in the keys (ordered_json::parse searches each object per key: ~13 s at this size).
TEST(ParseJsonBounded, OrderedParseOfManyKeys) {
  constexpr int kKeys = 152064;
  std::string text = "{\"logit_bias\": {";
  for (int i = kKeys - 1; i >= 0; --i) {
    text += '"';
    text += std::to_string(i);
    text += "\": 1";
    if (i > 0) text += ", ";
  }
  text += "}}";
  auto r = ParseOrderedJsonBounded(text, 64);
  ASSERT_TRUE(r.ok()) << r.message();
  const auto& bias = (*r)["logit_bias"];
  ASSERT_EQ(bias.size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(bias.begin().key(), std::to_string(kKeys - 1));
  EXPECT_EQ((--bias.end()).key(), "0");
}

TEST(JsonValueDepth, IsIterative) {
  nlohmann::json deep = nlohmann::json::array();
  nlohmann::json* at = &deep;
  for (int i = 1; i < 20000; ++i) {
    at->push_back(nlohmann::json::array());
    at = &(*at)[0];
  }
  EXPECT_EQ(JsonValueDepth(deep), 20000);
  EXPECT_EQ(JsonValueDepth(nlohmann::json(3)), 0);
}

}  // namespace
}  // namespace ember
