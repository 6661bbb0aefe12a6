// SampleRows: draws each sampled row's token on the device with the algorithm of
// backend/threshold_sampling.cc (its CPU twin): weights w = exp((logit - max) / T), every filter
// (top-k, top-p, min-p) and the draw a search for a weight threshold by bisection over the
// float's bits, each probe one pass of counts and masses over the row, then the r-th tie in id
// order. Only the ids travel back to the host.
//
// Two kernels run that one algorithm (SampleWith, generic over the reduction context):
//   - RowBlock: one 1,024-thread block per row reading the row from global memory each pass
//     (many rows: the rows fill the GPU);
//   - RowCluster: a thread-block cluster of 8 or 16 blocks per row (few rows, batch-1 decode):
//     each block holds its slice of the row's weights in shared memory, computed once, and a pass
//     is one read of that slice plus a cluster-wide sum of the blocks' partials through
//     distributed shared memory, in block-rank order (the same in every block, so every block
//     takes the same branches). ~100 passes cost ~1.9 ms for one 128k row on one SM; here each
//     pass reads 1/16 of the row from shared memory.
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "backend/cuda/block_argmax.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ember::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__device__ float Weight(float logit, float max, float inv_t) {
  if (logit != logit) return 0.0f;
  const float w = expf((logit - max) * inv_t);
  return w < FLT_MIN ? 0.0f : w;
}

static_assert(kWarps == 32, "BlockSum folds one warp partial per lane of warp 0");

// (count, mass) summed over a warp in a fixed tree order; lane 0 gets the total.
__device__ void WarpSum(long long& c, double& m) {
  for (int off = 16; off > 0; off >>= 1) {
    c += __shfl_down_sync(0xffffffffu, c, off);
    m += __shfl_down_sync(0xffffffffu, m, off);
  }
}

// Sums (count, mass) over the block: per warp, then the 32 warp partials by warp 0, each a
// shuffle tree (a fixed order: the same bits in every block that sums the same values). The
// block total lands in *count / *mass, written by thread 0 only.
__device__ void BlockSum(long long c, double m, long long* warp_count, double* warp_mass,
                         long long* count, double* mass) {
  WarpSum(c, m);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_count[warp] = c;
    warp_mass[warp] = m;
  }
  __syncthreads();
  if (warp == 0) {
    c = warp_count[lane];
    m = warp_mass[lane];
    WarpSum(c, m);
    if (lane == 0) {
      *count = c;
      *mass = m;
    }
  }
}

// Exclusive prefix sum of one value per thread over the block (thread order); every thread gets
// its prefix and the block total.
__device__ long long BlockExclusiveScan(long long v, long long* warp_sums, long long* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  long long inclusive = v;
  for (int off = 1; off < 32; off <<= 1) {
    const long long o = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += o;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long run = 0;
    for (int w = 0; w < kWarps; ++w) {
      const long long here = warp_sums[w];
      warp_sums[w] = run;
      run += here;
    }
    warp_sums[kWarps] = run;
  }
  __syncthreads();
  const long long result = warp_sums[warp] + inclusive - v;
  *total = warp_sums[kWarps];
  __syncthreads();
  return result;
}

// ---- one block per row ----

struct BlockShared {
  long long count[kWarps];
  double mass[kWarps];
  long long scan[kWarps + 1];
  long long out_count;
  double out_mass;
  int out_i;
};

struct RowBlock {
  const float* logits;
  int64_t n;
  float max, inv_t;
  BlockShared& s;

  __device__ bool leader() const { return threadIdx.x == 0; }
  __device__ float W(int64_t i) const { return Weight(logits[i], max, inv_t); }
  // Block-wide count and mass of the weights > t (strict) or >= t; every thread gets the result.
  __device__ void Above(float t, bool strict, long long* count, double* mass) {
    long long c = 0;
    double m = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      const float w = W(i);
      if (strict ? w > t : w >= t) {
        ++c;
        m += w;
      }
    }
    BlockSum(c, m, s.count, s.mass, &s.out_count, &s.out_mass);
    __syncthreads();
    *count = s.out_count;
    *mass = s.out_mass;
    __syncthreads();
  }
  // The id of the r-th (1-based) token of weight t in id order: each thread scans a contiguous
  // range; the block's exclusive scan of the per-thread counts places it.
  __device__ int NthTie(float t, long long r) {
    const int64_t chunk = (n + kThreads - 1) / kThreads;
    const int64_t begin = threadIdx.x * chunk, end = min(n, begin + chunk);
    long long c = 0;
    for (int64_t i = begin; i < end; ++i) c += W(i) == t;
    if (threadIdx.x == 0) s.out_i = -1;
    long long total;
    const long long first = BlockExclusiveScan(c, s.scan, &total);
    if (c > 0 && r > first && r <= first + c) {
      long long need = r - first;
      for (int64_t i = begin; i < end; ++i) {
        if (W(i) == t && --need == 0) {
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
};

// ---- a cluster of blocks per row ----

struct ClusterShared {
  long long count[kWarps];
  double mass[kWarps];
  long long scan[kWarps + 1];
  long long part_count[2];  // this block's partial, double-buffered across reductions
  double part_mass[2];
  long long out_count;
  double out_mass;
  float slice_max;
  int slice_index;  // global id of the slice's argmax, -1 when the slice has no non-NaN
  float row_max;
  int row_argmax;
  int found;        // the NthTie id when this block holds it, else -1
};

struct RowCluster {
  const float* w;  // [len] this block's weights, in shared memory
  int64_t len, offset;
  ClusterShared& s;
  cg::cluster_group cluster;
  int buf = 0;

  __device__ bool leader() const { return threadIdx.x == 0 && cluster.block_rank() == 0; }
  // Every block's partial is published in its part_*[buf], then warp 0 of each block loads
  // them (lane k from rank k, in parallel) and folds them in one shuffle tree: the same order,
  // hence the same bits, in every block. Double buffering makes one cluster barrier per
  // reduction enough: a block writes part_*[buf] again two reductions later, after every block
  // passed the barrier in between (so finished reading it).
  __device__ void ClusterSum(long long* count, double* mass) {
    cluster.sync();
    if (threadIdx.x < 32) {
      long long c = 0;
      double m = 0.0;
      if (threadIdx.x < cluster.num_blocks()) {
        const ClusterShared* other = cluster.map_shared_rank(&s, threadIdx.x);
        c = other->part_count[buf];
        m = other->part_mass[buf];
      }
      WarpSum(c, m);
      if (threadIdx.x == 0) {
        s.out_count = c;
        s.out_mass = m;
      }
    }
    __syncthreads();
    *count = s.out_count;
    *mass = s.out_mass;
    __syncthreads();
    buf ^= 1;
  }
  __device__ void Above(float t, bool strict, long long* count, double* mass) {
    long long c = 0;
    double m = 0.0;
    for (int64_t i = threadIdx.x; i < len; i += kThreads) {
      const float v = w[i];
      if (strict ? v > t : v >= t) {
        ++c;
        m += v;
      }
    }
    BlockSum(c, m, s.count, s.mass, &s.part_count[buf], &s.part_mass[buf]);
    ClusterSum(count, mass);
  }
  // As RowBlock::NthTie over the cluster: blocks hold consecutive slices, so a block's first
  // tie rank is the sum of the lower ranks' tie counts. The id reaches the leader.
  __device__ int NthTie(float t, long long r) {
    const int64_t chunk = (len + kThreads - 1) / kThreads;
    const int64_t begin = threadIdx.x * chunk, end = min(len, begin + chunk);
    long long c = 0;
    for (int64_t i = begin; i < end; ++i) c += w[i] == t;
    if (threadIdx.x == 0) s.found = -1;
    long long block_total;
    const long long in_block = BlockExclusiveScan(c, s.scan, &block_total);
    if (threadIdx.x == 0) s.part_count[buf] = block_total;
    cluster.sync();
    if (threadIdx.x == 0) {
      long long before = 0;
      for (unsigned k = 0; k < cluster.block_rank(); ++k)
        before += cluster.map_shared_rank(&s, k)->part_count[buf];
      s.out_count = before;
    }
    __syncthreads();
    const long long first = s.out_count + in_block;
    if (c > 0 && r > first && r <= first + c) {
      long long need = r - first;
      for (int64_t i = begin; i < end; ++i) {
        if (w[i] == t && --need == 0) {
          s.found = static_cast<int>(offset + i);
          break;
        }
      }
    }
    cluster.sync();  // every block's `found` is final
    int id = -1;
    if (leader()) {
      for (unsigned k = 0; k < cluster.num_blocks(); ++k)
        id = max(id, cluster.map_shared_rank(&s, k)->found);
    }
    buf ^= 1;
    return id;
  }
};

// ---- the algorithm (threshold_sampling.cc's ThresholdSample), over either context ----

struct Prefix {
  float t;
  long long ties;
};

template <typename Ctx>
__device__ double MassOf(Ctx& ctx, const Prefix& p) {
  long long c;
  double m;
  ctx.Above(p.t, true, &c, &m);
  return m + static_cast<double>(p.ties) * p.t;
}

template <typename Ctx>
__device__ long long TiesAt(Ctx& ctx, float t) {
  long long ge, gt;
  double m;
  ctx.Above(t, false, &ge, &m);
  ctx.Above(t, true, &gt, &m);
  return ge - gt;
}

template <typename Ctx>
__device__ double MassAtLeast(Ctx& ctx, const Prefix& kept, float x) {
  if (x > kept.t) {
    long long c;
    double m;
    ctx.Above(x, false, &c, &m);
    return m;
  }
  return MassOf(ctx, kept);
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

template <typename Ctx>
__device__ Prefix FirstN(Ctx& ctx, long long n) {
  const float t = LargestWhere(FLT_MIN, [&](float x) {
    long long c;
    double m;
    ctx.Above(x, false, &c, &m);
    return c >= n;
  });
  long long above;
  double m;
  ctx.Above(t, true, &above, &m);
  return {t, n - above};
}

// The token of a row whose maximum is finite; meaningful in the context's leader thread.
template <typename Ctx>
__device__ int SampleWith(Ctx& ctx, const SampleRowParams& p) {
  long long positive;
  double total;
  ctx.Above(0.0f, true, &positive, &total);
  long long kept_len = positive;
  Prefix kept{0.0f, 0};
  if (p.top_k > 0 && p.top_k < positive) {
    kept = FirstN(ctx, p.top_k);
    kept_len = p.top_k;
  }
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * MassOf(ctx, kept);
    const float t = LargestWhere(kept.t > 0.0f ? kept.t : FLT_MIN,
                                 [&](float v) { return MassAtLeast(ctx, kept, v) >= target; });
    long long above;
    double mass_above;
    ctx.Above(t, true, &above, &mass_above);
    long long ties = static_cast<long long>(ceil((target - mass_above) / t));
    const long long available = t == kept.t ? kept.ties : TiesAt(ctx, t);
    ties = max(1LL, min(ties, max(available, 1LL)));
    kept_len = min(kept_len, above + ties);
  }
  if (p.min_p > 0.0f) {
    long long at_least;
    double m;
    ctx.Above(p.min_p, false, &at_least, &m);
    kept_len = min(kept_len, max(at_least, 1LL));
  }
  if (kept_len < positive) kept = FirstN(ctx, kept_len);

  const double target = p.u * MassOf(ctx, kept);
  const float t = LargestWhere(kept.t > 0.0f ? kept.t : FLT_MIN,
                               [&](float v) { return MassAtLeast(ctx, kept, v) > target; });
  long long above;
  double mass_above;
  ctx.Above(t, true, &above, &mass_above);
  const long long available = t == kept.t ? kept.ties : TiesAt(ctx, t);
  long long r = static_cast<long long>(floor((target - mass_above) / t)) + 1;
  r = max(1LL, min(r, max(available, 1LL)));
  return ctx.NthTie(t, r);
}

__global__ void SampleRowsKernel(const float* __restrict__ x, int64_t cols,
                                 const int32_t* __restrict__ rows,
                                 const SampleRowParams* __restrict__ params,
                                 int32_t* __restrict__ ids) {
  __shared__ BlockShared s;
  const SampleRowParams p = params[blockIdx.x];
  const float* logits = x + static_cast<int64_t>(rows[blockIdx.x]) * cols;
  float row_max;
  int argmax;
  BlockArgmax<kThreads>(logits, cols, &row_max, &argmax);
  if (!isfinite(row_max)) {  // all -inf, or +inf present: the host falls back to argmax
    if (threadIdx.x == 0) ids[blockIdx.x] = argmax;
    return;
  }
  RowBlock ctx{logits, cols, row_max, 1.0f / p.temperature, s};
  const int id = SampleWith(ctx, p);
  if (ctx.leader()) ids[blockIdx.x] = id;
}

// Grid: num_rows clusters of C blocks; block rank k owns columns [k * slice, (k + 1) * slice).
// Dynamic shared memory: slice floats.
__global__ void SampleRowsClusterKernel(const float* __restrict__ x, int64_t cols, int64_t slice,
                                        const int32_t* __restrict__ rows,
                                        const SampleRowParams* __restrict__ params,
                                        int32_t* __restrict__ ids) {
  extern __shared__ float weights[];
  __shared__ ClusterShared s;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned row_index = blockIdx.x / cluster.num_blocks();
  const SampleRowParams p = params[row_index];
  const float* logits = x + static_cast<int64_t>(rows[row_index]) * cols;
  const int64_t offset = static_cast<int64_t>(cluster.block_rank()) * slice;
  const int64_t len = max(int64_t{0}, min(slice, cols - offset));

  // The row's maximum and its first index (NaN skipped): per slice, then over the slices in rank
  // order, the first strict improvement winning (= the first index of the maximum).
  float slice_max;
  int slice_argmax;
  BlockArgmax<kThreads>(logits + offset, len, &slice_max, &slice_argmax);
  if (threadIdx.x == 0) {
    const bool any = len > 0 && !isnan(logits[offset + slice_argmax]);
    s.slice_max = slice_max;
    s.slice_index = any ? static_cast<int>(offset + slice_argmax) : -1;
  }
  cluster.sync();
  if (threadIdx.x == 0) {
    float best = -INFINITY;
    int best_i = -1;
    for (unsigned k = 0; k < cluster.num_blocks(); ++k) {
      const ClusterShared* other = cluster.map_shared_rank(&s, k);
      if (other->slice_index >= 0 && (best_i < 0 || other->slice_max > best)) {
        best = other->slice_max;
        best_i = other->slice_index;
      }
    }
    s.row_max = best;
    s.row_argmax = best_i < 0 ? 0 : best_i;
  }
  __syncthreads();
  const float row_max = s.row_max;
  const int argmax = s.row_argmax;
  int id;
  if (!isfinite(row_max)) {  // all -inf, or +inf present: the host falls back to argmax
    id = argmax;
  } else {
    const float inv_t = 1.0f / p.temperature;
    for (int64_t i = threadIdx.x; i < len; i += kThreads)
      weights[i] = Weight(logits[offset + i], row_max, inv_t);
    __syncthreads();
    RowCluster ctx{weights, len, offset, s, cluster};
    id = SampleWith(ctx, p);
  }
  if (threadIdx.x == 0 && cluster.block_rank() == 0) ids[row_index] = id;
  cluster.sync();  // no block leaves while another may still read its shared memory
}

// Cluster shape for `num_rows` rows of `cols`: 16 blocks (where the device runs such clusters)
// or 8 per row while the rows fit on the SMs at once; 0 when one block per row is the better
// shape (many rows) or a slice would not fit in shared memory. Sets the kernel's dynamic shared
// memory limit for the chosen shape.
int ClusterSizeFor(int32_t num_rows, int64_t cols) {
  static int num_sms = 0, max_smem = 0;
  static int64_t checked_cols = -1;
  static bool sixteen = false;
  static size_t smem_set = 0;
  if (num_sms == 0) {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    max_smem -= static_cast<int>(sizeof(ClusterShared)) + 1024;  // static + BlockArgmax's slots
  }
  const auto slice_bytes = [&](int c) {
    return static_cast<size_t>((cols + c - 1) / c) * sizeof(float);
  };
  const auto allow_smem = [&](size_t bytes) {
    if (bytes <= smem_set) return;
    CUDA_CHECK(cudaFuncSetAttribute(SampleRowsClusterKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
    smem_set = bytes;
  };
  if (cols != checked_cols) {  // can a cluster of 16 run at all (16 free SMs in one GPC)?
    checked_cols = cols;
    sixteen = false;
    if (slice_bytes(16) <= static_cast<size_t>(max_smem) &&
        cudaFuncSetAttribute(SampleRowsClusterKernel,
                             cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
      allow_smem(slice_bytes(16));
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(16);
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = slice_bytes(16);
      cudaLaunchAttribute attribute;
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = 16;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      config.attrs = &attribute;
      config.numAttrs = 1;
      int clusters = 0;
      sixteen = cudaOccupancyMaxActiveClusters(&clusters, SampleRowsClusterKernel, &config) ==
                    cudaSuccess &&
                clusters >= 1;
    }
    (void)cudaGetLastError();  // a refused query is an answer, not an error
  }
  for (int c : {16, 8}) {
    if (c == 16 && !sixteen) continue;
    if (int64_t{num_rows} * c <= num_sms && slice_bytes(c) <= static_cast<size_t>(max_smem)) {
      allow_smem(slice_bytes(c));
      return c;
    }
  }
  return 0;
}

}  // namespace

void LaunchSampleRows(const float* x, int64_t cols, const int32_t* rows,
                      const SampleRowParams* params, int32_t num_rows, int32_t* ids,
                      cudaStream_t stream) {
  if (num_rows == 0) return;
  const int cluster = ClusterSizeFor(num_rows, cols);
  if (cluster == 0) {
    SampleRowsKernel<<<static_cast<unsigned>(num_rows), kThreads, 0, stream>>>(x, cols, rows,
                                                                               params, ids);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int64_t slice = (cols + cluster - 1) / cluster;
  const size_t smem = static_cast<size_t>(slice) * sizeof(float);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(num_rows * cluster));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, SampleRowsClusterKernel, x, cols, slice, rows, params,
                                ids));
}

}  // namespace ember::cuda
