// Register-resident flash attention for prefill in the bf16 mode (FlashAttention-2 layout on
// mma.sync m16n8k16 bf16 tensor-core instructions, f32 accumulation): block (64-row query tile,
// head, sequence), 4 warps x 16 query rows. Q fragments, S, P and O stay in registers; only the
// 64-key K/V tile is staged in shared memory (gathered from the paged f32 pool, rounded to bf16,
// read with ldmatrix). Causal, sliding window, soft-cap and GQA as in the other kernels; the
// softmax normaliser sums the bf16-rounded P that the P.V product actually uses.
// Head dims 64 and 128 (template); others use attention_prefill_tc.cu.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_bf16.cuh"

namespace ember::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per tile

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionPrefillFlashKernel(AttentionArgs a, const float* __restrict__ q, KvLayerView kv,
                                PlanView plan, float* __restrict__ out) {
  constexpr int kLd = D + 8;  // bf16 per shared row: 16-byte pad keeps ldmatrix conflict-free
  __shared__ __align__(16) __nv_bfloat16 k_s[kKeys * kLd];
  __shared__ __align__(16) __nv_bfloat16 v_s[kKeys * kLd];
  __shared__ int64_t slot_s[kKeys];

  const int4 seq = plan.seqs[blockIdx.z];
  const int32_t tile_start = (gridDim.x - 1 - blockIdx.x) * kRows;  // long (late) tiles first
  if (tile_start >= seq.y) return;
  const int32_t rows = min(kRows, seq.y - tile_start);
  const int32_t first_token = seq.x + tile_start;
  const int32_t head = blockIdx.y;
  const int32_t kv_head = head / (a.num_heads / a.num_kv_heads);
  const int32_t* block_table = plan.block_tables + seq.w;
  const int32_t bs = plan.block_size;
  const int64_t kv_row = static_cast<int64_t>(kv.num_kv_heads) * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int r0 = warp * 16 + g, r1 = r0 + 8;  // this thread's two rows in the tile
  const int32_t pos0 = r0 < rows ? plan.positions[first_token + r0] : -1;
  const int32_t pos1 = r1 < rows ? plan.positions[first_token + r1] : -1;

  // Q as A fragments: a0 (row g, cols 2t..), a1 (row g+8), a2 (row g, cols 2t+8..), a3.
  uint32_t qf[D / 16][4];
  {
    const float* q0 = q + (static_cast<int64_t>(first_token + r0) * a.num_heads + head) * D;
    const float* q1 = q + (static_cast<int64_t>(first_token + r1) * a.num_heads + head) * D;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int c = ks * 16 + 2 * t;
      const float2 z = make_float2(0.f, 0.f);
      const float2 x0 = r0 < rows ? *reinterpret_cast<const float2*>(q0 + c) : z;
      const float2 x1 = r1 < rows ? *reinterpret_cast<const float2*>(q1 + c) : z;
      const float2 x2 = r0 < rows ? *reinterpret_cast<const float2*>(q0 + c + 8) : z;
      const float2 x3 = r1 < rows ? *reinterpret_cast<const float2*>(q1 + c + 8) : z;
      qf[ks][0] = PackBf16(x0.x, x0.y);
      qf[ks][1] = PackBf16(x1.x, x1.y);
      qf[ks][2] = PackBf16(x2.x, x2.y);
      qf[ks][3] = PackBf16(x3.x, x3.y);
    }
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // l: this thread's columns only

  const int32_t first_pos = plan.positions[first_token];
  const int32_t last_pos = plan.positions[first_token + rows - 1];
  const int32_t lo = a.sliding_window > 0 ? max(0, first_pos - a.sliding_window + 1) : 0;
  const int32_t hi = last_pos + 1;
  const bool warp_active = warp * 16 < rows;
  const int32_t warp_first_pos = warp_active ? plan.positions[first_token + warp * 16] : 0;
  const int32_t warp_last_pos =
      warp_active ? plan.positions[first_token + min(rows - 1, warp * 16 + 15)] : -1;

  for (int32_t kt = lo; kt < hi; kt += kKeys) {
    __syncthreads();  // the previous tile's K/V are consumed
    if (threadIdx.x < kKeys) {
      const int32_t key = kt + threadIdx.x;
      slot_s[threadIdx.x] =
          key < hi ? static_cast<int64_t>(block_table[key / bs]) * bs + key % bs : -1;
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kKeys * D / 4 / (kWarps * 32); ++it) {
      const int idx = it * kWarps * 32 + threadIdx.x;
      const int j = idx / (D / 4), d = (idx % (D / 4)) * 4;
      const int64_t slot = slot_s[j];
      float4 kk = make_float4(0.f, 0.f, 0.f, 0.f), vv = kk;
      if (slot >= 0) {
        const int64_t off = slot * kv_row + static_cast<int64_t>(kv_head) * D + d;
        kk = __ldg(reinterpret_cast<const float4*>(kv.k + off));
        vv = __ldg(reinterpret_cast<const float4*>(kv.v + off));
      }
      *reinterpret_cast<uint2*>(k_s + j * kLd + d) =
          make_uint2(PackBf16(kk.x, kk.y), PackBf16(kk.z, kk.w));
      *reinterpret_cast<uint2*>(v_s + j * kLd + d) =
          make_uint2(PackBf16(vv.x, vv.y), PackBf16(vv.z, vv.w));
    }
    __syncthreads();
    if (!warp_active || kt > warp_last_pos ||
        (a.sliding_window > 0 && kt + kKeys - 1 <= warp_first_pos - a.sliding_window))
      continue;  // warp-uniform: no key of this tile is visible to this warp's rows

    // S = Q K^T: 8 n-tiles of 8 keys.
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        const int key = np * 16 + (lane % 8) + 8 * (lane / 16);
        const int d = ks * 16 + 8 * ((lane / 8) % 2);
        LdMatrixX4(b, k_s + key * kLd + d);
        Mma(s[2 * np], qf[ks], b[0], b[1]);
        Mma(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    }

    // Scale, soft-cap, mask; online softmax over rows r0 (c0, c1) and r1 (c2, c3).
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int32_t key = kt + n * 8 + 2 * t + (c & 1);
        const int32_t pos = c < 2 ? pos0 : pos1;
        const bool visible = pos >= 0 && key <= pos && key < hi &&
                             (a.sliding_window <= 0 || pos - key < a.sliding_window);
        float x = s[n][c] * a.scale;
        if (a.softcap > 0.f) x = a.softcap * tanhf(x / a.softcap);
        s[n][c] = visible ? x : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float new_m0 = fmaxf(m0, mx0), new_m1 = fmaxf(m1, mx1);
    const float corr0 = m0 == -INFINITY ? 0.f : __expf(m0 - new_m0);
    const float corr1 = m1 == -INFINITY ? 0.f : __expf(m1 - new_m1);
    m0 = new_m0;
    m1 = new_m1;
    // P as A fragments of the P.V product: keys 16kk..16kk+15 are n-tiles 2kk and 2kk+1.
    uint32_t pf[kKeys / 16][4];
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      float p[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float mm = c < 2 ? new_m0 : new_m1;
        p[c] = s[n][c] == -INFINITY ? 0.f : __expf(s[n][c] - mm);
      }
      const uint32_t lo_pair = PackBf16(p[0], p[1]), hi_pair = PackBf16(p[2], p[3]);
      const __nv_bfloat162 lo_b = *reinterpret_cast<const __nv_bfloat162*>(&lo_pair);
      const __nv_bfloat162 hi_b = *reinterpret_cast<const __nv_bfloat162*>(&hi_pair);
      sum0 += __low2float(lo_b) + __high2float(lo_b);
      sum1 += __low2float(hi_b) + __high2float(hi_b);
      pf[n / 2][(n % 2) * 2] = lo_pair;
      pf[n / 2][(n % 2) * 2 + 1] = hi_pair;
    }
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= corr0;
      o[n][1] *= corr0;
      o[n][2] *= corr1;
      o[n][3] *= corr1;
    }

    // O += P V: V tile [key][d] read transposed.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        const int key = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        const int d = dp * 16 + 8 * (lane / 16);
        LdMatrixX4Trans(b, v_s + key * kLd + d);
        Mma(o[2 * dp], pf[kk], b[0], b[1]);
        Mma(o[2 * dp + 1], pf[kk], b[2], b[3]);
      }
    }
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (pos0 >= 0 && l0 > 0.f) {
    float* row = out + (static_cast<int64_t>(first_token + r0) * a.num_heads + head) * D;
    const float inv = 1.f / l0;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(row + n * 8 + 2 * t) = make_float2(o[n][0] * inv, o[n][1] * inv);
  }
  if (pos1 >= 0 && l1 > 0.f) {
    float* row = out + (static_cast<int64_t>(first_token + r1) * a.num_heads + head) * D;
    const float inv = 1.f / l1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(row + n * 8 + 2 * t) = make_float2(o[n][2] * inv, o[n][3] * inv);
  }
}

}  // namespace

bool AttentionPrefillFlashSupported(int32_t head_dim) { return head_dim == 64 || head_dim == 128; }

void LaunchAttentionPrefillFlash(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                                 const PlanView& plan, int32_t max_query_len, float* out,
                                 cudaStream_t stream) {
  if (plan.num_tokens == 0 || plan.num_seqs == 0) return;
  CHECK(AttentionPrefillFlashSupported(args.head_dim)) << "head_dim " << args.head_dim;
  const dim3 grid((max_query_len + kRows - 1) / kRows, args.num_heads, plan.num_seqs);
  if (args.head_dim == 64) {
    AttentionPrefillFlashKernel<64><<<grid, kWarps * 32, 0, stream>>>(args, q, kv, plan, out);
  } else {
    AttentionPrefillFlashKernel<128><<<grid, kWarps * 32, 0, stream>>>(args, q, kv, plan, out);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
