#include "backend/cpu/matmul_quant.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/cpu/kquant_quantize.h"
#include "backend/cpu/matmul_kquant.h"
#include "backend/cpu/thread_scratch.h"
#include "util/check.h"
#include "util/half.h"

// GCC 12's AVX-512 intrinsics pass an undefined vector as their (ignored) merge source, which
// -Wuninitialized reports once they are inlined into target("avx512f") functions.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::cpu {
namespace {

constexpr int64_t kColBlock = 64;  // output columns per parallel work item
constexpr int64_t kDecodeStartRows = 2;  // matmul_quant_prefill.inc's kSingleColumnRows

size_t QuantBlockBytes(DType dtype) { return dtype == DType::kQ8_0 ? 34 : 18; }

// A block's f16 scale as float (F16C: the same value as F16ToF32).
inline float BlockScale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, sizeof h);
  return _cvtsh_ss(h);
}

// The fixed horizontal sum of 8 lanes: halves, then pairs, then the last two.
inline float HorizontalSum8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// How far ahead of a streaming decode tile its weights are prefetched (matmul_quant_prefill.inc's
// DecodeTile). On this session's Xeon (docs/perf.md, session 41) the decode tiles stalled on
// their weight loads: 1B Q4_0 tg 14.8 -> 23 tok/s with 2 KB (4 KB measured the same, 0.5-1 KB less).
constexpr size_t kDecodePrefetchBytes = 2048;

// The calling thread's buffer for a prefill work item's unpacked weights (AVX512_VNNI Columns:
// 128 bytes per column and block pair, cols * k * 2 bytes); apart from ActivationScratch, which
// holds x.
float* ScaleScratch(size_t floats) {
  return reinterpret_cast<float*>(ThreadScratch<struct WeightPairsTag>(floats * sizeof(float)));
}

}  // namespace

// ---- the int8-x kernel, once per integer-dot ISA (matmul_quant_prefill.inc) ----
namespace quant_avx2 {
#define EMBER_QUANT_ISA 0
#include "backend/cpu/matmul_quant_prefill.inc"
#undef EMBER_QUANT_ISA
}  // namespace quant_avx2

#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
namespace quant_avxvnni {
#define EMBER_QUANT_ISA 1
#include "backend/cpu/matmul_quant_prefill.inc"
#undef EMBER_QUANT_ISA
}  // namespace quant_avxvnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace quant_avx512vnni {
#define EMBER_QUANT_ISA 2
#include "backend/cpu/matmul_quant_prefill.inc"
#undef EMBER_QUANT_ISA
}  // namespace quant_avx512vnni
#pragma GCC pop_options

namespace {

std::atomic<QuantKernel> forced_kernel{QuantKernel::kInt8X};
std::atomic<QuantIsa> forced_isa{QuantIsa::kAuto};

QuantIsa BestIsa() {
  static const QuantIsa best = CpuHasQuantIsa(QuantIsa::kAvx512Vnni) ? QuantIsa::kAvx512Vnni
                               : CpuHasQuantIsa(QuantIsa::kAvxVnni)  ? QuantIsa::kAvxVnni
                                                                     : QuantIsa::kAvx2;
  return best;
}

QuantIsa ActiveIsa() {
  const QuantIsa forced = forced_isa.load(std::memory_order_relaxed);
  return forced == QuantIsa::kAuto ? BestIsa() : forced;
}

// ---- float32 x: fused dequantize + FMA ----

// The 32 values of a block without its scale (q, or q - 8) as 4 x 8 floats.
template <DType D>
inline void WidenBlock(const uint8_t* block, __m256 (&wf)[4]) {
  if constexpr (D == DType::kQ8_0) {
    const uint8_t* q = block + 2;
    for (int j = 0; j < 4; ++j)
      wf[j] = _mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * j))));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2));
    const __m128i low_mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(packed, low_mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low_mask), eight);
    wf[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    wf[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    wf[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    wf[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  }
}

// N rows x C columns. Per output, per block b in order: t = (w0 x0 + w2 x2) + (w1 x1 + w3 x3)
// (8 lanes, the values of each quarter of the block), acc = fma(t, d_b, acc); then the fixed
// horizontal sum, then + bias.
template <DType D, int N, int C>
void DecodeTile(const float* x, int64_t k, const uint8_t* w, size_t row_bytes, float* out,
                int64_t out_stride, const float* bias) {
  const int64_t num_blocks = k / kQuantBlock;
  const size_t block_bytes = QuantBlockBytes(D);
  __m256 acc[N][C];
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int c = 0; c < C; ++c) {
      const uint8_t* block = w + c * row_bytes + static_cast<size_t>(b) * block_bytes;
      __m256 wf[4];
      WidenBlock<D>(block, wf);
      const __m256 d = _mm256_set1_ps(BlockScale(block));
      for (int r = 0; r < N; ++r) {
        const float* xr = x + r * k + b * kQuantBlock;
        __m256 t0 = _mm256_mul_ps(wf[0], _mm256_loadu_ps(xr));
        __m256 t1 = _mm256_mul_ps(wf[1], _mm256_loadu_ps(xr + 8));
        t0 = _mm256_fmadd_ps(wf[2], _mm256_loadu_ps(xr + 16), t0);
        t1 = _mm256_fmadd_ps(wf[3], _mm256_loadu_ps(xr + 24), t1);
        acc[r][c] = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), d, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      float s = HorizontalSum8(acc[r][c]);
      if (bias != nullptr) s += bias[c];
      out[r * out_stride + c] = s;
    }
}

// Columns [0, cols) of w for N rows; C columns at a time (N * C <= 8 accumulators), then singles.
template <DType D, int N>
void DecodeColumns(const float* x, int64_t k, const uint8_t* w, size_t row_bytes, int64_t cols,
                   const float* bias, float* out, int64_t m) {
  constexpr int C = N <= 2 ? 4 : N <= 4 ? 2 : 1;
  int64_t c = 0;
  for (; c + C <= cols; c += C)
    DecodeTile<D, N, C>(x, k, w + c * row_bytes, row_bytes, out + c, m, bias ? bias + c : nullptr);
  for (; c < cols; ++c)
    DecodeTile<D, N, 1>(x, k, w + c * row_bytes, row_bytes, out + c, m, bias ? bias + c : nullptr);
}

template <DType D>
void DecodeBlock(const float* x, int64_t n, int64_t k, const uint8_t* w, size_t row_bytes,
                 int64_t cols, const float* bias, float* out, int64_t m) {
  switch (n) {
    case 1: return DecodeColumns<D, 1>(x, k, w, row_bytes, cols, bias, out, m);
    case 2: return DecodeColumns<D, 2>(x, k, w, row_bytes, cols, bias, out, m);
    case 3: return DecodeColumns<D, 3>(x, k, w, row_bytes, cols, bias, out, m);
    case 4: return DecodeColumns<D, 4>(x, k, w, row_bytes, cols, bias, out, m);
    case 5: return DecodeColumns<D, 5>(x, k, w, row_bytes, cols, bias, out, m);
    case 6: return DecodeColumns<D, 6>(x, k, w, row_bytes, cols, bias, out, m);
    case 7: return DecodeColumns<D, 7>(x, k, w, row_bytes, cols, bias, out, m);
    default: return DecodeColumns<D, 8>(x, k, w, row_bytes, cols, bias, out, m);
  }
}

// ---- int8 x: x quantized per block of 32 ----

// One row's blocks of `block` values (a multiple of 32): q = round-to-nearest-even(x / d),
// d = max|x| / 127 (0 for an all-zero block).
void QuantizeActivationRow(const float* x, int64_t k, int64_t block, int8_t* q, float* d) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < k / block; ++b) {
    const float* xb = x + b * block;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t j = 0; j < block; j += 8)
      amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(xb + j), abs_mask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float max_abs = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float scale = max_abs / 127.0f;
    d[b] = scale;
    const __m256 inv = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    for (int64_t j = 0; j < block; j += 32) {
      __m256i i[4];
      for (int u = 0; u < 4; ++u)
        i[u] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * u), inv),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      // packs interleave 128-bit lanes; the permute puts the 8 dwords back in element order.
      const __m256i p16a = _mm256_packs_epi32(i[0], i[1]), p16b = _mm256_packs_epi32(i[2], i[3]);
      const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
      const __m256i ordered =
          _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * block + j), ordered);
    }
  }
}

// -offset * (the sum of each 4 of a row's k int8 values), k / 4 int32 in order: the starting
// values of the VNNI kernels' dot lanes (exact: at most 128 * 4 * 128 in magnitude).
void StartValues(const int8_t* q, int64_t k, int offset, int32_t* starts) {
  const __m256i ones = _mm256_set1_epi8(1), neg = _mm256_set1_epi16(static_cast<int16_t>(-offset));
  for (int64_t j = 0; j < k; j += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + j));
    const __m256i s2 = _mm256_maddubs_epi16(ones, v);  // pairs, |s| <= 256
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(starts + j / 4), _mm256_madd_epi16(s2, neg));
  }
}

// The sums of each run of 16 of a row's k int8 values (exact: at most 16 * 127).
void RunSums16(const int8_t* q, int64_t k, int16_t* sums) {
  const __m256i ones = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < k; j += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + j));
    const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, v), ones16);  // runs of 4
    const __m256i s8 = _mm256_hadd_epi32(s4, s4);    // lane: runs of 8 (0-7, 8-15, ...)
    const __m256i s16 = _mm256_hadd_epi32(s8, s8);   // dword 0 of each 128-bit lane: 16
    sums[j / 16] = static_cast<int16_t>(_mm256_extract_epi32(s16, 0));
    sums[j / 16 + 1] = static_cast<int16_t>(_mm256_extract_epi32(s16, 4));
  }
}

// The calling thread's quantized-x buffer (ThreadScratch).
uint8_t* ActivationScratch(size_t bytes) { return ThreadScratch<struct ActivationTag>(bytes); }

using PrefillFn = void (*)(const int8_t*, const float*, const int32_t*, const float*, int64_t,
                           int64_t, const uint8_t*, DType, size_t, int64_t, const float*, float*,
                           int64_t);

PrefillFn PrefillFor(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kAvx512Vnni: return quant_avx512vnni::PrefillColumns;
    case QuantIsa::kAvxVnni: return quant_avxvnni::PrefillColumns;
    default: return quant_avx2::PrefillColumns;
  }
}

// The k-quants with int8 x (matmul_kquant.h): x quantized per super-block of 256 with run sums.
void MatMulKQuantInt8X(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype,
                       int64_t m, const float* bias, float* out, ThreadPool& pool) {
  CHECK_EQ(k % kKQuantBlock, 0) << "MatMulQuant: k " << k << " is not a multiple of 256";
  if (n == 0 || m == 0) return;
  const int64_t num_blocks = k / kKQuantBlock;
  // q [n k], then d [n num_blocks] floats, then sums [n k / 16] int16 (all offsets 4-aligned).
  uint8_t* scratch = ActivationScratch(static_cast<size_t>(n * k + n * num_blocks * 4 + n * k / 8));
  auto* xq = reinterpret_cast<int8_t*>(scratch);
  auto* xd = reinterpret_cast<float*>(scratch + n * k);
  auto* xs = reinterpret_cast<int16_t*>(scratch + n * k + n * num_blocks * 4);
  const int max_threads = n * k * m < (1 << 20) ? 1 : pool.num_threads();
  pool.ParallelFor(
      n,
      [&](int64_t r, int) {
        QuantizeActivationRow(x + r * k, k, kKQuantBlock, xq + r * k, xd + r * num_blocks);
        RunSums16(xq + r * k, k, xs + r * (k / 16));
      },
      max_threads);
  const KQuantInt8Fn kernel = KQuantInt8Kernel(ActiveIsa());
  const KQuantInt8X xv{xq, xd, xs};
  const auto* wb = static_cast<const uint8_t*>(w);
  const size_t row_bytes = DTypeRowBytes(w_dtype, k);
  pool.ParallelFor(
      (m + kColBlock - 1) / kColBlock,
      [&](int64_t blk, int) {
        const int64_t c0 = blk * kColBlock, cols = std::min(kColBlock, m - c0);
        kernel(xv, n, k, wb + c0 * row_bytes, w_dtype, row_bytes, cols, bias ? bias + c0 : nullptr,
               out + c0, m);
      },
      max_threads);
}

}  // namespace

void MatMulQuant(const float* x, int64_t n, int64_t k, const void* w, DType w_dtype, int64_t m,
                 const float* bias, float* out, ThreadPool& pool) {
  CHECK(IsBlockQuantized(w_dtype)) << "MatMulQuant weight " << DTypeName(w_dtype);
  const bool float_x = forced_kernel.load(std::memory_order_relaxed) == QuantKernel::kFloatX;
  if (IsKQuant(w_dtype)) {
    if (float_x) return MatMulKQuant(x, n, k, w, w_dtype, m, bias, out, pool);
    return MatMulKQuantInt8X(x, n, k, w, w_dtype, m, bias, out, pool);
  }
  CHECK_EQ(k % kQuantBlock, 0) << "MatMulQuant: k " << k << " is not a multiple of 32";
  if (n == 0 || m == 0) return;
  const auto* wb = static_cast<const uint8_t*>(w);
  const size_t row_bytes = DTypeRowBytes(w_dtype, k);
  const int max_threads = n * k * m < (1 << 20) ? 1 : pool.num_threads();
  const int64_t num_col_blocks = (m + kColBlock - 1) / kColBlock;
  if (float_x) {  // groups of up to 8 rows: a row's chain is the same in any group
    pool.ParallelFor(
        num_col_blocks,
        [&](int64_t blk, int) {
          const int64_t c0 = blk * kColBlock, cols = std::min(kColBlock, m - c0);
          const float* b = bias ? bias + c0 : nullptr;
          for (int64_t r = 0; r < n; r += kFloatXRows) {
            const int64_t rows = std::min(kFloatXRows, n - r);
            if (w_dtype == DType::kQ8_0)
              DecodeBlock<DType::kQ8_0>(x + r * k, rows, k, wb + c0 * row_bytes, row_bytes, cols,
                                        b, out + r * m + c0, m);
            else
              DecodeBlock<DType::kQ4_0>(x + r * k, rows, k, wb + c0 * row_bytes, row_bytes, cols,
                                        b, out + r * m + c0, m);
          }
        },
        max_threads);
    return;
  }
  const int64_t num_blocks = k / kQuantBlock;
  const QuantIsa isa = ActiveIsa();
  // On AVX512_VNNI x's per-row values are made here once per call instead of once per weight
  // column: the starting values (-offset * each 4 values' sum, [n][k / 32][8] int32: n * k bytes)
  // and, for the prefill tiles (n > 2), each block pair's dx broadcast ([n][k / 64][16] floats:
  // n * k bytes).
  const bool vnni512 = isa == QuantIsa::kAvx512Vnni;
  const bool pairs = vnni512 && n > kDecodeStartRows;
  uint8_t* scratch = ActivationScratch(
      static_cast<size_t>(n * k + n * num_blocks * 4 + (vnni512 ? n * k : 0) + (pairs ? n * k : 0)));
  auto* xq = reinterpret_cast<int8_t*>(scratch);
  auto* xd = reinterpret_cast<float*>(scratch + n * k);  // n * k is a multiple of 32
  auto* xs = vnni512 ? reinterpret_cast<int32_t*>(scratch + n * k + n * num_blocks * 4) : nullptr;
  auto* xp = pairs ? reinterpret_cast<float*>(scratch + 2 * n * k + n * num_blocks * 4) : nullptr;
  const int offset = w_dtype == DType::kQ4_0 ? 8 : 128;  // the VNNI kernels' weight offset
  pool.ParallelFor(
      n,
      [&](int64_t r, int) {
        QuantizeActivationRow(x + r * k, k, kQuantBlock, xq + r * k, xd + r * num_blocks);
        if (xs != nullptr) StartValues(xq + r * k, k, offset, xs + r * (k / 4));
        if (xp != nullptr)
          for (int64_t b = 0; b < num_blocks; ++b)
            _mm256_storeu_ps(xp + r * (k / 4) + b * 8, _mm256_set1_ps(xd[r * num_blocks + b]));
      },
      max_threads);
  const PrefillFn prefill = PrefillFor(isa);
  pool.ParallelFor(
      num_col_blocks,
      [&](int64_t blk, int) {
        const int64_t c0 = blk * kColBlock, cols = std::min(kColBlock, m - c0);
        prefill(xq, xd, xs, xp, n, k, wb + c0 * row_bytes, w_dtype, row_bytes, cols,
                bias ? bias + c0 : nullptr, out + c0, m);
      },
      max_threads);
}

void QuantizeRow(DType dtype, const float* src, int64_t count, void* dst) {
  if (IsKQuant(dtype)) return QuantizeKQuantRow(dtype, src, count, dst);
  CHECK(IsBlockQuantized(dtype) && count % kQuantBlock == 0)
      << "QuantizeRow: " << DTypeName(dtype) << " over " << count << " values";
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < count / kQuantBlock; ++b) {
    const float* x = src + b * kQuantBlock;
    uint8_t* block = out + b * QuantBlockBytes(dtype);
    float amax = 0.0f, signed_max = 0.0f;
    for (int64_t j = 0; j < kQuantBlock; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        signed_max = x[j];
      }
    }
    const float d = dtype == DType::kQ8_0 ? amax / 127.0f : signed_max / -8.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = F32ToF16(d);
    std::memcpy(block, &h, sizeof h);
    if (dtype == DType::kQ8_0) {
      for (int64_t j = 0; j < kQuantBlock; ++j)
        block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * inv)));
    } else {
      for (int64_t j = 0; j < kQuantBlock / 2; ++j) {
        const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * inv + 8.5f)));
        const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * inv + 8.5f)));
        block[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

void DequantizeQuantRow(DType dtype, const void* src, int64_t count, float* dst) {
  if (IsKQuant(dtype)) return DequantizeKQuantRow(dtype, src, count, dst);
  CHECK(IsBlockQuantized(dtype) && count % kQuantBlock == 0);
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < count / kQuantBlock; ++b) {
    const uint8_t* block = in + b * QuantBlockBytes(dtype);
    const float d = BlockScale(block);
    float* y = dst + b * kQuantBlock;
    if (dtype == DType::kQ8_0) {
      for (int64_t j = 0; j < kQuantBlock; ++j) y[j] = static_cast<int8_t>(block[2 + j]) * d;
    } else {
      for (int64_t j = 0; j < kQuantBlock / 2; ++j) {
        y[j] = static_cast<float>((block[2 + j] & 0x0f) - 8) * d;
        y[j + 16] = static_cast<float>((block[2 + j] >> 4) - 8) * d;
      }
    }
  }
}

bool CpuHasQuantIsa(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kAvx512Vnni:
      return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw");
    case QuantIsa::kAvxVnni: return __builtin_cpu_supports("avxvnni");
    default: return true;
  }
}

const char* QuantDotIsaName() {
  switch (ActiveIsa()) {
    case QuantIsa::kAvx512Vnni: return "avx512vnni";
    case QuantIsa::kAvxVnni: return "avxvnni";
    default: return "avx2";
  }
}

void SetQuantKernel(QuantKernel kernel, QuantIsa isa) {
  CHECK(CpuHasQuantIsa(isa)) << "this CPU lacks the requested integer-dot ISA";
  forced_kernel.store(kernel, std::memory_order_relaxed);
  forced_isa.store(isa, std::memory_order_relaxed);
}

}  // namespace ember::cpu
