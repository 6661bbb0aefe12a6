// SampleRows: one block per sampled row draws its token on the device with the algorithm of
// backend/threshold_sampling.cc (its CPU twin): weights w = exp((logit - max) / T), every filter
// (top-k, top-p, min-p) and the draw a search for a weight threshold by bisection over the
// float's bits, each probe one block-wide pass of counts and masses, then the r-th tie in id
// order. Only the ids travel back to the host.
#include <cfloat>
#include <climits>
#include <cstdint>

#include "backend/cuda/block_argmax.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

struct Shared {
  long long count[kWarps];
  double mass[kWarps];
  long long ties[kThreads];
  long long out_count;
  double out_mass;
  int out_i;
};

struct Row {
  const float* logits;
  int64_t n;
  float max, inv_t;
  __device__ float W(int64_t i) const {
    const float l = logits[i];
    if (l != l) return 0.0f;
    const float w = expf((l - max) * inv_t);
    return w < FLT_MIN ? 0.0f : w;
  }
};

// Block-wide count and mass of the weights > t (strict) or >= t; every thread gets the result.
__device__ void Above(const Row& row, float t, bool strict, Shared& s, long long* count,
                      double* mass) {
  long long c = 0;
  double m = 0.0;
  for (int64_t i = threadIdx.x; i < row.n; i += kThreads) {
    const float w = row.W(i);
    if (strict ? w > t : w >= t) {
      ++c;
      m += w;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    c += __shfl_down_sync(0xffffffffu, c, off);
    m += __shfl_down_sync(0xffffffffu, m, off);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s.count[warp] = c;
    s.mass[warp] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    long long tc = 0;
    double tm = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      tc += s.count[w];
      tm += s.mass[w];
    }
    s.out_count = tc;
    s.out_mass = tm;
  }
  __syncthreads();
  *count = s.out_count;
  *mass = s.out_mass;
  __syncthreads();
}

struct Prefix {
  float t;
  long long ties;
};

__device__ double MassOf(const Row& row, const Prefix& p, Shared& s) {
  long long c;
  double m;
  Above(row, p.t, true, s, &c, &m);
  return m + static_cast<double>(p.ties) * p.t;
}

__device__ long long TiesAt(const Row& row, float t, Shared& s) {
  long long ge, gt;
  double m;
  Above(row, t, false, s, &ge, &m);
  Above(row, t, true, s, &gt, &m);
  return ge - gt;
}

__device__ double MassAtLeast(const Row& row, const Prefix& kept, float x, Shared& s) {
  if (x > kept.t) {
    long long c;
    double m;
    Above(row, x, false, s, &c, &m);
    return m;
  }
  return MassOf(row, kept, s);
}

// Largest float t in [low, 1] with pred(t) (monotone; true at low). Uniform across the block.
template <typename Pred>
__device__ float LargestWhere(float low, Pred pred) {
  if (pred(1.0f)) return 1.0f;
  unsigned lo = __float_as_uint(low), hi = __float_as_uint(1.0f);
  while (hi - lo > 1) {
    const unsigned mid = lo + (hi - lo) / 2;
    if (pred(__uint_as_float(mid)))
      lo = mid;
    else
      hi = mid;
  }
  return __uint_as_float(lo);
}

__device__ Prefix FirstN(const Row& row, long long n, Shared& s) {
  const float t = LargestWhere(FLT_MIN, [&](float x) {
    long long c;
    double m;
    Above(row, x, false, s, &c, &m);
    return c >= n;
  });
  long long above;
  double m;
  Above(row, t, true, s, &above, &m);
  return {t, n - above};
}

// The id of the r-th (1-based) token of weight t in id order: each thread scans a contiguous
// range, thread 0 prefix-sums the per-thread counts.
__device__ int NthTie(const Row& row, float t, long long r, Shared& s) {
  const int64_t chunk = (row.n + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * chunk, end = min(row.n, begin + chunk);
  long long c = 0;
  for (int64_t i = begin; i < end; ++i) c += row.W(i) == t;
  s.ties[threadIdx.x] = c;
  if (threadIdx.x == 0) s.out_i = -1;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long before = 0;
    for (int k = 0; k < kThreads; ++k) {
      const long long here = s.ties[k];
      s.ties[k] = before;
      before += here;
    }
  }
  __syncthreads();
  const long long first = s.ties[threadIdx.x];
  if (c > 0 && r > first && r <= first + c) {
    long long need = r - first;
    for (int64_t i = begin; i < end; ++i) {
      if (row.W(i) == t && --need == 0) {
        s.out_i = static_cast<int>(i);
        break;
      }
    }
  }
  __syncthreads();
  const int id = s.out_i;
  __syncthreads();
  return id;
}

__global__ void SampleRowsKernel(const float* __restrict__ x, int64_t cols,
                                 const int32_t* __restrict__ rows,
                                 const SampleRowParams* __restrict__ params,
                                 int32_t* __restrict__ ids) {
  __shared__ Shared s;
  const SampleRowParams p = params[blockIdx.x];
  const float* logits = x + static_cast<int64_t>(rows[blockIdx.x]) * cols;
  float row_max;
  int argmax;
  BlockArgmax<kThreads>(logits, cols, &row_max, &argmax);
  if (!isfinite(row_max)) {  // all -inf, or +inf present: the host falls back to argmax
    if (threadIdx.x == 0) ids[blockIdx.x] = argmax;
    return;
  }
  const Row row{logits, cols, row_max, 1.0f / p.temperature};
  long long positive;
  double total;
  Above(row, 0.0f, true, s, &positive, &total);
  long long kept_len = positive;
  Prefix kept{0.0f, 0};
  if (p.top_k > 0 && p.top_k < positive) {
    kept = FirstN(row, p.top_k, s);
    kept_len = p.top_k;
  }
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * MassOf(row, kept, s);
    const float t = LargestWhere(kept.t > 0.0f ? kept.t : FLT_MIN,
                                 [&](float v) { return MassAtLeast(row, kept, v, s) >= target; });
    long long above;
    double mass_above;
    Above(row, t, true, s, &above, &mass_above);
    long long ties = static_cast<long long>(ceil((target - mass_above) / t));
    const long long available = t == kept.t ? kept.ties : TiesAt(row, t, s);
    ties = max(1LL, min(ties, max(available, 1LL)));
    kept_len = min(kept_len, above + ties);
  }
  if (p.min_p > 0.0f) {
    long long at_least;
    double m;
    Above(row, p.min_p, false, s, &at_least, &m);
    kept_len = min(kept_len, max(at_least, 1LL));
  }
  if (kept_len < positive) kept = FirstN(row, kept_len, s);

  const double target = p.u * MassOf(row, kept, s);
  const float t = LargestWhere(kept.t > 0.0f ? kept.t : FLT_MIN,
                               [&](float v) { return MassAtLeast(row, kept, v, s) > target; });
  long long above;
  double mass_above;
  Above(row, t, true, s, &above, &mass_above);
  const long long available = t == kept.t ? kept.ties : TiesAt(row, t, s);
  long long r = static_cast<long long>(floor((target - mass_above) / t)) + 1;
  r = max(1LL, min(r, max(available, 1LL)));
  const int id = NthTie(row, t, r, s);
  if (threadIdx.x == 0) ids[blockIdx.x] = id;
}

}  // namespace

void LaunchSampleRows(const float* x, int64_t cols, const int32_t* rows,
                      const SampleRowParams* params, int32_t num_rows, int32_t* ids,
                      cudaStream_t stream) {
  if (num_rows == 0) return;
  SampleRowsKernel<<<static_cast<unsigned>(num_rows), kThreads, 0, stream>>>(x, cols, rows, params,
                                                                             ids);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda
