// Batch-invariant bf16 GEMM on tensor cores: out_i[n, m_i] = x[n, k] W_i[m_i, k]^T (+ bias_i)
// for up to kGemvMaxParts weights sharing one x, in one launch. W is the mma A operand (16
// output features per m16 tile), x the B operand (8 rows per n8 tile).
// The invariant: every output element's f32 accumulator receives the same sequence of
// mma.sync m16n8k16 steps (k16 blocks in ascending k from 0, exactly ceil(k/16) of them, one
// accumulator chain, no split-K), with operands in the same fragment positions (natural k order
// as ldmatrix gives it), x rounded to bf16 RN, out-of-range k zero, and the bias added once after
// the chain. An mma computes each output element only from its own row of W and row of x, so the
// tile shape, the rows sharing a CTA, the variant (skinny / tiled / generic) and n never change
// an element's bits. Variants:
//   skinny (n <= kGemmSkinnyMaxRows): CTAs of 4 warps stream 16, 32 or 64 weight rows over all
//     of k through a deep cp.async ring (as deep as the CTAs per SM leave shared memory for;
//     weights of the first stages issued before PdlWait); 1, 2 or 4 warps run the mma chains
//     (one m16 tile each), x read as f32 and rounded in the fragment load.
//   tiled (larger n): x converted to bf16 once (LaunchConvert, RN), CTA tiles 128x128, 64x128,
//     32x128 or 16x128 (the largest that still fills the SMs), 3 cp.async stages of k64 (128x128)
//     or 4 of k32, ldmatrix for both operands.
//   generic (k % 8 != 0 or a pointer not 16-byte aligned): fragments loaded from global memory.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cache_hints.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma_bf16.cuh"
#include "backend/cuda/pdl.cuh"

namespace ember::cuda {
namespace {

struct GemmParts {
  const __nv_bfloat16* w[kGemvMaxParts];
  const float* bias[kGemvMaxParts];
  float* out[kGemvMaxParts];
  int64_t m[kGemvMaxParts];
  int32_t tile_end[kGemvMaxParts];  // exclusive prefix sums of the parts' m-tile counts
  int count;
};

// The part and first weight row of m tile `tile` (tiles of `rows` rows; each part starts a tile).
// Constant indices only: a run-time index would put the parameter struct in local memory.
struct PartTile {
  const __nv_bfloat16* w;
  const float* bias;
  float* out;
  int64_t m;
  int64_t m0;
};
__device__ __forceinline__ PartTile SelectPart(const GemmParts& p, int tile, int rows) {
  const int part = (p.count > 1 && tile >= p.tile_end[0]) + (p.count > 2 && tile >= p.tile_end[1]);
  const int first = part == 0 ? 0 : part == 1 ? p.tile_end[0] : p.tile_end[1];
  PartTile t;
  t.w = part == 0 ? p.w[0] : part == 1 ? p.w[1] : p.w[2];
  t.bias = part == 0 ? p.bias[0] : part == 1 ? p.bias[1] : p.bias[2];
  t.out = part == 0 ? p.out[0] : part == 1 ? p.out[1] : p.out[2];
  t.m = part == 0 ? p.m[0] : part == 1 ? p.m[1] : p.m[2];
  t.m0 = static_cast<int64_t>(tile - first) * rows;
  return t;
}

// acc (c0..c3 of an m16n8 tile: (feature g, row 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)) + bias.
__device__ __forceinline__ void StoreTile(const PartTile& pt, const float (&acc)[4], int64_t f0,
                                          int64_t r0, int64_t n) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t f = f0 + (i >= 2 ? 8 : 0), r = r0 + (i & 1);
    if (f < pt.m && r < n) pt.out[r * pt.m + f] = acc[i] + (pt.bias != nullptr ? pt.bias[f] : 0.f);
  }
}

// CTA: W warps; the first WM x WN compute, each TM m16 tiles x TN n8 tiles; all W warps copy.
// BK k per stage; the ring depth is a launch parameter. X_F32: x is f32 in memory (rounded in
// the fragment load), else bf16.
template <int W, int WM, int WN, int TM, int TN, int BK, bool X_F32>
struct Config {
  static constexpr int kThreads = W * 32;
  static constexpr int kBM = WM * TM * 16, kBN = WN * TN * 8;
  static constexpr int kLd = BK + 8;  // elements per smem row: 16-byte pad, conflict-free
  static constexpr int kXElem = X_F32 ? 4 : 2;
  static constexpr int kWBytes = kBM * kLd * 2;
  static constexpr int kXBytes = kBN * kLd * kXElem;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kWPerRow = BK / 8, kXPer = 16 / kXElem, kXPerRow = BK / kXPer;
  static constexpr int kWCopies = kBM * kWPerRow / kThreads;  // 16-byte copies per thread/stage
  static constexpr int kXCopies = kBN * kXPerRow / kThreads;
  static_assert(kBM * kWPerRow % kThreads == 0 && kBN * kXPerRow % kThreads == 0, "uneven copy");
  static_assert(BK % 16 == 0 && (X_F32 || TN % 2 == 0) && W >= WM * WN, "bad tile");
};

// The mma steps of one smem stage: for each k16 block (only those < k_left when kGuard: exactly
// ceil(k / 16) steps over the whole k in every variant), A from W by ldmatrix, B from x (f32:
// rounded here; bf16: ldmatrix), then the TM x TN mmas. Fragments are loaded KG k16 steps at a
// time before those steps' mmas: the helpers are volatile asm, kept in source order, so a load
// written after an mma would be issued after it and its latency would add to the chain's.
template <typename C, int TM, int TN, int BK, int KG, bool X_F32, bool kGuard>
__device__ __forceinline__ void ComputeStage(float (&acc)[TM][TN][4], const __nv_bfloat16* ws,
                                             const unsigned char* xs, int wm, int wn, int lane,
                                             int64_t k_left) {
  static_assert((BK / 16) % KG == 0, "KG must divide the stage's k16 steps");
#pragma unroll
  for (int k0 = 0; k0 < BK; k0 += 16 * KG) {
    if (kGuard && k0 >= k_left) break;
    uint32_t a[KG][TM][4];
    uint32_t b[KG][TN][2];
#pragma unroll
    for (int s = 0; s < KG; ++s) {
      const int kk = k0 + 16 * s;
#pragma unroll
      for (int i = 0; i < TM; ++i)
        LoadAFragment(a[s][i], ws, wm * TM * 16 + i * 16, C::kLd, kk, lane);
      if constexpr (X_F32) {
#pragma unroll
        for (int j = 0; j < TN; ++j)
          LoadBFragmentF32(b[s][j], reinterpret_cast<const float*>(xs), wn * TN * 8 + j * 8, C::kLd,
                           kk, lane);
      } else {
#pragma unroll
        for (int j = 0; j < TN; j += 2)
          LoadBFragmentsBf16(b[s][j], b[s][j + 1], reinterpret_cast<const __nv_bfloat16*>(xs),
                             wn * TN * 8 + j * 8, C::kLd, kk, lane);
      }
    }
#pragma unroll
    for (int s = 0; s < KG; ++s) {
      if (kGuard && k0 + 16 * s >= k_left) break;
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) Mma(acc[i][j], a[s][i], b[s][j][0], b[s][j][1]);
    }
  }
}

template <int W, int WM, int WN, int TM, int TN, int BK, bool X_F32>
__global__ void __launch_bounds__(W * 32, W == 8 ? 2 : 1)
    GemmKernel(const void* __restrict__ x, GemmParts p, int64_t n, int64_t k, int stages) {
  using C = Config<W, WM, WN, TM, TN, BK, X_F32>;
  // k16 steps whose fragments are loaded together: all of a stage for the skinny tiles, two for
  // the mid ones, one for 128 x 128 (whose registers go to the 64 accumulators).
  constexpr int kKG = TM * TN <= 4 ? BK / 16 : TM * TN <= 8 ? 2 : 1;
  extern __shared__ __align__(16) unsigned char smem[];
  const PartTile pt = SelectPart(p, blockIdx.x, C::kBM);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * C::kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % WM, wn = (warp / WM) % WN;
  const bool computes = warp < WM * WN;
  const int g = lane / 4, t = lane % 4;
  const int64_t ktiles = (k + BK - 1) / BK;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // This thread's copies: fixed rows and columns within a stage, so one source pointer each,
  // advanced by BK per stage. Rows past m (or n) are not copied: they only feed outputs that
  // are never stored. Columns past k are zero-filled.
  const __nv_bfloat16* wsrc[C::kWCopies];
  uint32_t wdst[C::kWCopies];
  int wcol[C::kWCopies];
  bool wrow_ok[C::kWCopies];
#pragma unroll
  for (int i = 0; i < C::kWCopies; ++i) {
    const int c = threadIdx.x + i * C::kThreads, r = c / C::kWPerRow, cc = c % C::kWPerRow;
    wrow_ok[i] = pt.m0 + r < pt.m;
    wsrc[i] = pt.w + (wrow_ok[i] ? (pt.m0 + r) * k : 0) + cc * 8;
    wdst[i] = static_cast<uint32_t>((r * C::kLd + cc * 8) * 2);
    wcol[i] = cc * 8;
  }
  const unsigned char* xsrc[C::kXCopies];
  uint32_t xdst[C::kXCopies];
  int xcol[C::kXCopies];
  bool xrow_ok[C::kXCopies];
#pragma unroll
  for (int i = 0; i < C::kXCopies; ++i) {
    const int c = threadIdx.x + i * C::kThreads, r = c / C::kXPerRow, cc = c % C::kXPerRow;
    xrow_ok[i] = n0 + r < n;
    xsrc[i] = static_cast<const unsigned char*>(x) +
              ((xrow_ok[i] ? (n0 + r) * k : 0) + cc * C::kXPer) * C::kXElem;
    xdst[i] = static_cast<uint32_t>(C::kWBytes + (r * C::kLd + cc * C::kXPer) * C::kXElem);
    xcol[i] = cc * C::kXPer;
  }
  // A launch of one CTA column reads each weight once: its lines go first from the L2. Wider
  // launches read every weight tile once per column, so those keep the normal priority.
  const uint64_t w_policy = gridDim.y == 1 ? EvictFirstPolicy() : EvictNormalPolicy();
  auto load_w = [&](int64_t kt, int slot) {
    const uint32_t base = smem0 + slot * C::kStageBytes;
#pragma unroll
    for (int i = 0; i < C::kWCopies; ++i) {
      const bool in_k = kt * BK + wcol[i] < k;
      if (wrow_ok[i])
        CpAsync16(base + wdst[i], in_k ? wsrc[i] + kt * BK : wsrc[i], in_k, w_policy);
    }
  };
  auto load_x = [&](int64_t kt, int slot) {
    const uint32_t base = smem0 + slot * C::kStageBytes;
#pragma unroll
    for (int i = 0; i < C::kXCopies; ++i) {
      const bool in_k = kt * BK + xcol[i] < k;
      if (xrow_ok[i])
        CpAsync16(base + xdst[i], in_k ? xsrc[i] + kt * BK * C::kXElem : xsrc[i], in_k);
    }
  };

  float acc[TM][TN][4];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  // Weights of the first stages stream in while the previous kernel finishes (no x yet).
  for (int s = 0; s < stages - 1; ++s)
    if (s < ktiles) load_w(s, s);
  PdlWait();
  for (int s = 0; s < stages - 1; ++s) {
    if (s < ktiles) load_x(s, s);
    CpAsyncCommit();
  }

  int slot = 0;
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    CpAsyncWaitPending(stages - 2);  // stage kt has landed (this thread's copies)
    __syncthreads();                 // ... everyone's; and stage kt - 1's slot is free to refill
    {
      const int64_t next = kt + stages - 1;
      const int next_slot = slot == 0 ? stages - 1 : slot - 1;
      if (next < ktiles) {
        load_w(next, next_slot);
        load_x(next, next_slot);
      }
      CpAsyncCommit();
    }
    if (computes) {
      const __nv_bfloat16* ws =
          reinterpret_cast<const __nv_bfloat16*>(smem + slot * C::kStageBytes);
      const unsigned char* xs = smem + slot * C::kStageBytes + C::kWBytes;
      // Full stages run unguarded, so the compiler can hoist every fragment load of the stage
      // above the mma chain; only the last, partial stage checks each k16 step.
      if (kt * BK + BK <= k) {
        ComputeStage<C, TM, TN, BK, kKG, X_F32, false>(acc, ws, xs, wm, wn, lane, 0);
      } else {
        ComputeStage<C, TM, TN, BK, kKG, X_F32, true>(acc, ws, xs, wm, wn, lane, k - kt * BK);
      }
    }
    slot = slot == stages - 1 ? 0 : slot + 1;
  }
  CpAsyncWait<0>();
  if (!computes) return;
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j)
      StoreTile(pt, acc[i][j], pt.m0 + wm * TM * 16 + i * 16 + g,
                n0 + wn * TN * 8 + j * 8 + 2 * t, n);
}

// One warp per (m16, n8) tile, fragments straight from global memory (any k, any alignment):
// the same fragment values and mma sequence as GemmKernel.
__global__ void __launch_bounds__(32)
    GemmGenericKernel(const float* __restrict__ x, GemmParts p, int64_t n, int64_t k) {
  const PartTile pt = SelectPart(p, blockIdx.x, 16);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * 8;
  const int g = threadIdx.x / 4, t = threadIdx.x % 4;
  const int64_t wr0 = pt.m0 + g, wr1 = wr0 + 8, xr = n0 + g;
  auto wpair = [&](int64_t row, int64_t c) -> uint32_t {
    const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
    __nv_bfloat162 v;
    v.x = row < pt.m && c < k ? pt.w[row * k + c] : z;
    v.y = row < pt.m && c + 1 < k ? pt.w[row * k + c + 1] : z;
    return *reinterpret_cast<const uint32_t*>(&v);
  };
  auto xpair = [&](int64_t c) -> uint32_t {
    const float lo = xr < n && c < k ? x[xr * k + c] : 0.f;
    const float hi = xr < n && c + 1 < k ? x[xr * k + c + 1] : 0.f;
    return PackBf16(lo, hi);
  };
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    const int64_t c0 = k0 + 2 * t, c1 = c0 + 8;
    const uint32_t a[4] = {wpair(wr0, c0), wpair(wr1, c0), wpair(wr0, c1), wpair(wr1, c1)};
    Mma(acc, a, xpair(c0), xpair(c1));
  }
  StoreTile(pt, acc, pt.m0 + g, n0 + 2 * t, n);
}

GemmParts MakeParts(const GemvPart* parts, int num_parts, int rows_per_tile) {
  CHECK(num_parts >= 1 && num_parts <= kGemvMaxParts) << num_parts << " GEMM parts";
  GemmParts p{};
  int32_t end = 0;
  for (int i = 0; i < num_parts; ++i) {
    p.w[i] = static_cast<const __nv_bfloat16*>(parts[i].w);
    p.bias[i] = parts[i].bias;
    p.out[i] = parts[i].out;
    p.m[i] = parts[i].m;
    end += static_cast<int32_t>((parts[i].m + rows_per_tile - 1) / rows_per_tile);
    p.tile_end[i] = end;
  }
  p.count = num_parts;
  return p;
}

constexpr int kSmemPerSm = 220 * 1024;  // of the H200's 228 KB, leaving room for L1 / reserved

int64_t MTiles(const GemvPart* parts, int num_parts, int rows) {
  int64_t tiles = 0;
  for (int i = 0; i < num_parts; ++i) tiles += (parts[i].m + rows - 1) / rows;
  return tiles;
}

// Launches one configuration; stages == 0: as deep a ring as the CTAs per SM leave room for.
template <int W, int WM, int WN, int TM, int TN, int BK, bool X_F32>
void Launch(const void* x, const GemvPart* parts, int num_parts, int64_t n, int64_t k,
            int stages, cudaStream_t stream) {
  using C = Config<W, WM, WN, TM, TN, BK, X_F32>;
  auto* kernel = GemmKernel<W, WM, WN, TM, TN, BK, X_F32>;
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kSmemPerSm));
    return true;
  }();
  (void)configured;
  const GemmParts p = MakeParts(parts, num_parts, C::kBM);
  const int64_t tiles = p.tile_end[num_parts - 1];
  const int64_t groups = (n + C::kBN - 1) / C::kBN;
  CHECK(groups <= 65535) << n << " GEMM rows";
  if (tiles == 0) return;
  if (stages == 0) {
    const int64_t sms = CurrentDeviceSmCount();
    const int64_t per_sm = std::clamp<int64_t>((tiles * groups + sms - 1) / sms, 1, 4);
    const int64_t ktiles = (k + BK - 1) / BK;
    stages = kStageChoices[0];
    for (int s : kStageChoices)
      if (s * C::kStageBytes * per_sm <= kSmemPerSm && s <= ktiles + 1) stages = s;
  }
  const size_t smem = static_cast<size_t>(stages) * C::kStageBytes;
  CHECK(smem <= static_cast<size_t>(kSmemPerSm)) << "GEMM ring of " << smem << " bytes";
  LaunchPdl(kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(groups)),
            dim3(C::kThreads), smem, stream, x, p, n, k, stages);
}

// The skinny variant for n rows: NT n8 tiles per warp, 4 warps per CTA of which 1, 2 or 4
// compute (one m16 tile each) and all copy: few tiles still get many CTAs and copy threads.
template <int NT>
void LaunchSkinny(const float* x, const GemvPart* parts, int num_parts, int64_t n, int64_t k,
                  cudaStream_t stream) {
  const int64_t tiles = MTiles(parts, num_parts, 16) * ((n + NT * 8 - 1) / (NT * 8));
  if (tiles >= 8 * CurrentDeviceSmCount()) {
    Launch<4, 4, 1, 1, NT, 64, true>(x, parts, num_parts, n, k, 0, stream);
  } else if (tiles >= 3 * CurrentDeviceSmCount()) {
    Launch<4, 2, 1, 1, NT, 128, true>(x, parts, num_parts, n, k, 0, stream);
  } else {
    Launch<4, 1, 1, 1, NT, 128, true>(x, parts, num_parts, n, k, 0, stream);
  }
}

bool GemmInvariantFast(const void* x, const GemvPart* parts, int num_parts, int64_t k) {
  bool ok = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  for (int i = 0; i < num_parts; ++i) ok = ok && reinterpret_cast<uintptr_t>(parts[i].w) % 16 == 0;
  return ok;
}

}  // namespace

int64_t GemmInvariantScratchBytes(int64_t n, int64_t k) {
  return n > kGemmSkinnyMaxRows ? n * k * 2 : 0;
}

void LaunchGemmInvariant(const float* x, void* x_bf16, const GemvPart* parts, int num_parts,
                         int64_t n, int64_t k, int tiled_variant, cudaStream_t stream) {
  if (n <= 0) return;
  const bool fast = GemmInvariantFast(x, parts, num_parts, k) &&
                    (n <= kGemmSkinnyMaxRows || reinterpret_cast<uintptr_t>(x_bf16) % 16 == 0);
  if (!fast) {
    const GemmParts p = MakeParts(parts, num_parts, 16);
    if (p.tile_end[num_parts - 1] == 0) return;
    const int64_t groups = (n + 7) / 8;
    CHECK(groups <= 65535) << n << " GEMM rows";
    GemmGenericKernel<<<dim3(static_cast<unsigned>(p.tile_end[num_parts - 1]),
                             static_cast<unsigned>(groups)),
                        32, 0, stream>>>(x, p, n, k);
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (n <= 8) return LaunchSkinny<1>(x, parts, num_parts, n, k, stream);
  if (n <= 16) return LaunchSkinny<2>(x, parts, num_parts, n, k, stream);
  if (n <= kGemmSkinnyMaxRows) return LaunchSkinny<4>(x, parts, num_parts, n, k, stream);
  CHECK(x_bf16 != nullptr) << "GEMM of " << n << " rows without a bf16 scratch";
  LaunchConvert(x, ElemType::kF32, x_bf16, ElemType::kBF16, n * k, stream);
  // The largest CTA tile (m x n) that still gives every SM a CTA, else the smallest.
  const int64_t groups = (n + 127) / 128, sms = CurrentDeviceSmCount();
  if (MTiles(parts, num_parts, 128) * groups >= sms) {
    if (tiled_variant == 1) {  // A/B: 4 stages of k32
      Launch<8, 2, 4, 4, 4, 32, false>(x_bf16, parts, num_parts, n, k, 4, stream);
    } else {
      Launch<8, 2, 4, 4, 4, 64, false>(x_bf16, parts, num_parts, n, k, 3, stream);  // 128 x 128
    }
  } else if (MTiles(parts, num_parts, 64) * groups >= sms) {
    Launch<8, 2, 4, 2, 4, 32, false>(x_bf16, parts, num_parts, n, k, 4, stream);  // 64 x 128
  } else if (MTiles(parts, num_parts, 32) * groups >= sms) {
    Launch<4, 1, 4, 2, 4, 32, false>(x_bf16, parts, num_parts, n, k, 4, stream);  // 32 x 128
  } else {
    Launch<4, 1, 4, 1, 4, 64, false>(x_bf16, parts, num_parts, n, k, 4, stream);  // 16 x 128
  }
}

}  // namespace ember::cuda
