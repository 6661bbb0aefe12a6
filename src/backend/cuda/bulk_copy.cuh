// Bulk copies from global into shared memory (cp.async.bulk, Hopper) whose completion is counted
// on a shared-memory mbarrier, and the mbarrier operations around them: the pieces of a ring of
// shared-memory stages that one producer lane fills while consumer warps drain it.
#pragma once

#include <cstdint>

namespace ember::cuda {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// `count` arrivals complete a phase. Fence once after the inits, before any other thread or the
// copy engine uses the barriers.
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void MbarInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Spins until the phase of parity `parity` has completed.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  }
}

// Whether the phase of parity `parity` has completed, without waiting.
__device__ __forceinline__ bool MbarReady(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(SmemAddr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

// One arrival that also announces `bytes` of bulk copies completing on this phase.
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

// bytes (a multiple of 16; src and dst 16-byte aligned) from global src to shared dst, counted
// on `bar` when they land; L2 lines under `policy` (cache_hints.cuh).
__device__ __forceinline__ void BulkCopyToShared(void* dst, const void* src, uint32_t bytes,
                                                 uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar)), "l"(policy)
      : "memory");
}

}  // namespace ember::cuda
