// generation_config.json parsing: int-or-list eos ids, sampling defaults, errors naming the file
// and field, and the real fixture files.
#include "sampling/generation_config.h"

#include <gtest/gtest.h>

#include "util/testing.h"

namespace ember {
namespace {

TEST(GenerationConfigTest, EosIdMayBeIntOrList) {
  auto single = ParseGenerationConfig(R"({"eos_token_id": 2, "bos_token_id": 1})", "g.json");
  ASSERT_TRUE(single.ok()) << single.message();
  EXPECT_EQ(single->eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(single->bos_token_id, 1);
  auto list =
      ParseGenerationConfig(R"({"eos_token_id": [128001, 128008, 128009, 128001]})", "g.json");
  ASSERT_TRUE(list.ok()) << list.message();
  EXPECT_EQ(list->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  auto none = ParseGenerationConfig(R"({"eos_token_id": null})", "g.json");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->eos_token_ids.empty());
}

TEST(GenerationConfigTest, SamplingDefaultsOverrideOnlyWhatIsSet) {
  auto config = ParseGenerationConfig(
      R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 512,
          "do_sample": true})",
      "g.json");
  ASSERT_TRUE(config.ok()) << config.message();
  const SamplingParams params = DefaultSamplingParams(*config);
  EXPECT_FLOAT_EQ(params.temperature, 0.6f);
  EXPECT_FLOAT_EQ(params.top_p, 0.95f);
  EXPECT_EQ(params.top_k, 20);
  EXPECT_EQ(params.max_tokens, 512);
  EXPECT_FLOAT_EQ(params.min_p, 0.0f);
  EXPECT_FLOAT_EQ(params.repetition_penalty, 1.0f);
}

TEST(GenerationConfigTest, ErrorsNameFileAndField) {
  EXPECT_EQ(ParseGenerationConfig(R"({"eos_token_id": "x"})", "m/g.json").message(),
            "m/g.json: eos_token_id: expected a token id or a list of token ids, got \"x\"");
  EXPECT_EQ(ParseGenerationConfig(R"({"top_k": 1.5})", "m/g.json").message(),
            "m/g.json: top_k: expected an integer, got 1.5");
  EXPECT_EQ(ParseGenerationConfig("{", "m/g.json").message(), "m/g.json: not valid JSON");
  EXPECT_EQ(ParseGenerationConfig("[]", "m/g.json").message(), "m/g.json: expected a JSON object");
}

TEST(GenerationConfigTest, MissingFileIsAnEmptyConfig) {
  auto config = LoadGenerationConfig("/nonexistent/generation_config.json");
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->eos_token_ids.empty());
  EXPECT_FALSE(config->temperature.has_value());
}

TEST(GenerationConfigTest, EosIdsMergeWithTokenizer) {
  GenerationConfig config;
  config.eos_token_ids = {9, 2};
  const std::vector<int32_t> tokenizer = {2, 5};
  EXPECT_EQ(EosTokenIds(config, tokenizer), (std::vector<int32_t>{2, 5, 9}));
}

TEST(GenerationConfigTest, LoadsFixtureFiles) {
  const std::string models = ember::testing::FixturesDir() + "/models";
  EMBER_REQUIRE_DIR(models);
  auto tiny = LoadGenerationConfig(models + "/tinystories-656k/generation_config.json");
  ASSERT_TRUE(tiny.ok()) << tiny.message();
  EXPECT_EQ(tiny->eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(tiny->bos_token_id, 1);
  EXPECT_FALSE(tiny->temperature.has_value());
  auto llama = LoadGenerationConfig(models + "/llama3/generation_config.json");
  ASSERT_TRUE(llama.ok()) << llama.message();
  const SamplingParams params = DefaultSamplingParams(*llama);
  EXPECT_FLOAT_EQ(params.temperature, 0.7f);
  EXPECT_FLOAT_EQ(params.top_p, 0.9f);
  EXPECT_EQ(params.top_k, 40);
  EXPECT_TRUE(params.Validate(100).ok());
}

}  // namespace
}  // namespace ember
