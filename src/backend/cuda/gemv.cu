// Skinny MatMul for decode (n <= 8 rows; the backend uses it for n == 1, where it is fastest, and
// gemm_invariant.cu for 2..8 rows): out_p[n, m_p] = x[n, k] W_p[m_p, k]^T (+ bias_p) for up
// to kGemvMaxParts weights sharing one x (q/k/v, gate/up) in ONE launch. bf16 W read once with
// 16-byte loads (double-buffered, 4 per lane per batch; the first batch is issued before
// waiting on the previous kernel: programmatic dependent launch, pdl.cuh), f32 x, f32 accumulation, one warp per
// output row. (Splitting a row's k over 2-8 warps of a block, to give small matrices more warps,
// measured slower on the H200: 8B decode 156 vs 166 tok/s.) The summation order depends only on
// k, never on n, so rows are batch-invariant within this path.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace ember::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kLoadsInFlight = 4;  // 16-byte weight loads per lane issued before their use

struct GemvParams {
  const __nv_bfloat16* w[kGemvMaxParts];
  const float* bias[kGemvMaxParts];
  float* out[kGemvMaxParts];
  int64_t m[kGemvMaxParts];
  int64_t end[kGemvMaxParts];  // exclusive prefix sums of m
  int64_t total;               // end[count - 1]
  int count;
};

// Block: kWarpsPerBlock output rows (over the concatenation of the parts), one per warp.
template <int N>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvBf16Kernel(const float* __restrict__ x, GemvParams p, int64_t k) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= p.total) return;  // (a run-time index into p would put p in local memory)
  // Select the part with constant indices only.
  const int part = (p.count > 1 && row >= p.end[0]) + (p.count > 2 && row >= p.end[1]);
  const int64_t local = row - (part == 0 ? 0 : part == 1 ? p.end[0] : p.end[1]);
  const __nv_bfloat16* w_part = part == 0 ? p.w[0] : part == 1 ? p.w[1] : p.w[2];
  const float* bias = part == 0 ? p.bias[0] : part == 1 ? p.bias[1] : p.bias[2];
  float* out = part == 0 ? p.out[0] : part == 1 ? p.out[1] : p.out[2];
  const int64_t m = part == 0 ? p.m[0] : part == 1 ? p.m[1] : p.m[2];

  float acc[N];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = 0.f;
  const __nv_bfloat16* w_row = w_part + local * k;
  constexpr int64_t kStride = 32 * 8;  // elements between one lane's consecutive loads
  constexpr int64_t kStep = kStride * kLoadsInFlight;
  auto load = [&](uint4 (&raw)[kLoadsInFlight], int64_t base) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t c = base + u * kStride;
      raw[u] = c < k ? __ldg(reinterpret_cast<const uint4*>(w_row + c)) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first weights stream in while the previous kernel finishes (x is not read before this).
  uint4 cur[kLoadsInFlight];
  load(cur, lane * 8);
  PdlWait();
  for (int64_t base = lane * 8; base < k; base += kStep) {
    uint4 next[kLoadsInFlight];
    load(next, base + kStep);  // double-buffered: up to 2 x kLoadsInFlight loads in flight
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t c = base + u * kStride;
      if (c >= k) break;
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&cur[u]);
      float wf[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(pairs[i]);
        wf[2 * i] = f.x;
        wf[2 * i + 1] = f.y;
      }
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float4 x0 = __ldg(reinterpret_cast<const float4*>(x + j * k + c));
        const float4 x1 = __ldg(reinterpret_cast<const float4*>(x + j * k + c + 4));
        acc[j] += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w + wf[4] * x1.x +
                  wf[5] * x1.y + wf[6] * x1.z + wf[7] * x1.w;
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) cur[u] = next[u];
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float v = WarpSum(acc[j]);
    if (lane == 0) out[j * m + local] = v + (bias != nullptr ? bias[local] : 0.f);
  }
}

template <int N>
void LaunchN(const float* x, const GemvParams& p, int64_t k, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((p.total + kWarpsPerBlock - 1) / kWarpsPerBlock);
  LaunchPdl(GemvBf16Kernel<N>, dim3(blocks), dim3(kWarpsPerBlock * 32), 0, stream, x, p, k);
}

}  // namespace

bool GemvBf16Supported(const void* x, const void* w, int64_t n, int64_t k) {
  return n >= 1 && n <= kGemvMaxRows && k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0 &&
         (reinterpret_cast<uintptr_t>(w) % 16) == 0;
}

void LaunchGemvBf16Multi(const float* x, const GemvPart* parts, int num_parts, int64_t n,
                         int64_t k, cudaStream_t stream) {
  CHECK(num_parts >= 1 && num_parts <= kGemvMaxParts) << num_parts << " GEMV parts";
  GemvParams p{};
  int64_t end = 0;
  for (int i = 0; i < num_parts; ++i) {
    p.w[i] = static_cast<const __nv_bfloat16*>(parts[i].w);
    p.bias[i] = parts[i].bias;
    p.out[i] = parts[i].out;
    p.m[i] = parts[i].m;
    end += parts[i].m;
    p.end[i] = end;
  }
  p.count = num_parts;
  p.total = end;
  if (end == 0) return;
  switch (n) {
    case 1: return LaunchN<1>(x, p, k, stream);
    case 2: return LaunchN<2>(x, p, k, stream);
    case 3: return LaunchN<3>(x, p, k, stream);
    case 4: return LaunchN<4>(x, p, k, stream);
    case 5: return LaunchN<5>(x, p, k, stream);
    case 6: return LaunchN<6>(x, p, k, stream);
    case 7: return LaunchN<7>(x, p, k, stream);
    case 8: return LaunchN<8>(x, p, k, stream);
    default: CHECK(false) << "GEMV with " << n << " rows";
  }
}

void LaunchGemvBf16(const float* x, const void* w, const float* bias, float* out, int64_t n,
                    int64_t m, int64_t k, cudaStream_t stream) {
  const GemvPart part{w, bias, out, m};
  LaunchGemvBf16Multi(x, &part, 1, n, k, stream);
}

}  // namespace ember::cuda
