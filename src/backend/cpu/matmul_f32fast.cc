#include "backend/cpu/matmul_f32fast.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "backend/cpu/avx512_widen.h"
#include "backend/cpu/matmul_bf16.h"
#include "backend/cpu/thread_scratch.h"
#include "util/check.h"

// GCC 12's AVX-512 intrinsics pass an undefined vector as their (ignored) merge source, which
// -Wuninitialized reports once they are inlined into target("avx512f") functions.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Compiled for AVX-512 whatever the build's -march: only called when HasF32Fast() says the CPU
// runs it.
#define EMBER_F32_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))

namespace ember::cpu {
namespace {

constexpr int kLanes = 16;          // rows per register
constexpr int kMaxGroups = 2;       // register tile: 2 x 16 rows ...
constexpr int kMaxCols = 12;        // ... x 12 columns = 24 accumulators (+ 2 x, 1 broadcast)
constexpr int64_t kChunk = 256;     // k per pass: a tile's weights (12 KB) stay in L1
constexpr int64_t kRowPanel = 512;  // rows per pass (the partial sums of a block stay in L2)
constexpr int64_t kBlockCols = 96;  // output columns per work item (a multiple of kMaxCols)

// Scratch tags (ThreadScratch): the packed x^T (the calling thread's, shared by the workers for
// the call), a block's float32 weight chunk and its partial sums.
struct PackedXTag;
struct PanelTag;
struct SumsTag;

// One pass of G x 16 rows by C columns over `len` k values: acc[g][c] (16 rows) continues from
// `sums` (or from zero when `first`), adds x^T[g][i] * w[c][i] for i in order, and goes back to
// `sums`. xt: group g's 16-row column i at xt + g * group_stride + i * 16; w: column c's value i
// at w + c * kChunk + i (a constant stride: one address register for every column); sums:
// group g, column c at sums + g * sums_group_stride + c * 16.
template <int G, int C>
EMBER_F32_TARGET void Tile(const float* xt, int64_t group_stride, const float* w, int64_t len,
                           float* sums, int64_t sums_group_stride, bool first) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c)
      acc[g][c] =
          first ? _mm512_setzero_ps() : _mm512_load_ps(sums + g * sums_group_stride + c * kLanes);
  for (int64_t i = 0; i < len; ++i) {
    __m512 xv[G];
    for (int g = 0; g < G; ++g) xv[g] = _mm512_load_ps(xt + g * group_stride + i * kLanes);
    for (int c = 0; c < C; ++c) {
      const __m512 wv = _mm512_set1_ps(w[c * kChunk + i]);
      for (int g = 0; g < G; ++g) acc[g][c] = _mm512_fmadd_ps(xv[g], wv, acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c)
      _mm512_store_ps(sums + g * sums_group_stride + c * kLanes, acc[g][c]);
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool);
using TileTable = std::array<std::array<TileFn, kMaxCols>, kMaxGroups>;
template <int G, int... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> TileRow(std::integer_sequence<int, Cs...>) {
  return {Tile<G, Cs + 1>...};
}
constexpr TileTable kTiles = {TileRow<1>(std::make_integer_sequence<int, kMaxCols>()),
                              TileRow<2>(std::make_integer_sequence<int, kMaxCols>())};

// Weights [c0, c0 + nc) x [i0, i0 + len) of w (dtype D) as float32 into dst (column c at
// dst + c * kChunk).
template <DType D>
EMBER_F32_TARGET void WidenChunk(const void* w, int64_t k, int64_t c0, int64_t nc, int64_t i0,
                                 int64_t len, float* dst) {
  const int64_t full = len / kLanes * kLanes;
  const __mmask16 tail = static_cast<__mmask16>((1u << (len - full)) - 1);
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t src = (c0 + c) * k + i0;
    float* d = dst + c * kChunk;
    for (int64_t i = 0; i < full; i += kLanes)
      _mm512_store_ps(d + i, Widen16<D>(w, src + i, __mmask16(0xffff)));
    if (full < len) _mm512_mask_storeu_ps(d + full, tail, Widen16<D>(w, src + full, tail));
  }
}

using WidenFn = void (*)(const void*, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
WidenFn WidenFor(DType dtype) {
  return dtype == DType::kF16    ? WidenChunk<DType::kF16>
         : dtype == DType::kBF16 ? WidenChunk<DType::kBF16>
                                 : WidenChunk<DType::kF32>;
}

// v[j] (j < 16) transposed in place: lane l of v[j] becomes lane j of v[l].
EMBER_F32_TARGET inline void Transpose16(__m512 (&v)[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
  }
  // u[4i + j]'s 128-bit lane q holds element 4q + j of v[4i .. 4i + 3].
  for (int j = 0; j < 4; ++j) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);
    const __m512 v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
    const __m512 w0 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
    v[j] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    v[4 + j] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    v[8 + j] = _mm512_shuffle_f32x4(v0, w0, 0xdd);
    v[12 + j] = _mm512_shuffle_f32x4(v1, w1, 0xdd);
  }
}

struct Problem {
  const float* xt;  // x^T of the row panel: [groups][k][16]
  int64_t groups;   // 16-row groups in the panel
  int64_t rows;     // rows in the panel (<= groups * 16)
  int64_t k;
  const void* w;
  DType dtype;
  int64_t m;
  const float* bias;
  float* out;  // the panel's first row of out [*, m]
};

// Output columns [c0, c0 + nc) of the panel's rows: k in chunks of kChunk (each chunk's weights
// widened once, shared by every row group), the partial sums held per block between chunks.
EMBER_F32_TARGET void ColumnBlock(const Problem& p, int64_t c0, int64_t nc) {
  float* panel = reinterpret_cast<float*>(
      ThreadScratch<PanelTag>(static_cast<size_t>(kBlockCols * kChunk) * sizeof(float)));
  float* sums = reinterpret_cast<float*>(
      ThreadScratch<SumsTag>(static_cast<size_t>(p.groups * kBlockCols * kLanes) * sizeof(float)));
  const int64_t sums_group_stride = nc * kLanes;
  const WidenFn widen = WidenFor(p.dtype);
  for (int64_t i0 = 0; i0 < p.k; i0 += kChunk) {
    const int64_t len = std::min(kChunk, p.k - i0);
    widen(p.w, p.k, c0, nc, i0, len, panel);
    for (int64_t c = 0; c < nc; c += kMaxCols) {
      const int cs = static_cast<int>(std::min<int64_t>(kMaxCols, nc - c));
      for (int64_t g = 0; g < p.groups; g += kMaxGroups) {
        const int gs = static_cast<int>(std::min<int64_t>(kMaxGroups, p.groups - g));
        kTiles[gs - 1][cs - 1](p.xt + g * p.k * kLanes + i0 * kLanes, p.k * kLanes,
                               panel + c * kChunk, len, sums + g * sums_group_stride + c * kLanes,
                               sums_group_stride, i0 == 0);
      }
    }
  }
  // The sums (16 rows per column) transposed into out's rows, 16 columns at a time, + bias.
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t rows = std::min<int64_t>(kLanes, p.rows - g * kLanes);
    for (int64_t c = 0; c < nc; c += kLanes) {
      const int64_t cols = std::min<int64_t>(kLanes, nc - c);
      const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
      __m512 v[kLanes];
      for (int64_t j = 0; j < kLanes; ++j)
        v[j] = j < cols ? _mm512_load_ps(sums + g * sums_group_stride + (c + j) * kLanes)
                        : _mm512_setzero_ps();
      Transpose16(v);
      const __m512 bias =
          p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + c0 + c) : _mm512_setzero_ps();
      for (int64_t r = 0; r < rows; ++r)
        _mm512_mask_storeu_ps(p.out + (g * kLanes + r) * p.m + c0 + c, mask,
                              p.bias != nullptr ? _mm512_add_ps(v[r], bias) : v[r]);
    }
  }
}

// Rows [r0, r0 + 16) of x (rows past n as zeros) transposed into dst: dst[i * 16 + r] =
// x[r0 + r, i].
void PackGroup(const float* x, int64_t n, int64_t k, int64_t r0, float* dst) {
  const int64_t rows = std::min<int64_t>(kLanes, n - r0);
  if (rows < kLanes) std::memset(dst, 0, static_cast<size_t>(k * kLanes) * sizeof(float));
  for (int64_t i0 = 0; i0 < k; i0 += kLanes) {
    const int64_t len = std::min<int64_t>(kLanes, k - i0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = x + (r0 + r) * k + i0;
      for (int64_t i = 0; i < len; ++i) dst[(i0 + i) * kLanes + r] = src[i];
    }
  }
}

// Flops per second of one pass of 24 independent chains of VDPBF16PS (64 flops each) or of FMAs
// (32), as the kernels' tiles keep. The chains are unrolled so that every accumulator stays in a
// register: a loop over an array of them would keep them in memory and time loads and stores.
template <bool Bf16>
EMBER_F32_TARGET double TimeChains() {
  constexpr int kIters = 4096;
  __m512 acc[24];
#pragma GCC unroll 24
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(1e-3f), b = _mm512_set1_ps(1e-3f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int n = 0; n < kIters; ++n) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) {
      if constexpr (Bf16) {
        // (VDPBF16PS through inline assembly: this function's target has no AVX512_BF16; only
        // called where the CPU has it.)
        __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc[i]) : "v"(a), "v"(b));
      } else {
        acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
      }
    }
    __asm__ volatile("" : "+v"(a));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m512 sum = acc[0];
#pragma GCC unroll 24
  for (int i = 1; i < 24; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return 24.0 * kIters * (Bf16 ? 64.0 : 32.0) / std::max(s, 1e-9);
}

}  // namespace

bool HasF32Fast() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}

DotRates MeasureDotRates() {
  DotRates rates;
  if (!HasF32Fast()) return rates;
  const bool bf16 = HasBf16Dot();
  // Alternating passes, the best of each (a warm-up pass first: the first wide instructions may
  // run while the core changes its clock), about a millisecond in all.
  TimeChains<false>();
  for (int pass = 0; pass < 8; ++pass) {
    rates.f32_fma = std::max(rates.f32_fma, TimeChains<false>());
    if (bf16) rates.bf16_dot = std::max(rates.bf16_dot, TimeChains<true>());
  }
  return rates;
}

bool Bf16DotOutrunsF32Fma() {
  static const bool outruns = [] {
    if (!HasBf16Dot() || !HasF32Fast()) return false;
    const DotRates rates = MeasureDotRates();
    // bf16 rounds x and W: it has to be clearly faster to be worth its error.
    return rates.bf16_dot > 1.25 * rates.f32_fma;
  }();
  return outruns;
}

void MatMulF32Fast(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                   const float* bias, float* out, ThreadPool& pool) {
  CHECK(HasF32Fast()) << "MatMulF32Fast needs AVX-512 (F, BW, VL)";
  CHECK(w_dtype == DType::kF32 || w_dtype == DType::kF16 || w_dtype == DType::kBF16)
      << "MatMulF32Fast weight must be F32/F16/BF16, got " << DTypeName(w_dtype);
  if (n == 0 || m == 0) return;
  if (k == 0) {  // empty chains: 0 (+ bias)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < m; ++c) out[r * m + c] = bias != nullptr ? 0.0f + bias[c] : 0.0f;
    return;
  }
  const int max_threads = n * k * m < (1 << 20) ? 1 : pool.num_threads();
  // Column blocks: whole tiles, at least two per thread.
  int64_t block = kBlockCols;
  while (block > kMaxCols && (m + block - 1) / block < 2 * max_threads) block -= kMaxCols;
  const int64_t blocks = (m + block - 1) / block;
  for (int64_t r0 = 0; r0 < n; r0 += kRowPanel) {
    const int64_t rows = std::min(kRowPanel, n - r0);
    const int64_t groups = (rows + kLanes - 1) / kLanes;
    float* xt = reinterpret_cast<float*>(
        ThreadScratch<PackedXTag>(static_cast<size_t>(groups * k * kLanes) * sizeof(float)));
    pool.ParallelFor(
        groups,
        [&](int64_t g, int) { PackGroup(x + r0 * k, rows, k, g * kLanes, xt + g * k * kLanes); },
        max_threads);
    const Problem p{xt, groups, rows, k, w, w_dtype, m, bias, out + r0 * m};
    pool.ParallelFor(
        blocks,
        [&](int64_t b, int) {
          const int64_t c0 = b * block;
          ColumnBlock(p, c0, std::min(block, m - c0));
        },
        max_threads);
  }
}

}  // namespace ember::cpu
