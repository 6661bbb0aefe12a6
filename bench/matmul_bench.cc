// CPU matmul kernel throughput (backend/cpu/matmul.h, and where the CPU has them matmul_f32fast.h's
// AVX-512 FMA tiles and matmul_bf16.h's AVX512_BF16 kernel): GFLOP/s of out = x W^T for
// prefill-sized (n = 512) and decode-sized (n = 1) x, per weight dtype and kernel, on one or more
// threads. Reports the best repetition's wall-clock rate (the least disturbed one on a noisy shared
// machine), the median, and the process-CPU-time rate. First, with AVX-512, one core's rate in
// chains of float32 FMAs and of bf16 dot products (cpu::MeasureDotRates).
// usage: matmul_bench [threads] [n] [k] [m]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_bf16.h"
#include "backend/cpu/matmul_f32fast.h"
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
  ember::cpu::ThreadPool pool(threads);
  if (ember::cpu::HasF32Fast()) {
    // The instructions' own ceilings on one core (what --cpu-matmul auto decides by).
    const ember::cpu::DotRates rates = ember::cpu::MeasureDotRates();
    std::printf("one core: VFMADD231PS %.1f GFLOP/s, VDPBF16PS %.1f GFLOP/s (0: not on this CPU)\n",
                rates.f32_fma / 1e9, rates.bf16_dot / 1e9);
  }
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(m);
  using Kernel = void (*)(const float*, int64_t, int64_t, const void*, ember::DType, int64_t,
                         const float*, float*, ember::cpu::ThreadPool&);
  std::vector<std::tuple<const char*, const void*, ember::DType, Kernel>> runs = {
      {"f16 exact", w16.data(), ember::DType::kF16, ember::cpu::MatMul},
      {"bf16 exact", wbf.data(), ember::DType::kBF16, ember::cpu::MatMul}};
  if (ember::cpu::HasF32Fast()) {
    runs.emplace_back("f16 f32fast", w16.data(), ember::DType::kF16, ember::cpu::MatMulF32Fast);
    runs.emplace_back("bf16 f32fast", wbf.data(), ember::DType::kBF16, ember::cpu::MatMulF32Fast);
  }
  if (ember::cpu::HasBf16Dot()) {
    runs.emplace_back("f16 bf16dot", w16.data(), ember::DType::kF16, ember::cpu::MatMulBf16);
    runs.emplace_back("bf16 bf16dot", wbf.data(), ember::DType::kBF16, ember::cpu::MatMulBf16);
  }
  for (auto [name, w, dtype, matmul] : runs) {
    matmul(x.data(), n, k, w, dtype, m, nullptr, out.data(), pool);  // warm-up
    // About a second of repetitions (at least 5): many short ones let the best dodge neighbours.
    const int reps = static_cast<int>(std::clamp(1e9 / flops * 40.0, 5.0, 2000.0));
    std::vector<double> times;
    const double c0 = CpuSeconds();
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      matmul(x.data(), n, k, w, dtype, m, nullptr, out.data(), pool);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double cpu = CpuSeconds() - c0;
    std::sort(times.begin(), times.end());
    const double best = times.front(), median = times[times.size() / 2];
    std::printf("%-12s n=%lld k=%lld m=%lld threads=%d: best %.1f GFLOP/s (median %.1f), %.1f GFLOP/s "
                "per CPU-second, best %.2f GB/s weights\n",
                name, static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m),
                threads, flops / best / 1e9, flops / median / 1e9, flops * reps / cpu / 1e9,
                static_cast<double>(m * k * 2) / best / 1e9);
  }
  return 0;
}
