// TextStream with real tokenizers: streamed text equals Decode() of the ids, a stop string that
// spans several tokens is cut exactly and never leaks, and multibyte characters split across
// byte-level tokens come out whole.
#include "serve/text_stream.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ember::serve
