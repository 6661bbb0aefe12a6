// End-to-end prompt check: our rendered chat, encoded by our tokenizer without adding special
// tokens (as transformers' apply_chat_template(tokenize=True) does), equals the reference ids.
#include <gtest/gtest.h>

#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "template/template_golden.h"

namespace ember {
namespace {

using ojson = nlohmann::ordered_json;

class ChatTemplateIds : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateIds, EncodedPromptMatchesReferenceIds) {
  const std::string name = GetParam();
  testing::TemplateGolden g;
  testing::LoadTemplateGolden(name, &g);
  if (IsSkipped() || HasFatalFailure()) return;
  const std::string& model_dir = g.model_dir;
  const ojson& golden = g.golden;
  auto tmpl = ChatTemplate::Load(model_dir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  auto tokenizer = Tokenizer::Load(model_dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.message();

  int num_checked = 0;
  for (const ojson& c : golden["chat"]) {
    if (c.contains("error") || !c.contains("ids")) continue;
    SCOPED_TRACE(name + "/" + c["name"].get<std::string>());
    auto rendered = tmpl->Render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(),
                                 c.contains("kwargs") ? c["kwargs"] : ojson::object());
    ASSERT_TRUE(rendered.ok()) << rendered.message();
    std::vector<int32_t> ids = (*tokenizer)->Encode(*rendered, /*add_special_tokens=*/false);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    ++num_checked;
  }
  EXPECT_GT(num_checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ChatTemplateIds,
                         ::testing::Values("llama3", "qwen3", "gemma3", "deepseek_v3"));

}  // namespace
}  // namespace ember
