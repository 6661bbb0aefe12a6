// A deepseek_v3 multi-token-prediction module (ModelLoadOptions::mtp_module) checked against an
// independent computation: the one-layer model whose only layer, final norm and LM head are the
// MTP block, shared_head.norm and the shared LM head (mtp_testing.h). With +-1 embeddings (unit
// RMS, so enorm / hnorm with weight 1 keep a row, up to eps) and eh_proj chosen to pass one
// half through, the module's input row equals the model's embedding row, so its logits over a
// sequence must equal the model's: through the hidden half (eh_proj = [0 | I], hidden = the
// embedding rows), and through both halves with the hidden rows zero after position 0 (eh_proj =
// [I | I], the embedding half zeroed at position 0 as vLLM does, so the hidden half carries row
// 0). A wrong concatenation order, a missing norm, a missing position-0 mask or a block loaded
// from the wrong layer fails them; PositionZeroEmbeddingIsMasked shows the mask is there. The same
// for qwen3_next's module (mtp.*: (1 + w) norms, no mask).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/mtp_testing.h"
#include "util/testing.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using testing::MtpCheckpointOptions;

std::string Fixture(const std::string& name) { return testing::FixturesDir() + "/models/" + name; }

std::string TempDir(const std::string& name) {
  return (fs::temp_directory_path() /
          ("ember_mtp_test_" + name + "_" + std::to_string(::getpid())))
      .string();
}

const std::vector<int32_t> kTokens = {5, 17, 300, 42, 7, 99, 256, 3, 11, 480, 64};

std::unique_ptr<Model> Load(const std::string& dir, bool mtp) {
  ModelLoadOptions opts;
  opts.mtp_module = mtp;
  auto model = Model::Load(dir, opts);
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return nullptr;
  EXPECT_TRUE((*model)->AllocateKvCache(4, 16).ok());
  return std::move(*model);
}

// Every row's logits of `tokens` (and each row's final hidden state), fed in two chunks; an MTP
// module gets `hidden` rows.
std::vector<float> Logits(Model& model, const std::vector<float>& hidden,
                          std::vector<float>* final_hidden = nullptr) {
  const auto vocab = static_cast<size_t>(model.config().vocab_size);
  const auto d = static_cast<size_t>(model.config().hidden_size);
  std::vector<float> all;
  const size_t split = 4;
  for (size_t begin : {size_t{0}, split}) {
    const size_t end = begin == 0 ? split : kTokens.size();
    BatchPlan plan;
    plan.block_size = 16;
    plan.AddSequence(std::vector<int32_t>(kTokens.begin() + static_cast<ptrdiff_t>(begin),
                                          kTokens.begin() + static_cast<ptrdiff_t>(end)),
                     static_cast<int32_t>(begin), {0}, false);
    for (int32_t r = 0; r < plan.num_tokens(); ++r) plan.logits_rows.push_back(r);
    std::vector<float> logits((end - begin) * vocab), last((end - begin) * d);
    StepOutputs out{logits, {}, {}, {}};
    out.final_hidden = last;
    std::vector<float> rows;
    if (model.is_mtp_module()) {
      rows.assign(hidden.begin() + static_cast<ptrdiff_t>(begin * d),
                  hidden.begin() + static_cast<ptrdiff_t>(end * d));
      out.mtp_hidden = rows;
    }
    const Status st = model.Forward(plan, out);
    EXPECT_TRUE(st.ok()) << st.message();
    all.insert(all.end(), logits.begin(), logits.end());
    if (final_hidden != nullptr) final_hidden->insert(final_hidden->end(), last.begin(), last.end());
  }
  return all;
}

// The +-1 embedding rows of kTokens in the checkpoint at dir; rows from `zero_from` on are zero.
std::vector<float> EmbeddingRows(const std::string& dir, size_t zero_from) {
  for (const testing::NamedF32& t : testing::ReadF32Tensors(dir + "/model.safetensors")) {
    if (t.name != "model.embed_tokens.weight") continue;
    const auto d = static_cast<size_t>(t.shape[1]);
    std::vector<float> rows(kTokens.size() * d, 0.0f);
    for (size_t i = 0; i < std::min(zero_from, kTokens.size()); ++i)
      std::copy_n(t.data.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(kTokens[i]) * d),
                  d, rows.begin() + static_cast<ptrdiff_t>(i * d));
    return rows;
  }
  ADD_FAILURE() << "no embedding in " << dir;
  return {};
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0f, std::fabs(b[i])));
  return worst;
}

void ExpectModuleMatchesModel(MtpCheckpointOptions::EhProj eh, size_t hidden_zero_from,
                              const std::string& name, const std::string& fixture = "deepseek_v3") {
  EMBER_REQUIRE_DIR(Fixture(fixture));
  const std::string dir = TempDir(name);
  MtpCheckpointOptions options;
  options.one_layer = true;
  options.eh = eh;
  testing::WriteMtpCheckpoint(Fixture(fixture), dir, options);
  auto model = Load(dir, false);
  auto mtp = Load(dir, true);
  ASSERT_NE(model, nullptr);
  ASSERT_NE(mtp, nullptr);
  EXPECT_EQ(mtp->config().num_layers, 1);
  EXPECT_TRUE(mtp->is_mtp_module());
  std::vector<float> model_hidden, mtp_hidden;
  const std::vector<float> want = Logits(*model, {}, &model_hidden);
  const std::vector<float> got = Logits(*mtp, EmbeddingRows(dir, hidden_zero_from), &mtp_hidden);
  EXPECT_LT(MaxDiff(got, want), 1e-3f);
  // The rows' hidden states before the final norm (what drafts chain on) agree too.
  EXPECT_LT(MaxDiff(mtp_hidden, model_hidden), 1e-3f);
  fs::remove_all(dir);
}

TEST(MtpModuleTest, HiddenHalfReproducesTheOneLayerModel) {
  ExpectModuleMatchesModel(MtpCheckpointOptions::EhProj::kHiddenHalf, kTokens.size(), "hidden");
}

TEST(MtpModuleTest, EmbeddingHalfMaskedAtPositionZeroReproducesTheOneLayerModel) {
  ExpectModuleMatchesModel(MtpCheckpointOptions::EhProj::kBothHalves, 1, "both");
}

// qwen3_next's module (mtp.*): through the hidden half, and through both halves with no position-0
// mask (its hidden rows zero everywhere, so only the embedding half carries).
TEST(MtpModuleTest, Qwen3NextModuleReproducesTheOneLayerModel) {
  ExpectModuleMatchesModel(MtpCheckpointOptions::EhProj::kHiddenHalf, kTokens.size(), "next_h",
                           "qwen3_next");
  ExpectModuleMatchesModel(MtpCheckpointOptions::EhProj::kBothHalves, 0, "next_e", "qwen3_next");
}

// The embedding half alone: row 0's input is zero (masked), so the logits differ from the
// model's there (and after it, through the KV); a module without the mask would match.
TEST(MtpModuleTest, PositionZeroEmbeddingIsMasked) {
  EMBER_REQUIRE_DIR(Fixture("deepseek_v3"));
  const std::string dir = TempDir("mask");
  MtpCheckpointOptions options;
  options.one_layer = true;
  options.eh = MtpCheckpointOptions::EhProj::kEmbeddingHalf;
  testing::WriteMtpCheckpoint(Fixture("deepseek_v3"), dir, options);
  auto model = Load(dir, false);
  auto mtp = Load(dir, true);
  ASSERT_NE(model, nullptr);
  ASSERT_NE(mtp, nullptr);
  const std::vector<float> want = Logits(*model, {});
  const std::vector<float> got = Logits(*mtp, EmbeddingRows(dir, 0));
  const auto vocab = static_cast<size_t>(model->config().vocab_size);
  const std::vector<float> want0(want.begin(), want.begin() + static_cast<ptrdiff_t>(vocab));
  const std::vector<float> got0(got.begin(), got.begin() + static_cast<ptrdiff_t>(vocab));
  EXPECT_GT(MaxDiff(got0, want0), 1e-2f);
  fs::remove_all(dir);
}

// StepOutputs::final_hidden is each row's hidden state before the final norm: the final norm
// and the LM head applied to it on the host give the step's logits (deepseek_v3: plain RMSNorm;
// qwen3_next: (1 + w), its own forward's end).
TEST(MtpModuleTest, FinalHiddenIsTheHiddenStateBeforeTheFinalNorm) {
  for (const std::string name : {"deepseek_v3", "qwen3_next"}) {
    EMBER_REQUIRE_DIR(Fixture(name));
    auto model = Load(Fixture(name), false);
    ASSERT_NE(model, nullptr);
    const ModelConfig& c = model->config();
    std::vector<float> hidden;
    const std::vector<float> logits = Logits(*model, {}, &hidden);
    std::vector<float> norm, head;
    for (const testing::NamedF32& t : testing::ReadF32Tensors(Fixture(name) + "/model.safetensors")) {
      if (t.name == "model.norm.weight") norm = t.data;
      if (t.name == "lm_head.weight") head = t.data;
    }
    ASSERT_FALSE(norm.empty() || head.empty()) << name;
    const auto d = static_cast<size_t>(c.hidden_size), vocab = static_cast<size_t>(c.vocab_size);
    const bool one_plus = name == "qwen3_next";
    std::vector<float> want(logits.size());
    for (size_t r = 0; r < kTokens.size(); ++r) {
      const float* h = hidden.data() + r * d;
      double ss = 0;
      for (size_t i = 0; i < d; ++i) ss += double{h[i]} * h[i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + c.rms_norm_eps);
      for (size_t v = 0; v < vocab; ++v) {
        double dot = 0;
        for (size_t i = 0; i < d; ++i)
          dot += h[i] * inv * (one_plus ? 1.0 + norm[i] : norm[i]) * head[v * d + i];
        want[r * vocab + v] = static_cast<float>(dot);
      }
    }
    EXPECT_LT(MaxDiff(logits, want), 1e-3f) << name;
  }
}

TEST(MtpModuleTest, RefusalsNameTheReason) {
  EMBER_REQUIRE_DIR(Fixture("deepseek_v3"));
  ModelLoadOptions opts;
  opts.mtp_module = true;
  // The fixture's conversion dropped the MTP tensors (num_nextn_predict_layers is 1).
  auto none = Model::Load(Fixture("deepseek_v3"), opts);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("no multi-token-prediction weights"), std::string::npos)
      << none.message();
  EXPECT_NE(none.message().find("model.layers.3.eh_proj.weight"), std::string::npos)
      << none.message();
  if (testing::DirExists(Fixture("llama3"))) {
    auto llama = Model::Load(Fixture("llama3"), opts);
    ASSERT_FALSE(llama.ok());
    EXPECT_NE(llama.message().find("\"llama\" has no multi-token-prediction module"),
              std::string::npos)
        << llama.message();
  }
  if (testing::DirExists(Fixture("qwen3_next"))) {  // its conversion dropped mtp.* too
    auto next = Model::Load(Fixture("qwen3_next"), opts);
    ASSERT_FALSE(next.ok());
    EXPECT_NE(next.message().find("mtp.fc.weight"), std::string::npos) << next.message();
  }
  // StepOutputs::mtp_hidden is refused by a model that is not an MTP module.
  auto model = Model::Load(Fixture("deepseek_v3"), ModelLoadOptions{});
  ASSERT_TRUE(model.ok()) << model.message();
  ASSERT_TRUE((*model)->AllocateKvCache(4, 16).ok());
  BatchPlan plan;
  plan.AddSequence({1, 2}, 0, {0}, true);
  std::vector<float> logits(static_cast<size_t>((*model)->config().vocab_size));
  std::vector<float> hidden(2 * static_cast<size_t>((*model)->config().hidden_size));
  StepOutputs out{logits, {}, {}, {}};
  out.mtp_hidden = hidden;
  EXPECT_FALSE((*model)->Forward(plan, out).ok());
}

}  // namespace
}  // namespace ember
