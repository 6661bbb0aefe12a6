// The CUDA backend's quantized KV pools (--kv-cache-dtype int8 / fp8 / int4, int4 with and
// without its Hadamard rotation) against the CPU backend, the reference: WriteKv and RopeWriteKv
// store exactly kv_quant's QuantizeKvRow bytes (int4: of HadamardRotate's row when rotated) in the
// CPU's head-major block layout (checked through CopyKvBlockToHost), and the attention over a
// quantized pool (bf16 mode: the batch-invariant kernel in its decode, key-split decode and
// split forms; f32 mode: split-K decode and the prefill kernel) equals the CPU backend's attention
// over the same rows, copied block by block into a CPU pool of the same format. Prefill, mixed
// and decode steps, block boundaries, GQA ratios 1 to 8, two layers of different formats.
// Tolerances (relative L2 over the whole output): f32 mode 1e-5 (the same dequantized floats in
// float32 arithmetic); bf16 mode 2e-2, the bf16 mode's tolerance against an f32 reference (K, V,
// Q and the weights rounded to bf16). Skips when no CUDA device is present (CI has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_util.h"
#include "backend/kv_quant.h"

namespace ember {
namespace {

using namespace cuda_test;

struct QuantCase {
  KvDType dtype;
  int32_t head_dim, num_heads, num_kv_heads;
  bool rotate = true;  // int4: KvFormat::rotate_int4
};

std::string QuantCaseName(const ::testing::TestParamInfo<QuantCase>& info) {
  const QuantCase& c = info.param;
  char name[96];
  std::snprintf(name, sizeof(name), "%s%s_D%d_H%d_KV%d", KvDTypeName(c.dtype),
                c.rotate ? "" : "_unrotated", c.head_dim, c.num_heads, c.num_kv_heads);
  return name;
}

// The other quantized dtype: layer 0's, beside the case's on layer 1 (per-layer formats).
KvDType Other(KvDType t) { return t == KvDType::kInt8 ? KvDType::kFP8 : KvDType::kInt8; }

class CudaKvQuantTest : public CudaOpsTest, public ::testing::WithParamInterface<QuantCase> {
 protected:
  static constexpr int32_t kBlocks = 255, kBlockSize = 16, kLayers = 2;

  KvFormat Format() const {
    return KvFormat{{Other(GetParam().dtype), GetParam().dtype}, GetParam().rotate};
  }

  // A CUDA backend (f32: the parity mode) and a CPU backend, both with Format()'s pools.
  void Setup(bool f32) {
    const QuantCase c = GetParam();
    CudaBackendOptions options;
    options.f32_compute = f32;
    auto created = CreateCudaBackend(0, options);
    ASSERT_TRUE(created.ok()) << created.status().message();
    gpu_ = std::move(created).value();
    CpuBackendOptions cpu_options;
    cpu_options.num_threads = 8;
    cpu_ = MakeCpuBackend(cpu_options);
    for (Backend* b : {gpu_.get(), cpu_.get()}) {
      ASSERT_TRUE(b->SetKvFormat(Format(), c.head_dim).ok());
      ASSERT_TRUE(b->AllocateKvPool(kLayers, kBlocks, kBlockSize, c.num_kv_heads, c.head_dim).ok());
    }
    ASSERT_EQ(gpu_->KvBlockBytes(), cpu_->KvBlockBytes());
    // Shuffled, disjoint block ids per sequence so a wrong block table shows.
    std::vector<int32_t> ids(kBlocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
    blocks_.clear();
    for (int32_t s = 0; s < 3; ++s)
      blocks_.emplace_back(ids.begin() + s * kBlocks / 3, ids.begin() + (s + 1) * kBlocks / 3);
  }

  // Every block of the GPU pool into the CPU pool (the disk tier's record format).
  void CopyPoolToCpu() {
    std::vector<uint8_t> block(static_cast<size_t>(gpu_->KvBlockBytes()));
    for (int32_t b = 0; b < kBlocks; ++b) {
      ASSERT_TRUE(gpu_->CopyKvBlockToHost(b, block).ok());
      ASSERT_TRUE(cpu_->CopyKvBlockFromHost(b, block).ok());
    }
  }

  // The stored row of (layer, K or V, slot, head) in a block record: layer-major, K then V, each
  // [kv_heads, block_size] rows (the CPU's head-major layout).
  std::vector<uint8_t> StoredRow(int32_t layer, int kv, int32_t slot, int32_t head) {
    const QuantCase c = GetParam();
    std::vector<uint8_t> block(static_cast<size_t>(gpu_->KvBlockBytes()));
    EXPECT_TRUE(gpu_->CopyKvBlockToHost(slot / kBlockSize, block).ok());
    size_t at = 0;
    for (int32_t l = 0; l < layer; ++l)
      at += 2 * static_cast<size_t>(kBlockSize * c.num_kv_heads *
                                    KvRowBytes(Format().layers[static_cast<size_t>(l)], c.head_dim));
    const int64_t row = KvRowBytes(Format().layers[static_cast<size_t>(layer)], c.head_dim);
    at += static_cast<size_t>(kv * kBlockSize * c.num_kv_heads * row +
                              (head * kBlockSize + slot % kBlockSize) * row);
    return std::vector<uint8_t>(block.begin() + static_cast<int64_t>(at),
                                block.begin() + static_cast<int64_t>(at + static_cast<size_t>(row)));
  }

  // One step on both backends: rows (seq, first_pos, n) per entry; K/V of both layers written on
  // the GPU, the pool copied to the CPU, then both attend over each layer. Returns the worst
  // relative L2 error of the two layers' outputs.
  double Step(const std::vector<std::array<int32_t, 3>>& rows, uint32_t seed) {
    const QuantCase c = GetParam();
    BatchPlan plan;
    plan.block_size = kBlockSize;
    for (const auto& [seq, first, n] : rows)
      plan.AddSequence(std::vector<int32_t>(static_cast<size_t>(n), 1), first,
                       blocks_[static_cast<size_t>(seq)], false);
    EXPECT_TRUE(gpu_->BeginStep(plan).ok());
    EXPECT_TRUE(cpu_->BeginStep(plan).ok());
    const int32_t T = plan.num_tokens(), D = c.head_dim;
    const size_t kvn = static_cast<size_t>(T * c.num_kv_heads * D);
    double worst = 0;
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      const uint32_t s = seed + 10 * static_cast<uint32_t>(layer);
      const std::vector<float> k = Random(kvn, s + 1), v = Random(kvn, s + 2);
      gpu_->WriteKv(layer, Upload(*gpu_, k, {T, c.num_kv_heads, D}),
                    Upload(*gpu_, v, {T, c.num_kv_heads, D}));
      if (layer == 1 && seed == first_seed_) CheckStoredRows(plan, k, v);
    }
    CopyPoolToCpu();
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      const std::vector<float> q =
          Random(static_cast<size_t>(T * c.num_heads * D), seed + 100 + static_cast<uint32_t>(layer));
      const AttentionParams p{layer, c.num_heads, c.num_kv_heads, D, 1.0f / std::sqrt(float(D))};
      Tensor out = gpu_->Alloc({T, c.num_heads * D});
      gpu_->Attention(p, Upload(*gpu_, q, {T, c.num_heads, D}), out);
      const std::vector<float> got = Download(*gpu_, out);
      Tensor cq = cpu_->Alloc({T, c.num_heads, D});
      std::memcpy(cq.data, q.data(), q.size() * sizeof(float));
      Tensor cpu_out = cpu_->Alloc({T, c.num_heads * D});
      cpu_->Attention(p, cq, cpu_out);
      const float* ref = static_cast<const float*>(cpu_out.data);
      worst = std::max(worst, RelL2(got, std::vector<double>(ref, ref + got.size())));
    }
    return worst;
  }

  // The step's rows of layer 1 are QuantizeKvRow's bytes, byte for byte.
  void CheckStoredRows(const BatchPlan& plan, const std::vector<float>& k,
                       const std::vector<float>& v) {
    const QuantCase c = GetParam();
    const int64_t row = KvRowBytes(c.dtype, c.head_dim);
    std::vector<uint8_t> want(static_cast<size_t>(row));
    int mismatches = 0;
    for (int32_t i = 0; i < plan.num_tokens(); i += 7) {  // every 7th token: the copies are slow
      for (int kv = 0; kv < 2; ++kv)
        for (int32_t h = 0; h < c.num_kv_heads; ++h) {
          const float* x = (kv == 0 ? k : v).data() + (i * c.num_kv_heads + h) * c.head_dim;
          std::vector<float> row(x, x + c.head_dim);
          if (c.dtype == KvDType::kInt4 && c.rotate) HadamardRotate(row.data(), c.head_dim);
          QuantizeKvRow(c.dtype, row.data(), c.head_dim, want.data());
          if (StoredRow(1, kv, plan.slot_mapping[static_cast<size_t>(i)], h) != want &&
              ++mismatches <= 3)
            ADD_FAILURE() << "token " << i << (kv == 0 ? " K" : " V") << " head " << h
                          << ": stored bytes differ from QuantizeKvRow's";
        }
    }
    EXPECT_EQ(mismatches, 0);
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::vector<std::vector<int32_t>> blocks_;
  uint32_t first_seed_ = 100;
};

// mode 0: f32 (split-K decode, the f32 prefill kernel), 1: bf16 (the batch-invariant kernel).
TEST_P(CudaKvQuantTest, AttentionMatchesCpuOverTheSameRows) {
  // (mode 2: the bf16 mode with EMBER_KV_DIRECT=0, int8 / FP8 rows of head dim 128 through the
  // bf16 tiles rather than as direct f16 operands.)
  const bool two_paths = GetParam().head_dim == 128 && GetParam().dtype != KvDType::kInt4;
  for (int mode : {0, 1, 2}) {
    if (mode == 2 && !two_paths) continue;
    const ScopedEnv env("EMBER_KV_DIRECT", mode == 2 ? "0" : "1");
    Setup(mode == 0);
    if (HasFatalFailure()) return;
    const double tol = mode == 0 ? 1e-5 : 2e-2;  // (the direct operands are the more exact)
    double worst = 0;
    auto check = [&](double err, const char* what) {
      EXPECT_LT(err, tol) << what << ", mode " << mode;
      worst = std::max(worst, err);
    };
    check(Step({{0, 0, 40}, {1, 0, 23}}, 100), "prefill");
    check(Step({{0, 40, 1}, {1, 23, 9}, {2, 0, 5}}, 200), "mixed");
    check(Step({{0, 41, 1}, {1, 32, 1}, {2, 5, 1}}, 300), "decode");
    check(Step({{0, 42, 1}, {1, 33, 1}, {2, 6, 1}}, 400), "decode 2");
    // A long history (the invariant kernel's 512-key splits; f32 split-K), then decode of it
    // alone (split mode and its combine) and beside a short one.
    check(Step({{0, 43, 1100}}, 500), "long chunk");
    check(Step({{0, 1143, 1}}, 600), "long decode");
    check(Step({{0, 1144, 1}, {2, 7, 1}}, 700), "long + short decode");
    std::printf("%s mode: worst relative L2 error against the CPU %.2e\n",
                mode == 0   ? "f32"
                : mode == 1 ? "bf16"
                            : "bf16 (EMBER_KV_DIRECT=0)",
                worst);
  }
}

// RopeWriteKv into a quantized layer stores the rotated k (as the op leaves it in k) quantized.
TEST_P(CudaKvQuantTest, RopeWriteKvStoresTheRotatedKeyQuantized) {
  const QuantCase c = GetParam();
  Setup(false);
  if (HasFatalFailure()) return;
  RopeSpec spec;
  spec.head_dim = c.head_dim;
  spec.rotary_dim = c.head_dim;
  spec.max_positions = 256;
  auto rope = gpu_->CreateRope(spec);
  ASSERT_TRUE(rope.ok()) << rope.message();
  BatchPlan plan;
  plan.block_size = kBlockSize;
  plan.AddSequence(std::vector<int32_t>(37, 1), 3, blocks_[0], false);
  ASSERT_TRUE(gpu_->BeginStep(plan).ok());
  const int32_t T = plan.num_tokens(), D = c.head_dim;
  const size_t kvn = static_cast<size_t>(T * c.num_kv_heads * D);
  Tensor q = Upload(*gpu_, Random(static_cast<size_t>(T * c.num_heads * D), 1), {T, c.num_heads, D});
  Tensor k = Upload(*gpu_, Random(kvn, 2), {T, c.num_kv_heads, D});
  const std::vector<float> v = Random(kvn, 3);
  gpu_->RopeWriteKv(*rope, 1, q, k, Upload(*gpu_, v, {T, c.num_kv_heads, D}));
  CheckStoredRows(plan, Download(*gpu_, k), v);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaKvQuantTest,
    ::testing::Values(QuantCase{KvDType::kInt8, 64, 8, 2}, QuantCase{KvDType::kFP8, 64, 8, 2},
                      QuantCase{KvDType::kInt8, 128, 32, 8}, QuantCase{KvDType::kFP8, 128, 32, 8},
                      QuantCase{KvDType::kInt8, 128, 8, 8}, QuantCase{KvDType::kFP8, 128, 64, 8},
                      QuantCase{KvDType::kInt8, 96, 6, 3}, QuantCase{KvDType::kFP8, 256, 4, 1},
                      QuantCase{KvDType::kInt8, 16, 8, 4}, QuantCase{KvDType::kFP8, 72, 4, 2},
                      QuantCase{KvDType::kInt4, 64, 8, 2}, QuantCase{KvDType::kInt4, 128, 32, 8},
                      QuantCase{KvDType::kInt4, 128, 8, 8, false},
                      QuantCase{KvDType::kInt4, 256, 4, 1}, QuantCase{KvDType::kInt4, 32, 8, 4},
                      QuantCase{KvDType::kInt4, 16, 4, 2}, QuantCase{KvDType::kInt4, 8, 4, 2}),
    QuantCaseName);

// The pool's bytes per token, per block and its format text are the CPU's for the same format;
// the dtypes without CUDA kernels are refused naming the dtype and the device.
TEST_F(CudaOpsTest, QuantizedKvBytesEqualTheCpus) {
  const int32_t layers = 3, kv_heads = 4, D = 128;
  const KvFormat formats[] = {KvFormat{{KvDType::kInt8, KvDType::kInt8, KvDType::kInt8}, true},
                              KvFormat{{KvDType::kFP8, KvDType::kFP8, KvDType::kFP8}, true},
                              KvFormat{{KvDType::kInt8, KvDType::kBF16, KvDType::kFP8}, true},
                              KvFormat{{KvDType::kInt4, KvDType::kBF16, KvDType::kInt4}, true},
                              KvFormat{{KvDType::kInt4, KvDType::kInt4, KvDType::kInt8}, false}};
  for (const KvFormat& f : formats) {
    auto gpu = Make(false);
    auto cpu = MakeCpuBackend(CpuBackendOptions{});
    for (Backend* b : {gpu.get(), cpu.get()}) {
      ASSERT_TRUE(b->SetKvFormat(f, D).ok()) << f.Describe();
      ASSERT_TRUE(b->AllocateKvPool(layers, 8, 16, kv_heads, D).ok());
    }
    EXPECT_EQ(gpu->KvTokenBytes(layers, kv_heads, D), cpu->KvTokenBytes(layers, kv_heads, D));
    EXPECT_EQ(gpu->KvBlockBytes(), cpu->KvBlockBytes());
    EXPECT_EQ(gpu->KvBlockBytes(), 16 * gpu->KvTokenBytes(layers, kv_heads, D));
    EXPECT_EQ(gpu->KvFormatText(D), cpu->KvFormatText(D));
  }
  EXPECT_EQ(Make(false)->KvTokenBytes(1, 1, D), 2 * 2 * D);  // no format set: the bf16 pool
  for (KvDType t : {KvDType::kF16, KvDType::kF32}) {
    const Status st = Make(false)->SetKvFormat(KvFormat{{KvDType::kInt8, t}, true}, D);
    ASSERT_FALSE(st.ok()) << KvDTypeName(t);
    EXPECT_NE(st.message().find(std::string("--kv-cache-dtype ") + KvDTypeName(t)),
              std::string::npos) << st.message();
    EXPECT_NE(st.message().find("cuda:0"), std::string::npos) << st.message();
  }
  const Status odd = Make(false)->SetKvFormat(KvFormat{{KvDType::kInt8}, true}, 42);
  EXPECT_FALSE(odd.ok());
  const Status int4 = Make(false)->SetKvFormat(KvFormat{{KvDType::kInt4}, true}, 96);
  ASSERT_FALSE(int4.ok());  // the rotation needs a power-of-two head_dim
  EXPECT_NE(int4.message().find("head_dim"), std::string::npos) << int4.message();
}

}  // namespace
}  // namespace ember
