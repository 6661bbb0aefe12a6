#include "backend/cpu/gated_delta.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/check.h"

// GCC 12's AVX-512 intrinsics pass an undefined vector as their (ignored) merge source, which
// -Wuninitialized reports once they are inlined into target("avx512f") functions.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define EMBER_AVX512_TARGET __attribute__((target("avx512f")))

namespace ember::cpu {
namespace {

float Silu(float x) { return x / (1.0f + std::exp(-x)); }
float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// y = x / sqrt(sum x^2 + 1e-6) * scale (the FLA l2norm's epsilon).
void L2Normalize(const float* x, int32_t n, float scale, float* y) {
  float sum = 0.0f;
  for (int32_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = scale / std::sqrt(sum + 1e-6f);
  for (int32_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

// One value head's inputs over a step's rows.
struct HeadRows {
  const DeltaHeadShape& s;
  int32_t head;
  const float *qkv, *ba, *a_log, *dt_bias;

  struct Row {
    const float* v;  // [v_dim]
    float beta, decay;
  };
  // Row t's q (l2-normed, times 1 / sqrt(k_dim)) and k (l2-normed), each [k_dim]; its v, beta
  // and decay exp(g).
  Row Read(int64_t t, float* q, float* k) const {
    const int32_t dk = s.k_dim;
    const int32_t kh = head / (s.num_v_heads / s.num_k_heads);
    const int64_t key_width = int64_t{s.num_k_heads} * dk;
    const float* row = qkv + t * s.qkv_stride();
    L2Normalize(row + int64_t{kh} * dk, dk, 1.0f / std::sqrt(static_cast<float>(dk)), q);
    L2Normalize(row + key_width + int64_t{kh} * dk, dk, 1.0f, k);
    const float* b = ba + t * 2 * s.num_v_heads;
    const float decay_rate = -std::exp(a_log[head]);
    return {row + 2 * key_width + int64_t{head} * s.v_dim, Sigmoid(b[head]),
            std::exp(decay_rate * Softplus(b[s.num_v_heads + head] + dt_bias[head]))};
  }
};

// Decay products below 1e-30 as 0: they contribute nothing at float precision, and products of
// many small decays would otherwise pass through subnormals (slow on many CPUs).
float Flush(float decay) { return decay < 1e-30f ? 0.0f : decay; }

// What a product does with its destination.
enum class Acc { kStore, kAdd, kSubtract };

// out[R, 8 V] (row stride ldo) op= a[R, m] (row stride lda) b[m, 8 V] (row stride ldb): each
// element one FMA chain over m in order.
template <int R, int V>
inline void Tile(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, float* out,
                 int64_t ldo, Acc mode) {
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < m; ++i) {
    __m256 bv[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = _mm256_loadu_ps(b + i * ldb + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + i);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      float* o = out + r * ldo + 8 * v;
      if (mode == Acc::kAdd) acc[r][v] = _mm256_add_ps(_mm256_loadu_ps(o), acc[r][v]);
      if (mode == Acc::kSubtract) acc[r][v] = _mm256_sub_ps(_mm256_loadu_ps(o), acc[r][v]);
      _mm256_storeu_ps(o, acc[r][v]);
    }
  }
}

// Tile with 512-bit vectors (16 V columns): the same FMA chains, so bitwise the same results.
// Compiled for AVX-512 whatever the build's -march; called only where HasAvx512() says so.
template <int R, int V>
EMBER_AVX512_TARGET inline void Tile512(const float* a, int64_t lda, int64_t m, const float* b,
                                        int64_t ldb, float* out, int64_t ldo, Acc mode) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < m; ++i) {
    __m512 bv[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_ps(b + i * ldb + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + i]);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      float* o = out + r * ldo + 16 * v;
      if (mode == Acc::kAdd) acc[r][v] = _mm512_add_ps(_mm512_loadu_ps(o), acc[r][v]);
      if (mode == Acc::kSubtract) acc[r][v] = _mm512_sub_ps(_mm512_loadu_ps(o), acc[r][v]);
      _mm512_storeu_ps(o, acc[r][v]);
    }
  }
}

bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// Columns [0, cols) of R rows: 64 and 16 at a time with 512-bit vectors where the CPU has them,
// else 16 and the last 8 with 256-bit ones.
template <int R>
EMBER_AVX512_TARGET void TileRow512(const float* a, int64_t lda, int64_t m, const float* b,
                                    int64_t ldb, int64_t cols, float* out, int64_t ldo, Acc mode) {
  int64_t j = 0;
  for (; j + 64 <= cols; j += 64) Tile512<R, 4>(a, lda, m, b + j, ldb, out + j, ldo, mode);
  for (; j + 16 <= cols; j += 16) Tile512<R, 1>(a, lda, m, b + j, ldb, out + j, ldo, mode);
  if (j < cols) Tile<R, 1>(a, lda, m, b + j, ldb, out + j, ldo, mode);
}

template <int R>
void TileRow(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t cols,
             float* out, int64_t ldo, Acc mode) {
  if (HasAvx512()) return TileRow512<R>(a, lda, m, b, ldb, cols, out, ldo, mode);
  int64_t j = 0;
  for (; j + 16 <= cols; j += 16) Tile<R, 2>(a, lda, m, b + j, ldb, out + j, ldo, mode);
  if (j < cols) Tile<R, 1>(a, lda, m, b + j, ldb, out + j, ldo, mode);
}

// out[n, cols] (row stride ldo) op= a[n, m] b[m, cols] (row strides lda, ldb); cols % 8 == 0.
// Small single-threaded products (the caller runs one head per thread).
void SmallMatMul(const float* a, int64_t lda, int64_t n, int64_t m, const float* b, int64_t ldb,
                 int64_t cols, float* out, int64_t ldo, Acc mode) {
  int64_t r = 0;
  for (; r + 4 <= n; r += 4)
    TileRow<4>(a + r * lda, lda, m, b, ldb, cols, out + r * ldo, ldo, mode);
  for (; r < n; ++r) TileRow<1>(a + r * lda, lda, m, b, ldb, cols, out + r * ldo, ldo, mode);
}

// One chunk's working set: rows padded to a multiple of 8 (np). Per thread, reused across calls
// (only grows): a step's heads would otherwise allocate and fault in fresh pages each call.
struct ChunkBuffers {
  static ChunkBuffers& ForThread(int32_t chunk, int32_t dk, int32_t dv) {
    thread_local ChunkBuffers b;
    const auto rows = static_cast<size_t>(chunk);
    for (std::vector<float>* v : {&b.q, &b.k, &b.kt}) v->resize(std::max(v->size(), rows * dk));
    for (std::vector<float>* v : {&b.d, &b.p}) v->resize(std::max(v->size(), rows * dv));
    for (std::vector<float>* v : {&b.qk, &b.kk}) v->resize(std::max(v->size(), rows * rows));
    for (std::vector<float>* v : {&b.alpha, &b.beta, &b.e}) v->resize(std::max(v->size(), rows));
    return b;
  }
  std::vector<float> q, k, kt;  // [np, dk] (times gamma once the Gram matrices are made); [dk, np]
  std::vector<float> d, p;      // [np, dv]: beta v, then D; gamma K S0
  std::vector<float> qk, kk;    // [np, np]: Q K^T, K K^T, then M and L
  std::vector<float> alpha, beta, e;  // [np] decays, betas, a row of E
};

// Reads rows [t0, t0 + n) into the buffers (padding rows: zero q, k, v and beta, decay 1, which
// leave D, the outputs and the state unchanged) and makes Q K^T and K K^T (lower blocks only).
void LoadChunk(const HeadRows& in, int64_t t0, int32_t n, int32_t np, ChunkBuffers& b) {
  const int32_t dk = in.s.k_dim, dv = in.s.v_dim;
  std::fill(b.q.begin() + int64_t{n} * dk, b.q.begin() + int64_t{np} * dk, 0.0f);
  std::fill(b.k.begin() + int64_t{n} * dk, b.k.begin() + int64_t{np} * dk, 0.0f);
  std::fill(b.d.begin() + int64_t{n} * dv, b.d.begin() + int64_t{np} * dv, 0.0f);
  for (int32_t t = 0; t < np; ++t) {
    b.alpha[static_cast<size_t>(t)] = 1.0f;
    b.beta[static_cast<size_t>(t)] = 0.0f;
    if (t >= n) continue;
    const HeadRows::Row row =
        in.Read(t0 + t, b.q.data() + int64_t{t} * dk, b.k.data() + int64_t{t} * dk);
    std::copy_n(row.v, dv, b.d.data() + int64_t{t} * dv);
    b.alpha[static_cast<size_t>(t)] = row.decay;
    b.beta[static_cast<size_t>(t)] = row.beta;
  }
  for (int32_t t = 0; t < np; ++t)
    for (int32_t i = 0; i < dk; ++i)
      b.kt[static_cast<size_t>(i) * np + t] = b.k[static_cast<size_t>(t) * dk + i];
  // Row block [r0, r0 + 16) needs columns < r0 + 16 only (causal).
  for (int32_t r0 = 0; r0 < np; r0 += 16) {
    const int32_t nr = std::min(16, np - r0), cols = r0 + nr;
    SmallMatMul(b.q.data() + int64_t{r0} * dk, dk, nr, dk, b.kt.data(), np, cols,
                b.qk.data() + int64_t{r0} * np, np, Acc::kStore);
    SmallMatMul(b.k.data() + int64_t{r0} * dk, dk, nr, dk, b.kt.data(), np, cols,
                b.kk.data() + int64_t{r0} * np, np, Acc::kStore);
  }
}

// Turns Q K^T into M = lower(Q K^T o E) and K K^T into L = strict_lower(diag(beta) K K^T o E),
// zero elsewhere; leaves E's last row (the decay from each row to the chunk's end) in b.e.
void DecayMasks(int32_t np, ChunkBuffers& b) {
  for (int32_t t = 0; t < np; ++t) {
    float* m = b.qk.data() + int64_t{t} * np;
    float* l = b.kk.data() + int64_t{t} * np;
    const float alpha = b.alpha[static_cast<size_t>(t)], beta = b.beta[static_cast<size_t>(t)];
    for (int32_t s = 0; s < t; ++s) {
      const float e = b.e[static_cast<size_t>(s)] = Flush(b.e[static_cast<size_t>(s)] * alpha);
      m[s] *= e;
      l[s] *= beta * e;
    }
    b.e[static_cast<size_t>(t)] = 1.0f;
    l[t] = 0.0f;
    std::fill(m + t + 1, m + np, 0.0f);
    std::fill(l + t + 1, l + np, 0.0f);
  }
}

// D = (I + L)^-1 R in place (R in b.d): blocks of 8 rows, each first less L times the rows
// solved before it, then row by row.
void SolveRows(int32_t np, int32_t dv, ChunkBuffers& b) {
  float* d = b.d.data();
  for (int32_t r0 = 0; r0 < np; r0 += 8) {
    const float* l = b.kk.data() + int64_t{r0} * np;
    if (r0 > 0) SmallMatMul(l, np, 8, r0, d, dv, dv, d + int64_t{r0} * dv, dv, Acc::kSubtract);
    for (int32_t t = r0 + 1; t < r0 + 8; ++t) {
      float* dt = d + int64_t{t} * dv;
      for (int32_t s = r0; s < t; ++s) {
        const float c = b.kk[static_cast<size_t>(t) * np + s];
        const float* ds = d + int64_t{s} * dv;
        for (int32_t j = 0; j < dv; ++j) dt[j] -= c * ds[j];
      }
    }
  }
}

// One chunk of n rows from `state` (S0, updated to the chunk's end); out [n, ldo].
void RunChunk(const HeadRows& in, int64_t t0, int32_t n, ChunkBuffers& b, float* state, float* out,
              int64_t ldo) {
  const int32_t dk = in.s.k_dim, dv = in.s.v_dim, np = (n + 7) / 8 * 8;
  LoadChunk(in, t0, n, np, b);
  float gamma = 1.0f;
  for (int32_t t = 0; t < np; ++t) {
    gamma = Flush(gamma * b.alpha[static_cast<size_t>(t)]);
    for (int32_t i = 0; i < dk; ++i) {
      b.q[static_cast<size_t>(t) * dk + i] *= gamma;
      b.k[static_cast<size_t>(t) * dk + i] *= gamma;
    }
  }
  SmallMatMul(b.q.data(), dk, n, dk, state, dv, dv, out, ldo, Acc::kStore);         // gamma Q S0
  SmallMatMul(b.k.data(), dk, np, dk, state, dv, dv, b.p.data(), dv, Acc::kStore);  // gamma K S0
  for (int32_t t = 0; t < np; ++t) {  // R = diag(beta) (V - gamma K S0)
    float* r = b.d.data() + int64_t{t} * dv;
    const float* p = b.p.data() + int64_t{t} * dv;
    const float beta = b.beta[static_cast<size_t>(t)];
    for (int32_t j = 0; j < dv; ++j) r[j] = (r[j] - p[j]) * beta;
  }
  DecayMasks(np, b);
  SolveRows(np, dv, b);
  // out += M D (row block [r0, r0 + 16) needs D's rows < r0 + 16 only).
  for (int32_t r0 = 0; r0 < n; r0 += 16) {
    const int32_t nr = std::min(16, n - r0);
    SmallMatMul(b.qk.data() + int64_t{r0} * np, np, nr, std::min(np, r0 + 16), b.d.data(), dv, dv,
                out + int64_t{r0} * ldo, ldo, Acc::kAdd);
  }
  // S = gamma_last S0 + (E_last K)^T D, E_last K's transpose from K^T's columns.
  for (int32_t i = 0; i < dk; ++i)
    for (int32_t t = 0; t < np; ++t)
      b.kt[static_cast<size_t>(i) * np + t] *= b.e[static_cast<size_t>(t)];
  for (int64_t i = 0; i < int64_t{dk} * dv; ++i) state[i] *= gamma;
  SmallMatMul(b.kt.data(), np, dk, np, b.d.data(), dv, dv, state, dv, Acc::kAdd);
}

}  // namespace

void CausalConv1dSiluRows(float* x, int64_t rows, int64_t channels, const float* weight,
                          int32_t kernel, float* window) {
  const int64_t hist = kernel - 1;
  // The inputs this step sees: the window, then the rows (kept before x is overwritten).
  std::vector<float> in(static_cast<size_t>((hist + rows) * channels));
  std::memcpy(in.data(), window, static_cast<size_t>(hist * channels) * sizeof(float));
  std::memcpy(in.data() + hist * channels, x, static_cast<size_t>(rows * channels) * sizeof(float));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0.0f;
      for (int32_t j = 0; j < kernel; ++j)
        acc += weight[c * kernel + j] * in[static_cast<size_t>((t + j) * channels + c)];
      x[t * channels + c] = Silu(acc);
    }
  }
  std::memcpy(window, in.data() + rows * channels,
              static_cast<size_t>(hist * channels) * sizeof(float));
}

void GatedDeltaRuleHead(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                        const float* a_log, const float* dt_bias, int64_t rows, float* state,
                        float* out, bool chunked) {
  if (chunked && rows >= kDeltaChunkMinRows && s.v_dim % 8 == 0)
    GatedDeltaRuleChunked(s, head, qkv, ba, a_log, dt_bias, rows, kDeltaChunk, state, out);
  else
    GatedDeltaRuleTokens(s, head, qkv, ba, a_log, dt_bias, rows, state, out);
}

void GatedDeltaRuleTokens(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                          const float* a_log, const float* dt_bias, int64_t rows, float* state,
                          float* out) {
  const int32_t dk = s.k_dim, dv = s.v_dim;
  const HeadRows in{s, head, qkv, ba, a_log, dt_bias};
  std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk));
  std::vector<float> delta(static_cast<size_t>(dv));
  const int64_t out_stride = int64_t{s.num_v_heads} * dv;
  for (int64_t t = 0; t < rows; ++t) {
    const HeadRows::Row row = in.Read(t, q.data(), k.data());
    const float *v = row.v, beta = row.beta, decay = row.decay;
    // S *= exp(g); delta = beta (v - S^T k)
    for (int32_t j = 0; j < dv; ++j) delta[static_cast<size_t>(j)] = 0.0f;
    for (int32_t i = 0; i < dk; ++i) {
      float* srow = state + int64_t{i} * dv;
      const float ki = k[static_cast<size_t>(i)];
      for (int32_t j = 0; j < dv; ++j) {
        srow[j] *= decay;
        delta[static_cast<size_t>(j)] += srow[j] * ki;
      }
    }
    for (int32_t j = 0; j < dv; ++j)
      delta[static_cast<size_t>(j)] = (v[j] - delta[static_cast<size_t>(j)]) * beta;
    // S += k delta^T; out = S^T q
    float* o = out + t * out_stride + int64_t{head} * dv;
    for (int32_t j = 0; j < dv; ++j) o[j] = 0.0f;
    for (int32_t i = 0; i < dk; ++i) {
      float* srow = state + int64_t{i} * dv;
      const float ki = k[static_cast<size_t>(i)], qi = q[static_cast<size_t>(i)];
      for (int32_t j = 0; j < dv; ++j) {
        srow[j] += ki * delta[static_cast<size_t>(j)];
        o[j] += srow[j] * qi;
      }
    }
  }
}

void GatedDeltaRuleChunked(const DeltaHeadShape& s, int32_t head, const float* qkv, const float* ba,
                           const float* a_log, const float* dt_bias, int64_t rows, int32_t chunk,
                           float* state, float* out) {
  CHECK(chunk > 0 && chunk % 8 == 0) << "delta-rule chunk " << chunk << " is not a multiple of 8";
  CHECK(s.v_dim % 8 == 0) << "chunked delta rule needs v_dim % 8 == 0, got " << s.v_dim;
  const HeadRows in{s, head, qkv, ba, a_log, dt_bias};
  ChunkBuffers& buffers = ChunkBuffers::ForThread(chunk, s.k_dim, s.v_dim);
  const int64_t out_stride = int64_t{s.num_v_heads} * s.v_dim;
  for (int64_t t0 = 0; t0 < rows; t0 += chunk) {
    const auto n = static_cast<int32_t>(std::min<int64_t>(chunk, rows - t0));
    RunChunk(in, t0, n, buffers, state, out + t0 * out_stride + int64_t{head} * s.v_dim,
             out_stride);
  }
}
}  // namespace ember::cpu
