// GgufFileChatTemplate: a GGUF file's templates with its own bos/eos token strings, none when the
// file has no template, and an error naming the key when the template does not parse.
#include "serve/gguf_chat_template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/gguf_test_util.h"

namespace ember {
namespace {

using ojson = nlohmann::ordered_json;

testing::GgufBuilder VocabMetadata() {
  testing::GgufBuilder b;
  b.String("general.architecture", "llama");
  b.String("tokenizer.ggml.model", "llama");
  b.StringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  b.Array("tokenizer.ggml.scores", GgufValueType::kFloat32, std::vector<float>{0, 0, 0, 0});
  b.Scalar("tokenizer.ggml.bos_token_id", GgufValueType::kUint32, uint32_t{1});
  b.Scalar("tokenizer.ggml.eos_token_id", GgufValueType::kUint32, uint32_t{2});
  return b;
}

Result<ChatTemplate> TemplateOf(const testing::GgufBuilder& b) {
  const std::vector<uint8_t> bytes = b.Build();
  auto file = GgufFile::Parse(bytes, "t.gguf");
  if (!file.ok()) return file.status();
  return GgufFileChatTemplate(*file);
}

TEST(GgufFileChatTemplate, NoTemplateIsNoneWithoutError) {
  auto t = TemplateOf(VocabMetadata());
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_FALSE(t->has_template());
}

TEST(GgufFileChatTemplate, RendersWithTheFilesTokensAndPicksToolUse) {
  testing::GgufBuilder b = VocabMetadata();
  b.String("tokenizer.chat_template", "{{ bos_token }}D{{ eos_token }}");
  b.String("tokenizer.chat_template.tool_use", "T{{ tools|length }}");
  auto t = TemplateOf(b);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(*t->Render(ojson::array(), nullptr, false, ojson::object()), "<s>D</s>");
  EXPECT_EQ(*t->Render(ojson::array(), ojson::array({1, 2, 3}), false, ojson::object()), "T3");
}

TEST(GgufFileChatTemplate, ABrokenTemplateNamesTheKey) {
  testing::GgufBuilder b = VocabMetadata();
  b.String("tokenizer.chat_template", "{{ 1 + }}");
  auto t = TemplateOf(b);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tokenizer.chat_template"), std::string::npos) << t.message();
}

}  // namespace
}  // namespace ember
