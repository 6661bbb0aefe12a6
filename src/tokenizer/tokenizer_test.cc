// Exactness tests against the Hugging Face goldens (tokenizers 0.23.2 / transformers 5.17) for
// the six real tokenizers and TinyStories-656K, plus the incremental detokenizer, thread safety,
// and load errors.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <thread>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/unicode.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

struct Case {
  std::string name;
  std::string tokenizer_dir;
  std::string golden_path;
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const char* name : {"llama2", "llama3", "qwen3", "gemma3", "deepseek_v3", "gptoss"}) {
    cases.push_back({name, testing::TokenizersDir() + "/" + name,
                     testing::FixturesDir() + "/tokenizers/" + name + "/golden.json"});
  }
  cases.push_back({"tinystories", testing::FixturesDir() + "/models/tinystories-656k",
                   testing::FixturesDir() + "/tokenizers/tinystories-656k/golden.json"});
  return cases;
}

// Each tokenizer is loaded once per test binary (loading dominates sanitizer runs).
const Tokenizer* LoadShared(const std::string& dir) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto it = loaded.find(dir);
  if (it == loaded.end()) {
    auto tok = Tokenizer::Load(dir);
    EXPECT_TRUE(tok.ok()) << tok.message();
    if (!tok.ok()) return nullptr;
    it = loaded.emplace(dir, std::move(tok).value()).first;
  }
  return it->second.get();
}

std::string StreamDecode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer detok(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    std::string piece = detok.Push(id);
    EXPECT_TRUE(tok::IsValidUtf8(piece)) << "Push returned a partial character";
    all += piece;
  }
  return all + detok.Flush();
}

class GoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenTest, EncodeDecodeAndStreamMatchReference) {
  const Case& c = GetParam();
  EMBER_REQUIRE_DIR(c.tokenizer_dir);
  // The tokenizer files come from setup.sh, the goldens from the fixtures folder: either may be
  // absent (a clone outside the workspace has tokenizers but no fixtures).
  EMBER_REQUIRE_DIR(c.golden_path.substr(0, c.golden_path.rfind('/')));
  auto golden_text = ReadFileToString(c.golden_path);
  ASSERT_TRUE(golden_text.ok()) << golden_text.message();
  auto golden = nlohmann::json::parse(*golden_text);
  const Tokenizer* loaded = LoadShared(c.tokenizer_dir);
  ASSERT_NE(loaded, nullptr);
  const Tokenizer& tok = *loaded;
  int num_cases = 0;
  for (const auto& e : golden["encode"]) {
    std::string text = e["text"];
    auto ids = e["ids"].get<std::vector<int32_t>>();
    auto ids_special = e["ids_with_special"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.Encode(text, false), ids) << c.name << " text: " << text;
    EXPECT_EQ(tok.Encode(text, true), ids_special) << c.name << " text: " << text;
    EXPECT_EQ(tok.Decode(ids, false), e["decoded"].get<std::string>()) << c.name << " text: " << text;
    EXPECT_EQ(tok.Decode(ids, true), e["decoded_skip_special"].get<std::string>())
        << c.name << " text: " << text;
    EXPECT_EQ(StreamDecode(tok, ids, false), e["decoded"].get<std::string>()) << c.name << " text: " << text;
    EXPECT_EQ(StreamDecode(tok, ids, true), e["decoded_skip_special"].get<std::string>())
        << c.name << " text: " << text;
    for (bool skip : {false, true}) {
      EXPECT_EQ(StreamDecode(tok, ids_special, skip), tok.Decode(ids_special, skip))
          << c.name << " text: " << text;
    }
    ++num_cases;
  }
  EXPECT_GE(num_cases, 30);
  if (golden.contains("bos_token") && !golden["bos_token"].is_null()) {
    EXPECT_EQ(tok.bos_token(), golden["bos_token"].get<std::string>());
    EXPECT_TRUE(tok.bos_token_id().has_value());
  }
  if (golden.contains("eos_token") && !golden["eos_token"].is_null()) {
    EXPECT_EQ(tok.eos_token(), golden["eos_token"].get<std::string>());
    EXPECT_TRUE(tok.eos_token_id().has_value());
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GoldenTest, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return info.param.name; });

// A stream of ids that splits characters mid-way: every prefix of a byte-level / byte-fallback
// encoding of multi-byte text must hold the partial character and still end up exact.
TEST(IncrementalDetokenizerTest, HoldsPartialCharactersAndMatchesDecode) {
  for (const char* name : {"llama3", "llama2"}) {
    std::string dir = testing::TokenizersDir() + "/" + name;
    EMBER_REQUIRE_DIR(dir);
    const Tokenizer* tok = LoadShared(dir);
    ASSERT_NE(tok, nullptr);
    std::string text = "emoji 👍🏽 and 中文测试 𝔘𝔫𝔦 ok";
    std::vector<int32_t> ids = tok->Encode(text, false);
    IncrementalDetokenizer detok(*tok, false);
    std::string all;
    int held = 0;
    for (int32_t id : ids) {
      std::string piece = detok.Push(id);
      ASSERT_TRUE(tok::IsValidUtf8(piece)) << name;
      if (piece.empty()) ++held;
      all += piece;
    }
    all += detok.Flush();
    EXPECT_EQ(all, tok->Decode(ids, false)) << name;
    EXPECT_EQ(all, text) << name;
    EXPECT_GT(held, 0) << name << ": expected some tokens to split a character";
  }
}

TEST(IncrementalDetokenizerTest, TruncatedCharacterFlushesLikeDecode) {
  std::string dir = testing::TokenizersDir() + "/llama3";
  EMBER_REQUIRE_DIR(dir);
  const Tokenizer* tok = LoadShared(dir);
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = tok->Encode("a👍", false);
  ids.pop_back();  // leave the emoji incomplete
  IncrementalDetokenizer detok(*tok, false);
  std::string all;
  for (int32_t id : ids) all += detok.Push(id);
  all += detok.Flush();
  EXPECT_EQ(all, tok->Decode(ids, false));
  EXPECT_NE(all.find("\xEF\xBF\xBD"), std::string::npos);  // U+FFFD, as Hugging Face decodes
}

// The streaming contract on arbitrary id sequences (not just encodings of valid text): random
// mixes of byte tokens (partial characters, invalid runs), specials and ordinary tokens.
TEST(IncrementalDetokenizerTest, RandomIdSequencesMatchDecode) {
  std::mt19937 rng(1234);
  for (const char* name : {"llama2", "llama3", "gemma3", "qwen3"}) {
    std::string dir = testing::TokenizersDir() + "/" + name;
    EMBER_REQUIRE_DIR(dir);
    const Tokenizer* tok = LoadShared(dir);
    ASSERT_NE(tok, nullptr);
    // A pool biased to the tokens that interact: byte-ish tokens, specials, spaces.
    std::vector<int32_t> pool = tok->Encode("é中👍 a  b\n\t€", false);
    for (int b = 0; b < 256; b += 7) {
      char name_buf[8];
      std::snprintf(name_buf, sizeof(name_buf), "<0x%02X>", b);
      if (auto id = tok->TokenToId(name_buf)) pool.push_back(*id);
    }
    for (int32_t id = 0; id < 300; ++id) pool.push_back(id);
    if (tok->bos_token_id()) pool.push_back(*tok->bos_token_id());
    if (tok->eos_token_id()) pool.push_back(*tok->eos_token_id());
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids(1 + rng() % 12);
      for (int32_t& id : ids) id = pool[rng() % pool.size()];
      for (bool skip : {false, true}) {
        ASSERT_EQ(StreamDecode(*tok, ids, skip), tok->Decode(ids, skip)) << name << " trial " << trial;
      }
    }
  }
}

// TokenBytes: the raw bytes each token adds mid-stream. Concatenated over an encoding (after a
// first token that starts the stream) they spell the text exactly, including characters split
// across byte-level or byte-fallback tokens; specials have none.
TEST(TokenizerTest, TokenBytesSpellTheTextMidStream) {
  for (const char* name : {"llama3", "llama2", "qwen3", "gemma3"}) {
    std::string dir = testing::TokenizersDir() + "/" + name;
    EMBER_REQUIRE_DIR(dir);
    const Tokenizer* tok = LoadShared(dir);
    ASSERT_NE(tok, nullptr);
    const std::string text = "{\"k\": [1, -2.5e3, true], \"s\": \"emoji 👍🏽 中文\\n\"}";
    std::vector<int32_t> ids = tok->Encode("x" + text, false);
    ASSERT_GT(ids.size(), 1u);
    std::string bytes;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::optional<std::string> b = tok->TokenBytes(ids[i]);
      ASSERT_TRUE(b.has_value()) << name << " id " << ids[i];
      bytes += *b;
    }
    // Mid-stream, a SentencePiece tokenizer's first "▁x" is " x" (at the start it drops the
    // space); a byte-level one adds nothing.
    EXPECT_TRUE(bytes == "x" + text || bytes == " x" + text) << name << ": " << bytes;
    if (tok->eos_token_id() && tok->IsSpecial(*tok->eos_token_id())) {
      EXPECT_FALSE(tok->TokenBytes(*tok->eos_token_id()).has_value()) << name;
    }
  }
}

// TokenBytesTable: every id's TokenBytes over a model vocabulary padded past the tokenizer's
// (byte-level "Ġthe" and byte-fallback "<0x0A>" as raw bytes, specials and padding without text),
// or cut below it.
TEST(TokenizerTest, TokenBytesTableCoversAPaddedVocabulary) {
  struct Case {
    const char* name;
    int32_t plain_id;  // a token whose bytes we know
    const char* plain_bytes;
    int32_t special_id;
  };
  for (const Case& c : {Case{"llama3", 279, " the", 128000}, Case{"llama2", 13, "\n", 1},
                        Case{"llama2", 272, " the", 2}}) {
    SCOPED_TRACE(c.name);
    const std::string dir = testing::TokenizersDir() + "/" + c.name;
    EMBER_REQUIRE_DIR(dir);
    const Tokenizer* tok = LoadShared(dir);
    ASSERT_NE(tok, nullptr);
    const int32_t known = tok->vocab_size();
    const std::vector<std::optional<std::string>> table = tok->TokenBytesTable(known + 64);
    ASSERT_EQ(table.size(), static_cast<size_t>(known + 64));
    EXPECT_EQ(table[static_cast<size_t>(c.plain_id)], c.plain_bytes);
    EXPECT_TRUE(tok->IsSpecial(c.special_id));
    EXPECT_EQ(table[static_cast<size_t>(c.special_id)], std::nullopt);
    for (int32_t id = 0; id < known; id += 97)
      EXPECT_EQ(table[static_cast<size_t>(id)], tok->TokenBytes(id)) << "id " << id;
    for (int32_t id = known; id < known + 64; ++id)
      EXPECT_EQ(table[static_cast<size_t>(id)], std::nullopt) << "padding id " << id;
    const std::vector<std::optional<std::string>> cut = tok->TokenBytesTable(c.plain_id + 1);
    ASSERT_EQ(cut.size(), static_cast<size_t>(c.plain_id + 1));
    EXPECT_EQ(cut.back(), c.plain_bytes);
    EXPECT_TRUE(tok->TokenBytesTable(0).empty());
  }
}

TEST(TokenizerTest, EncodeIsThreadSafe) {
  std::string dir = testing::TokenizersDir() + "/qwen3";
  EMBER_REQUIRE_DIR(dir);
  const Tokenizer* tok = LoadShared(dir);
  ASSERT_NE(tok, nullptr);
  std::vector<std::string> texts = {"Hello world, this is a test.", "中文测试，你好世界。",
                                    "def add(a, b):\n    return a + b\n", "<|im_start|>user\nhi"};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok->Encode(t, true));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < 200; ++i) {
        size_t k = size_t(i + th) % texts.size();
        if (tok->Encode(texts[k], true) != expected[k]) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerTest, LookupsAndInvalidIds) {
  std::string dir = testing::TokenizersDir() + "/llama3";
  EMBER_REQUIRE_DIR(dir);
  const Tokenizer* tok = LoadShared(dir);
  ASSERT_NE(tok, nullptr);
  const Tokenizer& t = *tok;
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.TokenToId("<|begin_of_text|>"), 128000);
  EXPECT_EQ(t.IdToToken(128000), "<|begin_of_text|>");
  EXPECT_TRUE(t.IsSpecial(128000));
  EXPECT_FALSE(t.IsSpecial(9906));
  EXPECT_EQ(t.TokenToId("Hello"), 9906);
  EXPECT_EQ(t.TokenToId("definitely not a token"), std::nullopt);
  std::vector<int32_t> bad = {9906, -1, 1 << 30, 1917};
  EXPECT_EQ(t.Decode(bad, false), "Hello world");
  // Invalid UTF-8 is encoded as U+FFFD, never crashes.
  EXPECT_EQ(t.Encode("a\xff", false), t.Encode("a\xEF\xBF\xBD", false));
}

TEST(TokenizerTest, UnsupportedComponentIsALoadErrorNamingIt) {
  auto dir = std::filesystem::temp_directory_path() / "ember_tokenizer_test_unsupported";
  std::filesystem::create_directories(dir);
  std::string json = R"({"version":"1.0","added_tokens":[],"normalizer":null,
    "pre_tokenizer":{"type":"BertPreTokenizer"},"post_processor":null,"decoder":null,
    "model":{"type":"BPE","vocab":{"a":0},"merges":[]}})";
  ASSERT_TRUE(WriteStringToFile((dir / "tokenizer.json").string(), json).ok());
  auto tok = Tokenizer::Load(dir.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.message().find("BertPreTokenizer"), std::string::npos) << tok.message();

  json = R"({"added_tokens":[],"model":{"type":"WordPiece","vocab":{"a":0}}})";
  ASSERT_TRUE(WriteStringToFile((dir / "tokenizer.json").string(), json).ok());
  tok = Tokenizer::Load(dir.string());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.message().find("WordPiece"), std::string::npos) << tok.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ember
