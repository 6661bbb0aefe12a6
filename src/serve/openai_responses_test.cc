// OpenAI Responses: input items translated into chat messages (calls joining their assistant turn,
// reasoning attached to the next one), tools, text.format and the stateful fields refused by name;
// the output translator's response object and its event stream (order, sequence numbers, items).
#include "serve/openai_responses.h"

#include <gtest/gtest.h>

#include <sstream>

namespace ember::serve {
namespace {

using json = nlohmann::json;

ResponsesTranslation Translate(const char* body) {
  auto r = TranslateResponsesRequest(RequestJson::parse(body));
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::get<ResponsesTranslation>(r);
}

TEST(OpenAiResponsesTest, StringInputAndInstructions) {
  const ResponsesTranslation t = Translate(
      R"({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9,
          "temperature": 0.2, "store": true, "metadata": {"k": "v"}})");
  EXPECT_EQ(t.chat_body["messages"],
            RequestJson::parse(R"([{"role": "system", "content": "Be brief."},
                                                           {"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(t.chat_body["max_tokens"], 9);
  EXPECT_EQ(t.chat_body["temperature"], 0.2);
  EXPECT_EQ(t.echo["store"], false);  // nothing is stored, whatever was asked
  EXPECT_EQ(t.echo["instructions"], "Be brief.");
  EXPECT_EQ(t.echo["metadata"], json::parse(R"({"k": "v"})"));
  EXPECT_EQ(t.message_paths, (std::vector<std::string>{"instructions", "input"}));
}

TEST(OpenAiResponsesTest, ItemsBecomeChatTurns) {
  const ResponsesTranslation t = Translate(R"({"input": [
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "use the tool"}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
       "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
      {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
      {"type": "function_call_output", "call_id": "call_2", "output": "noon"},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks"}]}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}})");
  const RequestJson& m = t.chat_body["messages"];
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["reasoning_content"], "use the tool");
  ASSERT_EQ(m[1]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[1]["tool_calls"][0], RequestJson::parse(R"({"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}})"));
  EXPECT_EQ(m[1]["tool_calls"][1]["id"], "call_2");
  EXPECT_EQ(m[2],
            RequestJson::parse(R"({"role": "tool", "tool_call_id": "call_1", "content": "21C"})"));
  EXPECT_EQ(m[4], RequestJson::parse(R"({"role": "assistant", "content": "Sunny."})"));
  EXPECT_EQ(m[5], RequestJson::parse(R"({"role": "user", "content": "Thanks"})"));
  EXPECT_EQ(t.message_paths[1], "input[2]");
  EXPECT_EQ(t.chat_body["tools"][0]["function"]["strict"], true);
  EXPECT_EQ(t.chat_body["tool_choice"]["function"]["name"], "get_weather");
  EXPECT_EQ(t.chat_body["response_format"]["json_schema"]["name"], "a");
}

// cache_salt (tenants do not share cached prompt KV) passes to the chat body, which checks it.
TEST(OpenAiResponsesTest, CacheSaltPassesThrough) {
  EXPECT_EQ(Translate(R"({"input": "x", "cache_salt": "t1"})").chat_body["cache_salt"], "t1");
  EXPECT_FALSE(Translate(R"({"input": "x"})").chat_body.contains("cache_salt"));
  auto r = TranslateResponsesRequest(RequestJson::parse(R"({"input": "x", "cache_salt": []})"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "cache_salt");
}

TEST(OpenAiResponsesTest, BadAndStatefulFieldsAreRefusedByName) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({})", "input"},
      {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id"},
      {R"({"input": "x", "conversation": "c"})", "conversation"},
      {R"({"input": "x", "background": true})", "background"},
      {R"({"input": "x", "frobnicate": 1})", "frobnicate"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens"},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": [{"type": "item_reference", "id": "x"}]})", "input[0].type"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})",
       "input[0].call_id"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}})",
       "text.format.name"},
      {R"({"input": "x", "include": ["reasoning.encrypted_content"]})", "include[0]"},
  };
  for (const auto& [body, param] : cases) {
    auto r = TranslateResponsesRequest(RequestJson::parse(body));
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, param) << body;
    EXPECT_EQ(e.message.rfind(param, 0), 0u) << e.message;
  }
  const std::vector<std::string> paths = {"instructions", "input[0]"};
  EXPECT_EQ(WithResponsesFieldNames(InvalidRequest("max_tokens: x", "max_tokens"), paths).param,
            "max_output_tokens");
  EXPECT_EQ(
      WithResponsesFieldNames(InvalidRequest("x", "tools[1].function.parameters"), paths).param,
      "tools[1].parameters");
  EXPECT_EQ(
      WithResponsesFieldNames(InvalidRequest("x", "response_format.json_schema.schema"), paths)
          .param,
      "text.format.schema");
  EXPECT_EQ(WithResponsesFieldNames(InvalidRequest("x", "messages[1].content"), paths).param,
            "input[0].content");
}

json ChatBody(const char* message, const char* finish) {
  json body = {{"usage",
                {{"prompt_tokens", 5},
                 {"completion_tokens", 3},
                 {"prompt_tokens_details", {{"cached_tokens", 2}}}}}};
  body["choices"] = json::array({{{"message", json::parse(message)}, {"finish_reason", finish}}});
  return body;
}

TEST(OpenAiResponsesTest, BodyHasItemsStatusAndUsage) {
  ResponsesOutput out("served", json{{"store", false}, {"tools", json::array()}});
  const json r = out.Body(ChatBody(R"({"content": null, "reasoning_content": "hmm",
      "tool_calls": [{"id": "call_7", "function": {"name": "f", "arguments": "{\"a\":1}"}}]})",
                                   "tool_calls"),
                          "");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["store"], false);
  ASSERT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "hmm");
  EXPECT_EQ(r["output"][1]["type"], "function_call");
  EXPECT_EQ(r["output"][1]["call_id"], "call_7");
  EXPECT_EQ(r["output"][1]["arguments"], "{\"a\":1}");
  EXPECT_EQ(r["usage"]["input_tokens"], 5);
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(r["usage"]["total_tokens"], 8);

  ResponsesOutput cut("served", json::object());
  const json c = cut.Body(ChatBody(R"({"content": "abc"})", "length"), "");
  EXPECT_EQ(c["status"], "incomplete");
  EXPECT_EQ(c["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(c["output"][0]["content"][0]["text"], "abc");
  EXPECT_EQ(c["output"][0]["status"], "incomplete");
}

std::vector<json> Events(const std::string& sse) {
  std::vector<json> events;
  std::istringstream in(sse);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) {
      events.push_back(json::parse(line.substr(6)));
      EXPECT_EQ(events.back()["type"], name);
    }
  }
  return events;
}

json Chunk(const char* delta, const char* finish = nullptr) {
  json choice = {{"delta", json::parse(delta)},
                 {"finish_reason", finish ? json(finish) : json(nullptr)}};
  return {{"choices", json::array({choice})}};
}

TEST(OpenAiResponsesTest, StreamEventsInOrderWithSequenceNumbers) {
  ResponsesOutput out("served", json::object());
  std::string sse;
  out.Begin(Usage{.prompt_tokens = 4}, &sse);
  out.Chunk(Chunk(R"({"role": "assistant", "content": ""})"), &sse);
  out.Chunk(Chunk(R"({"reasoning_content": "r"})"), &sse);
  out.Chunk(Chunk(R"({"content": "He"})"), &sse);
  out.Chunk(Chunk(R"({"content": "llo"})"), &sse);
  out.Chunk(
      Chunk(R"({"tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": "{}"}}]})"),
      &sse);
  out.Chunk(Chunk("{}", "tool_calls"), &sse);
  out.End(Usage{.prompt_tokens = 4, .completion_tokens = 6}, "", &sse);
  const std::vector<json> events = Events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    types.push_back(events[i]["type"]);
  }
  EXPECT_EQ(
      types,
      (std::vector<std::string>{
          "response.created", "response.in_progress", "response.output_item.added",
          "response.reasoning_text.delta", "response.reasoning_text.done",
          "response.output_item.done", "response.output_item.added", "response.content_part.added",
          "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
          "response.content_part.done", "response.output_item.done", "response.output_item.added",
          "response.function_call_arguments.delta", "response.function_call_arguments.done",
          "response.output_item.done", "response.completed"}));
  EXPECT_EQ(events[10]["text"], "Hello");
  EXPECT_EQ(events[12]["item"]["content"][0]["text"], "Hello");
  EXPECT_EQ(events[16]["output_index"], 2);
  const json& done = events.back()["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][2]["status"], "completed");
  EXPECT_EQ(done["usage"]["output_tokens"], 6);
}

TEST(OpenAiResponsesTest, EmptyStreamStillAnswersWithAMessage) {
  ResponsesOutput out("served", json::object());
  std::string sse;
  out.Begin(Usage{}, &sse);
  out.Chunk(Chunk("{}", "length"), &sse);
  out.End(Usage{}, "", &sse);
  const std::vector<json> events = Events(sse);
  EXPECT_EQ(events.back()["type"], "response.incomplete");
  EXPECT_EQ(events.back()["response"]["output"][0]["type"], "message");
}

}  // namespace
}  // namespace ember::serve
