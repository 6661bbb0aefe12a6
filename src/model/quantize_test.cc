// --quantize (model/quantize.h) against llama.cpp: the TinyStories safetensors projections
// quantized at load are byte for byte the blocks llama-quantize wrote into ts-q8_0.gguf and
// ts-q4_0.gguf (same reference quantizers), and the quantized model's greedy tokens agree with
// llama.cpp's on those files (gguf/golden.json) wherever llama.cpp's margin is at least 0.1 (its
// embedding is Q8_0 where ours stays F32, and it quantizes activations for every dot product).
// Also the flag's errors: unknown type names, an already-quantized tensor. Skips without fixtures.
#include "model/quantize.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "model/gguf_model.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

using json = nlohmann::json;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 32;

std::string GgufDir() { return testing::FixturesDir() + "/gguf"; }
std::string TinyStoriesDir() { return testing::FixturesDir() + "/models/tinystories-656k"; }

json ReadJson(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.message();
  return text.ok() ? json::parse(*text) : json();
}

TEST(QuantizeTest, ParsesGgufTypeNamesAndRefusesOthersNamingTheFlag) {
  auto q8 = ParseQuantizeType("Q8_0", "--quantize");
  ASSERT_TRUE(q8.ok());
  EXPECT_EQ(*q8, DType::kQ8_0);
  auto q4 = ParseQuantizeType("q4_0", "--quantize");
  ASSERT_TRUE(q4.ok());
  EXPECT_EQ(*q4, DType::kQ4_0);
  auto none = ParseQuantizeType("", "--quantize");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto q6k = ParseQuantizeType("Q6_K", "--quantize");
  ASSERT_TRUE(q6k.ok());
  EXPECT_EQ(*q6k, DType::kQ6_K);
  auto bad = ParseQuantizeType("q3_k", "--quantize");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--quantize: unsupported type 'q3_k'"), std::string::npos)
      << bad.message();
  EXPECT_TRUE(IsQuantizedProjection("model.layers.3.self_attn.q_proj.weight"));
  EXPECT_TRUE(IsQuantizedProjection("model.layers.0.mlp.gate_up_proj.weight"));
  EXPECT_FALSE(IsQuantizedProjection("lm_head.weight"));
  EXPECT_FALSE(IsQuantizedProjection("model.embed_tokens.weight"));
  EXPECT_FALSE(IsQuantizedProjection("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(IsQuantizedProjection("model.layers.0.mlp.experts.3.down_proj.weight"));
}

// Every projection of the safetensors model, quantized by QuantizeMatrix, equals the GGUF file's
// blocks (the loader puts llama.cpp's permuted q/k rows back; quantization is per row).
TEST(QuantizeTest, ProjectionsEqualLlamaQuantizeBlocks) {
  EMBER_REQUIRE_DIR(GgufDir());
  EMBER_REQUIRE_DIR(TinyStoriesDir());
  auto float_store = WeightStore::Open(TinyStoriesDir());
  ASSERT_TRUE(float_store.ok()) << float_store.message();
  for (auto [file, dtype] : {std::pair{"ts-q8_0.gguf", DType::kQ8_0}, {"ts-q4_0.gguf", DType::kQ4_0}}) {
    auto gguf = GgufFile::Open(GgufDir() + "/" + file);
    ASSERT_TRUE(gguf.ok()) << gguf.message();
    auto shared = std::make_shared<const GgufFile>(std::move(gguf).value());
    auto config = GgufModelConfig(*shared);
    ASSERT_TRUE(config.ok()) << config.message();
    std::string summary;
    auto store = OpenGgufWeights(shared, *config, [](DType) { return true; }, &summary);
    ASSERT_TRUE(store.ok()) << store.message();
    int compared = 0;
    for (const std::string& name : (*float_store)->Names()) {
      if (!IsQuantizedProjection(name)) continue;
      auto src = (*float_store)->Get(name);
      auto want = (*store)->Get(name);
      ASSERT_TRUE(src.ok() && want.ok()) << name;
      ASSERT_EQ(want->dtype, dtype) << file << " " << name;
      auto got = QuantizeMatrix(*src, dtype, "--quantize", 2);
      ASSERT_TRUE(got.ok()) << got.message();
      ASSERT_EQ(got->size(), want->nbytes) << name;
      EXPECT_EQ(0, std::memcmp(got->data(), want->data, got->size())) << file << " " << name;
      ++compared;
    }
    EXPECT_EQ(compared, 14) << file;
    // An already-quantized tensor is refused, naming the flag.
    auto requantize = QuantizeMatrix(*(*store)->Get("model.layers.0.mlp.up_proj.weight"),
                                     DType::kQ8_0, "--quantize", 1);
    ASSERT_FALSE(requantize.ok());
    EXPECT_NE(requantize.message().find("--quantize Q8_0: tensor"), std::string::npos)
        << requantize.message();
  }
}

// The k-quant quantizers against llama-quantize: every Q4_K / Q5_K / Q6_K matrix of the small-k
// files (llama-quantize from small-k-f16.gguf, no importance matrix) equals the f16 matrix
// quantized by QuantizeMatrix, byte for byte. The files' q/k rows are in llama.cpp's order in both
// (OpenGgufWeights undoes it alike), and quantization is per row.
TEST(QuantizeTest, KQuantsEqualLlamaQuantizeBlocks) {
  EMBER_REQUIRE_DIR(GgufDir());
  auto open = [](const std::string& file) {
    auto gguf = GgufFile::Open(GgufDir() + "/" + file);
    EXPECT_TRUE(gguf.ok()) << gguf.message();
    return std::make_shared<const GgufFile>(std::move(gguf).value());
  };
  auto f16 = open("small-k-f16.gguf");
  std::map<DType, int> compared;
  for (const char* file : {"small-k-q6_k.gguf", "small-k-q5_k_m.gguf", "small-k-q4_k_m.gguf"}) {
    auto quantized = open(file);
    auto config = GgufModelConfig(*quantized);
    ASSERT_TRUE(config.ok()) << config.message();
    std::string summary;
    auto store = OpenGgufWeights(quantized, *config, [](DType) { return true; }, &summary);
    auto src_store = OpenGgufWeights(f16, *config, nullptr, &summary);
    ASSERT_TRUE(store.ok() && src_store.ok());
    for (const std::string& name : (*store)->Names()) {
      auto want = (*store)->Get(name);
      ASSERT_TRUE(want.ok()) << name;
      if (!IsKQuant(want->dtype) || !IsQuantizedProjection(name)) continue;
      auto src = (*src_store)->Get(name);
      ASSERT_TRUE(src.ok()) << name;
      auto got = QuantizeMatrix(*src, want->dtype, "--quantize", 2);
      ASSERT_TRUE(got.ok()) << got.message();
      ASSERT_EQ(got->size(), want->nbytes) << name;
      EXPECT_EQ(0, std::memcmp(got->data(), want->data, got->size()))
          << file << " " << name << " " << DTypeName(want->dtype);
      ++compared[want->dtype];
    }
  }
  EXPECT_GT(compared[DType::kQ4_K], 0);
  EXPECT_GT(compared[DType::kQ5_K], 0);
  EXPECT_GT(compared[DType::kQ6_K], 0);
  // A k-quant needs rows of a multiple of 256 values; the error names the tensor and its rows.
  auto ts = WeightStore::Open(TinyStoriesDir());
  if (!ts.ok()) return;
  auto narrow = QuantizeMatrix(*(*ts)->Get("model.layers.0.self_attn.q_proj.weight"), DType::kQ4_K,
                               "--quantize", 1);
  ASSERT_FALSE(narrow.ok());
  EXPECT_NE(narrow.message().find("multiple of 256 values (rows of 128)"), std::string::npos)
      << narrow.message();
}

std::vector<int32_t> Greedy(Model& model, const std::vector<int32_t>& prompt, size_t count) {
  const int32_t vocab = model.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> blocks(kNumBlocks), out, step = prompt;
  for (int32_t i = 0; i < kNumBlocks; ++i) blocks[size_t(i)] = i;
  int32_t pos = 0;
  while (out.size() < count) {
    BatchPlan plan;
    plan.block_size = kBlockSize;
    plan.AddSequence(step, pos, blocks, true);
    Status st = model.Forward(plan, logits);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
    pos += static_cast<int32_t>(step.size());
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i)
      if (logits[size_t(i)] > logits[size_t(best)]) best = i;
    out.push_back(best);
    step = {best};
  }
  return out;
}

// Free-running greedy tokens of the --quantize'd safetensors model equal llama.cpp's on the GGUF
// quantized the same way, up to the first step whose margin is below 0.1.
TEST(QuantizeTest, QuantizedSafetensorsModelMatchesLlamaCppGreedy) {
  EMBER_REQUIRE_DIR(GgufDir());
  EMBER_REQUIRE_DIR(TinyStoriesDir());
  const json golden = ReadJson(GgufDir() + "/golden.json");
  for (auto [file, dtype] : {std::pair{"ts-q8_0.gguf", DType::kQ8_0}, {"ts-q4_0.gguf", DType::kQ4_0}}) {
    ModelLoadOptions opts;
    opts.device = DeviceKind::kCpu;
    opts.quantize = dtype;
    auto model = Model::Load(TinyStoriesDir(), opts);
    ASSERT_TRUE(model.ok()) << model.message();
    ASSERT_TRUE((*model)->AllocateKvCache(kNumBlocks, kBlockSize).ok());
    int steps = 0;
    for (const json& c : golden["files"][file]) {
      const auto want = c["greedy"].get<std::vector<int32_t>>();
      const auto margins = c["margins"].get<std::vector<double>>();
      const auto got = Greedy(**model, c["ids"].get<std::vector<int32_t>>(), want.size());
      for (size_t s = 0; s < want.size() && margins[s] >= 0.1; ++s, ++steps)
        ASSERT_EQ(got[s], want[s]) << file << " step " << s << " (margin " << margins[s] << ")";
    }
    std::printf("--quantize %s: %d free-running steps compared\n", DTypeName(dtype), steps);
    EXPECT_GE(steps, 8) << file;
  }
}

}  // namespace
}  // namespace ember
