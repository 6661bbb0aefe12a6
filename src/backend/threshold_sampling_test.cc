// ThresholdSample (the CUDA SampleRows kernel's CPU twin) against the host sampler, Sample():
// the same token for the same uniform draw over random rows (peaked, flat, with ties, -inf and
// NaN entries) and every combination of temperature, top-k, top-p and min-p; the CPU backend's
// SampleRows over a tensor of such rows; and, where a GPU exists, the CUDA kernel = the twin.
#include "backend/threshold_sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_loader.h"
#include "sampling/sampler.h"

namespace ember {
namespace {

std::vector<float> RandomRow(std::mt19937& rng, int vocab, int kind) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  const float scale = kind == 0 ? 1.0f : kind == 1 ? 6.0f : 0.2f;  // typical, peaked, flat
  for (float& x : row) x = normal(rng) * scale;
  if (kind == 3) {  // coarse values: many exact ties, including at the top
    for (float& x : row) x = std::round(x * 2.0f) / 2.0f;
  }
  if (kind == 4) {  // masked and broken entries
    for (size_t i = 0; i < row.size(); i += 7) row[i] = -std::numeric_limits<float>::infinity();
    row[3] = std::numeric_limits<float>::quiet_NaN();
  }
  return row;
}

TEST(ThresholdSampleTest, MatchesTheHostSampler) {
  std::mt19937 rng(123);
  int cases = 0, mismatches = 0;
  for (int vocab : {50, 1000, 4099}) {
    for (int kind = 0; kind < 5; ++kind) {
      for (float temperature : {0.5f, 1.0f, 1.7f}) {
        for (int32_t top_k : {0, 1, 7, 60}) {
          for (float top_p : {1.0f, 0.95f, 0.5f}) {
            for (float min_p : {0.0f, 0.05f}) {
              const std::vector<float> row = RandomRow(rng, vocab, kind);
              SamplingParams sp;
              sp.temperature = temperature;
              sp.top_k = top_k;
              sp.top_p = top_p;
              sp.min_p = min_p;
              sp.seed = static_cast<uint64_t>(cases);
              SamplerState state(sp, 0, {});
              SamplerState peek = state;
              RowSampling rp;
              rp.temperature = temperature;
              rp.top_k = top_k;
              rp.top_p = top_p;
              rp.min_p = min_p;
              rp.u = peek.NextUniform();
              std::vector<float> scratch = row;
              const int32_t host = Sample(scratch, sp, state).token_id;
              const int32_t twin = ThresholdSample(row, rp);
              ++cases;
              if (host != twin) {
                ++mismatches;
                ADD_FAILURE() << "vocab " << vocab << " kind " << kind << " T " << temperature
                              << " k " << top_k << " p " << top_p << " min_p " << min_p << " u "
                              << rp.u << ": host " << host << " twin " << twin;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases;
}

TEST(ThresholdSampleTest, CpuBackendSampleRows) {
  CpuBackendOptions options;
  options.num_threads = 1;
  auto be = MakeCpuBackend(options);
  std::mt19937 rng(7);
  const int vocab = 777, rows = 5;
  std::vector<float> data;
  for (int r = 0; r < rows; ++r) {
    std::vector<float> row = RandomRow(rng, vocab, r % 5);
    data.insert(data.end(), row.begin(), row.end());
  }
  const std::vector<int64_t> shape = {rows, vocab};
  auto x = be->UploadWeight("logits", DType::kF32, shape, data.data());
  ASSERT_TRUE(x.ok()) << x.message();
  const std::vector<int32_t> which = {4, 0, 2};
  std::vector<RowSampling> params(3);
  params[0] = {0.8f, 10, 0.9f, 0.0f, 0.31};
  params[1] = {1.0f, 0, 1.0f, 0.0f, 0.77};
  params[2] = {1.3f, 0, 0.6f, 0.02f, 0.05};
  std::vector<int32_t> ids(3, -1);
  ASSERT_TRUE(be->SampleRows(*x, which, params, ids).ok());
  for (size_t j = 0; j < which.size(); ++j) {
    std::span<const float> row(data.data() + which[j] * vocab, static_cast<size_t>(vocab));
    EXPECT_EQ(ids[j], ThresholdSample(row, params[j])) << "row " << which[j];
  }
  const std::vector<int32_t> bad = {5};
  EXPECT_FALSE(be->SampleRows(*x, bad, std::span(params).first(1), std::span(ids).first(1)).ok());
}

// The CUDA kernel against its twin, where a GPU exists: real-vocabulary rows, every filter.
TEST(ThresholdSampleTest, CudaMatchesTheTwin) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CudaBackendOptions options;
  options.f32_compute = true;  // keep the uploaded rows float32
  auto be = LoadCudaBackend(0, options);
  ASSERT_TRUE(be.ok()) << be.message();
  std::mt19937 rng(99);
  for (int vocab : {1000, 151936}) {
    const int rows = 40;
    std::vector<float> data;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row = RandomRow(rng, vocab, r % 5);
      data.insert(data.end(), row.begin(), row.end());
    }
    const std::vector<int64_t> shape = {rows, vocab};
    auto x = (*be)->UploadWeight("logits", DType::kF32, shape, data.data());
    ASSERT_TRUE(x.ok()) << x.message();
    std::vector<int32_t> which;
    std::vector<RowSampling> params;
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    const float temps[] = {0.6f, 1.0f, 1.5f};
    const int32_t ks[] = {0, 1, 20, 500};
    const float ps[] = {1.0f, 0.9f, 0.4f};
    const float min_ps[] = {0.0f, 0.1f};
    for (int r = 0; r < rows; ++r) {
      which.push_back(rows - 1 - r);  // rows in another order than stored
      params.push_back(
          {temps[r % 3], ks[r % 4], ps[(r / 4) % 3], min_ps[(r / 12) % 2], uniform(rng)});
    }
    std::vector<int32_t> ids(which.size(), -1);
    ASSERT_TRUE((*be)->SampleRows(*x, which, params, ids).ok());
    int mismatches = 0;
    for (size_t j = 0; j < which.size(); ++j) {
      std::span<const float> row(data.data() + static_cast<size_t>(which[j]) * vocab,
                                 static_cast<size_t>(vocab));
      const int32_t want = ThresholdSample(row, params[j]);
      if (ids[j] != want) {
        ++mismatches;
        ADD_FAILURE() << "vocab " << vocab << " row " << which[j] << " T " << params[j].temperature
                      << " k " << params[j].top_k << " p " << params[j].top_p << " min_p "
                      << params[j].min_p << " u " << params[j].u << ": cuda " << ids[j] << " twin "
                      << want;
      }
    }
    EXPECT_EQ(mismatches, 0) << "vocab " << vocab;
  }
}

}  // namespace
}  // namespace ember
