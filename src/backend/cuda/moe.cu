// Mixture-of-experts MLP (Backend::MoeMlp) on the device, with no host round trip (decode steps
// replay as graphs): six launches (five up to kFusedRouteRows rows).
//   0. router: a warp per (row, expert): the logit, f32 x times the router row, f32 accumulation
//      (+ the router bias, gpt_oss).
//   1. route: a warp per row: softmax of the router logits, the top k (lower expert first on
//      ties), renormalised when asked, chosen experts written in ascending order (the CPU twin:
//      backend/moe_route.h).
//   2. schedule (one block): the (row, slot) pairs grouped by expert, rows ascending within an
//      expert, and cut into tiles of up to kMoeTileRows pairs of one expert.
//   3. gate/up: per tile, its pairs' x rows in shared memory (f32); a warp per pair of
//      intermediate features streams those features' gate and up rows (16-byte loads) against
//      every row of the tile; gate and up (+ their biases) through the activation: silu(gate) * up
//      or gpt_oss's clamped SwiGLU, f32.
//   4. down: the same over the tile's act rows and the down rows (+ the down bias).
//   5. combine: out[i] = sum over the row's slots in ascending expert order of weight * y.
// Each pair's dot products are reduced in a fixed order (lane-strided partial sums, then the warp
// butterfly) whatever the other pairs of its tile, so a row's result does not depend on the
// batch. The grid is sized for the worst case (MoeMaxTiles); tiles past the schedule's count
// exit at once. f32 accumulation throughout; weights bf16 or f32 (or MXFP4 experts with a bf16
// router, dequantized as they load to the values the bf16 path would read), x f32, biases f32.
// Without biases and with silu the arithmetic is what it was before either existed (the same bits).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kScheduleThreads = 1024;
constexpr int kFusedRouteRows = 64;  // steps of up to this many rows route inside the schedule
constexpr int kWarps = 8;            // gate/up and down blocks
constexpr int kFeaturesPerWarp = 2;
constexpr int kFeaturesPerBlock = kWarps * kFeaturesPerWarp;

// MXFP4 expert rows (gpt-oss checkpoints kept packed): per row, k / 2 bytes of FP4 E2M1 pairs
// (low nibble first) and k / 32 scale bytes (2^(scale - 127) per block of 32).
struct Mxfp4 {};

// Loads<W>: a weight row's reference (Ref), made from the expert's matrix (and scales) and a
// row, and Get: its 8 weights at element c (c % 8 == 0) as f32.
template <typename W>
struct Loads;
template <>
struct Loads<__nv_bfloat16> {  // 8 weights per 16-byte load
  using Ref = const __nv_bfloat16*;
  static __device__ __forceinline__ Ref Row(const void* w, const void*, int64_t row, int64_t k) {
    return static_cast<const __nv_bfloat16*>(w) + row * k;
  }
  static __device__ __forceinline__ void Get(Ref w, int64_t c, float (&f)[8]) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w + c));
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(pairs[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};
template <>
struct Loads<float> {
  using Ref = const float*;
  static __device__ __forceinline__ Ref Row(const void* w, const void*, int64_t row, int64_t k) {
    return static_cast<const float*>(w) + row * k;
  }
  static __device__ __forceinline__ void Get(Ref w, int64_t c, float (&f)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(w + c));
    const float4 b = __ldg(reinterpret_cast<const float4*>(w + c + 4));
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
};
template <>
struct Loads<Mxfp4> {  // 8 weights per 4-byte load (+ the block's scale byte)
  struct Ref {
    const uint8_t* blocks;
    const uint8_t* scales;
  };
  static __device__ __forceinline__ Ref Row(const void* w, const void* scales, int64_t row,
                                            int64_t k) {
    return {static_cast<const uint8_t*>(w) + row * (k / 2),
            static_cast<const uint8_t*>(scales) + row * (k / 32)};
  }
  // The two E2M1 nibbles of byte b (low first) times 2^-14: each placed at fp16's bits 15 and
  // 11..9 (the e = 0 half-values land on fp16 subnormals), exactly.
  static __device__ __forceinline__ float2 Nibbles(uint32_t b) {
    const uint32_t h2 =
        ((b & 0x08u) << 12) | ((b & 0x07u) << 9) | ((b & 0x80u) << 24) | ((b & 0x70u) << 21);
    return __half22float2(*reinterpret_cast<const __half2*>(&h2));
  }
  // 8 weights: E2M1 times 2^(s - 127), the values the host's dequantization to bf16 gives
  // (model/weight_convert.cc: ldexp, then bf16 RN). For scales in [2, 240] that is one exact
  // multiply by 2^(s - 113) (a normal float); outside, ldexp and the bf16 rounding (values below
  // bf16's normal range round).
  static __device__ __forceinline__ void Get(Ref w, int64_t c, float (&f)[8]) {
    const uint32_t packed = __ldg(reinterpret_cast<const uint32_t*>(w.blocks + c / 2));
    const int s = __ldg(w.scales + c / 32);
    if (s >= 2 && s <= 240) {
      const float scale = __uint_as_float(static_cast<uint32_t>(s + 14) << 23);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = Nibbles(packed >> (8 * i));
        f[2 * i] = v.x * scale;
        f[2 * i + 1] = v.y * scale;
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = Nibbles(packed >> (8 * i));
      f[2 * i] = __bfloat162float(__float2bfloat16_rn(ldexpf(v.x, s - 113)));
      f[2 * i + 1] = __bfloat162float(__float2bfloat16_rn(ldexpf(v.y, s - 113)));
    }
  }
};

// acc_p[r] += w_p . xs[r] over k (k % 8 == 0), lane-strided, for the tile's `rows` rows and
// kParts weight rows streamed together (gate and up: both rows' loads in flight at once).
template <int kParts, typename W>
__device__ __forceinline__ void DotRows(const typename Loads<W>::Ref (&w)[kParts], const float* xs,
                                        int64_t k, int rows, float (&acc)[kParts][kMoeTileRows]) {
  const int lane = threadIdx.x % 32;
#pragma unroll 2
  for (int64_t c = lane * 8; c < k; c += 32 * 8) {
    float wf[kParts][8];
#pragma unroll
    for (int q = 0; q < kParts; ++q) Loads<W>::Get(w[q], c, wf[q]);
#pragma unroll
    for (int r = 0; r < kMoeTileRows; ++r) {
      if (r >= rows) break;
      const float4 x0 = *reinterpret_cast<const float4*>(xs + r * k + c);
      const float4 x1 = *reinterpret_cast<const float4*>(xs + r * k + c + 4);
#pragma unroll
      for (int q = 0; q < kParts; ++q) {
        acc[q][r] += wf[q][0] * x0.x + wf[q][1] * x0.y + wf[q][2] * x0.z + wf[q][3] * x0.w +
                     wf[q][4] * x1.x + wf[q][5] * x1.y + wf[q][6] * x1.z + wf[q][7] * x1.w;
      }
    }
  }
}

// logits[row, e] = router[e] . x[row] (+ bias[e] when bias is not null): a warp per (row, expert),
// lane-strided over d (d % 8 == 0) then the warp butterfly.
template <typename W>
__global__ void MoeRouterKernel(const float* __restrict__ x, const W* __restrict__ router,
                                const float* __restrict__ bias, int64_t rows,
                                int32_t num_experts, int64_t d, float* __restrict__ logits) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (item >= rows * num_experts) return;
  const int64_t row = item / num_experts, e = item % num_experts;
  float acc[1][kMoeTileRows] = {};
  const W* const w[1] = {router + e * d};
  DotRows<1, W>(w, x + row * d, d, 1, acc);
  float logit = WarpSum(acc[0][0]);
  if (bias != nullptr) logit += bias[e];
  if (threadIdx.x % 32 == 0) logits[item] = logit;
}

// One row, by one whole warp.
__device__ void RouteRow(const float* __restrict__ logits, int64_t row, int32_t num_experts,
                         int32_t top_k, bool normalize, int32_t* __restrict__ ids,
                         float* __restrict__ weights) {
  const int lane = threadIdx.x % 32;
  const float* l = logits + row * num_experts;
  float max = -INFINITY;
  for (int e = lane; e < num_experts; e += 32) max = fmaxf(max, l[e]);
  max = WarpMax(max);
  float sum = 0.0f;
  for (int e = lane; e < num_experts; e += 32) sum += expf(l[e] - max);
  sum = WarpSum(sum);
  uint32_t chosen = 0;  // bit i: expert lane + 32 i taken
  int32_t top_e[kMoeMaxTopK];
  float top_p[kMoeMaxTopK];
  for (int r = 0; r < top_k; ++r) {
    float best_p = -1.0f;
    int best_e = num_experts;
    for (int i = 0, e = lane; e < num_experts; ++i, e += 32) {
      if (chosen & (1u << i)) continue;
      const float p = expf(l[e] - max) / sum;
      if (p > best_p) {  // e ascends, so ties keep the lower expert
        best_p = p;
        best_e = e;
      }
    }
    WarpArgmax(best_p, best_e);
    if (best_e % 32 == lane) chosen |= 1u << (best_e / 32);
    top_e[r] = best_e;
    top_p[r] = best_p;
  }
  if (lane != 0) return;
  float top_sum = 0.0f;  // in rank order, as the twin
  for (int r = 0; r < top_k; ++r) top_sum += top_p[r];
  for (int r = 1; r < top_k; ++r) {  // ascending expert order
    const int32_t e = top_e[r];
    const float p = top_p[r];
    int j = r;
    for (; j > 0 && top_e[j - 1] > e; --j) {
      top_e[j] = top_e[j - 1];
      top_p[j] = top_p[j - 1];
    }
    top_e[j] = e;
    top_p[j] = p;
  }
  for (int r = 0; r < top_k; ++r) {
    ids[row * top_k + r] = top_e[r];
    weights[row * top_k + r] = normalize ? top_p[r] / top_sum : top_p[r];
  }
}

__global__ void MoeRouteKernel(const float* __restrict__ logits, int32_t n, int32_t num_experts,
                               int32_t top_k, bool normalize, int32_t* __restrict__ ids,
                               float* __restrict__ weights) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (row < n) RouteRow(logits, row, num_experts, top_k, normalize, ids, weights);
}

// One block. Pairs p = row * top_k + slot; sorted[offset[e] + j] is the j-th pair (by row) routed
// to expert e, pair_pos its inverse; tiles[3 t ..] = {expert, first, end} in sorted positions.
// With route_rows (steps of up to kFusedRouteRows rows: one launch fewer) the block's warps first
// route those rows themselves.
__global__ void MoeScheduleKernel(const float* __restrict__ logits, int32_t route_rows,
                                  bool normalize, int32_t* __restrict__ ids,
                                  float* __restrict__ weights, int32_t pairs, int32_t top_k,
                                  int32_t num_experts, int32_t* __restrict__ sorted,
                                  int32_t* __restrict__ pair_pos, int32_t* __restrict__ tiles,
                                  int32_t* __restrict__ num_tiles) {
  for (int64_t row = threadIdx.x / 32; row < route_rows; row += blockDim.x / 32)
    RouteRow(logits, row, num_experts, top_k, normalize, ids, weights);
  __syncthreads();  // (the block's own global writes are visible to it after the barrier)
  __shared__ int32_t count[kMoeMaxExperts];
  __shared__ int32_t offset[kMoeMaxExperts];
  __shared__ int32_t tile_base[kMoeMaxExperts];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t at = 0, tile = 0;
    for (int e = 0; e < num_experts; ++e) {
      offset[e] = at;
      tile_base[e] = tile;
      at += count[e];
      tile += (count[e] + kMoeTileRows - 1) / kMoeTileRows;
    }
    *num_tiles = tile;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    if (count[e] == 0) continue;
    int32_t at = offset[e];
    for (int p = 0; p < pairs; ++p) {
      if (ids[p] != e) continue;
      sorted[at] = p;
      pair_pos[p] = at;
      ++at;
    }
    const int32_t end = offset[e] + count[e];
    for (int32_t first = offset[e], t = tile_base[e]; first < end; first += kMoeTileRows, ++t) {
      tiles[3 * t] = e;
      tiles[3 * t + 1] = first;
      tiles[3 * t + 2] = min(end, first + kMoeTileRows);
    }
  }
}

// The gated activation of the gate/up kernel and the experts' gate/up biases (null: none).
struct ExpertActivation {
  const float* const* gate_bias;  // [num_experts] pointers to [inter] f32, or null
  const float* const* up_bias;
  bool clamped_swiglu;            // false: silu(g) * u
  float limit, alpha;
};

// act(g, u): silu(g) u, or (gpt_oss, transformers' order) g' = min(g, limit),
// u' = clamp(u, -limit, limit), (u' + 1) (g' sigmoid(alpha g')).
__device__ __forceinline__ float Activate(float g, float u, const ExpertActivation& p) {
  if (!p.clamped_swiglu) return g / (1.0f + expf(-g)) * u;
  g = fminf(g, p.limit);
  u = fminf(fmaxf(u, -p.limit), p.limit);
  return (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(g * p.alpha)))));
}

struct Tile {
  int32_t expert, first, rows;
};
__device__ __forceinline__ bool LoadTile(const int32_t* tiles, const int32_t* num_tiles, Tile* t) {
  if (static_cast<int32_t>(blockIdx.x) >= *num_tiles) return false;
  t->expert = tiles[3 * blockIdx.x];
  t->first = tiles[3 * blockIdx.x + 1];
  t->rows = tiles[3 * blockIdx.x + 2] - t->first;
  return true;
}

template <typename W>
__global__ void __launch_bounds__(kWarps * 32)
    MoeGateUpKernel(const float* __restrict__ x, const void* const* __restrict__ gate,
                    const void* const* __restrict__ up, const void* const* __restrict__ gate_scales,
                    const void* const* __restrict__ up_scales, const int32_t* __restrict__ sorted,
                    const int32_t* __restrict__ tiles, const int32_t* __restrict__ num_tiles,
                    int32_t top_k, int64_t d, int64_t inter, ExpertActivation activation,
                    float* __restrict__ act) {
  extern __shared__ float xs[];  // [rows, d]
  Tile t;
  if (!LoadTile(tiles, num_tiles, &t)) return;
  for (int64_t i = threadIdx.x; i < t.rows * d / 4; i += blockDim.x) {
    const int64_t r = i / (d / 4), c = i % (d / 4) * 4;
    const int64_t row = sorted[t.first + r] / top_k;
    *reinterpret_cast<float4*>(xs + r * d + c) = *reinterpret_cast<const float4*>(x + row * d + c);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const void* g_w = gate[t.expert];
  const void* u_w = up[t.expert];
  const void* g_s = gate_scales != nullptr ? gate_scales[t.expert] : nullptr;
  const void* u_s = up_scales != nullptr ? up_scales[t.expert] : nullptr;
  const float* g_b = activation.gate_bias != nullptr ? activation.gate_bias[t.expert] : nullptr;
  const float* u_b = activation.up_bias != nullptr ? activation.up_bias[t.expert] : nullptr;
#pragma unroll
  for (int f = 0; f < kFeaturesPerWarp; ++f) {
    const int64_t c =
        static_cast<int64_t>(blockIdx.y) * kFeaturesPerBlock + warp * kFeaturesPerWarp + f;
    if (c >= inter) break;
    float acc[2][kMoeTileRows] = {};
    const typename Loads<W>::Ref rows_w[2] = {Loads<W>::Row(g_w, g_s, c, d),
                                              Loads<W>::Row(u_w, u_s, c, d)};
    DotRows<2, W>(rows_w, xs, d, t.rows, acc);
#pragma unroll
    for (int r = 0; r < kMoeTileRows; ++r) {
      acc[0][r] = WarpSum(acc[0][r]);
      acc[1][r] = WarpSum(acc[1][r]);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kMoeTileRows; ++r) {
        if (r >= t.rows) break;
        float g = acc[0][r], u = acc[1][r];
        if (g_b != nullptr) {
          g += g_b[c];
          u += u_b[c];
        }
        act[(t.first + r) * inter + c] = Activate(g, u, activation);
      }
    }
  }
}

template <typename W>
__global__ void __launch_bounds__(kWarps * 32)
    MoeDownKernel(const float* __restrict__ act, const void* const* __restrict__ down,
                  const void* const* __restrict__ down_scales,
                  const float* const* __restrict__ down_bias, const int32_t* __restrict__ tiles,
                  const int32_t* __restrict__ num_tiles, int64_t d, int64_t inter,
                  float* __restrict__ y) {
  extern __shared__ float as[];  // [rows, inter]
  Tile t;
  if (!LoadTile(tiles, num_tiles, &t)) return;
  for (int64_t i = threadIdx.x; i < t.rows * inter / 4; i += blockDim.x)
    reinterpret_cast<float4*>(as)[i] = reinterpret_cast<const float4*>(act + t.first * inter)[i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const void* d_w = down[t.expert];
  const void* d_s = down_scales != nullptr ? down_scales[t.expert] : nullptr;
  const float* d_b = down_bias != nullptr ? down_bias[t.expert] : nullptr;  // [d] or null
#pragma unroll
  for (int f = 0; f < kFeaturesPerWarp; ++f) {
    const int64_t c =
        static_cast<int64_t>(blockIdx.y) * kFeaturesPerBlock + warp * kFeaturesPerWarp + f;
    if (c >= d) break;
    float acc[1][kMoeTileRows] = {};
    const typename Loads<W>::Ref rows_w[1] = {Loads<W>::Row(d_w, d_s, c, inter)};
    DotRows<1, W>(rows_w, as, inter, t.rows, acc);
#pragma unroll
    for (int r = 0; r < kMoeTileRows; ++r) acc[0][r] = WarpSum(acc[0][r]);
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kMoeTileRows; ++r) {
        if (r >= t.rows) break;
        y[(t.first + r) * d + c] = d_b != nullptr ? acc[0][r] + d_b[c] : acc[0][r];
      }
    }
  }
}

__global__ void MoeCombineKernel(const float* __restrict__ y, const float* __restrict__ weights,
                                 const int32_t* __restrict__ pair_pos, int32_t top_k, int64_t d,
                                 float* __restrict__ out) {
  const int64_t row = blockIdx.x;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int64_t p = row * top_k + j;
      acc = __fadd_rn(acc, __fmul_rn(y[pair_pos[p] * d + c], weights[p]));
    }
    out[row * d + c] = acc;
  }
}

void LaunchRouteAndSchedule(const MoeArgs& a, cudaStream_t stream) {
  const bool fused_route = a.rows <= kFusedRouteRows;
  if (!fused_route) {
    MoeRouteKernel<<<static_cast<unsigned>((a.rows + kRouteWarps - 1) / kRouteWarps),
                     kRouteWarps * 32, 0, stream>>>(a.logits, static_cast<int32_t>(a.rows),
                                                    a.num_experts, a.top_k, a.normalize, a.ids,
                                                    a.weights);
    CUDA_CHECK(cudaGetLastError());
  }
  MoeScheduleKernel<<<1, kScheduleThreads, 0, stream>>>(
      a.logits, fused_route ? static_cast<int32_t>(a.rows) : 0, a.normalize, a.ids, a.weights,
      static_cast<int32_t>(a.rows * a.top_k), a.top_k, a.num_experts, a.sorted, a.pair_pos, a.tiles,
      a.num_tiles);
  CUDA_CHECK(cudaGetLastError());
}

template <typename W, typename R>  // expert weights, router weights
void LaunchStages(const MoeArgs& a, cudaStream_t stream) {
  const int64_t router_threads = a.rows * a.num_experts * 32;
  MoeRouterKernel<R><<<static_cast<unsigned>((router_threads + 255) / 256), 256, 0, stream>>>(
      a.x, static_cast<const R*>(a.router), a.router_bias, a.rows, a.num_experts, a.d, a.logits);
  CUDA_CHECK(cudaGetLastError());
  LaunchRouteAndSchedule(a, stream);
  const size_t x_smem = sizeof(float) * kMoeTileRows * static_cast<size_t>(a.d);
  const size_t act_smem = sizeof(float) * kMoeTileRows * static_cast<size_t>(a.inter);
  const unsigned tiles = static_cast<unsigned>(a.max_tiles);
  const ExpertActivation activation{a.gate_bias, a.up_bias, a.clamped_swiglu, a.swiglu_limit,
                                 a.swiglu_alpha};
  MoeGateUpKernel<W>
      <<<dim3(tiles, static_cast<unsigned>((a.inter + kFeaturesPerBlock - 1) / kFeaturesPerBlock)),
         kWarps * 32, x_smem, stream>>>(a.x, a.gate, a.up, a.gate_scales, a.up_scales, a.sorted,
                                        a.tiles, a.num_tiles, a.top_k, a.d, a.inter, activation,
                                        a.act);
  CUDA_CHECK(cudaGetLastError());
  MoeDownKernel<W>
      <<<dim3(tiles, static_cast<unsigned>((a.d + kFeaturesPerBlock - 1) / kFeaturesPerBlock)),
         kWarps * 32, act_smem, stream>>>(a.act, a.down, a.down_scales, a.down_bias, a.tiles,
                                          a.num_tiles, a.d, a.inter, a.y);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int32_t MoeMaxTiles(int64_t rows, int32_t top_k, int32_t num_experts) {
  const int64_t pairs = rows * top_k;
  return static_cast<int32_t>(
      std::min<int64_t>(pairs, (pairs + kMoeTileRows - 1) / kMoeTileRows + num_experts));
}

bool MoeSupported(int32_t num_experts, int32_t top_k, int64_t d, int64_t inter) {
  return num_experts >= 1 && num_experts <= kMoeMaxExperts && top_k >= 1 && top_k <= kMoeMaxTopK &&
         top_k <= num_experts && d % 8 == 0 && inter % 8 == 0 &&
         static_cast<int64_t>(kMoeTileRows) * std::max(d, inter) * 4 <= kMoeMaxSmem;
}

void PrepareMoeKernels() {
  // Up to kMoeMaxSmem bytes of rows; set once, outside any graph capture.
  for (const void* kernel : {reinterpret_cast<const void*>(MoeGateUpKernel<__nv_bfloat16>),
                             reinterpret_cast<const void*>(MoeGateUpKernel<float>),
                             reinterpret_cast<const void*>(MoeGateUpKernel<Mxfp4>),
                             reinterpret_cast<const void*>(MoeDownKernel<__nv_bfloat16>),
                             reinterpret_cast<const void*>(MoeDownKernel<float>),
                             reinterpret_cast<const void*>(MoeDownKernel<Mxfp4>)}) {
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMoeMaxSmem));
  }
}

void LaunchMoeMlp(const MoeArgs& a, cudaStream_t stream) {
  CHECK(MoeSupported(a.num_experts, a.top_k, a.d, a.inter))
      << a.num_experts << " experts, top " << a.top_k << ", d " << a.d << ", inter " << a.inter;
  if (a.rows == 0) return;
  if (a.mxfp4) {
    CHECK(a.w_bf16 && a.d % 32 == 0 && a.inter % 32 == 0)
        << "MXFP4 experts: bf16 router, d " << a.d << ", inter " << a.inter;
    LaunchStages<Mxfp4, __nv_bfloat16>(a, stream);
  } else if (a.w_bf16) {
    LaunchStages<__nv_bfloat16, __nv_bfloat16>(a, stream);
  } else {
    LaunchStages<float, float>(a, stream);
  }
  MoeCombineKernel<<<static_cast<unsigned>(a.rows), 256, 0, stream>>>(a.y, a.weights, a.pair_pos,
                                                                      a.top_k, a.d, a.out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda
