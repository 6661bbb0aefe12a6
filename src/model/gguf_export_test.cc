// ExportGguf (`ember quantize`) round trips: a safetensors fixture written as GGUF and loaded back
// through Ember's GGUF loader gives bitwise the logits of the folder loaded with --quantize T (the
// same blocks, the same kernels; f32/bf16: the folder as stored), the same token ids and decoded
// text from the GGUF vocabulary, the same chat template source, and every EOS id of the folder's
// generation_config.json -- for tinystories (llama), qwen2, qwen3, qwen3_moe, gemma2, gemma3, phi3
// and llama3, and for q4_k / q5_k / q6_k on a folder made from small-k-f16.gguf (rows of 256 and
// 512 values). The random-weight fixtures have no tokenizer of their size, so they get a small
// byte-level BPE written here (with a chat template). Llama 3's rope scaling travels as
// rope_freqs.weight (llama.cpp's form), whose frequencies may differ from the folder's in the last
// bits: llama3 is compared within 1e-4. The mixed recipes (q4_k_m, q5_k_m) of the small-k folder
// equal llama-quantize's small-k files tensor for tensor, with bitwise the same logits, and every
// architecture's q4_k_m / q5_k_s file loads. Also the refusals: unknown type, missing folder,
// architectures and layouts GGUF cannot hold, k-quants on rows that are not multiples of 256, an
// unwritable destination (no file left).
#include "model/gguf_export.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>

#include "model/gguf_model.h"
#include "model/model.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ModelDir(const std::string& name) { return testing::FixturesDir() + "/models/" + name; }

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ember-gguf-export-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const char* kTemplate =
    "{% for m in messages %}<|begin|>{{ m.role }}: {{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|begin|>assistant: {% endif %}";

// A byte-level BPE of 256 bytes, merges of common letter pairs and space + letter, and two
// special tokens (<|begin|> added in front of every encoding), with a chat template.
void WriteSmallTokenizer(const std::string& dir) {
  const auto& alphabet = tok::GetByteLevelAlphabet();
  json vocab = json::object(), merges = json::array();
  for (int b = 0; b < 256; ++b) vocab[alphabet.byte_to_utf8[b]] = b;
  int next = 256;
  const std::string space = alphabet.byte_to_utf8[' '];
  for (char a : std::string("etaoinsh"))
    for (char b : std::string("etaoinshrdlucmfw")) {
      const std::string l(1, a), r(1, b);
      if (vocab.contains(l + r)) continue;
      merges.push_back(l + " " + r);
      vocab[l + r] = next++;
    }
  for (char a = 'a'; a <= 'z'; ++a) {
    merges.push_back(space + " " + std::string(1, a));
    vocab[space + std::string(1, a)] = next++;
  }
  json added = json::array();
  for (const char* t : {"<|begin|>", "<|end|>"})
    added.push_back({{"id", next++}, {"content", t}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  const int begin = next - 2;
  json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|begin|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens",
         {{"<|begin|>", {{"id", "<|begin|>"}, {"ids", {begin}}, {"tokens", {"<|begin|>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                   {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
        {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}}};
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  json config = {{"bos_token", "<|begin|>"}, {"eos_token", "<|end|>"}, {"chat_template", kTemplate}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
}

// The logits of every position of `ids`, one prefill.
std::vector<float> AllLogits(const std::string& path, std::optional<DType> quantize,
                             const std::vector<int32_t>& ids) {
  ModelLoadOptions opts;
  opts.device = DeviceKind::kCpu;
  opts.num_threads = 2;
  opts.quantize = quantize;
  auto model = Model::Load(path, opts);
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return {};
  constexpr int32_t kBlock = 16;
  const int32_t blocks = static_cast<int32_t>(ids.size() / kBlock + 1);
  EXPECT_TRUE((*model)->AllocateKvCache(blocks, kBlock).ok());
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int32_t b = 0; b < blocks; ++b) table[size_t(b)] = b;
  BatchPlan plan;
  plan.block_size = kBlock;
  plan.AddSequence(ids, 0, table, false);
  plan.logits_rows.clear();
  for (int32_t r = 0; r < static_cast<int32_t>(ids.size()); ++r) plan.logits_rows.push_back(r);
  std::vector<float> logits(ids.size() * static_cast<size_t>((*model)->config().vocab_size));
  Status st = (*model)->Forward(plan, logits);
  EXPECT_TRUE(st.ok()) << st.message();
  return logits;
}

std::string Export(const std::string& model, const std::string& tokenizer, GgmlType type,
                   const std::string& out, std::optional<QuantRecipe> recipe = std::nullopt) {
  GgufExportOptions o;
  o.model_dir = model;
  o.tokenizer_dir = tokenizer;
  o.out_path = out;
  o.type = type;
  o.recipe = recipe;
  o.threads = 2;
  auto chat = ChatTemplate::Load(tokenizer.empty() ? model : tokenizer);
  EXPECT_TRUE(chat.ok()) << chat.message();
  if (chat.ok()) o.chat_template = chat->default_source();
  auto summary = ExportGguf(o);
  EXPECT_TRUE(summary.ok()) << summary.message();
  return summary.ok() ? *summary : "";
}

// The GGUF file's tokenizer and template against the folder's.
void ExpectSameTokenizer(const std::string& gguf_path, const std::string& tokenizer_dir) {
  auto file = GgufFile::Open(gguf_path);
  ASSERT_TRUE(file.ok()) << file.message();
  auto vocab = GgufVocabOf(*file);
  ASSERT_TRUE(vocab.ok()) << vocab.message();
  auto from_gguf = Tokenizer::FromGgufVocab(*vocab);
  auto from_dir = Tokenizer::Load(tokenizer_dir);
  ASSERT_TRUE(from_gguf.ok() && from_dir.ok());
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.", "  two  spaces\nand a newline",
        "the cat sat on the mat", "über 123 中文 👍", ""}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = (*from_dir)->Encode(text, special);
      EXPECT_EQ((*from_gguf)->Encode(text, special), ids) << text << " special " << special;
      // TinyStories' tokenizer.json shows its special tokens even when skipping them (they are
      // "normalized" added tokens); llama.cpp skips control tokens: decode plain text only.
      const auto unk = (*from_dir)->TokenToId("<unk>");
      if (special || (unk && std::find(ids.begin(), ids.end(), *unk) != ids.end())) continue;
      EXPECT_EQ((*from_gguf)->Decode(ids, true), (*from_dir)->Decode(ids, true)) << text;
    }
  }
  auto chat = ChatTemplate::Load(tokenizer_dir);
  auto tmpl = GgufChatTemplate(*file);
  ASSERT_TRUE(chat.ok() && tmpl.ok());
  EXPECT_EQ(*tmpl, chat->default_source());
}

// Every EOS id the folder stops on (generation_config.json) is one the GGUF file stops on.
void ExpectFolderEosIds(const std::string& gguf_path, const std::string& model_dir) {
  auto file = GgufFile::Open(gguf_path);
  ASSERT_TRUE(file.ok()) << file.message();
  auto config = GgufModelConfig(*file);
  ASSERT_TRUE(config.ok()) << config.message();
  const std::vector<int32_t> file_eos = GgufGenerationDefaults(*config).eos_token_ids;
  auto config_text = ReadFileToString(model_dir + "/config.json");
  auto gen_text = ReadFileToString(model_dir + "/generation_config.json");
  ASSERT_TRUE(config_text.ok() && gen_text.ok());
  auto folder_config = ParseModelConfig(*config_text, "config.json");
  ASSERT_TRUE(folder_config.ok());
  auto gen = ParseGenerationConfig(*gen_text, "generation_config.json", *folder_config);
  ASSERT_TRUE(gen.ok());
  ASSERT_FALSE(gen->eos_token_ids.empty());
  for (int32_t id : gen->eos_token_ids)
    EXPECT_NE(std::find(file_eos.begin(), file_eos.end(), id), file_eos.end()) << id;
}

struct Case {
  std::string model;
  bool own_tokenizer;            // false: WriteSmallTokenizer
  std::vector<GgmlType> types;   // written and compared
  float tolerance;               // 0: bitwise
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model; }

class GgufExportTest : public ::testing::TestWithParam<Case> {};

TEST_P(GgufExportTest, RoundTripMatchesTheFolderWithQuantize) {
  const Case& c = GetParam();
  EMBER_REQUIRE_DIR(ModelDir(c.model));
  TempDir tmp;
  std::string tokenizer_dir;
  if (!c.own_tokenizer) {
    tokenizer_dir = tmp.path() + "/tokenizer";
    fs::create_directories(tokenizer_dir);
    WriteSmallTokenizer(tokenizer_dir);
  }
  auto tok = Tokenizer::Load(c.own_tokenizer ? ModelDir(c.model) : tokenizer_dir);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const std::vector<int32_t> ids =
      (*tok)->Encode("Once upon a time, there was a little dog who liked the sea and its sand.", true);
  for (GgmlType type : c.types) {
    const std::string name(GgmlTypeName(type));
    const std::string out = tmp.path() + "/" + name + ".gguf";
    const std::string summary = Export(ModelDir(c.model), tokenizer_dir, type, out);
    ASSERT_FALSE(summary.empty());
    std::optional<DType> quantize;
    if (type == GgmlType::kQ8_0) quantize = DType::kQ8_0;
    if (type == GgmlType::kQ4_0) quantize = DType::kQ4_0;
    const std::vector<float> want = AllLogits(ModelDir(c.model), quantize, ids);
    const std::vector<float> got = AllLogits(out, std::nullopt, ids);
    ASSERT_EQ(got.size(), want.size()) << name;
    if (c.tolerance == 0) {
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << c.model << " " << name << ": " << summary;
    } else {
      float worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
      EXPECT_LE(worst, c.tolerance) << c.model << " " << name;
    }
    ExpectSameTokenizer(out, c.own_tokenizer ? ModelDir(c.model) : tokenizer_dir);
    ExpectFolderEosIds(out, ModelDir(c.model));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufExportTest,
    ::testing::Values(
        Case{"tinystories-656k", true, {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_0}, 0},
        Case{"qwen3", false, {GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}, 0},
        Case{"qwen2", false, {GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}, 0},
        Case{"qwen3_moe", false, {GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}, 0},
        Case{"gemma2", false, {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_0}, 0},
        Case{"gemma3", false, {GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}, 0},
        Case{"phi3", false, {GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}, 0},
        Case{"llama3", false, {GgmlType::kBF16, GgmlType::kQ8_0}, 1e-4f}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.model;
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

// The k-quants need rows of multiples of 256, which no safetensors fixture has: the folder here is
std::string SmallKDir() { return testing::FixturesDir() + "/gguf"; }

// small-k-f16.gguf (llama.cpp's file: hidden 256, FFN 512) read back by Ember's GGUF loader and
// saved into `dir` as an f16 safetensors folder with TinyStories' tokenizer (the same 2048-token
// vocabulary).
void WriteSmallKFolder(const std::string& dir) {
  const std::string source = SmallKDir() + "/small-k-f16.gguf";
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(ModelDir("tinystories-656k") + "/" + f, dir + "/" + f);
  auto file = GgufFile::Open(source);
  ASSERT_TRUE(file.ok()) << file.message();
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto c = GgufModelConfig(*shared);
  ASSERT_TRUE(c.ok()) << c.message();
  std::string summary;
  auto store = OpenGgufWeights(shared, *c, nullptr, &summary);
  ASSERT_TRUE(store.ok()) << store.message();
  json header = json::object();
  std::string data;
  for (const std::string& name : (*store)->Names()) {
    auto view = (*store)->Get(name);
    ASSERT_TRUE(view.ok()) << name;
    header[name] = {{"dtype", DTypeName(view->dtype)},
                    {"shape", view->shape},
                    {"data_offsets", {data.size(), data.size() + view->nbytes}}};
    data.append(static_cast<const char*>(view->data), view->nbytes);
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the data 8-byte aligned, as safetensors pads it
  const uint64_t len = text.size();
  std::ofstream(dir + "/model.safetensors", std::ios::binary)
      << std::string(reinterpret_cast<const char*>(&len), 8) << text << data;
  const json config = {{"model_type", "llama"}, {"hidden_size", c->hidden_size},
                       {"intermediate_size", c->intermediate_size},
                       {"num_hidden_layers", c->num_layers}, {"num_attention_heads", c->num_heads},
                       {"num_key_value_heads", c->num_kv_heads}, {"head_dim", c->head_dim},
                       {"vocab_size", c->vocab_size}, {"max_position_embeddings", 512},
                       {"rms_norm_eps", c->rms_norm_eps}, {"rope_theta", c->rope.theta},
                       {"tie_word_embeddings", c->tie_word_embeddings},
                       {"torch_dtype", "float16"}};
  std::ofstream(dir + "/config.json") << config.dump();
}

TEST(GgufExportKQuantTest, RoundTripMatchesTheFolderWithQuantize) {
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  EMBER_REQUIRE_DIR(SmallKDir());
  TempDir tmp;
  const std::string dir = tmp.path() + "/small-k";
  ASSERT_NO_FATAL_FAILURE(WriteSmallKFolder(dir));
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const std::vector<int32_t> ids =
      (*tok)->Encode("Once upon a time, there was a little dog who liked the sea and its sand.", true);
  for (auto [type, dtype] : {std::pair{GgmlType::kQ4_K, DType::kQ4_K},
                             {GgmlType::kQ5_K, DType::kQ5_K}, {GgmlType::kQ6_K, DType::kQ6_K}}) {
    const std::string out = tmp.path() + "/" + std::string(GgmlTypeName(type)) + ".gguf";
    ASSERT_FALSE(Export(dir, "", type, out).empty());
    const std::vector<float> want = AllLogits(dir, dtype, ids), got = AllLogits(out, std::nullopt, ids);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
        << GgmlTypeName(type);
  }
}

// The mixed recipes against llama-quantize: the small-k folder written as q4_k_m / q5_k_m holds
// every tensor of small-k-q4_k_m.gguf / small-k-q5_k_m.gguf (llama-quantize from
// small-k-f16.gguf, no importance matrix) with its type, shape and bytes -- embedding and the
// attn_v / ffn_down Q6_K layers included -- and the same general.file_type; Ember's logits on
// the two files are bitwise equal.
TEST(GgufExportMixedTest, EqualsLlamaQuantizeFiles) {
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  EMBER_REQUIRE_DIR(SmallKDir());
  TempDir tmp;
  const std::string dir = tmp.path() + "/small-k";
  ASSERT_NO_FATAL_FAILURE(WriteSmallKFolder(dir));
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const std::vector<int32_t> ids = (*tok)->Encode("Once upon a time, a cat sat by the sea.", true);
  for (const auto& [recipe, file] : {std::pair{QuantRecipe::kQ4_K_M, "small-k-q4_k_m.gguf"},
                                     {QuantRecipe::kQ5_K_M, "small-k-q5_k_m.gguf"}}) {
    const std::string out = tmp.path() + "/" + QuantRecipeName(recipe) + ".gguf";
    ASSERT_FALSE(Export(dir, "", RecipeBaseType(recipe), out, recipe).empty());
    auto got = GgufFile::Open(out);
    auto want = GgufFile::Open(SmallKDir() + "/" + file);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_EQ(*got->GetUint32("general.file_type"), *want->GetUint32("general.file_type"));
    EXPECT_EQ(got->tensors().size(), want->tensors().size());
    std::set<GgmlType> types;
    for (const GgufTensorInfo& w : want->tensors()) {
      const GgufTensorInfo* g = got->FindTensor(w.name);
      ASSERT_NE(g, nullptr) << w.name;
      EXPECT_EQ(GgmlTypeName(g->type), GgmlTypeName(w.type)) << file << " " << w.name;
      EXPECT_EQ(g->dims, w.dims) << w.name;
      ASSERT_EQ(g->nbytes, w.nbytes) << w.name;
      EXPECT_EQ(0, std::memcmp(g->data, w.data, w.nbytes)) << file << " " << w.name;
      types.insert(w.type);
    }
    EXPECT_TRUE(types.count(GgmlType::kQ6_K) && types.count(RecipeBaseType(recipe))) << file;
    const std::vector<float> a = AllLogits(out, std::nullopt, ids);
    const std::vector<float> b = AllLogits(SmallKDir() + "/" + file, std::nullopt, ids);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << file;
  }
}

// Every architecture's q4_k_m / q5_k_s file (rows of 64-384 values: the Q5_0 / Q5_1 / Q8_0
// fallbacks; qwen3_moe's 8 experts: Q8_0 attn_k / attn_v, quantized stacked experts) loads in
// Ember, says general.file_type 15 / 16, and its logits stay near the folder's (the blocks
// themselves are checked against llama-quantize above and by tests/cli/quantize.sh).
TEST(GgufExportMixedTest, EveryArchitectureLoadsNearTheFolder) {
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  TempDir tmp;
  const std::string tokenizer_dir = tmp.path() + "/tokenizer";
  fs::create_directories(tokenizer_dir);
  WriteSmallTokenizer(tokenizer_dir);
  auto tok = Tokenizer::Load(tokenizer_dir);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const std::vector<int32_t> ids = (*tok)->Encode("Once upon a time, a cat sat by the sea.", true);
  for (const char* model : {"qwen3", "qwen2", "qwen3_moe", "gemma2", "gemma3", "phi3", "llama3"}) {
    const std::vector<float> want = AllLogits(ModelDir(model), std::nullopt, ids);
    for (QuantRecipe recipe : {QuantRecipe::kQ4_K_M, QuantRecipe::kQ5_K_S}) {
      const std::string out = tmp.path() + "/" + model + QuantRecipeName(recipe) + ".gguf";
      const std::string summary =
          Export(ModelDir(model), tokenizer_dir, RecipeBaseType(recipe), out, recipe);
      ASSERT_FALSE(summary.empty()) << model;
      auto file = GgufFile::Open(out);
      ASSERT_TRUE(file.ok()) << file.message();
      EXPECT_EQ(*file->GetUint32("general.file_type"), RecipeFileType(recipe));
      if (std::string(model) == "qwen3_moe") {
        EXPECT_EQ(file->FindTensor("blk.0.attn_v.weight")->type, GgmlType::kQ8_0);
        EXPECT_NE(file->FindTensor("blk.0.ffn_up_exps.weight")->type, GgmlType::kBF16);
      }
      const std::vector<float> got = AllLogits(out, std::nullopt, ids);
      ASSERT_EQ(got.size(), want.size()) << model;
      float worst = 0, scale = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] - want[i]));
        scale = std::max(scale, std::fabs(want[i]));
      }
      // 5-bit weights on random tiny models move logits by up to 27% of their largest (qwen3_moe,
      // whose top-2 routing flips); a misplaced row or block moves them by their whole size.
      EXPECT_LE(worst, 0.3f * scale) << model << " " << QuantRecipeName(recipe) << ": " << summary;
    }
  }
}

TEST(GgufExportErrorsTest, NameTheOptionFolderArchitectureAndTensor) {
  auto bad_type = ParseExportType("q3_k", "--type");
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.message().find("--type: unsupported type 'q3_k' (supported: f32, f16"),
            std::string::npos)
      << bad_type.message();
  ASSERT_TRUE(ParseExportType("Q4_K", "--type").ok());

  TempDir tmp;
  GgufExportOptions o;
  o.model_dir = tmp.path() + "/nothing";
  o.out_path = tmp.path() + "/x.gguf";
  auto missing = ExportGguf(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("nothing: model directory not found"), std::string::npos)
      << missing.message();

  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  for (const auto& [model, want] :
       {std::pair<std::string, std::string>{"gpt_oss", "architecture \"gpt_oss\" is not written"},
        {"mistral", "sliding-window layers (sliding_window 16)"}}) {
    o.model_dir = ModelDir(model);
    auto refused = ExportGguf(o);
    ASSERT_FALSE(refused.ok()) << model;
    EXPECT_NE(refused.message().find(want), std::string::npos) << refused.message();
  }
  o.model_dir = ModelDir("qwen3");  // no tokenizer.json of its own
  auto no_tokenizer = ExportGguf(o);
  ASSERT_FALSE(no_tokenizer.ok());
  EXPECT_NE(no_tokenizer.message().find("tokenizer.json: file not found"), std::string::npos)
      << no_tokenizer.message();

  o.model_dir = ModelDir("tinystories-656k");
  o.type = GgmlType::kQ4_K;  // rows of 128 and 384 values
  auto narrow = ExportGguf(o);
  ASSERT_FALSE(narrow.ok());
  EXPECT_NE(narrow.message().find("not a whole number of 256-element blocks"), std::string::npos)
      << narrow.message();
  EXPECT_FALSE(fs::exists(o.out_path));

  o.type = GgmlType::kQ8_0;
  o.out_path = tmp.path() + "/no/such/dir/x.gguf";
  auto unwritable = ExportGguf(o);
  ASSERT_FALSE(unwritable.ok());
  EXPECT_NE(unwritable.message().find("no/such/dir/x.gguf: cannot create"), std::string::npos)
      << unwritable.message();
  // Nothing but what the test made is left in the folder (no temporary file).
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
  EXPECT_EQ(entries, 0);
}

}  // namespace
}  // namespace ember
