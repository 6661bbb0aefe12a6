// Paged attention, one query row per block (decode steps): block (kv head, row, split) runs 4 warps
// over its share of the row's visible keys; each lane scores one key per 32-key tile and owns
// head_dim / 32 output dims. With num_splits > 1 (long contexts, few rows) each split writes an
// unnormalised partial (max, sum, acc[head_dim]) and a second kernel merges them (split-K).
// Attention sinks (args.sinks) join the denominator where a row is finally normalised (the
// single split's epilogue, or the merge): exp(sink - max) with the row's overall max.
// A quantized pool (kv.quant) is read through KvLoad (kv_rows.cuh): each value converted to
// float as it is loaded, the arithmetic after that unchanged.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kDimsPerLane = kMaxHeadDim / 32;
constexpr int kMaxGroup = 8;  // query heads per block (GQA group, chunked when larger)

// Block (kv head x group chunk, row, split): the query heads that share one KV head (up to
// kMaxGroup of them) are scored together, so each K/V row is read once per block, not per head.
__global__ void __launch_bounds__(kWarps * 32)
    AttentionDecodeKernel(AttentionArgs a, const float* __restrict__ q, KvLayerView kv,
                          PlanView plan, int32_t num_splits, float* __restrict__ partials,
                          float* __restrict__ out) {
  __shared__ float q_s[kMaxGroup][kMaxHeadDim];
  __shared__ float warp_m[kWarps][kMaxGroup], warp_l[kWarps][kMaxGroup];
  __shared__ float warp_acc[kWarps][kMaxGroup][kMaxHeadDim];
  const int32_t group = a.num_heads / a.num_kv_heads;
  const int32_t chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int32_t kv_head = blockIdx.x / chunks;
  const int32_t head0 = kv_head * group + (blockIdx.x % chunks) * kMaxGroup;
  const int32_t G = min(kMaxGroup, kv_head * group + group - head0);  // heads in this block
  const int32_t token = blockIdx.y, split = blockIdx.z;
  const int32_t D = a.head_dim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t pos = plan.positions[token];
  const int4 seq = plan.seqs[plan.token_seq[token]];
  const int32_t* block_table = plan.block_tables + seq.w;
  const int32_t bs = plan.block_size;

  const int32_t lo = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int32_t hi = pos + 1;  // exclusive
  const int32_t chunk = ((hi - lo + num_splits - 1) / num_splits + 31) / 32 * 32;
  const int32_t k_begin = lo + split * chunk;
  const int32_t k_end = min(hi, k_begin + chunk);

  // The first tile's slot (plan data only) before waiting for the previous kernel (WriteKv).
  int64_t first_slot = 0;
  {
    const int32_t key = k_begin + warp * 32 + lane;
    if (key < k_end) first_slot = static_cast<int64_t>(block_table[key / bs]) * bs + key % bs;
  }
  PdlWait();
  PdlTrigger();
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    q_s[g][d] = q[(static_cast<int64_t>(token) * a.num_heads + head0 + g) * D + d];
  }
  __syncthreads();

  const int64_t kv_row = static_cast<int64_t>(kv.num_kv_heads) * D;  // floats per slot
  const bool vec4 = (D % 4) == 0 && kv.quant == KvQuant::kNone;
  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kDimsPerLane];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] = 0.f;
  }

  for (int32_t tile = k_begin + warp * 32; tile < k_end; tile += kWarps * 32) {
    const int32_t key = tile + lane;
    const bool valid = key < k_end;
    int64_t slot = 0;
    float s[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.f;
    if (valid) {
      slot = tile == k_begin + warp * 32
                 ? first_slot
                 : static_cast<int64_t>(block_table[key / bs]) * bs + key % bs;
      const float* k_row = kv.k + (vec4 ? slot * kv_row + static_cast<int64_t>(kv_head) * D : 0);
      if (vec4) {
        for (int d = 0; d < D; d += 4) {
          const float4 kk = *reinterpret_cast<const float4*>(k_row + d);
#pragma unroll
          for (int g = 0; g < kMaxGroup; ++g)
            if (g < G)
              s[g] += q_s[g][d] * kk.x + q_s[g][d + 1] * kk.y + q_s[g][d + 2] * kk.z +
                      q_s[g][d + 3] * kk.w;
        }
      } else {
        for (int d = 0; d < D; ++d) {
          const float kd = KvLoad(kv, false, slot, kv_head, d);
#pragma unroll
          for (int g = 0; g < kMaxGroup; ++g)
            if (g < G) s[g] += q_s[g][d] * kd;
        }
      }
    }
    float p[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= G) {
        p[g] = 0.f;
        continue;
      }
      float sg = -INFINITY;
      if (valid) {
        sg = s[g] * a.scale;
        if (a.softcap > 0.f) sg = a.softcap * tanhf(sg / a.softcap);
      }
      const float new_m = fmaxf(m[g], WarpMax(sg));
      const float corr = m[g] == -INFINITY ? 0.f : expf(m[g] - new_m);
      p[g] = valid ? expf(sg - new_m) : 0.f;
      l[g] = l[g] * corr + p[g];
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] *= corr;
      m[g] = new_m;
    }
    const int32_t n_keys = min(32, k_end - tile);
    for (int j = 0; j < n_keys; ++j) {
      const int64_t slot_j = __shfl_sync(0xffffffffu, slot, j);
      float vv[kDimsPerLane];
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        vv[i] = d < D ? KvLoad(kv, true, slot_j, kv_head, d) : 0.f;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        const float pj = __shfl_sync(0xffffffffu, p[g], j);
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) acc[g][i] += pj * vv[i];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= G) break;
    const float lg = WarpSum(l[g]);
    if (lane == 0) {
      warp_m[warp][g] = m[g];
      warp_l[warp][g] = lg;
    }
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) warp_acc[warp][g][d] = acc[g][i];
    }
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    float block_m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) block_m = fmaxf(block_m, warp_m[w][g]);
    float block_l = 0.f, v = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float weight = warp_m[w][g] == -INFINITY ? 0.f : expf(warp_m[w][g] - block_m);
      block_l += warp_l[w][g] * weight;
      v += warp_acc[w][g][d] * weight;
    }
    const int64_t head = head0 + g;
    if (num_splits == 1) {
      if (a.sinks != nullptr) block_l += expf(a.sinks[head] - block_m);
      out[(static_cast<int64_t>(token) * a.num_heads + head) * D + d] = v / block_l;
    } else {
      float* part = partials +
                    ((static_cast<int64_t>(token) * a.num_heads + head) * num_splits + split) * (D + 2);
      if (d == 0) {
        part[0] = block_m;
        part[1] = block_l;
      }
      part[2 + d] = v;
    }
  }
}

// Merges the splits of one (head, row): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)
// (+ e^(sink - M) in the denominator with sinks, [num_heads] or null).
// The per-split weights are computed once into shared memory (all splits' (m, l) loaded in
// parallel), then each thread sums its dims over the splits with independent loads.
constexpr int kMaxSplits = 64;
__global__ void AttentionCombineKernel(int32_t num_heads, int32_t head_dim, int32_t num_splits,
                                       const float* __restrict__ sinks,
                                       const float* __restrict__ partials,
                                       float* __restrict__ out) {
  __shared__ float w_s[kMaxSplits];
  __shared__ float inv_l;
  PdlWait();
  PdlTrigger();
  const int32_t head = blockIdx.x, token = blockIdx.y;
  const int64_t rec = head_dim + 2;
  const float* part = partials + (static_cast<int64_t>(token) * num_heads + head) * num_splits * rec;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float ms[2], ls[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = lane + 32 * i;
      ms[i] = s < num_splits ? part[s * rec] : -INFINITY;
      ls[i] = s < num_splits ? part[s * rec + 1] : 0.f;
    }
    const float M = WarpMax(fmaxf(ms[0], ms[1]));
    float L = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float w = ms[i] == -INFINITY ? 0.f : expf(ms[i] - M);
      if (lane + 32 * i < num_splits) w_s[lane + 32 * i] = w;
      L += ls[i] * w;
    }
    L = WarpSum(L);
    if (sinks != nullptr) L += expf(sinks[head] - M);
    if (lane == 0) inv_l = 1.f / L;
  }
  __syncthreads();
  float* out_row = out + (static_cast<int64_t>(token) * num_heads + head) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float v = 0.f;
#pragma unroll 8
    for (int s = 0; s < num_splits; ++s) v += part[s * rec + 2 + d] * w_s[s];
    out_row[d] = v * inv_l;
  }
}

}  // namespace

int64_t DecodePartialsFloats(int32_t num_tokens, int32_t num_heads, int32_t head_dim,
                             int32_t num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<int64_t>(num_tokens) * num_heads * num_splits * (head_dim + 2);
}

void LaunchAttentionDecode(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                           const PlanView& plan, int32_t num_splits, float* partials, float* out,
                           cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  const int32_t group = args.num_heads / args.num_kv_heads;
  const dim3 grid(args.num_kv_heads * ((group + kMaxGroup - 1) / kMaxGroup), plan.num_tokens,
                  num_splits);
  LaunchPdl(AttentionDecodeKernel, grid, dim3(kWarps * 32), 0, stream, args, q, kv, plan,
            num_splits, partials, out);
  if (num_splits > 1) {
    CHECK(num_splits <= kMaxSplits) << num_splits << " splits";
    LaunchPdl(AttentionCombineKernel, dim3(args.num_heads, plan.num_tokens), dim3(128), 0, stream,
              args.num_heads, args.head_dim, num_splits, args.sinks,
              static_cast<const float*>(partials), out);
  }
}

}  // namespace ember::cuda
