// TextStream with real tokenizers: streamed text equals Decode() of the ids, a stop string that
// spans several tokens is cut exactly and never leaks, multibyte characters split across
// byte-level tokens come out whole, and kept control tokens (Mistral's) reach the tool-call parser.
#include "serve/text_stream.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "serve/tool_calls.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember::serve {
namespace {

std::unique_ptr<Tokenizer> LoadQwen3() {
  auto tok = Tokenizer::Load(testing::TokenizersDir() + "/qwen3");
  EXPECT_TRUE(tok.ok()) << tok.message();
  return tok.ok() ? std::move(*tok) : nullptr;
}

std::string StreamAll(TextStream& ts, const std::vector<int32_t>& ids, bool* stopped) {
  std::string out;
  *stopped = false;
  for (int32_t id : ids) {
    TextDelta d = ts.Push(id);
    out += d.text;
    if (d.stopped) {
      *stopped = true;
      return out;
    }
  }
  return out + ts.Finish();
}

TEST(TextStreamTest, StreamedTextEqualsDecode) {
  EMBER_REQUIRE_DIR(testing::TokenizersDir() + "/qwen3");
  auto tok = LoadQwen3();
  ASSERT_NE(tok, nullptr);
  const std::string text = "Hello, wörld! 猫が好き 🙂 end.";
  std::vector<int32_t> ids = tok->Encode(text, false);
  TextStream ts(*tok, {}, true);
  bool stopped;
  EXPECT_EQ(StreamAll(ts, ids, &stopped), tok->Decode(ids, true));
  EXPECT_FALSE(stopped);
}

TEST(TextStreamTest, StopStringAcrossTokensIsCutAndNeverLeaks) {
  EMBER_REQUIRE_DIR(testing::TokenizersDir() + "/qwen3");
  auto tok = LoadQwen3();
  ASSERT_NE(tok, nullptr);
  const std::string text = "The quick brown fox jumps over the lazy dog";
  std::vector<int32_t> ids = tok->Encode(text, false);
  for (const std::string stop : {"brown fox", "n f", "lazy", "dog", "quick"}) {
    TextStream ts(*tok, {stop}, true);
    std::string seen;
    bool stopped = false;
    for (int32_t id : ids) {
      TextDelta d = ts.Push(id);
      seen += d.text;
      EXPECT_EQ(seen.find(stop), std::string::npos) << "stop string leaked: " << stop;
      if (d.stopped) {
        stopped = true;
        break;
      }
    }
    EXPECT_TRUE(stopped) << stop;
    EXPECT_EQ(seen, text.substr(0, text.find(stop))) << stop;
  }
}

TEST(TextStreamTest, MultibyteCharactersAreNeverSplit) {
  EMBER_REQUIRE_DIR(testing::TokenizersDir() + "/qwen3");
  auto tok = LoadQwen3();
  ASSERT_NE(tok, nullptr);
  const std::string text = "🙂🙃😀 ßüé 漢字かな";
  std::vector<int32_t> ids = tok->Encode(text, false);
  TextStream ts(*tok, {"かな"}, true);
  std::string out;
  for (int32_t id : ids) {
    TextDelta d = ts.Push(id);
    // Every delta must be whole UTF-8: re-encoding and decoding it is lossless.
    EXPECT_EQ(tok->Decode(tok->Encode(d.text, false), true), d.text);
    out += d.text;
    if (d.stopped) break;
  }
  EXPECT_EQ(out, "🙂🙃😀 ßüé 漢字");
}

// Through the server's detokenize path: Qwen3's tokenizer with Mistral's three control tokens
// added as special tokens (ids past its last one); a reply streamed id by id through a TextStream
// that keeps MistralControlTokens() into the parser gives the call and the content, an unkept
// special token stays skipped, and a TextStream that skips every special token drops the tags
// (the text the other formats see).
TEST(TextStreamTest, MistralControlTokensReachTheToolCallParser) {
  const std::string qwen3 = testing::TokenizersDir() + "/qwen3";
  EMBER_REQUIRE_DIR(qwen3);
  auto text = ReadFileToString(qwen3 + "/tokenizer.json");
  ASSERT_TRUE(text.ok()) << text.message();
  nlohmann::json j = nlohmann::json::parse(*text);
  int32_t next = 0;
  for (const auto& [piece, id] : j["model"]["vocab"].items())
    next = std::max(next, id.get<int32_t>() + 1);
  for (const auto& added : j["added_tokens"]) next = std::max(next, added["id"].get<int32_t>() + 1);
  for (std::string_view token : MistralControlTokens())
    j["added_tokens"].push_back({{"id", next++},
                                 {"content", std::string(token)},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ember-mistral-tok-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  auto tok = Tokenizer::Load(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(tok.ok()) << tok.message();
  for (std::string_view token : MistralControlTokens()) {
    const std::optional<int32_t> id = (*tok)->TokenToId(token);
    ASSERT_TRUE(id.has_value()) << token;
    EXPECT_TRUE((*tok)->IsSpecial(*id)) << token;
  }
  std::vector<int32_t> ids =
      (*tok)->Encode("Once upon a time.[TOOL_CALLS]tell_story[ARGS]{\"about\": \"a cat\"}", false);
  const std::optional<int32_t> endoftext = (*tok)->TokenToId("<|endoftext|>");
  ASSERT_TRUE(endoftext.has_value());
  ids.insert(ids.begin() + 2, *endoftext);  // special, not kept: skipped as always
  TextStream kept(**tok, {}, MistralControlTokens());
  ToolCallParser parser(ToolCallFormat::kMistral);
  std::string content;
  std::vector<ToolCall> calls;
  auto take = [&](ToolCallDelta d) {
    content += d.content;
    for (ToolCall& c : d.calls) calls.push_back(std::move(c));
  };
  for (int32_t id : ids) take(parser.Push(kept.Push(id).text));
  take(parser.Push(kept.Finish()));
  take(parser.Finish());
  EXPECT_EQ(content, "Once upon a time.");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "tell_story");
  EXPECT_EQ(calls[0].arguments, "{\"about\":\"a cat\"}");
  TextStream skipping(**tok, {}, /*skip_special_tokens=*/true);
  std::string plain;
  for (int32_t id : ids) plain += skipping.Push(id).text;
  plain += skipping.Finish();
  EXPECT_EQ(plain, "Once upon a time.tell_story{\"about\": \"a cat\"}");
}

}  // namespace
}  // namespace ember::serve
