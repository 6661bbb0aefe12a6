// cp.async (sm_80+): 16-byte global -> shared copies that complete asynchronously in commit
// groups, shared by the tensor-core GEMM (gemm_invariant.cu) and the MoE experts (moe.cu).
#pragma once

#include <cstdint>

namespace ember::cuda {

// 16-byte global -> shared copy; zero-fills the destination when !valid (src then unread).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
// The same, its L2 lines under `policy` (cache_hints.cuh).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid,
                                          uint64_t policy) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(bytes), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// At most n groups pending (wait_group takes an immediate; n is one of the ring depths - 2).
__device__ __forceinline__ void CpAsyncWaitPending(int n) {
  switch (n) {
    case 1:
      return CpAsyncWait<1>();
    case 2:
      return CpAsyncWait<2>();
    case 4:
      return CpAsyncWait<4>();
    case 6:
      return CpAsyncWait<6>();
    case 10:
      return CpAsyncWait<10>();
    case 14:
      return CpAsyncWait<14>();
    case 22:
      return CpAsyncWait<22>();
    case 30:
      return CpAsyncWait<30>();
    default:
      return CpAsyncWait<0>();
  }
}
constexpr int kStageChoices[] = {3, 4, 6, 8, 12, 16, 24, 32};  // ring depths (waits above)

}  // namespace ember::cuda
