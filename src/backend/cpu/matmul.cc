#include "backend/cpu/matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/cpu/thread_scratch.h"
#include "util/half.h"

namespace ember::cpu {
namespace {

// Every output element is the same chain whatever n and whatever the thread count:
//   s = 0
//   for each k chunk [c, c + kKChunk) of the first k - k % 8 elements, in order:
//     acc = 0 (8 lanes); acc = fma(x[r, i:i+8], W[col, i:i+8], acc) for i = c, c + 8, ...
//     s += HorizontalSum(acc)            (fixed tree: halves, then pairs, then the last two)
//   s += x[r, i] * W[col, i] for the k % 8 tail in order
//   s += bias[col]
// Chunking k keeps every accumulator in a register for the whole chunk: the running sum is one
// float per output (held in `out` between chunks), so the prefill blocking needs no spill
// array, and decode and prefill read the weights in the same order.
constexpr int64_t kKChunk = 512;    // k elements per accumulator chunk (part of the chain)
constexpr int64_t kColBlock = 64;   // output columns per parallel work item (decode)
// Prefill: output columns per work item. Each packed 4-row x chunk (8 KB, from L3) serves this
// many columns before the next one is fetched, and the f32 panel (256 x 512 floats, 512 KB)
// stays in the core's L2; with 64 columns the whole packed x was re-read once per 64 columns.
constexpr int64_t kPanelColBlock = 256;
constexpr int64_t kFewRows = 8;     // up to this many rows: weights converted in the kernel
constexpr int kRowGroup = 4;        // prefill register tile: 4 rows x kPanelCols columns

// Per-thread scratch (thread_scratch.h): the pool's threads live as long as the backend, so calls
// reuse it instead of allocating (a per-call 128 KB malloc is an mmap + page faults, which
// dominated small models' prefill).
struct PanelTag;
struct PackedXTag;
template <typename Tag>
float* Scratch(size_t count) {
  return reinterpret_cast<float*>(ThreadScratch<Tag>(std::max<size_t>(count, 16) * sizeof(float)));
}

// Inside this file DType::kU8 weights are MXFP4: w points at an Mxfp4Matrix (MatMulMxfp4).
constexpr DType kMxfp4 = DType::kU8;

// 2^(s - 127) as one float for scale bytes s < 255 (s = 0: the subnormal 2^-127). An E2M1 value
// times it is exact wherever the result is finite (at most two significant bits, at least
// 2^-128), so one product equals ldexp. 2^128 (s = 255) is no float: there the magnitudes are
// doubled (exactly) and the entry is 2^127.
const std::array<float, 256> kMxfp4Pow2 = [] {
  std::array<float, 256> t{};
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t bits = s == 0 ? 0x00400000u : std::min<uint32_t>(s, 254) << 23;
    std::memcpy(&t[s], &bits, 4);
  }
  return t;
}();

// A block of 32 MXFP4 weights' scale: the E2M1 magnitude table and the multiplier.
struct Mxfp4Block {
  __m256 magnitudes;
  __m256 scale;
};
alignas(32) constexpr float kE2M1Magnitudes[2][8] = {
    {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f},
    {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f, 12.0f}};
inline Mxfp4Block Mxfp4BlockOf(int s) {
  return {_mm256_load_ps(kE2M1Magnitudes[s == 255]),
          _mm256_set1_ps(kMxfp4Pow2[static_cast<size_t>(s)])};
}

// The 8 weights of 4 packed bytes (low nibble first) under their block's scale.
inline __m256 Mxfp4Values(const uint8_t* packed_bytes, const Mxfp4Block& block) {
  uint32_t packed;
  std::memcpy(&packed, packed_bytes, 4);
  // Lane j holds nibble j in its low 4 bits (higher bits: later nibbles): the permute reads the
  // low 3 (the magnitude), bit 3 shifted to bit 31 is the sign.
  const __m256i codes = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed)),
                                          _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  const __m256 magnitude = _mm256_permutevar8x32_ps(block.magnitudes, codes);
  const __m256 sign = _mm256_castsi256_ps(_mm256_and_si256(
      _mm256_slli_epi32(codes, 28), _mm256_set1_epi32(static_cast<int>(0x80000000u))));
  return _mm256_mul_ps(_mm256_or_ps(magnitude, sign), block.scale);
}

float LoadWeight(const void* w, DType dtype, int64_t idx) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(w)[idx];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(w)[idx]);
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(w)[idx]);
    case DType::kI32:
    case DType::kU8:  // (MXFP4 has no k % 8 tail: MatMulMxfp4 takes k % 32 == 0)
    case DType::kQ8_0:  // (block-quantized weights go to MatMulQuant)
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  CHECK(false) << "MatMul weight must be F32/F16/BF16";
  return 0.0f;
}

// 8 consecutive weights of one row as f32 (MXFP4: idx % 8 == 0).
template <DType D>
inline __m256 Load8(const void* w, int64_t idx) {
  if constexpr (D == kMxfp4) {
    const auto* mx = static_cast<const Mxfp4Matrix*>(w);
    const int s = mx->scales[idx / 32];
    if (s != 255) [[likely]] {  // the plain table: a constant the caller's loop keeps
      return Mxfp4Values(mx->blocks + idx / 2,
                         {_mm256_load_ps(kE2M1Magnitudes[0]), _mm256_set1_ps(kMxfp4Pow2[s])});
    }
    return Mxfp4Values(mx->blocks + idx / 2, Mxfp4BlockOf(s));
  } else if constexpr (D == DType::kF16) {
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

// sums[r * sums_stride + c] += HorizontalSum(x[r, 0:len] (.) W[c, 0:len]) for an R x C tile, len
// a multiple of 8 (one k chunk). x rows are x_stride apart; W row c starts at element
// w_idx + c * w_stride. With one x row (decode: C weight rows streamed at once) each row's cache
// line kDecodePrefetchBytes ahead is prefetched once per line, and past a row's end the
// prefetches go on into the next column group's rows. Why: each measured faster decode on the
// AVX-512 box, with 4 KB and with 2 MB page-cache folios (docs/perf.md; on a Zen 3 box
// prefetching measured slower).
// Prefetches change no value, and one past the end of the mapping is dropped, not faulted.
constexpr int64_t kDecodePrefetchBytes = 1024;
template <DType D, int R, int C>
void DotKernel(const float* x, int64_t x_stride, const void* w, int64_t w_idx, int64_t w_stride,
               int64_t len, float* sums, int64_t sums_stride) {
  // Weights per 64-byte line (a multiple of the 8 per step), and element idx's byte address.
  constexpr int64_t kLineElems = D == DType::kF32 ? 16 : D == kMxfp4 ? 128 : 32;
  const char* bytes =
      D == kMxfp4 ? reinterpret_cast<const char*>(static_cast<const Mxfp4Matrix*>(w)->blocks)
                  : static_cast<const char*>(w);
  auto address = [&](int64_t idx) { return bytes + idx * 64 / kLineElems; };
  __m256 a[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[r][c] = _mm256_setzero_ps();
  // Where the prefetch distance runs past the end of the rows, it targets the same rows of the
  // next column group (C rows on), which the caller reads next, instead of rows this group is
  // already streaming.
  constexpr int64_t kAheadElems = kDecodePrefetchBytes / 64 * kLineElems;
  const int64_t row_pos = R == 1 ? w_idx % w_stride : 0;
  // Decode with MXFP4 weights steps a scale block (32) at a time: each column's scale is read
  // once per block, and its 4 groups of 8 go through the chain in order, as the 8-step does.
  constexpr bool kMxDecode = D == kMxfp4 && R == 1;
  for (int64_t i = 0; i < len; i += kMxDecode ? 32 : 8) {
    __m256 wv[C];
    if constexpr (R == 1) {
      if (i % kLineElems == 0) {
        const int64_t ahead =
            i + kAheadElems + (row_pos + i + kAheadElems >= w_stride ? (C - 1) * w_stride : 0);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          _mm_prefetch(address(w_idx + c * w_stride + ahead), _MM_HINT_T0);
        }
      }
    }
    if constexpr (kMxDecode) {
      const auto* mx = static_cast<const Mxfp4Matrix*>(w);
      __m256 xv[4];
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) xv[q] = _mm256_loadu_ps(x + i + 8 * q);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const int64_t idx = w_idx + c * w_stride + i;
        const Mxfp4Block block = Mxfp4BlockOf(mx->scales[idx / 32]);
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q)
          a[0][c] =
              _mm256_fmadd_ps(xv[q], Mxfp4Values(mx->blocks + idx / 2 + 4 * q, block), a[0][c]);
      }
      continue;
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      wv[c] = Load8<D>(w, w_idx + c * w_stride + i);
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
    for (int c = 0; c < C; ++c) sums[r * sums_stride + c] += HorizontalSum(a[r][c]);
}

// The prefill tile: like DotKernel<kF32, R, C> but both operands are packed into single
// contiguous streams: x rows laid out [len / 8][R][8] (element (r, i) at xp[i * R + r * 8]) and
// W from an f32 panel tile laid out [len / 8][C][8] (element (c, i) at panel[i * C + c * 8]).
template <int R, int C>
void PanelKernel(const float* xp, const float* panel, int64_t len, float* sums,
                 int64_t sums_stride) {
  __m256 a[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[r][c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < len; i += 8) {
    __m256 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      wv[c] = _mm256_load_ps(panel + i * C + c * 8);
      if constexpr (R > 1) __asm__("" : "+x"(wv[c]));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_load_ps(xp + i * R + r * 8);
      if constexpr (C > 1) __asm__("" : "+x"(xv));
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(xv, wv[c], a[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) sums[r * sums_stride + c] += HorizontalSum(a[r][c]);
}

// x rows [r0, r0 + rows) over k [0, k8) packed as [k8 / 8][rows][8] (PanelKernel's layout).
void PackRows(const float* x, int64_t k, int64_t r0, int64_t rows, int64_t k8, float* xp) {
  for (int64_t i = 0; i < k8; i += 8)
    for (int64_t r = 0; r < rows; ++r)
      _mm256_store_ps(xp + i * rows + r * 8, _mm256_loadu_ps(x + (r0 + r) * k + i));
}

using PanelFn = void (*)(const float*, const float*, int64_t, float*, int64_t);
template <int R>
constexpr std::array<PanelFn, 4> PanelRow() {
  return {PanelKernel<R, 1>, PanelKernel<R, 2>, PanelKernel<R, 3>, PanelKernel<R, 4>};
}
constexpr std::array<std::array<PanelFn, 4>, 4> kPanelTiles = {PanelRow<1>(), PanelRow<2>(),
                                                               PanelRow<3>(), PanelRow<4>()};

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

using KernelTableT = std::array<std::array<KernelFn, 8>, 4>;
constexpr KernelTableT kF32Kernels = KernelTable<DType::kF32>();
constexpr KernelTableT kF16Kernels = KernelTable<DType::kF16>();
constexpr KernelTableT kBF16Kernels = KernelTable<DType::kBF16>();
constexpr KernelTableT kMxfp4Kernels = KernelTable<kMxfp4>();

// Widest column group for a row group (accumulators + loads within 16 registers).
int MaxCols(int rows) { return rows == 1 ? 8 : rows == 2 ? 4 : 3; }

// Weight rows [c0, c0 + nc) x k [k0, k0 + len) as f32 panel tiles of kPanelCols columns, tile t
// at panel + t * kPanelCols * len laid out [len / 8][cols of the tile][8]: the exact values the
// kernel would convert itself, converted once for all rows of a prefill. With AVX-512VL's 32
// vector registers the tile is 4 x 4 (16 accumulators, and 256-column blocks end without a
// narrower tile); AVX2's 16 registers hold 4 x 3. The tile shape changes no output's chain.
#ifdef __AVX512VL__
constexpr int kPanelCols = 4;
#else
constexpr int kPanelCols = 3;
#endif
template <DType D>
void ConvertPanel(const void* w, int64_t k, int64_t c0, int64_t nc, int64_t k0, int64_t len,
                  float* panel) {
  for (int64_t t0 = 0; t0 < nc; t0 += kPanelCols) {
    const int64_t cols = std::min<int64_t>(kPanelCols, nc - t0);
    float* tile = panel + t0 * len;
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t i = 0; i < len; i += 8)
        _mm256_store_ps(tile + i * cols + c * 8, Load8<D>(w, (c0 + t0 + c) * k + k0 + i));
  }
}

// Output columns [c0, c0 + nc) of all n rows. Prefill only: xp is x packed by PackRows in groups
// of kRowGroup rows (group g at xp + g * kRowGroup * k8), panel [kPanelColBlock * kKChunk] floats.
void ColumnBlock(const float* x, const float* xp, int64_t n, int64_t k, const void* w, DType dtype,
                 int64_t c0, int64_t nc, const float* bias, float* out, int64_t m, float* panel) {
  const int64_t k8 = k - k % 8;
  for (int64_t r = 0; r < n; ++r) std::fill_n(out + r * m + c0, nc, 0.0f);
  if (n <= kFewRows) {
    // Few rows: read the weights straight from the mapping, one column group at a time so each
    // weight row is one sequential stream.
    const KernelTableT& kernels = dtype == DType::kF16    ? kF16Kernels
                                  : dtype == DType::kBF16 ? kBF16Kernels
                                  : dtype == kMxfp4       ? kMxfp4Kernels
                                                          : kF32Kernels;
    const int rows = static_cast<int>(n);
    for (int64_t r = 0; r < n;) {
      const int rg = std::min(kRowGroup, rows - static_cast<int>(r));
      for (int64_t c = 0; c < nc;) {
        const int cg = static_cast<int>(std::min<int64_t>(MaxCols(rg), nc - c));
        for (int64_t k0 = 0; k0 < k8; k0 += kKChunk)
          kernels[rg - 1][cg - 1](x + r * k + k0, k, w, (c0 + c) * k + k0, k,
                                  std::min(kKChunk, k8 - k0), out + r * m + c0 + c, m);
        c += cg;
      }
      r += rg;
    }
  } else {
    // Many rows: convert a [nc, kKChunk] weight slice once into an f32 panel (L2-resident) shared
    // by all rows; each 4x3 tile's operands (8 KB of x, 6 KB of panel) stay in L1.
    for (int64_t k0 = 0; k0 < k8; k0 += kKChunk) {
      const int64_t len = std::min(kKChunk, k8 - k0);
      const auto convert = dtype == DType::kF16    ? ConvertPanel<DType::kF16>
                           : dtype == DType::kBF16 ? ConvertPanel<DType::kBF16>
                           : dtype == kMxfp4       ? ConvertPanel<kMxfp4>
                                                   : ConvertPanel<DType::kF32>;
      convert(w, k, c0, nc, k0, len, panel);
      for (int64_t r = 0; r < n; r += kRowGroup) {
        const int rg = static_cast<int>(std::min<int64_t>(kRowGroup, n - r));
        // The next row group's packed x chunk (rg * len floats, contiguous) comes from L3: fetch
        // it a few lines per tile while this group's tiles run from L1/L2.
        const int64_t next_rg = std::min<int64_t>(kRowGroup, n - r - rg);
        const char* next_x = reinterpret_cast<const char*>(xp + (r + rg) * k8 + k0 * next_rg);
        const int64_t next_lines = next_rg * len * 4 / 64;
        const int64_t num_tiles = (nc + kPanelCols - 1) / kPanelCols;
        const int64_t lines_per_tile = (next_lines + num_tiles - 1) / num_tiles;
        for (int64_t t0 = 0, line = 0; t0 < nc; t0 += kPanelCols) {
          for (int64_t e = std::min(next_lines, line + lines_per_tile); line < e; ++line)
            _mm_prefetch(next_x + line * 64, _MM_HINT_T0);
          const int cols = static_cast<int>(std::min<int64_t>(kPanelCols, nc - t0));
          kPanelTiles[rg - 1][cols - 1](xp + r * k8 + k0 * rg, panel + t0 * len, len,
                                        out + r * m + c0 + t0, m);
        }
      }
    }
  }
  // The k % 8 tail and the bias (a pass over the block's outputs, skipped when both are absent:
  // for a 512-row prefill it re-read 512 strided rows of `out` per column block).
  if (k8 == k && bias == nullptr) return;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t col = c0 + c;
      float s = out[r * m + col];
      for (int64_t kk = k8; kk < k; ++kk) s += x[r * k + kk] * LoadWeight(w, dtype, col * k + kk);
      if (bias != nullptr) s += bias[col];
      out[r * m + col] = s;
    }
  }
}

}  // namespace

void ConvertToF32(const void* src, DType dtype, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = LoadWeight(src, dtype, i);
}

namespace {

// MatMul and MatMulMxfp4 (dtype kMxfp4: w an Mxfp4Matrix).
void MatMulAny(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
               const float* bias, float* out, ThreadPool& pool) {
  if (n == 0 || m == 0) return;
  // Small products run on the calling thread: waking another costs more than it saves.
  const int max_threads = n * k * m < (1 << 20) ? 1 : pool.num_threads();
  const bool use_panel = n > kFewRows;
  // Prefill blocks are narrowed (to no less than decode's) until every thread gets one.
  int64_t col_block = use_panel ? kPanelColBlock : kColBlock;
  while (col_block > kColBlock && (m + col_block - 1) / col_block < max_threads) col_block /= 2;
  const int64_t num_col_blocks = (m + col_block - 1) / col_block;
  const int64_t k8 = k - k % 8;
  // Prefill: x packed once, shared by every thread; [n rounded up to kRowGroup, k8] floats.
  float* xp = nullptr;
  if (use_panel) {
    const int64_t groups = (n + kRowGroup - 1) / kRowGroup;
    xp = Scratch<PackedXTag>(static_cast<size_t>(groups * kRowGroup * k8));
    pool.ParallelFor(
        groups,
        [&](int64_t g, int) {
          const int64_t r = g * kRowGroup;
          PackRows(x, k, r, std::min<int64_t>(kRowGroup, n - r), k8, xp + r * k8);
        },
        max_threads);
  }
  pool.ParallelFor(
      num_col_blocks,
      [&](int64_t b, int) {
        float* panel = use_panel ? Scratch<PanelTag>(
                                           static_cast<size_t>(kPanelColBlock * kKChunk))
                                 : nullptr;
        const int64_t c0 = b * col_block;
        ColumnBlock(x, xp, n, k, w, w_dtype, c0, std::min(col_block, m - c0), bias, out, m,
                    panel);
      },
      max_threads);
}

}  // namespace

void MatMul(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
            const float* bias, float* out, ThreadPool& pool) {
  CHECK(w_dtype == DType::kF32 || w_dtype == DType::kF16 || w_dtype == DType::kBF16)
      << "MatMul weight must be F32/F16/BF16";
  MatMulAny(x, n, k, w, w_dtype, m, bias, out, pool);
}

void MatMulMxfp4(const float* x, int64_t n, int64_t k, const Mxfp4Matrix& w, int64_t m,
                 const float* bias, float* out, ThreadPool& pool) {
  CHECK_EQ(k % 32, 0) << "MXFP4 MatMul: k " << k;
  MatMulAny(x, n, k, &w, kMxfp4, m, bias, out, pool);
}

}  // namespace ember::cpu
