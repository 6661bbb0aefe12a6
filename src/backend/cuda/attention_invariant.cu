// Batch-invariant paged attention for the bf16 mode: one kernel for decode and prefill
// whose per-row operation sequence does not depend on the other rows of the step.
//
// Rows: a block owns (sequence, KV head, row tile); its rows are the (query token, head of the
// GQA group) pairs of that sequence and KV head, row r = token * group + head-in-group, so each
// K/V tile is read once for all query heads that share it. Warps of 16 rows (m16n8k16 mma.sync,
// bf16 operands, f32 accumulation); head dims above 128 split O's columns over two warps.
// The per-row sequence, identical for every row wherever it lands:
//   - key tiles of kKeys at ABSOLUTE positions (tile t = keys [64t, 64t + 64)), masked per row by
//     causality and the sliding window; a tile with no visible key for a row is an exact no-op
//     for that row (running max unchanged, correction 1, P = 0);
//   - fixed key splits of kInvariantSplitKeys keys: the online-softmax state restarts at every
//     split boundary and the split states (m, l, o) are folded in split order by FoldScalars /
//     FoldValue with pinned rounding (no FMA contraction). A row whose keys lie in one split is
//     normalised directly. Whether the folds happen in the same block (sequential mode, the
//     running O kept in `out`) or through `partials` and the combine kernel (split mode: one
//     block per split, more parallelism at small batch) does not change a bit of the result.
// Two block shapes, the same per-row arithmetic (an mma computes each element from its own row):
// steps of few rows (decode) use warps of one 16-row m-tile, Q held in registers; steps with more
// rows than such a block (prefill, bf16 pool) take the prefill shape: from D 128 warps of two
// m-tiles (32 rows; 128 rows per block at D 128, 64 above), Q staged once as bf16 in shared
// memory and each K/V fragment fed to both m-tiles' mma (half the shared-memory traffic per
// flop); below D 128 one m-tile (kPrefillMTiles); both with a mask-free path for tiles every row
// of the warp sees whole. Blocks are ordered KV head fastest, longest row tiles first. A decode
// step whose sequences have at most 16 rows per KV head (D 64 and 128) takes the key-split form
// of the decode shape: all four warps share the one m-tile (in the plain shape three of them have
// no rows), each computing a quarter of a tile's scores and of O's columns; the tile's row maxima,
// the weights' pair sums and the bf16 weights meet in shared memory and every warp sums and
// multiplies them in the one-warp order (faster batch-1 and batched decode, docs/perf.md).
// K/V: a bf16 pool (the bf16 mode's, rounded RN by WriteKv) is copied by 16-byte cp.async
// straight into the bf16 shared tiles, double-buffered; an f32 pool (CudaBackendOptions::kv_f32,
// tests) is staged as f32 and rounded RN to bf16 in shared memory, which gives the same bits.
// A quantized pool (int8 / FP8 rows with a scale, kv.quant; kv_rows.cuh) is staged as bytes, two
// tiles ahead in two byte stagings (rows of D + 4 bytes; a pool block's rows of one head are
// contiguous, so whole blocks move by 16-byte cp.async, else rows by 4-byte ones), and at the
// tile's start every value is converted in registers (byte value times the row's scale,
// DequantizeKvRow's float) and rounded RN into the bf16 tiles; masked keys are 0. Half the bytes
// of a bf16 tile per stage, so two in flight keep a bf16 tile's bytes in flight. (int8 / FP8 rows
// of head dim 128 can skip the bf16 tiles, their bytes the mma operands: kDirectQuant below.)
// int4 rows (kInt4:
// nibbles, then an f16 scale per group) are staged the same way and converted 4 values (2 bytes)
// at a time, (nibble - 8) times the group's scale; a rotated layer's q and output are rotated by
// the caller (kv_rows.cuh's WarpHadamard, LaunchHadamardRows). The decode and
// key-split decode shapes serve it (prefill rows take the one-m-tile shape, as an f32 pool's do);
// no RoPE-fused form.
// Attention sinks (AttentionArgs::sinks): a row's sink enters only its final normalisation (the
// direct one, the sequential mode's last fold, the combine kernel's), added to the denominator as
// SinkWeight of the row's final max with the same pinned rounding in all three, so the modes still
// agree bitwise; without sinks nothing changes.
// The bf16 mode has no per-step split-K decode or flash/WMMA prefill kernels: this kernel is as
// fast or faster in every measured shape (docs/perf.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_fragments.cuh"
#include "backend/cuda/kv_rows.cuh"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/online_softmax.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope_rotate.cuh"

namespace ember::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kKeys = 64;  // keys per tile
constexpr int32_t kFilledByBlock = -2;  // a tile slot the block fills itself (kRope), not copied
constexpr int kSplitTiles = kInvariantSplitKeys / kKeys;
static_assert(kInvariantSplitKeys % kKeys == 0);

// kMT: 16-row m-tiles per warp (1: decode shape, Q in registers; 2: prefill shape, Q in shared).
// kKeySplit (decode shape, D <= 128): the block's rows are one m-tile that all kWarps warps
// share: each computes the scores of its kKeys / kWarps keys of a tile and a quarter of O's
// columns (the weights P pass through shared memory).
template <int D, int kMT, bool kKeySplit = false>
struct Shape {
  static_assert(!kKeySplit || (kMT == 1 && D <= 128 && D / 16 % kWarps == 0));
  // warps sharing one row group's O columns
  static constexpr int kDimSplit = kKeySplit ? kWarps : D > 128 ? 2 : 1;
  static constexpr int kWarpRows = 16 * kMT;
  static constexpr int kRowsPerBlock = kWarpRows * kWarps / kDimSplit;
  static constexpr int kDimBlocks = D / 16;  // 16-column blocks of the P.V product
  static constexpr int kDimBlocksPerWarp = (kDimBlocks + kDimSplit - 1) / kDimSplit;
  static constexpr int kLd = D + 8;  // bf16 per shared row: 16-byte pad, ldmatrix conflict-free
  static constexpr size_t kTileBytes = size_t{2} * kKeys * kLd * sizeof(__nv_bfloat16);  // K+V
  static constexpr size_t kStageBytes = size_t{2} * kKeys * D * sizeof(float);           // f32 K, V
  static constexpr int kQuantRowBytes = D + 4;  // int8 / FP8 rows: D bytes and an f32 scale
  static constexpr size_t kQuantStageBytes = size_t{2} * kKeys * kQuantRowBytes;       // bytes K, V
  // The staged rows' bytes: int8 / FP8, or int4 (fewer: the stagings keep their size).
  template <bool kInt4>
  static constexpr int kQuantRowBytesOf = kInt4 ? KvInt4RowBytes(D) : kQuantRowBytes;
  static constexpr size_t kQBytes =
      kMT > 1 ? size_t{kRowsPerBlock} * kLd * sizeof(__nv_bfloat16) : 0;  // bf16 Q [rows][kLd]
  // bf16 pool: two bf16 tile pairs (the next tile lands in the other one); f32 pool: one pair
  // and the f32 staging of the next tile; quantized pool: one pair and two byte stagings (the
  // next two tiles in flight). Then Q (kMT > 1).
  template <bool kBf16Kv, bool kQuantKv = false>
  static constexpr size_t kQOffset =
      kBf16Kv ? 2 * kTileBytes : kTileBytes + (kQuantKv ? 2 * kQuantStageBytes : kStageBytes);
  template <bool kBf16Kv, bool kQuantKv = false>
  static constexpr size_t kSmemBytes = kQOffset<kBf16Kv, kQuantKv> + kQBytes;
};

// The prefill shape's m-tiles per warp: 2 from D 128 (a faster 8B prefill), 1 below (at D 64 two
// m-tiles measured slower, and one m-tile with the mask-free path and 3 blocks per SM slightly
// faster than the decode shape; docs/perf.md).
template <int D>
constexpr int kPrefillMTiles = D >= 128 ? 2 : 1;

// Blocks per SM the register budget keeps (__launch_bounds__): for the one-m-tile shapes 4 at
// D 16 and 3 up to D 96 (at most 128 and 168 registers), else 1; the two-m-tile shape 2 (255
// registers).
constexpr int MinBlocksPerSm(int d, int m_tiles) {
  return m_tiles > 1 ? 2 : d <= 16 ? 4 : d <= 96 ? 3 : 1;
}

// int8 / FP8 rows of head dim 128 can take direct operands (kv_fragments.cuh): no bf16 tile. The
// stored bytes become f16 B fragments in registers, read from the byte staging by a fixed
// permutation of the dims (Q takes the same one) and of the keys (P takes the same one), chosen
// so that the reads are 4-byte words without bank conflicts (rows of D + 4 = 132 bytes):
//   - QK^T, chunk ks of 16 dims: thread t's k-indices 2t, 2t + 1, 2t + 8, 2t + 9 are the dims
//     4w .. 4w + 3 of word w = DirectKWord(t, ks); n-tile nn's column c is key DirectKey(nn, c);
//   - P.V, key block kk: thread t's k-indices are keys 16kk + 4t .. 4t + 3 (which is where
//     DirectKey puts n-tiles 2kk and 2kk + 1), read as one word of each of the four rows and
//     transposed (QuantWordsToVFragments); O's n-tile 4J + f, column c is dim
//     4 DirectVWord(c, J) + f.
// A score is (Q' . bytes) sq ks: Q' is the row over a power of two sq >= its max |q| (exact), ks
// the key's scale. P.V takes P' = P vs / vref (vs the key's value scale, vref the row's running
// max of vs over its visible keys, so P' <= 1 in f16): O is kept in units of vref and rescaled
// with the softmax's correction when vref grows (exactly 1 when neither moved). The per-row
// sequence is the same in every block shape, so the rows stay batch-invariant.
// A kernel takes them when launched with kDirectOps (Dispatch: where KvLayerView::direct is on).
template <int D, bool kQuantKv, bool kInt4, bool kDirectOps = true>
constexpr bool kDirectQuant = kQuantKv && !kInt4 && D == 128 && kDirectOps;
__device__ __forceinline__ int DirectKWord(int t, int ks) {
  return 2 * (t & 1) + 16 * (t >> 1) + (ks & 1) + 4 * (ks >> 1);
}
__device__ __forceinline__ int DirectKey(int nn, int c) {
  return 16 * (nn >> 1) + 2 * (nn & 1) + 4 * (c >> 1) + (c & 1);
}
__device__ __forceinline__ int DirectVWord(int c, int j) {
  return (c & 3) + 16 * (c >> 2) + 4 * j;
}

// Scores are kept in "logit units" u, which need no per-element work before the running max:
// without a soft-cap u = q.k (unscaled), with one u = cap * tanh(q.k * scale / cap). A key's
// weight is 2^(u c - m c) with c = ExpScale(a) (the softmax scale, if not applied yet, times
// log2 e): one FMA and one ex2 per score (online_softmax.cuh).
__device__ __forceinline__ float ExpScale(const AttentionArgs& a) {
  return a.softcap > 0.f ? kLog2e : __fmul_rn(a.scale, kLog2e);
}

// A finished row's softmax denominator: its keys' sum l plus, with sinks, its head's sink weight
// relative to the row's max m (logit units): 2^(sink log2 e - m c). The sink is in the units of
// the scaled (and capped) scores, which are u c / log2 e in both cases of ExpScale. row_id =
// token * num_heads + head. Pinned rounding: every mode that finishes the row adds the same bits.
// (The head comes from row_id, not from a row_head() argument: with that one ptxas allocated the
// main kernel's registers worse, e.g. a 60-byte spill in the D 96 decode shape.)
__device__ __forceinline__ float WithSink(float l, float m, float c, const AttentionArgs& a,
                                          int64_t row_id) {
  if (a.sinks == nullptr) return l;
  const int32_t head = static_cast<int32_t>(row_id % a.num_heads);
  return __fadd_rn(l, Exp2(__fsub_rn(__fmul_rn(a.sinks[head], kLog2e), MaxTimesScale(m, c))));
}

// The soft-capped score (pinned rounding: the same bits on every path).
__device__ __forceinline__ float Capped(float qk, const AttentionArgs& a) {
  return __fmul_rn(a.softcap, tanhf(__fdiv_rn(__fmul_rn(qk, a.scale), a.softcap)));
}

// 16-byte global -> shared copy, bypassing registers; src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void CpAsync16(void* smem_dst, const void* src, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// 4-byte global -> shared copy (quantized rows: D + 4 bytes, 4-byte aligned); src_bytes 0
// zero-fills.
__device__ __forceinline__ void CpAsync4(void* smem_dst, const void* src, int src_bytes) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void CpAsyncWaitAllButOne() {  // the newest group may be pending
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// A staged quantized row's 4 values from element d as floats (DequantizeKvRow's; 0 for a masked
// key): int8 / FP8 bytes times the row's scale, int4 (nibble - 8) times the group's scale.
template <int D, bool kInt8>
struct ByteValues {
  __device__ __forceinline__ void operator()(const unsigned char* r, int d, bool visible,
                                             float* f) const {
    const uint32_t b = visible ? *reinterpret_cast<const uint32_t*>(r + d) : 0u;
    const float scale = visible ? KvQuantScale(r, D) : 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      f[e] = __fmul_rn(KvQuantByteOf<kInt8>((b >> (8 * e)) & 0xffu), scale);
  }
};
template <int D>
struct Int4Values {
  __device__ __forceinline__ void operator()(const unsigned char* r, int d, bool visible,
                                             float* f) const {
    const unsigned b = visible ? *reinterpret_cast<const uint16_t*>(r + d / 2) : 0x8888u;
    const float scale = visible ? KvInt4Scale(r, d, D) : 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = __fmul_rn(KvInt4Level(b >> (4 * e)), scale);
  }
};

__device__ __forceinline__ int32_t FirstSplit(int32_t pos, int32_t window) {
  return (window > 0 ? max(0, pos - window + 1) : 0) / kInvariantSplitKeys;
}

// num_splits == 0: sequential mode, grid (kv heads * row tiles, 1, seqs). Otherwise split mode,
// grid (kv heads * row tiles * num_splits, 1, seqs); partials [num_tokens, num_heads, num_splits,
// D + 2]. blockIdx.x = (row tile * max(num_splits, 1) + split) * kv heads + kv head.
// kBf16Kv: kv is a bf16 pool (kv.bf16). kMT: m-tiles per warp (Shape). kRope (decode shape,
// one token per sequence, full rotary): q and the step's k arrive unrotated and the block whose
// keys include the token first stores its rotated k and its v (`rope`), as RopeWriteKvKernel
// would have (the same arithmetic and rounding, so the same bits). kQuantKv (not kBf16Kv): kv is
// a quantized pool (kv.quant), staged as bytes; its slot table then holds row indices. kInt4
// (with kQuantKv): its rows are int4 (D a power of two).
template <int D, bool kBf16Kv, int kMT, bool kPrefill, bool kRope = false, bool kKeySplit = false,
          bool kQuantKv = false, bool kInt4 = false, bool kFp8 = false, bool kDirectOps = false>
__global__ void __launch_bounds__(kWarps * 32, kDirectQuant<D, kQuantKv, kInt4, kDirectOps>
                                                   ? 2
                                                   : MinBlocksPerSm(D, kMT))
    AttentionInvariantKernel(AttentionArgs a, const float* __restrict__ q, KvLayerView kv,
                             PlanView plan, int32_t num_splits, float* __restrict__ partials,
                             float* __restrict__ out, RopeKvInput rope) {
  using S = Shape<D, kMT, kKeySplit>;
  static_assert(!kRope || (kMT == 1 && kBf16Kv && !kPrefill), "RoPE in the decode shape only");
  static_assert(!kKeySplit || !kPrefill, "key split in the decode shape only");
  static_assert(!kQuantKv || (!kBf16Kv && !kRope && !kPrefill), "a quantized pool: byte staging");
  static_assert(!kInt4 || (kQuantKv && (D & (D - 1)) == 0), "int4 rows: a power-of-two D");
  // kDirect: int8 / FP8 rows as direct f16 operands (kFp8: FP8), three byte stagings, no bf16 tile.
  constexpr bool kDirect = kDirectQuant<D, kQuantKv, kInt4, kDirectOps>;
  static_assert(!kDirectOps || kDirect, "direct operands: int8 / FP8 rows of head dim 128 only");
  static_assert(!kFp8 || kDirect);
  static_assert(!kDirect || (kMT == 1 && S::kDimBlocksPerWarp % 2 == 0));
  constexpr int kDimBlocksPerWarp = S::kDimBlocksPerWarp;
  static_assert(kMT == 1 || kBf16Kv, "the f32 pool (tests) uses the one-m-tile shape");
  extern __shared__ __align__(16) unsigned char smem[];
  // The tile being computed: bf16 [kKeys][kLd] K then V (bf16 pool: buffer b at b * kTileBytes).
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* v_s = k_s + kKeys * S::kLd;
  // f32 pool: [kKeys][D] f32 K then V.
  [[maybe_unused]] float* k_stage = reinterpret_cast<float*>(smem + S::kTileBytes);
  [[maybe_unused]] float* v_stage = k_stage + kKeys * D;
  // kMT > 1: the block's Q rows, bf16 [kRowsPerBlock][kLd].
  [[maybe_unused]] __nv_bfloat16* q_s =
      reinterpret_cast<__nv_bfloat16*>(smem + S::template kQOffset<kBf16Kv, kQuantKv>);
  // Quantized pool: stage b's [kKeys][kRowBytes] bytes of K, then V.
  constexpr int kRowBytes = S::template kQuantRowBytesOf<kInt4>;
  auto k_raw_at = [&](int stage) {
    return smem + (kDirect ? 0 : S::kTileBytes) + stage * S::kQuantStageBytes;
  };
  // K/V copies: 16 bytes each, kCopyChunks per K (V) row. When the block's threads divide into
  // whole rows, each thread copies one fixed column chunk of rows j0, j0 + kRowStep, ...
  constexpr int kCopyChunks = D / (kBf16Kv ? 8 : 4);
  constexpr bool kFixedChunk = (kWarps * 32) % kCopyChunks == 0;
  constexpr int kRowStep = kFixedChunk ? kWarps * 32 / kCopyChunks : 1;
  constexpr int kRowsPerThread = kKeys / kRowStep;
  // The next two (quantized pool: three) tiles' pool slots (-1: a masked key), key j at
  // slot_pos(j): a thread's keys j0, j0 + kRowStep, ... are consecutive, read with 16-byte loads.
  // A quantized pool's masked key of a block that holds a visible key: -2 - its row (the block's
  // rows are copied whole, its value zeroed at conversion).
  __shared__ __align__(16) int32_t slot_s[kQuantKv ? 3 : 2][kKeys];
  auto slot_pos = [](int j) {
    return kFixedChunk ? (j % kRowStep) * kRowsPerThread + j / kRowStep : j;
  };

  const int32_t group = a.num_heads / a.num_kv_heads;
  const int4 seq = plan.seqs[blockIdx.z];
  const int32_t kv_head = static_cast<int32_t>(blockIdx.x) % a.num_kv_heads;
  const int32_t tile_split = static_cast<int32_t>(blockIdx.x) / a.num_kv_heads;
  const int32_t num_tile_splits = static_cast<int32_t>(gridDim.x) / a.num_kv_heads;
  const int32_t num_row_tiles = num_splits > 0 ? num_tile_splits / num_splits : num_tile_splits;
  const int32_t row_tile = num_splits > 0 ? tile_split / num_splits : tile_split;
  const int32_t row_start = (num_row_tiles - 1 - row_tile) * S::kRowsPerBlock;  // late first
  const int32_t num_rows = seq.y * group;
  if (row_start >= num_rows) return;
  const int32_t rows = min(S::kRowsPerBlock, num_rows - row_start);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row_group = warp / S::kDimSplit, dim_part = warp % S::kDimSplit;
  const int dp_begin = dim_part * kDimBlocksPerWarp;
  const int dp_end = min(S::kDimBlocks, dp_begin + kDimBlocksPerWarp);
  const int warp_row0 = row_group * S::kWarpRows;  // the warp's first block row
  // This thread's rows: block rows warp_row0 + 16 mt + g + 8h (-1: past `rows`).
  auto row_token = [&](int mt, int h) {
    return seq.x + (row_start + min(warp_row0 + 16 * mt + g + 8 * h, rows - 1)) / group;
  };
  auto row_head = [&](int mt, int h) {
    return kv_head * group + (row_start + min(warp_row0 + 16 * mt + g + 8 * h, rows - 1)) % group;
  };
  int32_t pos[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      pos[mt][h] = warp_row0 + 16 * mt + g + 8 * h < rows ? plan.positions[row_token(mt, h)] : -1;
    }
  }
  const int32_t first_pos = plan.positions[seq.x + row_start / group];
  const int32_t last_pos = plan.positions[seq.x + (row_start + rows - 1) / group];
  const int32_t lo = a.sliding_window > 0 ? max(0, first_pos - a.sliding_window + 1) : 0;
  const int32_t hi = last_pos + 1;
  int32_t tile_begin = lo / kKeys, tile_end = last_pos / kKeys;  // inclusive
  if (num_splits > 0) {
    const int32_t split = tile_split % num_splits;
    tile_begin = max(tile_begin, split * kSplitTiles);
    tile_end = min(tile_end, split * kSplitTiles + kSplitTiles - 1);
    if (tile_begin > tile_end) return;
  }
  const bool warp_active = warp_row0 < rows;
  const int32_t warp_first_pos =
      warp_active ? plan.positions[seq.x + (row_start + warp_row0) / group] : 0;
  const int32_t warp_last_pos =
      warp_active
          ? plan.positions[seq.x + (row_start + min(rows - 1, warp_row0 + S::kWarpRows - 1)) / group]
          : -1;
  const int32_t* block_table = plan.block_tables + seq.w;
  const int32_t bs = plan.block_size;
  const int32_t kv_row = kv.num_kv_heads * D;  // elements per pool slot (a 32 x 32 -> 64 multiply)
  const float exp_scale = ExpScale(a);

  // Pipeline: the K/V of tile t + 1 arrive by cp.async (bf16 pool: into the other bf16 buffer;
  // f32 pool: into the f32 staging) while tile t is computed; the slots of tile t + 2 are looked
  // up meanwhile by the last kKeys threads (idle warps in decode).
  const int slot_thread = static_cast<int>(threadIdx.x) - (kWarps * 32 - kKeys);
  // kRope: the step's token p, whose K/V this kernel makes. When p lies in one of the block's
  // first two tiles, the block writes its rotated k and its v straight into that tile's shared
  // rows (kFilledByBlock: no copy for that key), so the first tile can be copied before PdlWait
  // and the pool store is off the critical path. Later tiles copy it from the pool as before.
  const int32_t step_pos = kRope ? plan.positions[seq.x] : -1;
  const bool fill_step_key = kRope && plan.slot_mapping[seq.x] >= 0 &&
                             step_pos / kKeys >= tile_begin && step_pos / kKeys <= tile_begin + 1 &&
                             step_pos / kKeys <= tile_end && step_pos >= lo;
  auto lookup_slot = [&](int32_t tile) -> int32_t {
    const int32_t key = tile * kKeys + slot_thread;
    if (fill_step_key && key == step_pos) return kFilledByBlock;
    if constexpr (kQuantKv) {
      // A quantized pool's row index: head-major within the block (KvQuantRowOffset / row_bytes).
      // Every key of a pool block that holds a visible key gets one (copy_quant_rows copies such
      // blocks whole), a masked one as -2 - row.
      const int32_t first = key - key % bs;
      if (!(tile <= tile_end && first < hi && first + bs > lo)) return -1;
      const int32_t row = (block_table[key / bs] * kv.num_kv_heads + kv_head) * bs + key % bs;
      return key >= lo && key < hi ? row : -2 - row;
    }
    if (!(tile <= tile_end && key >= lo && key < hi)) return -1;
    return block_table[key / bs] * bs + key % bs;
  };
  // Per tile, the K and V rows of the kKeys slots (slot_s) into shared rows of `ld` elements.
  auto copy_rows = [&](const int32_t* slots, auto* k_dst, auto* v_dst, int ld, const auto* k_src,
                       const auto* v_src) {
    constexpr int kPer = 16 / sizeof(*k_src);  // elements per 16-byte copy
    static_assert(kPer * kCopyChunks == D);
    if constexpr (kFixedChunk) {
      // A base pointer and constant strides per thread, the slots read 16 bytes at a time.
      const int j0 = static_cast<int>(threadIdx.x) / kCopyChunks;
      const int d = (static_cast<int>(threadIdx.x) % kCopyChunks) * kPer;
      const auto* k_col = k_src + static_cast<int64_t>(kv_head) * D + d;
      const auto* v_col = v_src + static_cast<int64_t>(kv_head) * D + d;
      auto* k_row = k_dst + j0 * ld + d;
      auto* v_row = v_dst + j0 * ld + d;
      const int32_t* mine = slots + j0 * kRowsPerThread;
      int32_t slot[kRowsPerThread];
      if constexpr (kRowsPerThread % 4 == 0) {
#pragma unroll
        for (int q = 0; q < kRowsPerThread / 4; ++q) {
          const int4 v = reinterpret_cast<const int4*>(mine)[q];
          slot[4 * q] = v.x;
          slot[4 * q + 1] = v.y;
          slot[4 * q + 2] = v.z;
          slot[4 * q + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int it = 0; it < kRowsPerThread; ++it) slot[it] = mine[it];
      }
#pragma unroll
      for (int it = 0; it < kRowsPerThread; ++it) {
        if (kRope && slot[it] == kFilledByBlock) continue;
        const int64_t off = static_cast<int64_t>(max(slot[it], 0)) * kv_row;
        CpAsync16(k_row + it * kRowStep * ld, k_col + off, slot[it] >= 0 ? 16 : 0);
        CpAsync16(v_row + it * kRowStep * ld, v_col + off, slot[it] >= 0 ? 16 : 0);
      }
    } else {
#pragma unroll 4
      for (int it = 0; it < kKeys * kCopyChunks / (kWarps * 32); ++it) {
        const int idx = it * kWarps * 32 + threadIdx.x;
        const int j = idx / kCopyChunks, d = (idx % kCopyChunks) * kPer;
        const int32_t slot = slots[slot_pos(j)];
        if (kRope && slot == kFilledByBlock) continue;
        const int64_t off =
            slot >= 0 ? static_cast<int64_t>(slot) * kv_row + static_cast<int64_t>(kv_head) * D + d
                      : int64_t{0};
        CpAsync16(k_dst + j * ld + d, k_src + off, slot >= 0 ? 16 : 0);
        CpAsync16(v_dst + j * ld + d, v_src + off, slot >= 0 ? 16 : 0);
      }
    }
  };
  // Quantized pool: the tile's K and V rows (row indices in `slots`) into byte staging `stage`.
  // When pool blocks tile the kKeys keys (block_size divides kKeys) and a block's rows are whole
  // 16-byte chunks (block_size * kRowBytes % 16 == 0), each block's rows of this head are one
  // contiguous, aligned span, copied 16 bytes at a time (a block no visible key of is
  // zero-filled); otherwise each visible key's rows, 4 bytes at a time (int4 rows of 10 or 18
  // bytes: 2 at a time, plain loads). The staging rows are the same either way.
  [[maybe_unused]] auto copy_quant_rows = [&](const int32_t* slots, int stage) {
    const unsigned char* k_src = reinterpret_cast<const unsigned char*>(kv.k);
    const unsigned char* v_src = reinterpret_cast<const unsigned char*>(kv.v);
    unsigned char* k_raw = k_raw_at(stage);
    unsigned char* v_raw = k_raw + kKeys * kRowBytes;
    if (bs * kRowBytes % 16 == 0 && kKeys % bs == 0) {
      const int chunks = bs * kRowBytes / 16;  // per pool block
      for (int idx = threadIdx.x; idx < kKeys * kRowBytes / 16; idx += kWarps * 32) {
        const int b = idx / chunks, c = idx % chunks;
        const int32_t first = slots[slot_pos(b * bs)];  // the block's first row (key % bs == 0)
        const int32_t base = first >= 0 ? first : first <= -2 ? -2 - first : -1;
        const int64_t off = base >= 0 ? static_cast<int64_t>(base) * kRowBytes + 16 * c : int64_t{0};
        CpAsync16(k_raw + 16 * idx, k_src + off, base >= 0 ? 16 : 0);
        CpAsync16(v_raw + 16 * idx, v_src + off, base >= 0 ? 16 : 0);
      }
      return;
    }
    if constexpr (kRowBytes % 4 == 0) {
      constexpr int kWords = kRowBytes / 4;
#pragma unroll 4
      for (int idx = threadIdx.x; idx < kKeys * kWords; idx += kWarps * 32) {
        const int j = idx / kWords, w = idx % kWords;
        const int32_t row = slots[slot_pos(j)];
        const int64_t off = row >= 0 ? static_cast<int64_t>(row) * kRowBytes + 4 * w : int64_t{0};
        CpAsync4(k_raw + j * kRowBytes + 4 * w, k_src + off, row >= 0 ? 4 : 0);
        CpAsync4(v_raw + j * kRowBytes + 4 * w, v_src + off, row >= 0 ? 4 : 0);
      }
    } else {
      constexpr int kHalves = kRowBytes / 2;
      for (int idx = threadIdx.x; idx < kKeys * kHalves; idx += kWarps * 32) {
        const int j = idx / kHalves, w = idx % kHalves;
        const int32_t row = slots[slot_pos(j)];
        const int64_t off = static_cast<int64_t>(row) * kRowBytes + 2 * w;
        const auto load = [&](const unsigned char* src) {
          return row >= 0 ? *reinterpret_cast<const uint16_t*>(src + off) : uint16_t{0};
        };
        *reinterpret_cast<uint16_t*>(k_raw + j * kRowBytes + 2 * w) = load(k_src);
        *reinterpret_cast<uint16_t*>(v_raw + j * kRowBytes + 2 * w) = load(v_src);
      }
    }
  };
  auto issue_copy = [&](const int32_t* slots, int buffer) {
    if constexpr (kQuantKv) {
      copy_quant_rows(slots, buffer);
    } else if constexpr (kBf16Kv) {
      __nv_bfloat16* k_dst = reinterpret_cast<__nv_bfloat16*>(smem + buffer * S::kTileBytes);
      copy_rows(slots, k_dst, k_dst + kKeys * S::kLd, S::kLd,
                reinterpret_cast<const __nv_bfloat16*>(kv.k),
                reinterpret_cast<const __nv_bfloat16*>(kv.v));
    } else {
      copy_rows(slots, k_stage, v_stage, D, kv.k, kv.v);
    }
    CpAsyncCommit();
  };
  if (slot_thread >= 0) {
    slot_s[0][slot_pos(slot_thread)] = lookup_slot(tile_begin);
    slot_s[1][slot_pos(slot_thread)] = lookup_slot(tile_begin + 1);
    if constexpr (kQuantKv) slot_s[2][slot_pos(slot_thread)] = lookup_slot(tile_begin + 2);
  }
  __syncthreads();
  // Before PdlWait the kernel may read the plan and the keys of earlier steps: when the first
  // tile holds no key this step writes (with kRope: none it must copy), its copy overlaps the end
  // of the previous kernel. With kRope the second tile's too (both buffers are free; the loop
  // then skips it), so a decode at 64-127 keys waits for no copy after PdlWait.
  const bool early_copy = kRope || (tile_begin + 1) * kKeys <= plan.positions[seq.x];
  if (early_copy) issue_copy(slot_s[0], 0);
  if (kRope && tile_begin + 1 <= tile_end) issue_copy(slot_s[1], 1);
  // kRope: the rotation's cos / sin at the token's position (constant tables) before PdlWait: this
  // thread's q columns (as x below) and, for threads under D / 2, its k column pair.
  static_assert(!kRope || D / 2 <= kWarps * 32);
  [[maybe_unused]] float q_cos[kRope ? D / 32 : 1][4][2], q_sin[kRope ? D / 32 : 1][4][2];
  [[maybe_unused]] float k_cos = 0.f, k_sin = 0.f;
  if constexpr (kRope) {
    const int64_t row = static_cast<int64_t>(max(step_pos, 0)) * (D / 2);
    const float* cos_row = rope.cos_table + row;
    const float* sin_row = rope.sin_table + row;
#pragma unroll
    for (int ks = 0; ks < D / 32; ++ks) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = ks * 16 + 2 * t + (j >= 2 ? 8 : 0);
        q_cos[ks][j][0] = cos_row[c];
        q_cos[ks][j][1] = cos_row[c + 1];
        q_sin[ks][j][0] = sin_row[c];
        q_sin[ks][j][1] = sin_row[c + 1];
      }
    }
    if (threadIdx.x < D / 2) {
      k_cos = cos_row[threadIdx.x];
      k_sin = sin_row[threadIdx.x];
    }
  }
  PdlTrigger();  // dependents first: see pdl.cuh
  PdlWait();

  // kMT == 1: Q as A fragments: a0 (row g, cols 2t..), a1 (row g+8), a2 (row g, cols 2t+8..), a3.
  // kMT > 1: Q rounded to bf16 the same way into q_s (zero rows past `rows`), read by ldmatrix.
  [[maybe_unused]] uint32_t qf[kMT == 1 ? D / 16 : 1][4];
  // kDirect: rows g, g + 8 over 2^e >= their max |q| (sq = 2^e; padding rows 1).
  [[maybe_unused]] float sq[2] = {1.f, 1.f};
  if constexpr (kDirect) {
    const float* qrow[2] = {
        q + (static_cast<int64_t>(row_token(0, 0)) * a.num_heads + row_head(0, 0)) * D,
        q + (static_cast<int64_t>(row_token(0, 1)) * a.num_heads + row_head(0, 1)) * D};
    float4 x[D / 16][2];
    float amax[2] = {0.f, 0.f};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        x[ks][h] = pos[0][h] >= 0
                       ? *reinterpret_cast<const float4*>(qrow[h] + 4 * DirectKWord(t, ks))
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        amax[h] = fmaxf(amax[h], fmaxf(fmaxf(fabsf(x[ks][h].x), fabsf(x[ks][h].y)),
                                       fmaxf(fabsf(x[ks][h].z), fabsf(x[ks][h].w))));
      }
    }
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
      int e = 0;
      frexpf(amax[h], &e);  // amax = f 2^e, f in [0.5, 1): |q| / 2^e < 1
      sq[h] = ldexpf(1.f, e);
      inv[h] = ldexpf(1.f, -e);
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      qf[ks][0] = PackF16(x[ks][0].x * inv[0], x[ks][0].y * inv[0]);
      qf[ks][1] = PackF16(x[ks][1].x * inv[1], x[ks][1].y * inv[1]);
      qf[ks][2] = PackF16(x[ks][0].z * inv[0], x[ks][0].w * inv[0]);
      qf[ks][3] = PackF16(x[ks][1].z * inv[1], x[ks][1].w * inv[1]);
    }
  } else if constexpr (kMT == 1) {
    const float* q0 = q + (static_cast<int64_t>(row_token(0, 0)) * a.num_heads + row_head(0, 0)) * D;
    const float* q1 = q + (static_cast<int64_t>(row_token(0, 1)) * a.num_heads + row_head(0, 1)) * D;
    // x[ks]: rows g, g + 8 at columns c = 16 ks + 2t (+1), then c + 8 (+1). (Loaded before the
    // kRope stores below, so that both loads are in flight together.)
    float2 x[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int c = ks * 16 + 2 * t;
      const float2 z = make_float2(0.f, 0.f);
      x[ks][0] = pos[0][0] >= 0 ? *reinterpret_cast<const float2*>(q0 + c) : z;
      x[ks][1] = pos[0][1] >= 0 ? *reinterpret_cast<const float2*>(q1 + c) : z;
      x[ks][2] = pos[0][0] >= 0 ? *reinterpret_cast<const float2*>(q0 + c + 8) : z;
      x[ks][3] = pos[0][1] >= 0 ? *reinterpret_cast<const float2*>(q1 + c + 8) : z;
    }
    if constexpr (kRope) {
      const int32_t p = step_pos;
      const int64_t slot = plan.slot_mapping[seq.x];  // < 0: a padding row, nothing stored
      if (slot >= 0 && tile_begin <= p / kKeys && p / kKeys <= tile_end) {
        constexpr int kHalf = D / 2;
        const int64_t src = (static_cast<int64_t>(seq.x) * a.num_kv_heads + kv_head) * D;
        const int64_t dst = slot * kv_row + static_cast<int64_t>(kv_head) * D;
        __nv_bfloat16* k_pool = reinterpret_cast<__nv_bfloat16*>(kv.k);
        __nv_bfloat16* v_pool = reinterpret_cast<__nv_bfloat16*>(kv.v);
        // The token's shared rows (fill_step_key): tile p / kKeys is in buffer (its tile -
        // tile_begin), row p % kKeys; the same bf16 values as the pool's.
        __nv_bfloat16* k_fill =
            reinterpret_cast<__nv_bfloat16*>(smem + (p / kKeys - tile_begin) * S::kTileBytes) +
            (p % kKeys) * S::kLd;
        __nv_bfloat16* v_fill = k_fill + kKeys * S::kLd;
        if (const int i = threadIdx.x; i < kHalf) {
          const float2 y = RotatePair(rope.k[src + i], rope.k[src + i + kHalf], k_cos, k_sin);
          const __nv_bfloat16 lo_k = __float2bfloat16_rn(y.x), hi_k = __float2bfloat16_rn(y.y);
          k_pool[dst + i] = lo_k;
          k_pool[dst + i + kHalf] = hi_k;
          if (fill_step_key) {
            k_fill[i] = lo_k;
            k_fill[i + kHalf] = hi_k;
          }
        }
        for (int i = threadIdx.x; i < D; i += kWarps * 32) {
          const __nv_bfloat16 vv = __float2bfloat16_rn(rope.v[src + i]);
          v_pool[dst + i] = vv;
          if (fill_step_key) v_fill[i] = vv;
        }
      }
      // The stores before this block's copies of the token's tile (none when the block fills the
      // token's shared rows itself).
      if (!fill_step_key) __threadfence_block();
      __syncthreads();

      // Rotate-half pairs (column c, c + D / 2): both in this thread, ks and ks + D / 32. The
      // block's rows are one token's heads, all at its position.
#pragma unroll
      for (int ks = 0; ks < D / 32; ++ks) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float2& lo = x[ks][j];
          float2& hi = x[ks + D / 32][j];
          const float2 y0 = RotatePair(lo.x, hi.x, q_cos[ks][j][0], q_sin[ks][j][0]);
          const float2 y1 = RotatePair(lo.y, hi.y, q_cos[ks][j][1], q_sin[ks][j][1]);
          lo = make_float2(y0.x, y1.x);
          hi = make_float2(y0.y, y1.y);
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int j = 0; j < 4; ++j) qf[ks][j] = PackBf16(x[ks][j].x, x[ks][j].y);
    }
  } else {
    // Batches of kBatch float2 loads in flight before their conversions.
    constexpr int kPairs = S::kRowsPerBlock * (D / 2) / (kWarps * 32);  // per thread
    static_assert(S::kRowsPerBlock * (D / 2) % (kWarps * 32) == 0);
    constexpr int kBatch = kPairs < 16 ? kPairs : 16;
#pragma unroll
    for (int it0 = 0; it0 < kPairs; it0 += kBatch) {
      float2 x[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int idx = (it0 + i) * kWarps * 32 + threadIdx.x;
        const int r = idx / (D / 2), c = (idx % (D / 2)) * 2;
        x[i] = make_float2(0.f, 0.f);
        if (it0 + i < kPairs && r < rows) {
          const int64_t tok = seq.x + (row_start + r) / group;
          const int32_t hd = kv_head * group + (row_start + r) % group;
          x[i] = *reinterpret_cast<const float2*>(q + (tok * a.num_heads + hd) * D + c);
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int idx = (it0 + i) * kWarps * 32 + threadIdx.x;
        const int r = idx / (D / 2), c = (idx % (D / 2)) * 2;
        if (it0 + i < kPairs) {
          *reinterpret_cast<uint32_t*>(q_s + r * S::kLd + c) = PackBf16(x[i].x, x[i].y);
        }
      }
    }
  }

  // The split's online-softmax state (o: this warp's columns; l: this thread's keys only) and,
  // in sequential mode, the running fold over the splits (M, L; its O lives in `out`).
  float o[kMT][2 * kDimBlocksPerWarp][4];
  float m[kMT][2], l[kMT][2];
  [[maybe_unused]] float vref[2];  // kDirect: the rows' running max value scale (O's unit)
  // The running fold lives in shared memory (registers go to o and s): [mt][h][thread].
  __shared__ float run_m[kMT][2][kWarps * 32], run_l[kMT][2][kWarps * 32];
  // kKeySplit: each tile's row maxima per warp, weights' pair sums [n-tile][row half][lane] and P
  // as A fragments [16-key block][register][lane].
  struct KeySplitShared {
    float max[kWarps][16];
    float pair_sum[kKeys / 8][2][32];
    uint32_t p[kKeys / 16][4][32];
  };
  struct NoKeySplit {};
  __shared__ std::conditional_t<kKeySplit, KeySplitShared, NoKeySplit> key_split;
  // kDirect with kKeySplit: each tile's rows' max value scale per warp.
  __shared__ std::conditional_t<kKeySplit && kDirect, float[kWarps][16], NoKeySplit> key_split_vmax;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    run_m[mt][0][threadIdx.x] = run_m[mt][1][threadIdx.x] = -INFINITY;
    run_l[mt][0][threadIdx.x] = run_l[mt][1][threadIdx.x] = 0.f;
  }

  if (!early_copy) issue_copy(slot_s[0], 0);
  if (kQuantKv && tile_begin + 1 <= tile_end) issue_copy(slot_s[1], 1);  // two in flight

  // A split starts from the empty state. (Reset at the end of the previous split, inside its
  // branch: a reset at the top of the loop compiles to ~136 selects in every tile.)
  auto reset_state = [&] {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int n = 0; n < 2 * kDimBlocksPerWarp; ++n) {
        o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
      }
      m[mt][0] = m[mt][1] = -INFINITY;
      l[mt][0] = l[mt][1] = 0.f;
    }
    if constexpr (kDirect) vref[0] = vref[1] = 0.f;
  };
  reset_state();
#ifdef EMBER_TRACE_ATTENTION
  // A trace build (pdl.cuh) with -DEMBER_TRACE_ATTENTION in CMAKE_CUDA_FLAGS stamps the step
  // timeline here and at the end too: the loads, the tiles' compute and the exit apart.
  TraceStamp();
#endif
  for (int32_t tile = tile_begin; tile <= tile_end; ++tile) {
    const int32_t kt = tile * kKeys;
    // Prefill shape: the block-table entry of tile + 2's key is loaded now, turned into a slot
    // and stored after this tile's compute, so its latency hides behind the mma work. (The
    // decode shape looks it up after the copy is issued, as before: fewer live registers.)
    const int32_t key2 = (tile + 2) * kKeys + slot_thread;
    const bool valid2 =
        kPrefill && slot_thread >= 0 && tile + 2 <= tile_end && key2 >= lo && key2 < hi;
    const int32_t block2 = valid2 ? block_table[key2 / bs] : 0;
    // The tile's copy group arrived (a quantized pool's next tile may still be in flight).
    if (kQuantKv && tile + 1 <= tile_end) {
      CpAsyncWaitAllButOne();
    } else {
      CpAsyncWaitAll();
    }
    __syncthreads();  // tile's K/V (and Q) arrived; the previous tile's bf16 K/V are consumed
    const int next = (tile + 1 - tile_begin) & 1;
    if constexpr (kBf16Kv) {
      // This tile is in buffer next ^ 1 (tile_begin in 0); the next one goes to buffer next.
      k_s = reinterpret_cast<__nv_bfloat16*>(smem + (next ^ 1) * S::kTileBytes);
      v_s = k_s + kKeys * S::kLd;
    } else if constexpr (kQuantKv && !kDirect) {
      // Quantized pool (staging (tile - tile_begin) & 1): 4 values of one key per item, byte value
      // times the row's scale (one rounding: DequantizeKvRow's float), then bf16 RN; a masked key
      // (slot < 0: zero-filled, or a stored row of a copied block) is 0.
      const unsigned char* k_raw = k_raw_at(next ^ 1);
      const unsigned char* v_raw = k_raw + kKeys * kRowBytes;
      const int32_t* slots = slot_s[(tile - tile_begin) % 3];
      // Per item 4 values of one key's K and V row: decode(row, d, visible, out) gives a row's
      // floats (a masked key's 0), rounded RN into the bf16 tiles.
      auto convert = [&](auto decode) {
#pragma unroll 4
        for (int it = 0; it < kKeys * D / 4 / (kWarps * 32); ++it) {
          const int idx = it * kWarps * 32 + threadIdx.x;
          const int j = idx / (D / 4), d = (idx % (D / 4)) * 4;
          const bool visible = slots[slot_pos(j)] >= 0;
          float kf[4], vf[4];
          decode(k_raw + j * kRowBytes, d, visible, kf);
          decode(v_raw + j * kRowBytes, d, visible, vf);
          *reinterpret_cast<uint2*>(k_s + j * S::kLd + d) =
              make_uint2(PackBf16(kf[0], kf[1]), PackBf16(kf[2], kf[3]));
          *reinterpret_cast<uint2*>(v_s + j * S::kLd + d) =
              make_uint2(PackBf16(vf[0], vf[1]), PackBf16(vf[2], vf[3]));
        }
      };
      if constexpr (kInt4) {
        convert(Int4Values<D>{});
      } else if (kv.quant == KvQuant::kInt8) {
        convert(ByteValues<D, true>{});
      } else {
        convert(ByteValues<D, false>{});
      }
      __syncthreads();  // bf16 tile ready, its staging free
    } else if constexpr (!kDirect) {
      // f32 pool: round to bf16 RN (the rounding WriteKv applies to a bf16 pool).
#pragma unroll 4
      for (int it = 0; it < kKeys * D / 4 / (kWarps * 32); ++it) {
        const int idx = it * kWarps * 32 + threadIdx.x;
        const int j = idx / (D / 4), d = (idx % (D / 4)) * 4;
        const float4 kk = *reinterpret_cast<const float4*>(k_stage + j * D + d);
        const float4 vv = *reinterpret_cast<const float4*>(v_stage + j * D + d);
        *reinterpret_cast<uint2*>(k_s + j * S::kLd + d) =
            make_uint2(PackBf16(kk.x, kk.y), PackBf16(kk.z, kk.w));
        *reinterpret_cast<uint2*>(v_s + j * S::kLd + d) =
            make_uint2(PackBf16(vv.x, vv.y), PackBf16(vv.z, vv.w));
      }
      __syncthreads();  // bf16 tile ready, staging free
    }
    if constexpr (kQuantKv) {
      // Tile + 2 into the staging just converted (tile + 1 is in flight in the other); tile + 3's
      // slots into this tile's (read above, before the __syncthreads).
      const int i = tile - tile_begin;
      // (kDirect: tile + 2 into the staging of tile - 1, whose compute every warp finished.)
      if (tile + 2 <= tile_end) issue_copy(slot_s[(i + 2) % 3], kDirect ? (i + 2) % 3 : next ^ 1);
      if (slot_thread >= 0) slot_s[i % 3][slot_pos(slot_thread)] = lookup_slot(tile + 3);
    } else {
      if (tile + 1 <= tile_end && !(kRope && tile == tile_begin)) issue_copy(slot_s[next], next);
      if (!kPrefill && slot_thread >= 0) {
        slot_s[next ^ 1][slot_pos(slot_thread)] = lookup_slot(tile + 2);
      }
    }
    // Warp-uniform skip of a tile no row of this warp sees (an exact no-op for each of them).
    const bool compute =
        warp_active && kt <= warp_last_pos &&
        !(a.sliding_window > 0 && kt + kKeys - 1 <= warp_first_pos - a.sliding_window);
    if (compute) {
      // S = Q K^T: kNt n-tiles of 8 keys from n-tile n_first (kKeySplit: this warp's share of the
      // tile, else all of it); each K fragment serves the warp's kMT m-tiles.
      constexpr int kNt = kKeySplit ? kKeys / 8 / kWarps : kKeys / 8;
      const int n_first = kKeySplit ? warp * kNt : 0;
      float s[kMT][kNt][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < kNt; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
      }
      // kDirect: this tile's staging; the keys' scales (ksc: K's, vsc: V's) of this thread's
      // score columns.
      [[maybe_unused]] const unsigned char* k_raw =
          kDirect ? k_raw_at((tile - tile_begin) % 3) : nullptr;
      [[maybe_unused]] const unsigned char* v_raw = kDirect ? k_raw + kKeys * kRowBytes : nullptr;
      [[maybe_unused]] float ksc[kDirect ? kNt : 1][2] = {}, vsc[kDirect ? kNt : 1][2] = {};
      [[maybe_unused]] float vinv[2] = {0.f, 0.f};  // kDirect: 1 / the rows' vref after this tile
      // kDirect: O += P' V for one 16-key block (pf: its weights as f16 A fragments) over this
      // warp's columns, V read as words of the block's four rows per thread and transposed.
      [[maybe_unused]] auto direct_pv = [&](int kk, const uint32_t(&pf)[4]) {
        const unsigned char* vrow = v_raw + (16 * kk + 4 * t) * kRowBytes;
#pragma unroll
        for (int jj = 0; jj < kDimBlocksPerWarp / 2; ++jj) {
          const int off = 4 * DirectVWord(g, dp_begin / 2 + jj);
          uint32_t b[4][2];
          QuantWordsToVFragments<!kFp8>(
              *reinterpret_cast<const uint32_t*>(vrow + off),
              *reinterpret_cast<const uint32_t*>(vrow + kRowBytes + off),
              *reinterpret_cast<const uint32_t*>(vrow + 2 * kRowBytes + off),
              *reinterpret_cast<const uint32_t*>(vrow + 3 * kRowBytes + off), b);
#pragma unroll
          for (int f = 0; f < 4; ++f) MmaF16(o[0][4 * jj + f], pf, b[f][0], b[f][1]);
        }
      };
      // The weights as mma operands: bf16, or (kDirect) P' = P vs / vref in f16.
      auto pack_weights = [&](int n, float p0, float p1, int h) -> uint32_t {
        if constexpr (kDirect) {
          return PackF16(__fmul_rn(p0, __fmul_rn(vsc[n][0], vinv[h])),
                         __fmul_rn(p1, __fmul_rn(vsc[n][1], vinv[h])));
        } else {
          return PackBf16(p0, p1);
        }
      };
      if constexpr (kDirect) {
#pragma unroll
        for (int n = 0; n < kNt; ++n) {
          const unsigned char* krow = k_raw + DirectKey(n_first + n, g) * kRowBytes;
          uint32_t w[D / 16];
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) {
            w[ks] = *reinterpret_cast<const uint32_t*>(krow + 4 * DirectKWord(t, ks));
          }
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = DirectKey(n_first + n, 2 * t + e);
            ksc[n][e] = KvQuantScale(k_raw + j * kRowBytes, D);
            vsc[n][e] = KvQuantScale(v_raw + j * kRowBytes, D);
          }
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) {
            uint32_t b0, b1;
            QuantWordToF16x2<!kFp8>(w[ks], b0, b1);
            MmaF16(s[0][n], qf[ks], b0, b1);
          }
        }
      }
#pragma unroll
      for (int ks = 0; ks < (kDirect ? 0 : D / 16); ++ks) {
        uint32_t qa[kMT][4];
        if constexpr (kMT == 1) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[0][i] = qf[ks][i];
        } else {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            LdMatrixX4(qa[mt], q_s + (warp_row0 + 16 * mt + lane % 16) * S::kLd + ks * 16 +
                                   8 * (lane / 16));
          }
        }
#pragma unroll
        for (int np = 0; np < kNt / 2; ++np) {
          uint32_t b[4];
          const int key = n_first * 8 + np * 16 + (lane % 8) + 8 * (lane / 16);
          const int d = ks * 16 + 8 * ((lane / 8) % 2);
          LdMatrixX4(b, k_s + key * S::kLd + d);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            Mma(s[mt][2 * np], qa[mt], b[0], b[1]);
            Mma(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
          }
        }
      }
      // Soft-cap (when set) and mask into logit units (ExpScale); online softmax over row 0 (c0,
      // c1) and row 1 (c2, c3). A tile every row of the warp sees whole skips the mask (rows past
      // `rows` compute throwaway values from zero Q and are never stored); without a soft-cap it
      // only takes the row maxima.
      const bool whole =
          kt + kKeys - 1 <= warp_first_pos &&
          (a.sliding_window <= 0 || warp_last_pos - kt < a.sliding_window);
      // The soft-cap and mask tests are warp-uniform: hoisted out of the element loops, each of
      // the four variants is straight-line code (one basic block the scheduler can interleave).
      float mx[kMT][2];
      [[maybe_unused]] float vm[2] = {0.f, 0.f};  // kDirect: the rows' max vsc over visible keys
      auto scores = [&](auto whole_tag, auto capped_tag) {
        constexpr bool kWhole = decltype(whole_tag)::value;
        constexpr bool kCapped = decltype(capped_tag)::value;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mx[mt][0] = mx[mt][1] = -INFINITY;
#pragma unroll
          for (int n = 0; n < kNt; ++n) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              float u = s[mt][n][c];
              if constexpr (kDirect) u = __fmul_rn(__fmul_rn(u, sq[c / 2]), ksc[n][c & 1]);
              if constexpr (kCapped) u = Capped(u, a);
              [[maybe_unused]] bool visible = true;
              if constexpr (!kWhole) {
                const int32_t key = kt + (kDirect ? DirectKey(n_first + n, 2 * t + (c & 1))
                                                  : (n_first + n) * 8 + 2 * t + (c & 1));
                const int32_t p = pos[mt][c / 2];
                visible =
                    p >= 0 && key <= p && (a.sliding_window <= 0 || p - key < a.sliding_window);
                if (!visible) u = -INFINITY;
              }
              if constexpr (kDirect) {
                if (visible) vm[c / 2] = fmaxf(vm[c / 2], vsc[n][c & 1]);
              }
              s[mt][n][c] = u;
            }
            mx[mt][0] = fmaxf(mx[mt][0], fmaxf(s[mt][n][0], s[mt][n][1]));
            mx[mt][1] = fmaxf(mx[mt][1], fmaxf(s[mt][n][2], s[mt][n][3]));
          }
        }
      };
      using Yes = std::true_type;
      using No = std::false_type;
      if (whole) {
        if (a.softcap > 0.f) {
          scores(Yes{}, Yes{});
        } else {
          scores(Yes{}, No{});
        }
      } else if (a.softcap > 0.f) {
        scores(No{}, Yes{});
      } else {
        scores(No{}, No{});
      }
      float corr[kMT][2], mc[kMT][2];
      // The rows' max reductions first, interleaved (a reduction per row between the rescales
      // was a serial chain of shuffle latencies).
#pragma unroll
      for (int step = 1; step <= 2; step *= 2) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], step));
          }
        }
        if constexpr (kDirect) {
          vm[0] = fmaxf(vm[0], __shfl_xor_sync(0xffffffffu, vm[0], step));
          vm[1] = fmaxf(vm[1], __shfl_xor_sync(0xffffffffu, vm[1], step));
        }
      }
      if constexpr (kKeySplit) {  // the tile's row maxima over the warps' keys (exact: a max)
        if (t == 0) {
          key_split.max[warp][g] = mx[0][0];
          key_split.max[warp][g + 8] = mx[0][1];
          if constexpr (kDirect) {
            key_split_vmax[warp][g] = vm[0];
            key_split_vmax[warp][g + 8] = vm[1];
          }
        }
        __syncthreads();  // (block-uniform: every warp has the same rows)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = key_split.max[0][g + 8 * h];
#pragma unroll
          for (int w = 1; w < kWarps; ++w) v = fmaxf(v, key_split.max[w][g + 8 * h]);
          mx[0][h] = v;
          if constexpr (kDirect) {
            float x = key_split_vmax[0][g + 8 * h];
#pragma unroll
            for (int w = 1; w < kWarps; ++w) x = fmaxf(x, key_split_vmax[w][g + 8 * h]);
            vm[h] = x;
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float new_m = fmaxf(m[mt][h], mx[mt][h]);
          corr[mt][h] = Rescale(m[mt][h], new_m, exp_scale);
          m[mt][h] = new_m;
          mc[mt][h] = MaxTimesScale(new_m, exp_scale);
        }
      }
      // kDirect: the rows' new vref, its reciprocal for the weights (vinv) and O's factor from
      // the old unit to the new one (exactly 1 when vref did not move), folded into O's factor.
      float ocorr[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        ocorr[mt][0] = corr[mt][0];
        ocorr[mt][1] = corr[mt][1];
      }
      if constexpr (kDirect) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float vnew = fmaxf(vref[h], vm[h]);
          vinv[h] = vnew > 0.f ? __frcp_rn(vnew) : 0.f;
          const float vfac = vnew == vref[h] ? 1.f : __fmul_rn(vref[h], vinv[h]);
          ocorr[0][h] = __fmul_rn(corr[0][h], vfac);
          vref[h] = vnew;
        }
      }
      // O *= corr, skipped when no row of the m-tile moved its max (a factor of exactly 1).
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if (__any_sync(0xffffffffu, ocorr[mt][0] != 1.f || ocorr[mt][1] != 1.f)) {
#pragma unroll
          for (int n = 0; n < 2 * kDimBlocksPerWarp; ++n) {
            o[mt][n][0] *= ocorr[mt][0];
            o[mt][n][1] *= ocorr[mt][0];
            o[mt][n][2] *= ocorr[mt][1];
            o[mt][n][3] *= ocorr[mt][1];
          }
        }
      }
      // O += P V, kPvKeys keys at a time: the weights of those keys become A fragments (keys
      // 16kk..16kk+15 are n-tiles 2kk, 2kk+1) and go straight into their mma. In the two-m-tile
      // shape 16 keys, so only one key block's fragments are live (all four at once cost
      // registers that the O accumulators then paid for in moves; 8B prefill attention -4%); the
      // one-m-tile shape has the registers and runs the whole tile at once (16 keys: 1B prefill
      // attention +4%). V tile [key][d] read transposed, each V fragment serving the kMT m-tiles.
      // l sums the f32 weights (P.V uses them rounded to bf16), in key order either way.
      constexpr int kPvKeys = kMT > 1 ? 16 : kKeys;
      float sum[kMT][2];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) sum[mt][0] = sum[mt][1] = 0.f;
      if constexpr (kKeySplit) {
        // This warp's keys' weights: their pair sums and bf16 A fragments to shared memory, then
        // every warp adds all pair sums in key order and multiplies all fragments into its
        // columns in key order: the arithmetic of the unsplit warp below.
#pragma unroll
        for (int n = 0; n < kNt; ++n) {
          float p[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) p[c] = Exp2(__fmaf_rn(s[0][n][c], exp_scale, -mc[0][c / 2]));
          key_split.pair_sum[n_first + n][0][lane] = p[0] + p[1];
          key_split.pair_sum[n_first + n][1][lane] = p[2] + p[3];
          key_split.p[(n_first + n) / 2][(n % 2) * 2][lane] = pack_weights(n, p[0], p[1], 0);
          key_split.p[(n_first + n) / 2][(n % 2) * 2 + 1][lane] = pack_weights(n, p[2], p[3], 1);
        }
        __syncthreads();
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          sum[0][0] += key_split.pair_sum[n][0][lane];
          sum[0][1] += key_split.pair_sum[n][1][lane];
        }
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          uint32_t pf[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) pf[i] = key_split.p[kk][i][lane];
          if constexpr (kDirect) {
            direct_pv(kk, pf);
          } else {
#pragma unroll
            for (int i = 0; i < kDimBlocksPerWarp; ++i) {
              const int dp = dp_begin + i;
              uint32_t b[4];
              const int key = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
              const int d = dp * 16 + 8 * (lane / 16);
              LdMatrixX4Trans(b, v_s + key * S::kLd + d);
              Mma(o[0][2 * i], pf, b[0], b[1]);
              Mma(o[0][2 * i + 1], pf, b[2], b[3]);
            }
          }
        }
      } else {
#pragma unroll
        for (int k0 = 0; k0 < kKeys; k0 += kPvKeys) {
          uint32_t pf[kMT][kPvKeys / 16][4];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int n = k0 / 8; n < (k0 + kPvKeys) / 8; ++n) {
              float p[4];
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                p[c] = Exp2(__fmaf_rn(s[mt][n][c], exp_scale, -mc[mt][c / 2]));  // masked: 0
              }
              sum[mt][0] += p[0] + p[1];
              sum[mt][1] += p[2] + p[3];
              const int kk = n / 2 - k0 / 16;
              pf[mt][kk][(n % 2) * 2] = pack_weights(n, p[0], p[1], 0);
              pf[mt][kk][(n % 2) * 2 + 1] = pack_weights(n, p[2], p[3], 1);
            }
          }
          if constexpr (kDirect) {
#pragma unroll
            for (int kk = 0; kk < kPvKeys / 16; ++kk) direct_pv(k0 / 16 + kk, pf[0][kk]);
          } else {
#pragma unroll
            for (int kk = 0; kk < kPvKeys / 16; ++kk) {
#pragma unroll
              for (int i = 0; i < kDimBlocksPerWarp; ++i) {
                const int dp = dp_begin + i;
                if (dp >= dp_end) break;
                uint32_t b[4];
                const int key = k0 + kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
                const int d = dp * 16 + 8 * (lane / 16);
                LdMatrixX4Trans(b, v_s + key * S::kLd + d);
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                  Mma(o[mt][2 * i], pf[mt][kk], b[0], b[1]);
                  Mma(o[mt][2 * i + 1], pf[mt][kk], b[2], b[3]);
                }
              }
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        l[mt][0] = __fadd_rn(__fmul_rn(l[mt][0], corr[mt][0]), sum[mt][0]);
        l[mt][1] = __fadd_rn(__fmul_rn(l[mt][1], corr[mt][1]), sum[mt][1]);
      }
    }

    // slot_s[next ^ 1] (this tile's slots) was last read before this tile's __syncthreads.
    if (kPrefill && slot_thread >= 0) {
      slot_s[next ^ 1][slot_pos(slot_thread)] = valid2 ? block2 * bs + key2 % bs : -1;
    }

    // End of a split: normalise, fold, or hand the split state to the combine kernel.
    // ForEachPair visits this warp's O column pairs of row half h of m-tile mt:
    // fn(n, col0, col1, o0, o1), n the pair's index among them (col1 = col0 + 1, except with
    // kDirect: its permuted columns, and O taken out of its vref units).
    auto ForEachPair = [&](int mt, int h, auto&& fn) {
#pragma unroll
      for (int i = 0; i < kDimBlocksPerWarp; ++i) {
        if (dp_begin + i >= dp_end) break;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int n = 2 * i + half;
          if constexpr (kDirect) {
            const int jg = 2 * dp_begin + n, jj = jg >> 2, f = jg & 3;
            fn(n, 4 * DirectVWord(2 * t, jj) + f, 4 * DirectVWord(2 * t + 1, jj) + f,
               __fmul_rn(o[mt][n][2 * h], vref[h]), __fmul_rn(o[mt][n][2 * h + 1], vref[h]));
          } else {
            const int col = (dp_begin + i) * 16 + half * 8 + 2 * t;
            fn(n, col, col + 1, o[mt][n][2 * h], o[mt][n][2 * h + 1]);
          }
        }
      }
    };
    // A column pair of an f32 row: adjacent (one 8-byte access) unless kDirect.
    auto store_pair = [](float* row, int c0, int c1, float2 v) {
      if constexpr (kDirect) {
        row[c0] = v.x;
        row[c1] = v.y;
      } else {
        *reinterpret_cast<float2*>(row + c0) = v;
      }
    };
    auto load_pair = [](const float* row, int c0, int c1) {
      if constexpr (kDirect) return make_float2(row[c0], row[c1]);
      return *reinterpret_cast<const float2*>(row + c0);
    };
    if (warp_active && ((tile + 1) % kSplitTiles == 0 || tile == tile_end)) {
      const int32_t s_idx = tile / kSplitTiles;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float lh = l[mt][h];
          lh += __shfl_xor_sync(0xffffffffu, lh, 1);
          lh += __shfl_xor_sync(0xffffffffu, lh, 2);
          if (pos[mt][h] < 0 || m[mt][h] == -INFINITY) continue;  // no key of this split: no-op
          const int64_t row_id = static_cast<int64_t>(row_token(mt, h)) * a.num_heads + row_head(mt, h);
          float* orow = out + row_id * D;
          const int32_t first = FirstSplit(pos[mt][h], a.sliding_window);
          const int32_t last = pos[mt][h] / kInvariantSplitKeys;
          if (first == last) {
            const float inv =
                __frcp_rn(WithSink(lh, m[mt][h], exp_scale, a, row_id));
            ForEachPair(mt, h, [&](int, int c0, int c1, float o0, float o1) {
              store_pair(orow, c0, c1, make_float2(__fmul_rn(o0, inv), __fmul_rn(o1, inv)));
            });
          } else if (num_splits > 0) {
            float* rec = partials + (row_id * num_splits + s_idx) * (D + 2);
            if (t == 0 && dim_part == 0) {
              rec[0] = m[mt][h];
              rec[1] = lh;
            }
            ForEachPair(mt, h, [&](int, int c0, int c1, float o0, float o1) {
              rec[2 + c0] = o0;
              rec[2 + c1] = o1;
            });
          } else {
            float& rm = run_m[mt][h][threadIdx.x];
            float& rl = run_l[mt][h][threadIdx.x];
            const bool had = rm != -INFINITY;
            float wa, wb;
            FoldScalars(rm, rl, m[mt][h], lh, exp_scale, wa, wb);
            const bool final_split = s_idx == last;
            const float inv =
                final_split ? __frcp_rn(WithSink(rl, rm, exp_scale, a, row_id)) : 1.f;
            // Every previous pair is loaded before the first store: loads and stores of `out`
            // interleaved made each load wait for the one before it (a fifth of the prefill
            // kernel's stall samples, ncu).
            float2 prev[2 * kDimBlocksPerWarp];
            if (had) {
              ForEachPair(mt, h, [&](int n, int c0, int c1, float, float) {
                prev[n] = load_pair(orow, c0, c1);
              });
            } else {
              ForEachPair(mt, h,
                          [&](int n, int, int, float, float) { prev[n] = make_float2(0.f, 0.f); });
            }
            ForEachPair(mt, h, [&](int n, int c0, int c1, float o0, float o1) {
              float2 v = make_float2(FoldValue(prev[n].x, o0, wa, wb),
                                     FoldValue(prev[n].y, o1, wa, wb));
              if (final_split) v = make_float2(__fmul_rn(v.x, inv), __fmul_rn(v.y, inv));
              store_pair(orow, c0, c1, v);
            });
          }
        }
      }
      reset_state();
    }
  }
#ifdef EMBER_TRACE_ATTENTION
  TraceStamp();
#endif
}

// Split mode's second pass: block (head, token) folds the row's split states in split order
// (rows whose keys lie in one split were written by the main kernel).
__global__ void AttentionInvariantCombineKernel(AttentionArgs a, PlanView plan, int32_t num_splits,
                                                const float* __restrict__ partials,
                                                float* __restrict__ out) {
  PdlWait();
  PdlTrigger();
  const int32_t head = blockIdx.x, token = blockIdx.y;
  const int32_t pos = plan.positions[token];
  const int32_t first = FirstSplit(pos, a.sliding_window);
  const int32_t last = pos / kInvariantSplitKeys;
  if (first == last) return;
  const int32_t D = a.head_dim;
  const int64_t row_id = static_cast<int64_t>(token) * a.num_heads + head;
  const float* rec0 = partials + row_id * num_splits * (D + 2);
  const float exp_scale = ExpScale(a);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float M = -INFINITY, L = 0.f, O = 0.f;
    for (int32_t s = first; s <= last; ++s) {
      const float* rec = rec0 + static_cast<int64_t>(s) * (D + 2);
      float wa, wb;
      FoldScalars(M, L, rec[0], rec[1], exp_scale, wa, wb);
      O = FoldValue(O, rec[2 + d], wa, wb);
    }
    out[row_id * D + d] = __fmul_rn(O, __frcp_rn(WithSink(L, M, exp_scale, a, row_id)));
  }
}

template <int D, bool kBf16Kv, int kMT, bool kPrefill, bool kRope = false, bool kKeySplit = false,
          bool kQuantKv = false, bool kInt4 = false, bool kFp8 = false, bool kDirectOps = false>
void LaunchForDim(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                  const PlanView& plan, int64_t max_rows, int32_t num_splits, float* partials,
                  float* out, const RopeKvInput& rope, cudaStream_t stream) {
  using S = Shape<D, kMT, kKeySplit>;
  constexpr size_t kSmemBytes = kDirectQuant<D, kQuantKv, kInt4, kDirectOps>
                                    ? 3 * S::kQuantStageBytes
                                    : S::template kSmemBytes<kBf16Kv, kQuantKv>;
  constexpr auto kKernel = AttentionInvariantKernel<D, kBf16Kv, kMT, kPrefill, kRope, kKeySplit,
                                                    kQuantKv, kInt4, kFp8, kDirectOps>;
  if constexpr (kSmemBytes > 48 * 1024) {  // the default dynamic limit
    static std::once_flag attr_once;
    std::call_once(attr_once, [] {
      CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kSmemBytes)));
    });
  }
  const int64_t row_tiles = (max_rows + S::kRowsPerBlock - 1) / S::kRowsPerBlock;
  const dim3 grid(
      static_cast<uint32_t>(row_tiles * (num_splits > 0 ? num_splits : 1) * args.num_kv_heads), 1,
      plan.num_seqs);
  LaunchPdl(kKernel, grid, dim3(kWarps * 32), kSmemBytes, stream, args, q, kv, plan, num_splits,
            partials, out, rope);
}

// The head dims with a RoPE-fused decode kernel and a key-split decode shape (each
// instantiation costs build time).
constexpr bool RopeFusedDim(int32_t d) { return d == 64 || d == 128; }
constexpr bool KeySplitDim(int32_t d) { return d == 64 || d == 128; }

// The two-m-tile (prefill) shape when a sequence has more rows than one decode-shape block.
template <int D>
void Dispatch(const AttentionArgs& args, const float* q, const KvLayerView& kv,
              const PlanView& plan, int32_t max_query_len, int32_t num_splits, float* partials,
              float* out, const RopeKvInput* rope, cudaStream_t stream) {
  if constexpr (D <= kMaxHeadDim) {
    if (args.head_dim != D) {
      Dispatch<D + 16>(args, q, kv, plan, max_query_len, num_splits, partials, out, rope, stream);
      return;
    }
    const int64_t max_rows =
        static_cast<int64_t>(max_query_len) * (args.num_heads / args.num_kv_heads);
    const bool key_split = KeySplitDim(D) && max_rows <= 16;
    if (rope != nullptr) {
      if constexpr (RopeFusedDim(D) && KeySplitDim(D)) {
        if (key_split) {
          LaunchForDim<D, true, 1, false, true, true>(args, q, kv, plan, max_rows, num_splits,
                                                      partials, out, *rope, stream);
          return;
        }
      }
      if constexpr (RopeFusedDim(D)) {
        LaunchForDim<D, true, 1, false, true>(args, q, kv, plan, max_rows, num_splits, partials,
                                              out, *rope, stream);
      }
    } else if (kv.quant == KvQuant::kInt4) {
      CHECK_EQ(kv.row_bytes, KvInt4RowBytes(D));
      if constexpr ((D & (D - 1)) == 0) {
        if constexpr (KeySplitDim(D)) {
          if (key_split) {
            LaunchForDim<D, false, 1, false, false, true, true, true>(
                args, q, kv, plan, max_rows, num_splits, partials, out, {}, stream);
            return;
          }
        }
        LaunchForDim<D, false, 1, false, false, false, true, true>(
            args, q, kv, plan, max_rows, num_splits, partials, out, {}, stream);
      } else {
        CHECK(false) << "int4 KV rows of head_dim " << D << " (a power of two only)";
      }
    } else if (kv.quant != KvQuant::kNone) {
      CHECK_EQ(kv.row_bytes, D + 4);
      if constexpr (kDirectQuant<D, true, false>) {  // direct operands, int8 or FP8
        if (kv.direct) {
          const bool fp8 = kv.quant == KvQuant::kFP8;
          if (key_split && fp8) {
            LaunchForDim<D, false, 1, false, false, true, true, false, true, true>(
                args, q, kv, plan, max_rows, num_splits, partials, out, {}, stream);
          } else if (key_split) {
            LaunchForDim<D, false, 1, false, false, true, true, false, false, true>(
                args, q, kv, plan, max_rows, num_splits, partials, out, {}, stream);
          } else if (fp8) {
            LaunchForDim<D, false, 1, false, false, false, true, false, true, true>(
                args, q, kv, plan, max_rows, num_splits, partials, out, {}, stream);
          } else {
            LaunchForDim<D, false, 1, false, false, false, true, false, false, true>(
                args, q, kv, plan, max_rows, num_splits, partials, out, {}, stream);
          }
          return;
        }
      }
      if constexpr (KeySplitDim(D)) {
        if (key_split) {
          LaunchForDim<D, false, 1, false, false, true, true>(args, q, kv, plan, max_rows,
                                                              num_splits, partials, out, {},
                                                              stream);
          return;
        }
      }
      LaunchForDim<D, false, 1, false, false, false, true>(args, q, kv, plan, max_rows, num_splits,
                                                           partials, out, {}, stream);
    } else if (!kv.bf16) {
      LaunchForDim<D, false, 1, false>(args, q, kv, plan, max_rows, num_splits, partials, out,
                                       {}, stream);
    } else if (max_rows <= Shape<D, 1>::kRowsPerBlock) {
      if constexpr (KeySplitDim(D)) {
        if (key_split) {
          LaunchForDim<D, true, 1, false, false, true>(args, q, kv, plan, max_rows, num_splits,
                                                       partials, out, {}, stream);
          return;
        }
      }
      LaunchForDim<D, true, 1, false>(args, q, kv, plan, max_rows, num_splits, partials, out, {},
                                      stream);
    } else {
      LaunchForDim<D, true, kPrefillMTiles<D>, true>(args, q, kv, plan, max_rows, num_splits,
                                                      partials, out, {}, stream);
    }
  }
}

}  // namespace

bool AttentionInvariantSupported(int32_t head_dim) {
  return head_dim >= 16 && head_dim <= kMaxHeadDim && head_dim % 16 == 0;
}

int32_t AttentionInvariantRowsPerBlock(int32_t head_dim) {  // the decode shape's
  return head_dim > 128 ? 16 * kWarps / 2 : 16 * kWarps;
}

bool AttentionInvariantCanFuseRope(const AttentionArgs& args, int32_t rotary_dim,
                                   int32_t max_query_len, const KvLayerView& kv) {
  return AttentionInvariantSupported(args.head_dim) && RopeFusedDim(args.head_dim) &&
         rotary_dim == args.head_dim && max_query_len == 1 && kv.bf16 &&
         args.num_heads / args.num_kv_heads <= AttentionInvariantRowsPerBlock(args.head_dim);
}

int64_t AttentionInvariantPartialsFloats(int32_t num_tokens, int32_t num_heads, int32_t head_dim,
                                         int32_t num_splits) {
  return static_cast<int64_t>(num_tokens) * num_heads * num_splits * (head_dim + 2);
}

std::vector<AttentionRun> AttentionInvariantRuns(const std::vector<int32_t>& query_lens,
                                                 int32_t group, int32_t head_dim) {
  // Dispatch's choice: the key-split decode shape, the decode shape, the prefill shape.
  const bool key_split = KeySplitDim(head_dim);
  const int64_t decode_rows = AttentionInvariantRowsPerBlock(head_dim);
  auto shape = [&](int32_t query_len) {
    const int64_t rows = int64_t{query_len} * group;
    return key_split && rows <= 16 ? 0 : rows <= decode_rows ? 1 : 2;
  };
  std::vector<AttentionRun> runs;
  int prev = -1;
  for (size_t s = 0; s < query_lens.size(); ++s) {
    const int32_t len = query_lens[s];
    if (len <= 0) continue;  // (no rows: in whichever run it falls)
    const int cur = shape(len);
    if (runs.empty() || cur != prev) {
      if (runs.size() == kMaxAttentionRuns) return {};
      runs.push_back(AttentionRun{static_cast<int32_t>(s), 0, 0});
      prev = cur;
    }
    AttentionRun& run = runs.back();
    run.num_seqs = static_cast<int32_t>(s) + 1 - run.first_seq;
    run.max_query_len = std::max(run.max_query_len, len);
  }
  if (runs.size() <= 1) return {};
  return runs;
}

void LaunchAttentionInvariant(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                              const PlanView& plan, int32_t max_query_len, int32_t num_splits,
                              float* partials, float* out, const RopeKvInput* rope,
                              cudaStream_t stream) {
  if (plan.num_tokens == 0 || plan.num_seqs == 0 || max_query_len <= 0) return;
  CHECK(AttentionInvariantSupported(args.head_dim)) << "head_dim " << args.head_dim;
  CHECK(num_splits == 0 || partials != nullptr);
  CHECK(rope == nullptr ||
        AttentionInvariantCanFuseRope(args, rope->rotary_dim, max_query_len, kv));
  Dispatch<16>(args, q, kv, plan, max_query_len, num_splits, partials, out, rope, stream);
  if (num_splits > 0) {
    LaunchPdl(AttentionInvariantCombineKernel, dim3(args.num_heads, plan.num_tokens), dim3(128), 0,
              stream, args, plan, num_splits, static_cast<const float*>(partials), out);
  }
}

}  // namespace ember::cuda
