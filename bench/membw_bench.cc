// Machine ceilings for the CPU backend (docs/perf.md): streaming read bandwidth of a
// buffer far larger than the L3 on 1..T threads, with 4 KB pages and with MADV_HUGEPAGE anonymous
// memory, as one stream per thread and as 8 prefetched streams per thread (the decode GEMV's
// pattern); and the FMA peak (12 independent 8-lane FMA chains per thread). Decode is bound by
// the first (every weight is read once per token), prefill by the second. Each figure is the best
// of several passes, so a busy shared machine still shows what the hardware can do.
// usage: membw_bench [max_threads=2] [buffer_mib=1024] [passes=5]
#include <sys/mman.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#pragma GCC target("avx2,fma")

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sums [p, p + bytes) (bytes % 128 == 0) with 4 independent 32-byte loads per iteration, as
// `streams` interleaved sequential streams (each a contiguous 1/streams of the range, the way a
// GEMV reads several weight rows at once), each prefetched `prefetch` bytes ahead (0: none).
float ReadStream(const float* p, size_t bytes, int streams, size_t prefetch) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const size_t per = bytes / sizeof(float) / static_cast<size_t>(streams) / 32 * 32;
  for (size_t i = 0; i < per; i += 32) {
    for (int s = 0; s < streams; ++s) {
      const float* q = p + per * static_cast<size_t>(s) + i;
      if (prefetch > 0) _mm_prefetch(reinterpret_cast<const char*>(q) + prefetch, _MM_HINT_T0);
      a0 = _mm256_add_ps(a0, _mm256_load_ps(q));
      a1 = _mm256_add_ps(a1, _mm256_load_ps(q + 8));
      a2 = _mm256_add_ps(a2, _mm256_load_ps(q + 16));
      a3 = _mm256_add_ps(a3, _mm256_load_ps(q + 24));
    }
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

// Best GB/s over `passes` passes of `threads` threads each reading its own contiguous share
// (bytes actually read: share rounded down per stream).
double ReadBandwidth(const float* buf, size_t bytes, int threads, int passes, int streams,
                     size_t prefetch) {
  double best = 0.0;
  std::vector<float> sink(static_cast<size_t>(threads));
  const size_t share = bytes / static_cast<size_t>(threads) / 128 * 128;
  for (int pass = 0; pass < passes; ++pass) {
    const double t0 = Now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        sink[static_cast<size_t>(t)] =
            ReadStream(buf + share / sizeof(float) * t, share, streams, prefetch);
      });
    for (std::thread& th : pool) th.join();
    best = std::max(best, static_cast<double>(share) * threads / (Now() - t0) / 1e9);
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

// GFLOP/s of 12 independent FMA chains (2 flops x 8 lanes each) on `threads` threads.
double FmaPeak(int threads) {
  constexpr int64_t kIters = 50'000'000;
  double best = 0.0;
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<float> sink(static_cast<size_t>(threads));
    const double t0 = Now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        __m256 a[12];
        for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_ps(static_cast<float>(j) * 1e-3f);
        const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
        for (int64_t i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
          for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(a[j], x, y);
        }
        __m256 s = a[0];
        for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, a[j]);
        float out[8];
        _mm256_storeu_ps(out, s);
        sink[static_cast<size_t>(t)] = out[0];
      });
    for (std::thread& th : pool) th.join();
    best = std::max(best, 2.0 * 8 * 12 * static_cast<double>(kIters) * threads / (Now() - t0) / 1e9);
  }
  return best;
}

float* MapBuffer(size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(p, 1, bytes);  // fault every page in before timing
  return static_cast<float*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  const int max_threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const size_t bytes = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024) << 20;
  const int passes = argc > 3 ? std::atoi(argv[3]) : 5;
  if (max_threads < 1 || bytes == 0 || passes < 1) {
    std::fprintf(stderr, "usage: membw_bench [max_threads=2] [buffer_mib=1024] [passes=5]\n");
    return 2;
  }
  for (bool huge : {false, true}) {
    float* buf = MapBuffer(bytes, huge);
    if (buf == nullptr) {
      std::fprintf(stderr, "membw_bench: cannot map %zu bytes\n", bytes);
      return 1;
    }
    for (auto [streams, prefetch] : {std::pair<int, size_t>{1, 0}, {8, 1024}})
      for (int t = 1; t <= max_threads; ++t)
        std::printf("read %zu MiB, %s pages, %d stream%s/thread%s, %d thread%s: best %.1f GB/s\n",
                    bytes >> 20, huge ? "MADV_HUGEPAGE" : "4 KB", streams, streams == 1 ? "" : "s",
                    prefetch > 0 ? " + prefetch 1 KB ahead" : "", t, t == 1 ? "" : "s",
                    ReadBandwidth(buf, bytes, t, passes, streams, prefetch));
    munmap(buf, bytes);
  }
  for (int t = 1; t <= max_threads; ++t)
    std::printf("FMA peak, 12 chains of 8-lane fma, %d thread%s: best %.1f GFLOP/s\n", t,
                t == 1 ? "" : "s", FmaPeak(t));
  return 0;
}
