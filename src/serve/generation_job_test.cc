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
    served_.token_texts = JsonModeTexts(*tokenizer_, served_.vocab_size);
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

  // Concatenated text of the SSE chunks (choice 0) and the finish reason.
  std::pair<std::string, std::string> RunStream(json body) {
    body["stream"] = true;
    auto job = Start(body);
    std::string sse;
    while (job->PollStream(std::chrono::milliseconds(20), &sse)) {
    }
    std::string text, finish;
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
      json chunk = json::parse(data);
      EXPECT_EQ(chunk["object"], "text_completion");
      for (const json& c : chunk["choices"]) {
        text += c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      }
    }
    EXPECT_TRUE(saw_done);
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
  Prepared prepared = PrepareChat(served_, json::parse(raw), raw);
  ASSERT_TRUE(std::holds_alternative<PreparedRequest>(prepared))
      << std::get<ApiError>(prepared).message;
  const std::string prompt = tokenizer_->Decode(
      std::get<PreparedRequest>(prepared).prompts[0].request.prompt_ids, true);
  EXPECT_LT(prompt.find("type"), prompt.find("function")) << prompt;
  EXPECT_LT(prompt.find("zebra"), prompt.find("apple")) << prompt;
}

}  // namespace
}  // namespace ember::serve
