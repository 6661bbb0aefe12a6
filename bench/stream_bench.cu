// How fast one block per SM can stream a buffer from DRAM into shared memory with bulk copies
// (cp.async.bulk into a ring of stages, completion on mbarriers; one producer lane per block and
// `consumers` warps that wait for each stage, optionally read all of it, and release it), against
// plain 16-byte loads by many warps (the batch-1 GEMV's way: no L1 allocation, evict-first in the
// L2). The question it answers (docs/perf.md): when a persistent decode kernel fed this way takes
// ~1 us per 32 KB stage whatever the stage size, is that the bulk-copy ring's own rate (stages in
// flight x stage size / latency), or the rest of that kernel? Every byte comes from DRAM (the buffer is 20x the
// L2). Prints GB/s (median of the reps) per configuration.
// usage: stream_bench [--mb 1024] [--reps 20]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/cache_hints.cuh"
#include "backend/cuda/cuda_check.h"
#include "cuda_timing.h"
#include "util/flags.h"

namespace {

constexpr int kMaxStages = 16;
constexpr int kMaxSmem = 227 << 10;

// Block b streams bytes [b * share, (b + 1) * share) of src through `stages` stages of
// stage_bytes; warp `consumers` (the last) is the producer. touch: the consumers read every
// 16-byte word of each stage (xor into a sum) before releasing it.
__global__ void RingKernel(const unsigned char* src, int64_t share, int stages, int stage_bytes,
                           int consumers, int touch, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + int64_t{stages} * stage_bytes);
  uint64_t* empty = full + kMaxStages;
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      ember::cuda::MbarInit(full + i, 1);
      ember::cuda::MbarInit(empty + i, static_cast<uint32_t>(consumers));
    }
    ember::cuda::MbarInitFence();
  }
  __syncthreads();
  const unsigned char* base = src + blockIdx.x * share;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int slot = 0;
  uint32_t phase = 0;
  auto advance = [&] {
    if (++slot == stages) {
      slot = 0;
      phase ^= 1;
    }
  };
  if (warp == consumers) {
    if (lane != 0) return;
    const uint64_t policy = ember::cuda::EvictFirstPolicy();
    for (int64_t off = 0; off < share; off += stage_bytes) {
      const uint32_t n = static_cast<uint32_t>(min(int64_t{stage_bytes}, share - off));
      ember::cuda::MbarWait(empty + slot, phase ^ 1);
      ember::cuda::MbarArriveExpectTx(full + slot, n);
      ember::cuda::BulkCopyToShared(smem + int64_t{slot} * stage_bytes, base + off, n, full + slot,
                                    policy);
      advance();
    }
    return;
  }
  unsigned acc = 0;
  for (int64_t off = 0; off < share; off += stage_bytes) {
    const int n = static_cast<int>(min(int64_t{stage_bytes}, share - off));
    ember::cuda::MbarWait(full + slot, phase);
    if (touch) {
      const uint4* s = reinterpret_cast<const uint4*>(smem + int64_t{slot} * stage_bytes);
      for (int i = warp * 32 + lane; i < n / 16; i += consumers * 32) {
        const uint4 v = s[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
    __syncwarp();
    if (lane == 0) ember::cuda::MbarArrive(empty + slot);
    advance();
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the reads
}

// Plain loads: warps over 16-byte words, `kInFlight` loads per lane issued before their use.
constexpr int kInFlight = 4;
__global__ void LoadKernel(const uint4* src, int64_t words, unsigned* sink) {
  const uint64_t policy = ember::cuda::EvictFirstPolicy();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  unsigned acc = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words;
       i += stride * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      v[u] = i + u * stride < words ? ember::cuda::LoadStreaming16(src + i + u * stride, policy)
                                    : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mb = 1024, reps = 20;
  bool help = false;
  ember::FlagParser flags("stream_bench [flags]");
  flags.AddInt("--mb", &mb, "buffer size in MiB (streamed once per rep)");
  flags.AddInt("--reps", &reps, "timed reps (the median counts)");
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  if (mb < 64 || reps < 1) {
    std::fprintf(stderr, "--mb must be >= 64 and --reps >= 1\n");
    return 2;
  }
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t bytes = mb << 20;
  unsigned char* buf = nullptr;
  unsigned* sink = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, static_cast<size_t>(bytes)));
  CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(buf, 0x5a, static_cast<size_t>(bytes)));
  CUDA_CHECK(
      cudaFuncSetAttribute(RingKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  const int64_t share = bytes / sms / 16 * 16;  // per block
  auto gbps = [](double ms, int64_t moved) { return static_cast<double>(moved) / (ms * 1e6); };
  std::printf("SMs %d, %lld MiB, reps %lld; GB/s (median)\n", sms, static_cast<long long>(mb),
              static_cast<long long>(reps));
  for (const int blocks_per_sm : {8, 16}) {
    const int blocks = sms * blocks_per_sm;
    const double ms = ember::bench::MedianMs(st, reps, [&] {
      LoadKernel<<<blocks, 128, 0, st>>>(reinterpret_cast<const uint4*>(buf), bytes / 16, sink);
      CUDA_CHECK(cudaGetLastError());
    });
    std::printf("loads: %2d blocks of 4 warps per SM, %d in flight per lane: %8.1f\n",
                blocks_per_sm, kInFlight, gbps(ms, bytes));
  }
  for (const int stage_kb : {16, 32, 64}) {
    for (const int stages : {2, 3, 4, 6, 8, 12}) {
      const int64_t smem = int64_t{stages} * stage_kb * 1024 + 2 * kMaxStages * 8;
      if (smem > kMaxSmem) continue;
      for (const int consumers : {1, 8}) {
        for (const int touch : {0, 1}) {
          const double ms = ember::bench::MedianMs(st, reps, [&] {
            RingKernel<<<sms, (consumers + 1) * 32, static_cast<size_t>(smem), st>>>(
                buf, share, stages, stage_kb * 1024, consumers, touch, sink);
            CUDA_CHECK(cudaGetLastError());
          });
          std::printf("ring: %2d stages x %2d KB (%3d KB), %d consumer warps, %s: %8.1f\n", stages,
                      stage_kb, stages * stage_kb, consumers, touch ? "read" : "no read",
                      gbps(ms, share * sms));
        }
      }
    }
  }
  CUDA_CHECK(cudaFree(buf));
  CUDA_CHECK(cudaFree(sink));
  return 0;
}
