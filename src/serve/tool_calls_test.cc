// Tool-call parsing: calls and content come out the same however the text is cut into pieces
// (streaming) and in one piece; blocks that are not calls stay content; forced-call texts parse
// back into their call; formats are read from real templates' tell-tale strings.
#include "serve/tool_calls.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace ember::serve {
namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

void Append(Parsed& p, ToolCallDelta d) {
  p.content += d.content;
  for (ToolCall& c : d.calls) p.calls.push_back(std::move(c));
}

Parsed ParseInPieces(ToolCallFormat format, const std::string& text,
                     const std::vector<size_t>& cuts) {
  ToolCallParser parser(format);
  Parsed p;
  size_t at = 0;
  for (size_t cut : cuts) {
    Append(p, parser.Push(std::string_view(text).substr(at, cut - at)));
    at = cut;
  }
  Append(p, parser.Push(std::string_view(text).substr(at)));
  Append(p, parser.Finish());
  return p;
}

// One piece, every byte alone, and random cuttings must agree.
Parsed ParseEveryWay(ToolCallFormat format, const std::string& text) {
  const Parsed whole = ParseInPieces(format, text, {});
  std::vector<size_t> bytes;
  for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
  std::mt19937 rng(3);
  std::vector<std::vector<size_t>> cuttings = {bytes};
  for (int r = 0; r < 20; ++r) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i)
      if (rng() % 4 == 0) cuts.push_back(i);
    cuttings.push_back(cuts);
  }
  for (const auto& cuts : cuttings) {
    const Parsed p = ParseInPieces(format, text, cuts);
    EXPECT_EQ(p.content, whole.content) << text;
    EXPECT_EQ(p.calls.size(), whole.calls.size()) << text;
    for (size_t i = 0; i < p.calls.size() && i < whole.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(p.calls[i].arguments, whole.calls[i].arguments);
      EXPECT_EQ(p.calls[i].index, static_cast<int32_t>(i));
    }
  }
  return whole;
}

TEST(ToolCallParserTest, HermesCallsAndContent) {
  const Parsed p = ParseEveryWay(
      ToolCallFormat::kHermes,
      "Let me look that up.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Zürich\", \"unit\": \"celsius\", \"a\": [1, {\"b\": null}]}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n");
  EXPECT_EQ(p.content, "Let me look that up.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  // Compact, keys in the model's order, non-ASCII kept.
  EXPECT_EQ(p.calls[0].arguments,
            "{\"city\":\"Zürich\",\"unit\":\"celsius\",\"a\":[1,{\"b\":null}]}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
}

TEST(ToolCallParserTest, HermesWithoutCallsIsPlainContent) {
  for (const std::string text : {"Hello, world.", "a <tool b", "ends with <tool_c", "x < y\n\n",
                                 "  spaced  out  \n", "<tool_calls> is not the tag", ""}) {
    const Parsed p = ParseEveryWay(ToolCallFormat::kHermes, text);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.calls.empty()) << text;
  }
}

TEST(ToolCallParserTest, HermesBlocksThatAreNotCallsStayContent) {
  for (const std::string block :
       {"<tool_call>\nnot json\n</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {}, \"extra\": 1}</tool_call>",
        "<tool_call>{\"name\": \"f\", \"argu"}) {
    const Parsed p = ParseEveryWay(ToolCallFormat::kHermes, "Text " + block);
    EXPECT_EQ(p.content, "Text" + block) << block;  // the separator before a block is dropped
    EXPECT_TRUE(p.calls.empty()) << block;
  }
}

TEST(ToolCallParserTest, HermesUnclosedCallAndStringArguments) {
  // A sample cut by a stop string (or EOS) right after the object still made its call.
  Parsed p = ParseEveryWay(ToolCallFormat::kHermes,
                           "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}\n");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ(p.content, "");
  p = ParseEveryWay(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\"}</tool_call> after");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{}");
  EXPECT_EQ(p.content, " after");
}

TEST(ToolCallParserTest, HermesHoldsOnlyWhatMayStillBeACall) {
  ToolCallParser parser(ToolCallFormat::kHermes);
  EXPECT_EQ(parser.Push("Hi there <tool").content, "Hi there");
  EXPECT_EQ(parser.Push("box> ok").content, " <toolbox> ok");
  EXPECT_EQ(parser.Push("\n\n").content, "");  // maybe a separator
  EXPECT_EQ(parser.Push("more").content, "\n\nmore");
  EXPECT_EQ(parser.Finish().content, "");
}

TEST(ToolCallParserTest, Llama3JsonCalls) {
  Parsed p =
      ParseEveryWay(ToolCallFormat::kLlama3Json,
                    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris; FR\"}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Paris; FR\"}");
  EXPECT_EQ(p.content, "");
  p = ParseEveryWay(
      ToolCallFormat::kLlama3Json,
      " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": 2}}");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, "{\"k\":2}");
  for (const std::string text :
       {"The answer is {\"name\": \"a\", \"parameters\": {}}",
        "{\"name\": \"a\", \"parameters\": {}} and more", "{\"key\": \"a json answer\"}",
        "{\"name\": \"a\", \"param", "   ", "plain"}) {
    p = ParseEveryWay(ToolCallFormat::kLlama3Json, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  ToolCallParser parser(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(parser.Push("  ").content, "");
  EXPECT_EQ(parser.Push("Sure").content, "  Sure");  // not a call: streams at once
}

// Mistral: [TOOL_CALLS] then a JSON array (tokenizers v3 / v7), or NAME[ARGS]{...} per call
// (v11+), with content before; the tags never reach the content of a block that parses.
TEST(ToolCallParserTest, MistralCallsBothSyntaxes) {
  Parsed p = ParseEveryWay(
      ToolCallFormat::kMistral,
      "Checking.\n[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
      "\"id\": \"a1b2c3d4e\"}, {\"name\": \"get_time\", \"arguments\": {}}]");
  EXPECT_EQ(p.content, "Checking.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  p = ParseEveryWay(ToolCallFormat::kMistral,
                    "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Zürich\", \"days\": [1, 2]}"
                    "[TOOL_CALLS]get_time[CALL_ID]x9y8z7w6v[ARGS]{}");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Zürich\",\"days\":[1,2]}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(p.calls[1].index, 1);
}

TEST(ToolCallParserTest, MistralBlocksThatAreNotCallsStayContent) {
  for (const std::string text : {"Hello, [TOOL", "plain [text] with [ARGS] inside", "", "  "}) {
    const Parsed p = ParseEveryWay(ToolCallFormat::kMistral, text);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.calls.empty()) << text;
  }
  for (const std::string block :
       {"[TOOL_CALLS] not json", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": [1]}]",
        "[TOOL_CALLS]f[ARGS]{\"cut\": ", "[TOOL_CALLS]two words[ARGS]{}", "[TOOL_CALLS][]"}) {
    const Parsed p = ParseEveryWay(ToolCallFormat::kMistral, "Text " + block);
    EXPECT_EQ(p.content, "Text" + block) << block;  // the separator before a block is dropped
    EXPECT_TRUE(p.calls.empty()) << block;
  }
  // One good call, then a block that is not one: the call stands, the block stays content.
  const Parsed p = ParseEveryWay(ToolCallFormat::kMistral, "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]oops");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "[TOOL_CALLS]oops");
}

TEST(ToolCallParserTest, MistralHoldsOnlyWhatMayStillBeACall) {
  ToolCallParser parser(ToolCallFormat::kMistral);
  EXPECT_EQ(parser.Push("Sure [TOOL").content, "Sure");
  EXPECT_EQ(parser.Push("S] done").content, " [TOOLS] done");
  const ToolCallDelta call = parser.Push(" [TOOL_CALLS]f[ARGS]{\"a\": 1}");
  EXPECT_EQ(call.content, "");
  EXPECT_TRUE(call.calls.empty());  // the block may still grow until the next tag or the end
  const ToolCallDelta next = parser.Push("[TOOL_CALLS]");
  ASSERT_EQ(next.calls.size(), 1u);
  EXPECT_EQ(next.calls[0].arguments, "{\"a\":1}");
  EXPECT_EQ(parser.Finish().content, "[TOOL_CALLS]");  // an empty block is no call
}

TEST(ToolCallParserTest, ForcedCallTextsParseBack) {
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    const std::string text =
        ForcedCallHead(f, "say \"hi\"") + "{\"to\": \"you\"}" + ForcedCallTail(f);
    const Parsed p = ParseEveryWay(f, text);
    ASSERT_EQ(p.calls.size(), 1u) << text;
    EXPECT_EQ(p.calls[0].name, "say \"hi\"");
    EXPECT_EQ(p.calls[0].arguments, "{\"to\":\"you\"}");
    EXPECT_EQ(p.content, "");
  }
}

TEST(ToolCallFormatTest, NamesAndDetection) {
  for (ToolCallFormat f :
       {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
        ToolCallFormat::kHarmony, ToolCallFormat::kMistral})
    EXPECT_EQ(ParseToolCallFormat(ToolCallFormatName(f)), f);
  EXPECT_FALSE(ParseToolCallFormat("deepseek").has_value());
  EXPECT_EQ(DetectToolCallFormat("{{- \"[TOOL_CALLS] [\" }}{%- for tool in message.tool_calls %}"),
            ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("{{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' }}"),
            ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>\\n{\"name\": \"' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{{- '<|python_tag|>' + tool_call.name }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(DetectToolCallFormat("{{ messages[0]['content'] }}"), ToolCallFormat::kNone);
  EXPECT_EQ(DetectToolCallFormat("{{- '<|start|>assistant<|channel|>commentary to=functions.' }}"),
            ToolCallFormat::kHarmony);
}

}  // namespace
}  // namespace ember::serve
