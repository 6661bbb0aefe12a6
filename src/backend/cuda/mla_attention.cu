// Multi-head latent attention (Backend::MlaAttention, deepseek_v3) over the latent pool, as two
// straightforward launches: (1) per row, rotate q's rope dims and k_rope and write [c | k_rope]
// at the row's slot; (2) a block per (row, head) with the up-projection absorbed, as
// backend/cpu/mla_attention.h: q_lat = W_uk^T q_nope, scores scale * (q_lat . c_t + q_rope .
// k_rope_t) with an online softmax over chunks of keys, o_lat = sum p_t c_t, out = W_uv o_lat.
// f32 throughout. Tuned kernels (keys shared by a sequence's rows and heads in shared memory,
// tensor cores for the absorbed products) are left: docs/architecture.md.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
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

}  // namespace

void LaunchMlaAttention(const MlaArgs& args, const PlanView& plan, cudaStream_t stream) {
  if (plan.num_tokens == 0) return;
  MlaRopeWriteKernel<<<static_cast<unsigned>(plan.num_tokens), 128, 0, stream>>>(args, plan);
  CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>(plan.num_tokens), static_cast<unsigned>(args.num_heads));
  MlaAttendKernel<<<grid, kMlaThreads, 0, stream>>>(args, plan);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
