// ReadEmbeddingSupport on hand-made model folders: the decoder default without modules.json, each
// sentence-transformers pooling mode, Normalize, and the layouts it refuses (with the reason).
#include "serve/embedding_config.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace ember::serve {
namespace {

namespace fs = std::filesystem;

class EmbeddingConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ember-embcfg-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  // modules.json of Transformer, Pooling (in 1_Pooling) and optionally Normalize.
  void WriteModules(bool normalize, const std::string& extra_module = "") {
    std::string modules =
        R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},)"
        R"({"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"})";
    if (normalize)
      modules +=
          R"(,{"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"})";
    modules += extra_module + "]";
    Write("modules.json", modules);
  }
  EmbeddingSupport Read() const { return ReadEmbeddingSupport(dir_.string()); }

  fs::path dir_;
};

TEST_F(EmbeddingConfigTest, DecoderDefaultIsLastTokenNormalized) {
  const EmbeddingSupport s = Read();
  EXPECT_TRUE(s.available);
  EXPECT_EQ(s.pooling.kind, PoolingKind::kLastToken);
  EXPECT_TRUE(s.pooling.normalize);
}

TEST_F(EmbeddingConfigTest, EachPoolingModeAndNormalize) {
  const std::pair<const char*, PoolingKind> modes[] = {
      {"pooling_mode_lasttoken", PoolingKind::kLastToken},
      {"pooling_mode_mean_tokens", PoolingKind::kMean},
      {"pooling_mode_cls_token", PoolingKind::kCls}};
  for (const auto& [key, kind] : modes) {
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(std::string(key) + (normalize ? " + Normalize" : ""));
      WriteModules(normalize);
      Write("1_Pooling/config.json", std::string(R"({"word_embedding_dimension": 64, ")") + key +
                                         R"(": true, "pooling_mode_max_tokens": false})");
      const EmbeddingSupport s = Read();
      ASSERT_TRUE(s.available) << s.unavailable_reason;
      EXPECT_EQ(s.pooling.kind, kind);
      EXPECT_EQ(s.pooling.normalize, normalize);
    }
  }
}

TEST_F(EmbeddingConfigTest, RefusesWhatItCannotRunNamingIt) {
  WriteModules(true);
  Write("1_Pooling/config.json", R"({"pooling_mode_max_tokens": true})");
  EmbeddingSupport s = Read();
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.unavailable_reason.find("pooling_mode_max_tokens"), std::string::npos);

  Write("1_Pooling/config.json",
        R"({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true})");
  s = Read();
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.unavailable_reason.find("exactly one"), std::string::npos);

  Write("1_Pooling/config.json", R"({"pooling_mode_mean_tokens": true})");
  WriteModules(
      true,
      R"(,{"idx":3,"name":"3","path":"3_Dense","type":"sentence_transformers.models.Dense"})");
  s = Read();
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.unavailable_reason.find("sentence_transformers.models.Dense"), std::string::npos);

  Write("modules.json", "{not json");
  s = Read();
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.unavailable_reason.find("modules.json"), std::string::npos);

  Write("modules.json",
        R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"}])");
  s = Read();
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.unavailable_reason.find("no Pooling module"), std::string::npos);
}

}  // namespace
}  // namespace ember::serve
