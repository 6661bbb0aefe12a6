// Forced tool calls: the token constraint allows exactly the tokens that keep the text a prefix
// of head + JSON object + tail for some head, checked against a reference built from plain
// string comparisons and the JSON scanner, over random walks in a small vocabulary.
#include "sampling/tool_call_constraint.h"

#include "sampling/constraint_walk.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace ember {
namespace {

struct Scan {
  bool prefix_ok;
  bool done;
};

// The reference: some head is a prefix of `text` (or `text` of it); after the head the rest is
// a JSON object prefix, then a prefix of the tail.
Scan Reference(const ToolCallPattern& p, const std::string& text) {
  for (const ToolCallPattern::Call& call : p.calls) {
    const std::string& head = call.head;
    if (head.starts_with(text)) return {true, false};
    if (!text.starts_with(head)) continue;
    JsonScanner json;
    size_t i = head.size();
    while (i < text.size() && !json.Done()) {
      if (!json.Step(static_cast<uint8_t>(text[i]))) return {false, false};
      ++i;
    }
    if (!json.Done()) return {true, false};
    const std::string rest = text.substr(i);
    if (!p.tail.starts_with(rest)) return {false, false};
    return {true, rest.size() == p.tail.size()};
  }
  return {false, false};
}

ToolCallPattern HermesLike() {
  ToolCallPattern p;
  for (const char* name : {"get_weather", "get_time", "f", "get"})
    p.calls.push_back({std::string("<call>{\"name\": \"") + name + "\", \"arguments\": ", nullptr});
  p.tail = "}</call>";
  return p;
}

TEST(ToolCallConstraintTest, AllowsExactlyTheTokensThatKeepAPrefix) {
  std::vector<std::optional<std::string>> pieces = {
      std::nullopt, "<call>",      "<call>{\"name\": \"",
      "get",        "_weather",    "\", \"arguments\": ",
      "{",          "}",           "\"",
      ":",          "1",           "}</call>",
      "</call>",    "}}",          "{\"",
      "\":",        std::string(), "é"};
  for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(std::string(1, c));
  const ToolCallPattern pattern = HermesLike();
  auto texts = TokenTexts::Build(pieces);
  std::mt19937 rng(11);
  std::vector<uint8_t> allowed;
  int completed = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::shared_ptr<TokenConstraint> walk = MakeToolCallConstraint(texts, pattern);
    // Lean on the longer pieces so that walks finish heads and tails.
    const std::string text = testing::CheckedWalk(
        *walk, pieces, [&](const std::string& t) { return Reference(pattern, t).prefix_ok; },
        [&](const std::vector<int32_t>& ids) {
          int32_t pick = ids[rng() % ids.size()];
          for (int32_t id : ids)
            if (pieces[static_cast<size_t>(id)]->size() > 3 && rng() % 2 == 0) pick = id;
          return pick;
        },
        120);
    const Scan s = Reference(pattern, text);
    EXPECT_TRUE(s.prefix_ok) << text;
    EXPECT_EQ(s.done, walk->Done()) << text;
    completed += walk->Done();
  }
  EXPECT_GT(completed, 5);
}

TEST(ToolCallConstraintTest, NamesAreMatchedWhole) {
  std::vector<std::optional<std::string>> pieces = {
      "<call>{\"name\": \"get", "\", \"arguments\": ", "_time", "_weather", "{}", "}</call>", "x"};
  auto texts = TokenTexts::Build(pieces);
  ToolCallPattern one;
  one.calls = {{"<call>{\"name\": \"get_time\", \"arguments\": ", nullptr}};
  one.tail = "}</call>";
  std::shared_ptr<TokenConstraint> c = MakeToolCallConstraint(texts, one);
  std::vector<uint8_t> allowed;
  ASSERT_TRUE(c->Accept(0));
  EXPECT_EQ(c->Allowed(allowed), 1);  // only "_time": "get" alone or "get_weather" are not names
  EXPECT_TRUE(allowed[2]);
  std::unique_ptr<TokenConstraint> copy = c->Clone();
  ASSERT_TRUE(c->Accept(2));
  ASSERT_TRUE(c->Accept(1));
  ASSERT_TRUE(c->Accept(4));
  EXPECT_FALSE(c->Done());
  ASSERT_TRUE(c->Accept(5));
  EXPECT_TRUE(c->Done());
  EXPECT_FALSE(copy->Accept(3));  // the clone kept its own state (after "get")
  EXPECT_FALSE(MakeToolCallConstraint(texts, one)->Accept(6));
}

TEST(ToolCallConstraintTest, ArgumentsFollowTheCallsSchema) {
  std::vector<std::optional<std::string>> pieces;
  for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(std::string(1, c));
  auto texts = TokenTexts::Build(pieces);
  auto schema =
      CompileJsonSchema(nlohmann::ordered_json::parse(
                            R"({"type": "object", "properties": {"x": {"type": "integer"}},
                                          "required": ["x"]})"),
                        "parameters");
  ASSERT_TRUE(schema.ok()) << schema.message();
  ToolCallPattern p;
  p.calls = {{"<call>a:", *schema}, {"<call>b:", nullptr}};
  p.tail = "</call>";
  auto accepts = [&](const std::string& text) {
    std::shared_ptr<TokenConstraint> c = MakeToolCallConstraint(texts, p);
    for (char ch : text)
      if (!c->Accept(ch - 0x20)) return false;
    return c->Done();
  };
  EXPECT_TRUE(accepts("<call>a:{\"x\": 5}</call>"));
  EXPECT_FALSE(accepts("<call>a:{\"x\": 5.5}</call>"));
  EXPECT_FALSE(accepts("<call>a:{\"y\": 5}</call>"));
  EXPECT_TRUE(accepts("<call>b:{\"y\": [5.5]}</call>"));
}

}  // namespace
}  // namespace ember
