// cuBLAS / cuBLASLt ceilings for the prefill and batched-decode GEMMs (docs/perf.md):
// for each weight shape of a model, out[n, m] = x[n, k] W[m, k]^T with bf16 x and W and f32
// accumulation, timed as
//   gemmex-f32   cublasGemmEx, f32 out (what the backend calls above 8 rows),
//   gemmex-bf16  cublasGemmEx, bf16 out,
//   lt-f32/lt-bf16  cublasLt, the best of its first 8 heuristic algorithms (each timed; the
//                   f32 candidates are also listed one by one, in the heuristic's order),
// and reports TFLOP/s (2 n m k / time, median of the repetitions). Random data, so the clocks see
// a real load. Every call reads its weights cold: calls rotate over copies of the weights that
// together exceed the L2. Why: a forward pass reads each weight once, and one reused copy would stay
// in the L2 for the 1B's small matrices.
// usage: gemm_bench [--shape llama-3.1-8b|llama-3.2-1b] [--tokens 4096] [--reps 20]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "cuda_timing.h"
#include "util/flags.h"

namespace {

struct Shape {
  const char* name;
  int64_t m, k;
};

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "llama-3.1-8b";
  int64_t n = 4096, reps = 20;
  bool help = false;
  ember::FlagParser flags("gemm_bench [flags]");
  flags.AddString("--shape", &shape, "llama-3.1-8b | llama-3.2-1b");
  flags.AddInt("--tokens", &n, "rows of x (prompt tokens in the step)");
  flags.AddInt("--reps", &reps, "timed calls per variant (the median counts)");
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  std::vector<Shape> shapes;
  if (shape == "llama-3.1-8b") {
    shapes = {{"q/o", 4096, 4096},      {"k/v", 1024, 4096},      {"qkv", 6144, 4096},
              {"gate/up", 14336, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  } else if (shape == "llama-3.2-1b") {
    shapes = {{"q/o", 2048, 2048},     {"k/v", 512, 2048},       {"qkv", 3072, 2048},
              {"gate/up", 8192, 2048}, {"gate_up", 16384, 2048}, {"down", 2048, 8192}};
  } else {
    std::fprintf(stderr, "unknown --shape %s\n", shape.c_str());
    return 2;
  }
  int64_t max_mk = 0, max_nk = 0, max_nm = 0;
  for (const Shape& s : shapes) {
    max_mk = std::max(max_mk, s.m * s.k);
    max_nk = std::max(max_nk, n * s.k);
    max_nm = std::max(max_nm, n * s.m);
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  auto random_bf16 = [&](int64_t count, float scale) {
    std::vector<__nv_bfloat16> h(static_cast<size_t>(count));
    for (auto& v : h) v = __float2bfloat16(dist(rng) * scale);
    void* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    return d;
  };
  // Weight copies rotated call by call, >= 256 MB in all (the H200's L2 is 50 MB).
  const int64_t copies =
      std::max<int64_t>(1, ((int64_t{256} << 20) + max_mk * 2 - 1) / (max_mk * 2));
  auto* w_all = static_cast<__nv_bfloat16*>(random_bf16(max_mk, 0.02f));
  {
    void* grown = nullptr;
    CUDA_CHECK(cudaMalloc(&grown, static_cast<size_t>(copies * max_mk) * 2));
    for (int64_t c = 0; c < copies; ++c)
      CUDA_CHECK(cudaMemcpy(static_cast<__nv_bfloat16*>(grown) + c * max_mk, w_all,
                            static_cast<size_t>(max_mk) * 2, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaFree(w_all));
    w_all = static_cast<__nv_bfloat16*>(grown);
  }
  int64_t rotation = 0;
  auto next_w = [&] { return w_all + (rotation++ % copies) * max_mk; };
  void* x = random_bf16(max_nk, 1.0f);
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(max_nm) * 4));
  const size_t ws_bytes = size_t{64} << 20;
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  CUBLAS_CHECK(cublasSetStream(h, st));
  CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_bytes));
  cublasLtHandle_t lt;
  CUBLAS_CHECK(cublasLtCreate(&lt));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device=%s shape=%s tokens=%ld reps=%ld\n", prop.name, shape.c_str(),
              static_cast<long>(n), static_cast<long>(reps));
  std::printf("%-8s %6s %6s | %12s %12s %12s %12s  (TFLOP/s, median)\n", "weight", "m", "k",
              "gemmex-f32", "gemmex-bf16", "lt-f32", "lt-bf16");
  constexpr int kVariants = 4;
  double total_flop = 0, total_ms[kVariants] = {};
  for (const Shape& s : shapes) {
    const double flop =
        2.0 * static_cast<double>(n) * static_cast<double>(s.m) * static_cast<double>(s.k);
    const float alpha = 1.f, beta = 0.f;
    double ms[kVariants];
    std::string candidates;  // lt-f32: every heuristic candidate, in cuBLASLt's order
    for (int variant = 0; variant < 2; ++variant) {
      const cudaDataType_t ct = variant == 0 ? CUDA_R_32F : CUDA_R_16BF;
      ms[variant] = ember::bench::MedianMs(st, reps, [&] {
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.m),
                                  static_cast<int>(n), static_cast<int>(s.k), &alpha, next_w(),
                                  CUDA_R_16BF, static_cast<int>(s.k), x, CUDA_R_16BF,
                                  static_cast<int>(s.k), &beta, out, ct, static_cast<int>(s.m),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
    }
    for (int variant = 0; variant < 2; ++variant) {
      const cudaDataType_t ct = variant == 0 ? CUDA_R_32F : CUDA_R_16BF;
      cublasLtMatmulDesc_t desc;
      CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof(opt)));
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof(opn)));
      cublasLtMatrixLayout_t la, lb, lc;
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.m, s.k));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, n, s.k));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, ct, s.m, n, s.m));
      cublasLtMatmulPreference_t pref;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res[8];
      int found = 0;
      CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, res, &found));
      double best = 1e30;
      for (int a = 0; a < found; ++a) {
        const double t = ember::bench::MedianMs(st, reps, [&] {
          CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, next_w(), la, x, lb, &beta, out, lc, out,
                                      lc, &res[a].algo, ws, ws_bytes, st));
        });
        best = std::min(best, t);
        if (variant == 0) {
          char buf[32];
          std::snprintf(buf, sizeof(buf), " %.1f", flop / (t * 1e-3) / 1e12);
          candidates += buf;
        }
      }
      ms[2 + variant] = best;
      CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
      CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
      CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
      CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
      CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    }
    std::printf("%-8s %6ld %6ld |", s.name, static_cast<long>(s.m), static_cast<long>(s.k));
    for (int v = 0; v < kVariants; ++v) std::printf(" %12.1f", flop / (ms[v] * 1e-3) / 1e12);
    std::printf("\n         lt-f32 candidates in heuristic order (TFLOP/s):%s\n",
                candidates.c_str());
    // Per-layer total over the unfused calls a llama layer makes (q, k, v, o, gate, up, down).
    const int calls = !std::strcmp(s.name, "q/o")       ? 2
                      : !std::strcmp(s.name, "k/v")     ? 2
                      : !std::strcmp(s.name, "gate/up") ? 2
                      : !std::strcmp(s.name, "down")    ? 1
                                                        : 0;
    total_flop += calls * flop;
    for (int v = 0; v < kVariants; ++v) total_ms[v] += calls * ms[v];
  }
  std::printf("layer (q,k,v,o,gate,up,down unfused) |");
  for (int v = 0; v < kVariants; ++v)
    std::printf(" %12.1f", total_flop / (total_ms[v] * 1e-3) / 1e12);
  std::printf("\n");

  // A layer's 7 GEMMs back to back as the backend issues them (cublasGemmEx, f32 out), on one
  // stream and with q/k/v and gate/up as the backend's two-stream groups (the later GEMMs of a
  // group on a second stream and handle between a fork and a join event).
  {
    auto find = [&](const char* name) {
      for (const Shape& sh : shapes)
        if (!std::strcmp(sh.name, name)) return sh;
      return Shape{name, 0, 0};
    };
    const Shape qo = find("q/o"), kv = find("k/v"), gu = find("gate/up"), down = find("down");
    cudaStream_t side;
    CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cublasHandle_t h2;
    CUBLAS_CHECK(cublasCreate(&h2));
    CUBLAS_CHECK(cublasSetStream(h2, side));
    void* ws2 = nullptr;
    CUDA_CHECK(cudaMalloc(&ws2, ws_bytes));
    CUBLAS_CHECK(cublasSetWorkspace(h2, ws2, ws_bytes));
    void* out2 = nullptr;
    void* out3 = nullptr;
    CUDA_CHECK(cudaMalloc(&out2, static_cast<size_t>(max_nm) * 4));
    CUDA_CHECK(cudaMalloc(&out3, static_cast<size_t>(max_nm) * 4));
    cudaEvent_t fork, join;
    CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    const float alpha = 1.f, beta = 0.f;
    auto gemm = [&](cublasHandle_t hh, const Shape& sh, void* o) {
      CUBLAS_CHECK(cublasGemmEx(hh, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh.m),
                                static_cast<int>(n), static_cast<int>(sh.k), &alpha, next_w(),
                                CUDA_R_16BF, static_cast<int>(sh.k), x, CUDA_R_16BF,
                                static_cast<int>(sh.k), &beta, o, CUDA_R_32F,
                                static_cast<int>(sh.m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    // gemms[0] on st, the rest on the side stream when `two`.
    auto group = [&](bool two, std::initializer_list<Shape> gemms) {
      void* outs[3] = {out, out2, out3};
      int i = 0;
      if (two) {
        CUDA_CHECK(cudaEventRecord(fork, st));
        CUDA_CHECK(cudaStreamWaitEvent(side, fork));
      }
      for (const Shape& sh : gemms) {
        gemm(two && i > 0 ? h2 : h, sh, outs[i]);
        ++i;
      }
      if (two) {
        CUDA_CHECK(cudaEventRecord(join, side));
        CUDA_CHECK(cudaStreamWaitEvent(st, join));
      }
    };
    double layer_ms[2];
    for (int two = 0; two < 2; ++two) {
      layer_ms[two] = ember::bench::MedianMs(st, reps, [&] {
        group(two == 1, {qo, kv, kv});
        group(false, {qo});
        group(two == 1, {gu, gu});
        group(false, {down});
      });
    }
    // q/k/v and gate/up as one GEMM each over concatenated weights, then each part's columns
    // copied out of the wide result into its own [n, m] buffer (a strided copy per part).
    const Shape qkv = find("qkv"), gate_up = find("gate_up");
    auto split = [&](const Shape& wide, std::initializer_list<int64_t> parts) {
      int64_t col = 0;
      void* dsts[3] = {out2, out3, out2};
      int i = 0;
      for (int64_t m : parts) {
        CUDA_CHECK(cudaMemcpy2DAsync(dsts[i++], static_cast<size_t>(m) * 4,
                                     static_cast<char*>(out) + col * 4,
                                     static_cast<size_t>(wide.m) * 4, static_cast<size_t>(m) * 4,
                                     static_cast<size_t>(n), cudaMemcpyDeviceToDevice, st));
        col += m;
      }
    };
    const double fused_ms = ember::bench::MedianMs(st, reps, [&] {
      group(false, {qkv});
      split(qkv, {qo.m, kv.m, kv.m});
      group(false, {qo});
      group(false, {gate_up});
      split(gate_up, {gu.m, gu.m});
      group(false, {down});
    });
    const double nofuse_split_ms = ember::bench::MedianMs(st, reps, [&] {
      group(false, {qkv});
      group(false, {qo});
      group(false, {gate_up});
      group(false, {down});
    });
    std::printf(
        "layer's 7 GEMMs in order, us (TFLOP/s): one stream %.1f (%.1f), q/k/v and gate/up "
        "on two streams %.1f (%.1f), q/k/v and gate/up fused then split %.1f (%.1f), fused "
        "without the split %.1f\n",
        layer_ms[0] * 1e3, total_flop / (layer_ms[0] * 1e-3) / 1e12, layer_ms[1] * 1e3,
        total_flop / (layer_ms[1] * 1e-3) / 1e12, fused_ms * 1e3,
        total_flop / (fused_ms * 1e-3) / 1e12, nofuse_split_ms * 1e3);
    CUDA_CHECK(cudaEventDestroy(fork));
    CUDA_CHECK(cudaEventDestroy(join));
    CUBLAS_CHECK(cublasDestroy(h2));
    CUDA_CHECK(cudaStreamDestroy(side));
  }
  CUBLAS_CHECK(cublasLtDestroy(lt));
  CUBLAS_CHECK(cublasDestroy(h));
  return 0;
}
