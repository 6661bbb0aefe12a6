// lora.cu's launcher (Backend::LoraDelta's kernels) and the segment descriptors it reads from
// device memory. Plain data and a launcher; any thread (the launch is on the caller's stream).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ember::cuda {
// One segment of a LoraDelta launch: rows [first_row, first_row + rows) take a [rank, k] and
// b [m, rank] (device weights, bf16 or f32 as LoraDeltaArgs::w_bf16 says).
struct LoraSegmentDesc {
  const void* a = nullptr;
  const void* b = nullptr;
  int32_t first_row = 0, rows = 0, rank = 0, pad = 0;
};
constexpr int32_t kMaxLoraKernelRank = 256;  // model/lora_adapter.h's kMaxLoraRankLimit
struct LoraDeltaArgs {
  const LoraSegmentDesc* segments = nullptr;  // [num_segments] on the device
  int32_t num_segments = 0;
  int32_t max_rows = 0;  // the largest segment's rows
  int32_t max_rank = 0;  // the largest segment's rank (t's row stride), <= kMaxLoraKernelRank
  const void* x = nullptr;  // [n, k] f32 or bf16 (x_bf16)
  bool x_bf16 = false;
  int64_t k = 0;
  void* out = nullptr;  // [n, m] f32 or bf16 (out_bf16), updated in place
  bool out_bf16 = false;
  int64_t m = 0;
  bool w_bf16 = false;
  float* t = nullptr;  // scratch [n, max_rank] f32
};
// For every segment: t[rows] = x[rows] a^T, then out[rows] += t[rows] b^T (two launches over
// all segments; float32 accumulation, each element's order fixed by its row alone).
void LaunchLoraDelta(const LoraDeltaArgs& args, cudaStream_t stream);
}  // namespace ember::cuda
