// Cache hints for weights that a kernel streams once per step (batch-1 decode GEMV, the
// invariant GEMM's one-column launches: decode of 2..128 rows). Without them each 16-byte weight load allocates in L1, where it evicts the GEMV's x,
// and enters the L2 at normal priority, where it evicts what is read again soon: the next
// GEMV's first rows that the last wave prefetched, the activations, the KV cache. The two hints
// together make batch-1 decode ~4-5% faster; L1::no_allocate gives about two thirds of that
// (docs/perf.md).
#pragma once

#include <cstdint>

namespace ember::cuda {

// An L2 policy under which the lines a load brings in are the first to be evicted.
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// The default priority, as a policy operand.
__device__ __forceinline__ uint64_t EvictNormalPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes of read-only data that is read once: no L1 allocation, L2 lines under `policy`.
__device__ __forceinline__ uint4 LoadStreaming16(const void* p, uint64_t policy) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(policy));
  return r;
}

// The same for 4 bytes.
__device__ __forceinline__ uint32_t LoadStreaming4(const void* p, uint64_t policy) {
  uint32_t r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;"
               : "=r"(r)
               : "l"(p), "l"(policy));
  return r;
}

}  // namespace ember::cuda
