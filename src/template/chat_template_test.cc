// Golden tests: every `chat` case of the six reference tokenizers must render byte-exactly as
// transformers.apply_chat_template did (or fail where the reference failed).
#include "template/chat_template.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "template/template_golden.h"

namespace ember {
namespace {

using ojson = nlohmann::ordered_json;

class ChatTemplateGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateGolden, RendersLikeTransformers) {
  const std::string name = GetParam();
  testing::TemplateGolden g;
  testing::LoadTemplateGolden(name, &g);
  if (IsSkipped() || HasFatalFailure()) return;
  const std::string& model_dir = g.model_dir;
  const ojson& golden = g.golden;

  auto tmpl = ChatTemplate::Load(model_dir);
  ASSERT_TRUE(tmpl.ok()) << tmpl.message();
  const ojson& chats = golden.contains("chat") ? golden["chat"] : ojson::array();
  if (chats.empty()) {
    // The reference had no template to render (llama2, gpt-oss without chat_template.jinja).
    EXPECT_FALSE(tmpl->has_template());
    return;
  }
  ASSERT_TRUE(tmpl->has_template());
  auto token = [&](const char* key) {
    return golden.contains(key) && golden[key].is_string() ? golden[key].get<std::string>() : "";
  };
  EXPECT_EQ(tmpl->bos_token(), token("bos_token"));
  EXPECT_EQ(tmpl->eos_token(), token("eos_token"));

  int num_checked = 0;
  for (const ojson& c : chats) {
    SCOPED_TRACE(name + "/" + c["name"].get<std::string>());
    auto rendered = tmpl->Render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(),
                                 c.contains("kwargs") ? c["kwargs"] : ojson::object());
    if (c.contains("error")) {
      EXPECT_FALSE(rendered.ok()) << "reference failed with " << c["error"] << " but we rendered:\n"
                                  << (rendered.ok() ? *rendered : "");
    } else {
      ASSERT_TRUE(rendered.ok()) << rendered.message();
      EXPECT_EQ(*rendered, c["rendered"].get<std::string>());
    }
    ++num_checked;
  }
  EXPECT_GT(num_checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ChatTemplateGolden,
                         ::testing::Values("llama2", "llama3", "qwen3", "gemma3", "deepseek_v3", "gptoss"));

// Render is const: one parsed template serves many HTTP threads at once.
TEST(ChatTemplate, ConcurrentRendersAgree) {
  auto t = ChatTemplate::FromSource(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ loop.index }}:{{ m.content | trim | upper }}|{% endfor %}{{ ns.n }}{{ tools | tojson }}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.message();
  ojson messages = ojson::array();
  for (int i = 0; i < 20; ++i) messages.push_back({{"role", "user"}, {"content", " m" + std::to_string(i) + " "}});
  ojson tools = ojson::array({{{"name", "f"}, {"b", 1}, {"a", 2}}});
  auto expected = t->Render(messages, tools, true, ojson::object());
  ASSERT_TRUE(expected.ok()) << expected.message();
  EXPECT_NE(expected->find("20:M19|20[{\"name\": \"f\", \"b\": 1, \"a\": 2}]"), std::string::npos) << *expected;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto r = t->Render(messages, tools, true, ojson::object());
        if (!r.ok() || *r != *expected) ++mismatches;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ChatTemplate, ErrorsNameLineAndColumn) {
  auto bad = ChatTemplate::FromSource("hello\n{% if x %}\n{{ 1 + }}\n{% endif %}", "", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("line 3"), std::string::npos) << bad.message();

  auto unclosed = ChatTemplate::FromSource("{% for m in messages %}x", "", "");
  ASSERT_FALSE(unclosed.ok());
  EXPECT_NE(unclosed.message().find("endfor"), std::string::npos) << unclosed.message();

  auto t = ChatTemplate::FromSource("ok\n  {{ raise_exception('bad role: ' + messages[0].role) }}", "", "");
  ASSERT_TRUE(t.ok()) << t.message();
  auto r = t->Render(nlohmann::json::parse(R"([{"role":"robot"}])"), nullptr, true, nlohmann::json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("bad role: robot"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("line 2, column 6"), std::string::npos) << r.message();
}

TEST(ChatTemplate, ToolUseTemplateIsPickedWhenToolsAreGiven) {
  const std::string dir = ::testing::TempDir() + "/ember_chat_template_list";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ojson config = {{"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}},
                  {"eos_token", "</s>"},
                  {"chat_template", ojson::array({{{"name", "default"}, {"template", "D{{ bos_token }}"}},
                                                  {{"name", "tool_use"}, {"template", "T{{ tools|length }}{{ pad_token }}"}}})},
                  {"pad_token", "<pad>"}};
  ASSERT_TRUE(WriteStringToFile(dir + "/tokenizer_config.json", config.dump()).ok());
  auto t = ChatTemplate::Load(dir);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(*t->Render(ojson::array(), nullptr, false, ojson::object()), "D<s>");
  EXPECT_EQ(*t->Render(ojson::array(), ojson::array({1, 2}), false, ojson::object()), "T2<pad>");
  // chat_template.jinja wins over tokenizer_config.json.
  ASSERT_TRUE(WriteStringToFile(dir + "/chat_template.jinja", "J{{ eos_token }}\n").ok());
  auto j = ChatTemplate::Load(dir);
  ASSERT_TRUE(j.ok()) << j.message();
  EXPECT_EQ(*j->Render(ojson::array(), nullptr, false, ojson::object()), "J</s>");
}

// A GGUF file's tokenizer.chat_template and tokenizer.chat_template.tool_use (FromSources): the
// same choice as a folder's named templates; a syntax error names the tool_use template.
TEST(ChatTemplate, FromSourcesPicksToolUseWhenToolsAreGiven) {
  auto t = ChatTemplate::FromSources("D{{ bos_token }}", "T{{ tools|length }}", "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(*t->Render(ojson::array(), nullptr, false, ojson::object()), "D<s>");
  EXPECT_EQ(*t->Render(ojson::array(), ojson::array({1, 2}), false, ojson::object()), "T2");
  EXPECT_EQ(t->tools_source(), "T{{ tools|length }}");
  EXPECT_EQ(t->tool_use_source(), "T{{ tools|length }}");
  auto only_tools = ChatTemplate::FromSources("", "T", "", "");
  ASSERT_TRUE(only_tools.ok()) << only_tools.message();
  EXPECT_FALSE(only_tools->Render(ojson::array(), nullptr, false, ojson::object()).ok());
  auto bad = ChatTemplate::FromSources("D", "{{ 1 + }}", "", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("tool_use"), std::string::npos) << bad.message();
}

TEST(ChatTemplate, ModelWithoutTemplateLoads) {
  const std::string dir = ::testing::TempDir() + "/ember_chat_template_none";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteStringToFile(dir + "/tokenizer_config.json", R"({"eos_token": "</s>"})").ok());
  auto t = ChatTemplate::Load(dir);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_FALSE(t->has_template());
  EXPECT_FALSE(t->Render(nlohmann::json::array(), nullptr, true, nlohmann::json::object()).ok());
}

}  // namespace
}  // namespace ember
