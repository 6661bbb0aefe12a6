#include "backend/cpu/matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "util/half.h"

namespace ember::cpu {
namespace {

// Output columns (weight rows) per block: 8 column vectors of 8 lanes.
constexpr int64_t kColBlock = 64;
constexpr int64_t kVecsPerBlock = kColBlock / 8;
// k per converted panel: the panel slice a kernel reads (C8 x kKBlock x 8 floats) stays in L1.
constexpr int64_t kKBlock = 256;
// With few rows (decode) the panel is used once, so longer k blocks give each weight row longer
// contiguous reads (better for DRAM streaming); the panel then lives in L2.
constexpr int64_t kKBlockFewRows = 1024;
constexpr int64_t kFewRows = 8;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

float LoadWeight(const void* w, DType dtype, int64_t idx) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(w)[idx];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(w)[idx]);
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(w)[idx]);
    case DType::kI32: break;
  }
  CHECK(false) << "MatMul weight must be F32/F16/BF16";
  return 0.0f;
}

// 8 consecutive weights of one row as f32.
template <DType D>
inline __m256 Load8(const void* w, int64_t idx) {
  if constexpr (D == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + idx)));
  } else if constexpr (D == DType::kBF16) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + idx)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(w) + idx);
  }
}

// In-register 8x8 transpose: r[i] = row i  ->  r[j] = column j.
inline void Transpose8x8(__m256 r[8]) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Converts weight rows [c0, c0 + nc) x k [k0, k0 + kc) into the interleaved f32 panel
// [ceil(nc / 8)][kc][8]: panel[g][i][j] = W[c0 + 8g + j, k0 + i] (zero for rows >= nc).
template <DType D>
void ConvertPanelT(const void* w, int64_t k, int64_t c0, int64_t nc, int64_t k0, int64_t kc,
                   float* panel) {
  const int64_t groups = (nc + 7) / 8;
  for (int64_t g = 0; g < groups; ++g) {
    float* dst = panel + g * kc * 8;
    const int64_t rows = std::min<int64_t>(8, nc - 8 * g);
    int64_t i = 0;
    if (rows == 8) {
      const int64_t base = (c0 + 8 * g) * k + k0;
      for (; i + 8 <= kc; i += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) r[j] = Load8<D>(w, base + j * k + i);
        Transpose8x8(r);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (i + j) * 8, r[j]);
      }
    }
    for (; i < kc; ++i)
      for (int64_t j = 0; j < 8; ++j)
        dst[i * 8 + j] = j < rows ? LoadWeight(w, D, (c0 + 8 * g + j) * k + k0 + i) : 0.0f;
  }
}

void ConvertPanel(const void* w, DType dtype, int64_t k, int64_t c0, int64_t nc, int64_t k0,
                  int64_t kc, float* panel) {
  switch (dtype) {
    case DType::kF16: return ConvertPanelT<DType::kF16>(w, k, c0, nc, k0, kc, panel);
    case DType::kBF16: return ConvertPanelT<DType::kBF16>(w, k, c0, nc, k0, kc, panel);
    case DType::kF32: return ConvertPanelT<DType::kF32>(w, k, c0, nc, k0, kc, panel);
    case DType::kI32: break;
  }
  CHECK(false) << "MatMul weight must be F32/F16/BF16";
}

// acc[r][c] (an 8-lane vector: columns 8c..8c+7 of the tile) += sum over i < kc of
// x[r, i] * panel[c][i][:], one FMA per k in order, so every lane is the same sequential chain.
template <int R, int C>
void MicroKernel(const float* x, int64_t x_stride, const float* panel, int64_t kc, float* acc,
                 int64_t acc_stride) {
  __m256 a[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[r][c] = _mm256_loadu_ps(acc + r * acc_stride + c * 8);
  for (int64_t i = 0; i < kc; ++i) {
    __m256 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(panel + (c * kc + i) * 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * x_stride + i);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(xv, wv[c], a[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + r * acc_stride + c * 8, a[r][c]);
}

using KernelFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);

template <int R, int... Cs>
constexpr std::array<KernelFn, sizeof...(Cs)> KernelRow(std::integer_sequence<int, Cs...>) {
  return {MicroKernel<R, Cs + 1>...};
}

// kKernels[R - 1][C - 1], R in 1..6 rows, C in 1..8 column vectors.
constexpr std::array<std::array<KernelFn, 8>, 6> kKernels = {
    KernelRow<1>(std::make_integer_sequence<int, 8>()), KernelRow<2>(std::make_integer_sequence<int, 8>()),
    KernelRow<3>(std::make_integer_sequence<int, 8>()), KernelRow<4>(std::make_integer_sequence<int, 8>()),
    KernelRow<5>(std::make_integer_sequence<int, 8>()), KernelRow<6>(std::make_integer_sequence<int, 8>())};

// Widest column-vector group for a row group (accumulators + loads fit 16 registers).
int MaxVecs(int rows) { return rows == 1 ? 8 : rows <= 3 ? 4 : 2; }

// Rows per kernel call: 6 while at least 6 remain (the 6x16 kernel), else what remains.
int RowsAt(int64_t remaining) { return static_cast<int>(std::min<int64_t>(6, remaining)); }

// Output columns [c0, c0 + nc) of all n rows. acc: [n][kVecsPerBlock * 8] floats.
void ColumnBlock(const float* x, int64_t n, int64_t k, const void* w, DType dtype, int64_t c0,
                 int64_t nc, const float* bias, float* out, int64_t m, float* panel, float* acc) {
  const int64_t vecs = (nc + 7) / 8;
  const int64_t acc_stride = kVecsPerBlock * 8;
  std::memset(acc, 0, static_cast<size_t>(n * acc_stride) * sizeof(float));
  const int64_t k_block = n <= kFewRows ? kKBlockFewRows : kKBlock;
  for (int64_t k0 = 0; k0 < k; k0 += k_block) {
    const int64_t kc = std::min(k_block, k - k0);
    ConvertPanel(w, dtype, k, c0, nc, k0, kc, panel);
    for (int64_t v = 0; v < vecs;) {
      // Column-vector group sized for full 6-row tiles; smaller row tails reuse the same columns.
      const int cg = static_cast<int>(std::min<int64_t>(MaxVecs(RowsAt(n)), vecs - v));
      for (int64_t r = 0; r < n;) {
        const int rg = RowsAt(n - r);
        // Split the group when this row count allows fewer vectors per call.
        for (int64_t cv = 0; cv < cg;) {
          const int c = std::min(MaxVecs(rg), cg - static_cast<int>(cv));
          kKernels[rg - 1][c - 1](x + r * k + k0, k, panel + (v + cv) * kc * 8, kc,
                                  acc + r * acc_stride + (v + cv) * 8, acc_stride);
          cv += c;
        }
        r += rg;
      }
      v += cg;
    }
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < nc; ++c)
      out[r * m + c0 + c] = acc[r * acc_stride + c] + (bias != nullptr ? bias[c0 + c] : 0.0f);
}

}  // namespace

void ConvertToF32(const void* src, DType dtype, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = LoadWeight(src, dtype, i);
}

void MatMul(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
            const float* bias, float* out, int32_t num_threads) {
  if (n == 0 || m == 0) return;
  const int64_t num_col_blocks = (m + kColBlock - 1) / kColBlock;
  // Small products run on one thread: waking a second one costs more than it saves.
  const int64_t work = n * k * m;
  const int threads = work < (1 << 20) ? 1 : static_cast<int>(std::max<int64_t>(
                                               1, std::min<int64_t>(num_threads, num_col_blocks)));
#pragma omp parallel num_threads(threads)
  {
    std::unique_ptr<float, FreeDeleter> panel(static_cast<float*>(
        std::aligned_alloc(64, static_cast<size_t>(kColBlock * kKBlockFewRows) * sizeof(float))));
    std::unique_ptr<float, FreeDeleter> acc(static_cast<float*>(
        std::aligned_alloc(64, static_cast<size_t>(n * kColBlock) * sizeof(float))));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < num_col_blocks; ++b) {
      const int64_t c0 = b * kColBlock;
      ColumnBlock(x, n, k, w, w_dtype, c0, std::min(kColBlock, m - c0), bias, out, m, panel.get(),
                  acc.get());
    }
  }
}

}  // namespace ember::cpu
