// WriteKv: scatters this step's k/v rows into the paged pool at their slots (one block per row);
// RopeWriteKv: RoPE over q and k and the same scatter in one launch.
// A bf16 pool stores each element rounded once, to nearest even (__float2bfloat16_rn): the same
// rounding attention_invariant.cu applies when it stages an f32 pool's K/V, so both pools give
// the same attention bits.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_rotate.cuh"

namespace ember::cuda {
namespace {

__device__ __forceinline__ void Store(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void Store(__nv_bfloat16* dst, float x) {
  *dst = __float2bfloat16_rn(x);
}

template <typename T>
__global__ void WriteKvKernel(const float* k, const float* v, T* k_pool, T* v_pool,
                              int64_t row_width, const int32_t* slot_mapping) {
  const int64_t token = blockIdx.x;
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding rows carry no K/V
  for (int64_t c = threadIdx.x; c < row_width; c += blockDim.x) {
    Store(k_pool + slot * row_width + c, k[token * row_width + c]);
    Store(v_pool + slot * row_width + c, v[token * row_width + c]);
  }
}

// One block per token: rotates q in place, rotates k in place and stores it (rotated pairs and
// the dims past rotary_dim) and v at the token's slot; RopeKernel's arithmetic per pair.
template <typename T>
__global__ void RopeWriteKvKernel(float* q, float* k, const float* v, int32_t num_heads,
                                  int32_t num_kv_heads, int32_t head_dim, int32_t rotary_dim,
                                  const float* cos_table, const float* sin_table,
                                  int32_t max_positions, const int32_t* positions,
                                  const int32_t* slot_mapping, T* k_pool, T* v_pool) {
  const int64_t token = blockIdx.x;
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  const int32_t pos = positions[token];
  if (pos < 0 || pos >= max_positions) __trap();  // CHECKed on the host side too
  const int32_t half = rotary_dim / 2;
  const float* cos_row = cos_table + static_cast<int64_t>(pos) * half;
  const float* sin_row = sin_table + static_cast<int64_t>(pos) * half;
  const int64_t slot = slot_mapping[token];  // < 0: a padding row, rotated but not stored
  const int64_t row_width = static_cast<int64_t>(num_kv_heads) * head_dim;
  for (int32_t j = threadIdx.x; j < num_heads * half; j += blockDim.x) {
    float* x = q + (token * num_heads + j / half) * head_dim;
    const int32_t i = j % half;
    const float2 y = RotatePair(x[i], x[i + half], cos_row[i], sin_row[i]);
    x[i] = y.x;
    x[i + half] = y.y;
  }
  // Per k head: head_dim - half items, a rotated pair (i < half) or a dim past rotary_dim.
  const int32_t per_head = head_dim - half;
  for (int32_t j = threadIdx.x; j < num_kv_heads * per_head; j += blockDim.x) {
    const int32_t head = j / per_head, i = j % per_head;
    float* x = k + (token * num_kv_heads + head) * head_dim;
    // (Formed only for a real slot: k_pool - row_width would point before the pool.)
    T* dst =
        slot >= 0 ? k_pool + slot * row_width + static_cast<int64_t>(head) * head_dim : nullptr;
    if (i < half) {
      const float2 y = RotatePair(x[i], x[i + half], cos_row[i], sin_row[i]);
      x[i] = y.x;
      x[i + half] = y.y;
      if (slot >= 0) {
        Store(dst + i, y.x);
        Store(dst + i + half, y.y);
      }
    } else if (slot >= 0) {
      Store(dst + i + half, x[i + half]);
    }
  }
  if (slot < 0) return;
  for (int64_t c = threadIdx.x; c < row_width; c += blockDim.x)
    Store(v_pool + slot * row_width + c, v[token * row_width + c]);
}

// One block per token into a quantized layer: with rotary_dim > 0 rotates q and k in place
// (RopeKernel's arithmetic per pair), then each warp quantizes K and V rows of the token's KV
// heads into the pool (none for a padding row).
__global__ void RopeWriteKvQuantKernel(float* q, float* k, const float* v, int32_t num_heads,
                                       int32_t rotary_dim, const float* cos_table,
                                       const float* sin_table, int32_t max_positions,
                                       const int32_t* positions, const int32_t* slot_mapping,
                                       KvLayerView kv) {
  const int64_t token = blockIdx.x;
  PdlWait();  // launched with LaunchPdl: the previous kernel's outputs are visible after this
  PdlTrigger();
  const int32_t num_kv_heads = kv.num_kv_heads, head_dim = kv.head_dim;
  if (rotary_dim > 0) {
    const int32_t pos = positions[token];
    if (pos < 0 || pos >= max_positions) __trap();  // CHECKed on the host side too
    const int32_t half = rotary_dim / 2;
    const float* cos_row = cos_table + static_cast<int64_t>(pos) * half;
    const float* sin_row = sin_table + static_cast<int64_t>(pos) * half;
    for (int32_t j = threadIdx.x; j < (num_heads + num_kv_heads) * half; j += blockDim.x) {
      const int32_t head = j / half, i = j % half;
      float* x = head < num_heads ? q + (token * num_heads + head) * head_dim
                                  : k + (token * num_kv_heads + head - num_heads) * head_dim;
      const float2 y = RotatePair(x[i], x[i + half], cos_row[i], sin_row[i]);
      x[i] = y.x;
      x[i + half] = y.y;
    }
    __syncthreads();  // the rotated k rows, visible to the block's warps
  }
  const int64_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding rows carry no K/V
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int32_t r = warp; r < 2 * num_kv_heads; r += warps) {
    const bool is_v = r >= num_kv_heads;
    const int32_t head = is_v ? r - num_kv_heads : r;
    const float* x = (is_v ? v : k) + (token * num_kv_heads + head) * head_dim;
    unsigned char* pool = reinterpret_cast<unsigned char*>(is_v ? kv.v : kv.k);
    WarpQuantizeRow(kv.quant, x, head_dim, pool + KvQuantRowOffset(kv, slot, head), kv.rotated);
  }
}

// A warp per row: the row in registers (WarpHadamard's layout), rotated, stored.
__global__ void HadamardRowsKernel(const float* src, float* dst, int64_t rows, int32_t n) {
  PdlWait();
  PdlTrigger();
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  constexpr int kPerLane = kMaxHeadDim / 32;
  float v[kPerLane];
  WarpLoadRow(src + row * n, n, v);
  WarpHadamard(v, n);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < n) dst[row * n + d] = v[i];
  }
}

}  // namespace

void LaunchRopeWriteKv(float* q, float* k, const float* v, int32_t num_heads, int32_t rotary_dim,
                       const float* cos_table, const float* sin_table, int32_t max_positions,
                       const KvLayerView& kv, const PlanView& plan, cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  const int32_t num_kv_heads = kv.num_kv_heads, head_dim = kv.head_dim;
  CHECK(rotary_dim % 2 == 0 && rotary_dim <= head_dim) << "rotary_dim " << rotary_dim;
  const dim3 grid(static_cast<unsigned>(plan.num_tokens)), block(256);
  if (kv.quant != KvQuant::kNone) {
    LaunchPdl(RopeWriteKvQuantKernel, grid, block, 0, stream, q, k, v, num_heads, rotary_dim,
              cos_table, sin_table, max_positions, plan.positions, plan.slot_mapping, kv);
  } else if (kv.bf16) {
    LaunchPdl(RopeWriteKvKernel<__nv_bfloat16>, grid, block, 0, stream, q, k, v, num_heads,
              num_kv_heads, head_dim, rotary_dim, cos_table, sin_table, max_positions,
              plan.positions, plan.slot_mapping, reinterpret_cast<__nv_bfloat16*>(kv.k),
              reinterpret_cast<__nv_bfloat16*>(kv.v));
  } else {
    LaunchPdl(RopeWriteKvKernel<float>, grid, block, 0, stream, q, k, v, num_heads, num_kv_heads,
              head_dim, rotary_dim, cos_table, sin_table, max_positions, plan.positions,
              plan.slot_mapping, kv.k, kv.v);
  }
}

void LaunchHadamardRows(const float* src, float* dst, int64_t rows, int32_t n,
                        cudaStream_t stream) {
  if (rows == 0) return;
  CHECK(n > 0 && n <= kMaxHeadDim && (n & (n - 1)) == 0) << "Hadamard rows of " << n;
  constexpr int kRowsPerBlock = 8;
  LaunchPdl(HadamardRowsKernel,
            dim3(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock)),
            dim3(32 * kRowsPerBlock), 0, stream, src, dst, rows, n);
}

void LaunchWriteKv(const float* k, const float* v, const KvLayerView& kv, const PlanView& plan,
                   cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  const int64_t row_width = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  if (kv.quant != KvQuant::kNone) {
    LaunchPdl(RopeWriteKvQuantKernel, dim3(plan.num_tokens), dim3(256), 0, stream,
              static_cast<float*>(nullptr), const_cast<float*>(k), v, 0, 0,
              static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), 0,
              plan.positions, plan.slot_mapping, kv);
  } else if (kv.bf16) {
    LaunchPdl(WriteKvKernel<__nv_bfloat16>, dim3(plan.num_tokens), dim3(256), 0, stream, k, v,
              reinterpret_cast<__nv_bfloat16*>(kv.k), reinterpret_cast<__nv_bfloat16*>(kv.v),
              row_width, plan.slot_mapping);
  } else {
    LaunchPdl(WriteKvKernel<float>, dim3(plan.num_tokens), dim3(256), 0, stream, k, v, kv.k, kv.v,
              row_width, plan.slot_mapping);
  }
}

}  // namespace ember::cuda
