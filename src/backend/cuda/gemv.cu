// The one-row MatMul of batch-1 decode: out_p[m_p] = W_p[m_p, k] x[k] (+ bias_p) for up to
// kGemvMaxParts weights sharing one x (q/k/v, gate/up) in ONE launch. bf16 W read once with
// 16-byte loads (double-buffered, 4 per lane per batch; the first batch is issued before waiting
// on the previous kernel: programmatic dependent launch, pdl.cuh; no L1 allocation and evict-first
// in the L2: cache_hints.cuh), f32 x, f32 accumulation. One
// warp computes a row, except in launches of >= 4,096 rows of k >= 4,096: there two warps of a
// block each take one half of the row's k and their sums are added in order, which doubles the
// independent load chains. Why two thresholds: the split pays on the 8B's wide launches and
// measures slower on the 1B's k = 2,048 launches and its 2,048-row down (docs/perf.md). The
// summation order depends only on the weight shapes.
// When it knows the next GEMV launch's weights (GemvPrefetch), the launch's last wave of warps asks
// the L2 for their first 4 MB as it finishes, so the DRAM streams on through this launch's tail and
// the small kernels in between. 2..8 rows of x take gemm_invariant.cu, which streams the weights
// once for all rows instead of re-reading every x row per weight load.
// With a LoRA update (GemvLora, the ring kernel only), one launch does the whole batch-1 update
// as well: an extra warp per block computes the shrink t = x a^T, one rank index of one part at a
// time over the grid, and publishes its count; each output row, once the count is complete, adds
// t b^T to its sum (with the bias). Rows wait only at their store, long after the shrink is done.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#ifdef EMBER_TRACE_GEMV
#ifndef EMBER_CUDA_TRACE
#error "-DEMBER_TRACE_GEMV stamps the step timeline too: configure with -DEMBER_CUDA_TRACE=ON"
#endif
#include <cstdio>
#include <vector>
#endif

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cache_hints.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gated.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

// 4 warps (4 rows, or 2 split rows) per block: 8 blocks per SM at 64 registers (7 for the
// unsplit kernel, see kMinBlocks), the same 32 warps as 2 blocks of 8 but finer tails, which
// decode slightly faster (2 warps are no better; docs/perf.md).
constexpr int kWarpsPerBlock = 4;
constexpr int kLoadsInFlight = 4;  // 16-byte weight loads per lane issued before their use
// Launches of at least kSplitMinRows rows of at least kSplitMinK elements split each row over two
// warps.
constexpr int64_t kSplitMinK = 4096;
constexpr int64_t kSplitMinRows = 4096;
// The L2 prefetch of the next GEMV's weights (GemvPrefetch): ~1% of a batch-1 decode step. 4 MB
// is the measured best: 8 MB is no better, 16 and 32 MB are slower (docs/perf.md).
constexpr int64_t kPrefetchBytes = int64_t{4} << 20;
// __launch_bounds__'s blocks-per-SM hint (0: none). With a hint of 1, ptxas schedules the unsplit
// kernel in 68 registers instead of 64 (7 blocks per SM instead of 8; the same PTX apart from the
// hint, so the same arithmetic), which decodes the 1B faster. The split kernel is slower with the
// hint, so it has none (docs/perf.md).
template <int kSplit>
constexpr int kMinBlocks = kSplit == 1 ? 1 : 0;

struct GemvParams {
  const __nv_bfloat16* w[kGemvMaxParts];
  const float* bias[kGemvMaxParts];
  float* out[kGemvMaxParts];
  int64_t end[kGemvMaxParts];  // exclusive prefix sums of m
  int64_t total;               // end[count - 1]
  int count;
  // L2 prefetch by the warps of blocks >= prefetch_block once their row is done: warp i of
  // them takes bytes [i * prefetch_chunk, min(prefetch_bytes, (i + 1) * prefetch_chunk)).
  const unsigned char* prefetch;
  int64_t prefetch_bytes, prefetch_chunk;
  unsigned prefetch_block;
  GemvLora lora;  // the ring kernel's LoRA update (kLora)
};

// Asks the L2 for [p, p + bytes) (bytes a multiple of 16, p 16-byte aligned); no completion.
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Block: kWarpsPerBlock / kSplit output rows (over the concatenation of the parts); a row's k is
// cut into kSplit slices of whole 256-element lane strides, one warp each, and the slices' warp
// sums are added in slice order (kSplit = 1: one warp per row).
template <int kSplit>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocks<kSplit>)
    GemvBf16Kernel(const float* __restrict__ x, GemvParams p, int64_t k) {
  constexpr int kRowsPerBlock = kWarpsPerBlock / kSplit;
  __shared__ float slice_sum[kWarpsPerBlock];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp / kSplit;
  const int slice = warp % kSplit;
  const bool valid = row < p.total;
  // Select the part with constant indices only (a run-time index into p would put p in local
  // memory).
  const int part = (p.count > 1 && row >= p.end[0]) + (p.count > 2 && row >= p.end[1]);
  const int64_t local = row - (part == 0 ? 0 : part == 1 ? p.end[0] : p.end[1]);
  const __nv_bfloat16* w_part = part == 0 ? p.w[0] : part == 1 ? p.w[1] : p.w[2];
  const float* bias = part == 0 ? p.bias[0] : part == 1 ? p.bias[1] : p.bias[2];
  float* out = part == 0 ? p.out[0] : part == 1 ? p.out[1] : p.out[2];

  constexpr int64_t kStride = 32 * 8;  // elements between one lane's consecutive loads
  constexpr int64_t kStep = kStride * kLoadsInFlight;
  const int64_t slice_len = (k + kStride * kSplit - 1) / (kStride * kSplit) * kStride;
  const int64_t begin = slice * slice_len;
  const int64_t end = valid ? min(k, begin + slice_len) : 0;
  float acc = 0.f;
  const uint64_t policy = EvictFirstPolicy();
  const __nv_bfloat16* w_row = valid ? w_part + local * k : w_part;  // (no pointer past the end)
  auto load = [&](uint4 (&raw)[kLoadsInFlight], int64_t base) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t c = base + u * kStride;
      raw[u] = c < end ? LoadStreaming16(w_row + c, policy) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first weights stream in while the previous kernel finishes (x is not read before this).
  uint4 cur[kLoadsInFlight];
  load(cur, begin + lane * 8);
  PdlWait();
  for (int64_t base = begin + lane * 8; base < end; base += kStep) {
    uint4 next[kLoadsInFlight];
    load(next, base + kStep);  // double-buffered: up to 2 x kLoadsInFlight loads in flight
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t c = base + u * kStride;
      if (c >= end) break;
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&cur[u]);
      float wf[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(pairs[i]);
        wf[2 * i] = f.x;
        wf[2 * i + 1] = f.y;
      }
      const float4 x0 = __ldg(reinterpret_cast<const float4*>(x + c));
      const float4 x1 = __ldg(reinterpret_cast<const float4*>(x + c + 4));
      acc += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w + wf[4] * x1.x +
             wf[5] * x1.y + wf[6] * x1.z + wf[7] * x1.w;
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) cur[u] = next[u];
  }
  const float v = WarpSum(acc);
  if constexpr (kSplit == 1) {
    if (valid && lane == 0) out[local] = v + (bias != nullptr ? bias[local] : 0.f);
  } else {
    if (lane == 0) slice_sum[warp] = v;
    __syncthreads();
    if (valid && slice == 0 && lane == 0) {
      float sum = slice_sum[warp];
#pragma unroll
      for (int i = 1; i < kSplit; ++i) sum += slice_sum[warp + i];
      out[local] = sum + (bias != nullptr ? bias[local] : 0.f);
    }
  }
  if (p.prefetch_bytes > 0 && blockIdx.x >= p.prefetch_block && lane == 0) {
    const int64_t i = static_cast<int64_t>(blockIdx.x - p.prefetch_block) * kWarpsPerBlock + warp;
    const int64_t begin = i * p.prefetch_chunk;
    if (begin < p.prefetch_bytes) {
      PrefetchL2(p.prefetch + begin,
                 static_cast<uint32_t>(min(p.prefetch_chunk, p.prefetch_bytes - begin)));
    }
  }
}

// ---- The ring GEMV: weights streamed into shared memory by a producer lane ----
// One block per SM owns a contiguous share of the rows (over the concatenation of the parts). Its
// last warp's lane 0 copies them, whole rows at a time, into a ring of shared-memory stages of
// rows_per_stage rows (cp.async.bulk, completion counted on the stage's `full` mbarrier), and
// starts at once: weights are constant, so the copies need not wait for the previous kernel, and
// the block triggers its dependents at its start. So while the kernel before it (an RMSNorm, the
// attention, the gated activation) still runs, the ring fills: up to kRingBytes per SM of this
// GEMV's weights arrive before its x exists. The consumer warps wait on PdlWait, take their x
// columns into registers once, and then drain the stages: warp w handles row w / G of a stage
// (G = kRingConsumers / rows per stage warps per row, each a fixed interleaved subset of the
// row's 16-byte chunks), releases each stage once its dot products are done, folds its lane sums
// of kFoldRows stages across the warp together, and G > 1 warps add their sums in warp order
// through shared memory.
constexpr int kRingConsumers = 8;
constexpr int kRingThreads = (kRingConsumers + 1) * 32;
constexpr int kRingMaxStages = 16;
constexpr int kRingChunks = 8;  // 16-byte chunks per lane per row: x in 64 registers
constexpr int64_t kRingMaxStageBytes = 48 << 10;
// The most ring per SM (a launch takes only the stages its blocks need). The size is measured,
// not derived: two ring blocks never share an SM (9 warps of 112 registers each), so a GEMV's
// copies do not start beside the GEMV before it; a ring fills while the small kernels before its
// GEMV run. 128 KB (4 stages of 32 KB) is the fastest size measured for the 1B and the 8B
// (docs/perf.md).
constexpr int64_t kRingBytes = 128 << 10;

// d + the 8 products, in element order (one fma chain).
__device__ __forceinline__ float Dot8(const uint4& w, const float (&x)[8], float d = 0.f) {
  // bf16 to f32 is a shift: element 2i is word i's low half, 2i + 1 its high half.
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    d = fmaf(__uint_as_float(u[i] << 16), x[2 * i], d);
    d = fmaf(__uint_as_float(u[i] & 0xffff0000u), x[2 * i + 1], d);
  }
  return d;
}

// One 16-byte shared-memory load. Why: given a uint4 still in shared memory, the compiler reads it
// as four 4-byte loads, each chunk's behind its own branch, so a warp's chunks run one after the
// other; with one 16-byte load a chunk, all issued first, a stage's dot products take far fewer
// cycles (a trace build's clock stamps, docs/perf.md).
__device__ __forceinline__ uint4 LoadShared16(const uint4* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(SmemAddr(p)));
  return v;
}

// A warp's share of one row in a ring stage: chunks g * 32 + lane + j * 32 * group (j <
// kRingChunks) of w against x's matching registers, summed over j in order; chunks past the row
// add 0. All loads are issued before any math.
__device__ __forceinline__ float StageRowDot(const uint4* w, int64_t chunks, int g, int group,
                                             int lane, const float (&xr)[kRingChunks][8]) {
  uint4 wv[kRingChunks];
#pragma unroll
  for (int j = 0; j < kRingChunks; ++j) {
    const int64_t c = g * 32 + lane + int64_t{j} * 32 * group;
    wv[j] = LoadShared16(w + (c < chunks ? c : 0));
  }
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < kRingChunks; ++j) {
    const int64_t c = g * 32 + lane + int64_t{j} * 32 * group;
    const float d = c < chunks ? Dot8(wv[j], xr[j]) : 0.f;
    acc = j == 0 ? d : acc + d;
  }
  return acc;
}

#ifdef EMBER_TRACE_GEMV
// The ring GEMV's own timeline (a trace build with -DEMBER_TRACE_GEMV): blocks 0, grid / 2 and
// grid - 1 of every launch record %globaltimer at their start, when PdlWait returns (with how
// many of their first stages had already landed), when x is in registers, when each of the first
// kGemvDetailStages stages' copies had landed, when the ring is drained and at the end.
// DumpGemvDetail writes them (DumpStepTrace, to EMBER_CUDA_TRACE_OUT.gemv).
constexpr int kGemvDetailStages = 16;
struct GemvDetail {
  unsigned long long entry, wait, x, drained, end, full[kGemvDetailStages];
  // %clock64 in the first 8 stages: the stage's copies landed, its dot products done, its slot
  // released.
  long long clk[8][3];
  unsigned block, grid, k, total, ready, num_stages, stages, pad;
};
constexpr unsigned kGemvDetailRing = 1u << 16;
__device__ GemvDetail g_gemv_detail[kGemvDetailRing];
__device__ unsigned g_gemv_detail_next;
// The timers read once `dep` (a value the timed work produced) is in a register.
__device__ __forceinline__ unsigned long long GlobalTimerAfter(float dep) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "f"(dep) : "memory");
  return t;
}
__device__ __forceinline__ long long ClockAfter(float dep) {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) : "f"(dep) : "memory");
  return c;
}
#endif

// A warp folds its lane sums of kFoldRows consecutive stages (one row of each) across the warp
// together: 6 shuffles for 4 rows instead of 20, off the path to each stage's release (a little
// faster than a warp sum per stage, docs/perf.md).
constexpr int kFoldRows = 4;
__device__ __forceinline__ float FoldRows4(const float (&p)[kFoldRows], int lane) {
  const bool hi16 = (lane & 16) != 0, hi8 = (lane & 8) != 0;
  float w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float send = hi16 ? p[i] : p[i + 2], keep = hi16 ? p[i + 2] : p[i];
    w[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
  const float send = hi8 ? w[0] : w[1], keep = hi8 ? w[1] : w[0];
  float z = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  z += __shfl_xor_sync(0xffffffffu, z, 4);
  z += __shfl_xor_sync(0xffffffffu, z, 2);
  z += __shfl_xor_sync(0xffffffffu, z, 1);
  return z;  // the sum of p[2 * hi16 + hi8] over the warp, in every lane of the 8 sharing it
}

// x's float4 i. kLora: through the L2 (ld.global.cg), never the read-only path: a fused LoRA
// launch holds its blocks long after its dependents launched (programmatic dependent launch), so
// the kernel after the next one can be resident while x's producer still runs, and a
// non-coherent load of x (what const __restrict__ allows the compiler) may be served before the
// producer's stores. Session 49: with graphs, a fused launch fed by an RmsNorm of the previous
// fused launch's output read a stale x.
template <bool kLora>
__device__ __forceinline__ float4 LoadX(const float* x, int64_t i) {
  if constexpr (kLora) return __ldcg(reinterpret_cast<const float4*>(x) + i);
  return reinterpret_cast<const float4*>(x)[i];
}

// The LoRA update's parts for the row's slot (none: slot < 0): each part's entry and the total of
// their ranks (the shrink's rows over the grid).
struct LoraRowEntries {
  LoraEntry part[kMaxLoraKernelParts];
  int32_t total = 0;
};
__device__ __forceinline__ LoraRowEntries LoraEntriesOf(const GemvLora& l) {
  LoraRowEntries e;
  const int32_t slot = *l.row_entry;
#pragma unroll
  for (int i = 0; i < kMaxLoraKernelParts; ++i) {
    if (slot >= 0 && i < l.parts) e.part[i] = l.entries[int64_t{i} * l.num_slots + slot];
    e.total += e.part[i].rank;
  }
  return e;
}

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The LoRA warp of a ring block: the shrink rows blockIdx.x, blockIdx.x + gridDim.x, ... of the
// concatenated parts' ranks, t[part * rank_cap + j] = x . a_part[j] (lane strides of 8 elements,
// then the warp sum), then their count added to l.sync[0].
__device__ __forceinline__ void LoraShrinkRows(const GemvLora& l, const LoraRowEntries& e,
                                               const float* __restrict__ x, int64_t k, int lane) {
  unsigned done = 0;
  for (int32_t row = blockIdx.x; row < e.total; row += gridDim.x) {
    const int part = (row >= e.part[0].rank) + (row >= e.part[0].rank + e.part[1].rank);
    const LoraEntry en = part == 0 ? e.part[0] : part == 1 ? e.part[1] : e.part[2];
    const int32_t j = row - (part == 0   ? 0
                             : part == 1 ? e.part[0].rank
                                         : e.part[0].rank + e.part[1].rank);
    const __nv_bfloat16* a = static_cast<const __nv_bfloat16*>(en.a) + int64_t{j} * k;
    float acc = 0.f;
    for (int64_t c = int64_t{lane} * 8; c < k; c += 32 * 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(a + c);
      const float4 x0 = LoadX<true>(x + c, 0);
      const float4 x1 = LoadX<true>(x + c, 1);
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      acc += Dot8(w, xv);
    }
    acc = WarpSum(acc);
    if (lane == 0) l.t[part * l.rank_cap + j] = acc;
    ++done;
  }
  if (lane == 0 && done > 0) {
    __threadfence();
    atomicAdd(l.sync, done);
  }
}

// Row `local` of GEMV part `part`'s LoRA term, t_part . b_part[local] (j in order), once all
// `total` shrink rows of the launch are published; 0 where the part has no update (slot: the
// row's, -1 none).
__device__ __forceinline__ float LoraRowTerm(const GemvLora& l, int32_t slot, int32_t total,
                                             int part, int64_t local, bool& waited) {
  const int li = part == 0 ? l.lora_of[0] : part == 1 ? l.lora_of[1] : l.lora_of[2];
  if (li < 0 || slot < 0) return 0.f;
  const LoraEntry en = l.entries[int64_t{li} * l.num_slots + slot];
  if (en.rank == 0) return 0.f;
  if (!waited) {
    while (LoadAcquire(l.sync) < static_cast<unsigned>(total)) __nanosleep(32);
    waited = true;
  }
  const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(en.b) + local * en.rank;
  const float* t = l.t + li * l.rank_cap;
  float acc = 0.f;
  int32_t j = 0;
  if (en.rank % 8 == 0 && l.rank_cap % 4 == 0 && reinterpret_cast<uintptr_t>(en.b) % 16 == 0) {
    // 8 rank indices a step: one 16-byte load of b, two of t, all issued before the sums.
    for (; j < en.rank; j += 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(b + j);
      const float4 t0 = __ldcg(reinterpret_cast<const float4*>(t + j));
      const float4 t1 = __ldcg(reinterpret_cast<const float4*>(t + j + 4));
      const float tv[8] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z, t1.w};
      acc = Dot8(w, tv, acc);
    }
  }
  for (; j < en.rank; ++j) acc = fmaf(__ldcg(t + j), __bfloat162float(b[j]), acc);
  return acc;
}

// The end of a LoRA ring launch, for the consumer warps and the LoRA warp of every block: once
// all of a block's waits are over, its count goes into l.sync[1], and the grid's last block
// zeroes both counters for the next launch (which reads them only after its PdlWait, that is,
// after this grid has completed).
__device__ __forceinline__ void LoraLaunchEnd(const GemvLora& l) {
  asm volatile("bar.sync 2, %0;" ::"r"((kRingConsumers + 1) * 32) : "memory");
  if (threadIdx.x == 0 && atomicAdd(l.sync + 1, 1u) == gridDim.x - 1) {
    l.sync[0] = 0;
    l.sync[1] = 0;
  }
}

// At most 112 registers, so the small kernels before and after it fit beside a block. kLora: one
// more warp (the LoRA warp, after the producer), and p.lora's update added to every row's sum.
template <bool kGated, bool kLora>
__global__ void __maxnreg__(112)
    GemvRingKernel(const float* __restrict__ x, GemvParams p, int64_t k, int rows_per_stage,
                   int stages, float* __restrict__ gated_out, bool gelu) {
  constexpr bool gated = kGated;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kRingMaxStages], empty[kRingMaxStages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row_bytes = k * 2;
  const int64_t stage_bytes = row_bytes * rows_per_stage;
  // gated (gelu: gelu_tanh, else silu): rows interleave the two parts, gate i then up i (row 2i, 2i
  // + 1), and a block owns whole pairs.
  const int64_t units = gated ? p.total / 2 : p.total, unit_rows = gated ? 2 : 1;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * units / gridDim.x * unit_rows;
  const int64_t row_end = static_cast<int64_t>(blockIdx.x + 1) * units / gridDim.x * unit_rows;
  const int64_t num_stages = (row_end - row_begin + rows_per_stage - 1) / rows_per_stage;
  // Rows split over several warps, or gated: [rows of the block][warps per row] warp sums, added
  // after the ring.
  float* partials = reinterpret_cast<float*>(ring + stages * stage_bytes);
#ifdef EMBER_TRACE_GEMV
  GemvDetail* detail = nullptr;
  if (threadIdx.x == 0 &&
      (blockIdx.x == 0 || blockIdx.x == gridDim.x / 2 || blockIdx.x == gridDim.x - 1)) {
    detail = g_gemv_detail + atomicAdd(&g_gemv_detail_next, 1u) % kGemvDetailRing;
    detail->entry = GlobalTimer();
    detail->block = blockIdx.x;
    detail->grid = gridDim.x;
    detail->k = static_cast<unsigned>(k);
    detail->total = static_cast<unsigned>(p.total);
    detail->num_stages = static_cast<unsigned>(num_stages);
    detail->stages = static_cast<unsigned>(stages);
  }
#endif
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      MbarInit(full + i, 1);
      MbarInit(empty + i, kRingConsumers);
    }
    MbarInitFence();
  }
  __syncthreads();
  PdlTrigger();
  auto part_of = [&](int64_t row) -> int {
    if (gated) return static_cast<int>(row & 1);
    return (p.count > 1 && row >= p.end[0]) + (p.count > 2 && row >= p.end[1]);
  };
  auto local_of = [&](int64_t row, int part) {
    if (gated) return row >> 1;
    return row - (part == 0 ? 0 : part == 1 ? p.end[0] : p.end[1]);
  };
  if (kLora && warp == kRingConsumers + 1) {  // the LoRA warp: the shrink, then the end
    PdlWait();
    LoraShrinkRows(p.lora, LoraEntriesOf(p.lora), x, k, lane);
    LoraLaunchEnd(p.lora);
    return;
  }
  if (warp == kRingConsumers) {
    if (lane != 0) return;
    const uint64_t policy = EvictFirstPolicy();
    int slot = 0;
    uint32_t phase = 0;
    for (int64_t s = 0; s < num_stages; ++s) {
      const int64_t r0 = row_begin + s * rows_per_stage;
      const int n = static_cast<int>(min(int64_t{rows_per_stage}, row_end - r0));
      MbarWait(empty + slot, phase ^ 1);
      MbarArriveExpectTx(full + slot, static_cast<uint32_t>(n * row_bytes));
      unsigned char* dst = ring + slot * stage_bytes;
      for (int i = 0; i < n; ++i) {
        const int part = part_of(r0 + i);
        const __nv_bfloat16* w = part == 0 ? p.w[0] : part == 1 ? p.w[1] : p.w[2];
        BulkCopyToShared(dst + i * row_bytes, w + local_of(r0 + i, part) * k,
                         static_cast<uint32_t>(row_bytes), full + slot, policy);
      }
      if (++slot == stages) {
        slot = 0;
        phase ^= 1;
      }
    }
    return;
  }
  int32_t lora_slot = -1, lora_total = 0;
  if constexpr (kLora) {
    const LoraRowEntries e = LoraEntriesOf(p.lora);
    lora_slot = *p.lora.row_entry;
    lora_total = e.total;
  }
  bool lora_waited = false;
  // Stores row's sum (+ bias, + the LoRA term) and returns the stored value.
  auto row_sum_store = [&](int64_t row, float v) {
    const int part = part_of(row);
    const int64_t local = local_of(row, part);
    const float* bias = part == 0 ? p.bias[0] : part == 1 ? p.bias[1] : p.bias[2];
    float* out = part == 0 ? p.out[0] : part == 1 ? p.out[1] : p.out[2];
    float add = bias != nullptr ? bias[local] : 0.f;
    if constexpr (kLora)
      add += LoraRowTerm(p.lora, lora_slot, lora_total, part, local, lora_waited);
    const float value = v + add;
    out[local] = value;
    return value;
  };
  const int group = kRingConsumers / rows_per_stage;  // warps per row
  const int row_in_stage = warp / group, g = warp % group;
  const int64_t chunks = k / 8;
  PdlWait();
#ifdef EMBER_TRACE_GEMV
  if (detail != nullptr) {
    detail->wait = GlobalTimer();
    unsigned ready = 0;
    for (int i = 0; i < stages && i < num_stages; ++i) ready += MbarReady(full + i, 0);
    detail->ready = ready;
  }
#endif
  float xr[kRingChunks][8];
#pragma unroll
  for (int j = 0; j < kRingChunks; ++j) {
    const int64_t c = g * 32 + lane + int64_t{j} * 32 * group;
    const float4 a = c < chunks ? LoadX<kLora>(x, 2 * c) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 b = c < chunks ? LoadX<kLora>(x, 2 * c + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
    xr[j][0] = a.x, xr[j][1] = a.y, xr[j][2] = a.z, xr[j][3] = a.w;
    xr[j][4] = b.x, xr[j][5] = b.y, xr[j][6] = b.z, xr[j][7] = b.w;
  }
#ifdef EMBER_TRACE_GEMV
  if (detail != nullptr) {
    float dep = 0.f;
#pragma unroll
    for (int j = 0; j < kRingChunks; ++j) dep += xr[j][0];
    detail->x = GlobalTimerAfter(dep);
  }
#endif
  int slot = 0;
  uint32_t phase = 0;
  for (int64_t s0 = 0; s0 < num_stages; s0 += kFoldRows) {
    float pend[kFoldRows];  // this lane's share of row row_in_stage of stages s0, s0 + 1, ...
#pragma unroll
    for (int u = 0; u < kFoldRows; ++u) {
      pend[u] = 0.f;
      const int64_t s = s0 + u;
      if (s >= num_stages) continue;
      const int64_t row = row_begin + s * rows_per_stage + row_in_stage;
      MbarWait(full + slot, phase);
#ifdef EMBER_TRACE_GEMV
      if (detail != nullptr && s < kGemvDetailStages) detail->full[s] = GlobalTimer();
      if (detail != nullptr && s < 8) detail->clk[s][0] = clock64();
#endif
      if (row < row_end) {
        pend[u] = StageRowDot(
            reinterpret_cast<const uint4*>(ring + slot * stage_bytes + row_in_stage * row_bytes),
            chunks, g, group, lane, xr);
      }
#ifdef EMBER_TRACE_GEMV
      if (detail != nullptr && s < 8) detail->clk[s][1] = ClockAfter(pend[u]);
#endif
      __syncwarp();
      if (lane == 0) MbarArrive(empty + slot);
#ifdef EMBER_TRACE_GEMV
      if (detail != nullptr && s < 8) detail->clk[s][2] = clock64();
#endif
      if (++slot == stages) {
        slot = 0;
        phase ^= 1;
      }
    }
    const float sum = FoldRows4(pend, lane);
    const int64_t s = s0 + ((lane >> 4) & 1) * 2 + ((lane >> 3) & 1);
    const int64_t row = row_begin + s * rows_per_stage + row_in_stage;
    if ((lane & 7) == 0 && s < num_stages && row < row_end) {
      if (group == 1 && !gated && !kLora) {
        row_sum_store(row, sum);
      } else {
        partials[(row - row_begin) * group + g] = sum;
      }
    }
  }
#ifdef EMBER_TRACE_GEMV
  // A trace build (pdl.cuh) with -DEMBER_TRACE_GEMV in CMAKE_CUDA_FLAGS stamps the step timeline
  // here (block 0 has drained its ring) and when the grid's last block ends.
  TraceStamp();
  if (detail != nullptr) detail->drained = GlobalTimer();
#endif
  // (kLora: every row is stored here, one a thread, so the rows' LoRA terms run side by side
  // after the ring instead of inside the loop that drains it.)
  if (group > 1 || gated || kLora) {
    // The row sums of the warps sharing each row, added in warp order (barrier 1: the consumers).
    asm volatile("bar.sync 1, %0;" ::"r"(kRingConsumers * 32) : "memory");
    auto row_total = [&](int64_t i) {
      float total = partials[i * group];
      for (int j = 1; j < group; ++j) total += partials[i * group + j];
      return row_sum_store(row_begin + i, total);
    };
    if (gated) {
      for (int64_t i = threadIdx.x; 2 * i < row_end - row_begin; i += kRingConsumers * 32) {
        const float gate = row_total(2 * i), up = row_total(2 * i + 1);
        gated_out[(row_begin >> 1) + i] = Gated(gate, up, gelu);
      }
    } else {
      for (int64_t i = threadIdx.x; i < row_end - row_begin; i += kRingConsumers * 32) row_total(i);
    }
  }
  if constexpr (kLora) LoraLaunchEnd(p.lora);
#ifdef EMBER_TRACE_GEMV
  if (threadIdx.x == 0) TraceStampLastBlock();
  if (detail != nullptr) detail->end = GlobalTimer();
#endif
}

// Rows per stage for k: the most (8, 4, 2, 1) whose warps' share of a row fits kRingChunks
// chunks per lane and whose stage fits kRingMaxStageBytes; 0: the ring kernel cannot take k.
int RingRowsPerStage(int64_t k) {
  for (int rows = kRingConsumers; rows >= 1; rows /= 2) {
    const int64_t group = kRingConsumers / rows;
    const bool fits_lanes = (k / 8 + 32 * group - 1) / (32 * group) <= kRingChunks;
    if (fits_lanes && (rows == 1 || rows * k * 2 <= kRingMaxStageBytes)) return rows;
  }
  return 0;
}

struct RingPlan {
  int rows_per_stage = 0, stages = 0;
  int64_t smem_bytes = 0;
};
constexpr int64_t kRingMaxSmem = 200 << 10;

// The ring launch for `total` rows of k (gated: gate / up pairs) with at most ring_bytes of
// stages, if the ring kernel can take them.
bool RingPlanWithRing(int64_t total, int64_t k, bool gated, int64_t ring_bytes, RingPlan* plan,
                      bool lora = false) {
  const int rows_per_stage = RingRowsPerStage(k);
  if (rows_per_stage == 0) return false;
  const int64_t stage_bytes = rows_per_stage * k * 2;
  const int64_t sms = CurrentDeviceSmCount();
  const int64_t max_rows = gated ? 2 * ((total / 2 + sms - 1) / sms) : (total + sms - 1) / sms;
  const int64_t block_stages = (max_rows + rows_per_stage - 1) / rows_per_stage;
  const int64_t group = kRingConsumers / rows_per_stage;
  const int64_t partial_bytes = group > 1 || gated || lora ? max_rows * group * 4 : 0;
  const int64_t stages =
      std::min<int64_t>({int64_t{kRingMaxStages}, block_stages, ring_bytes / stage_bytes});
  if (stages < 1 || stages * stage_bytes + partial_bytes > kRingMaxSmem) return false;
  plan->rows_per_stage = rows_per_stage;
  plan->stages = static_cast<int>(stages);
  plan->smem_bytes = stages * stage_bytes + partial_bytes;
  return true;
}

// Shared memory an SM offers two ring blocks side by side (less the per-block reservation and
// the kernel's mbarriers).
int64_t RingPairSmem() {
  static const int64_t bytes = [] {
    int device = 0, per_sm = 0, reserved = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
    return int64_t{per_sm} - 2 * (int64_t{reserved} + 2 * kRingMaxStages * 8);
  }();
  return bytes;
}

// The ring launch for `total` rows of k (gated: gate / up pairs), if the ring kernel can take
// them. A gated launch takes kRingGatedKb when that ring and the output projection's
// (k rows of k, as in a Llama layer) would fit an SM together, else kRingBytes. This is a measured
// rule, not a mechanism (the two blocks do not actually share an SM, see kRingBytes): 160 KB is
// the fastest gated ring on the 1B (o ring 64 KB), and 128 KB beats 160 on the 8B (o ring
// 128 KB), where the rule picks it (docs/perf.md).
constexpr int64_t kRingGatedKb = 160;
bool RingPlanFor(int64_t total, int64_t k, bool gated, RingPlan* plan, bool lora = false) {
  if (!gated) return RingPlanWithRing(total, k, false, kRingBytes, plan, lora);
  RingPlan before;
  if (!RingPlanWithRing(k, k, false, kRingBytes, &before)) before.smem_bytes = 0;
  if (RingPlanWithRing(total, k, true, kRingGatedKb << 10, plan) &&
      plan->smem_bytes + before.smem_bytes <= RingPairSmem()) {
    return true;
  }
  return RingPlanWithRing(total, k, true, kRingBytes, plan);
}

}  // namespace

bool GemvBf16Supported(const void* x, const void* w, int64_t k) {
  return k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0 &&
         (reinterpret_cast<uintptr_t>(w) % 16) == 0;
}

bool GemvGatedFused(int64_t m, int64_t k) {
  RingPlan plan;
  return RingPlanFor(2 * m, k, true, &plan);
}

bool GemvLoraFused(int64_t total, int64_t k, bool gated) {
  RingPlan plan;
  return RingPlanFor(total, k, gated, &plan, /*lora=*/true);
}

void LaunchGemvBf16Multi(const float* x, const GemvPart* parts, int num_parts, int64_t k,
                         GemvPrefetch next, cudaStream_t stream, GemvGatedOut gated,
                         const GemvLora* lora) {
  CHECK(num_parts >= 1 && num_parts <= kGemvMaxParts) << num_parts << " GEMV parts";
  CHECK(gated.out == nullptr || (num_parts == 2 && parts[0].m == parts[1].m))
      << "a gated GEMV takes the gate and the up part, of equal rows";
  GemvParams p{};
  int64_t end = 0;
  for (int i = 0; i < num_parts; ++i) {
    p.w[i] = static_cast<const __nv_bfloat16*>(parts[i].w);
    p.bias[i] = parts[i].bias;
    p.out[i] = parts[i].out;
    end += parts[i].m;
    p.end[i] = end;
  }
  p.count = num_parts;
  p.total = end;
  if (end == 0) return;
  RingPlan plan;
  const bool ring = RingPlanFor(p.total, k, gated.out != nullptr, &plan, lora != nullptr);
  CHECK(ring || lora == nullptr) << "a GEMV with a LoRA update needs the ring kernel (k " << k
                                 << ", " << p.total << " rows)";
  if (ring) {
    static const bool attr = [] {
      for (auto kernel : {GemvRingKernel<false, false>, GemvRingKernel<true, false>,
                          GemvRingKernel<false, true>, GemvRingKernel<true, true>}) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kRingMaxSmem));
      }
      return true;
    }();
    (void)attr;
    const bool g = gated.out != nullptr;
    if (lora != nullptr) {
      CHECK(lora->parts >= 1 && lora->parts <= kMaxLoraKernelParts && lora->sync != nullptr &&
            lora->t != nullptr && k % 8 == 0);
      p.lora = *lora;
    }
    auto kernel = lora != nullptr
                      ? (g ? GemvRingKernel<true, true> : GemvRingKernel<false, true>)
                      : (g ? GemvRingKernel<true, false> : GemvRingKernel<false, false>);
    LaunchPdl(kernel, dim3(static_cast<unsigned>(CurrentDeviceSmCount())),
              dim3(kRingThreads + (lora != nullptr ? 32 : 0)), static_cast<size_t>(plan.smem_bytes),
              stream, x, p, k, plan.rows_per_stage, plan.stages, gated.out, gated.gelu);
    return;
  }
  if (gated.out != nullptr) {  // the GEMV, then the activation
    LaunchGemvBf16Multi(x, parts, num_parts, k, next, stream);
    LaunchGatedActivation(parts[0].out, parts[1].out, false, gated.out, false, parts[0].m,
                          gated.gelu, stream);
    return;
  }
  const bool split = k >= kSplitMinK && p.total >= kSplitMinRows;
  const int64_t rows_per_block = split ? kWarpsPerBlock / 2 : kWarpsPerBlock;
  const unsigned blocks = static_cast<unsigned>((p.total + rows_per_block - 1) / rows_per_block);
  const int64_t prefetch_bytes = std::min(next.bytes, kPrefetchBytes) / 16 * 16;
  if (next.w != nullptr && prefetch_bytes > 0 && reinterpret_cast<uintptr_t>(next.w) % 16 == 0) {
    // The last wave: the blocks that start only once every earlier block has a slot.
    // (The two kernels differ in registers, so each has its own count.)
    auto resident_of = [](void (*kernel)(const float*, GemvParams, int64_t)) {
      int per_sm = 0;
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel,
                                                               kWarpsPerBlock * 32, 0));
      return int64_t{per_sm} * CurrentDeviceSmCount();
    };
    static const int64_t resident_unsplit = resident_of(GemvBf16Kernel<1>);
    static const int64_t resident_split = resident_of(GemvBf16Kernel<2>);
    const int64_t resident = split ? resident_split : resident_unsplit;
    p.prefetch_block = static_cast<unsigned>(std::max<int64_t>(0, blocks - resident));
    const int64_t warps = (blocks - p.prefetch_block) * int64_t{kWarpsPerBlock};
    p.prefetch = static_cast<const unsigned char*>(next.w);
    p.prefetch_bytes = prefetch_bytes;
    p.prefetch_chunk = std::max<int64_t>(16, (prefetch_bytes / warps + 15) / 16 * 16);
  }
  LaunchPdl(split ? GemvBf16Kernel<2> : GemvBf16Kernel<1>, dim3(blocks),
            dim3(kWarpsPerBlock * 32), 0, stream, x, p, k);
}

#ifdef EMBER_TRACE_GEMV
// One line per recorded block: k total grid block stages num_stages ready, then entry, x,
// drained, end and the first stages' landing times, all in ns from its PdlWait.
void DumpGemvDetail(const char* path) {
  unsigned n = 0;
  if (cudaMemcpyFromSymbol(&n, g_gemv_detail_next, sizeof n) != cudaSuccess || n == 0) return;
  std::vector<GemvDetail> all(kGemvDetailRing);
  CUDA_CHECK(cudaMemcpyFromSymbol(all.data(), g_gemv_detail, sizeof(GemvDetail) * all.size()));
  all.resize(std::min(n, kGemvDetailRing));
  std::sort(all.begin(), all.end(),
            [](const GemvDetail& a, const GemvDetail& b) { return a.wait < b.wait; });
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  auto rel = [](unsigned long long t, unsigned long long w) {
    return static_cast<long long>(t) - static_cast<long long>(w);
  };
  for (const GemvDetail& d : all) {
    std::fprintf(f, "%u %u %u %u %u %u %u %lld %lld %lld %lld", d.k, d.total, d.grid, d.block,
                 d.stages, d.num_stages, d.ready, rel(d.entry, d.wait), rel(d.x, d.wait),
                 rel(d.drained, d.wait), rel(d.end, d.wait));
    for (unsigned s = 0; s < d.num_stages && s < kGemvDetailStages; ++s)
      std::fprintf(f, " %lld", rel(d.full[s], d.wait));
    // then "|" and per stage (of the first 8): cycles from stage 0's landing to its own, then from
    // its landing to its dot products and to its release.
    std::fprintf(f, " |");
    for (unsigned s = 0; s < d.num_stages && s < 8; ++s) {
      std::fprintf(f, " %lld %lld %lld", d.clk[s][0] - d.clk[0][0], d.clk[s][1] - d.clk[s][0],
                   d.clk[s][2] - d.clk[s][0]);
    }
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}
#endif

}  // namespace ember::cuda
