// The skinny wgmma GEMM of batched decode (backend/cuda/gemm_skinny.cu) against cublasGemmEx
// (bf16 in, f32 out, CUBLAS_COMPUTE_32F: what the backend calls above 8 rows), for each weight of
// a model and each token count: out[t, m] = x[t, :] . W[m, :]. Every call reads its weights cold
// (calls rotate over copies of the weights that together exceed 256 MB, 5x the L2). Checks the
// skinny result against cuBLAS (max |diff| / max |ref|, FAIL above 1e-2 or on a NaN) and against a
// second run of itself (bitwise), and first every plan of two small cases against an FP32 host
// reference. Prints, per (weight, tokens), the plan, microseconds per call (median of --reps,
// CUDA events around kCallsPerTiming calls), the weight bytes streamed per second, cuBLAS's time
// and the speedup; --sweep also times every plan (block_m x split) and names the fastest (to
// tune PlanSkinnyGemm).
// usage: skinny_gemm_bench [--shape llama-3.2-1b|llama-3.1-8b] [--tokens 16,32,64,128,256]
//                          [--reps 20] [--sweep]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_skinny.h"
#include "cuda_timing.h"
#include "util/flags.h"

namespace {

using ember::cuda::SkinnyGemmPlan;

// Calls between two timing events (each on the next weight copy), so the launch overhead
// overlaps the previous call as in a decode step; the skinny kernel's PDL launch lets its first
// weight copies start under the previous call's tail, as it would after the step's other kernels.
constexpr int kCallsPerTiming = 10;

struct Shape {
  const char* name;
  int64_t m, k;
};

// Uniform in [-scale, scale) from a hash of the index (the same values on every run).
__global__ void FillRandomBf16(__nv_bfloat16* p, int64_t count, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    p[i] = __float2bfloat16((static_cast<float>(h >> 8) * (1.f / 8388608.f) - 1.f) * scale);
  }
}

void FillRandom(__nv_bfloat16* p, int64_t count, uint32_t seed, float scale) {
  FillRandomBf16<<<1024, 256>>>(p, count, seed, scale);
  CUDA_CHECK(cudaGetLastError());
}

std::string PlanName(const SkinnyGemmPlan& p) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "n%d/bm%d/s%d/g%d", p.n, p.block_m, p.split, p.grid);
  return buf;
}

struct Compare {
  double rel = 0;  // max |a - ref| / max |ref|
  bool nan = false;
};

Compare CompareTo(const std::vector<float>& a, const std::vector<float>& ref) {
  double max_diff = 0, max_ref = 0;
  Compare c;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(ref[i])) c.nan = true;
    max_diff = std::max(max_diff, std::fabs(double(a[i]) - double(ref[i])));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  c.rel = max_ref > 0 ? max_diff / max_ref : max_diff;
  return c;
}

std::vector<float> Download(const float* d, int64_t count) {
  std::vector<float> h(static_cast<size_t>(count));
  CUDA_CHECK(cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// Every plan of a small case (tokens x m x k) against an FP32 host reference; false on a failure.
bool CheckSmallCase(int64_t tokens, int64_t m, int64_t k, cudaStream_t st) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<__nv_bfloat16> hx(static_cast<size_t>(tokens * k)), hw(static_cast<size_t>(m * k));
  for (auto& v : hx) v = __float2bfloat16(dist(rng));
  for (auto& v : hw) v = __float2bfloat16(dist(rng));
  std::vector<float> ref(static_cast<size_t>(tokens * m));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < m; ++r) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) {
        s += double(__bfloat162float(hx[t * k + i])) * double(__bfloat162float(hw[r * k + i]));
      }
      ref[t * m + r] = static_cast<float>(s);
    }
  }
  __nv_bfloat16 *dx = nullptr, *dw = nullptr;
  float* dout = nullptr;
  const int64_t ldo = m + 64;  // a row stride past m: the kernel must not touch the gap
  CUDA_CHECK(cudaMalloc(&dx, hx.size() * 2));
  CUDA_CHECK(cudaMalloc(&dw, hw.size() * 2));
  CUDA_CHECK(cudaMalloc(&dout, static_cast<size_t>(tokens * ldo) * 4));
  CUDA_CHECK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  const SkinnyGemmPlan chosen = ember::cuda::PlanSkinnyGemm(tokens, m, k);
  bool ok = true;
  for (int block_m : {64, 128}) {
    for (int split = 1; split <= std::min<int64_t>(8, k / 64); ++split) {
      const SkinnyGemmPlan plan{chosen.n, block_m, split, 0};
      CUDA_CHECK(cudaMemset(dout, 0xFF, static_cast<size_t>(tokens * ldo) * 4));  // NaNs
      ember::cuda::LaunchSkinnyGemmWithPlan(dx, dw, dout, ldo, tokens, m, k, plan, st);
      CUDA_CHECK(cudaStreamSynchronize(st));
      const std::vector<float> all = Download(dout, tokens * ldo);
      std::vector<float> got(ref.size());
      bool gap_ok = true;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t r = 0; r < ldo; ++r) {
          const float v = all[t * ldo + r];
          if (r < m) {
            got[t * m + r] = v;
          } else if (!std::isnan(v)) {
            gap_ok = false;
          }
        }
      }
      const Compare c = CompareTo(got, ref);
      const bool pass = !c.nan && gap_ok && c.rel <= 1e-3;
      ok = ok && pass;
      std::printf("host check T=%ld M=%ld K=%ld bm=%d split=%d: max|diff|/max|ref| %.2e%s%s\n",
                  static_cast<long>(tokens), static_cast<long>(m), static_cast<long>(k), block_m,
                  split, c.rel, c.nan ? " NaN" : "", pass ? "" : (gap_ok ? " FAIL" : " FAIL(gap)"));
    }
  }
  CUDA_CHECK(cudaFree(dx));
  CUDA_CHECK(cudaFree(dw));
  CUDA_CHECK(cudaFree(dout));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "llama-3.1-8b";
  std::vector<int64_t> token_counts = {16, 32, 64, 128, 256};
  int64_t reps = 20;
  bool sweep = false, help = false;
  ember::FlagParser flags("skinny_gemm_bench [flags]");
  flags.AddString("--shape", &shape, "llama-3.2-1b | llama-3.1-8b");
  flags.AddIntList("--tokens", &token_counts, "comma-separated rows of x (1..256)");
  flags.AddInt("--reps", &reps, "timed calls per variant (the median counts)");
  flags.AddBool("--sweep", &sweep, "also time every plan (block_m x split)");
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  for (int64_t t : token_counts) {
    if (t < 1 || t > 256) {
      std::fprintf(stderr, "--tokens: %ld is not in 1..256\n", static_cast<long>(t));
      return 2;
    }
  }
  std::vector<Shape> shapes;
  if (shape == "llama-3.1-8b") {
    shapes = {{"q/o", 4096, 4096},
              {"k/v", 1024, 4096},
              {"gate/up", 14336, 4096},
              {"down", 4096, 14336},
              {"lm_head", 128256, 4096}};
  } else if (shape == "llama-3.2-1b") {
    shapes = {{"q/o", 2048, 2048},
              {"k/v", 512, 2048},
              {"gate/up", 8192, 2048},
              {"down", 2048, 8192},
              {"lm_head", 128256, 2048}};
  } else {
    std::fprintf(stderr, "unknown --shape %s\n", shape.c_str());
    return 2;
  }
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device=%s shape=%s tokens=", prop.name, shape.c_str());
  for (size_t i = 0; i < token_counts.size(); ++i) {
    std::printf("%s%ld", i > 0 ? "," : "", static_cast<long>(token_counts[i]));
  }
  std::printf(" reps=%ld\n", static_cast<long>(reps));

  bool all_ok = CheckSmallCase(9, 128, 128, st);
  all_ok = CheckSmallCase(37, 192, 512, st) && all_ok;  // a half-empty last row tile, n = 64

  int64_t max_mk = 0, max_k = 0, max_m = 0;
  for (const Shape& s : shapes) {
    max_mk = std::max(max_mk, s.m * s.k);
    max_k = std::max(max_k, s.k);
    max_m = std::max(max_m, s.m);
  }
  // One pool of weights, >= 256 MB; a shape rotates over the copies of itself that fit in it.
  const int64_t pool_elems = std::max<int64_t>(max_mk, (int64_t{256} << 20) / 2);
  __nv_bfloat16* pool = nullptr;
  CUDA_CHECK(cudaMalloc(&pool, static_cast<size_t>(pool_elems) * 2));
  FillRandom(pool, pool_elems, 1, 0.05f);
  __nv_bfloat16* x = nullptr;
  CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(256 * max_k) * 2));
  FillRandom(x, 256 * max_k, 2, 1.f);
  const int64_t out_elems = 256 * max_m;
  float *out = nullptr, *out2 = nullptr, *ref = nullptr;
  CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(out_elems) * 4));
  CUDA_CHECK(cudaMalloc(&out2, static_cast<size_t>(out_elems) * 4));
  CUDA_CHECK(cudaMalloc(&ref, static_cast<size_t>(out_elems) * 4));
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  CUBLAS_CHECK(cublasSetStream(h, st));
  CUDA_CHECK(cudaDeviceSynchronize());

  std::printf("%-8s %6s %6s %4s %-18s | %9s %7s | %9s %7s | %7s | %9s %s\n", "weight", "m", "k",
              "T", "plan", "skinny us", "TB/s", "cublas us", "TB/s", "speedup", "rel err", "check");
  for (const Shape& s : shapes) {
    const int64_t copies = std::max<int64_t>(1, pool_elems / (s.m * s.k));
    int64_t rotation = 0;
    auto next_w = [&] { return pool + (rotation++ % copies) * s.m * s.k; };
    const double weight_bytes = double(s.m) * double(s.k) * 2;
    for (int64_t T : token_counts) {
      const float alpha = 1.f, beta = 0.f;
      auto cublas = [&](const __nv_bfloat16* w, float* o) {
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.m),
                                  static_cast<int>(T), static_cast<int>(s.k), &alpha, w,
                                  CUDA_R_16BF, static_cast<int>(s.k), x, CUDA_R_16BF,
                                  static_cast<int>(s.k), &beta, o, CUDA_R_32F,
                                  static_cast<int>(s.m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      // Correctness on copy 0: against cuBLAS and against a second run.
      const SkinnyGemmPlan plan = ember::cuda::PlanSkinnyGemm(T, s.m, s.k);
      CUDA_CHECK(cudaMemset(out, 0xFF, static_cast<size_t>(T * s.m) * 4));
      CUDA_CHECK(cudaMemset(out2, 0, static_cast<size_t>(T * s.m) * 4));
      ember::cuda::LaunchSkinnyGemm(x, pool, out, s.m, T, s.m, s.k, st);
      ember::cuda::LaunchSkinnyGemm(x, pool, out2, s.m, T, s.m, s.k, st);
      cublas(pool, ref);
      CUDA_CHECK(cudaStreamSynchronize(st));
      const std::vector<float> a = Download(out, T * s.m), b = Download(out2, T * s.m),
                               r = Download(ref, T * s.m);
      const Compare c = CompareTo(a, r);
      const bool bitwise = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      const bool ok = !c.nan && c.rel <= 1e-2 && bitwise;
      all_ok = all_ok && ok;

      // Encode every copy's tensor map before timing (a launch then only looks it up).
      for (int64_t c = 0; c < copies; ++c) {
        ember::cuda::LaunchSkinnyGemm(x, next_w(), out, s.m, T, s.m, s.k, st);
      }
      const double ms =
          ember::bench::MedianMs(st, reps,
                                 [&] {
                                   for (int i = 0; i < kCallsPerTiming; ++i) {
                                     ember::cuda::LaunchSkinnyGemm(x, next_w(), out, s.m, T, s.m,
                                                                   s.k, st);
                                   }
                                 }) /
          kCallsPerTiming;
      const double cublas_ms = ember::bench::MedianMs(st, reps,
                                                      [&] {
                                                        for (int i = 0; i < kCallsPerTiming; ++i)
                                                          cublas(next_w(), ref);
                                                      }) /
                               kCallsPerTiming;
      std::printf("%-8s %6ld %6ld %4ld %-18s | %9.2f %7.2f | %9.2f %7.2f | %6.2fx | %9.2e %s%s%s\n",
                  s.name, static_cast<long>(s.m), static_cast<long>(s.k), static_cast<long>(T),
                  PlanName(plan).c_str(), ms * 1e3, weight_bytes / (ms * 1e-3) / 1e12,
                  cublas_ms * 1e3, weight_bytes / (cublas_ms * 1e-3) / 1e12, cublas_ms / ms, c.rel,
                  ok ? "ok" : "FAIL", c.nan ? " (NaN)" : "",
                  bitwise ? "" : " (not bitwise reproducible)");
      if (sweep) {
        std::string line;
        double best_ms = 1e30;
        std::string best_name;
        for (int block_m : {128, 64}) {
          for (int split = 1; split <= std::min<int64_t>(8, s.k / 64); ++split) {
            const SkinnyGemmPlan p{plan.n, block_m, split, 0};
            CUDA_CHECK(cudaMemset(out, 0xFF, static_cast<size_t>(T * s.m) * 4));
            ember::cuda::LaunchSkinnyGemmWithPlan(x, pool, out, s.m, T, s.m, s.k, p, st);
            CUDA_CHECK(cudaStreamSynchronize(st));
            const Compare pc = CompareTo(Download(out, T * s.m), r);
            const bool pok = !pc.nan && pc.rel <= 1e-2;
            all_ok = all_ok && pok;
            for (int64_t c = 0; c < copies; ++c) {  // encode the maps before timing
              ember::cuda::LaunchSkinnyGemmWithPlan(x, next_w(), out, s.m, T, s.m, s.k, p, st);
            }
            const double t =
                ember::bench::MedianMs(st, reps,
                                       [&] {
                                         for (int i = 0; i < kCallsPerTiming; ++i) {
                                           ember::cuda::LaunchSkinnyGemmWithPlan(
                                               x, next_w(), out, s.m, T, s.m, s.k, p, st);
                                         }
                                       }) /
                kCallsPerTiming;
            char buf[64];
            std::snprintf(buf, sizeof(buf), " bm%d/s%d %.2f%s", block_m, split, t * 1e3,
                          pok ? "" : " FAIL");
            line += buf;
            if (t < best_ms) {
              best_ms = t;
              best_name = buf;
            }
          }
        }
        std::printf("    sweep (us):%s\n    best:%s\n", line.c_str(), best_name.c_str());
      }
    }
  }
  std::printf("%s\n", all_ok ? "ALL OK" : "FAIL (see above)");
  CUBLAS_CHECK(cublasDestroy(h));
  CUDA_CHECK(cudaFree(pool));
  CUDA_CHECK(cudaFree(x));
  CUDA_CHECK(cudaFree(out));
  CUDA_CHECK(cudaFree(out2));
  CUDA_CHECK(cudaFree(ref));
  CUDA_CHECK(cudaStreamDestroy(st));
  return all_ok ? 0 : 1;
}
