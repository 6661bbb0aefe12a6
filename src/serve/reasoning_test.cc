// Reasoning parsing: the split into reasoning and content is the same however the text is cut
// (streaming); only a leading think block is reasoning; an R1-style prompt starts inside one.
#include "serve/reasoning.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace ember::serve {
namespace {

struct Split {
  std::string reasoning, content;
};

Split ParseInPieces(bool starts_in, const std::string& text, const std::vector<size_t>& cuts) {
  ReasoningParser parser(starts_in);
  Split out;
  size_t at = 0;
  auto add = [&out](ReasoningDelta d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
  };
  for (size_t cut : cuts) {
    add(parser.Push(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  add(parser.Push(std::string_view(text).substr(at)));
  add(parser.Finish());
  return out;
}

Split ParseEveryWay(bool starts_in, const std::string& text) {
  const Split whole = ParseInPieces(starts_in, text, {});
  std::mt19937 rng(9);
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  std::vector<std::vector<size_t>> cuttings = {bytes};
  for (int r = 0; r < 20; ++r) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 3 == 0) cuts.push_back(i);
    cuttings.push_back(cuts);
  }
  for (const auto& cuts : cuttings) {
    const Split p = ParseInPieces(starts_in, text, cuts);
    EXPECT_EQ(p.reasoning, whole.reasoning) << text;
    EXPECT_EQ(p.content, whole.content) << text;
  }
  return whole;
}

TEST(ReasoningParserTest, SplitsALeadingThinkBlock) {
  Split s = ParseEveryWay(false, "<think>\nLet me see: 2 < 3.\n</think>\n\nThe answer is 3.");
  EXPECT_EQ(s.reasoning, "\nLet me see: 2 < 3.\n");
  EXPECT_EQ(s.content, "The answer is 3.");
  s = ParseEveryWay(false, "\n<think></think>Hi <think>not reasoning</think>");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "Hi <think>not reasoning</think>");
  s = ParseEveryWay(false, "<think>cut by max_tokens </thi");
  EXPECT_EQ(s.reasoning, "cut by max_tokens </thi");
  EXPECT_EQ(s.content, "");
}

TEST(ReasoningParserTest, TextWithoutABlockIsContent) {
  for (const std::string text : {"Hello", "  <thin", "<b>bold</b>", "", "\n\n", "</think> stray"}) {
    const Split s = ParseEveryWay(false, text);
    EXPECT_EQ(s.reasoning, "") << text;
    EXPECT_EQ(s.content, text);
  }
}

TEST(ReasoningParserTest, AnR1PromptStartsInside) {
  const Split s = ParseEveryWay(true, "thinking...</think>\n\nanswer");
  EXPECT_EQ(s.reasoning, "thinking...");
  EXPECT_EQ(s.content, "answer");
  EXPECT_TRUE(PromptEndsInThinkBlock("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptEndsInThinkBlock("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptEndsInThinkBlock("<|im_start|>assistant\n"));
  EXPECT_TRUE(TemplateHasThinkBlocks("{%- if '</think>' in content %}"));
  EXPECT_FALSE(TemplateHasThinkBlocks("{{ messages[0]['content'] }}"));
}

}  // namespace
}  // namespace ember::serve
