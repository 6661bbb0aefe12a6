// Component tests for what the real-tokenizer goldens do not reach: every Split behavior (the
// examples of the Hugging Face `tokenizers` documentation), Metaspace, Digits, added-token
// lstrip/rstrip/single_word, the run-wise NFC against utf8proc's whole-string NFC, and the
// TemplateProcessing suffix.
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <filesystem>

#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember::tok {
namespace {

std::vector<std::string> PreTokenize(const std::string& json, const std::string& text) {
  simdjson::dom::parser parser;
  Json root;
  EXPECT_EQ(parser.parse(json).get(root), simdjson::SUCCESS);
  auto pre = PreTokenizer::FromJson(root);
  EXPECT_TRUE(pre.ok()) << pre.message();
  std::vector<Piece> pieces;
  (*pre)->Split(text, true, &pieces);
  std::vector<std::string> out;
  for (auto& p : pieces) out.push_back(p.text);
  return out;
}

std::string SplitJson(const std::string& behavior, bool invert = false) {
  return R"({"type":"Split","pattern":{"String":"-"},"behavior":")" + behavior +
         R"(","invert":)" + (invert ? "true" : "false") + "}";
}

TEST(PreTokenizerTest, SplitBehaviorsMatchTokenizersDocs) {
  const std::string text = "the-final--countdown";
  using V = std::vector<std::string>;
  EXPECT_EQ(PreTokenize(SplitJson("Removed"), text), (V{"the", "final", "countdown"}));
  EXPECT_EQ(PreTokenize(SplitJson("Isolated"), text), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(PreTokenize(SplitJson("MergedWithPrevious"), text), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(PreTokenize(SplitJson("MergedWithNext"), text), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(PreTokenize(SplitJson("Contiguous"), text), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(PreTokenize(SplitJson("Removed", true), text), (V{"-", "-", "-"}));
}

TEST(PreTokenizerTest, MetaspaceDigitsWhitespace) {
  using V = std::vector<std::string>;
  EXPECT_EQ(PreTokenize(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})",
                        "Hey friend!"),
            (V{"▁Hey", "▁friend!"}));
  EXPECT_EQ(PreTokenize(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":false})",
                        "Hey friend!"),
            (V{"Hey▁friend!"}));
  EXPECT_EQ(PreTokenize(R"({"type":"Digits","individual_digits":true})", "a123"), (V{"a", "1", "2", "3"}));
  EXPECT_EQ(PreTokenize(R"({"type":"Digits","individual_digits":false})", "a123b"), (V{"a", "123", "b"}));
  EXPECT_EQ(PreTokenize(R"({"type":"Whitespace"})", "Hey friend!  ok"), (V{"Hey", "friend", "!", "ok"}));
  // The GPT-2 regex of ByteLevel (with the byte map: space -> U+0120).
  EXPECT_EQ(PreTokenize(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})", "I'm ok"),
            (V{"I", "'m", "\xC4\xA0ok"}));
}

TEST(NormalizerTest, RunWiseNfcEqualsWholeStringNfc) {
  simdjson::dom::parser parser;
  Json root;
  ASSERT_EQ(parser.parse(std::string(R"({"type":"NFC"})")).get(root), simdjson::SUCCESS);
  auto nfc = Normalizer::FromJson(root);
  ASSERT_TRUE(nfc.ok());
  std::vector<std::string> texts = {
      "plain ascii", "e\xCC\x81 and a\xCC\xA3\xCC\x81",          // e + acute; a + dot below + acute
      "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8 jamo",               // L V T -> one syllable
      "\xEA\xB0\x80\xE1\x86\xA8",                               // LV syllable + T
      "\xE3\x81\x8B\xE3\x82\x99",                               // ka + voiced mark
      "\xE2\x84\xAB \xEF\xA4\x80 \xCD\x80",                     // Angstrom, CJK compat, U+0340
      "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD q\xCC\x87\xCC\xA3"};
  std::string mixed = testing::FixturesDir() + "/bench/mixed-1mb.txt";
  if (auto text = ReadFileToString(mixed); text.ok()) texts.push_back(*text);
  for (const std::string& t : texts) {
    auto* full = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(t.c_str()));
    ASSERT_NE(full, nullptr);
    EXPECT_EQ((*nfc)->Normalize(t), std::string(reinterpret_cast<char*>(full))) << t.substr(0, 80);
    std::free(full);
  }
}

class SyntheticTokenizer : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> Load(const std::string& added_flags) {
    auto dir = std::filesystem::temp_directory_path() / "ember_tokenizer_components_test";
    std::filesystem::create_directories(dir);
    std::string json = R"({"added_tokens":[{"id":4,"content":"<m>",)" + added_flags +
                       R"(,"special":true,"normalized":false}],
      "normalizer":null,"pre_tokenizer":null,"decoder":null,
      "post_processor":{"type":"TemplateProcessing","single":[{"Sequence":{"id":"A","type_id":0}},
        {"SpecialToken":{"id":"<m>","type_id":0}}],"pair":[],
        "special_tokens":{"<m>":{"id":"<m>","ids":[4],"tokens":["<m>"]}}},
      "model":{"type":"BPE","vocab":{"a":0,"b":1," ":2,"ab":3},"merges":["a b"]}})";
    EXPECT_TRUE(WriteStringToFile((dir / "tokenizer.json").string(), json).ok());
    auto tok = Tokenizer::Load(dir.string());
    std::filesystem::remove_all(dir);
    EXPECT_TRUE(tok.ok()) << tok.message();
    return tok.ok() ? std::move(tok).value() : nullptr;
  }
};

TEST_F(SyntheticTokenizer, AddedTokenStripFlags) {
  using V = std::vector<int32_t>;
  auto plain = Load(R"("lstrip":false,"rstrip":false,"single_word":false)");
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->Encode("ab <m> ab", false), (V{3, 2, 4, 2, 3}));
  EXPECT_EQ(plain->Encode("ab", true), (V{3, 4}));  // the template appends <m>
  auto lstrip = Load(R"("lstrip":true,"rstrip":false,"single_word":false)");
  EXPECT_EQ(lstrip->Encode("ab <m> ab", false), (V{3, 4, 2, 3}));
  auto rstrip = Load(R"("lstrip":false,"rstrip":true,"single_word":false)");
  EXPECT_EQ(rstrip->Encode("ab <m> ab", false), (V{3, 2, 4, 3}));
  auto single = Load(R"("lstrip":false,"rstrip":false,"single_word":true)");
  // Inside a word the token is not matched; its characters are not in the vocab and there is
  // no unk, so they vanish and "a", "b" merge.
  EXPECT_EQ(single->Encode("a<m>b", false), (V{3}));
  EXPECT_EQ(single->Encode("a <m> b", false), (V{0, 2, 4, 2, 1}));
  // No decoder: tokens joined by spaces.
  EXPECT_EQ(plain->Decode(V{3, 4, 0}, false), "ab <m> a");
  EXPECT_EQ(plain->Decode(V{3, 4, 0}, true), "ab a");
}

}  // namespace
}  // namespace ember::tok
