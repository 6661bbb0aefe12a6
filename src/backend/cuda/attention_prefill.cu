// Paged attention for prefill chunks (and mixed steps): block (query tile, head, sequence) holds
// 16 query rows of one sequence; 32-key tiles of K and V are staged in shared memory and shared
// by the tile's rows (4 warps x 4 rows; lane = key for scores, lane = output dims for P.V).
// Causal, sliding window, soft-capping and GQA are per-(row, key) masks/maps; attention sinks
// (args.sinks) add exp(sink - max) to a row's final denominator. A plain CUDA-core
// flash-style kernel: correct first; tensor-core tiles are later work. A quantized pool
// (kv.quant) is read through KvLoad (kv_rows.cuh) as the tiles are staged.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kTileRows = kWarps * kRowsPerWarp;  // 16
constexpr int kTileKeys = 32;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

size_t SharedBytes(int32_t D) {
  return sizeof(float) * (static_cast<size_t>(kTileRows) * D + kTileKeys * (D + 1) +
                          static_cast<size_t>(kTileKeys) * D) +
         sizeof(int64_t) * kTileKeys;
}

__global__ void __launch_bounds__(kWarps * 32)
    AttentionPrefillKernel(AttentionArgs a, const float* __restrict__ q, KvLayerView kv,
                           PlanView plan, float* __restrict__ out) {
  extern __shared__ float smem[];
  const int32_t D = a.head_dim;
  float* q_s = smem;                          // [kTileRows][D]
  float* k_s = q_s + kTileRows * D;           // [kTileKeys][D + 1] (padded: lane = key)
  float* v_s = k_s + kTileKeys * (D + 1);     // [kTileKeys][D]
  int64_t* slot_s = reinterpret_cast<int64_t*>(v_s + kTileKeys * D);  // [kTileKeys]

  const int4 seq = plan.seqs[blockIdx.z];
  const int32_t head = blockIdx.y;
  const int32_t tile_start = blockIdx.x * kTileRows;
  if (tile_start >= seq.y) return;
  const int32_t rows = min(kTileRows, seq.y - tile_start);
  const int32_t first_token = seq.x + tile_start;
  const int32_t kv_head = head / (a.num_heads / a.num_kv_heads);
  const int32_t* block_table = plan.block_tables + seq.w;
  const int32_t bs = plan.block_size;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int idx = threadIdx.x; idx < kTileRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    q_s[idx] = r < rows ? q[(static_cast<int64_t>(first_token + r) * a.num_heads + head) * D + d]
                        : 0.f;
  }
  const int32_t first_pos = plan.positions[first_token];
  const int32_t last_pos = plan.positions[first_token + rows - 1];
  int32_t row_pos[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    row_pos[rr] = r < rows ? plan.positions[first_token + r] : -1;
  }
  const int32_t lo = a.sliding_window > 0 ? max(0, first_pos - a.sliding_window + 1) : 0;
  const int32_t hi = last_pos + 1;

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[rr][i] = 0.f;
  }

  for (int32_t kt = lo; kt < hi; kt += kTileKeys) {
    __syncthreads();  // previous tile fully consumed
    if (threadIdx.x < kTileKeys) {
      const int32_t key = kt + threadIdx.x;
      slot_s[threadIdx.x] =
          key < hi ? static_cast<int64_t>(block_table[key / bs]) * bs + key % bs : -1;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTileKeys * D; idx += blockDim.x) {
      const int j = idx / D, d = idx % D;
      const int64_t slot = slot_s[j];
      float kval = 0.f, vval = 0.f;
      if (slot >= 0) {
        kval = KvLoad(kv, false, slot, kv_head, d);
        vval = KvLoad(kv, true, slot, kv_head, d);
      }
      k_s[j * (D + 1) + d] = kval;
      v_s[j * D + d] = vval;
    }
    __syncthreads();
    const int32_t key = kt + lane;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int32_t pos = row_pos[rr];
      if (pos < 0) continue;  // warp-uniform: padding row of the tile
      const bool visible = key < hi && key <= pos &&
                           (a.sliding_window <= 0 || pos - key < a.sliding_window);
      float s = -INFINITY;
      if (visible) {
        const float* q_row = q_s + (warp * kRowsPerWarp + rr) * D;
        const float* k_row = k_s + lane * (D + 1);
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot += q_row[d] * k_row[d];
        s = dot * a.scale;
        if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
      }
      const float tile_max = WarpMax(s);
      if (tile_max == -INFINITY) continue;  // warp-uniform: no visible key in this tile
      const float new_m = fmaxf(m[rr], tile_max);
      const float corr = m[rr] == -INFINITY ? 0.f : expf(m[rr] - new_m);
      const float p = visible ? expf(s - new_m) : 0.f;
      l[rr] = l[rr] * corr + p;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) acc[rr][i] *= corr;
      for (int j = 0; j < kTileKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) {
          const int d = lane + 32 * i;
          if (d < D) acc[rr][i] += pj * v_s[j * D + d];
        }
      }
      m[rr] = new_m;
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (row_pos[rr] < 0) continue;
    float total = WarpSum(l[rr]);
    if (a.sinks != nullptr) total += expf(a.sinks[head] - m[rr]);  // m: the row's max, warp-uniform
    const int32_t token = first_token + warp * kRowsPerWarp + rr;
    float* out_row = out + (static_cast<int64_t>(token) * a.num_heads + head) * D;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) out_row[d] = acc[rr][i] / total;
    }
  }
}

}  // namespace

void LaunchAttentionPrefill(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                            const PlanView& plan, int32_t max_query_len, float* out,
                            cudaStream_t stream) {
  if (plan.num_tokens == 0 || plan.num_seqs == 0) return;
  const size_t smem = SharedBytes(args.head_dim);
  static size_t configured_smem = 0;  // the attribute is per function; raise it once
  if (smem > 48 * 1024 && smem > configured_smem) {
    CUDA_CHECK(cudaFuncSetAttribute(AttentionPrefillKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(SharedBytes(kMaxHeadDim))));
    configured_smem = SharedBytes(kMaxHeadDim);
  }
  const dim3 grid((max_query_len + kTileRows - 1) / kTileRows, args.num_heads, plan.num_seqs);
  AttentionPrefillKernel<<<grid, kWarps * 32, smem, stream>>>(args, q, kv, plan, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
