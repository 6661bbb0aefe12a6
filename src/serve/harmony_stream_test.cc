// Harmony through the server's real detokenize path: a reply encoded with the gpt-oss tokenizer
// (its control tokens are single special ids) streamed id by id through a TextStream that keeps
// harmony's control tokens, into a HarmonyParser, splits exactly as the text does; other special
// tokens stay skipped, and a TextStream that skips every special token is unchanged. A chat
// request to a harmony model is prepared for the harmony parser (forced calls are refused), and
// one to a model whose template writes Mistral's [TOOL_CALLS] for the mistral parser (the same).
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "serve/harmony.h"
#include "serve/output_parsers.h"
#include "serve/request_builder.h"
#include "serve/text_stream.h"
#include "template/chat_template.h"
#include "util/testing.h"

namespace ember::serve {
namespace {

constexpr std::string_view kReply =
    "<|channel|>analysis<|message|>User wants the weather in Zürich — call get_weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"location\": \"Zürich\", \"unit\": \"°C\"}<|call|>";

class HarmonyStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::TokenizersDir() + "/gptoss";
    EMBER_REQUIRE_DIR(dir);
    auto tok = Tokenizer::Load(dir);
    ASSERT_TRUE(tok.ok()) << tok.message();
    tokenizer_ = std::move(*tok);
  }

  std::vector<int32_t> Ids(std::string_view text) const {
    return tokenizer_->Encode(text, /*add_special_tokens=*/false);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(HarmonyStreamTest, ControlTokensAreSingleSpecialIds) {
  for (std::string_view token : HarmonyControlTokens()) {
    const std::optional<int32_t> id = tokenizer_->TokenToId(token);
    ASSERT_TRUE(id.has_value()) << token;
    EXPECT_TRUE(tokenizer_->IsSpecial(*id)) << token;
    EXPECT_EQ(Ids(token), std::vector<int32_t>{*id}) << token;
  }
}

TEST_F(HarmonyStreamTest, TokenByTokenThroughTextStream) {
  // The model's last token, <|call|>, is a stop token: the server never pushes it.
  std::vector<int32_t> ids = Ids(kReply);
  ASSERT_EQ(ids.back(), *tokenizer_->TokenToId("<|call|>"));
  ids.pop_back();
  // An unkept special token (<|endoftext|>) in the middle must vanish, as it does today.
  const int32_t endoftext = *tokenizer_->TokenToId("<|endoftext|>");
  ids.insert(ids.begin() + 3, endoftext);

  TextStream stream(*tokenizer_, {}, HarmonyControlTokens());
  HarmonyParser parser(HarmonyOptions{}, "<|start|>user<|message|>Weather?<|end|><|start|>assistant");
  std::string text, reasoning, content;
  std::vector<ToolCall> calls;
  auto add = [&](HarmonyDelta d) {
    reasoning += d.reasoning;
    content += d.content;
    for (ToolCall& c : d.calls) calls.push_back(std::move(c));
  };
  for (int32_t id : ids) {
    const TextDelta delta = stream.Push(id);
    ASSERT_FALSE(delta.stopped);
    text += delta.text;
    add(parser.Push(delta.text));
  }
  const std::string tail = stream.Finish();
  text += tail;
  add(parser.Push(tail));
  add(parser.Finish());

  EXPECT_EQ(text, std::string(kReply.substr(0, kReply.size() - std::string_view("<|call|>").size())));
  EXPECT_EQ(reasoning, "User wants the weather in Zürich — call get_weather.");
  EXPECT_EQ(content, "");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(calls[0].arguments),
            nlohmann::json::parse(R"({"location": "Zürich", "unit": "°C"})"));
}

TEST_F(HarmonyStreamTest, SkippingStreamIsUnchanged) {
  // Other models' samples skip every special token, harmony's included, as before.
  const std::vector<int32_t> ids = Ids(kReply);
  TextStream stream(*tokenizer_, {}, /*skip_special_tokens=*/true);
  std::string text;
  for (int32_t id : ids) text += stream.Push(id).text;
  text += stream.Finish();
  EXPECT_EQ(text, tokenizer_->Decode(ids, /*skip_special_tokens=*/true));
  for (std::string_view token : HarmonyControlTokens()) EXPECT_EQ(text.find(token), std::string::npos);
}

TEST_F(HarmonyStreamTest, StopStringStillCutsTheText) {
  const std::vector<int32_t> ids = Ids(
      "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
      "<|message|>One. STOP Two.");
  TextStream stream(*tokenizer_, {"STOP"}, HarmonyControlTokens());
  HarmonyParser parser(HarmonyOptions{}, "<|start|>assistant");
  std::string reasoning, content;
  for (int32_t id : ids) {
    const TextDelta delta = stream.Push(id);
    const HarmonyDelta d = parser.Push(delta.text);
    reasoning += d.reasoning;
    content += d.content;
    if (delta.stopped) break;
  }
  const HarmonyDelta d = parser.Finish();
  reasoning += d.reasoning;
  content += d.content;
  EXPECT_TRUE(stream.stopped());
  EXPECT_EQ(reasoning, "Think.");
  EXPECT_EQ(content, "One. ");
}

// A chat model served over `tokenizer` and `tmpl`, its output parsers chosen as `ember serve`'s
// auto does from the template.
ServedModel AutoServed(const std::string& name, const Tokenizer& tokenizer,
                       const ChatTemplate& tmpl) {
  ServedModel served;
  served.name = name;
  served.tokenizer = &tokenizer;
  served.chat_template = &tmpl;
  served.context_length = 4096;
  served.vocab_size = tokenizer.vocab_size();
  Result<OutputParsers> parsers = ChooseOutputParsers("auto", "auto", tmpl.tools_source());
  EXPECT_TRUE(parsers.ok()) << parsers.message();
  if (parsers.ok()) {
    served.reasoning_format = parsers->reasoning;
    served.tool_format = parsers->tools;
  }
  return served;
}

// A chat body: one user message and one tool.
nlohmann::json ChatWithATool() {
  const nlohmann::json tools = nlohmann::json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  return {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"tools", tools}};
}

TEST_F(HarmonyStreamTest, ChatRequestIsPreparedForHarmony) {
  // Enough of gpt-oss's template to end where its generation prompt does.
  auto tmpl = ChatTemplate::FromSource(
      "{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endfor %}"
      "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
      "{#- <|channel|>commentary to=functions. #}",
      "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  const ServedModel served = AutoServed("gpt-oss", *tokenizer_, *tmpl);
  nlohmann::json body = ChatWithATool();

  Prepared prepared = PrepareChat(served, body);
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(prepared))
      << std::get<ApiError>(prepared).message;
  const PreparedRequest& request = std::get<PreparedRequest>(prepared);
  EXPECT_TRUE(request.harmony);
  EXPECT_TRUE(request.reasoning);
  EXPECT_EQ(request.tool_format, ToolCallFormat::kHarmony);
  EXPECT_EQ(request.harmony_last_message, "<|start|>assistant");
  // The rendered control tokens are encoded as their special ids.
  const std::vector<int32_t>& ids = request.prompts[0].request.prompt_ids;
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tokenizer_->TokenToId("<|start|>")), 2);

  body["tool_choice"] = "required";
  prepared = PrepareChat(served, body);
  ASSERT_TRUE(std::holds_alternative<ApiError>(prepared));
  EXPECT_EQ(std::get<ApiError>(prepared).param, "tool_choice");
  EXPECT_NE(std::get<ApiError>(prepared).message.find("harmony"), std::string::npos);
}

// A chat request with tools to a model whose template writes [TOOL_CALLS] is prepared for the
// mistral parser; forcing a call is a 400 naming tool_choice (the calls start with special tokens
// the output constraint cannot write).
TEST(MistralChatTest, ChatRequestTakesTheParserAndRefusesForcedCalls) {
  EMBER_REQUIRE_DIR(testing::TokenizersDir() + "/qwen3");
  auto tok = Tokenizer::Load(testing::TokenizersDir() + "/qwen3");
  ASSERT_TRUE(tok.ok()) << tok.message();
  auto tmpl = ChatTemplate::FromSource(
      "{%- for m in messages %}[INST]{{ m.content }}[/INST]{%- endfor %}{#- [TOOL_CALLS] #}", "",
      "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  const ServedModel served = AutoServed("mistral", **tok, *tmpl);
  ASSERT_EQ(served.tool_format, ToolCallFormat::kMistral);
  nlohmann::json body = ChatWithATool();
  Prepared prepared = PrepareChat(served, body);
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(prepared))
      << std::get<ApiError>(prepared).message;
  EXPECT_EQ(std::get<PreparedRequest>(prepared).tool_format, ToolCallFormat::kMistral);
  body["tool_choice"] = "required";
  prepared = PrepareChat(served, body);
  ASSERT_TRUE(std::holds_alternative<ApiError>(prepared));
  EXPECT_EQ(std::get<ApiError>(prepared).param, "tool_choice");
  EXPECT_NE(std::get<ApiError>(prepared).message.find("mistral"), std::string::npos);
}

}  // namespace
}  // namespace ember::serve
