// Mixture-of-experts MLP (Backend::MoeMlp) on the device, with no host round trip (decode steps
// replay as graphs): six launches (five up to kFusedRouteRows rows).
//   0. router: a warp per (row, expert): the logit, f32 x times the router row, f32 accumulation
//      (+ the router bias, gpt_oss).
//   1. route: a warp per row: softmax of the router logits, the top k (lower expert first on
//      ties), renormalised when asked, chosen experts written in ascending order (the CPU twin:
//      backend/moe_route.h); or deepseek_v3's grouped sigmoid routing (MoeRouteSpec::grouped:
//      one lane per row, in MoeRouteGrouped's order).
//   2. schedule (one block): the (row, slot) pairs grouped by expert, rows ascending within an
//      expert, and cut into tiles of up to kMoeTileRows (SIMT) or 8, 64 or 128 (tensor cores)
//      pairs of one expert.
//   3. gate/up: SIMT (MoeArgs::mma false; the tensor-core kernels are described below, at
//      MmaConfig): per tile, its pairs' x rows in shared memory (f32); a warp per pair of
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
// With MoeArgs::mma, stages 3 and 4 run as grouped GEMMs on tensor cores instead (bf16 or MXFP4
// weights; the experts' inputs rounded to bf16; also batch-invariant), with one more launch for
// large steps (x gathered to bf16 in expert order).
// Small SIMT steps (MoeByPair: batch-1 decode, small batches) skip stages 2 and 5: gate/up by
// (pair, feature), down by (row, feature) with the combine folded in, the same operations in the
// same order (the same bits); four launches, each a programmatic dependent launch (see
// MoePairGateUpKernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cache_hints.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kScheduleThreads = 1024;
constexpr int kFusedRouteRows = 64;  // steps of up to this many rows route inside the schedule

// The route kernels' score bias: router_bias under grouped routing (MoeRouteSpec), else none.
inline const float* ScoreBias(const MoeArgs& a) {
  return a.route.grouped ? a.router_bias : nullptr;
}
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
  using Raw = uint4;
  static __device__ __forceinline__ Ref Row(const void* w, const void*, int64_t row, int64_t k) {
    return static_cast<const __nv_bfloat16*>(w) + row * k;
  }
  static __device__ __forceinline__ Raw Fetch(Ref w, int64_t c, uint64_t policy) {
    return LoadStreaming16(w + c, policy);
  }
  static __device__ __forceinline__ void Unpack(const Raw& raw, float (&f)[8]) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(pairs[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
  static __device__ __forceinline__ void Get(Ref w, int64_t c, float (&f)[8]) {
    Unpack(__ldg(reinterpret_cast<const uint4*>(w + c)), f);
  }
};
template <>
struct Loads<float> {
  using Ref = const float*;
  struct Raw {
    float4 a, b;
  };
  static __device__ __forceinline__ Ref Row(const void* w, const void*, int64_t row, int64_t k) {
    return static_cast<const float*>(w) + row * k;
  }
  static __device__ __forceinline__ Raw Fetch(Ref w, int64_t c, uint64_t) {
    return {__ldg(reinterpret_cast<const float4*>(w + c)),
            __ldg(reinterpret_cast<const float4*>(w + c + 4))};
  }
  static __device__ __forceinline__ void Unpack(const Raw& r, float (&f)[8]) {
    f[0] = r.a.x, f[1] = r.a.y, f[2] = r.a.z, f[3] = r.a.w;
    f[4] = r.b.x, f[5] = r.b.y, f[6] = r.b.z, f[7] = r.b.w;
  }
  static __device__ __forceinline__ void Get(Ref w, int64_t c, float (&f)[8]) {
    Unpack(Fetch(w, c, 0), f);
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
  // multiply of the nibble's value by a power of two (a normal float): for [2, 128] from float
  // bits, for (128, 240] through fp16 (2^(s - 1) would overflow); outside, ldexp and the bf16
  // rounding (values below bf16's normal range round).
  static __device__ __forceinline__ void Get(Ref w, int64_t c, float (&f)[8]) {
    Decode(__ldg(reinterpret_cast<const uint32_t*>(w.blocks + c / 2)), __ldg(w.scales + c / 32), f);
  }
  struct Raw {
    uint32_t packed;
    int scale;
  };
  static __device__ __forceinline__ Raw Fetch(Ref w, int64_t c, uint64_t policy) {
    return {LoadStreaming4(w.blocks + c / 2, policy), __ldg(w.scales + c / 32)};
  }
  static __device__ __forceinline__ void Unpack(const Raw& raw, float (&f)[8]) {
    Decode(raw.packed, raw.scale, f);
  }
  // The 8 weights of 4 packed bytes under scale byte s.
  static __device__ __forceinline__ void Decode(uint32_t packed, int s, float (&f)[8]) {
    if (s >= 2 && s <= 128) {
      // Nibble j's sign at bit 31 and its 3 bits at 24..22 of a float: E2M1 x 2^-126 (the 0.5s a
      // subnormal), times 2^(s - 1), both exact (one shift pair, one select, one multiply each).
      const float scale = __uint_as_float(static_cast<uint32_t>(s + 126) << 23);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t v = packed << (28 - 4 * j);
        f[j] = __uint_as_float((v & 0x80000000u) | ((v >> 6) & 0x01C00000u)) * scale;
      }
      return;
    }
    if (s <= 240) {
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

// One lane-stride group's contribution: its 8 products summed in element order. Every SIMT dot
// product here adds these to its accumulator, so the tile, by-pair and router kernels round alike.
__device__ __forceinline__ float Group8(const float (&w)[8], const float4& x0, const float4& x1) {
  return w[0] * x0.x + w[1] * x0.y + w[2] * x0.z + w[3] * x0.w + w[4] * x1.x + w[5] * x1.y +
         w[6] * x1.z + w[7] * x1.w;
}

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
      for (int q = 0; q < kParts; ++q) acc[q][r] += Group8(wf[q], x0, x1);
    }
  }
}

// acc[q] += w_q . x_q for kParts weight rows, each against its own f32 row x_q (kSharedX: all
// the same row, loaded once), in DotRows' order: lane-strided groups of 8, each group's products
// summed and then added. Fetch issues the loads of Loads<W>::kBatch lane strides from `base`,
// Consume uses them.
template <int kParts, typename W, bool kSharedX, int kBatch>
struct PartDots {
  using L = Loads<W>;
  typename L::Raw raw[kParts][kBatch];
  __device__ __forceinline__ void Fetch(const typename L::Ref (&w)[kParts], int64_t k, int64_t base,
                                        uint64_t policy) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = base + u * 256;
#pragma unroll
      for (int q = 0; q < kParts; ++q)
        raw[q][u] = c < k ? L::Fetch(w[q], c, policy) : typename L::Raw{};
    }
  }
  __device__ __forceinline__ void Consume(const float* const* x, int64_t k, int64_t base,
                                          float (&acc)[kParts]) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t c = base + u * 256;
      if (c >= k) break;
      float4 x0, x1;
#pragma unroll
      for (int q = 0; q < kParts; ++q) {
        if (q == 0 || !kSharedX) {
          x0 = __ldg(reinterpret_cast<const float4*>(x[q] + c));
          x1 = __ldg(reinterpret_cast<const float4*>(x[q] + c + 4));
        }
        float wf[8];
        L::Unpack(raw[q][u], wf);
        acc[q] += Group8(wf, x0, x1);
      }
    }
  }
};

// logits[row, e] = router[e] . x[row] (+ bias[e] when bias is not null): a warp per (row, expert),
// lane-strided over d (d % 8 == 0) then the warp butterfly (DotRows' order). The router row's
// first kRouterBatch lane strides (all of a 3,072-wide one) are loaded before waiting on the
// kernel that wrote x.
constexpr int kRouterBatch = 12;
template <typename W>
__global__ void MoeRouterKernel(const float* __restrict__ x, const W* __restrict__ router,
                                const float* __restrict__ bias, int64_t rows,
                                int32_t num_experts, int64_t d, float* __restrict__ logits) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const bool valid = item < rows * num_experts;
  const int64_t row = item / num_experts, e = item % num_experts;
  const int lane = threadIdx.x % 32;
  using L = Loads<W>;
  const typename L::Ref w[1] = {L::Row(router, nullptr, valid ? e : 0, d)};
  const uint64_t policy = EvictFirstPolicy();
  PartDots<1, W, true, kRouterBatch> dots;
  if (valid) dots.Fetch(w, d, lane * 8, policy);
  PdlWait();  // x: the previous kernel's
  PdlTrigger();
  if (!valid) return;
  const float* const xs[1] = {x + row * d};
  float acc[1] = {};
  for (int64_t base = lane * 8;;) {
    dots.Consume(xs, d, base, acc);
    base += kRouterBatch * 256;
    if (base >= d) break;
    dots.Fetch(w, d, base, policy);
  }
  float logit = WarpSum(acc[0]);
  if (bias != nullptr) logit += bias[e];
  if (lane == 0) logits[item] = logit;
}

// deepseek_v3's grouped sigmoid routing (MoeRouteGrouped, backend/moe_route.h) of one row, by
// one thread, in the host twin's order.
__device__ void RouteRowGrouped(const float* __restrict__ l, int64_t row, int32_t num_experts,
                                int32_t top_k, const MoeRouteSpec& spec,
                                const float* __restrict__ bias, int32_t* __restrict__ ids,
                                float* __restrict__ weights) {
  const int32_t groups = spec.groups, per = num_experts / groups;
  auto score = [&](int32_t e) { return 1.0f / (1.0f + expf(-l[e])); };
  auto choice = [&](int32_t e) { return score(e) + bias[e]; };
  uint64_t kept = 0;
  for (int32_t j = 0; j < spec.top_groups; ++j) {
    float best_score = -INFINITY;
    int32_t best_g = -1;
    for (int32_t g = 0; g < groups; ++g) {
      if (kept & (uint64_t{1} << g)) continue;
      float best = -INFINITY, second = -INFINITY;
      for (int32_t e = g * per; e < (g + 1) * per; ++e) {
        const float v = choice(e);
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      if (best_g < 0 || best + second > best_score) {
        best_score = best + second;
        best_g = g;
      }
    }
    kept |= uint64_t{1} << best_g;
  }
  int32_t top_e[kMoeMaxTopK];
  for (int32_t r = 0; r < top_k; ++r) {
    float best_v = -INFINITY;
    int32_t best_e = -1;
    for (int32_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int32_t q = 0; q < r; ++q) taken |= top_e[q] == e;
      if (taken) continue;
      const float v = (kept & (uint64_t{1} << (e / per))) ? choice(e) : 0.0f;
      if (best_e < 0 || v > best_v) {
        best_v = v;
        best_e = e;
      }
    }
    top_e[r] = best_e;
  }
  for (int32_t r = 1; r < top_k; ++r)  // ascending expert order
    for (int32_t j = r; j > 0 && top_e[j - 1] > top_e[j]; --j) {
      const int32_t t = top_e[j];
      top_e[j] = top_e[j - 1];
      top_e[j - 1] = t;
    }
  float sum = 0.0f;
  for (int32_t r = 0; r < top_k; ++r) sum += score(top_e[r]);
  for (int32_t r = 0; r < top_k; ++r) {
    const float w = score(top_e[r]);
    ids[row * top_k + r] = top_e[r];
    weights[row * top_k + r] = (spec.normalize ? w / (sum + 1e-20f) : w) * spec.scale;
  }
}

// One row, by one whole warp.
__device__ void RouteRow(const float* __restrict__ logits, int64_t row, int32_t num_experts,
                         int32_t top_k, const MoeRouteSpec& spec, const float* __restrict__ bias,
                         int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int lane = threadIdx.x % 32;
  if (spec.grouped) {
    if (lane == 0)
      RouteRowGrouped(logits + row * num_experts, row, num_experts, top_k, spec, bias, ids,
                      weights);
    return;
  }
  const bool normalize = spec.normalize;
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
                               int32_t top_k, MoeRouteSpec route, const float* __restrict__ bias,
                               int32_t* __restrict__ ids,
                               float* __restrict__ weights) {
  PdlWait();  // logits: the router's
  PdlTrigger();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (row < n) RouteRow(logits, row, num_experts, top_k, route, bias, ids, weights);
}

// One block. Pairs p = row * top_k + slot; sorted[offset[e] + j] is the j-th pair (by row) routed
// to expert e, pair_pos its inverse; tiles[3 t ..] = {expert, first, end} in sorted positions,
// each of up to tile_rows pairs.
// With route_rows (steps of up to kFusedRouteRows rows: one launch fewer) the block's warps first
// route those rows themselves.
__global__ void MoeScheduleKernel(const float* __restrict__ logits, int32_t route_rows,
                                  MoeRouteSpec route, const float* __restrict__ bias,
                                  int32_t* __restrict__ ids,
                                  float* __restrict__ weights, int32_t pairs, int32_t top_k,
                                  int32_t num_experts, int32_t tile_rows,
                                  int32_t* __restrict__ sorted, int32_t* __restrict__ pair_pos,
                                  int32_t* __restrict__ tiles, int32_t* __restrict__ num_tiles) {
  for (int64_t row = threadIdx.x / 32; row < route_rows; row += blockDim.x / 32)
    RouteRow(logits, row, num_experts, top_k, route, bias, ids, weights);
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
      tile += (count[e] + tile_rows - 1) / tile_rows;
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
    for (int32_t first = offset[e], t = tile_base[e]; first < end; first += tile_rows, ++t) {
      tiles[3 * t] = e;
      tiles[3 * t + 1] = first;
      tiles[3 * t + 2] = min(end, first + tile_rows);
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

// ---- Small steps by pair (SIMT) ----
// Steps of fewer than kByPairMaxPairsPerExpert (row, expert) pairs per expert on average (batch-1
// decode, small batches: a chosen expert serves about one pair) skip the schedule and the
// combine: gate/up takes a warp per (pair, intermediate feature) and streams the pair's expert
// rows as the batch-1 GEMV does (Loads<W>::kBatch loads per lane and row in flight, no L1
// allocation, evict-first in the L2); down takes a warp per (row, output feature) over the row's
// experts in ascending order and adds weight * y into the row's sum as the combine does. The dot
// products, biases, activation and combine are the tile kernels' operations in the tile kernels'
// order, so a row gets the same bits either way. Four launches (router, route, gate/up, down),
// each a programmatic dependent launch; down reads its experts and issues its first weight loads
// before waiting on gate/up.
constexpr int kPairWarps = 4;
constexpr int64_t kByPairMaxPairsPerExpert = 2;

// act[p, c] for pair p = blockIdx.y and feature c: the gate/up kernel's value.
template <typename W, int kBatch>
__global__ void __launch_bounds__(kPairWarps * 32)
    MoePairGateUpKernel(const float* __restrict__ x, const void* const* __restrict__ gate,
                        const void* const* __restrict__ up,
                        const void* const* __restrict__ gate_scales,
                        const void* const* __restrict__ up_scales, const int32_t* __restrict__ ids,
                        int32_t top_k, int64_t d, int64_t inter, ExpertActivation activation,
                        float* __restrict__ act) {
  const int lane = threadIdx.x % 32;
  const int64_t p = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kPairWarps + threadIdx.x / 32;
  PdlWait();  // ids: the route kernel's
  PdlTrigger();
  if (c >= inter) return;
  const int32_t e = ids[p];
  using L = Loads<W>;
  const typename L::Ref w[2] = {
      L::Row(gate[e], gate_scales != nullptr ? gate_scales[e] : nullptr, c, d),
      L::Row(up[e], up_scales != nullptr ? up_scales[e] : nullptr, c, d)};
  const float* xr = x + p / top_k * d;
  const float* const xs[2] = {xr, xr};
  const uint64_t policy = EvictFirstPolicy();
  float acc[2] = {};
  PartDots<2, W, true, kBatch> dots;
  for (int64_t base = lane * 8; base < d; base += kBatch * 256) {
    dots.Fetch(w, d, base, policy);
    dots.Consume(xs, d, base, acc);
  }
  float g = WarpSum(acc[0]), u = WarpSum(acc[1]);
  if (lane == 0) {
    if (activation.gate_bias != nullptr) {
      g += activation.gate_bias[e][c];
      u += activation.up_bias[e][c];
    }
    act[p * inter + c] = Activate(g, u, activation);
  }
}

// out[row, c] for row = blockIdx.y and feature c: the down kernel's y of each of the row's pairs
// (kParts experts at a time, ascending), combined as MoeCombineKernel does.
template <typename W, int kParts, int kBatch>
__global__ void __launch_bounds__(kPairWarps * 32)
    MoePairDownKernel(const float* __restrict__ act, const void* const* __restrict__ down,
                      const void* const* __restrict__ down_scales,
                      const float* const* __restrict__ down_bias, const int32_t* __restrict__ ids,
                      const float* __restrict__ weights, int32_t top_k, int64_t d, int64_t inter,
                      float* __restrict__ out) {
  using L = Loads<W>;
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kPairWarps + threadIdx.x / 32;
  const bool valid = c < d;
  const int64_t wc = valid ? c : 0;  // (rows of invalid warps: row 0, never consumed)
  const uint64_t policy = EvictFirstPolicy();
  // Pairs j0 + q of the row (the last one repeated past top_k); ids come from the route kernel,
  // which completed before any gate/up block passed its wait, so before this kernel started (read
  // from the L2).
  auto rows_of = [&](int j0, typename L::Ref(&w)[kParts]) {
#pragma unroll
    for (int q = 0; q < kParts; ++q) {
      const int32_t e = __ldcg(ids + row * top_k + min(j0 + q, top_k - 1));
      w[q] = L::Row(down[e], down_scales != nullptr ? down_scales[e] : nullptr, wc, inter);
    }
  };
  PartDots<kParts, W, false, kBatch> dots;
  typename L::Ref w[kParts];
  rows_of(0, w);
  if (valid) dots.Fetch(w, inter, lane * 8, policy);
  PdlWait();  // act: the gate/up kernel's
  if (!valid) return;
  float sum = 0.0f;
  for (int j0 = 0; j0 < top_k; j0 += kParts) {
    if (j0 > 0) {
      rows_of(j0, w);
      dots.Fetch(w, inter, lane * 8, policy);
    }
    const float* xs[kParts];
#pragma unroll
    for (int q = 0; q < kParts; ++q) xs[q] = act + (row * top_k + min(j0 + q, top_k - 1)) * inter;
    float acc[kParts] = {};
    for (int64_t base = lane * 8;;) {
      dots.Consume(xs, inter, base, acc);
      base += kBatch * 256;
      if (base >= inter) break;
      dots.Fetch(w, inter, base, policy);
    }
#pragma unroll
    for (int q = 0; q < kParts; ++q) acc[q] = WarpSum(acc[q]);
    if (lane == 0) {
#pragma unroll
      for (int q = 0; q < kParts; ++q) {
        if (j0 + q >= top_k) break;
        const int64_t p = row * top_k + j0 + q;
        const float* b = down_bias != nullptr ? down_bias[ids[p]] : nullptr;
        const float y = b != nullptr ? acc[q] + b[c] : acc[q];
        sum = __fadd_rn(sum, __fmul_rn(y, weights[p]));
      }
    }
  }
  if (lane == 0) out[row * d + c] = sum;
}

void LaunchRouteAndSchedule(const MoeArgs& a, int32_t tile_rows, cudaStream_t stream) {
  const bool fused_route = a.rows <= kFusedRouteRows;
  if (!fused_route) {
    MoeRouteKernel<<<static_cast<unsigned>((a.rows + kRouteWarps - 1) / kRouteWarps),
                     kRouteWarps * 32, 0, stream>>>(a.logits, static_cast<int32_t>(a.rows),
                                                    a.num_experts, a.top_k, a.route, ScoreBias(a),
                                                    a.ids, a.weights);
    CUDA_CHECK(cudaGetLastError());
  }
  MoeScheduleKernel<<<1, kScheduleThreads, 0, stream>>>(
      a.logits, fused_route ? static_cast<int32_t>(a.rows) : 0, a.route, ScoreBias(a), a.ids,
      a.weights,
      static_cast<int32_t>(a.rows * a.top_k), a.top_k, a.num_experts, tile_rows, a.sorted,
      a.pair_pos, a.tiles, a.num_tiles);
  CUDA_CHECK(cudaGetLastError());
}

// ---- The experts on tensor cores (MoeArgs::mma) ----
// A grouped GEMM over the schedule's tiles: CTA (tile, m block) computes out[first + r, f] for the
// tile's pairs r and BM output features f of its expert, W (the expert's [m, k] rows) the mma A
// operand, the pairs' rows the B operand. The invariant, as gemm_invariant.cu's: every output
// element's f32 accumulator receives the mma.sync m16n8k16 steps of k16 blocks in ascending k
// from 0 (ceil(k / 16) of them, one chain), with W's values and the B row rounded to bf16 RN in
// the natural fragment positions; biases and the activation come after the chain. An element
// depends only on its own W row and B row, so neither the tile shape nor the other pairs of a
// tile change its bits: a row's result is the same in every step. B rows: x (gate/up; pair
// sorted[p] / top_k) or act (down), read f32 and rounded in the fragment load (small steps), or
// bf16 copies made beforehand (x gathered by MoeGatherBf16Kernel; act stored bf16 by gate/up).
// MXFP4 weights are staged as bytes and converted once per stage, in shared memory, to the values
// the bf16 path reads (Loads<Mxfp4>).
template <typename W, int P, int WM, int WN, int TM, int TN, int BK, bool B_F32>
struct MmaConfig {
  static constexpr bool kMx = std::is_same_v<W, Mxfp4>;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kBM = WM * TM * 16, kBN = WN * TN * 8;
  static constexpr int kWRowBytes = kMx ? BK / 2 : BK * 2;  // one weight row of a stage
  static constexpr int kWLd = kWRowBytes + 16;              // + 16-byte pad: conflict-free
  static constexpr int kWBytes = P * kBM * kWLd;
  static constexpr int kLd = BK + 8;    // elements per row of the bf16 W and the B tiles
  static constexpr int kALd = kLd * 2;  // bf16 W rows (the stage's, or MXFP4's converted)
  static constexpr int kCvtBytes = kMx ? P * kBM * kALd : 0;  // MXFP4: one converted stage
  static constexpr int kBElem = B_F32 ? 4 : 2;
  static constexpr int kBLd = kLd * kBElem;
  static constexpr int kStageBytes = kWBytes + kBN * kBLd;
  static constexpr int kWCopies = P * kBM * (kWRowBytes / 16);  // 16-byte copies per stage
  static constexpr int kBCopies = kBN * (BK * kBElem / 16);
  static_assert(BK % 32 == 0 && (B_F32 || TN % 2 == 0), "bad tile");
};

struct MmaParams {
  const void* b;          // B rows [*, k]: f32 (B_F32) or bf16
  const int32_t* gather;  // null: the tile's row r is B row first + r; else gather[first + r] / div
  int32_t gather_div;
  const void* const* w[2];       // per part: [num_experts] pointers to [m, k] weights
  const void* const* scales[2];  // MXFP4: [num_experts] pointers to [m, k / 32] scale bytes
  const float* const* bias[2];   // null or [num_experts] pointers to [m] f32
  const int32_t* tiles;
  const int32_t* num_tiles;
  int64_t m, k;
  ExpertActivation activation;  // P == 2: out = act(gate + bias, up + bias)
  void* out;                    // [pairs, m] in sorted positions: f32, or bf16 (out_bf16)
  bool out_bf16;
};

// MXFP4: the stage's weight bytes (raw, rows of C::kWLd bytes) as bf16 rows of C::kALd bytes in
// cvt, by the whole CTA, 8 weights per item: Loads<Mxfp4>'s values, which bf16 holds exactly, so
// the mma reads what the bf16 path would. ss: the tile's scale bytes ([P * BM][k32]); k0: the
// stage's first k.
template <typename C, int BK>
__device__ __forceinline__ void ConvertMxfp4Stage(const unsigned char* raw, unsigned char* cvt,
                                                  const uint8_t* ss, int64_t k32, int64_t k0) {
  constexpr int kItems = C::kWBytes / C::kWLd * (BK / 8);  // rows x 8-weight groups
  for (int i = threadIdx.x; i < kItems; i += C::kThreads) {
    const int row = i / (BK / 8), c8 = i % (BK / 8);
    float f[8];
    Loads<Mxfp4>::Decode(*reinterpret_cast<const uint32_t*>(raw + row * C::kWLd + c8 * 4),
                         ss[row * k32 + (k0 + c8 * 8) / 32], f);
    const uint32_t out[4] = {PackBf16(f[0], f[1]), PackBf16(f[2], f[3]), PackBf16(f[4], f[5]),
                             PackBf16(f[6], f[7])};
    *reinterpret_cast<uint4*>(cvt + row * C::kALd + c8 * 16) = {out[0], out[1], out[2], out[3]};
  }
}

template <typename W, int P, int WM, int WN, int TM, int TN, int BK, bool B_F32>
__global__ void __launch_bounds__(32 * WM * WN) MoeMmaKernel(MmaParams prm, int stages) {
  using C = MmaConfig<W, P, WM, WN, TM, TN, BK, B_F32>;
  extern __shared__ __align__(16) unsigned char smem[];
  Tile tile;
  if (!LoadTile(prm.tiles, prm.num_tiles, &tile)) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * C::kBM, k = prm.k, m = prm.m;
  const int64_t k32 = (k + 31) / 32, ktiles = (k + BK - 1) / BK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % WM, wn = warp / WM;
  const int g = lane / 4, t = lane % 4;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const unsigned char* w[P];
  unsigned char* cvt = smem + stages * C::kStageBytes;  // MXFP4: the converted stage
  uint8_t* ws_scales = cvt + C::kCvtBytes;              // MXFP4: [P][BM][k32]
#pragma unroll
  for (int p = 0; p < P; ++p) w[p] = static_cast<const unsigned char*>(prm.w[p][tile.expert]);
  if constexpr (C::kMx) {
    uint8_t* sc = ws_scales;
    for (int64_t i = threadIdx.x; i < P * C::kBM * k32; i += C::kThreads) {
      const int p = static_cast<int>(i / (C::kBM * k32));
      const int64_t r = i / k32 % C::kBM, j = i % k32;
      const auto* src = static_cast<const uint8_t*>(prm.scales[p == 0 ? 0 : 1][tile.expert]);
      sc[i] = m0 + r < m ? src[(m0 + r) * k32 + j] : 127;
    }
  }
  // Weight rows past m and B rows past the tile are not copied: they only feed outputs that are
  // never stored. Columns past k are zero-filled.
  const int64_t w_row_bytes = C::kMx ? k / 2 : k * 2;
  auto load_stage = [&](int64_t kt, int slot) {
    const uint32_t base = smem0 + slot * C::kStageBytes;
    for (int c = threadIdx.x; c < C::kWCopies; c += C::kThreads) {
      constexpr int kPerRow = C::kWRowBytes / 16;
      const int p = c / (C::kBM * kPerRow), r = c / kPerRow % C::kBM, cc = c % kPerRow;
      const int64_t col = kt * C::kWRowBytes + cc * 16;  // bytes into the row
      if (m0 + r >= m) continue;
      const bool in_k = col < w_row_bytes;
      const unsigned char* src = (p == 0 ? w[0] : w[P - 1]) + (m0 + r) * w_row_bytes;
      CpAsync16(base + (p * C::kBM + r) * C::kWLd + cc * 16, in_k ? src + col : src, in_k);
    }
    for (int c = threadIdx.x; c < C::kBCopies; c += C::kThreads) {
      constexpr int kPerRow = BK * C::kBElem / 16;
      const int r = c / kPerRow, cc = c % kPerRow;
      if (r >= tile.rows) continue;
      const int64_t pos = tile.first + r;
      const int64_t row = prm.gather != nullptr ? prm.gather[pos] / prm.gather_div : pos;
      const int64_t col = kt * BK + cc * (16 / C::kBElem);  // elements
      const bool in_k = col < k;
      const unsigned char* src =
          static_cast<const unsigned char*>(prm.b) + (row * k + (in_k ? col : 0)) * C::kBElem;
      CpAsync16(base + C::kWBytes + r * C::kBLd + cc * 16, src, in_k);
    }
  };

  float acc[P][TM][TN][4];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j)
        acc[p][i][j][0] = acc[p][i][j][1] = acc[p][i][j][2] = acc[p][i][j][3] = 0.f;

  for (int s = 0; s < stages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    CpAsyncCommit();
  }
  int slot = 0;
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    CpAsyncWaitPending(stages - 2);  // stage kt has landed (this thread's copies)
    __syncthreads();                 // ... everyone's (and the scales); slot kt - 1 is free
    {
      const int64_t next = kt + stages - 1;
      if (next < ktiles) load_stage(next, slot == 0 ? stages - 1 : slot - 1);
      CpAsyncCommit();
    }
    const unsigned char* st = smem + slot * C::kStageBytes;
    const unsigned char* bs = st + C::kWBytes;
    const unsigned char* ws = st;  // bf16 W rows of C::kALd bytes
    if constexpr (C::kMx) {
      ConvertMxfp4Stage<C, BK>(st, cvt, ws_scales, k32, kt * BK);
      __syncthreads();  // (the barrier above: every warp is done with the previous conversion)
      ws = cvt;
    }
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      if (kt * BK + kk >= k) break;  // exactly ceil(k / 16) steps
      uint32_t a[P][TM][4];
      uint32_t b[TN][2];
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < TM; ++i)
          LoadAFragment(a[p][i], reinterpret_cast<const __nv_bfloat16*>(ws),
                        p * C::kBM + wm * TM * 16 + i * 16, C::kLd, kk, lane);
      if constexpr (B_F32) {
#pragma unroll
        for (int j = 0; j < TN; ++j)
          LoadBFragmentF32(b[j], reinterpret_cast<const float*>(bs), wn * TN * 8 + j * 8, C::kLd,
                           kk, lane);
      } else {
#pragma unroll
        for (int j = 0; j < TN; j += 2)
          LoadBFragmentsBf16(b[j], b[j + 1], reinterpret_cast<const __nv_bfloat16*>(bs),
                             wn * TN * 8 + j * 8, C::kLd, kk, lane);
      }
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) Mma(acc[p][i][j], a[p][i], b[j][0], b[j][1]);
    }
    slot = slot == stages - 1 ? 0 : slot + 1;
  }
  CpAsyncWait<0>();

  // acc c0..c3: (feature g, pair 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
  const float* bias[P];
#pragma unroll
  for (int p = 0; p < P; ++p) bias[p] = prm.bias[p] != nullptr ? prm.bias[p][tile.expert] : nullptr;
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t f = m0 + wm * TM * 16 + i * 16 + g + (e >= 2 ? 8 : 0);
        const int r = wn * TN * 8 + j * 8 + 2 * t + (e & 1);
        if (f >= m || r >= tile.rows) continue;
        float v = acc[0][i][j][e] + (bias[0] != nullptr ? bias[0][f] : 0.f);
        if constexpr (P == 2)
          v = Activate(v, acc[P - 1][i][j][e] + (bias[P - 1] != nullptr ? bias[P - 1][f] : 0.f),
                       prm.activation);
        const int64_t at = (tile.first + r) * m + f;
        if (prm.out_bf16) {
          static_cast<__nv_bfloat16*>(prm.out)[at] = __float2bfloat16_rn(v);
        } else {
          static_cast<float*>(prm.out)[at] = v;
        }
      }
}

// xg[p] = x[sorted[p] / top_k] rounded to bf16 RN, for every sorted position p (d % 8 == 0).
__global__ void MoeGatherBf16Kernel(const float* __restrict__ x, const int32_t* __restrict__ sorted,
                                    int32_t top_k, int64_t d, __nv_bfloat16* __restrict__ xg) {
  const int64_t p = blockIdx.x;
  const float* src = x + static_cast<int64_t>(sorted[p] / top_k) * d;
  for (int64_t c = threadIdx.x * 8; c < d; c += blockDim.x * 8) {
    const float4 lo = *reinterpret_cast<const float4*>(src + c);
    const float4 hi = *reinterpret_cast<const float4*>(src + c + 4);
    const uint4 v = {PackBf16(lo.x, lo.y), PackBf16(lo.z, lo.w), PackBf16(hi.x, hi.y),
                     PackBf16(hi.z, hi.w)};
    *reinterpret_cast<uint4*>(xg + p * d + c) = v;
  }
}

constexpr int kSmemPerSm = 220 * 1024;  // of the H200's 228 KB

// One MoeMmaKernel configuration over tiles of C::kBN pairs (grid: the most such tiles the step
// can have x the m blocks); the ring as deep as the CTAs per SM leave room for.
template <typename W, int P, int WM, int WN, int TM, int TN, int BK, bool B_F32>
void LaunchMma(const MoeArgs& a, const MmaParams& prm, cudaStream_t stream) {
  using C = MmaConfig<W, P, WM, WN, TM, TN, BK, B_F32>;
  auto* kernel = MoeMmaKernel<W, P, WM, WN, TM, TN, BK, B_F32>;  // (PrepareMoeKernels)
  const int64_t pairs = a.rows * a.top_k;
  const int64_t tiles = std::min<int64_t>(pairs, (pairs + C::kBN - 1) / C::kBN + a.num_experts);
  const int64_t mblocks = (prm.m + C::kBM - 1) / C::kBM;
  const int64_t ktiles = (prm.k + BK - 1) / BK;
  const size_t extra_bytes =
      C::kMx ? C::kCvtBytes + (P * C::kBM * ((prm.k + 31) / 32) + 15) / 16 * 16 : 0;
  const int64_t per_sm = std::clamp<int64_t>(
      (tiles * mblocks + CurrentDeviceSmCount() - 1) / CurrentDeviceSmCount(), 1, 4);
  int stages = kStageChoices[0];
  for (int s : kStageChoices)
    if ((s * C::kStageBytes + extra_bytes) * per_sm <= kSmemPerSm && s <= ktiles + 1) stages = s;
  const size_t smem = static_cast<size_t>(stages) * C::kStageBytes + extra_bytes;
  CHECK(smem <= static_cast<size_t>(kSmemPerSm) && mblocks <= 65535)
      << "MoE tile ring of " << smem << " bytes, " << mblocks << " m blocks";
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(mblocks)), C::kThreads, smem,
           stream>>>(prm, stages);
  CUDA_CHECK_LAUNCH();
}

// Steps of up to kMmaSmallPairsPerExpert pairs per expert on average take tiles of 8 pairs with
// f32 B rows; larger ones tiles of 64 with bf16 B copies, and from kMmaWidePairsPerExpert tiles
// of 128, which read each expert's weights half as often but leave more of a tile empty (so they
// pay on long prefills only; docs/perf.md).
constexpr int64_t kMmaSmallPairsPerExpert = 8;
constexpr int64_t kMmaWidePairsPerExpert = 128;

template <typename W>
void LaunchMmaStages(const MoeArgs& a, cudaStream_t stream) {
  constexpr bool kMx = std::is_same_v<W, Mxfp4>;
  const int64_t pairs = a.rows * a.top_k;
  const bool small = pairs <= kMmaSmallPairsPerExpert * a.num_experts;
  const bool wide = pairs >= kMmaWidePairsPerExpert * a.num_experts;
  LaunchRouteAndSchedule(a, small ? 8 : wide ? 128 : 64, stream);
  MmaParams up{};
  up.w[0] = a.gate;
  up.w[1] = a.up;
  up.scales[0] = a.gate_scales;
  up.scales[1] = a.up_scales;
  up.bias[0] = a.gate_bias;
  up.bias[1] = a.up_bias;
  up.tiles = a.tiles;
  up.num_tiles = a.num_tiles;
  up.m = a.inter;
  up.k = a.d;
  up.activation = {nullptr, nullptr, a.clamped_swiglu, a.swiglu_limit, a.swiglu_alpha};
  up.out = a.act;
  MmaParams down{};
  down.w[0] = down.w[1] = a.down;
  down.scales[0] = down.scales[1] = a.down_scales;
  down.bias[0] = down.bias[1] = a.down_bias;
  down.tiles = a.tiles;
  down.num_tiles = a.num_tiles;
  down.m = a.d;
  down.k = a.inter;
  down.b = a.act;
  down.out = a.y;
  if (small) {  // 4 warps, each one m16 tile per part over 8 pairs
    up.b = a.x;
    up.gather = a.sorted;
    up.gather_div = a.top_k;
    LaunchMma<W, 2, 4, 1, 1, 1, 64, true>(a, up, stream);
    LaunchMma<W, 1, 4, 1, 1, 1, 64, true>(a, down, stream);
    return;
  }
  // 8 warps (2 x 4), each 2 m16 tiles per part x 2 (4) n8 tiles: 64 features x 64 (128) pairs.
  // x gathered to bf16 into y's space (read by gate/up before down writes y), act stored bf16.
  auto* xg = reinterpret_cast<__nv_bfloat16*>(a.y);
  MoeGatherBf16Kernel<<<static_cast<unsigned>(pairs), 128, 0, stream>>>(a.x, a.sorted, a.top_k, a.d,
                                                                        xg);
  CUDA_CHECK_LAUNCH();
  up.b = xg;
  up.out_bf16 = true;
  constexpr int kBK = kMx ? 64 : 32;
  if (wide) {
    LaunchMma<W, 2, 2, 4, 2, 4, kBK, false>(a, up, stream);
    LaunchMma<W, 1, 2, 4, 2, 4, kBK, false>(a, down, stream);
    return;
  }
  LaunchMma<W, 2, 2, 4, 2, 2, kBK, false>(a, up, stream);
  LaunchMma<W, 1, 2, 4, 2, 2, kBK, false>(a, down, stream);
}

template <typename W, int kGuBatch, int kDownParts, int kDownBatch>
void LaunchByPairStagesT(const MoeArgs& a, cudaStream_t stream) {
  const ExpertActivation activation{a.gate_bias, a.up_bias, a.clamped_swiglu, a.swiglu_limit,
                                    a.swiglu_alpha};
  LaunchPdl(MoeRouteKernel, dim3(static_cast<unsigned>((a.rows + kRouteWarps - 1) / kRouteWarps)),
            dim3(kRouteWarps * 32), 0, stream, a.logits, static_cast<int32_t>(a.rows),
            a.num_experts, a.top_k, a.route, ScoreBias(a), a.ids, a.weights);
  LaunchPdl(MoePairGateUpKernel<W, kGuBatch>,
            dim3(static_cast<unsigned>((a.inter + kPairWarps - 1) / kPairWarps),
                 static_cast<unsigned>(a.rows * a.top_k)),
            dim3(kPairWarps * 32), 0, stream, a.x, a.gate, a.up, a.gate_scales, a.up_scales, a.ids,
            a.top_k, a.d, a.inter, activation, a.act);
  LaunchPdl(MoePairDownKernel<W, kDownParts, kDownBatch>,
            dim3(static_cast<unsigned>((a.d + kPairWarps - 1) / kPairWarps),
                 static_cast<unsigned>(a.rows)),
            dim3(kPairWarps * 32), 0, stream, a.act, a.down, a.down_scales, a.down_bias, a.ids,
            a.weights, a.top_k, a.d, a.inter, a.out);
}

// The by-pair kernels' loads in flight, per weight type: gate/up's lane strides per row, down's
// rows per pass and lane strides per row. The values are the fastest measured in bench/moe_bench
// at 1 to 8 rows (deeper strides cost registers: 12/2/12 takes 157; docs/perf.md).
template <typename W>
void LaunchByPairStages(const MoeArgs& a, cudaStream_t stream) {
  if constexpr (std::is_same_v<W, Mxfp4>) {
    LaunchByPairStagesT<W, 4, 2, 4>(a, stream);
  } else if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    LaunchByPairStagesT<W, 4, 4, 4>(a, stream);
  } else {
    LaunchByPairStagesT<W, 2, 2, 2>(a, stream);
  }
}

// LaunchMmaStages' kernels for weights W (PrepareMoeKernels sets their shared-memory limit).
template <typename W>
std::array<const void*, 6> MmaKernels() {
  constexpr int kBK = std::is_same_v<W, Mxfp4> ? 64 : 32;
  return {reinterpret_cast<const void*>(MoeMmaKernel<W, 2, 4, 1, 1, 1, 64, true>),
          reinterpret_cast<const void*>(MoeMmaKernel<W, 1, 4, 1, 1, 1, 64, true>),
          reinterpret_cast<const void*>(MoeMmaKernel<W, 2, 2, 4, 2, 4, kBK, false>),
          reinterpret_cast<const void*>(MoeMmaKernel<W, 1, 2, 4, 2, 4, kBK, false>),
          reinterpret_cast<const void*>(MoeMmaKernel<W, 2, 2, 4, 2, 2, kBK, false>),
          reinterpret_cast<const void*>(MoeMmaKernel<W, 1, 2, 4, 2, 2, kBK, false>)};
}

template <typename R>  // router weights
void LaunchRouter(const MoeArgs& a, cudaStream_t stream) {
  const int64_t router_threads = a.rows * a.num_experts * 32;
  LaunchPdl(MoeRouterKernel<R>, dim3(static_cast<unsigned>((router_threads + 255) / 256)),
            dim3(256), 0, stream, a.x, static_cast<const R*>(a.router),
            a.route.grouped ? nullptr : a.router_bias, a.rows,
            a.num_experts, a.d, a.logits);
}

template <typename W>  // expert weights
void LaunchSimtStages(const MoeArgs& a, cudaStream_t stream) {
  LaunchRouteAndSchedule(a, kMoeTileRows, stream);
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

bool MoeByPair(int64_t pairs, int32_t num_experts) {
  return pairs < kByPairMaxPairsPerExpert * num_experts;
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
  for (const auto& kernels : {MmaKernels<__nv_bfloat16>(), MmaKernels<Mxfp4>()}) {
    for (const void* kernel : kernels) {
      CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemPerSm));
    }
  }
}

void LaunchMoeMlp(const MoeArgs& a, cudaStream_t stream) {
  CHECK(MoeSupported(a.num_experts, a.top_k, a.d, a.inter))
      << a.num_experts << " experts, top " << a.top_k << ", d " << a.d << ", inter " << a.inter;
  if (a.rows == 0) return;
  if (a.mxfp4) {
    CHECK(a.w_bf16 && a.d % 32 == 0 && a.inter % 32 == 0)
        << "MXFP4 experts: bf16 router, d " << a.d << ", inter " << a.inter;
  }
  CHECK(!a.mma || a.w_bf16) << "tensor-core experts need bf16 or MXFP4 weights";
  if (a.w_bf16) {
    LaunchRouter<__nv_bfloat16>(a, stream);
  } else {
    LaunchRouter<float>(a, stream);
  }
  if (!a.mma && MoeByPair(a.rows * a.top_k, a.num_experts)) {
    if (a.mxfp4) {
      LaunchByPairStages<Mxfp4>(a, stream);
    } else if (a.w_bf16) {
      LaunchByPairStages<__nv_bfloat16>(a, stream);
    } else {
      LaunchByPairStages<float>(a, stream);
    }
    return;  // (down combined the rows)
  }
  if (a.mma && a.mxfp4) {
    LaunchMmaStages<Mxfp4>(a, stream);
  } else if (a.mma) {
    LaunchMmaStages<__nv_bfloat16>(a, stream);
  } else if (a.mxfp4) {
    LaunchSimtStages<Mxfp4>(a, stream);
  } else if (a.w_bf16) {
    LaunchSimtStages<__nv_bfloat16>(a, stream);
  } else {
    LaunchSimtStages<float>(a, stream);
  }
  MoeCombineKernel<<<static_cast<unsigned>(a.rows), 256, 0, stream>>>(a.y, a.weights, a.pair_pos,
                                                                      a.top_k, a.d, a.out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda
