// Shared by the CUDA backend's GPU test binaries (cuda_ops_test, cuda_attention_test): seeded
// random data, the relative L2 error the tolerances are stated in, bf16 rounding as the device
// does it, and the fixture that skips when no CUDA device is present (CI has none) and moves
// tensors between host and device through the Backend interface.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "util/half.h"

namespace ember::cuda_test {

// Sets an environment variable for the scope (the CUDA backend reads its switches when created).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

inline std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline double RelL2(const std::vector<float>& got, const std::vector<double>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline float RoundBf16(float x) { return Bf16ToF32(F32ToBf16(x)); }

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present; CUDA op tests skipped";
  }
  std::unique_ptr<Backend> Make(bool f32) {
    auto r = CreateCudaBackend(0, f32);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }
  // bf16 mode with the batch-invariant GEMM on (the default is the GEMV / cuBLAS paths).
  std::unique_ptr<Backend> MakeInvariant() {
    CudaBackendOptions options;
    options.batch_invariant = true;
    auto r = CreateCudaBackend(0, options);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }
  Tensor Upload(Backend& b, const std::vector<float>& host, std::initializer_list<int64_t> shape) {
    Tensor t = b.Alloc(shape);
    Status st = CudaCopyFromHost(b, host, t);
    EXPECT_TRUE(st.ok()) << st.message();
    return t;
  }
  Tensor Weight(Backend& b, const std::vector<float>& host, std::vector<int64_t> shape) {
    auto r = b.UploadWeight("w", DType::kF32, shape, host.data());
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.value();
  }
  std::vector<float> Download(Backend& b, const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()), NAN);
    Status st = b.CopyToHost(t, out);
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }
  // A plan of one sequence of n tokens at positions [first_pos, first_pos + n).
  static BatchPlan SimplePlan(int32_t n, int32_t first_pos = 0, int32_t vocab = 1) {
    BatchPlan plan;
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 7 + 3) % vocab;
    std::vector<int32_t> blocks((first_pos + n) / plan.block_size + 1);
    std::iota(blocks.begin(), blocks.end(), 0);
    plan.AddSequence(tokens, first_pos, blocks, true);
    return plan;
  }
};

}  // namespace ember::cuda_test
