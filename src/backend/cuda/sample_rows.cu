// SampleRows: draws each sampled row's token on the device with the algorithm of
// backend/threshold_sampling.cc (its CPU twin): weights w = exp((logit - max) / T), every filter
// (top-k, top-p, min-p) and the draw a search for a weight threshold by bisection over the
// float's bits, each probe one pass of counts and masses over the row, then the r-th tie in id
// order. Only the ids travel back to the host.
//
// Two kernels run that one algorithm (SampleWith, generic over the reduction context):
//   - RowBlock: one 1,024-thread block per row reading the row from global memory each pass
//     (many rows: the rows fill the GPU). Once a search has established that every later probe
//     of it lies at or above a floor L above which at most kCompactMax weights lie, the block's
//     next pass over the row also gathers those weights into shared memory (each thread its own
//     strided elements, in index order), and every later probe >= L is answered from them: the
//     same elements summed in the same order, so the same bits, from a few thousand weights
//     instead of the vocabulary. A real model's distribution has a small head, so most of a
//     draw's ~40 passes leave global memory (128 rows of a 128k vocabulary are 64 MB, more than
//     the L2: each full pass streams them from DRAM); a flat row (random weights) compacts late
//     or never and pays a full pass per probe (bench/cuda_sample_bench, docs/perf.md);
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
// Thresholds probed per pass over the row: a search step resolves 2 bits of the threshold per
// pass instead of bisection's 1. A probe's sums are the ones a pass for that threshold alone
// would give (same elements, same order), so the search finds the same threshold.
constexpr int kProbes = 3;

__device__ float Weight(float logit, float max, float inv_t) {
  if (logit != logit) return 0.0f;
  const float w = expf((logit - max) * inv_t);
  return w < FLT_MIN ? 0.0f : w;
}

// The next float above t >= 0: "w > t" is "w >= NextUp(t)" for floats.
__device__ float NextUp(float t) { return __uint_as_float(__float_as_uint(t) + 1u); }

// Per probe j: the count and mass of the weights >= t[j].
struct Sums {
  long long count[kProbes];
  double mass[kProbes];
};

static_assert(kWarps == 32, "BlockSum folds one warp partial per lane of warp 0");

// Summed over a warp in a fixed tree order; lane 0 gets the total.
__device__ void WarpSum(Sums& v) {
  for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
    for (int j = 0; j < kProbes; ++j) {
      v.count[j] += __shfl_down_sync(0xffffffffu, v.count[j], off);
      v.mass[j] += __shfl_down_sync(0xffffffffu, v.mass[j], off);
    }
  }
}

// Sums over the block: per warp, then the 32 warp partials by warp 0, each a shuffle tree (a
// fixed order: the same bits in every block that sums the same values). The block total lands
// in *out, written by thread 0 only.
__device__ void BlockSum(Sums v, Sums* warp_parts, Sums* out) {
  WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_parts[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_parts[lane];
    WarpSum(v);
    if (lane == 0) *out = v;
  }
}

// This thread's share of a probe pass over w(i), i = first, first + stride, ... < n.
template <typename W>
__device__ Sums ThreadSums(const float (&t)[kProbes], int64_t first, int64_t n, int64_t stride,
                           W w_of) {
  int c[kProbes] = {};
  double m[kProbes] = {};
  for (int64_t i = first; i < n; i += stride) {
    const float w = w_of(i);
#pragma unroll
    for (int j = 0; j < kProbes; ++j) {
      if (w >= t[j]) {
        ++c[j];
        m[j] += w;
      }
    }
  }
  Sums v;
#pragma unroll
  for (int j = 0; j < kProbes; ++j) {
    v.count[j] = c[j];
    v.mass[j] = m[j];
  }
  return v;
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
  Sums warp_parts[kWarps];
  long long scan[kWarps + 1];
  Sums out;
  int out_i;
  int num_ties;                 // compact NthTie: entries of tie_ids
  int tie_ids[kThreads];
};

// Compaction: at most kCompactPerThread weights per thread in shared memory ([k][thread]
// layout, weight and the element's stride index), attempted when a floor has at most kCompactMax
// weights at or above it (4 per thread on average; a thread with more than its 16 aborts it,
// which spread evenly happens about once in 10^3 rows).
constexpr int kCompactPerThread = 16;
constexpr long long kCompactMax = 4 * kThreads;
constexpr size_t kCompactSmemBytes =
    size_t{kCompactPerThread} * kThreads * (sizeof(float) + sizeof(uint16_t));
// Rows up to this many columns have stride indices below 2^16 (uint16_t).
constexpr int64_t kCompactMaxCols = int64_t{kThreads} * 65536;

struct RowBlock {
  const float* logits;
  int64_t n;
  float max, inv_t;
  BlockShared& s;
  float* cand_w;      // [kCompactPerThread][kThreads]
  uint16_t* cand_j;   // the same layout: element threadIdx.x + j * kThreads
  float floor = INFINITY;      // compact(): every weight >= floor is held
  float pending = INFINITY;    // the next full pass gathers the weights >= pending
  int held = 0;                // compact(): this thread's weights
  long long retry_below = kCompactMax + 1;

  __device__ bool leader() const { return threadIdx.x == 0; }
  // The weights >= floor are held in cand_w / cand_j (a finite floor is set only by a gather).
  __device__ bool compact() const { return floor != INFINITY; }
  __device__ float W(int64_t i) const { return Weight(logits[i], max, inv_t); }
  __device__ bool Covers(const float (&t)[kProbes]) const {
    bool all = compact();
#pragma unroll
    for (int j = 0; j < kProbes; ++j) all = all && t[j] >= floor;
    return all;
  }
  // Block-wide sums for the thresholds t; every thread gets the result.
  __device__ Sums Probe(const float (&t)[kProbes]) {
    if (Covers(t)) {
      // The weights below the floor are below every t: skipping them leaves each thread's
      // count and mass (index order) as the full pass has them.
      BlockSum(ThreadSums(t, 0, held, 1,
                          [&](int64_t k) { return cand_w[k * kThreads + threadIdx.x]; }),
               s.warp_parts, &s.out);
    } else if (pending == INFINITY) {
      BlockSum(ThreadSums(t, threadIdx.x, n, kThreads, [&](int64_t i) { return W(i); }),
               s.warp_parts, &s.out);
    } else {
      // The same pass, which also keeps this thread's weights >= pending (i = threadIdx.x +
      // j * kThreads, visited in index order).
      int got = 0;
      BlockSum(ThreadSums(t, threadIdx.x, n, kThreads,
                          [&](int64_t i) {
                            const float w = W(i);
                            if (w >= pending) {
                              if (got < kCompactPerThread) {
                                cand_w[got * kThreads + threadIdx.x] = w;
                                cand_j[got * kThreads + threadIdx.x] =
                                    static_cast<uint16_t>(i / kThreads);
                              }
                              ++got;
                            }
                            return w;
                          }),
               s.warp_parts, &s.out);
      if (__syncthreads_or(got > kCompactPerThread)) {  // a thread's share overflowed
        floor = INFINITY;
      } else {
        floor = pending;
        held = got;
      }
      pending = INFINITY;
    }
    __syncthreads();
    const Sums result = s.out;
    __syncthreads();
    return result;
  }
  // A search's probes from now on are all >= low, and `count` weights are >= low: the next full
  // pass gathers them when there are few enough (block-uniform arguments).
  __device__ void MaybeCompact(float low, long long count) {
    if (count > kCompactMax || count >= retry_below || (compact() && low >= floor) ||
        n > kCompactMaxCols) {
      return;
    }
    pending = low;
    retry_below = count / 2;  // after a failed gather, wait for a smaller head
  }
  // The id of the r-th (1-based) token of weight t in id order: each thread scans a contiguous
  // range; the block's exclusive scan of the per-thread counts places it. From the compacted
  // weights (t >= floor): the ties' ids are listed and the one with r - 1 smaller ids wins.
  __device__ int NthTie(float t, long long r) {
    if (compact() && t >= floor) {
      if (threadIdx.x == 0) {
        s.num_ties = 0;
        s.out_i = -1;
      }
      __syncthreads();
      for (int k = 0; k < held; ++k) {
        if (cand_w[k * kThreads + threadIdx.x] == t) {
          const int slot = atomicAdd(&s.num_ties, 1);
          if (slot < kThreads) {
            s.tie_ids[slot] = static_cast<int>(threadIdx.x) +
                              static_cast<int>(cand_j[k * kThreads + threadIdx.x]) * kThreads;
          }
        }
      }
      __syncthreads();
      const int num_ties = s.num_ties;
      if (num_ties <= kThreads) {  // else the scan below (more ties than the list holds)
        if (static_cast<int>(threadIdx.x) < num_ties) {
          const int mine = s.tie_ids[threadIdx.x];
          long long smaller = 0;
          for (int q = 0; q < num_ties; ++q) smaller += s.tie_ids[q] < mine;
          if (smaller == r - 1) s.out_i = mine;
        }
        __syncthreads();
        const int id = s.out_i;
        __syncthreads();
        return id;
      }
    }
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
  Sums warp_parts[kWarps];
  long long scan[kWarps + 1];
  Sums part[2];  // this block's partial, double-buffered across reductions
  long long tie_part[2];
  Sums out;
  long long tie_before;
  float slice_max;
  int slice_index;  // global id of the slice's argmax, -1 when the slice has no non-NaN
  float row_max;
  int row_argmax;
  int found;  // the NthTie id when this block holds it, else -1
};

struct RowCluster {
  const float* w;  // [len] this block's weights, in shared memory
  int64_t len, offset;
  ClusterShared& s;
  cg::cluster_group cluster;
  int buf = 0;

  __device__ bool leader() const { return threadIdx.x == 0 && cluster.block_rank() == 0; }
  __device__ void MaybeCompact(float, long long) {}  // the weights are in shared memory already
  // Every block's partial is published in its part[buf], then warp 0 of each block loads them
  // (lane k from rank k, in parallel) and folds them in one shuffle tree: the same order, hence
  // the same bits, in every block. Double buffering makes one cluster barrier per reduction
  // enough: a block writes part[buf] again two reductions later, after every block passed the
  // barrier in between (so finished reading it).
  __device__ Sums Probe(const float (&t)[kProbes]) {
    BlockSum(ThreadSums(t, threadIdx.x, len, kThreads, [&](int64_t i) { return w[i]; }),
             s.warp_parts, &s.part[buf]);
    cluster.sync();
    if (threadIdx.x < 32) {
      Sums v = {};
      if (threadIdx.x < cluster.num_blocks())
        v = cluster.map_shared_rank(&s, threadIdx.x)->part[buf];
      WarpSum(v);
      if (threadIdx.x == 0) s.out = v;
    }
    __syncthreads();
    const Sums result = s.out;
    __syncthreads();
    buf ^= 1;
    return result;
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
    if (threadIdx.x == 0) s.tie_part[buf] = block_total;
    cluster.sync();
    if (threadIdx.x == 0) {
      long long before = 0;
      for (unsigned k = 0; k < cluster.block_rank(); ++k)
        before += cluster.map_shared_rank(&s, k)->tie_part[buf];
      s.tie_before = before;
    }
    __syncthreads();
    const long long first = s.tie_before + in_block;
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

// A rank-order prefix: every weight > t, then the first `ties` tokens of weight t (id order).
struct Prefix {
  float t;
  long long ties;
};

// Count and mass of the weights >= t (one pass).
struct Level {
  long long count;
  double mass;
};
template <typename Ctx>
__device__ Level AtLeast(Ctx& ctx, float t) {
  const float ts[kProbes] = {t, t, t};
  const Sums s = ctx.Probe(ts);
  return {s.count[0], s.mass[0]};
}

template <typename Ctx>
__device__ double MassOf(Ctx& ctx, const Prefix& p) {
  return AtLeast(ctx, NextUp(p.t)).mass + static_cast<double>(p.ties) * p.t;
}

// Largest float t in [low, 1] with pred(t, count, mass) (count / mass of the weights >= t;
// monotone; true at low), kProbes thresholds per pass. Uniform across the block / cluster.
template <typename Ctx, typename Pred>
__device__ float LargestWhere(Ctx& ctx, float low, Pred pred) {
  const Level top = AtLeast(ctx, 1.0f);
  if (pred(1.0f, top.count, top.mass)) return 1.0f;
  unsigned lo = __float_as_uint(low), hi = __float_as_uint(1.0f);
  while (hi - lo > 1) {  // pred(lo) true, pred(hi) false
    const unsigned long long span = hi - lo;
    unsigned mid[kProbes];
    float ts[kProbes];
#pragma unroll
    for (int j = 0; j < kProbes; ++j) {
      mid[j] = lo + static_cast<unsigned>(span * (j + 1) / (kProbes + 1));  // lo <= mid < hi
      ts[j] = __uint_as_float(mid[j]);
    }
    const Sums s = ctx.Probe(ts);
    unsigned new_lo = lo, new_hi = hi;
    long long lo_count = -1;
    for (int j = kProbes - 1; j >= 0; --j) {
      if (pred(ts[j], s.count[j], s.mass[j])) {
        new_lo = mid[j];
        lo_count = s.count[j];
        break;
      }
      new_hi = mid[j];
    }
    lo = new_lo;
    hi = new_hi;
    // Every later probe of this search lies in (lo, hi).
    if (lo_count >= 0 && hi - lo > 1) ctx.MaybeCompact(__uint_as_float(lo), lo_count);
  }
  return __uint_as_float(lo);
}

// The first n tokens of the rank order (n >= 1, n <= tokens with w > 0).
template <typename Ctx>
__device__ Prefix FirstN(Ctx& ctx, long long n) {
  const float t =
      LargestWhere(ctx, FLT_MIN, [&](float, long long count, double) { return count >= n; });
  return {t, n - AtLeast(ctx, NextUp(t)).count};
}

// Weights > t (count, mass) and tokens of weight exactly t, in one pass.
struct Split {
  long long above;
  double mass_above;
  long long ties;
};
template <typename Ctx>
__device__ Split SplitAt(Ctx& ctx, float t) {
  const float ts[kProbes] = {t, NextUp(t), NextUp(t)};
  const Sums s = ctx.Probe(ts);
  return {s.count[1], s.mass[1], s.count[0] - s.count[1]};
}

// The token of a row whose maximum is finite; meaningful in the context's leader thread.
// Follows ThresholdSample step by step; two shortcuts give FirstN's result without its search:
// the prefix `kept` already holds, and top-p's own prefix (its threshold t with `ties` >= 1
// tokens at t is exactly FirstN(above + ties), since FirstN depends on counts only).
template <typename Ctx>
__device__ int SampleWith(Ctx& ctx, const SampleRowParams& p) {
  const long long positive = AtLeast(ctx, NextUp(0.0f)).count;
  long long kept_len = positive;
  Prefix kept{0.0f, 0};  // every w > 0
  long long kept_is = positive;  // the length `kept` describes
  Prefix top_p_prefix{0.0f, 0};
  long long top_p_len = -1;
  if (p.top_k > 0 && p.top_k < positive) {
    kept = FirstN(ctx, p.top_k);
    kept_len = kept_is = p.top_k;
  }
  if (p.top_p < 1.0f) {
    const double kept_mass = MassOf(ctx, kept);
    const double target = static_cast<double>(p.top_p) * kept_mass;
    const float t = LargestWhere(ctx, kept.t > 0.0f ? kept.t : FLT_MIN,
                                 [&](float x, long long, double mass) {
                                   return (x > kept.t ? mass : kept_mass) >= target;
                                 });
    const Split at = SplitAt(ctx, t);
    long long ties = static_cast<long long>(ceil((target - at.mass_above) / t));
    const long long available = t == kept.t ? kept.ties : at.ties;
    ties = max(1LL, min(ties, max(available, 1LL)));
    if (at.above + ties < kept_len) {
      kept_len = at.above + ties;
      if (available >= 1) {
        top_p_prefix = {t, ties};
        top_p_len = kept_len;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const long long at_least = AtLeast(ctx, p.min_p).count;
    kept_len = min(kept_len, max(at_least, 1LL));
  }
  if (kept_len == top_p_len) {
    kept = top_p_prefix;
  } else if (kept_len != kept_is) {
    kept = FirstN(ctx, kept_len);
  }

  const double kept_mass = MassOf(ctx, kept);
  const double target = p.u * kept_mass;
  const float t = LargestWhere(ctx, kept.t > 0.0f ? kept.t : FLT_MIN,
                               [&](float x, long long, double mass) {
                                 return (x > kept.t ? mass : kept_mass) > target;
                               });
  const Split at = SplitAt(ctx, t);
  const long long available = t == kept.t ? kept.ties : at.ties;
  long long r = static_cast<long long>(floor((target - at.mass_above) / t)) + 1;
  r = max(1LL, min(r, max(available, 1LL)));
  return ctx.NthTie(t, r);
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* __restrict__ x, int64_t cols, const int32_t* __restrict__ rows,
                     const SampleRowParams* __restrict__ params, int32_t* __restrict__ ids) {
  __shared__ BlockShared s;
  extern __shared__ unsigned char compact_smem[];  // kCompactSmemBytes
  const SampleRowParams p = params[blockIdx.x];
  const float* logits = x + static_cast<int64_t>(rows[blockIdx.x]) * cols;
  float row_max;
  int argmax;
  BlockArgmax<kThreads>(logits, cols, &row_max, &argmax);
  if (!isfinite(row_max)) {  // all -inf, or +inf present: the host falls back to argmax
    if (threadIdx.x == 0) ids[rows[blockIdx.x]] = argmax;
    return;
  }
  float* cand_w = reinterpret_cast<float*>(compact_smem);
  RowBlock ctx{logits, cols, row_max, 1.0f / p.temperature, s, cand_w,
               reinterpret_cast<uint16_t*>(cand_w + kCompactPerThread * kThreads)};
  const int id = SampleWith(ctx, p);
  if (ctx.leader()) ids[rows[blockIdx.x]] = id;
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
  if (threadIdx.x == 0 && cluster.block_rank() == 0) ids[rows[row_index]] = id;
  cluster.sync();  // no block leaves while another may still read its shared memory
}

// Cluster shape for `num_rows` rows of `cols`: 16 blocks (where the device runs such clusters)
// or 8 per row while the rows fit on the SMs at once; 0 when one block per row is the better
// shape (many rows) or a slice would not fit in shared memory. Sets the kernel's dynamic shared
// memory limit for the chosen shape.
int ClusterSizeFor(int32_t num_rows, int64_t cols) {
  static int max_smem = 0;
  static int64_t checked_cols = -1;
  static bool sixteen = false;
  static size_t smem_set = 0;
  const int num_sms = CurrentDeviceSmCount();
  if (max_smem == 0) {
    int device;
    CUDA_CHECK(cudaGetDevice(&device));
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
    static const bool smem_set = [] {
      CUDA_CHECK(cudaFuncSetAttribute(SampleRowsKernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(kCompactSmemBytes)));
      return true;
    }();
    (void)smem_set;
    SampleRowsKernel<<<static_cast<unsigned>(num_rows), kThreads, kCompactSmemBytes, stream>>>(
        x, cols, rows, params, ids);
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
