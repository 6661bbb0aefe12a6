// Request schema: valid requests parse into typed fields; each kind of bad input is a 400 that
// names the field (types, ranges, NaN/inf, unknown fields, unsupported values).
#include "serve/openai_schema.h"

#include <cmath>

#include <gtest/gtest.h>

namespace ember::serve {
namespace {

using nlohmann::json;

SchemaLimits Limits() {
  SchemaLimits l;
  l.vocab_size = 1000;
  l.max_n = 8;
  return l;
}

std::optional<ApiError> Chat(const std::string& body, ChatRequest* out = nullptr) {
  ChatRequest scratch;
  return ParseChatRequest(json::parse(body), Limits(), out ? out : &scratch);
}
std::optional<ApiError> Completion(const std::string& body, CompletionRequest* out = nullptr) {
  CompletionRequest scratch;
  return ParseCompletionRequest(json::parse(body), Limits(), out ? out : &scratch);
}

TEST(OpenAiSchemaTest, ParsesAFullChatRequest) {
  ChatRequest req;
  auto err = Chat(R"({"model":"m","messages":[{"role":"system","content":"be nice"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.1,
      "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,
      "logit_bias":{"5":-100,"7":2.5},"seed":-3,"stop":["x","yy"],"n":2,"stream":true,
      "stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3,"user":"u",
      "metadata":{"k":"v"},"chat_template_kwargs":{"enable_thinking":false},
      "response_format":{"type":"text"},
      "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
      "tool_choice":"auto"})",
                  &req);
  ASSERT_FALSE(err) << err->message;
  const CommonParams& p = req.params;
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FLOAT_EQ(*p.temperature, 0.5f);
  EXPECT_EQ(*p.top_k, 40);
  EXPECT_EQ(p.logit_bias.size(), 2u);
  EXPECT_EQ(*p.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(p.stop, (std::vector<std::string>{"x", "yy"}));
  EXPECT_EQ(p.n, 2);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(p.top_logprobs, 3);
  EXPECT_EQ(req.messages[1]["content"], "a\nb");
  EXPECT_TRUE(req.tools.is_array());
  EXPECT_EQ(req.tool_choice, ToolChoice::kAuto);
  EXPECT_TRUE(req.parallel_tool_calls);
  EXPECT_EQ(req.chat_template_kwargs["enable_thinking"], false);
}

TEST(OpenAiSchemaTest, AResponseMessageCanBeSentBack) {
  ChatRequest req;
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"},
      {"role":"assistant","content":null,"refusal":null,"annotations":[],"function_call":null,
       "audio":null,"reasoning_content":"hmm","tool_calls":[{"id":"call_1","type":"function",
       "function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"42"}]})",
                    &req));
  EXPECT_EQ(req.messages[1]["content"], "");
  EXPECT_EQ(req.messages[1]["reasoning_content"], "hmm");
  EXPECT_FALSE(req.messages[1].contains("refusal"));
  auto err = Chat(R"({"messages":[{"role":"assistant","content":"a","function_call":{"name":"f"}}]})");
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->param, "messages[0].function_call");
}

TEST(OpenAiSchemaTest, ToolChoiceForms) {
  const std::string head = R"({"messages":[{"role":"user","content":"hi"}],
      "tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],)";
  ChatRequest req;
  ASSERT_FALSE(Chat(head + R"("tool_choice":"required","parallel_tool_calls":false})", &req));
  EXPECT_EQ(req.tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(req.parallel_tool_calls);
  ChatRequest named;
  ASSERT_FALSE(Chat(head + R"("tool_choice":{"type":"function","function":{"name":"g"}}})", &named));
  EXPECT_EQ(named.tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(named.tool_choice_name, "g");
  ChatRequest none;
  ASSERT_FALSE(Chat(head + R"("tool_choice":"none"})", &none));
  EXPECT_TRUE(none.tools.is_null());
}

// vLLM's extensions for fixed-length generations (benchmarks), and JSON mode: both endpoints.
// vLLM's cache_salt: kept as given on both endpoints; at most 1024 bytes.
TEST(OpenAiSchemaTest, ParsesCacheSalt) {
  ChatRequest chat;
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],"cache_salt":"t1"})", &chat));
  EXPECT_EQ(chat.params.cache_salt, "t1");
  CompletionRequest completion;
  ASSERT_FALSE(Completion(R"({"prompt":"a"})", &completion));
  EXPECT_EQ(completion.params.cache_salt, "");
  const std::string too_long(1025, 'x');
  auto err = Completion(R"({"prompt":"a","cache_salt":")" + too_long + R"("})", &completion);
  ASSERT_TRUE(err.has_value());
  EXPECT_EQ(err->param, "cache_salt");
}

TEST(OpenAiSchemaTest, ParsesIgnoreEosMinTokensAndJsonMode) {
  ChatRequest chat;
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],"ignore_eos":true,
                       "max_tokens":9,"min_tokens":9})",
                    &chat));
  EXPECT_TRUE(chat.params.ignore_eos);
  EXPECT_TRUE(chat.params.speculative_decoding);  // absent: the server's setting
  EXPECT_EQ(chat.params.min_tokens, 9);
  CompletionRequest completion;
  ASSERT_FALSE(Completion(R"({"prompt":"a","min_tokens":3})", &completion));
  EXPECT_FALSE(completion.params.ignore_eos);
  EXPECT_EQ(completion.params.min_tokens, 3);
  ASSERT_FALSE(Completion(R"({"prompt":"a"})", &completion));
  EXPECT_EQ(completion.params.min_tokens, 0);
  EXPECT_FALSE(completion.params.json_object);
  ASSERT_FALSE(Completion(R"({"prompt":"a","response_format":{"type":"json_object"}})",
                          &completion));
  EXPECT_TRUE(completion.params.json_object);
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],
                       "response_format":{"type":"json_object"}})",
                    &chat));
  EXPECT_TRUE(chat.params.json_object);
}

TEST(OpenAiSchemaTest, TokenIdKeysAreDigitsOnly) {
  EXPECT_EQ(ParseTokenIdKey("0"), 0);
  EXPECT_EQ(ParseTokenIdKey("2147483647"), 2147483647);
  for (const char* bad : {"", "+1", " 1", "1 ", "-1", "1e3", "0x10", "2147483648", "99999999999"})
    EXPECT_FALSE(ParseTokenIdKey(bad).has_value()) << bad;
}

TEST(OpenAiSchemaTest, NullsCountAsAbsent) {
  ChatRequest req;
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],"temperature":null,
                       "stop":null,"logprobs":null})",
                    &req));
  EXPECT_FALSE(req.params.temperature.has_value());
  EXPECT_EQ(req.params.top_logprobs, -1);
}

struct BadCase {
  const char* body;
  const char* param;
};

TEST(OpenAiSchemaTest, ParsesLlamaCppSamplers) {
  ChatRequest req;
  auto err = Chat(R"({"messages":[{"role":"user","content":"hi"}],"top_n_sigma":1.5,
      "typical_p":0.9,"xtc_probability":0.5,"xtc_threshold":0.2,"dry_multiplier":0.8,
      "dry_base":1.5,"dry_allowed_length":3,"dry_penalty_last_n":256,
      "dry_sequence_breakers":["\n","###"]})",
                  &req);
  ASSERT_FALSE(err) << err->message;
  const CommonParams& p = req.params;
  EXPECT_FLOAT_EQ(*p.top_n_sigma, 1.5f);
  EXPECT_FLOAT_EQ(*p.typical_p, 0.9f);
  EXPECT_FLOAT_EQ(*p.xtc_probability, 0.5f);
  EXPECT_FLOAT_EQ(*p.xtc_threshold, 0.2f);
  EXPECT_FLOAT_EQ(*p.dry_multiplier, 0.8f);
  EXPECT_FLOAT_EQ(*p.dry_base, 1.5f);
  EXPECT_EQ(*p.dry_allowed_length, 3);
  EXPECT_EQ(*p.dry_penalty_last_n, 256);
  EXPECT_EQ(*p.dry_sequence_breakers, (std::vector<std::string>{"\n", "###"}));
  ASSERT_FALSE(Completion(R"({"prompt":"x","xtc_probability":1,"dry_multiplier":1})"));
}

TEST(OpenAiSchemaTest, BadLlamaCppSamplerFieldsNameTheField) {
  const BadCase cases[] = {
      {R"({"prompt":"x","xtc_probability":"often"})", "xtc_probability"},
      {R"({"prompt":"x","xtc_probability":2})", "xtc_probability"},
      {R"({"prompt":"x","xtc_threshold":0.7})", "xtc_threshold"},
      {R"({"prompt":"x","temperature":0,"xtc_probability":0.5})", "xtc_probability"},
      {R"({"prompt":"x","typical_p":0})", "typical_p"},
      {R"({"prompt":"x","top_n_sigma":-3})", "top_n_sigma"},
      {R"({"prompt":"x","dry_multiplier":-1})", "dry_multiplier"},
      {R"({"prompt":"x","dry_base":0.5})", "dry_base"},
      {R"({"prompt":"x","dry_allowed_length":0})", "dry_allowed_length"},
      {R"({"prompt":"x","dry_allowed_length":1.5})", "dry_allowed_length"},
      {R"({"prompt":"x","dry_penalty_last_n":-2})", "dry_penalty_last_n"},
      {R"({"prompt":"x","dry_sequence_breakers":"\n"})", "dry_sequence_breakers"},
      {R"({"prompt":"x","dry_sequence_breakers":[1]})", "dry_sequence_breakers[0]"},
      {R"({"prompt":"x","dry_sequence_breakers":[""]})", "dry_sequence_breakers"},
  };
  for (const BadCase& c : cases) {
    auto err = Completion(c.body);
    ASSERT_TRUE(err.has_value()) << c.body;
    EXPECT_EQ(err->param, c.param) << c.body << " -> " << err->message;
  }
}

TEST(OpenAiSchemaTest, BadChatRequestsNameTheField) {
  const BadCase cases[] = {
      {R"({"messages":[{"role":"user","content":"hi"}],"foo":1})", "foo"},
      {R"({"messages":[{"role":"user","content":"hi","bar":1}]})", "messages[0].bar"},
      {R"({"messages":[]})", "messages"},
      {R"({})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[{"role":"robot","content":"hi"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages":[{"role":"user","content":"hi"}],"temperature":"hot"})", "temperature"},
      {R"({"messages":[{"role":"user","content":"hi"}],"temperature":2.5})", "temperature"},
      {R"({"messages":[{"role":"user","content":"hi"}],"top_p":0})", "top_p"},
      {R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1.5})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"hi"}],"n":9})", "n"},
      {R"({"messages":[{"role":"user","content":"hi"}],"stop":[""]})", "stop"},
      {R"({"messages":[{"role":"user","content":"hi"}],"stop":[1]})", "stop[0]"},
      {R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":{"abc":1}})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":{"1000":1}})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":{"1":101}})", "logit_bias"},
      {R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21})",
       "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}})",
       "stream_options"},
      {R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema"},
      {R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"xml"}})",
       "response_format.type"},
      {R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",
          "json_schema":{"name":"x"}}})",
       "response_format.json_schema.schema"},
      {R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",
          "json_schema":{"name":"x","schema":{},"extra":1}}})",
       "response_format.json_schema.extra"},
      {R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object",
          "schema":{}}})",
       "response_format.schema"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":"required"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":"always"})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":3})", "tool_choice"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",
          "function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice.function.name"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",
          "function":{"name":"f"}}],"tool_choice":{"type":"tool","function":{"name":"f"}}})",
       "tool_choice.type"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",
          "function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f",
          "x":1}}})",
       "tool_choice.function.x"},
      {R"({"messages":[{"role":"user","content":"hi"}],"parallel_tool_calls":"no"})",
       "parallel_tool_calls"},
      {R"({"messages":[{"role":"user","content":"hi"}],"seed":18446744073709551615})", "seed"},
      {R"({"messages":[{"role":"user","content":"hi"}],"user":5})", "user"},
      {R"({"messages":[{"role":"user","content":"hi"}],"ignore_eos":1})", "ignore_eos"},
      {R"({"messages":[{"role":"user","content":"hi"}],"speculative_decoding":"off"})",
       "speculative_decoding"},
      {R"({"messages":[{"role":"user","content":"hi"}],"cache_salt":7})", "cache_salt"},
      {R"({"messages":[{"role":"user","content":"hi"}],"cache_salt":""})", "cache_salt"},
      {R"({"messages":[{"role":"user","content":"hi"}],"min_tokens":-1})", "min_tokens"},
      {R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"min_tokens":5})",
       "min_tokens"},
      {R"({"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0})",
       "max_completion_tokens"},
      {R"({"messages":[{"role":"user","content":"hi"}],"echo":true,"max_tokens":0})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"hi"}],"echo":true})", "echo"},
      {R"({"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":21})", "prompt_logprobs"},
      {R"({"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":true})",
       "prompt_logprobs"},
  };
  for (const BadCase& c : cases) {
    auto err = Chat(c.body);
    ASSERT_TRUE(err.has_value()) << c.body;
    EXPECT_EQ(err->http_status, 400);
    EXPECT_EQ(err->param, c.param) << c.body << " -> " << err->message;
    EXPECT_NE(err->message.find(c.param), std::string::npos) << err->message;
    json j = err->ToJson();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
}

// An integer range error states the real bounds: a seed past int64 once read "must be in
// [-9223372036854775808, inf]", which the rejected 18446744073709551615 satisfies.
TEST(OpenAiSchemaTest, IntegerRangeErrorsStateTheBounds) {
  auto err = Chat(R"({"messages":[{"role":"user","content":"hi"}],"seed":18446744073709551615})");
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->message.find("[-9223372036854775808, 9223372036854775807], got "
                              "18446744073709551615"),
            std::string::npos)
      << err->message;
}

TEST(OpenAiSchemaTest, NonFiniteNumbersAreRejected) {
  // JSON text cannot spell NaN/inf (the HTTP layer's parser rejects 1e999 as malformed), but a
  // parsed document can hold them; the schema must still refuse.
  for (double bad : {std::nan(""), HUGE_VAL}) {
    json body = json::parse(R"({"messages":[{"role":"user","content":"hi"}]})");
    body["top_p"] = bad;
    ChatRequest req;
    auto err = ParseChatRequest(body, Limits(), &req);
    ASSERT_TRUE(err.has_value());
    EXPECT_EQ(err->param, "top_p");
  }
}

TEST(OpenAiSchemaTest, CompletionPromptForms) {
  CompletionRequest a, b, c, d;
  ASSERT_FALSE(Completion(R"({"prompt":"Once"})", &a));
  EXPECT_EQ(a.prompts.size(), 1u);
  EXPECT_EQ(a.prompts[0].text, "Once");
  ASSERT_FALSE(Completion(R"({"prompt":["a","b"],"echo":true})", &b));
  EXPECT_EQ(b.prompts.size(), 2u);
  EXPECT_TRUE(b.echo);
  ASSERT_FALSE(Completion(R"({"prompt":[1,2,3],"logprobs":2})", &c));
  EXPECT_TRUE(c.prompts[0].is_token_ids);
  EXPECT_EQ(c.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(c.params.top_logprobs, 2);
  ASSERT_FALSE(Completion(R"({"prompt":[[1],[2,3]]})", &d));
  EXPECT_EQ(d.prompts.size(), 2u);
}

// echo with logprobs covers the prompt; max_tokens 0 only echoes it; prompt_logprobs (vLLM) on
// both endpoints, not with stream.
TEST(OpenAiSchemaTest, PromptLogprobsEchoAndMaxTokensZero) {
  CompletionRequest a, b;
  ASSERT_FALSE(Completion(R"({"prompt":"x","echo":true,"logprobs":1,"max_tokens":0})", &a));
  EXPECT_TRUE(a.echo);
  EXPECT_EQ(a.params.top_logprobs, 1);
  EXPECT_EQ(a.params.max_tokens, 0);
  EXPECT_EQ(a.params.prompt_logprobs, -1);
  ASSERT_FALSE(Completion(R"({"prompt":"x","prompt_logprobs":3,"max_completion_tokens":2})", &b));
  EXPECT_EQ(b.params.prompt_logprobs, 3);
  EXPECT_FALSE(b.echo);
  ChatRequest c;
  ASSERT_FALSE(ParseChatRequest(
      json::parse(R"({"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":0})"), Limits(),
      &c));
  EXPECT_EQ(c.params.prompt_logprobs, 0);
  auto err = Completion(R"({"prompt":"x","max_tokens":0})");
  ASSERT_TRUE(err.has_value());
  EXPECT_NE(err->message.find("0 only on /v1/completions with echo"), std::string::npos)
      << err->message;
}

TEST(OpenAiSchemaTest, BadCompletionRequestsNameTheField) {
  const BadCase cases[] = {
      {R"({})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":[1,5000]})", "prompt"},
      {R"({"prompt":[1,-1]})", "prompt"},
      {R"({"prompt":["a",1]})", "prompt[1]"},
      {R"({"prompt":"x","best_of":2})", "best_of"},
      {R"({"prompt":"x","suffix":"y"})", "suffix"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":0,"echo":false})", "max_tokens"},
      {R"({"prompt":"x","max_completion_tokens":0,"logprobs":1})", "max_completion_tokens"},
      {R"({"prompt":"x","max_tokens":-1,"echo":true})", "max_tokens"},
      {R"({"prompt":"x","echo":1})", "echo"},
      {R"({"prompt":"x","prompt_logprobs":-1})", "prompt_logprobs"},
      {R"({"prompt":"x","prompt_logprobs":21})", "prompt_logprobs"},
      {R"({"prompt":"x","prompt_logprobs":"2"})", "prompt_logprobs"},
      {R"({"prompt":"x","prompt_logprobs":1,"stream":true})", "prompt_logprobs"},
  };
  for (const BadCase& c : cases) {
    auto err = Completion(c.body);
    ASSERT_TRUE(err.has_value()) << c.body;
    EXPECT_EQ(err->param, c.param) << c.body << " -> " << err->message;
  }
}

std::optional<ApiError> BatchLine(const std::string& line, CompletionRequest* out = nullptr) {
  CompletionRequest scratch;
  return ParseCompletionRequest(RequestJson::parse(line), Limits(), out ? out : &scratch,
                                CompletionSource::kBatchLine);
}

// An `ember batch` line is read by the completions schema: each invalid field gives the very
// error (message and param) that the same /v1/completions body gets.
TEST(OpenAiSchemaTest, BatchLinesShareTheCompletionSchema) {
  const char* bad_fields[] = {
      R"("temperature":2.5)",
      R"("temperature":"hot")",
      R"("top_p":0)",
      R"("top_k":-2)",
      R"("min_p":-1)",
      R"("repetition_penalty":11)",
      R"("presence_penalty":3)",
      R"("logit_bias":{"1000":1})",
      R"("logit_bias":{"abc":1})",
      R"("logit_bias":{"1":101})",
      R"("seed":1.5)",
      R"("stop":[""])",
      R"("max_tokens":-1)",
      R"("min_tokens":-1)",
      R"("max_tokens":4,"min_tokens":5)",
      R"("logprobs":21)",
      R"("prompt_logprobs":21)",
      R"("colour":"red")",
      R"("response_format":{"type":"xml"})",
  };
  for (const char* field : bad_fields) {
    const std::string body = std::string(R"({"prompt":"x",)") + field + "}";
    auto server = Completion(body);
    auto batch = BatchLine(body);
    ASSERT_TRUE(server.has_value()) << body;
    ASSERT_TRUE(batch.has_value()) << body;
    EXPECT_EQ(batch->message, server->message);
    EXPECT_EQ(batch->param, server->param);
  }
  CompletionRequest ok;
  ASSERT_FALSE(BatchLine(R"({"prompt":"x","seed":-3,"top_k":40,"ignore_eos":true})", &ok));
  EXPECT_EQ(*ok.params.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(*ok.params.top_k, 40);
  EXPECT_TRUE(ok.params.ignore_eos);
  CompletionRequest spec_off;
  ASSERT_FALSE(BatchLine(R"({"prompt":"x","speculative_decoding":false})", &spec_off));
  EXPECT_FALSE(spec_off.params.speculative_decoding);
}

// What only a batch line has: prompt_ids, one prompt, max_tokens 0 to score the prompt with
// prompt_logprobs, and no field that one output line cannot carry.
TEST(OpenAiSchemaTest, BatchLineForms) {
  CompletionRequest ids, scored;
  ASSERT_FALSE(BatchLine(R"({"prompt_ids":[1,2,3],"max_tokens":4})", &ids));
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_token_ids);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(BatchLine(R"({"prompt_ids":[1,2],"max_tokens":0,"prompt_logprobs":2})", &scored));
  EXPECT_EQ(scored.params.max_tokens, 0);
  EXPECT_EQ(scored.params.prompt_logprobs, 2);
  auto zero = BatchLine(R"({"prompt_ids":[1,2],"max_tokens":0})");
  ASSERT_TRUE(zero.has_value());
  EXPECT_EQ(zero->param, "max_tokens");
  EXPECT_NE(zero->message.find("needs prompt_logprobs"), std::string::npos) << zero->message;
  const BadCase cases[] = {
      {R"({"prompt":"x","prompt_ids":[1]})", "prompt_ids"},
      {R"({"prompt_ids":"x"})", "prompt_ids"},
      {R"({"prompt_ids":[1,5000]})", "prompt_ids"},
      {R"({"prompt_ids":[]})", "prompt_ids"},
      {R"({"prompt":["a","b"]})", "prompt"},
      {R"({})", "prompt"},
      {R"({"prompt":"x","n":2})", "n"},
      {R"({"prompt":"x","echo":true})", "echo"},
      {R"({"prompt":"x","stream":true})", "stream"},
      {R"({"prompt":"x","model":"m"})", "model"},
  };
  for (const BadCase& c : cases) {
    auto err = BatchLine(c.body);
    ASSERT_TRUE(err.has_value()) << c.body;
    EXPECT_EQ(err->param, c.param) << c.body << " -> " << err->message;
    EXPECT_NE(err->message.find(c.param), std::string::npos) << err->message;
  }
  // On /v1/completions prompt_ids is not a field.
  auto http = Completion(R"({"prompt":"x","prompt_ids":[1]})");
  ASSERT_TRUE(http.has_value());
  EXPECT_EQ(http->param, "prompt_ids");
}

}  // namespace
}  // namespace ember::serve

namespace ember::serve {
namespace {

// vLLM's guided_* fields and structured_outputs, llama.cpp's json_schema and grammar: each sets
// one structured-output constraint and names itself; two such fields are a 400 naming them.
TEST(OpenAiSchemaTest, GuidedFieldsSetOneConstraint) {
  CompletionRequest c;
  ASSERT_FALSE(Completion(R"({"prompt":"a","guided_regex":"\\d+"})", &c));
  EXPECT_EQ(c.params.regex, "\\d+");
  EXPECT_EQ(c.params.output_field, "guided_regex");
  c = {};
  ASSERT_FALSE(Completion(R"j({"prompt":"a","guided_choice":["yes","no (maybe)"]})j", &c));
  EXPECT_EQ(c.params.regex, "(?:yes|no \\(maybe\\))");
  c = {};
  ASSERT_FALSE(Completion(R"({"prompt":"a","guided_json":"{\"type\":\"object\"}"})", &c));
  EXPECT_EQ(c.params.json_schema.dump(), R"({"type":"object"})");
  EXPECT_EQ(c.params.output_field, "guided_json");
  c = {};
  ASSERT_FALSE(Completion(R"({"prompt":"a","json_schema":{"type":"object"}})", &c));
  EXPECT_EQ(c.params.output_field, "json_schema");
  ChatRequest chat;
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],
                        "structured_outputs":{"choice":["a","b"]}})", &chat));
  EXPECT_EQ(chat.params.regex, "(?:a|b)");
  EXPECT_EQ(chat.params.output_field, "structured_outputs.choice");
  chat = {};
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"text"},
                        "structured_outputs":{"json":{"type":"object"}}})", &chat));
  EXPECT_EQ(chat.params.output_field, "structured_outputs.json");
  chat = {};
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],
                        "structured_outputs":{"json_object":true}})", &chat));
  EXPECT_TRUE(chat.params.json_object);
  for (const char* field : {"grammar", "guided_grammar"}) {
    c = {};
    ASSERT_FALSE(Completion(std::string(R"({"prompt":"a",")") + field + R"(":"root ::= \"a\""})", &c));
    EXPECT_EQ(c.params.grammar, "root ::= \"a\"");
    EXPECT_EQ(c.params.output_field, field);
  }
  chat = {};
  ASSERT_FALSE(Chat(R"({"messages":[{"role":"user","content":"hi"}],
                        "structured_outputs":{"grammar":"root ::= [0-9]+"}})", &chat));
  EXPECT_EQ(chat.params.grammar, "root ::= [0-9]+");
  EXPECT_EQ(chat.params.output_field, "structured_outputs.grammar");
}

TEST(OpenAiSchemaTest, GuidedFieldErrorsNameTheFields) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt":"a","response_format":{"type":"json_object"},"guided_regex":"a"})",
       "guided_regex: cannot be combined with response_format"},
      {R"({"prompt":"a","guided_json":{"type":"object"},"guided_choice":["a"]})",
       "guided_choice: cannot be combined with guided_json"},
      {R"({"prompt":"a","json_schema":{"type":"object"},"structured_outputs":{"regex":"a"}})",
       "structured_outputs.regex: cannot be combined with json_schema"},
      {R"({"prompt":"a","response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}},
          "json_schema":{}})",
       "json_schema: cannot be combined with response_format"},
      {R"({"prompt":"a","guided_regex":"a","guided_grammar":"root ::= \"a\""})",
       "guided_grammar: cannot be combined with guided_regex"},
      {R"({"prompt":"a","guided_grammar":"root ::= \"a\"","grammar":"root ::= \"a\""})",
       "grammar: cannot be combined with guided_grammar"},
      {R"({"prompt":"a","response_format":{"type":"json_object"},"grammar":"root ::= \"a\""})",
       "grammar: cannot be combined with response_format"},
      {R"({"prompt":"a","grammar":5})", "grammar: expected a string (a GBNF grammar)"},
      {R"({"prompt":"a","structured_outputs":{"grammar":["x"]}})", "structured_outputs.grammar: expected a string"},
      {R"({"prompt":"a","structured_outputs":{"structural_tag":"x"}})",
       "structured_outputs.structural_tag: structural tags are not supported"},
      {R"({"prompt":"a","structured_outputs":{}})", "structured_outputs: give one of"},
      {R"({"prompt":"a","structured_outputs":{"regex":"a","whitespace_pattern":" "}})",
       "Unrecognized request argument supplied: structured_outputs.whitespace_pattern"},
      {R"({"prompt":"a","guided_choice":[]})", "guided_choice: expected a non-empty array"},
      {R"({"prompt":"a","guided_choice":["a",1]})", "guided_choice[1]: expected a string"},
      {R"({"prompt":"a","guided_regex":5})", "guided_regex: expected a string"},
      {R"({"prompt":"a","guided_json":"{not json"})", "guided_json: not a JSON schema"},
      {R"({"prompt":"a","guided_json":[1]})", "guided_json: expected an object"},
      {R"({"prompt":"a","guided_decoding_backend":"xgrammar"})",
       "Unrecognized request argument supplied: guided_decoding_backend"},
  };
  for (const auto& [body, message] : cases) {
    auto err = Completion(body);
    ASSERT_TRUE(err.has_value()) << body;
    EXPECT_EQ(err->message.rfind(message, 0), 0u) << err->message;
  }
}

}  // namespace
}  // namespace ember::serve
