// The skinny GEMM (gemm_skinny.h): batched decode's out[t, m] = x[t, :] . W[m, :] streams W from
// DRAM once at near the copy bandwidth, where cublasGemmEx reached ~2 TB/s on the 8B's shapes and
// under 1 TB/s on the 1B's.
//
// One CTA owns block_m = 64 * kWarpGroups weight rows (a row tile) and a range of k. Warp group 0
// is the producer: its first lane copies, per 64-wide k block, the [block_m][64] weight tile and
// the [n][64] token tile (rows past `tokens` zero-filled) into a ring of kStages shared-memory
// stages with TMA (128-byte swizzle), completion counted on the stage's `full` mbarrier. Warp
// groups 1..kWarpGroups are the consumers: each multiplies its 64 weight rows by the n tokens with
// four wgmma.m64nNk16 per stage (both operands from shared memory, K-major), keeping one stage's
// wgmmas in flight while the next is issued, and releases a stage on its `empty` mbarrier (one
// arrival per consumer warp). The weight tiles' first copies go out before the PDL wait (weights
// are constant); the token tiles only after it.
//
// split == 1: a persistent grid of min(tiles, SMs) CTAs walks the row tiles (CTA b takes tiles
// b, b + grid, ...); the ring runs on across tiles, so a tile's epilogue (registers straight to
// out) overlaps the next tile's copies. split > 1 (few row tiles): the `split` CTAs of a cluster
// share one row tile, CTA r taking k blocks [r kb / split, (r + 1) kb / split); each writes its
// f32 partial tile into its own (drained) stage memory, the cluster syncs, and CTA r adds, for
// its 1 / split share of the tile's outputs, the partials of CTAs 0, 1, ..., split - 1 in that
// order (distributed shared memory), so the result does not depend on which CTA finished first.
// The plan (block_m, split) comes from a small cost model of the weight stream (PlanSkinnyGemm).
#include "backend/cuda/gemm_skinny.h"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cache_hints.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBlockK = 64;  // bf16 per 128-byte swizzled row: one TMA box's inner extent
constexpr int kRowBytes = kBlockK * 2;
constexpr int kMaxTokens = 256;  // wgmma's largest n
constexpr int kMaxSplit = 8;     // portable cluster size
constexpr int kMaxStages = 8;
constexpr int kSmemLimit = 227 << 10;  // H100/H200 opt-in shared memory per block

template <int kN, int kWarpGroups>
struct SkinnyConfig {
  static constexpr int kBlockM = 64 * kWarpGroups;
  static constexpr int kWBytes = kBlockM * kRowBytes;    // [kBlockM][64] bf16, swizzled
  static constexpr int kXBytes = kN * kRowBytes;         // [kN][64] bf16, swizzled
  static constexpr int kStageBytes = kWBytes + kXBytes;  // a multiple of 1024 (swizzle atoms)
  static constexpr int kStages = std::min(kMaxStages, (kSmemLimit - 2048) / kStageBytes);
  static constexpr int kThreads = 128 * (kWarpGroups + 1);
  // The split-k partial tile, [kN][kBlockM + 4] f32 in the drained stages (+4: the fragment
  // stores of a warp hit 32 distinct banks).
  static constexpr int kPartialStride = kBlockM + 4;
  // 1 KB of slack to align the stages to 1 KB (the 128-byte swizzle's atom), then the stages,
  // then the full and empty barriers.
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kStageBytes % 1024 == 0, "stages must stay 1 KB aligned");
  static_assert(kN * kPartialStride * 4 <= kStages * kStageBytes, "partial must fit the stages");
  static_assert(kSmemBytes <= kSmemLimit, "shared memory");
  static_assert(kStages >= 2, "stages");
};

struct SkinnyParams {
  float* out;
  int64_t ldo;
  int tokens;
  int m;
  int num_kb;     // k / 64
  int num_tiles;  // ceil(m / block_m)
  int split;      // CTAs per cluster sharing a row tile's k (1: persistent over tiles)
};

// ---- wgmma (sm_90a) ----

// Shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle: rows of 128 bytes,
// 8-row atoms 1024 bytes apart (stride byte offset), leading byte offset unused (1), base offset
// 0 (the tile starts 1 KB aligned; stepping the start address by 32 bytes per k16 inside the
// 128-byte row is how the swizzled K-major layout is walked).
__device__ __forceinline__ uint64_t SwizzledKMajorDesc(uint32_t smem_addr) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Ties the accumulators to this point of the instruction stream (after a wait), so the compiler
// does not read them before the asynchronous wgmma has written them.
template <int kCount>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x N] (+)= A[64 x 16] B[16 x N], both K-major in shared memory; scale_d == 0 ignores D's
// old value. The N / 2 f32 accumulators per thread are spelled out because inline PTX takes a
// literal register list.
template <int kN>
struct Wgmma;

#define EMBER_F8(i)                                                                         \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
template <>
struct Wgmma<16> {
  static __device__ __forceinline__ void Run(float (&d)[8], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7}, "
        "%8, %9, p, 1, 1, 0, 0;\n}\n"
        : EMBER_F8(0)
        : "l"(a), "l"(b), "r"(scale_d));
  }
};
template <>
struct Wgmma<32> {
  static __device__ __forceinline__ void Run(float (&d)[16], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, 0;\n}\n"
        : EMBER_F8(0), EMBER_F8(8)
        : "l"(a), "l"(b), "r"(scale_d));
  }
};
template <>
struct Wgmma<64> {
  static __device__ __forceinline__ void Run(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : EMBER_F8(0), EMBER_F8(8), EMBER_F8(16), EMBER_F8(24)
        : "l"(a), "l"(b), "r"(scale_d));
  }
};
template <>
struct Wgmma<128> {
  static __device__ __forceinline__ void Run(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
        "%60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : EMBER_F8(0), EMBER_F8(8), EMBER_F8(16), EMBER_F8(24), EMBER_F8(32), EMBER_F8(40),
          EMBER_F8(48), EMBER_F8(56)
        : "l"(a), "l"(b), "r"(scale_d));
  }
};
template <>
struct Wgmma<256> {
  static __device__ __forceinline__ void Run(float (&d)[128], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
        "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "
        "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "
        "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
        "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
        "%120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
        : EMBER_F8(0), EMBER_F8(8), EMBER_F8(16), EMBER_F8(24), EMBER_F8(32), EMBER_F8(40),
          EMBER_F8(48), EMBER_F8(56), EMBER_F8(64), EMBER_F8(72), EMBER_F8(80), EMBER_F8(88),
          EMBER_F8(96), EMBER_F8(104), EMBER_F8(112), EMBER_F8(120)
        : "l"(a), "l"(b), "r"(scale_d));
  }
};
#undef EMBER_F8

// ---- TMA ----

// One 2-D box of `map` at (inner, outer) into shared memory, counted on `bar` (complete_tx).
__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, int inner, int outer,
                                          uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(SmemAddr(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void ConsumerBarrier(int threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}

// ---- The kernel ----

template <int kN, int kWarpGroups>
__global__ void __launch_bounds__(SkinnyConfig<kN, kWarpGroups>::kThreads, 1)
    SkinnyGemmKernel(const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap x_map, const SkinnyParams p) {
  using C = SkinnyConfig<kN, kWarpGroups>;
  extern __shared__ unsigned char smem_raw[];
  // [kStages][kStageBytes]: the weight tile [kBlockM][64] then the token tile [kN][64]
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kStages * C::kStageBytes);
  uint64_t* empty = full + C::kStages;
  const int warp_group = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      MbarInit(full + s, 1);
      MbarInit(empty + s, 4 * kWarpGroups);
    }
    MbarInitFence();
  }
  __syncthreads();
  PdlTrigger();

  // This CTA's row tiles (first_tile + i * tile_stride, i < num_my_tiles) and k blocks.
  int first_tile, tile_stride, num_my_tiles, kb_begin, kb_count, rank = 0;
  if (p.split > 1) {
    rank = static_cast<int>(cg::this_cluster().block_rank());
    first_tile = blockIdx.x / p.split;
    tile_stride = 0;
    num_my_tiles = 1;
    kb_begin = rank * p.num_kb / p.split;
    kb_count = (rank + 1) * p.num_kb / p.split - kb_begin;
  } else {
    first_tile = blockIdx.x;
    tile_stride = gridDim.x;
    num_my_tiles = (p.num_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
    kb_begin = 0;
    kb_count = p.num_kb;
  }

  if (warp_group == 0) {
    // ---- Producer: one lane issues every copy ----
    if (threadIdx.x == 0) {
      const int total = num_my_tiles * kb_count;      // ring iterations
      const uint64_t w_policy = EvictFirstPolicy();   // read once
      const uint64_t x_policy = EvictNormalPolicy();  // read by every CTA
      auto stage = [&](int it) { return smem + (it % C::kStages) * C::kStageBytes; };
      auto k_of = [&](int it) { return (kb_begin + it % kb_count) * kBlockK; };
      auto m_of = [&](int it) { return (first_tile + it / kb_count * tile_stride) * C::kBlockM; };
      // The first stages' weights go out before the previous kernel has finished; x after it.
      const int prologue = min(C::kStages, total);
      for (int it = 0; it < prologue; ++it) {
        MbarArriveExpectTx(full + it, C::kStageBytes);
        TmaLoad2d(stage(it), &w_map, k_of(it), m_of(it), full + it, w_policy);
      }
      PdlWait();
      for (int it = 0; it < prologue; ++it) {
        TmaLoad2d(stage(it) + C::kWBytes, &x_map, k_of(it), 0, full + it, x_policy);
      }
      for (int it = prologue; it < total; ++it) {
        const int slot = it % C::kStages;
        MbarWait(empty + slot, ((it / C::kStages) & 1) ^ 1);
        MbarArriveExpectTx(full + slot, C::kStageBytes);
        TmaLoad2d(stage(it), &w_map, k_of(it), m_of(it), full + slot, w_policy);
        TmaLoad2d(stage(it) + C::kWBytes, &x_map, k_of(it), 0, full + slot, x_policy);
      }
    }
    __syncwarp();
  } else {
    // ---- Consumers: warp group g multiplies weight rows [64 g, 64 g + 64) of the tile ----
    const int g = warp_group - 1;
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    PdlWait();  // out may still be read by the previous kernel
    // The m64nN accumulator fragment: d[4 j + {0, 1}] is (row, col + {0, 1}), d[4 j + {2, 3}]
    // is (row + 8, col + {0, 1}), row = 16 warp + lane / 4, col = 8 j + 2 (lane % 4).
    float d[kN / 2];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) d[i] = 0.f;
    const int row = warp * 16 + lane / 4;
    const uint32_t smem_addr = SmemAddr(smem);
    int it = 0;
    for (int tile_idx = 0; tile_idx < num_my_tiles; ++tile_idx) {
      for (int kb = 0; kb < kb_count; ++kb, ++it) {
        const int slot = it % C::kStages;
        MbarWait(full + slot, (it / C::kStages) & 1);
        const uint32_t stage = smem_addr + slot * C::kStageBytes;
        const uint64_t a = SwizzledKMajorDesc(stage + g * 64 * kRowBytes);
        const uint64_t b = SwizzledKMajorDesc(stage + C::kWBytes);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kBlockK / 16; ++kk) {  // 16 bf16 = 32 bytes = 2 descriptor units
          Wgmma<kN>::Run(d, a + 2 * kk, b + 2 * kk, (kb > 0 || kk > 0) ? 1 : 0);
        }
        WgmmaCommit();
        if (kb > 0) {  // the previous stage's wgmmas are done: release it
          WgmmaWait<1>();
          if (lane == 0) MbarArrive(empty + (it - 1) % C::kStages);
        }
      }
      WgmmaWait<0>();
      FenceAccumulators(d);
      if (lane == 0) MbarArrive(empty + (it - 1) % C::kStages);
      const int m0 = (first_tile + tile_idx * tile_stride) * C::kBlockM + g * 64;
      if (p.split == 1 && m0 < p.m) {  // m % 64 == 0: a warp group's rows are all in or all out
        float* out = p.out + m0 + row;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
          const int col = 8 * j + 2 * (lane % 4);
          if (col < p.tokens) {
            out[col * p.ldo] = d[4 * j];
            out[col * p.ldo + 8] = d[4 * j + 2];
          }
          if (col + 1 < p.tokens) {
            out[(col + 1) * p.ldo] = d[4 * j + 1];
            out[(col + 1) * p.ldo + 8] = d[4 * j + 3];
          }
        }
      }
    }
    if (p.split > 1) {
      // Every stage is drained (both warp groups' wgmmas done, every copy landed): the partial
      // tile [kN][kPartialStride] f32 reuses the stage memory. The proxy fence orders the
      // wgmmas' (async proxy) reads before these generic writes.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      ConsumerBarrier(128 * kWarpGroups);
      float* part = reinterpret_cast<float*>(smem) + g * 64 + row;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        const int col = 8 * j + 2 * (lane % 4);
        part[col * C::kPartialStride] = d[4 * j];
        part[col * C::kPartialStride + 8] = d[4 * j + 2];
        part[(col + 1) * C::kPartialStride] = d[4 * j + 1];
        part[(col + 1) * C::kPartialStride + 8] = d[4 * j + 3];
      }
    }
  }
  if (p.split > 1) {
    // ---- Split-k reduction over the cluster, in split order ----
    // CTA `rank` sums elements [rank E / split, (rank + 1) E / split) of the tile's
    // E = tokens x kBlockM outputs (flattened token-major, so the stores run along m).
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const float* part = reinterpret_cast<const float*>(smem);
    const int num_elems = p.tokens * C::kBlockM;
    const int lo = rank * num_elems / p.split, hi = (rank + 1) * num_elems / p.split;
    const int m0 = first_tile * C::kBlockM;
    for (int e = lo + static_cast<int>(threadIdx.x); e < hi; e += blockDim.x) {
      const int t = e / C::kBlockM, r = e % C::kBlockM;
      if (m0 + r >= p.m) continue;
      float v[kMaxSplit];
#pragma unroll
      for (int q = 0; q < kMaxSplit; ++q) {
        v[q] = q < p.split ? cluster.map_shared_rank(part, q)[t * C::kPartialStride + r] : 0.f;
      }
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < kMaxSplit; ++q) {
        if (q < p.split) sum += v[q];
      }
      p.out[t * p.ldo + m0 + r] = sum;
    }
    cluster.sync();  // no CTA leaves while another still reads its shared memory
  }
}

// ---- Host ----

using KernelFn = void (*)(CUtensorMap, CUtensorMap, SkinnyParams);

struct KernelInfo {
  KernelFn fn;
  int smem_bytes;
  int threads;
  int stages;
  int blocks_per_sm;  // occupancy (filled at first use)
};

constexpr int kTokenBuckets[] = {16, 32, 64, 128, 256};
constexpr int kNumBuckets = 5;

int BucketIndex(int n) {
  for (int i = 0; i < kNumBuckets; ++i) {
    if (kTokenBuckets[i] == n) return i;
  }
  CHECK(false) << "skinny GEMM: no instance for n = " << n;
  return -1;
}

template <int kN, int kWarpGroups>
KernelInfo MakeInfo() {
  using C = SkinnyConfig<kN, kWarpGroups>;
  return {&SkinnyGemmKernel<kN, kWarpGroups>, C::kSmemBytes, C::kThreads, C::kStages, 0};
}

// [bucket][block_m / 64 - 1], with the shared-memory opt-in set and the occupancy read once.
KernelInfo& Kernel(int n, int block_m) {
  static KernelInfo* table = [] {
    static KernelInfo t[kNumBuckets][2] = {{MakeInfo<16, 1>(), MakeInfo<16, 2>()},
                                           {MakeInfo<32, 1>(), MakeInfo<32, 2>()},
                                           {MakeInfo<64, 1>(), MakeInfo<64, 2>()},
                                           {MakeInfo<128, 1>(), MakeInfo<128, 2>()},
                                           {MakeInfo<256, 1>(), MakeInfo<256, 2>()}};
    for (auto& row : t) {
      for (KernelInfo& info : row) {
        const void* fn = reinterpret_cast<const void*>(info.fn);
        CUDA_CHECK(
            cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, info.smem_bytes));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&info.blocks_per_sm, fn,
                                                                 info.threads, info.smem_bytes));
        CHECK(info.blocks_per_sm >= 1) << "skinny GEMM: a block does not fit an SM";
      }
    }
    return &t[0][0];
  }();
  return table[BucketIndex(n) * 2 + block_m / 64 - 1];
}

// CTAs of clusters of `split` that can be resident at once (read once per instance and split).
int ClusterCapacityCtas(int n, int block_m, int split) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [pos, inserted] = cache.try_emplace({n, block_m, split}, 0);
  if (inserted) {
    const KernelInfo& info = Kernel(n, block_m);
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(split, 1, 1);
    config.blockDim = dim3(info.threads, 1, 1);
    config.dynamicSmemBytes = info.smem_bytes;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = split;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    int clusters = 0;
    CUDA_CHECK(
        cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(info.fn), &config));
    pos->second = std::max(1, clusters) * split;
  }
  return pos->second;
}

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The cost model behind PlanSkinnyGemm (seconds; only its ordering matters). Each active CTA
// streams its weight tiles at the DRAM bandwidth's share, capped by what its ring sustains
// (stages in flight per copy latency); the token tiles come from the L2 and count a quarter; a
// k block takes at least its wgmma time; each wave of CTAs pays one copy latency to fill its
// ring (a persistent grid only once), and a split wave the cluster reduction.
constexpr double kDramBytesPerS = 4.0e12;
constexpr double kCopyLatencyS = 1.0e-6;
constexpr double kSmFlopsPerS = 6.0e12;  // ~80% of an H200 SM's dense bf16 rate
constexpr double kDsmemBytesPerS = 200e9;
constexpr double kClusterSyncS = 0.5e-6;

double PlanCost(int n, int block_m, int split, int64_t m, int64_t k, int grid, int capacity) {
  const KernelInfo& info = Kernel(n, block_m);
  const int64_t tiles = CeilDiv(m, block_m), num_kb = k / kBlockK;
  const int64_t ctas = split == 1 ? tiles : tiles * split;
  const int64_t active = std::min<int64_t>(std::min<int64_t>(ctas, grid), capacity);
  const int64_t rounds = CeilDiv(ctas, active);
  const double w_bytes = double(block_m) * kRowBytes, x_bytes = double(n) * kRowBytes;
  const double bw =
      std::min(kDramBytesPerS / double(active), info.stages * w_bytes / kCopyLatencyS);
  const double per_kb =
      std::max((w_bytes + 0.25 * x_bytes) / bw, 2.0 * block_m * n * kBlockK / kSmFlopsPerS);
  double t = double(rounds) * double(CeilDiv(num_kb, split)) * per_kb;
  t += kCopyLatencyS * double(split == 1 ? 1 : rounds);
  if (split > 1) t += double(rounds) * (2 * kClusterSyncS + block_m * n * 4.0 / kDsmemBytesPerS);
  return t;
}

int GridFor(const SkinnyGemmPlan& plan, int64_t m) {
  const int64_t tiles = CeilDiv(m, plan.block_m);
  if (plan.split > 1) return static_cast<int>(tiles * plan.split);
  const KernelInfo& info = Kernel(plan.n, plan.block_m);
  return static_cast<int>(
      std::min<int64_t>(tiles, int64_t{CurrentDeviceSmCount()} * info.blocks_per_sm));
}

// ---- Tensor maps ----

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                cudaEnableDefault, &query));
    CHECK(query == cudaDriverEntryPointSuccess && p != nullptr)
        << "skinny GEMM: cuTensorMapEncodeTiled not found in the driver";
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A bf16 [rows, k] row-major matrix read in [box_rows][64] boxes with the 128-byte swizzle;
// rows past `rows` read as zeros. Encoded once per (pointer, rows, k, box_rows).
CUtensorMap CachedMap(const void* ptr, int64_t rows, int64_t k, int box_rows) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int64_t, int64_t, int>, CUtensorMap> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [pos, inserted] = cache.try_emplace({ptr, rows, k, box_rows});
  if (inserted) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};  // bytes, of dim 1
    const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBlockK), static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = EncodeTiled()(
        &pos->second, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides,
        box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) cache.erase(pos);
    CHECK(r == CUDA_SUCCESS) << "skinny GEMM: cuTensorMapEncodeTiled failed (" << int(r)
                             << ") for rows " << rows << " k " << k << " box " << box_rows;
  }
  return pos->second;
}

}  // namespace

bool SkinnyGemmSupported(int64_t tokens, int64_t m, int64_t k, const void* x, const void* w) {
  return tokens >= 1 && tokens <= kMaxTokens && m > 0 && k > 0 && m % 64 == 0 && k % kBlockK == 0 &&
         m < (int64_t{1} << 31) && k < (int64_t{1} << 31) &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

namespace {

SkinnyGemmPlan ChoosePlan(int64_t tokens, int64_t m, int64_t k) {
  SkinnyGemmPlan best;
  for (int n : kTokenBuckets) {
    if (n >= tokens) {
      best.n = n;
      break;
    }
  }
  CHECK(best.n > 0) << "skinny GEMM: tokens " << tokens << " > " << kMaxTokens;
  double best_cost = 0;
  const int max_split = static_cast<int>(std::min<int64_t>(kMaxSplit, k / kBlockK));
  for (int block_m : {128, 64}) {
    for (int split = 1; split <= max_split; ++split) {
      SkinnyGemmPlan plan{best.n, block_m, split, 0};
      plan.grid = GridFor(plan, m);
      const int capacity = split == 1 ? plan.grid : ClusterCapacityCtas(plan.n, block_m, split);
      const double cost = PlanCost(plan.n, block_m, split, m, k, plan.grid, capacity);
      if (best.block_m == 0 || cost < best_cost) {
        best = plan;
        best_cost = cost;
      }
    }
  }
  return best;
}

}  // namespace

SkinnyGemmPlan PlanSkinnyGemm(int64_t tokens, int64_t m, int64_t k) {
  // Cached per (padded tokens, m, k): a launch only looks its plan up.
  int64_t n = kTokenBuckets[0];
  while (n < tokens && n < kMaxTokens) n *= 2;
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, SkinnyGemmPlan> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [pos, inserted] = cache.try_emplace({n, m, k});
  if (inserted) pos->second = ChoosePlan(n, m, k);
  return pos->second;
}

// Why only the k/v shapes (at most 1,024 rows and 4 M elements): on them this kernel beats
// cublasGemmEx at every row count (bench/skinny_gemm_bench) and speeds up batched decode in the
// engine. Larger matrices are slower than cuBLAS from 128 rows and within a few percent below, and
// adding the 1B's q/o made the engine slower (docs/perf.md).
bool SkinnyGemmPreferred(int64_t tokens, int64_t m, int64_t k) {
  if (tokens < 1 || tokens > kMaxTokens) return false;
  return m <= 1024 && m * k <= (int64_t{4} << 20);
}

void SkinnyGemmWarmUp() {
  (void)Kernel(kTokenBuckets[0], 64);
}

void LaunchSkinnyGemmWithPlan(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out,
                              int64_t ldo, int64_t tokens, int64_t m, int64_t k,
                              const SkinnyGemmPlan& plan, cudaStream_t stream) {
  CHECK(SkinnyGemmSupported(tokens, m, k, x, w) && ldo >= m)
      << "skinny GEMM: unsupported call tokens " << tokens << " m " << m << " k " << k;
  CHECK(plan.n >= tokens && (plan.block_m == 64 || plan.block_m == 128) && plan.split >= 1 &&
        plan.split <= kMaxSplit && plan.split <= k / kBlockK)
      << "skinny GEMM: bad plan n " << plan.n << " block_m " << plan.block_m << " split "
      << plan.split;
  const KernelInfo& info = Kernel(plan.n, plan.block_m);
  const CUtensorMap w_map = CachedMap(w, m, k, plan.block_m);
  const CUtensorMap x_map = CachedMap(x, tokens, k, plan.n);
  const SkinnyParams params{out,
                            ldo,
                            static_cast<int>(tokens),
                            static_cast<int>(m),
                            static_cast<int>(k / kBlockK),
                            static_cast<int>(CeilDiv(m, plan.block_m)),
                            plan.split};
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(GridFor(plan, m), 1, 1);
  config.blockDim = dim3(info.threads, 1, 1);
  config.dynamicSmemBytes = info.smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  config.numAttrs = 1;
  if (plan.split > 1) {
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = plan.split;
    attrs[1].val.clusterDim.y = 1;
    attrs[1].val.clusterDim.z = 1;
    config.numAttrs = 2;
  }
  config.attrs = attrs;
  CUDA_CHECK(cudaLaunchKernelEx(&config, info.fn, w_map, x_map, params));
}

void LaunchSkinnyGemm(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int64_t ldo,
                      int64_t tokens, int64_t m, int64_t k, cudaStream_t stream) {
  LaunchSkinnyGemmWithPlan(x, w, out, ldo, tokens, m, k, PlanSkinnyGemm(tokens, m, k), stream);
}

}  // namespace ember::cuda
