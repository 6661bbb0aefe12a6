// The one-row MatMul of batch-1 decode: out_p[m_p] = W_p[m_p, k] x[k] (+ bias_p) for up to
// kGemvMaxParts weights sharing one x (q/k/v, gate/up) in ONE launch. bf16 W read once with
// 16-byte loads (double-buffered, 4 per lane per batch; the first batch is issued before waiting
// on the previous kernel: programmatic dependent launch, pdl.cuh; no L1 allocation and evict-first
// in the L2: cache_hints.cuh), f32 x, f32 accumulation. One
// warp computes a row, except in launches of >= 4,096 rows of k >= 4,096: there two warps of a
// block each take one half of the row's k and their sums are added in order, which doubles the
// independent load chains. H200, bench/gemv_bench: 8B q/k/v 19.0 -> 16.6 us, down 37.5 -> 34.1 us,
// 8B decode step 4.79 -> 4.65 ms. The 1B's k = 2,048 launches were slower split (q/k/v 5.7 -> 6.8
// us, lm_head 123 -> 136 us) and its 2,048-row down (k = 8,192) cost 1% of tg128 split, hence the
// two thresholds (docs/perf.md, session 6). The summation order depends only on the weight shapes.
// When it knows the next GEMV launch's weights (GemvPrefetch), the launch's last wave of warps asks
// the L2 for their first 4 MB as it finishes, so the DRAM streams on through this launch's tail and
// the small kernels in between. 2..8 rows of x take gemm_invariant.cu, which streams the weights
// once for all rows (up to 3x faster than this kernel's former multi-row form, which re-read every
// x row per weight load).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cache_hints.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

// 4 warps (4 rows, or 2 split rows) per block: 8 blocks per SM at 64 registers (7 for the
// unsplit kernel, see kMinBlocks), the same 32 warps as 2 blocks of 8 but finer tails. H200, same call (docs/perf.md, session
// 11): decode ms/step 1B 1.042 / 1.025 -> 1.017 / 1.015, 8B 4.655 / 4.593 -> 4.578 / 4.589;
// gemv_bench equal or 1-3% faster per weight group; 2 warps no better.
constexpr int kWarpsPerBlock = 4;
constexpr int kLoadsInFlight = 4;  // 16-byte weight loads per lane issued before their use
// Launches of at least kSplitMinRows rows of at least kSplitMinK elements split each row over two
// warps.
constexpr int64_t kSplitMinK = 4096;
constexpr int64_t kSplitMinRows = 4096;
// The L2 prefetch of the next GEMV's weights (GemvPrefetch): ~1% of a batch-1 decode step. H200,
// decode ms/step, same calls (docs/perf.md, session 12): 4 MB 1B 1.021 / 1.032 / 0.998 / 0.987
// vs none 1.033 / 1.070 / 1.001 / 1.000, 8B 4.577 / 4.625 / 4.492 / 4.503 vs 4.621 / 4.643 /
// 4.526 / 4.527; 8 MB no better, 16 and 32 MB slower.
constexpr int64_t kPrefetchBytes = int64_t{4} << 20;
// __launch_bounds__'s blocks-per-SM hint (0: none). With a hint of 1, ptxas schedules the unsplit
// kernel in 68 registers instead of 64 (7 blocks per SM instead of 8; the same PTX apart from the
// hint, so the same arithmetic): `ember bench` tg128 on the 1B 1,071.0 / 1,071.4 -> 1,089.7 /
// 1,088.8 tok/s. The split kernel got slower with it (8B 234.5 -> 227.3), so it has none. H200,
// same call (docs/perf.md, session 14).
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

}  // namespace

bool GemvBf16Supported(const void* x, const void* w, int64_t k) {
  return k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0 &&
         (reinterpret_cast<uintptr_t>(w) % 16) == 0;
}

void LaunchGemvBf16Multi(const float* x, const GemvPart* parts, int num_parts, int64_t k,
                         GemvPrefetch next, cudaStream_t stream) {
  CHECK(num_parts >= 1 && num_parts <= kGemvMaxParts) << num_parts << " GEMV parts";
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

}  // namespace ember::cuda
