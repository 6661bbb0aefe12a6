// The recurrent ops of qwen3_next's gated DeltaNet layers (Backend::CausalConv1dSilu,
// Backend::GatedDeltaRule) and SigmoidGateMul, as straightforward kernels: each walks a
// sequence's rows in order (a recurrence), with the state read from and written back to its
// state slot. Where a step need not be batch-invariant, a long sequence's delta rule takes the
// chunked form instead (GatedDeltaChunkedKernel: kDeltaChunk rows at a time by matrix products,
// the CPU's GatedDeltaRuleChunked in f32 SIMT arithmetic). Sequences that share a slot (padding
// rows) are walked in plan order by one block (serial_seqs); otherwise each block column takes
// one sequence. A
// sequence with a snapshot slot also stores the state after each row but its last there (the
// values the row leaves in registers: the same the state slot ends with after that row).
#include <algorithm>
#include <cmath>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

__device__ __forceinline__ float SiluF(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
__device__ __forceinline__ float SoftplusF(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The sequences block column blockIdx.z takes: all of them in plan order (serial), or its own.
__device__ __forceinline__ void SeqRange(int32_t num_seqs, bool serial, int32_t* first,
                                         int32_t* end) {
  *first = serial ? 0 : static_cast<int32_t>(blockIdx.z);
  *end = serial ? num_seqs : *first + 1;
}

// A thread per channel: the K - 1 previous inputs in registers, the rows in order.
__global__ void CausalConv1dSiluKernel(float* __restrict__ x, int64_t channels,
                                       const float* __restrict__ weight, int32_t kernel,
                                       float* __restrict__ state, int64_t slot_floats,
                                       int64_t state_offset, PlanView plan, bool serial) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  const int32_t hist = kernel - 1;
  float w[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) w[j] = j < kernel ? weight[c * kernel + j] : 0.0f;
  int32_t first, end;
  SeqRange(plan.num_seqs, serial, &first, &end);
  for (int32_t s = first; s < end; ++s) {
    const int4 seq = plan.seqs[s];  // {query_start, query_len, context_len, table start}
    float* window = state + plan.state_slots[s] * slot_floats + state_offset;
    const int64_t snapshot = plan.snapshot_slots[s];
    const bool fresh = seq.z == seq.y;
    float in[kMaxConvKernel];  // in[0 .. hist): the window, oldest first
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j)
      in[j] = j < hist && !fresh ? window[j * channels + c] : 0.0f;
    for (int32_t t = 0; t < seq.y; ++t) {
      float* px = x + (static_cast<int64_t>(seq.x) + t) * channels + c;
      const float cur = *px;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxConvKernel; ++j) {
        if (j < hist) acc += w[j] * in[j];
        else if (j == hist) acc += w[j] * cur;
      }
#pragma unroll
      for (int j = 0; j < kMaxConvKernel - 2; ++j)
        if (j + 1 < hist) in[j] = in[j + 1];
#pragma unroll
      for (int j = 0; j < kMaxConvKernel - 1; ++j)
        if (j == hist - 1) in[j] = cur;
      *px = SiluF(acc);
      if (snapshot >= 0 && t + 1 < seq.y) {
        float* snap = state + (snapshot + t) * slot_floats + state_offset;
#pragma unroll
        for (int j = 0; j < kMaxConvKernel - 1; ++j)
          if (j < hist) snap[j * channels + c] = in[j];
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j)
      if (j < hist) window[j * channels + c] = in[j];
  }
}

constexpr int kDeltaWarps = 8;     // a block: 32 state columns x 8 warps of rows
constexpr int kDeltaMaxRows = kMaxDeltaKeyDim / kDeltaWarps;  // rows of S per thread

// A value head's constants for the delta-rule kernels (block x: the value head).
struct DeltaHead {
  int32_t head, dk, dv, kh;               // the value head, the head dims, its key head
  int64_t key_width, stride, out_stride;  // q's (and k's) width, a qkv row's, an out row's
  int64_t state_offset;                   // the head's [dk, dv] within a slot
  float scale, decay_rate, dt_bias;       // 1 / sqrt(dk), -exp(a_log), dt_bias
  __device__ DeltaHead(const GatedDeltaArgs& a, int32_t h)
      : head(h),
        dk(a.k_dim),
        dv(a.v_dim),
        kh(h / (a.num_v_heads / a.num_k_heads)),
        key_width(static_cast<int64_t>(a.num_k_heads) * a.k_dim),
        stride(2 * key_width + static_cast<int64_t>(a.num_v_heads) * a.v_dim),
        out_stride(static_cast<int64_t>(a.num_v_heads) * a.v_dim),
        state_offset(a.state_offset + static_cast<int64_t>(h) * a.k_dim * a.v_dim),
        scale(rsqrtf(static_cast<float>(a.k_dim))),
        decay_rate(-expf(a.a_log[h])),
        dt_bias(a.dt_bias[h]) {}
  // The head's [dk, dv] state in slot `slot`.
  __device__ float* State(const GatedDeltaArgs& a, int64_t slot) const {
    return a.state + slot * a.slot_floats + state_offset;
  }
};

// Whether the chunked kernel takes sequence (rows, snapshot) rather than the row-by-row one.
__device__ __forceinline__ bool ChunkedSeq(const GatedDeltaArgs& a, int32_t rows,
                                           int32_t snapshot) {
  return a.chunked_min_rows > 0 && rows >= a.chunked_min_rows && snapshot < 0;
}

// Block (value head, 32-column chunk, sequence): lane j owns column j of the chunk, warp w the
// rows [w * rows, (w + 1) * rows) of S, in registers; per row t the block normalises q and k,
// reduces S^T k and S^T q across the warps through shared memory, and writes out.
__global__ void __launch_bounds__(kDeltaWarps * 32)
    GatedDeltaRuleKernel(GatedDeltaArgs a, PlanView plan, bool serial) {
  __shared__ float qk[2 * kMaxDeltaKeyDim];
  __shared__ float norms[2];
  __shared__ float part[2][kDeltaWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const DeltaHead h(a, blockIdx.x);
  const int32_t head = h.head, dk = h.dk, dv = h.dv, kh = h.kh;
  const int32_t col = blockIdx.y * 32 + lane;
  const bool has_col = col < dv;
  const int32_t rows = (dk + kDeltaWarps - 1) / kDeltaWarps;
  const int32_t row0 = warp * rows;
  int32_t first, end;
  SeqRange(plan.num_seqs, serial, &first, &end);
  for (int32_t s_i = first; s_i < end; ++s_i) {
    const int4 seq = plan.seqs[s_i];
    float* state = h.State(a, plan.state_slots[s_i]);
    const int64_t snapshot = plan.snapshot_slots[s_i];
    if (ChunkedSeq(a, seq.y, static_cast<int32_t>(snapshot))) continue;  // (never serial)
    const bool fresh = seq.z == seq.y;
    float s[kDeltaMaxRows];
#pragma unroll
    for (int r = 0; r < kDeltaMaxRows; ++r) {
      const int32_t i = row0 + r;
      s[r] = r < rows && i < dk && has_col && !fresh ? state[static_cast<int64_t>(i) * dv + col]
                                                     : 0.0f;
    }
    for (int32_t t = 0; t < seq.y; ++t) {
      const int64_t row = static_cast<int64_t>(seq.x) + t;
      const float* x = a.qkv + row * h.stride;
      for (int32_t i = threadIdx.x; i < 2 * dk; i += blockDim.x)
        qk[i] = i < dk ? x[static_cast<int64_t>(kh) * dk + i]
                       : x[h.key_width + static_cast<int64_t>(kh) * dk + (i - dk)];
      __syncthreads();
      if (warp < 2) {
        float sum = 0.0f;
        for (int32_t i = lane; i < dk; i += 32) sum += qk[warp * dk + i] * qk[warp * dk + i];
        sum = WarpSum(sum);
        if (lane == 0) norms[warp] = sum;
      }
      __syncthreads();
      const float q_inv = h.scale / sqrtf(norms[0] + 1e-6f);
      const float k_inv = 1.0f / sqrtf(norms[1] + 1e-6f);
      const float* ba = a.ba + row * 2 * a.num_v_heads;
      const float beta = SigmoidF(ba[head]);
      const float decay = expf(h.decay_rate * SoftplusF(ba[a.num_v_heads + head] + h.dt_bias));
      float acc = 0.0f;  // this warp's rows of (S exp(g))^T k
#pragma unroll
      for (int r = 0; r < kDeltaMaxRows; ++r) {
        const int32_t i = row0 + r;
        if (r < rows && i < dk) {
          s[r] *= decay;
          acc += s[r] * (qk[dk + i] * k_inv);
        }
      }
      part[0][warp][lane] = acc;
      __syncthreads();
      float sk = 0.0f;
#pragma unroll
      for (int w = 0; w < kDeltaWarps; ++w) sk += part[0][w][lane];
      const float v = has_col ? x[2 * h.key_width + static_cast<int64_t>(head) * dv + col] : 0.0f;
      const float delta = (v - sk) * beta;
      float o = 0.0f;
#pragma unroll
      for (int r = 0; r < kDeltaMaxRows; ++r) {
        const int32_t i = row0 + r;
        if (r < rows && i < dk) {
          s[r] += (qk[dk + i] * k_inv) * delta;
          o += s[r] * (qk[i] * q_inv);
        }
      }
      part[1][warp][lane] = o;
      __syncthreads();  // also: every warp is done with qk before the next row loads it
      if (warp == 0 && has_col) {
        float out = 0.0f;
#pragma unroll
        for (int w = 0; w < kDeltaWarps; ++w) out += part[1][w][lane];
        a.out[row * h.out_stride + static_cast<int64_t>(head) * dv + col] = out;
      }
      if (snapshot >= 0 && t + 1 < seq.y) {
        float* snap = h.State(a, snapshot + t);
#pragma unroll
        for (int r = 0; r < kDeltaMaxRows; ++r) {
          const int32_t i = row0 + r;
          if (r < rows && i < dk && has_col) snap[static_cast<int64_t>(i) * dv + col] = s[r];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kDeltaMaxRows; ++r) {
      const int32_t i = row0 + r;
      if (r < rows && i < dk && has_col) state[static_cast<int64_t>(i) * dv + col] = s[r];
    }
    __syncthreads();  // a later sequence of the same slot reads what this one wrote
  }
}

// The chunked form: block (value head, 32-column chunk, sequence) walks the sequence's chunks in
// order with the state's 32 columns S [dk, 32] in shared memory. Per chunk of n rows (padded to
// kDeltaChunk with zero q, k, v, beta 0 and log decay 0, which change nothing), with g_t the
// rows' log decays, G their running sum, gamma_t = exp(G_t), E_ts = exp(G_t - G_s) (s <= t):
//   L = strict_lower(diag(beta) (K K^T o E)), M = lower(Q K^T o E)
//   D = (I + L)^-1 diag(beta) (V - diag(gamma) K S)     (8-row blocks, then row by row)
//   out = diag(gamma) Q S + M D
//   S = gamma_last S + (diag(E_last) K)^T D
// (the recurrence unrolled over the chunk: GatedDeltaRuleChunked's algebra; the Gram matrices
// are recomputed by each column block.) Row t of the chunk is warp t % 8's in the products
// over S, lanes the columns.
constexpr int kChunkWarps = 8;
constexpr int kChunkLd = kDeltaChunkMaxKeyDim + 1;  // a q / k row in shared memory (padded)
constexpr int kChunkLdT = kDeltaChunk + 1;          // a row of the [t][s] matrices (padded)
constexpr int kChunkRowsPerWarp = kDeltaChunk / kChunkWarps;
constexpr size_t kChunkSmemBytes =
    sizeof(float) * (2 * kDeltaChunk * kChunkLd + 2 * kDeltaChunk * kChunkLdT +
                     kDeltaChunkMaxKeyDim * 32 + kDeltaChunk * 32 + 3 * kDeltaChunk);

__global__ void __launch_bounds__(kChunkWarps * 32)
    GatedDeltaChunkedKernel(GatedDeltaArgs a, PlanView plan) {
  extern __shared__ float sm[];
  float* q_s = sm;                               // [kDeltaChunk][kChunkLd] l2-normed q
  float* k_s = q_s + kDeltaChunk * kChunkLd;     // [kDeltaChunk][kChunkLd] l2-normed k
  float* m_s = k_s + kDeltaChunk * kChunkLd;     // [kDeltaChunk][kChunkLdT] Q K^T, then M
  float* l_s = m_s + kDeltaChunk * kChunkLdT;    // [kDeltaChunk][kChunkLdT] K K^T, then L
  float* s_s = l_s + kDeltaChunk * kChunkLdT;    // [dk][32] the state's columns
  float* d_s = s_s + kDeltaChunkMaxKeyDim * 32;  // [kDeltaChunk][32] V, then R, then D
  float* g_s = d_s + kDeltaChunk * 32;           // [kDeltaChunk] log decays, then G
  float* beta_s = g_s + kDeltaChunk;             // [kDeltaChunk]
  float* w_s = beta_s + kDeltaChunk;             // [kDeltaChunk] E_last
  const int4 seq = plan.seqs[blockIdx.z];
  if (!ChunkedSeq(a, seq.y, plan.snapshot_slots[blockIdx.z])) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const DeltaHead h(a, blockIdx.x);
  const int32_t head = h.head, dk = h.dk, dv = h.dv, kh = h.kh, col0 = blockIdx.y * 32;
  const int32_t col = col0 + lane;
  const bool has_col = col < dv;
  float* state = h.State(a, plan.state_slots[blockIdx.z]);
  const bool fresh = seq.z == seq.y;
  for (int e = threadIdx.x; e < dk * 32; e += kChunkWarps * 32) {
    const int32_t c = col0 + e % 32;
    s_s[e] = !fresh && c < dv ? state[static_cast<int64_t>(e / 32) * dv + c] : 0.f;
  }
  for (int32_t t0 = 0; t0 < seq.y; t0 += kDeltaChunk) {
    const int32_t n = min(kDeltaChunk, seq.y - t0);
    // The chunk's rows: q and k l2-normed (q also by 1 / sqrt(dk)), beta, log decay, V's columns.
    for (int t = warp; t < kDeltaChunk; t += kChunkWarps) {
      float* qr = q_s + t * kChunkLd;
      float* kr = k_s + t * kChunkLd;
      const int64_t row = static_cast<int64_t>(seq.x) + t0 + t;
      const float* x = a.qkv + row * h.stride;
      float qq = 0.f, kk = 0.f;
      for (int32_t i = lane; i < dk; i += 32) {
        const float qv = t < n ? x[static_cast<int64_t>(kh) * dk + i] : 0.f;
        const float kv = t < n ? x[h.key_width + static_cast<int64_t>(kh) * dk + i] : 0.f;
        qr[i] = qv;
        kr[i] = kv;
        qq += qv * qv;
        kk += kv * kv;
      }
      qq = WarpSum(qq);
      kk = WarpSum(kk);
      const float q_inv = h.scale / sqrtf(qq + 1e-6f), k_inv = 1.0f / sqrtf(kk + 1e-6f);
      for (int32_t i = lane; i < dk; i += 32) {
        qr[i] *= q_inv;
        kr[i] *= k_inv;
      }
      if (lane == 0) {
        const float* ba = a.ba + row * 2 * a.num_v_heads;
        beta_s[t] = t < n ? SigmoidF(ba[head]) : 0.f;
        g_s[t] = t < n ? h.decay_rate * SoftplusF(ba[a.num_v_heads + head] + h.dt_bias) : 0.f;
      }
      d_s[t * 32 + lane] =
          t < n && has_col ? x[2 * h.key_width + static_cast<int64_t>(head) * dv + col] : 0.f;
    }
    __syncthreads();
    // G; the Gram matrices' lower triangles; (K S)[t][lane] and (Q S)[t][lane] of this warp's
    // rows.
    if (threadIdx.x == 0) {
      float acc = 0.f;
      for (int t = 0; t < kDeltaChunk; ++t) g_s[t] = acc += g_s[t];
    }
    for (int e = threadIdx.x; e < kDeltaChunk * kDeltaChunk; e += kChunkWarps * 32) {
      const int t = e / kDeltaChunk, s = e % kDeltaChunk;
      float qk = 0.f, kk = 0.f;
      if (s <= t) {
        const float* qt = q_s + t * kChunkLd;
        const float* kt = k_s + t * kChunkLd;
        const float* ks = k_s + s * kChunkLd;
        for (int32_t i = 0; i < dk; ++i) {
          qk += qt[i] * ks[i];
          kk += kt[i] * ks[i];
        }
      }
      m_s[t * kChunkLdT + s] = qk;
      l_s[t * kChunkLdT + s] = kk;
    }
    float ks_row[kChunkRowsPerWarp], qs_row[kChunkRowsPerWarp];
#pragma unroll
    for (int j = 0; j < kChunkRowsPerWarp; ++j) ks_row[j] = qs_row[j] = 0.f;
    for (int32_t i = 0; i < dk; ++i) {
      const float sv = s_s[i * 32 + lane];
#pragma unroll
      for (int j = 0; j < kChunkRowsPerWarp; ++j) {
        const int t = warp + kChunkWarps * j;
        ks_row[j] += k_s[t * kChunkLd + i] * sv;
        qs_row[j] += q_s[t * kChunkLd + i] * sv;
      }
    }
    __syncthreads();
    // The decays: M, L, E_last, R = diag(beta) (V - diag(gamma) K S), diag(gamma) Q S.
    const float g_last = g_s[kDeltaChunk - 1];
    for (int e = threadIdx.x; e < kDeltaChunk * kDeltaChunk; e += kChunkWarps * 32) {
      const int t = e / kDeltaChunk, s = e % kDeltaChunk;
      const float decay = s <= t ? expf(g_s[t] - g_s[s]) : 0.f;
      m_s[t * kChunkLdT + s] *= decay;
      l_s[t * kChunkLdT + s] = s < t ? l_s[t * kChunkLdT + s] * beta_s[t] * decay : 0.f;
    }
    if (threadIdx.x < kDeltaChunk) w_s[threadIdx.x] = expf(g_last - g_s[threadIdx.x]);
#pragma unroll
    for (int j = 0; j < kChunkRowsPerWarp; ++j) {
      const int t = warp + kChunkWarps * j;
      const float gamma = expf(g_s[t]);
      d_s[t * 32 + lane] = beta_s[t] * (d_s[t * 32 + lane] - gamma * ks_row[j]);
      qs_row[j] *= gamma;
    }
    __syncthreads();
    // D = (I + L)^-1 R: per block of 8 rows, less L times the rows before it (a row per warp),
    // then row by row within the block (warp 0).
    for (int r0 = 0; r0 < kDeltaChunk; r0 += 8) {
      if (r0 > 0) {
        const int t = r0 + warp;
        float acc = 0.f;
        for (int s = 0; s < r0; ++s) acc += l_s[t * kChunkLdT + s] * d_s[s * 32 + lane];
        d_s[t * 32 + lane] -= acc;
        __syncthreads();
      }
      if (warp == 0) {
        for (int t = r0 + 1; t < r0 + 8; ++t) {
          float acc = 0.f;
          for (int s = r0; s < t; ++s) acc += l_s[t * kChunkLdT + s] * d_s[s * 32 + lane];
          d_s[t * 32 + lane] -= acc;
        }
      }
      __syncthreads();
    }
    // out = diag(gamma) Q S + M D; S = gamma_last S + (diag(E_last) K)^T D.
#pragma unroll
    for (int j = 0; j < kChunkRowsPerWarp; ++j) {
      const int t = warp + kChunkWarps * j;
      float acc = qs_row[j];
      for (int s = 0; s <= t; ++s) acc += m_s[t * kChunkLdT + s] * d_s[s * 32 + lane];
      if (t < n && has_col)
        a.out[(static_cast<int64_t>(seq.x) + t0 + t) * h.out_stride +
              static_cast<int64_t>(head) * dv + col] = acc;
    }
    const float gamma_last = expf(g_last);
    for (int32_t i = warp; i < dk; i += kChunkWarps) {
      float acc = s_s[i * 32 + lane] * gamma_last;
      for (int t = 0; t < kDeltaChunk; ++t)
        acc += w_s[t] * k_s[t * kChunkLd + i] * d_s[t * 32 + lane];
      s_s[i * 32 + lane] = acc;
    }
    __syncthreads();  // the chunk's buffers are free, S is whole
  }
  for (int e = threadIdx.x; e < dk * 32; e += kChunkWarps * 32) {
    const int32_t c = col0 + e % 32;
    if (c < dv) state[static_cast<int64_t>(e / 32) * dv + c] = s_s[e];
  }
}

__global__ void SigmoidGateMulKernel(float* __restrict__ x, const float* __restrict__ gate,
                                     int64_t n, int64_t run) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= SigmoidF(gate[i / run]);
}

}  // namespace

void LaunchCausalConv1dSilu(float* x, int64_t channels, const float* weight, int32_t kernel,
                            float* state, int64_t slot_floats, int64_t state_offset,
                            const PlanView& plan, bool serial_seqs, cudaStream_t stream) {
  if (plan.num_seqs == 0 || channels == 0) return;
  const dim3 grid(static_cast<unsigned>((channels + 127) / 128), 1,
                  serial_seqs ? 1u : static_cast<unsigned>(plan.num_seqs));
  CausalConv1dSiluKernel<<<grid, 128, 0, stream>>>(x, channels, weight, kernel, state,
                                                    slot_floats, state_offset, plan, serial_seqs);
  CUDA_CHECK_LAUNCH();
}

void LaunchGatedDeltaRule(const GatedDeltaArgs& args, const PlanView& plan, bool serial_seqs,
                          cudaStream_t stream) {
  if (plan.num_seqs == 0) return;
  const dim3 grid(static_cast<unsigned>(args.num_v_heads),
                  static_cast<unsigned>((args.v_dim + 31) / 32),
                  serial_seqs ? 1u : static_cast<unsigned>(plan.num_seqs));
  GatedDeltaRuleKernel<<<grid, kDeltaWarps * 32, 0, stream>>>(args, plan, serial_seqs);
  CUDA_CHECK_LAUNCH();
  if (args.chunked_min_rows > 0) {  // the long sequences (the kernel above skipped them)
    CHECK(!serial_seqs && args.k_dim <= kDeltaChunkMaxKeyDim);
    static std::once_flag attr_once;
    std::call_once(attr_once, [] {
      CUDA_CHECK(cudaFuncSetAttribute(GatedDeltaChunkedKernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kChunkSmemBytes)));
    });
    GatedDeltaChunkedKernel<<<dim3(grid.x, grid.y, static_cast<unsigned>(plan.num_seqs)),
                              kChunkWarps * 32, kChunkSmemBytes, stream>>>(args, plan);
    CUDA_CHECK_LAUNCH();
  }
}

int32_t GatedDeltaChunkedMinRows(int32_t k_dim) {
  return k_dim <= kDeltaChunkMaxKeyDim ? 2 * kDeltaChunk : 0;
}

void LaunchSigmoidGateMul(float* x, const float* gate, int64_t rows, int64_t cols, int64_t groups,
                          cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  SigmoidGateMulKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, gate, n,
                                                                          cols / groups);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
