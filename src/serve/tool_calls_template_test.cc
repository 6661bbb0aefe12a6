// The hermes parser reads back exactly what a real template writes for an assistant's tool calls
// (the syntax the model was trained to produce): qwen3's template renders two calls, and the
// parser recovers their names and arguments from the rendered assistant turn. Templates of other
// syntaxes are not mistaken for a known one.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/tool_calls.h"
#include "template/chat_template.h"
#include "util/testing.h"

namespace ember::serve {
namespace {

using nlohmann::json;

TEST(ToolCallTemplateTest, HermesReadsBackQwen3sRenderedCalls) {
  const std::string dir = testing::TokenizersDir() + "/qwen3";
  EMBER_REQUIRE_DIR(dir);
  auto tmpl = ChatTemplate::Load(dir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  ASSERT_EQ(DetectToolCallFormat(tmpl->tools_source()), ToolCallFormat::kHermes);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const json user = {{"role", "user"}, {"content", "Weather in Paris and Zürich?"}};
  const json calls = json::parse(R"([
      {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
      {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}])");
  const json assistant = {{"role", "assistant"}, {"content", "Checking."}, {"tool_calls", calls}};
  auto prompt = tmpl->Render(json::array({user}), tools, true, json::object());
  auto whole = tmpl->Render(json::array({user, assistant}), tools, false, json::object());
  ASSERT_TRUE(prompt.ok() && whole.ok());
  ASSERT_TRUE(whole->starts_with(*prompt)) << *whole;
  std::string turn = whole->substr(prompt->size());
  turn = turn.substr(0, turn.find("<|im_end|>"));

  ToolCallParser parser(ToolCallFormat::kHermes);
  ToolCallDelta a = parser.Push(turn), b = parser.Finish();
  // (qwen3 writes an empty thinking block before the last assistant turn.)
  EXPECT_EQ(a.content + b.content, "<think>\n\n</think>\n\nChecking.") << turn;
  for (ToolCall& c : b.calls) a.calls.push_back(std::move(c));
  ASSERT_EQ(a.calls.size(), 2u) << turn;
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(a.calls[0].arguments), json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(json::parse(a.calls[1].arguments), json::parse(R"({"city": "Zürich"})"));
}

TEST(ToolCallTemplateTest, OtherTemplatesAreNotMistaken) {
  for (const char* name : {"llama3", "gemma3", "deepseek_v3"}) {
    const std::string dir = testing::TokenizersDir() + "/" + name;
    EMBER_REQUIRE_DIR(dir);
    auto tmpl = ChatTemplate::Load(dir);
    ASSERT_TRUE(tmpl.ok()) << tmpl.message();
    EXPECT_EQ(DetectToolCallFormat(tmpl->tools_source()), ToolCallFormat::kNone) << name;
  }
}

}  // namespace
}  // namespace ember::serve
