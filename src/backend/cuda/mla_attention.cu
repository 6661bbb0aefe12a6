// Multi-head latent attention (Backend::MlaAttention, deepseek_v3) over the latent pool, as two
// straightforward launches: (1) per row, rotate q's rope dims and k_rope and write [c | k_rope]
// at the row's slot; (2) a block per (row, head) with the up-projection absorbed, as
// backend/cpu/mla_attention.h: q_lat = W_uk^T q_nope, scores scale * (q_lat . c_t + q_rope .
// k_rope_t) with an online softmax over chunks of keys, o_lat = sum p_t c_t, out = W_uv o_lat.
// f32 throughout: the f32 compute mode's path (exact parity). The bf16 mode takes the tensor-core
// path below (LaunchMlaAttentionFlash): keys shared by a sequence's rows and heads in shared
// memory, the absorbed products on mma.sync.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kMlaThreads = 256;
constexpr int kMlaWarps = kMlaThreads / 32;
constexpr int kKeyChunk = 64;
constexpr int kLatentPerThread = kMlaMaxLatent / kMlaThreads;

// v [dim] rotated in place at one position (HF rotate-half; with `interleave` its pairs are
// first de-interleaved), as cpu/mla_attention.cc's RotateRope.
__device__ void RotateRope(float* v, int32_t dim, const float* cos, const float* sin,
                           bool interleave) {
  const int32_t half = dim / 2;
  float x[kMlaMaxRope];
  for (int32_t j = 0; j < half; ++j) {
    x[j] = interleave ? v[2 * j] : v[j];
    x[half + j] = interleave ? v[2 * j + 1] : v[half + j];
  }
  for (int32_t j = 0; j < half; ++j) {
    const float x1 = x[j], x2 = x[j + half];
    v[j] = x1 * cos[j] - x2 * sin[j];
    v[j + half] = x2 * cos[j] + x1 * sin[j];
  }
}

// A block per row: thread h < heads rotates q's head h, thread `heads` k_rope into the pool row
// (written with the latent c by the whole block).
__global__ void MlaRopeWriteKernel(MlaArgs a, PlanView plan) {
  const int64_t i = blockIdx.x;
  const int32_t pos = plan.positions[i];
  const int32_t rd = a.rope_dim, lat = a.latent_dim, half = rd / 2;
  if (pos < 0 || pos >= a.max_positions) __trap();  // beyond the rope table
  const float* cs = a.cos + static_cast<int64_t>(pos) * half;
  const float* sn = a.sin + static_cast<int64_t>(pos) * half;
  const int64_t slot = plan.slot_mapping[i];
  if (slot < 0 || slot >= a.num_slots) __trap();
  float* row = a.pool + slot * (lat + rd);
  for (int32_t r = threadIdx.x; r < lat; r += blockDim.x) row[r] = a.c[i * lat + r];
  const int64_t qd = a.nope_dim + rd;
  for (int32_t h = threadIdx.x; h <= a.num_heads; h += blockDim.x) {
    if (h < a.num_heads) {
      RotateRope(a.q + (i * a.num_heads + h) * qd + a.nope_dim, rd, cs, sn, a.rope_interleave);
    } else {
      float* k = row + lat;
      for (int32_t j = 0; j < rd; ++j) k[j] = a.k_rope[i * rd + j];
      RotateRope(k, rd, cs, sn, a.rope_interleave);
    }
  }
}

__global__ void __launch_bounds__(kMlaThreads) MlaAttendKernel(MlaArgs a, PlanView plan) {
  __shared__ float q_nope[kMlaMaxLatent];  // nope_dim <= latent checked by the caller's bounds
  __shared__ float q_rope[kMlaMaxRope];
  __shared__ float q_lat[kMlaMaxLatent];
  __shared__ float scores[kKeyChunk];
  const int64_t i = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t lat = a.latent_dim, rd = a.rope_dim, nope = a.nope_dim;
  const int64_t width = lat + rd;
  const float* qh = a.q + (i * a.num_heads + h) * (nope + rd);
  for (int32_t j = threadIdx.x; j < nope + rd; j += blockDim.x) {
    if (j < nope) q_nope[j] = qh[j];
    else q_rope[j - nope] = qh[j];
  }
  __syncthreads();
  const float* w_uk = a.kv_b + static_cast<int64_t>(h) * (nope + a.v_dim) * lat;  // [nope, lat]
  const float* w_uv = w_uk + static_cast<int64_t>(nope) * lat;                    // [v_dim, lat]
  for (int32_t r = threadIdx.x; r < lat; r += blockDim.x) {
    float sum = 0.0f;
    for (int32_t j = 0; j < nope; ++j) sum += q_nope[j] * w_uk[static_cast<int64_t>(j) * lat + r];
    q_lat[r] = sum;
  }
  __syncthreads();
  const int4 seq = plan.seqs[plan.token_seq[i]];
  const int32_t* blocks = plan.block_tables + seq.w;
  const int32_t pos = plan.positions[i];
  const int32_t bs = plan.block_size;
  auto key = [&](int32_t t) {
    const int64_t slot = static_cast<int64_t>(blocks[t / bs]) * bs + t % bs;
    return a.pool + slot * width;
  };
  float o[kLatentPerThread];
#pragma unroll
  for (int q = 0; q < kLatentPerThread; ++q) o[q] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int32_t base = 0; base <= pos; base += kKeyChunk) {
    const int32_t count = min(kKeyChunk, pos + 1 - base);
    for (int32_t k = warp; k < count; k += kMlaWarps) {
      const float* row = key(base + k);
      float dot = 0.0f, dot_rope = 0.0f;
      for (int32_t r = lane; r < lat; r += 32) dot += q_lat[r] * row[r];
      for (int32_t r = lane; r < rd; r += 32) dot_rope += q_rope[r] * row[lat + r];
      dot = WarpSum(dot);
      dot_rope = WarpSum(dot_rope);
      if (lane == 0) scores[k] = (dot + dot_rope) * a.scale;
    }
    __syncthreads();
    float chunk_max = -INFINITY;
    for (int32_t k = 0; k < count; ++k) chunk_max = fmaxf(chunk_max, scores[k]);
    const float m_new = fmaxf(m, chunk_max);
    const float corr = expf(m - m_new);  // 0 at the first chunk (m = -inf)
    l *= corr;
#pragma unroll
    for (int q = 0; q < kLatentPerThread; ++q) o[q] *= corr;
    for (int32_t k = 0; k < count; ++k) {
      const float p = expf(scores[k] - m_new);
      l += p;
      const float* row = key(base + k);
#pragma unroll
      for (int q = 0; q < kLatentPerThread; ++q) {
        const int32_t r = threadIdx.x + q * kMlaThreads;
        if (r < lat) o[q] += p * row[r];
      }
    }
    m = m_new;
    __syncthreads();  // scores are rewritten by the next chunk
  }
  const float inv = 1.0f / l;
#pragma unroll
  for (int q = 0; q < kLatentPerThread; ++q) {
    const int32_t r = threadIdx.x + q * kMlaThreads;
    if (r < lat) q_lat[r] = o[q] * inv;  // q_lat now holds o_lat
  }
  __syncthreads();
  float* out = a.out + (i * a.num_heads + h) * a.v_dim;
  for (int32_t v = warp; v < a.v_dim; v += kMlaWarps) {
    const float* w = w_uv + static_cast<int64_t>(v) * lat;
    float sum = 0.0f;
    for (int32_t r = lane; r < lat; r += 32) sum += w[r] * q_lat[r];
    sum = WarpSum(sum);
    if (lane == 0) out[v] = sum;
  }
}

// ---- The tensor-core path (bf16 mode; LaunchMlaAttentionFlash) ----
//
// Three stages per chunk of the step's tokens, each row's arithmetic independent of the other rows
// (so the results are batch-invariant and the same for a row in a prefill, a decode step or a
// verification step):
//   1. q_lat = q_nope W_uk per head (MlaHeadGemmKernel: bf16 operands rounded RN from the f32
//      inputs, f32 accumulation over k in chunks of 32, in order), stored as bf16;
//   2. MlaFlashKernel: a block owns 16 * MT consecutive (token, head) rows of one sequence and
//      streams that sequence's latent rows [c | k_rope] once for all of them, in tiles of 32 keys
//      at absolute positions, rounded RN to bf16 in shared memory. Four warps share each 16-row
//      m-tile: warp w computes the scores of keys [8w, 8w + 8) of the tile (m16n8k16 over the
//      padded width), the tile's row maxima and weight sums meet in shared memory (the sums added
//      in warp order), the bf16 weights go through shared memory, and warp w accumulates the
//      16-column pairs p = w (mod 4) of o_lat = sum p_t c_t. Online softmax in base 2 with pinned
//      rounding (a fully masked tile is an exact no-op for a row); o_lat / l stored as bf16;
//   3. out = o_lat W_uv^T per head (MlaHeadGemmKernel again), f32.
// Key splits (MlaSplits::keys > 0): the state restarts every `keys` keys; a block owns one split
// of its rows, and a row whose keys span several splits is finished by MlaSplitFoldKernel, which
// folds the splits' states in order. Whether a row is split depends on its position alone, so
// the results stay independent of the step; the splits give a long context's decode rows many
// blocks.
// The 16 * MT rows of a block are computed the same whatever MT is (1, 2 or 4: the most rows per
// block that still leaves two blocks per SM to schedule; steps of few rows get more blocks).
constexpr int kFlashKeys = 32;    // keys per tile
constexpr int kFlashWarpsPerMt = 4;
constexpr int kFlashMaxPairs = 8;  // 16-column pairs of o_lat per warp: latent_dim <= 512
constexpr int kFlashMaxWidth = 640;  // latent + rope, padded to 16
constexpr int kFlashLdP = kFlashKeys + 8;
constexpr int kGemmTile = 64, kGemmK = 32, kGemmLd = kGemmK + 8;

__host__ __device__ constexpr int RoundUp16(int x) { return (x + 15) / 16 * 16; }

// A fragment's two row values (rows lane / 4 and lane / 4 + 8 of the m-tile) reduced over the
// row's 4 lanes with op (xor 1, then xor 2: every lane ends with the same bits) and stored at
// rows[lane / 4], rows[lane / 4 + 8].
struct MaxOp {
  __device__ float operator()(float x, float y) const { return fmaxf(x, y); }
};
struct AddRnOp {
  __device__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
};
template <typename Op>
__device__ __forceinline__ void QuadReduceStore(float a, float b, Op op, float* rows, int lane) {
#pragma unroll
  for (int step = 1; step <= 2; step *= 2) {
    a = op(a, __shfl_xor_sync(0xffffffffu, a, step));
    b = op(b, __shfl_xor_sync(0xffffffffu, b, step));
  }
  if (lane % 4 == 0) {
    rows[lane / 4] = a;
    rows[lane / 4 + 8] = b;
  }
}
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void StoreAs(float* p, float x) { *p = x; }
__device__ __forceinline__ void StoreAs(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// C[h](m, n) = sum_k A[h](m, k) B[h](k, n) for m < rows, n < cols, k < depth; grid (col tiles,
// row tiles, heads), 4 warps of 16 rows x 64 columns. A(m, k) = a[m * a_row + h * a_head + k];
// B(k, n) = b[h * b_head + k * b_ld + n] (kBKRows) or b[h * b_head + n * b_ld + k];
// C(m, n) = c[m * c_row + h * c_head + n].
template <typename TA, typename TC, bool kBKRows>
__global__ void __launch_bounds__(128) MlaHeadGemmKernel(const TA* a, int64_t a_row,
                                                         int64_t a_head, const float* b,
                                                         int64_t b_head, int64_t b_ld, TC* c,
                                                         int64_t c_row, int64_t c_head,
                                                         int32_t rows, int32_t cols,
                                                         int32_t depth) {
  __shared__ __align__(16) __nv_bfloat16 as[kGemmTile * kGemmLd];
  __shared__ __align__(16) __nv_bfloat16 bs[kGemmTile * kGemmLd];  // [n][k]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int32_t h = blockIdx.z;
  const int32_t m0 = blockIdx.y * kGemmTile, n0 = blockIdx.x * kGemmTile;
  const TA* ah = a + h * a_head;
  const float* bh = b + h * b_head;
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int32_t k0 = 0; k0 < depth; k0 += kGemmK) {
    for (int e = tid; e < kGemmTile * kGemmK; e += blockDim.x) {
      const int r = e / kGemmK, kk = e % kGemmK;
      const int32_t m = m0 + r, k = k0 + kk;
      const float v = m < rows && k < depth ? ToFloat(ah[m * a_row + k]) : 0.f;
      as[r * kGemmLd + kk] = __float2bfloat16_rn(v);
    }
    for (int e = tid; e < kGemmTile * kGemmK; e += blockDim.x) {
      int n, kk;
      if constexpr (kBKRows) {
        kk = e / kGemmTile;
        n = e % kGemmTile;
      } else {
        n = e / kGemmK;
        kk = e % kGemmK;
      }
      const int32_t col = n0 + n, k = k0 + kk;
      float v = 0.f;
      if (col < cols && k < depth) v = kBKRows ? bh[k * b_ld + col] : bh[col * b_ld + k];
      bs[n * kGemmLd + kk] = __float2bfloat16_rn(v);
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kGemmK; ks += 16) {
      uint32_t af[4];
      LoadAFragment(af, as, warp * 16, kGemmLd, ks, lane);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        uint32_t b0[2], b1[2];
        LoadBFragmentsBf16(b0, b1, bs, p * 16, kGemmLd, ks, lane);
        Mma(acc[2 * p], af, b0[0], b0[1]);
        Mma(acc[2 * p + 1], af, b1[0], b1[1]);
      }
    }
    __syncthreads();
  }
  TC* ch = c + h * c_head;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t m = m0 + warp * 16 + lane / 4 + (e / 2) * 8;
      const int32_t n = n0 + j * 8 + 2 * (lane % 4) + e % 2;
      if (m < rows && n < cols) StoreAs(ch + m * c_row + n, acc[j][e]);
    }
  }
}

// Shared memory of MlaFlashKernel<MT> at padded width kw: the key tile and Q [rows][kw + 8] bf16,
// the weights [MT][16][kFlashLdP] bf16, the partial maxima and sums [MT][4][16] f32, the rows'
// positions and output rows [16 MT] int32 and the tile's pool slots [kFlashKeys] int32.
__host__ __device__ constexpr size_t MlaFlashSmemBytes(int mt, int kw) {
  return size_t{2} * (kFlashKeys + 16 * mt) * (kw + 8) + size_t{2} * mt * 16 * kFlashLdP +
         size_t{4} * 2 * mt * kFlashWarpsPerMt * 16 + size_t{4} * 2 * 16 * mt +
         size_t{4} * kFlashKeys;
}

// q_lat / o_lat: [rows of the chunk's tokens, heads, latent] bf16, token i at row
// (i - tok_begin) * heads + head; rows of tokens outside [tok_begin, tok_end) are skipped.
template <int MT>
__global__ void __launch_bounds__(MT* kFlashWarpsPerMt * 32)
    MlaFlashKernel(MlaArgs a, PlanView plan, const __nv_bfloat16* q_lat, __nv_bfloat16* o_lat,
                   int32_t tok_begin, int32_t tok_end, MlaSplits splits) {
  constexpr int kRows = 16 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  const int32_t lat = a.latent_dim, rd = a.rope_dim, width = lat + rd, heads = a.num_heads;
  const int kw = RoundUp16(width), ld = kw + 8;
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* qs = ks + kFlashKeys * ld;
  __nv_bfloat16* ps = qs + kRows * ld;
  float* red_max = reinterpret_cast<float*>(ps + MT * 16 * kFlashLdP);
  float* red_sum = red_max + MT * kFlashWarpsPerMt * 16;
  int32_t* row_pos = reinterpret_cast<int32_t*>(red_sum + MT * kFlashWarpsPerMt * 16);
  int32_t* row_out = row_pos + kRows;
  int32_t* key_slot = row_out + kRows;  // the tile's pool slots (-1: past the block's keys)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int4 seq = plan.seqs[blockIdx.y];
  const int64_t seq_rows = int64_t{seq.y} * heads;
  const int32_t num_splits = splits.keys > 0 ? splits.count : 1;
  const int32_t split = static_cast<int32_t>(blockIdx.x % num_splits);
  const int64_t r0 = int64_t{blockIdx.x / num_splits} * kRows;
  if (r0 >= seq_rows) return;  // (uniform)
  for (int r = tid; r < kRows; r += blockDim.x) {
    int32_t pos = -1, out_row = -1;
    if (r0 + r < seq_rows) {
      const int32_t i = seq.x + static_cast<int32_t>((r0 + r) / heads);
      if (i >= tok_begin && i < tok_end) {
        pos = plan.positions[i];
        out_row = (i - tok_begin) * heads + static_cast<int32_t>((r0 + r) % heads);
      }
    }
    row_pos[r] = pos;
    row_out[r] = out_row;
  }
  __syncthreads();
  int32_t max_pos = -1;
  for (int r = 0; r < kRows; ++r) max_pos = max(max_pos, row_pos[r]);
  // This block's keys: its split's, or all of them.
  const int32_t key_begin = splits.keys > 0 ? split * splits.keys : 0;
  const int32_t key_end = splits.keys > 0 ? min(key_begin + splits.keys, max_pos + 1) : max_pos + 1;
  if (key_begin >= key_end) return;  // (uniform: no row of this chunk sees a key of the split)
  // Q: [q_lat | rotated q_rope | 0], invalid rows 0.
  const int64_t qd = a.nope_dim + rd;
  for (int e = tid; e < kRows * kw; e += blockDim.x) {
    const int r = e / kw, col = e % kw;
    const int32_t out_row = row_out[r];
    float v = 0.f;
    if (out_row >= 0 && col < width) {
      if (col < lat) {
        v = __bfloat162float(q_lat[int64_t{out_row} * lat + col]);
      } else {
        const int64_t row = int64_t{tok_begin} * heads + out_row;  // (token, head) of the step
        v = a.q[row * qd + a.nope_dim + (col - lat)];
      }
    }
    qs[r * ld + col] = __float2bfloat16_rn(v);
  }

  const int g = warp / kFlashWarpsPerMt, qw = warp % kFlashWarpsPerMt;
  const int row_a = g * 16 + lane / 4, row_b = row_a + 8;
  const int32_t pos_a = row_pos[row_a], pos_b = row_pos[row_b];
  const float c = __fmul_rn(a.scale, kLog2e);
  const int pairs = RoundUp16(lat) / 16, ksteps = kw / 16;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  float o[kFlashMaxPairs][2][4];
#pragma unroll
  for (int j = 0; j < kFlashMaxPairs; ++j)
#pragma unroll
    for (int n = 0; n < 2; ++n) o[j][n][0] = o[j][n][1] = o[j][n][2] = o[j][n][3] = 0.f;
  const int32_t* blocks = plan.block_tables + seq.w;
  const int32_t bs = plan.block_size;
  const int vecs = kw / 4;
  __nv_bfloat16* pw = ps + g * 16 * kFlashLdP;
  for (int32_t k0 = key_begin; k0 < key_end; k0 += kFlashKeys) {
    __syncthreads();  // the previous tile's readers are done (and Q is staged)
    if (tid < kFlashKeys) {
      const int32_t key = k0 + tid;
      key_slot[tid] = key < key_end ? blocks[key / bs] * bs + key % bs : -1;
    }
    __syncthreads();
    // The tile's rows as float4s, kBatch loads in flight per thread before any is used.
    constexpr int kBatch = MT == 1 ? 8 : 4;
    const int total = kFlashKeys * vecs;
    for (int e0 = tid; e0 < total; e0 += kBatch * static_cast<int>(blockDim.x)) {
      float4 v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int e = e0 + u * static_cast<int>(blockDim.x);
        v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (e < total) {
          const int kr = e / vecs, cv = (e % vecs) * 4;
          const int32_t slot = key_slot[kr];
          if (slot >= 0 && cv < width)
            v[u] = *reinterpret_cast<const float4*>(a.pool + int64_t{slot} * width + cv);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int e = e0 + u * static_cast<int>(blockDim.x);
        if (e < total) {
          const int kr = e / vecs, cv = (e % vecs) * 4;
          *reinterpret_cast<uint2*>(ks + kr * ld + cv) =
              make_uint2(PackBf16(v[u].x, v[u].y), PackBf16(v[u].z, v[u].w));
        }
      }
    }
    __syncthreads();
    // Scores of this warp's 8 keys for the m-tile's 16 rows.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    const __nv_bfloat16* kq = ks + (qw * 8) * ld;
    int kstep = 0;
    for (; kstep + 2 <= ksteps; kstep += 2) {
      uint32_t b[4], af[4];
      LdMatrixX4(b, kq + (lane % 8) * ld + kstep * 16 + (lane / 8) * 8);
      LoadAFragment(af, qs, g * 16, ld, kstep * 16, lane);
      Mma(s, af, b[0], b[1]);
      LoadAFragment(af, qs, g * 16, ld, kstep * 16 + 16, lane);
      Mma(s, af, b[2], b[3]);
    }
    if (kstep < ksteps) {
      uint32_t b[2], af[4];
      LdMatrixX2(b, kq + (lane % 8) * ld + kstep * 16 + ((lane / 8) % 2) * 8);
      LoadAFragment(af, qs, g * 16, ld, kstep * 16, lane);
      Mma(s, af, b[0], b[1]);
    }
    const int32_t key0 = k0 + qw * 8 + 2 * (lane % 4);
    const float u0 = key0 <= pos_a ? s[0] : -INFINITY, u1 = key0 + 1 <= pos_a ? s[1] : -INFINITY;
    const float u2 = key0 <= pos_b ? s[2] : -INFINITY, u3 = key0 + 1 <= pos_b ? s[3] : -INFINITY;
    QuadReduceStore(fmaxf(u0, u1), fmaxf(u2, u3), MaxOp{},
                    red_max + (g * kFlashWarpsPerMt + qw) * 16, lane);
    __syncthreads();
    float tm_a = -INFINITY, tm_b = -INFINITY;
#pragma unroll
    for (int w = 0; w < kFlashWarpsPerMt; ++w) {
      tm_a = fmaxf(tm_a, red_max[(g * kFlashWarpsPerMt + w) * 16 + lane / 4]);
      tm_b = fmaxf(tm_b, red_max[(g * kFlashWarpsPerMt + w) * 16 + lane / 4 + 8]);
    }
    const float mn_a = fmaxf(m_a, tm_a), mn_b = fmaxf(m_b, tm_b);
    const float corr_a = Rescale(m_a, mn_a, c), corr_b = Rescale(m_b, mn_b, c);
    const float ms_a = MaxTimesScale(mn_a, c), ms_b = MaxTimesScale(mn_b, c);
    const __nv_bfloat162 pa = __floats2bfloat162_rn(Exp2(__fsub_rn(__fmul_rn(u0, c), ms_a)),
                                                    Exp2(__fsub_rn(__fmul_rn(u1, c), ms_a)));
    const __nv_bfloat162 pb = __floats2bfloat162_rn(Exp2(__fsub_rn(__fmul_rn(u2, c), ms_b)),
                                                    Exp2(__fsub_rn(__fmul_rn(u3, c), ms_b)));
    QuadReduceStore(__fadd_rn(__low2float(pa), __high2float(pa)),
                    __fadd_rn(__low2float(pb), __high2float(pb)), AddRnOp{},
                    red_sum + (g * kFlashWarpsPerMt + qw) * 16, lane);
    const int pc = qw * 8 + 2 * (lane % 4);
    *reinterpret_cast<__nv_bfloat162*>(pw + (lane / 4) * kFlashLdP + pc) = pa;
    *reinterpret_cast<__nv_bfloat162*>(pw + (lane / 4 + 8) * kFlashLdP + pc) = pb;
    __syncthreads();
    float ts_a = red_sum[(g * kFlashWarpsPerMt) * 16 + lane / 4];
    float ts_b = red_sum[(g * kFlashWarpsPerMt) * 16 + lane / 4 + 8];
#pragma unroll
    for (int w = 1; w < kFlashWarpsPerMt; ++w) {
      ts_a = __fadd_rn(ts_a, red_sum[(g * kFlashWarpsPerMt + w) * 16 + lane / 4]);
      ts_b = __fadd_rn(ts_b, red_sum[(g * kFlashWarpsPerMt + w) * 16 + lane / 4 + 8]);
    }
    l_a = __fadd_rn(__fmul_rn(l_a, corr_a), ts_a);
    l_b = __fadd_rn(__fmul_rn(l_b, corr_b), ts_b);
    m_a = mn_a;
    m_b = mn_b;
#pragma unroll
    for (int j = 0; j < kFlashMaxPairs; ++j)
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        o[j][n][0] = __fmul_rn(o[j][n][0], corr_a);
        o[j][n][1] = __fmul_rn(o[j][n][1], corr_a);
        o[j][n][2] = __fmul_rn(o[j][n][2], corr_b);
        o[j][n][3] = __fmul_rn(o[j][n][3], corr_b);
      }
#pragma unroll
    for (int kk = 0; kk < kFlashKeys; kk += 16) {
      uint32_t af[4];
      LoadAFragment(af, pw, 0, kFlashLdP, kk, lane);
#pragma unroll
      for (int j = 0; j < kFlashMaxPairs; ++j) {
        const int pair = qw + kFlashWarpsPerMt * j;
        if (pair < pairs) {
          uint32_t b[4];
          LdMatrixX4Trans(b, ks + (kk + lane % 16) * ld + pair * 16 + (lane / 16) * 8);
          Mma(o[j][0], af, b[0], b[1]);
          Mma(o[j][1], af, b[2], b[3]);
        }
      }
    }
  }
  int32_t out_a = row_out[row_a], out_b = row_out[row_b];
  // f(first, col, value) for each o_lat value this lane holds (columns < lat): first says
  // whether it belongs to row a (else row b).
  auto each_value = [&](auto f) {
#pragma unroll
    for (int j = 0; j < kFlashMaxPairs; ++j) {
      const int pair = qw + kFlashWarpsPerMt * j;
      if (pair >= pairs) continue;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int32_t col = pair * 16 + n * 8 + 2 * (lane % 4) + e % 2;
          if (col < lat) f(e < 2, col, o[j][n][e]);
        }
      }
    }
  };
  if (splits.keys > 0) {
    // A row whose keys span several splits leaves this split's state (m, l, unnormalised o) in
    // splits.partials for MlaSplitFoldKernel (a split past the row's keys leaves nothing); a row
    // within the first split is finished here, by the first split's block.
    auto partial = [&](int32_t out_row, int32_t pos, float m, float l) -> float* {
      if (out_row < 0 || pos < splits.keys || split > pos / splits.keys) return nullptr;
      float* rec = splits.partials + (int64_t{out_row} * splits.count + split) * (lat + 2);
      if (qw == 0 && lane % 4 == 0) {
        rec[0] = m;
        rec[1] = l;
      }
      return rec + 2;
    };
    float* rec_a = partial(out_a, pos_a, m_a, l_a);
    float* rec_b = partial(out_b, pos_b, m_b, l_b);
    each_value([&](bool first, int32_t col, float v) {
      float* rec = first ? rec_a : rec_b;
      if (rec != nullptr) rec[col] = v;
    });
    if (rec_a != nullptr || split != 0 || pos_a >= splits.keys) out_a = -1;
    if (rec_b != nullptr || split != 0 || pos_b >= splits.keys) out_b = -1;
  }
  const float inv_a = __frcp_rn(l_a), inv_b = __frcp_rn(l_b);
  each_value([&](bool first, int32_t col, float v) {
    const int32_t out_row = first ? out_a : out_b;
    if (out_row >= 0)
      o_lat[int64_t{out_row} * lat + col] =
          __float2bfloat16_rn(__fmul_rn(v, first ? inv_a : inv_b));
  });
}

// Rows whose keys span several splits: their splits' states folded in split order (pinned
// rounding), o_lat = O / L as bf16. A block per row of the chunk.
__global__ void MlaSplitFoldKernel(MlaArgs a, PlanView plan, __nv_bfloat16* o_lat,
                                   int32_t tok_begin, MlaSplits splits) {
  const int32_t out_row = blockIdx.x, lat = a.latent_dim;
  const int32_t pos = plan.positions[tok_begin + out_row / a.num_heads];
  if (pos < splits.keys) return;  // finished by its only split's block
  const float c = __fmul_rn(a.scale, kLog2e);
  const float* rec0 = splits.partials + int64_t{out_row} * splits.count * (lat + 2);
  const int32_t last = pos / splits.keys;
  for (int32_t d = threadIdx.x; d < lat; d += blockDim.x) {
    float M = -INFINITY, L = 0.f, O = 0.f;
    for (int32_t s = 0; s <= last; ++s) {
      const float* rec = rec0 + int64_t{s} * (lat + 2);
      float wa, wb;
      FoldScalars(M, L, rec[0], rec[1], c, wa, wb);
      O = FoldValue(O, rec[2 + d], wa, wb);
    }
    o_lat[int64_t{out_row} * lat + d] = __float2bfloat16_rn(__fmul_rn(O, __frcp_rn(L)));
  }
}

template <int MT>
void LaunchFlash(const MlaArgs& a, const PlanView& plan, int32_t max_query_len,
                 const __nv_bfloat16* q_lat, __nv_bfloat16* o_lat, int32_t tok_begin,
                 int32_t tok_end, const MlaSplits& splits, cudaStream_t stream) {
  const int kw = RoundUp16(a.latent_dim + a.rope_dim);
  const size_t smem = MlaFlashSmemBytes(MT, kw);
  static std::once_flag attr_once;
  std::call_once(attr_once, [] {
    CUDA_CHECK(cudaFuncSetAttribute(MlaFlashKernel<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(MlaFlashSmemBytes(MT, kFlashMaxWidth))));
  });
  const int64_t rows = int64_t{max_query_len} * a.num_heads;
  const int64_t num_splits = splits.keys > 0 ? splits.count : 1;
  const dim3 grid(static_cast<unsigned>((rows + 16 * MT - 1) / (16 * MT) * num_splits),
                  static_cast<unsigned>(plan.num_seqs));
  MlaFlashKernel<MT><<<grid, MT * kFlashWarpsPerMt * 32, smem, stream>>>(
      a, plan, q_lat, o_lat, tok_begin, tok_end, splits);
  CUDA_CHECK_LAUNCH();
  if (splits.keys > 0 && splits.count > 1) {
    MlaSplitFoldKernel<<<static_cast<unsigned>((tok_end - tok_begin) * a.num_heads), 128, 0,
                         stream>>>(a, plan, o_lat, tok_begin, splits);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void LaunchMlaAttention(const MlaArgs& args, const PlanView& plan, cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  MlaRopeWriteKernel<<<static_cast<unsigned>(plan.num_tokens), 128, 0, stream>>>(args, plan);
  CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>(plan.num_tokens), static_cast<unsigned>(args.num_heads));
  MlaAttendKernel<<<grid, kMlaThreads, 0, stream>>>(args, plan);
  CUDA_CHECK_LAUNCH();
}

bool MlaFlashSupported(const MlaArgs& a) {
  const int32_t width = a.latent_dim + a.rope_dim;
  return width % 4 == 0 && RoundUp16(width) <= kFlashMaxWidth &&
         RoundUp16(a.latent_dim) <= 16 * kFlashWarpsPerMt * kFlashMaxPairs && a.nope_dim > 0 &&
         a.v_dim > 0;
}

int32_t MlaFlashChunkTokens(const MlaArgs& a, int32_t num_tokens, int32_t num_splits) {
  // q_lat's bytes per token, and the split partials' (f32 records of latent + 2 per split)
  const int64_t row_bytes = int64_t{a.num_heads} * a.latent_dim * 2;
  const int64_t split_bytes =
      num_splits > 1 ? int64_t{a.num_heads} * num_splits * (a.latent_dim + 2) * 4 : 0;
  const int64_t chunk = std::max<int64_t>(
      1, std::min(kMlaFlashChunkBytes / row_bytes,
                  split_bytes > 0 ? kMlaSplitPartialsBytes / split_bytes : INT64_MAX));
  return static_cast<int32_t>(std::min<int64_t>(chunk, std::max(num_tokens, 1)));
}

void LaunchMlaAttentionFlash(const MlaArgs& a, const PlanView& plan, int32_t max_query_len,
                             void* q_lat_bytes, void* o_lat_bytes, const MlaSplits& splits,
                             int32_t chunk_tokens, int32_t num_sms, int32_t m_tiles,
                             cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  auto* q_lat = static_cast<__nv_bfloat16*>(q_lat_bytes);
  auto* o_lat = static_cast<__nv_bfloat16*>(o_lat_bytes);
  MlaRopeWriteKernel<<<static_cast<unsigned>(plan.num_tokens), 128, 0, stream>>>(a, plan);
  CUDA_CHECK_LAUNCH();
  const int64_t heads = a.num_heads, lat = a.latent_dim, qd = a.nope_dim + a.rope_dim;
  const int64_t head_rows = int64_t{a.nope_dim + a.v_dim} * lat;  // kv_b's floats per head
  auto tiles = [](int64_t x) { return static_cast<unsigned>((x + kGemmTile - 1) / kGemmTile); };
  for (int32_t t0 = 0; t0 < plan.num_tokens; t0 += chunk_tokens) {
    const int32_t t1 = std::min(plan.num_tokens, t0 + chunk_tokens), n = t1 - t0;
    // q_lat[i, h, :] = q_nope[i, h, :] W_uk[h]   (W_uk[h]: kv_b's rows of head h, [nope, lat])
    MlaHeadGemmKernel<float, __nv_bfloat16, true>
        <<<dim3(tiles(lat), tiles(n), static_cast<unsigned>(heads)), 128, 0, stream>>>(
            a.q + t0 * heads * qd, heads * qd, qd, a.kv_b, head_rows, lat, q_lat, heads * lat,
            lat, n, a.latent_dim, a.nope_dim);
    CUDA_CHECK_LAUNCH();
    // The most rows per block that still gives every SM two blocks (or m_tiles when set).
    const int64_t rows = int64_t{n} * heads;
    int mt = rows / 64 >= 2 * int64_t{num_sms} ? 4 : rows / 32 >= 2 * int64_t{num_sms} ? 2 : 1;
    if (m_tiles == 1 || m_tiles == 2 || m_tiles == 4) mt = m_tiles;
    if (mt == 4) {
      LaunchFlash<4>(a, plan, max_query_len, q_lat, o_lat, t0, t1, splits, stream);
    } else if (mt == 2) {
      LaunchFlash<2>(a, plan, max_query_len, q_lat, o_lat, t0, t1, splits, stream);
    } else {
      LaunchFlash<1>(a, plan, max_query_len, q_lat, o_lat, t0, t1, splits, stream);
    }
    // out[i, h, :] = W_uv[h] o_lat[i, h, :]   (W_uv[h]: the next v_dim rows, [v, lat])
    MlaHeadGemmKernel<__nv_bfloat16, float, false>
        <<<dim3(tiles(a.v_dim), tiles(n), static_cast<unsigned>(heads)), 128, 0, stream>>>(
            o_lat, heads * lat, lat, a.kv_b + int64_t{a.nope_dim} * lat, head_rows, lat,
            a.out + t0 * heads * a.v_dim, heads * a.v_dim, a.v_dim, n, a.v_dim, a.latent_dim);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace ember::cuda
