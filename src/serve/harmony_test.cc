// Harmony parsing: the split into reasoning, content and tool calls is the same however the text
// is cut (streaming: every split point, and random multi-cuts); each channel lands where it
// belongs; calls come out with and without <|constrain|>, with the recipient in either part of
// the header; truncated output goes where it stands; no control token ever reaches the user.
#include "serve/harmony.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include <nlohmann/json.hpp>

namespace ember::serve {
namespace {

using nlohmann::json;

// What the generation prompt of gpt-oss's template ends with.
constexpr std::string_view kPrompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant";

struct Parsed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

bool operator==(const Parsed& a, const Parsed& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.calls.size() != b.calls.size())
    return false;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    if (a.calls[i].index != b.calls[i].index || a.calls[i].name != b.calls[i].name ||
        a.calls[i].arguments != b.calls[i].arguments)
      return false;
  }
  return true;
}

Parsed ParseInPieces(const std::string& text, const std::vector<size_t>& cuts,
                     HarmonyOptions options = {}, std::string_view prompt = kPrompt) {
  HarmonyParser parser(options, prompt);
  Parsed out;
  auto add = [&out](HarmonyDelta d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (ToolCall& c : d.calls) out.calls.push_back(std::move(c));
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    add(parser.Push(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  add(parser.Push(std::string_view(text).substr(at)));
  add(parser.Finish());
  return out;
}

// Parses whole, cut at every single point, byte by byte, and in random pieces; all must agree.
Parsed ParseEveryWay(const std::string& text, HarmonyOptions options = {},
                     std::string_view prompt = kPrompt) {
  const Parsed whole = ParseInPieces(text, {}, options, prompt);
  std::vector<std::vector<size_t>> cuttings;
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) {
    cuttings.push_back({i});
    bytes.push_back(i);
  }
  cuttings.push_back(bytes);
  std::mt19937 rng(7);
  for (int r = 0; r < 30; ++r) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 4 == 0) cuts.push_back(i);
    cuttings.push_back(cuts);
  }
  for (const std::vector<size_t>& cuts : cuttings) {
    const Parsed p = ParseInPieces(text, cuts, options, prompt);
    EXPECT_TRUE(p == whole) << text << "\nreasoning: " << p.reasoning << " vs " << whole.reasoning
                            << "\ncontent: " << p.content << " vs " << whole.content;
    if (!(p == whole)) break;
  }
  for (std::string_view token : HarmonyControlTokens()) {
    EXPECT_EQ(whole.content.find(token), std::string::npos) << whole.content;
    EXPECT_EQ(whole.reasoning.find(token), std::string::npos) << whole.reasoning;
  }
  return whole;
}

TEST(HarmonyTest, AnalysisThenFinal) {
  // <|return|> is a stop token (never shown), so the text ends with the answer.
  const Parsed p = ParseEveryWay(
      "<|channel|>analysis<|message|>User says hi. Reply < 10 words.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?");
  EXPECT_EQ(p.reasoning, "User says hi. Reply < 10 words.");
  EXPECT_EQ(p.content, "Hello! How can I help?");
  EXPECT_TRUE(p.calls.empty());
  // The same with the end token in the text (ignore_eos keeps it).
  const Parsed q = ParseEveryWay(
      "<|channel|>analysis<|message|>User says hi. Reply < 10 words.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>");
  EXPECT_TRUE(p == q);
}

TEST(HarmonyTest, ToolCallWithConstrain) {
  const Parsed p = ParseEveryWay(
      "<|channel|>analysis<|message|>Need weather.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"location\":\"Paris\", \"unit\": \"c\"}<|call|>");
  EXPECT_EQ(p.reasoning, "Need weather.");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].index, 0);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"location":"Paris","unit":"c"})");  // model's key order
  EXPECT_TRUE(p.calls[0].id.empty());  // the server gives ids
}

TEST(HarmonyTest, ToolCallWithoutConstrain) {
  const Parsed p = ParseEveryWay(
      "<|channel|>commentary to=functions.get_weather json<|message|>{\"location\": \"Tokyo\"}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"location":"Tokyo"})");
  EXPECT_EQ(p.content, "");
  // No arguments at all: an empty object.
  const Parsed q = ParseEveryWay("<|channel|>commentary to=functions.now<|message|><|call|>");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].arguments, "{}");
}

TEST(HarmonyTest, RecipientInTheRoleHeader) {
  // Right after the generation prompt (`<|start|>assistant`) ...
  const Parsed p = ParseEveryWay(
      " to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"x\"}<|call|>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "lookup");
  EXPECT_EQ(p.calls[0].arguments, R"({"q":"x"})");
  // ... and in a later message.
  const Parsed q = ParseEveryWay(
      "<|channel|>analysis<|message|>Look it up.<|end|>"
      "<|start|>assistant to=functions.lookup<|channel|>commentary <|constrain|>json"
      "<|message|>{\"q\": \"y\"}<|call|>");
  EXPECT_EQ(q.reasoning, "Look it up.");
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].name, "lookup");
  EXPECT_EQ(q.calls[0].arguments, R"({"q":"y"})");
}

TEST(HarmonyTest, MultipleMessages) {
  const Parsed p = ParseEveryWay(
      "<|channel|>analysis<|message|>First thought.<|end|>"
      "<|start|>assistant<|channel|>analysis<|message|>Second thought.<|end|>"
      "<|start|>assistant<|channel|>commentary<|message|>Let me check two cities.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"location\": \"Paris\"}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"location\": \"Zürich\"}<|call|>"
      "<|start|>assistant<|channel|>final<|message|>Done.<|return|>");
  EXPECT_EQ(p.reasoning, "First thought.\n\nSecond thought.");
  EXPECT_EQ(p.content, "Let me check two cities.\n\nDone.");  // the preamble is for the user
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].index, 0);
  EXPECT_EQ(p.calls[1].index, 1);
  EXPECT_EQ(json::parse(p.calls[1].arguments), json::parse(R"({"location": "Zürich"})"));
}

TEST(HarmonyTest, TruncatedOutputGoesWhereItStands) {
  Parsed p = ParseEveryWay("<|channel|>analysis<|message|>cut by max_tok");
  EXPECT_EQ(p.reasoning, "cut by max_tok");
  EXPECT_EQ(p.content, "");
  p = ParseEveryWay("<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final"
                    "<|message|>The answer is 4");
  EXPECT_EQ(p.reasoning, "ok");
  EXPECT_EQ(p.content, "The answer is 4");
  // A cut header is markup: nothing of it is shown.
  p = ParseEveryWay("<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>fin");
  EXPECT_EQ(p.reasoning, "ok");
  EXPECT_EQ(p.content, "");
  p = ParseEveryWay("<|channel|>analysis<|message|>ok<|end|><|start|>assistant");
  EXPECT_EQ(p.content, "");
  // A call cut inside its arguments is no call: its body is content (as other syntaxes do).
  p = ParseEveryWay("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "{\"a\": ");
  // A partial control token at the very end is text.
  p = ParseEveryWay("<|channel|>final<|message|>x <|en");
  EXPECT_EQ(p.content, "x <|en");
}

TEST(HarmonyTest, OptionsTurnReasoningAndCallsIntoContent) {
  const std::string text =
      "<|channel|>analysis<|message|>Think.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{\"a\": 1}<|call|>";
  const Parsed no_tools = ParseEveryWay(text, HarmonyOptions{.reasoning = true, .tool_calls = false});
  EXPECT_EQ(no_tools.reasoning, "Think.");
  EXPECT_EQ(no_tools.content, "{\"a\": 1}");
  EXPECT_TRUE(no_tools.calls.empty());
  const Parsed no_reasoning =
      ParseEveryWay(text, HarmonyOptions{.reasoning = false, .tool_calls = true});
  EXPECT_EQ(no_reasoning.reasoning, "");
  EXPECT_EQ(no_reasoning.content, "Think.");
  EXPECT_EQ(no_reasoning.calls.size(), 1u);
}

TEST(HarmonyTest, BuiltInToolRecipientsAreNotCalls) {
  const Parsed p = ParseEveryWay(
      "<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}<|call|>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.reasoning, "{\"query\": \"x\"}");
  EXPECT_EQ(p.content, "");
}

TEST(HarmonyTest, BadArgumentsStayContent) {
  const Parsed p = ParseEveryWay(
      "<|channel|>commentary to=functions.f json<|message|>[1, 2]<|call|>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "[1, 2]");
}

TEST(HarmonyTest, WhereThePromptStops) {
  // The prompt opened the final channel itself: the output is its body.
  Parsed p = ParseEveryWay("Sure.", {}, "<|start|>assistant<|channel|>final<|message|>");
  EXPECT_EQ(p.content, "Sure.");
  p = ParseEveryWay("Hmm.<|end|><|start|>assistant<|channel|>final<|message|>Yes.", {},
                    "<|start|>assistant<|channel|>analysis<|message|>");
  EXPECT_EQ(p.reasoning, "Hmm.");
  EXPECT_EQ(p.content, "Yes.");
  // A prompt ending with a closed message: the output starts a new one.
  p = ParseEveryWay("<|start|>assistant<|channel|>final<|message|>Hi.", {},
                    "<|start|>user<|message|>x<|end|>");
  EXPECT_EQ(p.content, "Hi.");
}

TEST(HarmonyTest, OutputWithoutMarkupIsContent) {
  // A model that does not write harmony loses nothing: its text is content.
  Parsed p = ParseEveryWay("Just some text, <no> markup.");
  EXPECT_EQ(p.content, "Just some text, <no> markup.");
  p = ParseEveryWay("plain", {}, "no harmony prompt");
  EXPECT_EQ(p.content, "plain");
}

// Random sequences of control tokens and text: however malformed, no control token leaks and
// streaming agrees with the whole text (ParseEveryWay checks both).
TEST(HarmonyTest, RandomMarkupNeverLeaks) {
  const std::vector<std::string> words = {"assistant", " ", "analysis", "final", "commentary",
                                          " to=functions.f", " json", "{\"a\": 1}", "text", "<",
                                          "\n", "to=python"};
  std::mt19937 rng(11);
  for (int round = 0; round < 60; ++round) {
    std::string text;
    const int num_parts = 3 + static_cast<int>(rng() % 12);
    for (int i = 0; i < num_parts; ++i) {
      if (rng() % 2 == 0)
        text += HarmonyControlTokens()[rng() % HarmonyControlTokens().size()];
      else
        text += words[rng() % words.size()];
    }
    ParseEveryWay(text);
    ParseEveryWay(text, HarmonyOptions{.reasoning = false, .tool_calls = false});
  }
}

TEST(HarmonyTest, DetectsHarmonyTemplates) {
  EXPECT_TRUE(TemplateRendersHarmony(
      "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}"));
  EXPECT_FALSE(TemplateRendersHarmony("{{ '<|im_start|>' + message.role }}"));
}

}  // namespace
}  // namespace ember::serve
