// Backend::ArgmaxRows on every backend present against the sampler's tie rules: first index of
// the maximum, NaN never wins, an all-NaN row answers 0, -inf rows still have an argmax; long
// rows (a real vocabulary) with the maximum in the last element. The CUDA backend cuts a few long
// rows into chunks (one block each) and gives many rows a block each: both shapes are checked,
// with row lengths that are and are not a multiple of 4 (its vector and scalar loads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_loader.h"

namespace ember {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The rule cases on rows of `cols` columns, then `fillers` rows whose maximum sits at a spread
// of positions.
void CheckBackend(Backend& be, int64_t cols, int fillers) {
  std::vector<std::vector<float>> rows = {
      {1.0f, 5.0f, 5.0f, -1.0f},       // tie: the first
      {kNaN, 0.0f, kNaN, 2.0f, 2.0f},  // NaN skipped
      {kNaN, kNaN, kNaN},              // all NaN (the whole row): 0
      {-kInf, -kInf, -kInf},           // all -inf: 0
      {-kInf, kNaN, -3.0f, -kInf},     // one finite value
      {0.0f, -0.0f, 0.0f},             // signed zeros are equal: the first
  };
  std::vector<int32_t> want = {1, 3, 0, 0, 2, 0};
  std::vector<float> data(rows.size() * cols + 2 * cols, -1.0f);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::fill(data.begin() + static_cast<int64_t>(r) * cols,
              data.begin() + static_cast<int64_t>(r + 1) * cols, r == 2 ? kNaN : -kInf);
    std::copy(rows[r].begin(), rows[r].end(), data.begin() + static_cast<int64_t>(r) * cols);
  }
  const size_t last = rows.size();
  data[(last + 1) * cols - 1] = 7.0f;  // maximum in the final element
  want.push_back(static_cast<int32_t>(cols - 1));
  data[(last + 1) * cols + 77] = 3.0f;  // the same maximum twice, far apart
  data[(last + 2) * cols - 5] = 3.0f;
  want.push_back(77);
  data.resize(data.size() + static_cast<size_t>(fillers * cols), -1.0f);
  for (int f = 0; f < fillers; ++f) {
    const int64_t at = (f * int64_t{7919}) % cols;
    data[static_cast<size_t>((last + 2 + f) * cols + at)] = 2.0f;
    want.push_back(static_cast<int32_t>(at));
  }
  const int64_t num_rows = static_cast<int64_t>(want.size());
  const std::vector<int64_t> shape = {num_rows, cols};
  auto x = be.UploadWeight("argmax_input", DType::kF32, shape, data.data());
  ASSERT_TRUE(x.ok()) << x.message();
  std::vector<int32_t> ids(want.size(), -1);
  Status st = be.ArgmaxRows(*x, ids);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(ids, want) << be.name() << " cols " << cols << " rows " << num_rows;
}

void CheckShapes(Backend& be) {
  CheckBackend(be, 151'936, 0);  // qwen's vocabulary: 8 rows (the CUDA split shape)
  CheckBackend(be, 50'257, 3);   // gpt-2's: not a multiple of 4
  CheckBackend(be, 32'000, 40);  // 48 rows (CUDA: a block per row)
}

TEST(ArgmaxRowsTest, Cpu) {
  CpuBackendOptions options;
  options.num_threads = 1;
  auto be = MakeCpuBackend(options);
  CheckShapes(*be);
}

TEST(ArgmaxRowsTest, CudaMatchesTheSameRules) {
  if (CudaDevicesAvailable() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA backend module)";
  CudaBackendOptions options;
  options.f32_compute = true;  // keep the uploaded matrix float32
  auto be = LoadCudaBackend(0, options);
  ASSERT_TRUE(be.ok()) << be.message();
  CheckShapes(**be);
}

}  // namespace
}  // namespace ember
