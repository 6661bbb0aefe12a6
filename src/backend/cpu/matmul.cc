#include "backend/cpu/matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "util/half.h"

namespace ember::cpu {
namespace {

// Every output element is the same chain whatever n: an 8-lane accumulator
// acc = fma(x[r, i:i+8], W[c, i:i+8], acc) for i = 0, 8, 16, ... in order (spilled to memory
// between k blocks, which is exact), then a fixed horizontal sum, then the k % 8 tail in order,
// then the bias. Weights are converted 8 at a time straight from the mapping (F16C / bf16 shift)
// inside the kernel: no transposes, so decode streams the weights at memory speed.
constexpr int64_t kColBlock = 64;   // output columns per parallel work item
constexpr int64_t kRowBlock = 128;  // x rows whose accumulators are live across k blocks
constexpr int64_t kKBlock = 1024;   // k per pass when many rows reuse the weight slice
constexpr int64_t kFewRows = 8;     // up to this many rows: one pass over all of k

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

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// acc[r][c] += x[r, 0:len] (.) W[c, 0:len] lane-wise, len a multiple of 8. x rows are x_stride
// apart; W row c starts at element w_idx + c * k.
template <DType D, int R, int C>
void DotKernel(const float* x, int64_t x_stride, const void* w, int64_t w_idx, int64_t k,
               int64_t len, float* acc, int64_t acc_stride) {
  __m256 a[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[r][c] = _mm256_loadu_ps(acc + r * acc_stride + c * 8);
  for (int64_t i = 0; i < len; i += 8) {
    __m256 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      wv[c] = Load8<D>(w, w_idx + c * k + i);
      // Keep operands in registers: folding them into each FMA would load them again per use.
      if constexpr (R > 1) __asm__("" : "+x"(wv[c]));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * x_stride + i);
      if constexpr (C > 1) __asm__("" : "+x"(xv));
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(xv, wv[c], a[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + r * acc_stride + c * 8, a[r][c]);
}

using KernelFn = void (*)(const float*, int64_t, const void*, int64_t, int64_t, int64_t, float*,
                          int64_t);

template <DType D, int R, int... Cs>
constexpr std::array<KernelFn, sizeof...(Cs)> KernelRow(std::integer_sequence<int, Cs...>) {
  return {DotKernel<D, R, Cs + 1>...};
}

template <DType D>
constexpr std::array<std::array<KernelFn, 8>, 4> KernelTable() {
  return {KernelRow<D, 1>(std::make_integer_sequence<int, 8>()),
          KernelRow<D, 2>(std::make_integer_sequence<int, 8>()),
          KernelRow<D, 3>(std::make_integer_sequence<int, 8>()),
          KernelRow<D, 4>(std::make_integer_sequence<int, 8>())};
}

constexpr auto kF32Kernels = KernelTable<DType::kF32>();
constexpr auto kF16Kernels = KernelTable<DType::kF16>();
constexpr auto kBF16Kernels = KernelTable<DType::kBF16>();

// Widest column group for a row group (accumulators + loads within 16 registers).
int MaxCols(int rows) { return rows == 1 ? 8 : rows == 2 ? 4 : 3; }
constexpr int kRowGroup = 4;  // 4 rows x 3 columns: 12 FMAs per 7 loads

// Weight rows [c0, c0 + nc) x k [k0, k0 + len) as a row-major f32 panel [nc][len]: the exact
// values the kernel would convert itself, converted once for all rows of a prefill.
template <DType D>
void ConvertPanel(const void* w, int64_t k, int64_t c0, int64_t nc, int64_t k0, int64_t len,
                  float* panel) {
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t i = 0; i < len; i += 8)
      _mm256_storeu_ps(panel + c * len + i, Load8<D>(w, (c0 + c) * k + k0 + i));
}

// Output columns [c0, c0 + nc) of all n rows. acc: [kRowBlock][kColBlock][8] floats.
void ColumnBlock(const float* x, int64_t n, int64_t k, const void* w, DType dtype, int64_t c0,
                 int64_t nc, const float* bias, float* out, int64_t m, float* acc, float* panel) {
  // Few rows: read the weights straight from the mapping. Many rows: convert a [nc, kKBlock]
  // slice once into an f32 panel shared by all of them (f32 weights are used as they are).
  const bool few = n <= kFewRows;
  const bool use_panel = !few && dtype != DType::kF32;
  const DType kernel_dtype = use_panel ? DType::kF32 : dtype;
  const auto& kernels = kernel_dtype == DType::kF16    ? kF16Kernels
                        : kernel_dtype == DType::kBF16 ? kBF16Kernels
                                                       : kF32Kernels;
  const int64_t k8 = k - k % 8;
  const int64_t acc_stride = kColBlock * 8;
  const int64_t k_block = few ? std::max<int64_t>(k8, 8) : kKBlock;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t nr = std::min(kRowBlock, n - r0);
    std::memset(acc, 0, static_cast<size_t>(nr * acc_stride) * sizeof(float));
    for (int64_t k0 = 0; k0 < k8; k0 += k_block) {
      const int64_t len = std::min(k_block, k8 - k0);
      const void* wsrc = w;
      int64_t w_base = c0 * k + k0, w_stride = k;
      if (use_panel) {
        if (dtype == DType::kF16) ConvertPanel<DType::kF16>(w, k, c0, nc, k0, len, panel);
        else ConvertPanel<DType::kBF16>(w, k, c0, nc, k0, len, panel);
        wsrc = panel;
        w_base = 0;
        w_stride = len;
      }
      for (int64_t r = 0; r < nr;) {
        const int rg = static_cast<int>(std::min<int64_t>(kRowGroup, nr - r));
        for (int64_t c = 0; c < nc;) {
          const int cg = static_cast<int>(std::min<int64_t>(MaxCols(rg), nc - c));
          kernels[rg - 1][cg - 1](x + (r0 + r) * k + k0, k, wsrc, w_base + c * w_stride, w_stride,
                                  len, acc + r * acc_stride + c * 8, acc_stride);
          c += cg;
        }
        r += rg;
      }
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t row = r0 + r;
      for (int64_t c = 0; c < nc; ++c) {
        const int64_t col = c0 + c;
        float s = HorizontalSum(_mm256_loadu_ps(acc + r * acc_stride + c * 8));
        for (int64_t kk = k8; kk < k; ++kk) s += x[row * k + kk] * LoadWeight(w, dtype, col * k + kk);
        if (bias != nullptr) s += bias[col];
        out[row * m + col] = s;
      }
    }
  }
}

}  // namespace

void ConvertToF32(const void* src, DType dtype, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = LoadWeight(src, dtype, i);
}

void MatMul(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
            const float* bias, float* out, int32_t num_threads) {
  if (n == 0 || m == 0) return;
  CHECK(w_dtype == DType::kF32 || w_dtype == DType::kF16 || w_dtype == DType::kBF16)
      << "MatMul weight must be F32/F16/BF16";
  const int64_t num_col_blocks = (m + kColBlock - 1) / kColBlock;
  // Small products run on one thread: waking a second one costs more than it saves.
  const int64_t work = n * k * m;
  const int threads = work < (1 << 20) ? 1 : static_cast<int>(std::max<int64_t>(
                                               1, std::min<int64_t>(num_threads, num_col_blocks)));
#pragma omp parallel num_threads(threads)
  {
    std::unique_ptr<float, FreeDeleter> acc(static_cast<float*>(std::aligned_alloc(
        64, static_cast<size_t>(std::min(kRowBlock, n) * kColBlock * 8) * sizeof(float))));
    std::unique_ptr<float, FreeDeleter> panel(static_cast<float*>(std::aligned_alloc(
        64, static_cast<size_t>(n > kFewRows ? kColBlock * kKBlock : 16) * sizeof(float))));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < num_col_blocks; ++b) {
      const int64_t c0 = b * kColBlock;
      ColumnBlock(x, n, k, w, w_dtype, c0, std::min(kColBlock, m - c0), bias, out, m, acc.get(),
                  panel.get());
    }
  }
}

}  // namespace ember::cpu
