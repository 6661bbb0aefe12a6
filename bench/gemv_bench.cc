// Batch-1 decode GEMV (backend/cuda/gemv.cu) in isolation: for each weight group of a model's
// decode step, out = W x with bf16 W and f32 x, launched `--chain` times back to back in one CUDA
// graph (programmatic dependent launch between them, as in a decode step), each launch on its own
// copy of the weights so every byte comes from DRAM (the copies total >= 256 MB, 5x the L2). Prints
// microseconds per launch and the weight bytes streamed per second (median of the replays). The
// question it answers: how close to the device-copy bandwidth each matrix shape streams.
// usage: gemv_bench [--shape llama-3.2-1b|llama-3.1-8b] [--chain 16] [--reps 30]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "cuda_timing.h"
#include "util/flags.h"

namespace {

struct Group {
  const char* name;
  std::vector<int64_t> ms;  // rows of each part sharing x
  int64_t k;
};

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "llama-3.2-1b";
  int64_t chain = 16, reps = 30;
  bool help = false;
  ember::FlagParser flags("gemv_bench [flags]");
  flags.AddString("--shape", &shape, "llama-3.2-1b | llama-3.1-8b");
  flags.AddInt("--chain", &chain, "GEMV launches per graph replay (each on its own weights)");
  flags.AddInt("--reps", &reps, "timed graph replays (the median counts)");
  const ember::Status parsed = flags.Parse(argc, argv, 1, &help);
  if (const int status = flags.ExitStatusAfterParse(parsed, help); status >= 0) return status;
  if (chain < 1 || reps < 1) {
    std::fprintf(stderr, "--chain and --reps must be >= 1\n");
    return 2;
  }
  std::vector<Group> groups;
  if (shape == "llama-3.2-1b") {
    groups = {{"qkv", {2048, 512, 512}, 2048}, {"o", {2048}, 2048},
              {"gate/up", {8192, 8192}, 2048}, {"down", {2048}, 8192},
              {"lm_head", {128256}, 2048}};
  } else if (shape == "llama-3.1-8b") {
    groups = {{"qkv", {4096, 1024, 1024}, 4096}, {"o", {4096}, 4096},
              {"gate/up", {14336, 14336}, 4096}, {"down", {4096}, 14336},
              {"lm_head", {128256}, 4096}};
  } else {
    std::fprintf(stderr, "unknown --shape %s\n", shape.c_str());
    return 2;
  }
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  std::printf("shape=%s chain=%ld reps=%ld\n%-8s %8s %6s | %9s %8s\n", shape.c_str(),
              static_cast<long>(chain), static_cast<long>(reps), "weights", "MB", "k", "us/call",
              "TB/s");
  for (const Group& g : groups) {
    int64_t m_total = 0;
    for (int64_t m : g.ms) m_total += m;
    const size_t bytes = static_cast<size_t>(m_total * g.k) * 2;
    const int64_t copies = std::min<int64_t>(
        chain, std::max<int64_t>(2, static_cast<int64_t>((size_t{256} << 20) / bytes) + 1));
    std::vector<void*> w(static_cast<size_t>(copies));
    for (void*& p : w) {
      CUDA_CHECK(cudaMalloc(&p, bytes));
      CUDA_CHECK(cudaMemset(p, 0x3c, bytes));  // bf16 0x3c3c ~ 0.0115: finite, nonzero
    }
    float *x = nullptr, *out = nullptr;
    CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(g.k) * 4));
    CUDA_CHECK(cudaMemset(x, 0, static_cast<size_t>(g.k) * 4));
    CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(m_total) * 4));
    // The chain, captured once: launch i reads weight copy i % copies.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int64_t i = 0; i < chain; ++i) {
      const char* base = static_cast<const char*>(w[static_cast<size_t>(i % copies)]);
      std::vector<ember::cuda::GemvPart> parts;
      int64_t row = 0;
      for (int64_t m : g.ms) {
        parts.push_back({base + row * g.k * 2, nullptr, out + row, m});
        row += m;
      }
      // The next launch's weights are this one's L2 prefetch (as in a decode step).
      const ember::cuda::GemvPrefetch next{w[static_cast<size_t>((i + 1) % copies)],
                                           static_cast<int64_t>(bytes)};
      ember::cuda::LaunchGemvBf16Multi(x, parts.data(), static_cast<int>(parts.size()), g.k, next,
                                       st);
    }
    CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const double median_ms = ember::bench::MedianMs(
        st, reps, [&] { CUDA_CHECK(cudaGraphLaunch(exec, st)); });
    const double us = 1e3 * median_ms / static_cast<double>(chain);
    std::printf("%-8s %8.1f %6ld | %9.2f %8.2f\n", g.name, static_cast<double>(bytes) / 1e6,
                static_cast<long>(g.k), us, static_cast<double>(bytes) / us / 1e6);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    for (void* p : w) CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(out));
  }
  return 0;
}
