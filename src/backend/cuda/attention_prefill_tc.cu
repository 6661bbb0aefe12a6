// Tensor-core prefill attention (bf16 mode): block (64-row query tile, head, sequence), 4 warps
// x 16 query rows. Per 64-key tile: K/V gathered from the paged f32 pool into shared memory as
// bf16; S = Q K^T and O += P V on tensor cores (WMMA 16x16x16, f32 accumulate); the online
// softmax (scale, soft-cap, causal/window mask) runs in f32 on S staged in shared memory, and
// O lives in shared memory so rows can be rescaled. Needs head_dim % 16 == 0 (<= 256).
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 64;           // keys per tile
constexpr int kPad = 8;             // bf16 row padding (16 bytes) against bank conflicts

struct Layout {  // byte offsets into dynamic shared memory (each a multiple of 32)
  size_t q, k, v, s, p, o, slot, total;
};

__host__ __device__ inline Layout MakeLayout(int D) {
  Layout l;
  const size_t ld = static_cast<size_t>(D + kPad);
  l.q = 0;
  l.k = l.q + kRows * ld * 2;
  l.v = l.k + kKeys * ld * 2;
  l.s = l.v + kKeys * ld * 2;
  l.p = l.s + static_cast<size_t>(kWarps) * 16 * kKeys * 4;
  l.o = l.p + static_cast<size_t>(kWarps) * 16 * (kKeys + kPad) * 2;
  l.slot = l.o + static_cast<size_t>(kWarps) * 16 * D * 4;
  l.total = l.slot + kKeys * sizeof(int64_t);
  return l;
}

__global__ void __launch_bounds__(kWarps * 32)
    AttentionPrefillTcKernel(AttentionArgs a, const float* __restrict__ q, KvLayerView kv,
                             PlanView plan, float* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int D = a.head_dim;
  const int ld = D + kPad;
  const Layout L = MakeLayout(D);
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem + L.q);  // [kRows][ld]
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem + L.k);  // [kKeys][ld]
  __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(smem + L.v);  // [kKeys][ld]
  int64_t* slot_s = reinterpret_cast<int64_t*>(smem + L.slot);         // [kKeys]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s_w = reinterpret_cast<float*>(smem + L.s) + warp * 16 * kKeys;  // [16][kKeys]
  __nv_bfloat16* p_w =
      reinterpret_cast<__nv_bfloat16*>(smem + L.p) + warp * 16 * (kKeys + kPad);  // [16][kKeys+8]
  float* o_w = reinterpret_cast<float*>(smem + L.o) + warp * 16 * D;              // [16][D]

  const int4 seq = plan.seqs[blockIdx.z];
  const int32_t head = blockIdx.y;
  const int32_t tile_start = blockIdx.x * kRows;
  if (tile_start >= seq.y) return;
  const int32_t rows = min(kRows, seq.y - tile_start);
  const int32_t first_token = seq.x + tile_start;
  const int32_t kv_head = head / (a.num_heads / a.num_kv_heads);
  const int32_t* block_table = plan.block_tables + seq.w;
  const int32_t bs = plan.block_size;
  const int64_t kv_row = static_cast<int64_t>(kv.num_kv_heads) * D;

  for (int idx = threadIdx.x; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    const float v =
        r < rows ? q[(static_cast<int64_t>(first_token + r) * a.num_heads + head) * D + d] : 0.f;
    q_s[r * ld + d] = __float2bfloat16_rn(v);
  }
  for (int idx = lane; idx < 16 * D; idx += 32) o_w[idx] = 0.f;

  // Softmax state: lanes 2r and 2r+1 own row r of this warp (32 columns each).
  const int my_row = lane / 2, half = lane % 2;
  const int32_t my_r = warp * 16 + my_row;
  const int32_t my_pos = my_r < rows ? plan.positions[first_token + my_r] : -1;
  float m = -INFINITY, l = 0.f;

  const int32_t first_pos = plan.positions[first_token];
  const int32_t last_pos = plan.positions[first_token + rows - 1];
  const int32_t lo = a.sliding_window > 0 ? max(0, first_pos - a.sliding_window + 1) : 0;
  const int32_t hi = last_pos + 1;
  // This warp's rows: skip key tiles entirely outside their range.
  const int32_t warp_first_r = warp * 16;
  const bool warp_active = warp_first_r < rows;
  const int32_t warp_last_pos =
      warp_active ? plan.positions[first_token + min(rows - 1, warp_first_r + 15)] : -1;
  const int32_t warp_first_pos = warp_active ? plan.positions[first_token + warp_first_r] : 0;

  for (int32_t kt = lo; kt < hi; kt += kKeys) {
    __syncthreads();  // previous tile's K/V fully consumed (and q_s written on the first pass)
    if (threadIdx.x < kKeys) {
      const int32_t key = kt + threadIdx.x;
      slot_s[threadIdx.x] =
          key < hi ? static_cast<int64_t>(block_table[key / bs]) * bs + key % bs : -1;
    }
    __syncthreads();
    for (int idx = threadIdx.x * 4; idx < kKeys * D; idx += blockDim.x * 4) {
      const int j = idx / D, d = idx % D;  // D % 16 == 0: a float4 never straddles rows
      const int64_t slot = slot_s[j];
      float4 kk = make_float4(0.f, 0.f, 0.f, 0.f), vv = kk;
      if (slot >= 0) {
        const int64_t off = slot * kv_row + static_cast<int64_t>(kv_head) * D + d;
        kk = *reinterpret_cast<const float4*>(kv.k + off);
        vv = *reinterpret_cast<const float4*>(kv.v + off);
      }
      __nv_bfloat162* kd = reinterpret_cast<__nv_bfloat162*>(k_s + j * ld + d);
      __nv_bfloat162* vd = reinterpret_cast<__nv_bfloat162*>(v_s + j * ld + d);
      kd[0] = __floats2bfloat162_rn(kk.x, kk.y);
      kd[1] = __floats2bfloat162_rn(kk.z, kk.w);
      vd[0] = __floats2bfloat162_rn(vv.x, vv.y);
      vd[1] = __floats2bfloat162_rn(vv.z, vv.w);
    }
    __syncthreads();
    // Warp-uniform skip: no key of this tile is visible to any of this warp's rows.
    if (!warp_active || kt > warp_last_pos ||
        (a.sliding_window > 0 && kt + kKeys - 1 <= warp_first_pos - a.sliding_window))
      continue;

    // S = Q_w K^T   [16][kKeys]
    for (int n = 0; n < kKeys / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kd = 0; kd < D; kd += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, q_s + warp * 16 * ld + kd, ld);
        wmma::load_matrix_sync(fb, k_s + n * 16 * ld + kd, ld);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, kKeys, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on this lane's half row.
    float sv[32];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      const int32_t key = kt + col;
      const bool visible = my_pos >= 0 && key < hi && key <= my_pos &&
                           (a.sliding_window <= 0 || my_pos - key < a.sliding_window);
      float s = -INFINITY;
      if (visible) {
        s = s_w[my_row * kKeys + col] * a.scale;
        if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
      }
      sv[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float new_m = fmaxf(m, mx);
    const float corr = (m == -INFINITY) ? 0.f : expf(m - new_m);
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = sv[c] == -INFINITY ? 0.f : expf(sv[c] - new_m);
      const __nv_bfloat16 pb = __float2bfloat16_rn(p);
      sum += __bfloat162float(pb);  // normalise by what P.V actually sums
      p_w[my_row * (kKeys + kPad) + half * 32 + c] = pb;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = new_m;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) o_w[my_row * D + c] *= corr;
    __syncwarp();

    // O_w += P V   [16][D]
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + n * 16, D, wmma::mem_row_major);
      for (int kk = 0; kk < kKeys; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, p_w + kk, kKeys + kPad);
        wmma::load_matrix_sync(fb, v_s + kk * ld + n * 16, ld);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o_w + n * 16, acc, D, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (my_pos >= 0 && l > 0.f) {
    const int32_t token = first_token + my_r;
    float* out_row = out + (static_cast<int64_t>(token) * a.num_heads + head) * D;
    const float inv = 1.f / l;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c)
      out_row[c] = o_w[my_row * D + c] * inv;
  }
}

}  // namespace

bool AttentionPrefillTcSupported(int32_t head_dim) {
  return head_dim % 16 == 0 && head_dim <= kMaxHeadDim;
}

void LaunchAttentionPrefillTc(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                              const PlanView& plan, int32_t max_query_len, float* out,
                              cudaStream_t stream) {
  if (plan.num_tokens == 0 || plan.num_seqs == 0) return;
  CHECK(AttentionPrefillTcSupported(args.head_dim));
  const size_t smem = MakeLayout(args.head_dim).total;
  static bool configured = false;  // the attribute is per function; raise it once to the max
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(AttentionPrefillTcKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(MakeLayout(kMaxHeadDim).total)));
    configured = true;
  }
  const dim3 grid((max_query_len + kRows - 1) / kRows, args.num_heads, plan.num_seqs);
  AttentionPrefillTcKernel<<<grid, kWarps * 32, smem, stream>>>(args, q, kv, plan, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
