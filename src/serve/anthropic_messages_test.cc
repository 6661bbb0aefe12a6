// Anthropic Messages: request translation into the chat body (every block kind, tools,
// tool_choice, thinking), errors that name the Anthropic field, and the output translator (the
// message body, and the event stream with its block indexes) fed chat.completion shapes.
#include "serve/anthropic_messages.h"

#include <gtest/gtest.h>

#include <sstream>

namespace ember::serve {
namespace {

using json = nlohmann::json;

RequestJson Parse(const char* text) {
  return RequestJson::parse(text);
}

AnthropicTranslation Translate(const char* body, AnthropicRoute route = AnthropicRoute::kMessages) {
  auto r = TranslateAnthropicRequest(Parse(body), route);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::get<AnthropicTranslation>(r);
}

ApiError Refusal(const char* body, AnthropicRoute route = AnthropicRoute::kMessages) {
  auto r = TranslateAnthropicRequest(Parse(body), route);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(AnthropicMessagesTest, ConversationWithToolsTranslatesToChat) {
  const AnthropicTranslation t = Translate(R"({
    "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "call it", "signature": "s"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"z": 1, "a": "x"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
        {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]}],
    "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "stop_sequences": ["END"], "temperature": 0.5, "top_k": 3, "stream": true,
    "metadata": {"user_id": "u"}, "thinking": {"type": "enabled", "budget_tokens": 2048}})");
  const RequestJson& chat = t.chat_body;
  ASSERT_EQ(chat["messages"].size(), 5u);
  EXPECT_EQ(chat["messages"][0], Parse(R"({"role": "system", "content": "Be brief."})"));
  EXPECT_EQ(chat["messages"][1], Parse(R"({"role": "user", "content": "Weather?"})"));
  const RequestJson& assistant = chat["messages"][2];
  EXPECT_EQ(assistant["content"], "Checking.");
  EXPECT_EQ(assistant["reasoning_content"], "call it");
  EXPECT_EQ(assistant["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(assistant["tool_calls"][0]["function"]["name"], "get_weather");
  // The input stays an object in the client's key order (templates render it with tojson).
  EXPECT_EQ(assistant["tool_calls"][0]["function"]["arguments"].dump(), R"({"z":1,"a":"x"})");
  EXPECT_EQ(chat["messages"][3],
            Parse(R"({"role": "tool", "tool_call_id": "toolu_1", "content": "21C"})"));
  EXPECT_EQ(chat["messages"][4], Parse(R"({"role": "user", "content": "And tomorrow?"})"));
  EXPECT_EQ(t.message_paths, (std::vector<std::string>{"system", "messages[0]", "messages[1]",
                                                       "messages[2].content[0]", "messages[2]"}));
  EXPECT_EQ(chat["tools"][0], Parse(R"({"type": "function", "function": {"name": "get_weather",
                                       "description": "d", "parameters": {"type": "object"}}})"));
  EXPECT_EQ(chat["tool_choice"], "required");
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["stop"], Parse(R"(["END"])"));
  EXPECT_EQ(chat["max_tokens"], 64);
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["top_k"], 3);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["chat_template_kwargs"], Parse(R"({"enable_thinking": true})"));
  EXPECT_FALSE(chat.contains("metadata"));
}

TEST(AnthropicMessagesTest, ToolChoiceKinds) {
  const char* base = R"({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                         "tools": [{"name": "f", "input_schema": {}}], "tool_choice": )";
  auto with = [&](const std::string& choice) {
    return Translate((std::string(base) + choice + "}").c_str()).chat_body["tool_choice"];
  };
  EXPECT_EQ(with(R"({"type": "auto"})"), "auto");
  EXPECT_EQ(with(R"({"type": "none"})"), "none");
  EXPECT_EQ(with(R"({"type": "tool", "name": "f"})"),
            Parse(R"({"type": "function", "function": {"name": "f"}})"));
}

// cache_salt (tenants do not share cached prompt KV) passes to the chat body, which checks it.
TEST(AnthropicMessagesTest, CacheSaltPassesThrough) {
  const AnthropicTranslation t = Translate(
      R"({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "cache_salt": "t1"})");
  EXPECT_EQ(t.chat_body["cache_salt"], "t1");
  EXPECT_FALSE(Translate(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})")
                   .chat_body.contains("cache_salt"));
  EXPECT_EQ(Refusal(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                        "cache_salt": 5})")
                .param,
            "cache_salt");
}

TEST(AnthropicMessagesTest, BadFieldsAreRefusedByName) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"messages": [{"role": "user", "content": "hi"}]})", "max_tokens"},
      {R"({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]})", "max_tokens"},
      {R"({"max_tokens": 1, "messages": []})", "messages"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": []}]})", "messages[0].content"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "n": 2})", "n"},
      {R"({"max_tokens": 1, "messages": [{"role": "system", "content": "hi"}]})",
       "messages[0].role"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image",
          "source": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text",
          "text": "a", "extra": 1}]}]})",
       "messages[0].content[0].extra"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})",
       "messages[0].content[0].tool_use_id"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"},
          {"role": "assistant", "content": "prefill"}]})",
       "messages[1]"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}],
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]})",
       "tools[0].type"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}],
          "tools": [{"name": "f"}]})",
       "tools[0].input_schema"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}],
          "tool_choice": {"type": "tool"}})",
       "tool_choice.name"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}],
          "stop_sequences": [1]})",
       "stop_sequences[0]"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}],
          "thinking": {"type": "enabled"}})",
       "thinking.budget_tokens"},
      {R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}],
          "metadata": {"user_id": "u", "other": 1}})",
       "metadata.other"},
  };
  for (const auto& [body, param] : cases) {
    const ApiError e = Refusal(body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_EQ(e.message.rfind(param, 0), 0u) << e.message;
  }
  // count_tokens takes no generation fields.
  EXPECT_EQ(Refusal(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}]})",
                    AnthropicRoute::kCountTokens)
                .param,
            "max_tokens");
  EXPECT_FALSE(
      Translate(R"({"messages": [{"role": "user", "content": "a"}]})", AnthropicRoute::kCountTokens)
          .chat_body.contains("max_tokens"));
}

TEST(AnthropicMessagesTest, ChatErrorsGetAnthropicFieldNames) {
  const std::vector<std::string> paths = {"system", "messages[0]", "messages[1].content[0]"};
  ApiError e = WithAnthropicFieldNames(
      InvalidRequest("tools[2].function.parameters: bad", "tools[2].function.parameters"), paths);
  EXPECT_EQ(e.param, "tools[2].input_schema");
  EXPECT_EQ(e.message, "tools[2].input_schema: bad");
  EXPECT_EQ(WithAnthropicFieldNames(InvalidRequest("stop: too many", "stop"), paths).param,
            "stop_sequences");
  EXPECT_EQ(WithAnthropicFieldNames(InvalidRequest("x", "messages[2].content"), paths).param,
            "messages[1].content[0].content");
  EXPECT_EQ(WithAnthropicFieldNames(InvalidRequest("x", "tool_choice.function.name"), paths).param,
            "tool_choice.name");
  EXPECT_EQ(WithAnthropicFieldNames(InvalidRequest("x", "messages"), paths).param, "messages");
}

TEST(AnthropicMessagesTest, ErrorShapeByStatus) {
  const json e = AnthropicErrorJson(401, "no key");
  EXPECT_EQ(e, json::parse(R"({"type": "error", "error": {"type": "authentication_error",
                                                           "message": "no key"}})"));
  EXPECT_EQ(AnthropicErrorType(400), "invalid_request_error");
  EXPECT_EQ(AnthropicErrorType(404), "not_found_error");
  EXPECT_EQ(AnthropicErrorType(413), "request_too_large");
  EXPECT_EQ(AnthropicErrorType(429), "rate_limit_error");
  EXPECT_EQ(AnthropicErrorType(500), "api_error");
  EXPECT_EQ(AnthropicErrorType(503), "overloaded_error");
}

json ChatBody(const char* message, const char* finish) {
  json body = {{"id", "chatcmpl-1"},
               {"object", "chat.completion"},
               {"model", "m"},
               {"usage", {{"prompt_tokens", 11}, {"completion_tokens", 7}}}};
  body["choices"] =
      json::array({{{"index", 0}, {"message", json::parse(message)}, {"finish_reason", finish}}});
  return body;
}

TEST(AnthropicMessagesTest, BodyHasBlocksStopReasonAndUsage) {
  AnthropicOutput out("served");
  const json body =
      out.Body(ChatBody(R"({"role": "assistant", "content": "Sure.", "reasoning_content": "hmm",
                   "tool_calls": [{"id": "call_abc", "type": "function",
                                   "function": {"name": "f", "arguments": "{\"a\":1}"}}]})",
                        "tool_calls"),
               "");
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["role"], "assistant");
  EXPECT_EQ(body["model"], "served");
  EXPECT_EQ(body["id"].get<std::string>().rfind("msg_", 0), 0u);
  ASSERT_EQ(body["content"].size(), 3u);
  EXPECT_EQ(body["content"][0],
            json::parse(R"({"type": "thinking", "thinking": "hmm", "signature": ""})"));
  EXPECT_EQ(body["content"][1], json::parse(R"({"type": "text", "text": "Sure."})"));
  EXPECT_EQ(body["content"][2], json::parse(R"({"type": "tool_use", "id": "toolu_abc", "name": "f",
                                                "input": {"a": 1}})"));
  EXPECT_EQ(body["stop_reason"], "tool_use");
  EXPECT_EQ(body["stop_sequence"], nullptr);
  EXPECT_EQ(body["usage"], json::parse(R"({"input_tokens": 11, "cache_creation_input_tokens": 0,
                                           "cache_read_input_tokens": 0, "output_tokens": 7})"));

  const std::string text = R"({"role": "assistant", "content": "x"})";
  // Prompt tokens reused from the prefix cache: cache_read_input_tokens, the rest input_tokens.
  json cached = ChatBody(text.c_str(), "stop");
  cached["usage"]["prompt_tokens_details"] = {{"cached_tokens", 8}};
  EXPECT_EQ(out.Body(cached, "")["usage"],
            json::parse(R"({"input_tokens": 3, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 8, "output_tokens": 7})"));
  EXPECT_EQ(out.Body(ChatBody(text.c_str(), "stop"), "")["stop_reason"], "end_turn");
  EXPECT_EQ(out.Body(ChatBody(text.c_str(), "length"), "")["stop_reason"], "max_tokens");
  const json stopped = out.Body(ChatBody(text.c_str(), "stop"), "END");
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence");
  EXPECT_EQ(stopped["stop_sequence"], "END");
}

// The stream's events as (name, data) pairs.
std::vector<std::pair<std::string, json>> Events(const std::string& sse) {
  std::vector<std::pair<std::string, json>> events;
  std::istringstream in(sse);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) {
      const json data = json::parse(line.substr(6));
      EXPECT_EQ(data["type"], name) << "the event name is the data's type";
      events.emplace_back(name, data);
    }
  }
  return events;
}

json Chunk(const char* delta, const char* finish = nullptr) {
  json choice = {{"index", 0},
                 {"delta", json::parse(delta)},
                 {"finish_reason", finish ? json(finish) : json(nullptr)}};
  return {{"object", "chat.completion.chunk"}, {"choices", json::array({choice})}};
}

TEST(AnthropicMessagesTest, StreamOpensAndClosesBlocksInOrder) {
  AnthropicOutput out("served");
  std::string sse;
  out.Begin(Usage{.prompt_tokens = 9}, &sse);
  out.Chunk(Chunk(R"({"role": "assistant", "content": ""})"), &sse);
  out.Chunk(Chunk(R"({"reasoning_content": "let me"})"), &sse);
  out.Chunk(Chunk(R"({"reasoning_content": " think", "content": "Hi"})"), &sse);
  out.Chunk(Chunk(R"({"content": " there"})"), &sse);
  out.Chunk(Chunk(R"({"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                      "function": {"name": "f", "arguments": "{\"a\":2}"}}]})"),
            &sse);
  out.Chunk(Chunk("{}", "tool_calls"), &sse);
  out.End(Usage{.prompt_tokens = 9, .completion_tokens = 5, .cached_tokens = 6}, "", &sse);
  const auto events = Events(sse);
  std::vector<std::string> names;
  for (const auto& [name, data] : events) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "message_start", "ping", "content_block_start", "content_block_delta",
                       "content_block_delta", "content_block_stop", "content_block_start",
                       "content_block_delta", "content_block_delta", "content_block_stop",
                       "content_block_start", "content_block_delta", "content_block_stop",
                       "message_delta", "message_stop"}));
  EXPECT_EQ(events[0].second["message"]["usage"]["input_tokens"], 9);
  EXPECT_EQ(events[0].second["message"]["usage"]["cache_read_input_tokens"], 0);
  // message_delta: the final split (6 of the 9 prompt tokens from the prefix cache).
  EXPECT_EQ(events[13].second["usage"],
            json::parse(R"({"input_tokens": 3, "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 6, "output_tokens": 5})"));
  EXPECT_EQ(events[2].second["content_block"]["type"], "thinking");
  EXPECT_EQ(events[3].second["delta"],
            json::parse(R"({"type": "thinking_delta", "thinking": "let me"})"));
  EXPECT_EQ(events[6].second["index"], 1);
  EXPECT_EQ(events[7].second["delta"], json::parse(R"({"type": "text_delta", "text": "Hi"})"));
  EXPECT_EQ(events[10].second["index"], 2);
  EXPECT_EQ(events[10].second["content_block"]["id"], "toolu_9");
  EXPECT_EQ(events[11].second["delta"],
            json::parse(R"({"type": "input_json_delta", "partial_json": "{\"a\":2}"})"));
  EXPECT_EQ(events[13].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(events[13].second["usage"]["output_tokens"], 5);
}

TEST(AnthropicMessagesTest, StreamStopSequenceAndFailure) {
  AnthropicOutput out("served");
  std::string sse;
  out.Begin(Usage{}, &sse);
  out.Chunk(Chunk(R"({"content": "a"})", "stop"), &sse);
  out.End(Usage{}, "END", &sse);
  const auto events = Events(sse);
  const json& delta = events[events.size() - 2].second["delta"];
  EXPECT_EQ(delta["stop_reason"], "stop_sequence");
  EXPECT_EQ(delta["stop_sequence"], "END");

  std::string failed;
  AnthropicOutput broken("served");
  broken.Fail(ApiError{503, "shutting down", "server_error", "", "shutting_down"}, &failed);
  EXPECT_EQ(Events(failed)[0].second["error"]["type"], "overloaded_error");
}

}  // namespace
}  // namespace ember::serve
