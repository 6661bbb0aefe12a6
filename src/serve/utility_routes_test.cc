// The utility routes and /v1/embeddings in-process with the real TinyStories-656K tokenizer,
// model and engine: /tokenize under llama.cpp's and vLLM's field names (special tokens added or
// not, parse_special, pieces, token strings), /detokenize with and without special tokens, every
// bad field a 400 naming it; PrepareEmbeddings' validation, OpenAI's base64 encoding, and a whole
// embeddings request through its AsyncResponse.
#include "serve/utility_routes.h"

#include <chrono>
#include <cmath>
#include <thread>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "serve/embeddings.h"
#include "tokenizer/tokenizer.h"
#include "util/testing.h"
#include "util/version.h"

namespace ember::serve {
namespace {

using nlohmann::json;
constexpr int32_t kBos = 1;  // <|start_story|>

class UtilityRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::FixturesDir() + "/models/tinystories-656k";
    if (!testing::DirExists(dir)) GTEST_SKIP() << "fixture not found: " << dir;
    auto model = Model::Load(dir, ModelLoadOptions{});
    ASSERT_TRUE(model.ok()) << model.message();
    model_ = std::move(*model);
    auto tok = Tokenizer::Load(dir);
    ASSERT_TRUE(tok.ok()) << tok.message();
    tokenizer_ = std::move(*tok);
    auto engine = Engine::Create(model_.get(), EngineConfig{});
    ASSERT_TRUE(engine.ok()) << engine.message();
    engine_ = std::move(*engine);
    served_.name = "tiny";
    served_.tokenizer = tokenizer_.get();
    served_.engine = engine_.get();
    served_.context_length = engine_->context_length();
    served_.vocab_size = engine_->vocab_size();
    served_.embeddings.available = true;
    served_.embeddings.pooling = {PoolingKind::kLastToken, true};
  }

  json Ok(std::variant<json, ApiError> r) {
    if (auto* e = std::get_if<ApiError>(&r)) {
      ADD_FAILURE() << e->message;
      return json();
    }
    return std::get<json>(r);
  }
  // The 4xx's param (or "(ok)").
  static std::string Param(const std::variant<json, ApiError>& r) {
    const auto* e = std::get_if<ApiError>(&r);
    return e == nullptr ? "(ok)" : e->param;
  }
  std::string EmbedParam(const json& body) {
    auto r = PrepareEmbeddings(served_, RequestJson(body));
    const auto* e = std::get_if<ApiError>(&r);
    return e == nullptr ? "(ok)" : e->param;
  }

  // One /v1/embeddings request through its AsyncResponse, polled to the end; the 200 body.
  static json RunEmbeddings(const ServedModel& served, const json& body) {
    HttpRequest req;
    req.method = "POST";
    req.path = "/v1/embeddings";
    req.body = body.dump();
    Handled handled = HandleUtilityRoute(served, req, false);
    EXPECT_NE(handled.async, nullptr) << handled.response.body;
    if (handled.async == nullptr) return json();
    handled.async->Start([] {});
    std::string ignored;
    while (handled.async->Poll(&ignored)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    HttpResponse res = handled.async->Final();
    EXPECT_EQ(res.status, 200) << res.body;
    return json::parse(res.body);
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  ServedModel served_;
};

TEST_F(UtilityRoutesTest, TokenizeUnderBothServersFieldNames) {
  const std::vector<int32_t> plain = tokenizer_->Encode("Once upon a time", false);
  // llama.cpp: content, no special tokens unless add_special.
  json r = Ok(Tokenize(served_, RequestJson{{"content", "Once upon a time"}}));
  EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(), plain);
  EXPECT_EQ(r["count"], plain.size());
  EXPECT_EQ(r["max_model_len"], served_.context_length);
  r = Ok(Tokenize(served_, RequestJson{{"content", "Once upon a time"}, {"add_special", true}}));
  EXPECT_EQ(r["tokens"][0], kBos);
  // vLLM: prompt adds them unless add_special_tokens is false.
  r = Ok(Tokenize(served_, RequestJson{{"prompt", "Once upon a time"}, {"model", "tiny"}}));
  EXPECT_EQ(r["tokens"][0], kBos);
  EXPECT_EQ(r["count"], plain.size() + 1);
  r = Ok(Tokenize(served_, RequestJson{{"prompt", "Once upon a time"},
                                       {"add_special_tokens", false},
                                       {"return_token_strs", true}}));
  EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(), plain);
  ASSERT_EQ(r["token_strs"].size(), plain.size());
  EXPECT_EQ(r["token_strs"][0], tokenizer_->IdToToken(plain[0]));
  // parse_special false: special-token text is ordinary text.
  r = Ok(Tokenize(served_, RequestJson{{"content", "<|start_story|>Once"}}));
  EXPECT_EQ(r["tokens"][0], kBos);
  r = Ok(
      Tokenize(served_, RequestJson{{"content", "<|start_story|>Once"}, {"parse_special", false}}));
  EXPECT_NE(r["tokens"][0], kBos);
  // with_pieces: {id, piece}; the pieces spell the text (SentencePiece's leading space too).
  r = Ok(Tokenize(served_, RequestJson{{"content", "Once upon"}, {"with_pieces", true}}));
  std::string spelled;
  std::vector<int32_t> piece_ids;
  for (const json& t : r["tokens"]) {
    spelled += t["piece"].get<std::string>();
    piece_ids.push_back(t["id"].get<int32_t>());
  }
  EXPECT_EQ(piece_ids, tokenizer_->Encode("Once upon", false));
  EXPECT_EQ(spelled, " Once upon");
}

TEST_F(UtilityRoutesTest, TokenizeRefusesBadFieldsNamingThem) {
  EXPECT_EQ(Param(Tokenize(served_, RequestJson{{"content", "a"}, {"bogus", 1}})), "bogus");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson{{"content", 3}})), "content");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson{{"content", "a"}, {"prompt", "b"}})), "content");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson::object())), "messages");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson{{"content", "a"}, {"add_special", "yes"}})),
            "add_special");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson{{"content", "a"},
                                                {"add_special", true},
                                                {"add_special_tokens", true}})),
            "add_special_tokens");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson{{"content", "a"}, {"tools", json::array()}})),
            "tools");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson{{"content", "a"}, {"model", "other"}})), "model");
  // No chat template: the chat form is refused naming messages.
  EXPECT_EQ(
      Param(Tokenize(served_, RequestJson{{"messages",
                                           json::array({{{"role", "user"}, {"content", "hi"}}})}})),
      "messages");
  EXPECT_EQ(Param(Tokenize(served_, RequestJson(json::array()))), "");
}

TEST_F(UtilityRoutesTest, DetokenizeWithAndWithoutSpecialTokens) {
  std::vector<int32_t> ids = tokenizer_->Encode("Once upon a time", true);
  ASSERT_EQ(ids[0], kBos);
  json r = Ok(Detokenize(served_, RequestJson{{"tokens", ids}}));
  EXPECT_EQ(r["content"], tokenizer_->Decode(ids, false));
  EXPECT_EQ(r["prompt"], r["content"]);
  EXPECT_NE(r["content"].get<std::string>().find("<|start_story|>"), std::string::npos);
  // TinyStories' special tokens are normalized ones, which the reference does not skip (see
  // tokenizer.cc); the skipping itself is checked with qwen3's tokenizer below.
  r = Ok(Detokenize(served_, RequestJson{{"tokens", ids}, {"skip_special_tokens", true}}));
  EXPECT_EQ(r["content"], tokenizer_->Decode(ids, true));
  EXPECT_EQ(Param(Detokenize(served_, RequestJson{{"tokens", {1, -4}}})), "tokens");
  EXPECT_EQ(Param(Detokenize(served_, RequestJson{{"tokens", {1, 1 << 30}}})), "tokens");
  EXPECT_EQ(Param(Detokenize(served_, RequestJson{{"tokens", {1, "x"}}})), "tokens");
  EXPECT_EQ(Param(Detokenize(served_, RequestJson{{"tokens", "1 2"}})), "tokens");
  EXPECT_EQ(Param(Detokenize(served_, RequestJson::object())), "tokens");
  EXPECT_EQ(Param(Detokenize(served_, RequestJson{{"tokens", {1}}, {"skip_special_tokens", 1}})),
            "skip_special_tokens");
}

TEST(UtilityRoutesQwen3Test, DetokenizeSkipsSpecialTokensWhenAsked) {
  const std::string dir = testing::TokenizersDir() + "/qwen3";
  if (!testing::DirExists(dir)) GTEST_SKIP() << "tokenizer not found: " << dir;
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.message();
  ServedModel served;
  served.name = "qwen3";
  served.tokenizer = tokenizer->get();
  served.vocab_size = (*tokenizer)->vocab_size();
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text, false);
  auto kept = Detokenize(served, RequestJson{{"tokens", ids}});
  ASSERT_TRUE(std::holds_alternative<json>(kept));
  EXPECT_EQ(std::get<json>(kept)["content"], text);
  auto skipped = Detokenize(served, RequestJson{{"tokens", ids}, {"skip_special_tokens", true}});
  ASSERT_TRUE(std::holds_alternative<json>(skipped));
  EXPECT_EQ(std::get<json>(skipped)["content"], "user\nhi");
}

TEST_F(UtilityRoutesTest, EmbeddingsRefuseBadFieldsNamingThem) {
  EXPECT_EQ(EmbedParam({{"input", "hello"}}), "(ok)");
  EXPECT_EQ(EmbedParam({{"input", {"a", "b"}},
                        {"encoding_format", "base64"},
                        {"user", "u"},
                        {"dimensions", 8},
                        {"model", "tiny"}}),
            "(ok)");
  EXPECT_EQ(EmbedParam({{"input", {5, 6, 7}}}), "(ok)");
  EXPECT_EQ(EmbedParam({{"input", {{5, 6}, {7}}}}), "(ok)");
  EXPECT_EQ(EmbedParam(json::object()), "input");
  EXPECT_EQ(EmbedParam({{"input", ""}}), "input");
  EXPECT_EQ(EmbedParam({{"input", json::array()}}), "input");
  EXPECT_EQ(EmbedParam({{"input", {"a", 5}}}), "input");
  EXPECT_EQ(EmbedParam({{"input", {{5}, "a"}}}), "input");
  EXPECT_EQ(EmbedParam({{"input", {5, 1 << 20}}}), "input");
  EXPECT_EQ(EmbedParam({{"input", {json::array()}}}), "input");
  EXPECT_EQ(EmbedParam({{"input", 5}}), "input");
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"encoding_format", "hex"}}), "encoding_format");
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"dimensions", 0}}), "dimensions");
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"dimensions", 1 << 20}}), "dimensions");
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"dimensions", 2.5}}), "dimensions");
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"user", 1}}), "user");
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"model", "other"}}), "model");
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"max_tokens", 1}}), "max_tokens");
  // An input longer than the served context is named by its index.
  auto r = PrepareEmbeddings(
      served_,
      RequestJson{
          {"input", {json::array({5}), std::vector<int32_t>(served_.context_length + 1, 5)}}});
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "input");
  EXPECT_NE(std::get<ApiError>(r).message.find("input[1]"), std::string::npos);
  // dimensions only where the model's embeddings are normalized.
  served_.embeddings.pooling.normalize = false;
  EXPECT_EQ(EmbedParam({{"input", "a"}, {"dimensions", 8}}), "dimensions");
  served_.embeddings.available = false;
  served_.embeddings.unavailable_reason = "because";
  EXPECT_EQ(EmbedParam({{"input", "a"}}), "model");
}

TEST_F(UtilityRoutesTest, Base64IsLittleEndianFloat32) {
  EXPECT_EQ(Base64Floats(std::vector<float>{1.0f}), "AACAPw==");             // 00 00 80 3f
  EXPECT_EQ(Base64Floats(std::vector<float>{1.0f, -2.0f}), "AACAPwAAAMA=");  // + 00 00 00 c0
  EXPECT_EQ(Base64Floats(std::vector<float>{}), "");
}

// The whole route through its AsyncResponse: one pooled unit vector per input, in order, the
// same for an input given as text or as its token ids; dimensions truncates and re-normalizes.
TEST_F(UtilityRoutesTest, EmbeddingsRequestEndToEnd) {
  const auto run = [&](const json& body) { return RunEmbeddings(served_, body); };
  const std::vector<int32_t> ids = tokenizer_->Encode("Once upon a time", true);
  json r = run({{"input", {"Once upon a time", "The end"}}});
  ASSERT_EQ(r["data"].size(), 2u);
  EXPECT_EQ(r["data"][1]["index"], 1);
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size() + tokenizer_->Encode("The end", true).size());
  const std::vector<float> text_vec = r["data"][0]["embedding"].get<std::vector<float>>();
  EXPECT_EQ(static_cast<int32_t>(text_vec.size()), model_->config().hidden_size);
  double sq = 0;
  for (float x : text_vec) sq += x * x;
  EXPECT_NEAR(sq, 1.0, 1e-5);
  json by_ids = run({{"input", ids}});
  EXPECT_EQ(by_ids["data"][0]["embedding"].get<std::vector<float>>(), text_vec);
  json cut = run({{"input", ids}, {"dimensions", 8}, {"encoding_format", "base64"}});
  EXPECT_EQ(cut["data"][0]["embedding"], Base64Floats(TruncateEmbedding(text_vec, 8)));
  HttpRequest version;
  version.method = "GET";
  version.path = "/version";
  EXPECT_EQ(json::parse(HandleUtilityRoute(served_, version, false).response.body)["version"],
            kEmberVersion);
}

// A request of more inputs than the engine's queue holds (--max-queue 3 here) is submitted as
// its own inputs finish, not refused: every vector equals the one the input gets alone.
TEST_F(UtilityRoutesTest, EmbeddingsLargerThanTheQueue) {
  auto model = Model::Load(testing::FixturesDir() + "/models/tinystories-656k", ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  EngineConfig config;
  config.max_queue = 3;
  auto engine = Engine::Create(model->get(), config);
  ASSERT_TRUE(engine.ok()) << engine.message();
  ServedModel served = served_;
  served.engine = engine->get();
  const auto run = [&](const std::vector<std::vector<int32_t>>& inputs) {
    return RunEmbeddings(served, json{{"input", inputs}});
  };
  std::vector<std::vector<int32_t>> inputs;
  for (int32_t i = 0; i < 40; ++i) inputs.push_back({kBos, 10 + i, 20 + i % 7, 30});
  const json all = run(inputs);
  ASSERT_EQ(all["data"].size(), inputs.size());
  for (size_t i : {size_t{0}, size_t{17}, size_t{39}}) {
    EXPECT_EQ(all["data"][i]["index"], i);
    EXPECT_EQ(all["data"][i]["embedding"], run({inputs[i]})["data"][0]["embedding"]) << i;
  }
}

// A client that goes away: destroying the response before the vectors arrive cancels every input
// still running, and the engine ends them (nothing is left running or queued).
TEST_F(UtilityRoutesTest, AbandonedEmbeddingsAreCancelled) {
  HttpRequest req;
  req.method = "POST";
  req.path = "/v1/embeddings";
  std::vector<std::vector<int32_t>> inputs(64, std::vector<int32_t>(400, 5));
  req.body = json{{"input", inputs}}.dump();
  Handled handled = HandleUtilityRoute(served_, req, false);
  ASSERT_NE(handled.async, nullptr) << handled.response.body;
  handled.async.reset();  // the client is gone
  bool drained = false;
  for (int i = 0; i < 2000 && !drained; ++i) {
    const EngineStats stats = engine_->Stats();
    drained = stats.requests_finished + stats.requests_cancelled >= 64 && stats.num_running == 0 &&
              stats.num_queued == 0;
    if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(drained);
  EXPECT_GT(engine_->Stats().requests_cancelled, 0);
}

}  // namespace
}  // namespace ember::serve
