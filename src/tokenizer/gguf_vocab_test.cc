// Tokenizer::FromGgufVocab against the tokenizer.json path: a GgufVocab is built from a real
// tokenizer folder by GgufVocabFromTokenizerDir (what `ember quantize` writes: vocab, merges,
// added tokens; "llama" scores from the merge ranks, which is how a BPE-trained SentencePiece vocab
// orders its pieces; the model, pre-tokenizer and space prefix detected) and must encode the
// Hugging Face goldens and many random strings to the same ids, and decode them to the same text. The GGUF files' own
// vocabularies are checked in model/gguf_model_test.cc.
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/gguf_vocab_export.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/tokenizer.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

using nlohmann::json;

// Random strings from a pool of ASCII, spaces, newlines, accents, CJK, emoji and byte soup.
std::vector<std::string> RandomStrings(int count, uint32_t seed) {
  static const std::vector<std::string> kPieces = {
      "a",    "e",        "the",   " ",    "  ",        "\n",          "\n\n", "\t",
      "Once", " upon",    "Lily",  "'s",   "'ll",       "!",           ",",    ".",
      "?",    "123",      "4567",  "é",    "ü",         "中文",        "日本", "👍",
      "🇫🇷",   "\xC2\xA0", "-",     "(",    ")",         "\"",          "x",    "Z",
      "ing",  " dog",     "  cat", "\r\n", "e\xCC\x81", "\xE2\x80\x89"};
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    const int len = int(rng() % 12);
    for (int k = 0; k < len; ++k) s += kPieces[rng() % kPieces.size()];
    out.push_back(std::move(s));
  }
  return out;
}

struct Case {
  std::string name, model, pre, golden;
  bool add_space_prefix = true;  // "llama" vocabularies
};

class GgufVocabTest : public ::testing::TestWithParam<Case> {};

TEST_P(GgufVocabTest, EncodesAndDecodesLikeTheTokenizerJson) {
  const Case& c = GetParam();
  const std::string dir = c.name == "tinystories-656k"
                              ? testing::FixturesDir() + "/models/tinystories-656k"
                              : testing::TokenizersDir() + "/" + c.name;
  EMBER_REQUIRE_DIR(dir);
  const std::string golden_path =
      testing::FixturesDir() + "/tokenizers/" + c.golden + "/golden.json";
  EMBER_REQUIRE_DIR(testing::FixturesDir() + "/tokenizers/" + c.golden);
  auto reference = Tokenizer::Load(dir);
  ASSERT_TRUE(reference.ok()) << reference.message();
  auto exported = GgufVocabFromTokenizerDir(dir);
  ASSERT_TRUE(exported.ok()) << exported.message();
  GgufVocab vocab = *exported;
  EXPECT_EQ(vocab.model, c.model);
  EXPECT_EQ(vocab.pre, c.pre);
  if (c.model == "llama") {
    EXPECT_EQ(vocab.add_space_prefix, c.add_space_prefix);
  }
  auto built = Tokenizer::FromGgufVocab(vocab);
  ASSERT_TRUE(built.ok()) << built.message();
  const Tokenizer& ref = **reference;
  const Tokenizer& tok = **built;
  EXPECT_EQ(tok.vocab_size(), ref.vocab_size());

  std::vector<std::string> texts = RandomStrings(400, 7);
  auto golden_text = ReadFileToString(golden_path);
  ASSERT_TRUE(golden_text.ok()) << golden_text.message();
  int num_golden = 0;
  const json golden = json::parse(*golden_text);
  for (const json& e : golden["encode"]) {
    const std::string text = e["text"];
    // Added tokens are matched in raw text (llama.cpp's rule); tokenizer.json may match them
    // only in normalized text, so texts that spell one are compared against the golden only
    // where both rules agree: those without "<".
    if (text.find('<') != std::string::npos) continue;
    EXPECT_EQ(tok.Encode(text, false), e["ids"].get<std::vector<int32_t>>())
        << c.name << ": " << text;
    texts.push_back(text);
    ++num_golden;
  }
  EXPECT_GT(num_golden, 20);
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = ref.Encode(text, false);
    ASSERT_EQ(tok.Encode(text, false), ids) << c.name << ": \"" << text << "\"";
    ASSERT_EQ(tok.Encode(text, true), ref.Encode(text, true)) << c.name << ": \"" << text << "\"";
    // TinyStories' tokenizer.json shows its "<unk>" even when skipping special tokens (it is
    // matched and decoded in its normalized form " <unk>"); llama.cpp skips it as a control token.
    if (c.name == "tinystories-656k" && std::find(ids.begin(), ids.end(), 0) != ids.end()) continue;
    EXPECT_EQ(tok.Decode(ids, true), ref.Decode(ids, true)) << c.name << ": \"" << text << "\"";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Vocabularies, GgufVocabTest,
    ::testing::Values(Case{"llama3", "gpt2", "llama-bpe", "llama3"},
                      Case{"qwen3", "gpt2", "qwen2", "qwen3"},
                      Case{"gptoss", "gpt2", "gpt-4o", "gptoss"},
                      Case{"llama2", "llama", "", "llama2"},
                      Case{"gemma3", "llama", "", "gemma3", /*add_space_prefix=*/false},
                      Case{"tinystories-656k", "llama", "", "tinystories-656k"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.name;
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

TEST(GgufVocabTest, ErrorsNameTheKey) {
  GgufVocab v;
  v.model = "rwkv";
  v.tokens = {"a", "b"};
  auto t = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tokenizer.ggml.model"), std::string::npos) << t.message();
  EXPECT_NE(t.message().find("rwkv"), std::string::npos) << t.message();

  v.model = "gpt2";
  v.merges = {"a b"};
  v.tokens = {"a", "b", "ab"};
  v.pre = "falcon";
  t = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tokenizer.ggml.pre: \"falcon\""), std::string::npos) << t.message();

  v.pre = "";
  v.merges.clear();
  t = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tokenizer.ggml.merges"), std::string::npos) << t.message();

  v.model = "llama";
  v.scores = {0.0f};
  t = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tokenizer.ggml.scores"), std::string::npos) << t.message();

  v.scores = {0.0f, 0.0f, 0.0f};
  v.eos_token_id = 7;
  t = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tokenizer.ggml.eos_token_id"), std::string::npos) << t.message();

  v.eos_token_id.reset();
  v.token_types = {1, 1, 9};
  t = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tokenizer.ggml.token_type[2]"), std::string::npos) << t.message();
}

// The SentencePiece rules on a hand-made vocab: highest score first, leftmost on ties, byte
// fallback, fused unknown characters, the space prefix and BOS.
TEST(GgufVocabTest, SentencePieceMergesByScore) {
  GgufVocab v;
  v.model = "llama";
  v.tokens = {"<unk>",
              "<s>",
              "</s>",
              "\xE2\x96\x81",
              "a",
              "b",
              "c",
              "ab",
              "bc",
              "\xE2\x96\x81"
              "a",
              "<0x0A>",
              "abc"};
  v.scores = {0, 0, 0, -10, -10, -10, -10, -2, -1, -3, 0, -5};
  v.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 1};
  auto t = Tokenizer::FromGgufVocab(v);
  ASSERT_TRUE(t.ok()) << t.message();
  const Tokenizer& tok = **t;
  // "▁abc": bc (-1) beats ab (-2) and ▁a (-3); then ▁a (-3) beats abc (-5).
  EXPECT_EQ(tok.Encode("abc", false), (std::vector<int32_t>{9, 8}));
  EXPECT_EQ(tok.Encode("abc", true), (std::vector<int32_t>{1, 9, 8}));
  // "▁cabc": the same, but ▁a is not adjacent: bc, then abc.
  EXPECT_EQ(tok.Encode("cabc", false), (std::vector<int32_t>{3, 6, 11}));
  // "\n" has a byte token; "é" and "ü" have none: one unknown token for both.
  EXPECT_EQ(tok.Encode("a\n\xC3\xA9\xC3\xBC"
                       "b",
                       false),
            (std::vector<int32_t>{9, 10, 0, 5}));
  EXPECT_EQ(tok.Decode(std::vector<int32_t>{1, 9, 10, 5}, true), "a\nb");
  EXPECT_EQ(tok.Encode("</s>c", false), (std::vector<int32_t>{2, 3, 6}));
  EXPECT_EQ(tok.bos_token_id(), 1);
  EXPECT_EQ(tok.eos_token_id(), 2);
}

}  // namespace
}  // namespace ember
