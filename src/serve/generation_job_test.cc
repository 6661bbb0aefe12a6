// GenerationJob + RequestBuilder in-process with the real TinyStories-656K model and engine:
// the non-streaming body and the SSE stream carry the same text, stop strings cut exactly,
// usage adds up, context overflow is a 400 with the numbers, and an abandoned job cancels its
// engine request (the engine frees it).
#include "serve/generation_job.h"

#include <thread>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/testing.h"

namespace ember::serve {
namespace {

using nlohmann::json;

class GenerationJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FixturesDir() + "/models/tinystories-656k";
    if (!testing::DirExists(dir_)) GTEST_SKIP() << "fixture not found: " << dir_;
    auto model = Model::Load(dir_, ModelLoadOptions{});
    ASSERT_TRUE(model.ok()) << model.message();
    model_ = std::move(*model);
    auto tok = Tokenizer::Load(dir_);
    ASSERT_TRUE(tok.ok()) << tok.message();
    tokenizer_ = std::move(*tok);
    EngineConfig config;
    config.max_running = 8;
    auto engine = Engine::Create(model_.get(), config);
    ASSERT_TRUE(engine.ok()) << engine.message();
    engine_ = std::move(*engine);
    served_.name = "tiny";
    served_.tokenizer = tokenizer_.get();
    served_.engine = engine_.get();
    served_.defaults = model_->generation_defaults();
    served_.context_length = engine_->context_length();
    served_.vocab_size = engine_->vocab_size();
    served_.token_texts = VocabularyTexts(*tokenizer_, served_.vocab_size);
  }

  std::unique_ptr<GenerationJob> Start(const json& body) {
    Prepared prepared = PrepareCompletion(served_, body);
    EXPECT_TRUE(std::holds_alternative<PreparedRequest>(prepared))
        << std::get<ApiError>(prepared).message;
    if (!std::holds_alternative<PreparedRequest>(prepared)) return nullptr;
    auto started = GenerationJob::Start(served_, std::get<PreparedRequest>(prepared), &metrics_, 0);
    EXPECT_TRUE(std::holds_alternative<std::unique_ptr<GenerationJob>>(started));
    return std::move(std::get<std::unique_ptr<GenerationJob>>(started));
  }

  json RunToBody(const json& body) {
    auto job = Start(body);
    while (!job->PollUntilDone(std::chrono::milliseconds(20))) {
    }
    auto result = job->Result();
    EXPECT_TRUE(std::holds_alternative<json>(result));
    return std::get<json>(result);
  }

  // The SSE chunks of a streamed request, up to "data: [DONE]".
  std::vector<json> StreamChunks(json body) {
    body["stream"] = true;
    auto job = Start(body);
    std::string sse;
    while (job->PollStream(std::chrono::milliseconds(20), &sse)) {
    }
    std::vector<json> chunks;
    size_t pos = 0;
    bool saw_done = false;
    while ((pos = sse.find("data: ", pos)) != std::string::npos) {
      const size_t end = sse.find("\n\n", pos);
      const std::string data = sse.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") {
        saw_done = true;
        continue;
      }
      chunks.push_back(json::parse(data));
      EXPECT_EQ(chunks.back()["object"], "text_completion");
    }
    EXPECT_TRUE(saw_done);
    return chunks;
  }

  // Concatenated text of the SSE chunks (choice 0) and the finish reason.
  std::pair<std::string, std::string> RunStream(json body) {
    std::string text, finish;
    for (const json& chunk : StreamChunks(std::move(body))) {
      for (const json& c : chunk["choices"]) {
        text += c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      }
    }
    return {text, finish};
  }

  std::string dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  ServedModel served_;
  Metrics metrics_;
};

TEST_F(GenerationJobTest, StreamAndBodyAgreeAndStopStringsCut) {
  const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}};
  json body = RunToBody(request);
  const std::string text = body["choices"][0]["text"];
  ASSERT_GT(text.size(), 20u);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(body["usage"]["total_tokens"].get<int>(),
            6 + body["usage"]["completion_tokens"].get<int>());
  auto [streamed, finish] = RunStream(request);
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(finish, body["choices"][0]["finish_reason"]);

  const std::string stop = text.substr(text.size() / 2, 6);
  json cut_request = request;
  cut_request["stop"] = stop;
  json cut = RunToBody(cut_request);
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  auto [cut_streamed, cut_finish] = RunStream(cut_request);
  EXPECT_EQ(cut_streamed, text.substr(0, text.find(stop)));
  EXPECT_EQ(cut_finish, "stop");
}

// PollChunks (what the API dialects consume) gives PollStream's events unframed, and the job
// names the stop string that ended a sample.
TEST_F(GenerationJobTest, PollChunksAndTheMatchedStopString) {
  const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0},
                        {"stream", true}};
  const auto [streamed, streamed_finish] = RunStream(request);
  auto job = Start(request);
  std::vector<json> chunks;
  while (job->PollChunks(std::chrono::milliseconds(20), &chunks)) {
  }
  std::string text, finish;  // (chunk boundaries follow the polls' timing)
  for (const json& chunk : chunks) {
    EXPECT_EQ(chunk["object"], "text_completion");
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, streamed);
  EXPECT_EQ(finish, streamed_finish);
  EXPECT_FALSE(job->error().has_value());
  EXPECT_EQ(job->stop_string(0), "");  // EOS or length

  const std::string stop = text.substr(text.size() / 2, 6);
  json cut_request = request;
  cut_request["stop"] = json::array({"@@never@@", stop});
  cut_request.erase("stream");
  auto cut = Start(cut_request);
  while (!cut->PollUntilDone(std::chrono::milliseconds(20))) {
  }
  EXPECT_EQ(cut->stop_string(0), stop);
}

TEST_F(GenerationJobTest, ContextOverflowNamesTheNumbers) {
  Prepared prepared = PrepareCompletion(served_, {{"prompt", "Once upon a time"}, {"max_tokens", 600}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(prepared));
  const ApiError& e = std::get<ApiError>(prepared);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("512"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("606"), std::string::npos) << e.message;
  Prepared chat = PrepareChat(served_, {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(chat));
  EXPECT_NE(std::get<ApiError>(chat).message.find("chat template"), std::string::npos);
}

// TinyStories' vocabulary cannot spell `{`: it still serves the structured outputs that need
// none (a regex, a grammar); JSON mode is refused per request, naming the field.
TEST_F(GenerationJobTest, StructuredOutputWithoutBraceTokens) {
  ASSERT_NE(served_.token_texts, nullptr);
  const json regex = {{"prompt", "Once"}, {"max_tokens", 4}, {"guided_regex", "[a-z ]+"}};
  EXPECT_TRUE(std::holds_alternative<PreparedRequest>(PrepareCompletion(served_, regex)));
  const json grammar = {{"prompt", "Once"}, {"max_tokens", 4}, {"grammar", "root ::= [a-z]+"}};
  EXPECT_TRUE(std::holds_alternative<PreparedRequest>(PrepareCompletion(served_, grammar)));
  const json object = {{"prompt", "Once"}, {"response_format", {{"type", "json_object"}}}};
  Prepared refused = PrepareCompletion(served_, object);
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "response_format");
  EXPECT_NE(std::get<ApiError>(refused).message.find("can start"), std::string::npos)
      << std::get<ApiError>(refused).message;
}

TEST_F(GenerationJobTest, DestroyingAnUnfinishedJobCancelsIt) {
  auto job = Start({{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"temperature", 1.0},
                    {"logit_bias", {{"2", -100}}}});
  ASSERT_NE(job, nullptr);
  job->PollUntilDone(std::chrono::milliseconds(50));
  job.reset();
  bool freed = false;
  for (int i = 0; i < 200 && !freed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EngineStats s = engine_->Stats();
    freed = s.requests_cancelled == 1 && s.num_running == 0 && s.kv_blocks_used == 0;
  }
  EXPECT_TRUE(freed);
}

TEST_F(GenerationJobTest, ToolSchemasReachTheTemplateInRequestKeyOrder) {
  auto tmpl = ChatTemplate::FromSource(
      "{% for t in tools %}{{ t | tojson }}{% endfor %}{{ messages[0].content }}", "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  served_.chat_template = &*tmpl;
  const std::string raw =
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"tools":[{"type":"function",)"
      R"("function":{"name":"zeta","parameters":{"zebra":1,"apple":2}}}]})";
  Prepared prepared = PrepareChat(served_, RequestJson::parse(raw));
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(prepared))
      << std::get<ApiError>(prepared).message;
  const std::string prompt = tokenizer_->Decode(
      std::get<PreparedRequest>(prepared).prompts[0].request.prompt_ids, true);
  EXPECT_LT(prompt.find("type"), prompt.find("function")) << prompt;
  EXPECT_LT(prompt.find("zebra"), prompt.find("apple")) << prompt;
}

// The legacy logprobs object's token entries are where their text is in the choice's text.
void ExpectOffsetsLocateTokens(const json& choice) {
  const json& lp = choice["logprobs"];
  const std::string text = choice["text"];
  ASSERT_EQ(lp["tokens"].size(), lp["text_offset"].size());
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    const std::string token = lp["tokens"][i];
    const size_t offset = lp["text_offset"][i];
    EXPECT_EQ(text.substr(offset, token.size()), token) << "token " << i;
  }
}

// echo + logprobs on a token-id prompt: the prompt's tokens lead the logprobs (the first with
// null logprob and alternatives), its values are the engine's prompt logprobs, the generated
// part is what the request gives without echo, and the offsets locate every token in the text.
TEST_F(GenerationJobTest, EchoWithLogprobsCoversThePromptThenTheCompletion) {
  const std::vector<int32_t> ids = {1, 80, 147, 201, 282, 57};
  const json request = {{"prompt", ids}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}};
  json echo_request = request;
  echo_request["echo"] = true;
  const json plain = RunToBody(request)["choices"][0];
  const json body = RunToBody(echo_request);
  const json& choice = body["choices"][0];
  const std::string prompt_text = tokenizer_->Decode(ids, false);
  EXPECT_EQ(choice["text"], prompt_text + plain["text"].get<std::string>());
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + plain["logprobs"]["tokens"].size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  std::string joined;
  for (const json& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, choice["text"]);
  ExpectOffsetsLocateTokens(choice);

  GenerationRequest direct;
  direct.prompt_ids = ids;
  direct.max_tokens = 0;
  direct.prompt_logprobs = 2;
  auto stream = std::get<std::shared_ptr<ResponseStream>>(engine_->Submit(direct));
  std::vector<TokenEvent> events;
  std::vector<PromptLogprob> want;
  while (stream->Next(&events)) {
    for (TokenEvent& e : events)
      if (e.prompt_logprobs) want = *e.prompt_logprobs;
    events.clear();
  }
  ASSERT_EQ(want.size(), ids.size() - 1);
  for (size_t p = 1; p < ids.size(); ++p) {
    EXPECT_EQ(lp["token_logprobs"][p].get<double>(), double(want[p - 1].logprob)) << p;
    ASSERT_EQ(lp["top_logprobs"][p].size(), want[p - 1].top_logprobs.size());
    const std::string best =
        tokenizer_->Decode(std::vector<int32_t>{want[p - 1].top_logprobs[0].token_id}, false);
    EXPECT_EQ(lp["top_logprobs"][p][best].get<double>(),
              double(want[p - 1].top_logprobs[0].logprob));
  }
  const json& generated = plain["logprobs"];
  for (size_t i = 0; i < generated["tokens"].size(); ++i) {
    EXPECT_EQ(lp["tokens"][ids.size() + i], generated["tokens"][i]);
    EXPECT_EQ(lp["token_logprobs"][ids.size() + i], generated["token_logprobs"][i]);
    EXPECT_EQ(lp["top_logprobs"][ids.size() + i], generated["top_logprobs"][i]);
  }

  // Streamed: the first chunk carries the echoed text and every prompt entry; the chunks' entries
  // put together equal the body's.
  const std::vector<json> chunks = StreamChunks(echo_request);
  ASSERT_FALSE(chunks.empty());
  const json& first = chunks[0]["choices"][0];
  EXPECT_EQ(first["text"].get<std::string>().substr(0, prompt_text.size()), prompt_text);
  ASSERT_GE(first["logprobs"]["tokens"].size(), ids.size());
  json streamed = {{"tokens", json::array()},
                   {"token_logprobs", json::array()},
                   {"top_logprobs", json::array()},
                   {"text_offset", json::array()}};
  for (const json& chunk : chunks) {
    const json& c = chunk["choices"][0];
    if (c["logprobs"].is_null()) continue;
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const json& v : c["logprobs"][key]) streamed[key].push_back(v);
  }
  EXPECT_EQ(streamed, lp);
}

// A text prompt: what the tokenizer adds (a BOS, a leading space) is not in the echoed text: those
// tokens sit at offset 0, the others where their text is;
// max_tokens 0 returns the prompt alone with finish_reason "length" and no completion tokens.
// max_tokens 0 without echo is refused naming the field.
TEST_F(GenerationJobTest, EchoWithMaxTokensZeroReturnsThePromptAlone) {
  const json body = RunToBody(
      {{"prompt", "Once upon a time"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}});
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["text"], "Once upon a time");
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 0);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 6);
  // Tokens <|start_story|>, "▁" (the normalizer's prefix), "On", "ce▁", "upon▁a▁tim", "e": the
  // decoded prompt "<|start_story|> Once upon a time" has 16 bytes before the echoed text.
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  EXPECT_EQ(lp["text_offset"], json({0, 0, 0, 2, 5, 15}));
  EXPECT_EQ(lp["tokens"], json({"<|start_story|>", " ", "On", "ce ", "upon a tim", "e"}));
  for (size_t i = 1; i < 6; ++i) EXPECT_LE(lp["token_logprobs"][i], 0.0);
  const json plain = RunToBody({{"prompt", "Once upon a time"}, {"max_tokens", 0}, {"echo", true}});
  EXPECT_EQ(plain["choices"][0]["text"], "Once upon a time");
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
  Prepared refused = PrepareCompletion(served_, {{"prompt", "Once"}, {"max_tokens", 0}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(refused));
  EXPECT_EQ(std::get<ApiError>(refused).param, "max_tokens");
}

// vLLM's prompt_logprobs: on each completions choice, on the chat body; a list with null first,
// then per position the prompt token's {logprob, rank, decoded_token} and the top alternatives,
// keyed by id. Its values are the echo's.
TEST_F(GenerationJobTest, VllmPromptLogprobsOnCompletionsAndChat) {
  const std::vector<int32_t> ids = {1, 80, 147, 201, 282, 57};
  const json body = RunToBody(
      {{"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}, {"prompt_logprobs", 2}, {"n", 2}});
  const json echo = RunToBody({{"prompt", ids},
                               {"max_tokens", 0},
                               {"echo", true},
                               {"logprobs", 2}})["choices"][0]["logprobs"];
  ASSERT_EQ(body["choices"].size(), 2u);
  const json& list = body["choices"][0]["prompt_logprobs"];
  EXPECT_EQ(body["choices"][1]["prompt_logprobs"], list);
  ASSERT_EQ(list.size(), ids.size());
  EXPECT_TRUE(list[0].is_null());
  for (size_t p = 1; p < ids.size(); ++p) {
    const json& position = list[p];
    EXPECT_GE(position.size(), 2u);
    EXPECT_LE(position.size(), 3u);
    const json& own = position[std::to_string(ids[p])];
    EXPECT_EQ(own["logprob"], echo["token_logprobs"][p]);
    EXPECT_EQ(own["decoded_token"], tokenizer_->Decode(std::vector<int32_t>{ids[p]}, false));
    EXPECT_GE(own["rank"].get<int>(), 1);
    int32_t ranks = 0;
    for (const auto& [id, item] : position.items()) ranks += item["rank"].get<int>() <= 2;
    EXPECT_EQ(ranks, 2);
  }
  auto tmpl = ChatTemplate::FromSource("{{ messages[0].content }}", "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  served_.chat_template = &*tmpl;
  Prepared chat = PrepareChat(served_, {{"messages", {{{"role", "user"}, {"content", "Once"}}}},
                                        {"max_tokens", 1},
                                        {"prompt_logprobs", 0}});
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(chat)) << std::get<ApiError>(chat).message;
  const size_t num_prompt = std::get<PreparedRequest>(chat).prompts[0].request.prompt_ids.size();
  auto job = GenerationJob::Start(served_, std::get<PreparedRequest>(chat), &metrics_, 0);
  auto& started = std::get<std::unique_ptr<GenerationJob>>(job);
  while (!started->PollUntilDone(std::chrono::milliseconds(20))) {
  }
  const json chat_body = std::get<json>(started->Result());
  ASSERT_EQ(chat_body["prompt_logprobs"].size(), num_prompt);
  EXPECT_FALSE(chat_body["choices"][0].contains("prompt_logprobs"));
  for (size_t p = 1; p < num_prompt; ++p) EXPECT_EQ(chat_body["prompt_logprobs"][p].size(), 1u);
}

// A server set to harmony whose model writes none (TinyStories): the job's harmony path (a
// TextStream keeping control tokens, a HarmonyParser) loses nothing. Content is exactly the plain
// path's, in the body and in the stream, and there is no reasoning.
TEST_F(GenerationJobTest, HarmonyPathLosesNothingOfPlainOutput) {
  auto tmpl = ChatTemplate::FromSource("{{ messages[0].content }}", "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  served_.chat_template = &*tmpl;
  const json body = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                     {"max_tokens", 24},
                     {"temperature", 0}};
  auto run = [&](json b, std::string* streamed) {
    Prepared prepared = PrepareChat(served_, b);
    EXPECT_TRUE(std::holds_alternative<PreparedRequest>(prepared));
    auto started = GenerationJob::Start(served_, std::get<PreparedRequest>(prepared), &metrics_, 0);
    auto& job = std::get<std::unique_ptr<GenerationJob>>(started);
    if (b.value("stream", false)) {
      std::string sse;
      while (job->PollStream(std::chrono::milliseconds(20), &sse)) {
      }
      for (size_t pos = 0; (pos = sse.find("data: {", pos)) != std::string::npos;) {
        const size_t end = sse.find("\n\n", pos);
        const json chunk = json::parse(sse.substr(pos + 6, end - pos - 6));
        pos = end;
        for (const json& c : chunk["choices"]) {
          EXPECT_FALSE(c["delta"].contains("reasoning_content"));
          if (c["delta"].contains("content") && c["delta"]["content"].is_string())
            *streamed += c["delta"]["content"].get<std::string>();
        }
      }
      return json();
    }
    while (!job->PollUntilDone(std::chrono::milliseconds(20))) {
    }
    return std::get<json>(job->Result())["choices"][0]["message"];
  };
  const json plain = run(body, nullptr);
  ASSERT_TRUE(plain["content"].is_string());
  ASSERT_FALSE(plain["content"].get<std::string>().empty());
  served_.reasoning_format = ReasoningFormat::kHarmony;
  served_.tool_format = ToolCallFormat::kHarmony;
  const json harmony = run(body, nullptr);
  EXPECT_EQ(harmony["content"], plain["content"]);
  EXPECT_FALSE(harmony.contains("reasoning_content"));
  json stream_body = body;
  stream_body["stream"] = true;
  std::string streamed;
  run(stream_body, &streamed);
  EXPECT_EQ(streamed, plain["content"].get<std::string>());
}

}  // namespace
}  // namespace ember::serve
