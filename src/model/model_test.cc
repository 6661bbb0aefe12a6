// Parity with the transformers reference: logits at every position of every golden sequence
// within relative L2 error 1e-4 of golden_logits.safetensors, and greedy continuations identical
// to golden.json, for each dense family, loading both config.json (5.x) and config.v4.json (4.x).
// Also: batched == solo (bitwise) for mixed prefill-chunk and decode rows.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <sstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta.h"
#include "backend/cuda_loader.h"
#include "backend/threshold_sampling.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "util/mapped_file.h"
#include "util/testing.h"

namespace ember {
namespace {

using json = nlohmann::json;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kNumBlocks = 64;

std::string ModelDir(const std::string& name) {
  return ember::testing::FixturesDir() + "/models/" + name;
}

// f32_compute: CUDA f32 weights and GEMMs, and the CPU's exact kernels (or `cpu_matmul`); else
// bf16 on both (the CPU's bf16 dot-product kernels for prefill).
std::unique_ptr<Model> LoadOrDie(const std::string& dir, const std::string& config_file,
                                 DeviceKind device = DeviceKind::kCpu, bool f32_compute = true,
                                 CpuMatmul cpu_matmul = CpuMatmul::kExact) {
  ModelLoadOptions opts;
  opts.config_file = config_file;
  opts.device = device;
  opts.cuda_f32_compute = f32_compute;  // CUDA parity mode: f32 weights and GEMMs
  opts.cpu_matmul = f32_compute ? cpu_matmul : CpuMatmul::kBf16;
  auto model = Model::Load(dir, opts);
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return nullptr;
  EXPECT_TRUE((*model)->AllocateKvCache(kNumBlocks, kBlockSize).ok());
  return std::move(model).value();
}

std::vector<int32_t> Blocks(int32_t first, int32_t count) {
  std::vector<int32_t> b;
  for (int32_t i = 0; i < count; ++i) b.push_back(first + i);
  return b;
}

// Prefills `tokens` with logits at every row; returns [len, vocab].
std::vector<float> PrefillAllLogits(Model& model, const std::vector<int32_t>& tokens) {
  BatchPlan plan;
  plan.block_size = kBlockSize;
  plan.AddSequence(tokens, 0, Blocks(0, kNumBlocks), false);
  for (int32_t i = 0; i < plan.num_tokens(); ++i) plan.logits_rows.push_back(i);
  std::vector<float> logits(tokens.size() * static_cast<size_t>(model.config().vocab_size));
  Status st = model.Forward(plan, logits);
  EXPECT_TRUE(st.ok()) << st.message();
  return logits;
}

int32_t Argmax(const float* v, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

// Prefill then `count` single-token decode steps; returns the greedy tokens.
std::vector<int32_t> Greedy(Model& model, const std::vector<int32_t>& prompt, size_t count) {
  const int32_t vocab = model.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<int32_t> out;
  std::vector<int32_t> step = prompt;
  int32_t pos = 0;
  while (out.size() < count) {
    BatchPlan plan;
    plan.block_size = kBlockSize;
    plan.AddSequence(step, pos, Blocks(0, kNumBlocks), true);
    Status st = model.Forward(plan, logits);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
    pos += static_cast<int32_t>(step.size());
    out.push_back(Argmax(logits.data(), vocab));
    step = {out.back()};
  }
  return out;
}

double RelativeL2(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void CheckLogits(const std::vector<float>& logits, const TensorView& golden, int32_t vocab,
                 const std::string& what) {
  ASSERT_EQ(golden.dtype, DType::kF32);
  ASSERT_EQ(golden.nbytes / 4, logits.size()) << what;
  const float* ref = static_cast<const float*>(golden.data);
  const int64_t rows = static_cast<int64_t>(logits.size()) / vocab;
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r)
    worst = std::max(worst, RelativeL2(logits.data() + r * vocab, ref + r * vocab, vocab));
  EXPECT_LT(worst, 1e-4) << what << ": worst per-position relative L2 error";
}

void RunParity(const std::string& name, const std::string& config_file,
               DeviceKind device = DeviceKind::kCpu, CpuMatmul cpu_matmul = CpuMatmul::kExact) {
  const std::string dir = ModelDir(name);
  auto model = LoadOrDie(dir, config_file, device, true, cpu_matmul);
  ASSERT_NE(model, nullptr);
  auto golden_text = ReadFileToString(dir + "/golden.json");
  ASSERT_TRUE(golden_text.ok());
  json golden = json::parse(*golden_text);
  auto golden_logits = WeightStore::OpenFile(dir + "/golden_logits.safetensors");
  ASSERT_TRUE(golden_logits.ok()) << golden_logits.message();
  const int32_t vocab = model->config().vocab_size;
  int checked = 0;
  for (auto& [seq_name, ids] : golden["sequences"].items()) {
    std::vector<int32_t> tokens = ids.get<std::vector<int32_t>>();
    auto ref = (*golden_logits)->Get("logits." + seq_name);
    ASSERT_TRUE(ref.ok()) << ref.message();
    CheckLogits(PrefillAllLogits(*model, tokens), *ref, vocab, name + "/" + seq_name);
    ++checked;
  }
  EXPECT_GT(checked, 0);
  for (auto& [seq_name, expected] : golden["greedy"].items()) {
    std::vector<int32_t> want = expected.get<std::vector<int32_t>>();
    std::vector<int32_t> prompt = golden["sequences"][seq_name].get<std::vector<int32_t>>();
    EXPECT_EQ(Greedy(*model, prompt, want.size()), want) << name << "/" << seq_name;
  }
}

class ParityTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(ParityTest, LogitsAndGreedyMatchTransformers) {
  const auto& [name, config_file] = GetParam();
  EMBER_REQUIRE_DIR(ModelDir(name));
  RunParity(name, config_file);
}

INSTANTIATE_TEST_SUITE_P(Families, ParityTest,
                         ::testing::Combine(::testing::Values("llama3", "qwen2", "qwen3",
                                                              "qwen3_moe", "gpt_oss", "mistral",
                                                              "phi3", "gemma2", "gemma3",
                                                              "deepseek_v3", "qwen3_next"),
                                            ::testing::Values("config.json", "config.v4.json")),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The same goldens and tolerance with the CPU's AVX-512 FMA tiles for prefill-sized products
// (--cpu-matmul f32: float32 like the exact kernels, another summation order).
class CpuF32FastParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuF32FastParityTest, LogitsAndGreedyMatchTransformers) {
  if (!CpuHasF32Fast()) GTEST_SKIP() << "this CPU has no AVX-512";
  EMBER_REQUIRE_DIR(ModelDir(GetParam()));
  RunParity(GetParam(), "config.json", DeviceKind::kCpu, CpuMatmul::kF32);
}

INSTANTIATE_TEST_SUITE_P(Families, CpuF32FastParityTest,
                         ::testing::Values("llama3", "qwen2", "qwen3", "qwen3_moe", "gpt_oss",
                                           "mistral", "phi3", "gemma2", "gemma3", "deepseek_v3",
                                           "qwen3_next"));

// The same goldens through Model on the CUDA backend (f32 compute mode), where a GPU exists.
class CudaParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaParityTest, LogitsAndGreedyMatchTransformers) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  EMBER_REQUIRE_DIR(ModelDir(GetParam()));
  RunParity(GetParam(), "config.json", DeviceKind::kCuda);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaParityTest,
                         ::testing::Values("llama3", "qwen2", "qwen3", "qwen3_moe", "gpt_oss",
                                           "mistral", "phi3", "gemma2", "gemma3", "deepseek_v3",
                                           "qwen3_next"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The per-row state snapshots (SequenceSlice::snapshot_slot: speculation's rollback on a hybrid
// model): after one 6-row step, decoding row r + 1 from the snapshot after row r gives the logits
// a fresh prefill of rows 0..r + 1 gives; a snapshot range past the slots is refused.
TEST(ModelTest, Qwen3NextStateSnapshotsAreTheRowStates) {
  EMBER_REQUIRE_DIR(ModelDir("qwen3_next"));
  auto loaded = Model::Load(ModelDir("qwen3_next"), ModelLoadOptions{});
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  Model& model = **loaded;
  ASSERT_TRUE(model.AllocateKvCache(kNumBlocks, kBlockSize, 8).ok());
  const auto vocab = static_cast<size_t>(model.config().vocab_size);
  const std::vector<int32_t> tokens = {1, 80, 147, 201, 282, 57};
  auto forward = [&](const std::vector<int32_t>& rows, int32_t pos, int32_t block, int32_t slot,
                     int32_t snapshot_slot) {
    BatchPlan plan;
    plan.block_size = kBlockSize;
    plan.AddSequence(rows, pos, {block}, true);
    plan.seqs.back().state_slot = slot;
    plan.seqs.back().snapshot_slot = snapshot_slot;
    std::vector<float> logits(vocab);
    Status st = model.Forward(plan, logits);
    EXPECT_TRUE(st.ok()) << st.message();
    return logits;
  };
  forward(tokens, 0, 0, 0, 3);  // slot 0, snapshots after rows 0..4 in slots 3..7
  for (int32_t r = 0; r + 1 < static_cast<int32_t>(tokens.size()); ++r) {
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + r + 2);
    const std::vector<float> want = forward(prefix, 0, 1, 1, -1);  // from zero, block 1, slot 1
    ASSERT_TRUE(model.CopyStateSlot(3 + r, 2).ok());
    const std::vector<float> got = forward({tokens[static_cast<size_t>(r) + 1]}, r + 1, 0, 2, -1);
    float worst = 0.0f;
    for (size_t i = 0; i < vocab; ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LT(worst, 1e-4f) << "snapshot after row " << r;
  }
  BatchPlan past;
  past.block_size = kBlockSize;
  past.AddSequence(tokens, 0, {0}, true);
  past.seqs.back().snapshot_slot = 4;  // rows 0..4 would need slots 4..8 of 8
  std::vector<float> logits(vocab);
  EXPECT_FALSE(model.Forward(past, logits).ok());
}

// A long prompt in one step: with the chunked delta rule (CpuBackendOptions::chunked_delta_rule)
// it runs in chunks (cpu/gated_delta.h: 240 rows are 3 chunks of 64 and one of 48) and every
// row's logits agree with 16-row steps (token by token) to float rounding (5e-5 of the largest
// logit); without it (the default) they are bitwise equal.
TEST(ModelTest, Qwen3NextChunkedPrefillMatchesTokenSteps) {
  EMBER_REQUIRE_DIR(ModelDir("qwen3_next"));
  const int32_t len = 240, step = 16;  // max_position_embeddings 256
  static_assert(len >= cpu::kDeltaChunkMinRows && step < cpu::kDeltaChunkMinRows);
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(len);
  for (int32_t& t : tokens) t = 1 + static_cast<int32_t>(rng() % 500);
  for (const bool chunked : {false, true}) {
    ModelLoadOptions opts;
    opts.cpu_chunked_delta_rule = chunked;
    auto loaded = Model::Load(ModelDir("qwen3_next"), opts);
    ASSERT_TRUE(loaded.ok()) << loaded.message();
    Model& model = **loaded;
    ASSERT_TRUE(model.AllocateKvCache(kNumBlocks, kBlockSize).ok());
    const std::vector<float> whole = PrefillAllLogits(model, tokens);
    const auto vocab = static_cast<size_t>(model.config().vocab_size);
    std::vector<float> stepped(whole.size());
    for (int32_t first = 0; first < len; first += step) {
      BatchPlan plan;
      plan.block_size = kBlockSize;
      plan.AddSequence(std::vector<int32_t>(tokens.begin() + first, tokens.begin() + first + step),
                       first, Blocks(0, kNumBlocks), false);
      for (int32_t i = 0; i < step; ++i) plan.logits_rows.push_back(i);
      ASSERT_TRUE(
          model.Forward(plan, std::span(stepped).subspan(first * vocab, step * vocab)).ok());
    }
    float worst = 0.0f, scale = 0.0f;
    for (size_t i = 0; i < whole.size(); ++i) {
      worst = std::max(worst, std::fabs(whole[i] - stepped[i]));
      scale = std::max(scale, std::fabs(stepped[i]));
    }
    if (!chunked) {
      EXPECT_EQ(whole, stepped) << "the token loop splits bitwise";
      continue;
    }
    EXPECT_GT(worst, 0.0f) << "the chunked form ran";
    EXPECT_LT(worst, 5e-5f * scale) << "largest logit " << scale;
    std::printf("chunked vs token-loop prefill: largest logit difference %.3g of %.3g\n", worst,
                scale);
  }
}

// The CUDA backend in its production bf16 mode: logits within relative L2 3e-2 of the goldens
// (mixture-of-experts models: most positions, see below), and greedy tokens identical wherever the choice is clear of the bf16 error: a step may differ
// only where our own top-1/top-2 margin is below twice the largest absolute logit error seen on
// that sequence's prefill (after which the continuations legitimately diverge), and not at all
// when the golden's smallest margin over the whole generation exceeds that bound.
// bf16 arithmetic (the CUDA backend's default; the CPU's --cpu-matmul bf16) against the float32
// goldens: every position's logits within 3e-2 relative L2, and greedy steps equal wherever the
// golden's margin is clear of twice the largest logit error seen.
void CheckBf16Parity(const std::string& name, DeviceKind device) {
  const std::string dir = ModelDir(name);
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadOrDie(dir, "config.json", device, /*f32_compute=*/false);
  ASSERT_NE(model, nullptr);
  json golden = json::parse(*ReadFileToString(dir + "/golden.json"));
  auto golden_logits = WeightStore::OpenFile(dir + "/golden_logits.safetensors");
  ASSERT_TRUE(golden_logits.ok()) << golden_logits.message();
  const int32_t vocab = model->config().vocab_size;
  const double golden_margin = golden["min_greedy_margin"].get<double>();
  for (auto& [seq_name, expected] : golden["greedy"].items()) {
    SCOPED_TRACE(name + "/" + seq_name);
    const std::vector<int32_t> prompt = golden["sequences"][seq_name].get<std::vector<int32_t>>();
    auto ref = (*golden_logits)->Get("logits." + seq_name);
    ASSERT_TRUE(ref.ok()) << ref.message();
    const float* want_logits = static_cast<const float*>(ref->data);
    const std::vector<float> logits = PrefillAllLogits(*model, prompt);
    double worst_rel = 0, max_abs = 0;
    size_t off_positions = 0;  // beyond 3e-2
    for (size_t r = 0; r < prompt.size(); ++r) {
      const size_t off = r * static_cast<size_t>(vocab);
      const double rel = RelativeL2(logits.data() + off, want_logits + off, vocab);
      worst_rel = std::max(worst_rel, rel);
      if (rel >= 3e-2) {
        ++off_positions;
        std::printf("%s/%s position %zu: relative L2 %.4f\n", name.c_str(), seq_name.c_str(), r,
                    rel);
      }
      for (int32_t j = 0; j < vocab; ++j)
        max_abs = std::max(max_abs,
                           std::abs(static_cast<double>(logits[off + j]) - want_logits[off + j]));
    }
    if (model->config().num_experts == 0) {
      EXPECT_LT(worst_rel, 3e-2) << "worst per-position relative L2 error";
    } else {
      // A mixture of experts routes discontinuously: where the golden chose an expert by a hair,
      // the bf16 error may choose the other one, which moves that position (and the positions
      // attending to it) by far more than the error itself. So: most positions within 3e-2, and
      // no position beyond 0.25.
      EXPECT_LE(off_positions, (prompt.size() + 7) / 8) << "positions beyond 3e-2";
      EXPECT_LT(worst_rel, 0.25) << "worst per-position relative L2 error";
    }
    const double bound = 2 * max_abs;

    // Greedy decode with our margins.
    const std::vector<int32_t> want = expected.get<std::vector<int32_t>>();
    std::vector<float> step_logits(static_cast<size_t>(vocab));
    std::vector<int32_t> step = prompt;
    int32_t pos = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      BatchPlan plan;
      plan.block_size = kBlockSize;
      plan.AddSequence(step, pos, Blocks(0, kNumBlocks), true);
      ASSERT_TRUE(model->Forward(plan, step_logits).ok());
      pos += static_cast<int32_t>(step.size());
      const int32_t top = Argmax(step_logits.data(), vocab);
      float second = -INFINITY;
      for (int32_t j = 0; j < vocab; ++j)
        if (j != top) second = std::max(second, step_logits[static_cast<size_t>(j)]);
      const double margin = static_cast<double>(step_logits[static_cast<size_t>(top)]) - second;
      if (top != want[i]) {
        EXPECT_LT(golden_margin, bound) << "the golden's choices are all clear of the bf16 error ("
                                        << bound << ") but step " << i << " differs";
        EXPECT_LT(margin, bound) << "step " << i << ": " << top << " vs golden " << want[i]
                                 << " with a clear margin " << margin;
        break;  // from here the continuations legitimately diverge
      }
      step = {top};
    }
  }
}

class CudaBf16ParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBf16ParityTest, LogitsCloseAndClearGreedyStepsMatch) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CheckBf16Parity(GetParam(), DeviceKind::kCuda);
}

class CpuBf16ParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuBf16ParityTest, LogitsCloseAndClearGreedyStepsMatch) {
  if (!CpuHasBf16Dot()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  CheckBf16Parity(GetParam(), DeviceKind::kCpu);
}

// qwen3_next is left out of the bf16 suites: its tiny random fixture amplifies bf16 rounding
// through the recurrent state (CPU and CUDA bf16 give the same per-position errors, up to 0.30
// relative L2 on the long sequence, 21 of 48 positions beyond 3e-2; docs/perf.md session 38);
// its float32 parity (above) is exact on both backends.
INSTANTIATE_TEST_SUITE_P(Families, CpuBf16ParityTest,
                         ::testing::Values("llama3", "qwen2", "qwen3", "qwen3_moe", "gpt_oss",
                                           "mistral", "phi3", "gemma2", "gemma3", "deepseek_v3"));

// On CUDA deepseek_v3 is left out too: one position of its short sequence (of 5) is at 0.46
// relative L2, past the MoE bound of 0.25 (a routing flip on the random fixture: every other
// position within 3e-2; H100, session 38); its float32 parity is exact.
INSTANTIATE_TEST_SUITE_P(Families, CudaBf16ParityTest,
                         ::testing::Values("llama3", "qwen2", "qwen3", "qwen3_moe", "gpt_oss",
                                           "mistral", "phi3", "gemma2", "gemma3"));

// StepOutputs with argmax and sampled rows: the backend's ids equal the argmax / ThresholdSample
// of the logits a plain Forward gives, and the copied rows' logits are the same bits.
void CheckArgmaxRows(DeviceKind device) {
  const std::string dir = ModelDir("tinystories-656k");
  auto model = LoadOrDie(dir, "config.json", device);
  ASSERT_NE(model, nullptr);
  const int32_t vocab = model->config().vocab_size;
  const std::vector<int32_t> tokens = {1, 80, 147, 201, 282, 57, 9, 33, 121};
  const std::vector<float> full = PrefillAllLogits(*model, tokens);
  BatchPlan plan;
  plan.block_size = kBlockSize;
  plan.AddSequence(tokens, 0, Blocks(0, kNumBlocks), false);
  for (int32_t i = 0; i < plan.num_tokens(); ++i) plan.logits_rows.push_back(i);
  const size_t rows = tokens.size();
  std::vector<float> logits(rows * static_cast<size_t>(vocab), -1.0f);
  // Runs of copied rows between argmax and sampled rows.
  std::vector<RowOutput> kinds(rows);
  std::vector<RowSampling> sampling(rows);
  for (size_t r = 0; r < rows; ++r) {
    kinds[r] = r % 3 == 1 ? RowOutput::kCopy : r % 3 == 0 ? RowOutput::kArgmax : RowOutput::kSample;
    sampling[r] = {0.9f, r % 2 == 0 ? 0 : 40, 0.95f, 0.0f, 0.1 * static_cast<double>(r)};
  }
  std::vector<int32_t> ids(rows, -1);
  Status st = model->Forward(plan, StepOutputs{logits, kinds, sampling, ids});
  ASSERT_TRUE(st.ok()) << st.message();
  for (size_t r = 0; r < rows; ++r) {
    const float* want = full.data() + r * static_cast<size_t>(vocab);
    if (kinds[r] == RowOutput::kArgmax) {
      EXPECT_EQ(ids[r], Argmax(want, vocab)) << "row " << r;
    } else if (kinds[r] == RowOutput::kSample) {
      EXPECT_EQ(ids[r], ThresholdSample({want, static_cast<size_t>(vocab)}, sampling[r]))
          << "row " << r;
    } else {
      EXPECT_EQ(std::memcmp(logits.data() + r * static_cast<size_t>(vocab), want,
                            static_cast<size_t>(vocab) * sizeof(float)),
                0)
          << "row " << r;
    }
  }
  std::vector<int32_t> bad_ids(rows - 1);
  EXPECT_FALSE(model->Forward(plan, StepOutputs{logits, kinds, sampling, bad_ids}).ok());
}

// Fed tokens: a step launched with defer_ids, then (before its ids are read) a decode step whose
// rows take those ids as fed tokens (-1 - r), gives the same logits bits as the same two steps
// run with the ids read in between and passed explicitly; WaitIds then delivers the first
// step's ids. A fed token that names a row which made no id is an error.
void CheckFedTokens(DeviceKind device) {
  const std::string dir = ModelDir("tinystories-656k");
  auto model = LoadOrDie(dir, "config.json", device);
  ASSERT_NE(model, nullptr);
  const int32_t vocab = model->config().vocab_size;
  const std::vector<int32_t> a = {1, 80, 147, 201, 282}, b = {57, 9, 33};
  BatchPlan first;
  first.block_size = kBlockSize;
  first.AddSequence(a, 0, Blocks(0, 4), true);
  first.AddSequence(b, 0, Blocks(4, 4), true);
  const std::vector<RowOutput> kinds = {RowOutput::kSample, RowOutput::kArgmax};
  const std::vector<RowSampling> sampling = {{0.9f, 40, 0.95f, 0.0f, 0.37}, {}};
  std::vector<float> no_logits(2 * static_cast<size_t>(vocab));
  auto decode = [&](int32_t token_a, int32_t token_b) {
    BatchPlan plan;
    plan.block_size = kBlockSize;
    plan.AddSequence({token_a}, static_cast<int32_t>(a.size()), Blocks(0, 4), true);
    plan.AddSequence({token_b}, static_cast<int32_t>(b.size()), Blocks(4, 4), true);
    return plan;
  };
  // Explicit: read the ids, then feed them.
  std::vector<int32_t> ids(2, -1);
  ASSERT_TRUE(model->Forward(first, StepOutputs{no_logits, kinds, sampling, ids}).ok());
  std::vector<float> want(2 * static_cast<size_t>(vocab));
  ASSERT_TRUE(model->Forward(decode(ids[0], ids[1]), want).ok());
  // Fed: the decode step is launched before the ids are read.
  std::vector<int32_t> deferred(2, -1);
  StepOutputs outputs{no_logits, kinds, sampling, deferred};
  outputs.defer_ids = true;
  ASSERT_TRUE(model->Forward(first, outputs).ok());
  std::vector<float> got(2 * static_cast<size_t>(vocab));
  Status st = model->Forward(decode(-1, -2), got);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(model->WaitIds().ok());
  EXPECT_EQ(deferred, ids);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  // The last step copied its logits: it made no ids to feed.
  st = model->Forward(decode(-1, -2), got);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("made no id"), std::string::npos) << st.message();
  // A kCopy row makes no id either, nor does a row past the step's.
  const std::vector<RowOutput> one_copied = {RowOutput::kArgmax, RowOutput::kCopy};
  ASSERT_TRUE(model->Forward(first, StepOutputs{no_logits, one_copied, sampling, ids}).ok());
  EXPECT_FALSE(model->Forward(decode(-1, -2), got).ok());
  ASSERT_TRUE(model->Forward(first, StepOutputs{no_logits, kinds, sampling, ids}).ok());
  EXPECT_FALSE(model->Forward(decode(-1, -3), got).ok());
  EXPECT_TRUE(model->Forward(decode(-2, -1), got).ok());
  // defer_ids with a kCopy row is refused.
  outputs.row_kinds = one_copied;
  EXPECT_FALSE(model->Forward(first, outputs).ok());
}

TEST(TinyStoriesTest, FedTokensOnCpu) {
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  CheckFedTokens(DeviceKind::kCpu);
}

TEST(TinyStoriesTest, FedTokensOnCuda) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  CheckFedTokens(DeviceKind::kCuda);
}

TEST(TinyStoriesTest, ArgmaxRowsOnCpu) {
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  CheckArgmaxRows(DeviceKind::kCpu);
}

TEST(TinyStoriesTest, ArgmaxRowsOnCuda) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  EMBER_REQUIRE_DIR(ModelDir("tinystories-656k"));
  CheckArgmaxRows(DeviceKind::kCuda);
}

TEST(TinyStoriesTest, LogitsAndGreedyMatchTransformers) {
  const std::string dir = ModelDir("tinystories-656k");
  EMBER_REQUIRE_DIR(dir);
  auto model = LoadOrDie(dir, "config.json");
  ASSERT_NE(model, nullptr);
  json golden = json::parse(*ReadFileToString(dir + "/golden.json"));
  auto golden_logits = WeightStore::OpenFile(dir + "/golden_logits.safetensors");
  ASSERT_TRUE(golden_logits.ok()) << golden_logits.message();
  const int32_t vocab = model->config().vocab_size;
  ASSERT_GE(golden["prompts"].size(), 1u);
  EXPECT_EQ(golden["prompts"][0]["ids"].get<std::vector<int32_t>>(),
            (std::vector<int32_t>{1, 80, 147, 201, 282, 57}));
  for (size_t i = 0; i < golden["prompts"].size(); ++i) {
    const json& p = golden["prompts"][i];
    std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    auto ref = (*golden_logits)->Get("logits." + std::to_string(i));
    ASSERT_TRUE(ref.ok()) << ref.message();
    CheckLogits(PrefillAllLogits(*model, ids), *ref, vocab, "tinystories/" + std::to_string(i));
    std::vector<int32_t> want = p["greedy_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(want.size(), i == 0 ? 64u : want.size());
    EXPECT_EQ(Greedy(*model, ids, want.size()), want) << "prompt " << i;
  }
}

// Three sequences in one plan (a fresh prefill, a decode row, a second prefill chunk) give
// bitwise the same logits as each run alone.
TEST(BatchInvarianceTest, BatchedEqualsSoloBitwise) {
  for (const std::string name : {"qwen3", "qwen3_moe", "gpt_oss", "gemma3", "deepseek_v3"}) {
    EMBER_REQUIRE_DIR(ModelDir(name));
    auto model = LoadOrDie(ModelDir(name), "config.json");
    ASSERT_NE(model, nullptr);
    const int32_t vocab = model->config().vocab_size;
    std::vector<int32_t> a = {1,  17,  300, 42, 42, 8, 511, 99, 250, 3,
                              77, 128, 5,   6,  7,  8, 9,   10, 11};
    std::vector<int32_t> b_prompt = {1, 5, 9, 200, 201, 202, 17};
    std::vector<int32_t> c_prompt = {1, 400, 401, 402, 403};
    std::vector<int32_t> c_chunk = {404, 405, 406, 407, 408, 409, 410, 411, 412, 413,
                                    414, 415, 416, 417, 418, 419, 420, 421, 422};
    const auto blocks_a = Blocks(0, 4), blocks_b = Blocks(10, 4), blocks_c = Blocks(20, 4);
    auto run =
        [&](const std::vector<std::tuple<std::vector<int32_t>, int32_t, std::vector<int32_t>>>&
                seqs) {
          BatchPlan plan;
          plan.block_size = kBlockSize;
          for (const auto& [tokens, first, blocks] : seqs)
            plan.AddSequence(tokens, first, blocks, false);
          for (int32_t i = 0; i < plan.num_tokens(); ++i) plan.logits_rows.push_back(i);
          std::vector<float> logits(static_cast<size_t>(plan.num_tokens()) * vocab);
          Status st = model->Forward(plan, logits);
          EXPECT_TRUE(st.ok()) << st.message();
          return logits;
        };
    run({{b_prompt, 0, blocks_b}});
    run({{c_prompt, 0, blocks_c}});
    std::vector<float> solo;
    for (auto& part :
         {run({{a, 0, blocks_a}}), run({{{300}, 7, blocks_b}}), run({{c_chunk, 5, blocks_c}})})
      solo.insert(solo.end(), part.begin(), part.end());
    std::vector<float> batched =
        run({{a, 0, blocks_a}, {{300}, 7, blocks_b}, {c_chunk, 5, blocks_c}});
    ASSERT_EQ(solo.size(), batched.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < solo.size(); ++i) mismatches += solo[i] != batched[i];
    EXPECT_EQ(mismatches, 0u) << name << ": batched logits differ from solo (bitwise)";
  }
}

// deepseek_v3's latent pool: per token and layer only [c | k_rope] (16 + 8 floats), which is
// what KvBytesPerToken reports; a block copied out and back into other blocks (the prompt
// cache's host and disk tiers) continues the sequence exactly as the original blocks do.
TEST(MlaTest, LatentPoolSizeAndBlockCopies) {
  EMBER_REQUIRE_DIR(ModelDir("deepseek_v3"));
  auto model = LoadOrDie(ModelDir("deepseek_v3"), "config.json");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->KvBytesPerToken(), 3 * (16 + 8) * 4);
  EXPECT_EQ(model->KvBlockBytes(), int64_t{3} * kBlockSize * (16 + 8) * 4);
  const int32_t vocab = model->config().vocab_size;
  std::vector<int32_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1 + (i * 31) % 500);
  auto step = [&](const std::vector<int32_t>& tokens, int32_t first, std::vector<int32_t> blocks) {
    BatchPlan plan;
    plan.block_size = kBlockSize;
    plan.AddSequence(tokens, first, blocks, true);
    std::vector<float> logits(static_cast<size_t>(vocab));
    Status st = model->Forward(plan, logits);
    EXPECT_TRUE(st.ok()) << st.message();
    return logits;
  };
  step(prompt, 0, Blocks(0, 3));
  std::vector<std::vector<uint8_t>> bytes(3, std::vector<uint8_t>(model->KvBlockBytes()));
  const std::vector<std::span<uint8_t>> outs(bytes.begin(), bytes.end());
  const int32_t blocks[] = {0, 1, 2};
  ASSERT_TRUE(model->CopyKvBlocksToHost(blocks, outs).ok());
  for (int32_t b = 0; b < 3; ++b) ASSERT_TRUE(model->CopyKvBlockFromHost(10 + b, bytes[b]).ok());
  const std::vector<float> original = step({7}, 37, Blocks(0, 3));
  const std::vector<float> copied = step({7}, 37, Blocks(10, 3));
  EXPECT_EQ(original, copied);
  EXPECT_NE(model->KvFingerprint().find("mla latent pool"), std::string::npos);
}

// The CPU backend seen through Backend's defaults for everything MLA (TakesMla false,
// AllocateLatentKvPool refusing): a backend without MLA.
class WithoutMla : public Backend {
 public:
  std::string name() const override { return "without-mla"; }
  Result<Tensor> UploadWeight(const std::string& n, DType t, std::span<const int64_t> shape,
                              const void* data) override {
    return cpu_->UploadWeight(n, t, shape, data);
  }
  Status AllocateKvPool(int32_t l, int32_t b, int32_t s, int32_t h, int32_t d) override {
    return cpu_->AllocateKvPool(l, b, s, h, d);
  }
  Result<int32_t> CreateRope(const RopeSpec& spec) override { return cpu_->CreateRope(spec); }
  Status BeginStep(const BatchPlan& plan) override { return cpu_->BeginStep(plan); }
  Tensor Alloc(std::initializer_list<int64_t> shape) override { return cpu_->Alloc(shape); }
  void Embedding(const Tensor& t, float s, Tensor o) override { cpu_->Embedding(t, s, o); }
  void RmsNorm(const Tensor& x, const Tensor& w, float e, RmsNormKind k, Tensor o) override {
    cpu_->RmsNorm(x, w, e, k, o);
  }
  void AddRmsNorm(Tensor r, const Tensor& d, const Tensor& w, float e, RmsNormKind k,
                  Tensor o) override {
    cpu_->AddRmsNorm(r, d, w, e, k, o);
  }
  void MatMul(const Tensor& x, const Tensor& w, const Tensor* b, Tensor o) override {
    cpu_->MatMul(x, w, b, o);
  }
  void Rope(int32_t id, Tensor q, Tensor k) override { cpu_->Rope(id, q, k); }
  void WriteKv(int32_t l, const Tensor& k, const Tensor& v) override { cpu_->WriteKv(l, k, v); }
  void Attention(const AttentionParams& p, const Tensor& q, Tensor o) override {
    cpu_->Attention(p, q, o);
  }
  void SiluMul(const Tensor& g, const Tensor& u, Tensor o) override { cpu_->SiluMul(g, u, o); }
  void GeluTanhMul(const Tensor& g, const Tensor& u, Tensor o) override {
    cpu_->GeluTanhMul(g, u, o);
  }
  void Add(const Tensor& a, const Tensor& b, Tensor o) override { cpu_->Add(a, b, o); }
  void Softcap(Tensor x, float cap) override { cpu_->Softcap(x, cap); }
  void GatherLogitsRows(const Tensor& x, Tensor o) override { cpu_->GatherLogitsRows(x, o); }
  Status CopyToHost(const Tensor& t, std::span<float> o) override { return cpu_->CopyToHost(t, o); }
  Status ArgmaxRows(const Tensor& x, std::span<int32_t> ids) override {
    return cpu_->ArgmaxRows(x, ids);
  }
  Status SampleRows(const Tensor& x, std::span<const int32_t> rows,
                    std::span<const RowSampling> params, std::span<int32_t> ids) override {
    return cpu_->SampleRows(x, rows, params, ids);
  }
  Status ApplyLogitEdits(Tensor x, std::span<const LogitEdit> edits) override {
    return cpu_->ApplyLogitEdits(x, edits);
  }
  Status ApplyTokenMasks(Tensor x, std::span<const RowMask> masks) override {
    return cpu_->ApplyTokenMasks(x, masks);
  }
  Result<BackendMemory> MemoryInfo() const override { return cpu_->MemoryInfo(); }
  std::span<float> HostBuffer(size_t count) override { return cpu_->HostBuffer(count); }

 private:
  std::unique_ptr<Backend> cpu_ = MakeCpuBackend({});
};

// A backend without MLA refuses deepseek_v3 at load, naming the architecture and itself, and its
// latent pool refuses; other models still load on it.
TEST(MlaTest, BackendWithoutMlaRefusesAtLoad) {
  EMBER_REQUIRE_DIR(ModelDir("deepseek_v3"));
  auto model = Model::Load(ModelDir("deepseek_v3"), std::make_unique<WithoutMla>(),
                           ModelLoadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.message().find("\"deepseek_v3\" (multi-head latent attention) is not supported "
                                 "on the without-mla backend yet"),
            std::string::npos)
      << model.message();
  WithoutMla be;
  const Status st = be.AllocateLatentKvPool(1, 4, 16, 24);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("without-mla backend"), std::string::npos) << st.message();
  EMBER_REQUIRE_DIR(ModelDir("qwen3"));
  auto qwen = Model::Load(ModelDir("qwen3"), std::make_unique<WithoutMla>(), ModelLoadOptions{});
  EXPECT_TRUE(qwen.ok()) << qwen.message();
}

}  // namespace
}  // namespace ember
