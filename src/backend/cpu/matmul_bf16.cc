#include "backend/cpu/matmul_bf16.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <utility>

#include "backend/cpu/avx512_widen.h"
#include "backend/cpu/thread_scratch.h"
#include "util/check.h"

// GCC 12's AVX-512 intrinsics pass an undefined vector as their (ignored) merge source, which
// -Wuninitialized reports once they are inlined into target("avx512f") functions.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Compiled for AVX-512 whatever the build's -march: only called when HasBf16Dot() says the CPU
// runs it.
#define EMBER_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

namespace ember::cpu {
namespace {

constexpr int64_t kStep = 32;  // bf16 values per 512-bit register: one VDPBF16PS
constexpr int kTileRows = 4;   // register tile: 4 rows x 6 columns = 24 accumulators
constexpr int kTileCols = 6;
// Weight bytes (as bf16) a column block keeps in the core's L2 while every row group passes.
constexpr int64_t kBlockWeightBytes = int64_t{384} << 10;

// Per-thread scratch (thread_scratch.h): x rounded to bf16, and a block's bf16 weight panel.
struct RowsTag;
struct PanelTag;
template <typename Tag>
uint16_t* Scratch(size_t count) {
  return reinterpret_cast<uint16_t*>(
      ThreadScratch<Tag>(std::max<size_t>(count, 32) * sizeof(uint16_t)));
}

EMBER_BF16_TARGET inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xffff)
                         : remaining <= 0 ? __mmask16(0) : __mmask16((1u << remaining) - 1);
}

// Elements [offset, offset + k) of `src` rounded to bf16 (nearest even) into dst[0, kp), zeros
// past k. bf16 sources come out unchanged.
template <DType D>
EMBER_BF16_TARGET void RowToBf16(const void* src, int64_t offset, int64_t k, int64_t kp,
                                 uint16_t* dst) {
  for (int64_t i = 0; i < kp; i += kStep) {
    const __m512 lo = Widen16<D>(src, offset + i, TailMask(k - i));
    const __m512 hi = Widen16<D>(src, offset + i + 16, TailMask(k - i - 16));
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

using RowFn = void (*)(const void*, int64_t, int64_t, int64_t, uint16_t*);
RowFn RowConverter(DType dtype) {
  return dtype == DType::kF16 ? RowToBf16<DType::kF16>
         : dtype == DType::kBF16 ? RowToBf16<DType::kBF16>
                                 : RowToBf16<DType::kF32>;
}

// The fixed horizontal sum: halves, quarters, then pairs, then the last two.
EMBER_BF16_TARGET inline float HorizontalSum(__m512 v) {
  const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// 32 weights of a row from element idx as bf16: bf16 as stored, f16/f32 rounded as RowToBf16
// rounds them (the same instructions, so a panel and an inline conversion agree bit for bit).
// Masked: only `remaining` (< 32) are read, the rest are 0.
template <DType D, bool Masked>
EMBER_BF16_TARGET inline __m512bh LoadW32(const void* w, int64_t idx, int64_t remaining) {
  if constexpr (D == DType::kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(w) + idx;
    if constexpr (Masked) {
      const __mmask32 mask = remaining <= 0 ? 0 : (uint32_t{1} << remaining) - 1;
      return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, p));
    } else {
      return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
    }
  } else {
    const __mmask16 m0 = Masked ? TailMask(remaining) : __mmask16(0xffff);
    const __mmask16 m1 = Masked ? TailMask(remaining - 16) : __mmask16(0xffff);
    return _mm512_cvtne2ps_pbh(Widen16<D>(w, idx + 16, m1), Widen16<D>(w, idx, m0));
  }
}

// One 32-wide step of an R x C tile at k offset i.
template <int R, int C, DType D, bool Masked>
EMBER_BF16_TARGET inline void TileStep(const uint16_t* x, int64_t x_stride, const void* w,
                                       int64_t w_idx, int64_t w_stride, int64_t i, int64_t k,
                                       __m512 (&acc)[R][C]) {
  __m512bh xv[R];
  for (int r = 0; r < R; ++r)
    xv[r] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + r * x_stride + i));
  for (int c = 0; c < C; ++c) {
    const __m512bh wv = LoadW32<D, Masked>(w, w_idx + c * w_stride + i, k - i);
    for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv);
  }
}

// R rows x C columns over the whole k (zero-padded to kp): out[r, c] =
// hsum(sum over 32-steps of x[r, i:i+32] . w[c, i:i+32]) (+ bias[c]). x is bf16 [R, x_stride];
// column c's weights start at element w_idx + c * w_stride of w (dtype D).
template <int R, int C, DType D>
EMBER_BF16_TARGET void Tile(const uint16_t* x, int64_t x_stride, const void* w, int64_t w_idx,
                            int64_t w_stride, int64_t k, int64_t kp, float* out,
                            int64_t out_stride, const float* bias) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t full = k / kStep * kStep;
  for (int64_t i = 0; i < full; i += kStep)
    TileStep<R, C, D, false>(x, x_stride, w, w_idx, w_stride, i, k, acc);
  if (full < kp) TileStep<R, C, D, true>(x, x_stride, w, w_idx, w_stride, full, k, acc);
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = HorizontalSum(acc[r][c]);
      if (bias != nullptr) s += bias[c];
      out[r * out_stride + c] = s;
    }
  }
}

using TileFn = void (*)(const uint16_t*, int64_t, const void*, int64_t, int64_t, int64_t, int64_t,
                        float*, int64_t, const float*);
using TileTable = std::array<std::array<TileFn, kTileCols>, kTileRows>;
template <int R, DType D, int... Cs>
constexpr std::array<TileFn, sizeof...(Cs)> TileRow(std::integer_sequence<int, Cs...>) {
  return {Tile<R, Cs + 1, D>...};
}
template <DType D>
constexpr TileTable MakeTiles() {
  constexpr auto cols = std::make_integer_sequence<int, kTileCols>();
  return {TileRow<1, D>(cols), TileRow<2, D>(cols), TileRow<3, D>(cols), TileRow<4, D>(cols)};
}
constexpr TileTable kBf16Tiles = MakeTiles<DType::kBF16>();
constexpr TileTable kF16Tiles = MakeTiles<DType::kF16>();
constexpr TileTable kF32Tiles = MakeTiles<DType::kF32>();

struct Problem {
  const uint16_t* xb;  // x in bf16, [n, kp]
  int64_t n, k, kp;
  const void* w;
  DType dtype;
  int64_t m;
  const float* bias;
  float* out;
};

// Output columns [c0, c0 + nc) of every row. The weights are read where they are (converted in
// the kernel) for bf16 and for a single row group; otherwise f16/f32 weights are converted once
// into a bf16 [nc, kp] panel that every row group shares.
void ColumnBlock(const Problem& p, int64_t c0, int64_t nc) {
  const TileTable* tiles = &kBf16Tiles;
  const void* w = p.w;
  int64_t w_idx = c0 * p.k, w_stride = p.k, k = p.k;
  if (p.dtype != DType::kBF16 && p.n <= kTileRows) {
    tiles = p.dtype == DType::kF16 ? &kF16Tiles : &kF32Tiles;
  } else if (p.dtype != DType::kBF16) {
    uint16_t* panel = Scratch<PanelTag>(static_cast<size_t>(nc * p.kp));
    const RowFn convert = RowConverter(p.dtype);
    for (int64_t c = 0; c < nc; ++c) convert(p.w, (c0 + c) * p.k, p.k, p.kp, panel + c * p.kp);
    w = panel;
    w_idx = 0;
    w_stride = k = p.kp;
  }
  for (int64_t r = 0; r < p.n; r += kTileRows) {
    const int rg = static_cast<int>(std::min<int64_t>(kTileRows, p.n - r));
    for (int64_t c = 0; c < nc; c += kTileCols) {
      const int cg = static_cast<int>(std::min<int64_t>(kTileCols, nc - c));
      (*tiles)[rg - 1][cg - 1](p.xb + r * p.kp, p.kp, w, w_idx + c * w_stride, w_stride, k, p.kp,
                               p.out + r * p.m + c0 + c, p.m,
                               p.bias != nullptr ? p.bias + c0 + c : nullptr);
    }
  }
}

}  // namespace

bool HasBf16Dot() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

void MatMulBf16(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                const float* bias, float* out, ThreadPool& pool) {
  CHECK(HasBf16Dot()) << "MatMulBf16 needs AVX512_BF16";
  CHECK(w_dtype == DType::kF32 || w_dtype == DType::kF16 || w_dtype == DType::kBF16)
      << "MatMulBf16 weight must be F32/F16/BF16";
  if (n == 0 || m == 0) return;
  const int64_t kp = (k + kStep - 1) / kStep * kStep;
  // Small products run on the calling thread: waking another costs more than it saves.
  const int max_threads = n * k * m < (1 << 20) ? 1 : pool.num_threads();
  uint16_t* xb = Scratch<RowsTag>(static_cast<size_t>(n * kp));
  pool.ParallelFor(
      n, [&](int64_t r, int) { RowToBf16<DType::kF32>(x, r * k, k, kp, xb + r * kp); },
      max_threads);
  // Column blocks whose bf16 weights stay in L2, in whole tiles, and at least two per thread.
  int64_t col_block = std::max<int64_t>(kTileCols, kBlockWeightBytes / (kp * 2)) / kTileCols *
                      kTileCols;
  while (col_block > kTileCols && (m + col_block - 1) / col_block < 2 * max_threads)
    col_block = std::max<int64_t>(kTileCols, col_block / 2 / kTileCols * kTileCols);
  const Problem p{xb, n, k, kp, w, w_dtype, m, bias, out};
  pool.ParallelFor(
      (m + col_block - 1) / col_block,
      [&](int64_t b, int) {
        const int64_t c0 = b * col_block;
        ColumnBlock(p, c0, std::min(col_block, m - c0));
      },
      max_threads);
}

}  // namespace ember::cpu
