// Warp-level bf16 tensor-core primitives shared by the attention and GEMM kernels:
// mma.sync m16n8k16 (row.col, f32 accumulation), ldmatrix x2 / x4 (plain and transposed) and the
// float pair -> bf16x2 packing. Every lane of the warp must execute them together.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace ember::cuda {

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c[16x8] += a[16x16] b[16x8] (row.col), bf16 operands, f32 accumulators. Each element of c
// depends only on its own row of a and column of b.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem_ptr) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX2(uint32_t (&r)[2], const void* smem_ptr) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem_ptr) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Fragments of row-major tiles in shared memory for Mma (lane = 4 g + t): of the rows of `tile`
// (`ld` elements apart) from row0, k from kk,
// the A fragment of an m16 x k16 tile (16 bf16 weight rows) ...
__device__ __forceinline__ void LoadAFragment(uint32_t (&a)[4], const __nv_bfloat16* tile, int row0,
                                              int ld, int kk, int lane) {
  LdMatrixX4(a, tile + (row0 + lane % 16) * ld + kk + (lane / 16) * 8);
}

// ... the B fragment of a k16 x n8 tile from 8 f32 rows, rounded to bf16 RN (row g's elements
// kk + 2t, kk + 2t + 1 and those 8 on) ...
__device__ __forceinline__ void LoadBFragmentF32(uint32_t (&b)[2], const float* tile, int row0,
                                                 int ld, int kk, int lane) {
  const float* xr = tile + (row0 + lane / 4) * ld + kk + 2 * (lane % 4);
  const float2 lo = *reinterpret_cast<const float2*>(xr);
  const float2 hi = *reinterpret_cast<const float2*>(xr + 8);
  b[0] = PackBf16(lo.x, lo.y);
  b[1] = PackBf16(hi.x, hi.y);
}

// ... and the B fragments of two k16 x n8 tiles from 16 bf16 rows (b0: rows 0..7, b1: 8..15), by
// one ldmatrix.
__device__ __forceinline__ void LoadBFragmentsBf16(uint32_t (&b0)[2], uint32_t (&b1)[2],
                                                   const __nv_bfloat16* tile, int row0, int ld,
                                                   int kk, int lane) {
  uint32_t r[4];
  LdMatrixX4(r, tile + (row0 + lane % 8 + (lane / 16) * 8) * ld + kk + ((lane / 8) % 2) * 8);
  b0[0] = r[0];
  b0[1] = r[1];
  b1[0] = r[2];
  b1[1] = r[3];
}

}  // namespace ember::cuda
