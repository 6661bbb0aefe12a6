// lora.cu's launcher (Backend::LoraDelta's kernels) and the per-row tables it reads from device
// memory. Plain data and a launcher; any thread (the launch is on the caller's stream).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ember::cuda {
// One adapter of a LoraDelta launch (a LoRA slot's matrices for one projection): a [rank, k] and
// b [m, rank] (device weights, bf16 or f32 as LoraDeltaArgs::w_bf16 says). rank 0: none (the
// rows that name it are left alone).
struct LoraEntry {
  const void* a = nullptr;
  const void* b = nullptr;
  int32_t rank = 0, pad = 0;
};
constexpr int32_t kMaxLoraKernelRank = 256;  // model/lora_adapter.h's kMaxLoraRankLimit
constexpr int kMaxLoraKernelParts = 3;       // backend.h's kMaxLoraParts
// Only row_entry's and entries' addresses, the shapes and rank_cap shape the launches: what the
// tables hold is data, so a captured graph stays right for any mix of adapters over the rows.
// Up to kMaxLoraKernelParts outputs of one x (Backend::LoraDeltaGroup) share the launches.
struct LoraDeltaArgs {
  const int32_t* row_entry = nullptr;  // [n] on the device: each row's slot, -1 none
  // [n] on the device: the rows in the order the kernels tile them (every row once; rows of one
  // slot together, the rows of no slot last), so a tile's rows share their adapter's loads.
  const int32_t* row_order = nullptr;
  // On the device, [part][num_slots]: part p's entry of slot s at p * num_slots + s.
  const LoraEntry* entries = nullptr;
  int32_t num_slots = 0;
  int32_t parts = 1;
  int32_t n = 0;
  int32_t rank_cap = 0;  // >= every entry's rank, <= kMaxLoraKernelRank (t: parts * rank_cap)
  const void* x = nullptr;  // [n, k] f32 or bf16 (x_bf16)
  bool x_bf16 = false;
  int64_t k = 0;
  void* out[kMaxLoraKernelParts] = {};  // [n, m[p]] f32 or bf16 (out_bf16), updated in place
  bool out_bf16 = false;
  int64_t m[kMaxLoraKernelParts] = {};
  bool w_bf16 = false;
  // 16-byte loads allowed: x_vec for x and every a (k % 8 == 0, 16-byte aligned bases), w_vec
  // for every b (16-byte aligned; each entry's rank % 8 decides per entry). Either way each
  // element is summed in the same order (only the load width differs).
  bool x_vec = false, w_vec = false;
  float* t = nullptr;  // scratch [n, parts * rank_cap] f32
  // overwrite: out[row] = base[col] (or 0 where base is null) + the update, for every row,
  // adapter or not, instead of out += the update (out f32: a GEMV's bias, CudaBackend's
  // MatMulGroupLora).
  bool overwrite = false;
  const float* base[kMaxLoraKernelParts] = {};
};
// For every part and row with an entry: t[row] = x[row] a^T, then out[row] += t[row] b^T
// (overwrite: out[row] = base + t[row] b^T for every row, 0 for the update of a row without one).
// Two launches for all parts, programmatic dependent launches: each reads its weights' first
// chunks before waiting on the kernel before it; float32 accumulation, each element's order fixed
// by its row alone: batch-invariant.
void LaunchLoraDelta(const LoraDeltaArgs& args, cudaStream_t stream);

// The stacked form's step between its shrink and expand GEMMs (CudaBackend::RecordLoraStacked):
// t [n][parts][width] f32, the shrink of every slot's rank block (width = slots * rank, rank a
// multiple of 8); tb [parts][n][width] bf16 receives t rounded where column j belongs to the slot
// part_rows[p * n + row] names (j / rank), 0 elsewhere (and for rows of slot -1).
void LaunchLoraStackMask(const float* t, const int32_t* part_rows, int32_t n, int32_t parts,
                         int32_t width, int32_t rank, void* tb, cudaStream_t stream);
}  // namespace ember::cuda
