#include "backend/cpu/matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "util/half.h"

namespace ember::cpu {
namespace {

constexpr int64_t kColBlock = 24;  // weight rows per panel (multiple of every kernel width)
constexpr int64_t kKBlock = 512;   // k per panel
constexpr int64_t kRowBlock = 96;  // x rows whose accumulators stay live across k blocks

// Converts w[row0 .. row0+rows, k0 .. k0+kc) to f32 panel [rows, kc] (kc multiple of 8 except
// possibly the final block, whose tail is written too).
void ConvertPanel(const void* w, DType dtype, int64_t k, int64_t row0, int64_t rows, int64_t k0,
                  int64_t kc, float* panel) {
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = panel + r * kc;
    const int64_t off = (row0 + r) * k + k0;
    int64_t i = 0;
    switch (dtype) {
      case DType::kF32: {
        std::memcpy(dst, static_cast<const float*>(w) + off, static_cast<size_t>(kc) * 4);
        i = kc;
        break;
      }
      case DType::kF16: {
        const uint16_t* src = static_cast<const uint16_t*>(w) + off;
        for (; i + 8 <= kc; i += 8)
          _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                        reinterpret_cast<const __m128i*>(src + i))));
        for (; i < kc; ++i) dst[i] = F16ToF32(src[i]);
        break;
      }
      case DType::kBF16: {
        const uint16_t* src = static_cast<const uint16_t*>(w) + off;
        for (; i + 8 <= kc; i += 8) {
          __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
          _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        for (; i < kc; ++i) dst[i] = Bf16ToF32(src[i]);
        break;
      }
      case DType::kI32:
        CHECK(false) << "MatMul weight must be F32/F16/BF16";
    }
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);                       // 4 lanes
  __m128 shuf = _mm_movehdup_ps(lo);
  __m128 sums = _mm_add_ps(lo, shuf);
  shuf = _mm_movehl_ps(shuf, sums);
  sums = _mm_add_ss(sums, shuf);
  return _mm_cvtss_f32(sums);
}

// acc[r][c] (+)= x[r, 0:kc8] . panel[c, 0:kc8], kc8 a multiple of 8.
template <int R, int C>
inline void MicroKernel(const float* x, int64_t x_stride, const float* panel, int64_t panel_stride,
                        int64_t kc8, __m256* acc_mem) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = acc_mem[r * C + c];
  for (int64_t i = 0; i < kc8; i += 8) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(panel + c * panel_stride + i);
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * x_stride + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc_mem[r * C + c] = acc[r][c];
}

using KernelFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, __m256*);

template <int R>
KernelFn PickKernel(int c) {
  switch (c) {
    case 1: return MicroKernel<R, 1>;
    case 2: return MicroKernel<R, 2>;
    case 3: return MicroKernel<R, 3>;
    case 4: return MicroKernel<R, 4>;
    case 6: return MicroKernel<R, 6>;
    case 8: return MicroKernel<R, 8>;
  }
  return nullptr;
}

// Widest column group for a row group of r rows (keeps accumulators within 16 registers).
int ColGroupFor(int r) { return r == 1 ? 8 : r == 2 ? 6 : 3; }

KernelFn Kernel(int r, int c) {
  switch (r) {
    case 1: return PickKernel<1>(c);
    case 2: return PickKernel<2>(c);
    case 3: return PickKernel<3>(c);
    case 4: return PickKernel<4>(c);
  }
  return nullptr;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// One column block [c0, c0 + nc) for all n rows.
void ColumnBlock(const float* x, int64_t n, int64_t k, const void* w, DType dtype, int64_t c0,
                 int64_t nc, const float* bias, float* out, int64_t m, float* panel,
                 __m256* accs) {
  const int64_t k8 = k - k % 8;
  for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int64_t nr = std::min(kRowBlock, n - r0);
    for (int64_t i = 0; i < nr * nc; ++i) accs[i] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < k8; k0 += kKBlock) {
      const int64_t kc = std::min(kKBlock, k8 - k0);
      ConvertPanel(w, dtype, k, c0, nc, k0, kc, panel);
      for (int64_t r = 0; r < nr;) {
        const int rg = static_cast<int>(std::min<int64_t>(4, nr - r));
        const int cg_max = ColGroupFor(rg);
        for (int64_t c = 0; c < nc;) {
          int cg = static_cast<int>(std::min<int64_t>(cg_max, nc - c));
          if (cg == 5) cg = 4;
          if (cg == 7) cg = 6;
          // Accumulators of (row r.., col c..) live at accs[(r * nc + c) ...] as an R x C tile.
          __m256* tile = accs + (r * nc) + c * rg;  // unique per (r-group, c) within this block
          Kernel(rg, cg)(x + (r0 + r) * k + k0, k, panel + c * kc, kc, kc, tile);
          c += cg;
        }
        r += rg;
      }
    }
    // Finish: horizontal sums, scalar k tail, bias.
    for (int64_t r = 0; r < nr;) {
      const int rg = static_cast<int>(std::min<int64_t>(4, nr - r));
      const int cg_max = ColGroupFor(rg);
      for (int64_t c = 0; c < nc;) {
        int cg = static_cast<int>(std::min<int64_t>(cg_max, nc - c));
        if (cg == 5) cg = 4;
        if (cg == 7) cg = 6;
        __m256* tile = accs + (r * nc) + c * rg;
        for (int rr = 0; rr < rg; ++rr) {
          for (int cc = 0; cc < cg; ++cc) {
            const int64_t row = r0 + r + rr, col = c0 + c + cc;
            float s = HorizontalSum(tile[rr * cg + cc]);
            for (int64_t kk = k8; kk < k; ++kk) {
              float wv = 0.0f;
              if (dtype == DType::kF32) wv = static_cast<const float*>(w)[col * k + kk];
              else if (dtype == DType::kF16) wv = F16ToF32(static_cast<const uint16_t*>(w)[col * k + kk]);
              else wv = Bf16ToF32(static_cast<const uint16_t*>(w)[col * k + kk]);
              s += x[row * k + kk] * wv;
            }
            if (bias != nullptr) s += bias[col];
            out[row * m + col] = s;
          }
        }
        c += cg;
      }
      r += rg;
    }
  }
}

}  // namespace

void ConvertToF32(const void* src, DType dtype, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF32: dst[i] = static_cast<const float*>(src)[i]; break;
      case DType::kF16: dst[i] = F16ToF32(static_cast<const uint16_t*>(src)[i]); break;
      case DType::kBF16: dst[i] = Bf16ToF32(static_cast<const uint16_t*>(src)[i]); break;
      case DType::kI32: CHECK(false) << "ConvertToF32 of I32";
    }
  }
}

void MatMul(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
            const float* bias, float* out, int32_t num_threads) {
  if (n == 0 || m == 0) return;
  const int64_t num_col_blocks = (m + kColBlock - 1) / kColBlock;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, num_col_blocks)));
#pragma omp parallel num_threads(threads)
  {
    const int64_t kc_max = std::min(kKBlock, std::max<int64_t>(8, k));
    std::unique_ptr<float, AlignedFree> panel(static_cast<float*>(
        std::aligned_alloc(64, static_cast<size_t>(kColBlock * kc_max) * sizeof(float))));
    // Accumulator tiles (one 8-float vector per output element of a row block).
    std::unique_ptr<float, AlignedFree> accs(static_cast<float*>(std::aligned_alloc(
        64, static_cast<size_t>(std::min(kRowBlock, n) * kColBlock) * 8 * sizeof(float))));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < num_col_blocks; ++b) {
      const int64_t c0 = b * kColBlock;
      ColumnBlock(x, n, k, w, w_dtype, c0, std::min(kColBlock, m - c0), bias, out, m, panel.get(),
                  reinterpret_cast<__m256*>(accs.get()));
    }
  }
}

}  // namespace ember::cpu
