// CPU matmul kernel throughput (backend/cpu/matmul.h): GFLOP/s of out = x W^T for prefill-sized
// (n = 512) and decode-sized (n = 1) x, per weight dtype, on one or more threads. Reports both
// wall-clock and process-CPU-time rates so a noisy shared machine can still be read.
// usage: matmul_bench [threads] [n] [k] [m]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "util/half.h"

namespace {

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 512;
  const int64_t k = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int64_t m = argc > 4 ? std::atoll(argv[4]) : 2048;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> x(static_cast<size_t>(n * k)), out(static_cast<size_t>(n * m));
  for (float& v : x) v = dist(rng);
  std::vector<uint16_t> w16(static_cast<size_t>(m * k));
  for (uint16_t& v : w16) v = ember::F32ToF16(dist(rng));
  std::vector<uint16_t> wbf(static_cast<size_t>(m * k));
  for (uint16_t& v : wbf) v = ember::F32ToBf16(dist(rng));
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(m);
  for (auto [name, w, dtype] : {std::tuple{"f16", static_cast<const void*>(w16.data()), ember::DType::kF16},
                                std::tuple{"bf16", static_cast<const void*>(wbf.data()), ember::DType::kBF16}}) {
    ember::cpu::MatMul(x.data(), n, k, w, dtype, m, nullptr, out.data(), threads);  // warm-up
    const int reps = n >= 64 ? 3 : 50;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = CpuSeconds();
    for (int r = 0; r < reps; ++r)
      ember::cpu::MatMul(x.data(), n, k, w, dtype, m, nullptr, out.data(), threads);
    const double cpu = CpuSeconds() - c0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-4s n=%lld k=%lld m=%lld threads=%d: %.1f GFLOP/s wall, %.1f GFLOP/s per CPU-second, "
                "%.2f GB/s weights (wall)\n",
                name, static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m),
                threads, flops * reps / wall / 1e9, flops * reps / cpu / 1e9,
                static_cast<double>(m * k * 2) * reps / wall / 1e9);
  }
  return 0;
}
