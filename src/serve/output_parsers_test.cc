// Parser choice: auto reads the template (think blocks, hermes, harmony); harmony on either flag
// brings the other's auto along; harmony beside another parser is an error, never double parsing.
#include "serve/output_parsers.h"

#include <gtest/gtest.h>

namespace ember::serve {
namespace {

constexpr std::string_view kHarmonyTemplate =
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}";
constexpr std::string_view kQwen3Template = "{{- '<tool_call>\\n' }}{{- '<think>\\n\\n</think>' }}";

OutputParsers Choose(std::string_view reasoning, std::string_view tools, std::string_view source) {
  Result<OutputParsers> r = ChooseOutputParsers(reasoning, tools, source);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : OutputParsers{};
}

TEST(OutputParsersTest, AutoReadsTheTemplate) {
  OutputParsers p = Choose("auto", "auto", kHarmonyTemplate);
  EXPECT_EQ(p.reasoning, ReasoningFormat::kHarmony);
  EXPECT_EQ(p.tools, ToolCallFormat::kHarmony);
  EXPECT_TRUE(p.harmony());
  p = Choose("auto", "auto", kQwen3Template);
  EXPECT_EQ(p.reasoning, ReasoningFormat::kThink);
  EXPECT_EQ(p.tools, ToolCallFormat::kHermes);
  EXPECT_FALSE(p.harmony());
  p = Choose("auto", "auto", "{{ m.content }}");
  EXPECT_EQ(p.reasoning, ReasoningFormat::kNone);
  EXPECT_EQ(p.tools, ToolCallFormat::kNone);
}

TEST(OutputParsersTest, HarmonyOnOneFlagBringsTheOthersAuto) {
  OutputParsers p = Choose("harmony", "auto", kQwen3Template);
  EXPECT_EQ(p.tools, ToolCallFormat::kHarmony);
  p = Choose("auto", "harmony", "{{ m.content }}");
  EXPECT_EQ(p.reasoning, ReasoningFormat::kHarmony);
  // none switches one half off; the other still uses harmony.
  p = Choose("none", "auto", kHarmonyTemplate);
  EXPECT_EQ(p.reasoning, ReasoningFormat::kNone);
  EXPECT_EQ(p.tools, ToolCallFormat::kHarmony);
  EXPECT_TRUE(p.harmony());
  p = Choose("harmony", "none", kQwen3Template);
  EXPECT_EQ(p.tools, ToolCallFormat::kNone);
  EXPECT_TRUE(p.harmony());
}

TEST(OutputParsersTest, HarmonyBesideAnotherParserIsAnError) {
  for (auto [reasoning, tools, source] :
       {std::tuple{"harmony", "hermes", kQwen3Template}, {"think", "harmony", kQwen3Template},
        {"auto", "llama3_json", kHarmonyTemplate}, {"think", "auto", kHarmonyTemplate}}) {
    Result<OutputParsers> r = ChooseOutputParsers(reasoning, tools, source);
    ASSERT_FALSE(r.ok()) << reasoning << " " << tools;
    EXPECT_NE(r.message().find("conflict"), std::string::npos) << r.message();
  }
}

TEST(OutputParsersTest, UnknownNamesNameTheFlag) {
  Result<OutputParsers> r = ChooseOutputParsers("deepseek", "auto", "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.message().find("--reasoning-parser"), 0u) << r.message();
  r = ChooseOutputParsers("auto", "deepseek", "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.message().find("--tool-call-parser"), 0u) << r.message();
  // mistral is a known name, and auto finds it in a template that writes [TOOL_CALLS].
  r = ChooseOutputParsers("auto", "mistral", "");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->tools, ToolCallFormat::kMistral);
  r = ChooseOutputParsers("auto", "auto", "{{- '[TOOL_CALLS]' + call.name + '[ARGS]' }}");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->tools, ToolCallFormat::kMistral);
}

}  // namespace
}  // namespace ember::serve
