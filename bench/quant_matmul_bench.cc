// Quantized CPU matmul throughput (backend/cpu/matmul_quant.h) next to the f16 kernel
// (backend/cpu/matmul.h) in the same run: for each n (decode: <= 8, prefill: > 8) and weight type,
// the best repetition's GFLOP/s (2 n k m / time) and weight GB/s (the matrix's bytes / time), and
// the median. Q8_0 / Q4_0 run the default int8-x kernel (best ISA) and the float32-x kernel; with
// "all", also every other integer-dot ISA the CPU has. Q4_K / Q5_K / Q6_K (matmul_kquant.h: the
// same variants) run on random packed super-blocks (no k-quant quantizer here: random quant
// bytes and f16 scales of 0.001), next to "f32" (the same shape as the f32 matrix the loader
// dequantizes them to without the kernels).
// usage: quant_matmul_bench [threads] [k] [m] [n1,n2,...] [all]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_quant.h"
#include "util/half.h"

namespace {

using ember::DType;
namespace cpu = ember::cpu;

struct Variant {
  std::string label;
  cpu::QuantKernel kernel = cpu::QuantKernel::kInt8X;
  cpu::QuantIsa isa = cpu::QuantIsa::kAuto;
};

void Measure(const char* name, const std::string& label, const float* x, int64_t n, int64_t k,
             const void* w, DType dtype, int64_t m, size_t weight_bytes, float* out,
             cpu::ThreadPool& pool) {
  auto run = [&] {
    if (ember::IsBlockQuantized(dtype))
      cpu::MatMulQuant(x, n, k, w, dtype, m, nullptr, out, pool);
    else
      cpu::MatMul(x, n, k, w, dtype, m, nullptr, out, pool);
  };
  run();  // warm-up
  const double flops = 2.0 * double(n) * double(k) * double(m);
  const int reps = static_cast<int>(std::clamp(1e9 / flops * 20.0, 5.0, 500.0));
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double best = times.front(), median = times[times.size() / 2];
  std::printf("| %-5s | %-18s | %4lld | %5lld | %5lld | %7.1f | %7.1f | %6.2f | %8.3f |\n", name,
              label.c_str(), static_cast<long long>(n), static_cast<long long>(k),
              static_cast<long long>(m), flops / best * 1e-9, flops / median * 1e-9,
              double(weight_bytes) / best * 1e-9, best * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t k = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t m = argc > 3 ? std::atoll(argv[3]) : 2048;
  std::vector<int64_t> ns = {1, 4, 8, 64, 512};
  if (argc > 4) {
    ns.clear();
    for (const char* p = argv[4]; *p != '\0';) {
      char* end = nullptr;
      ns.push_back(std::strtoll(p, &end, 10));
      p = *end == ',' ? end + 1 : end;
    }
  }
  const bool all = argc > 5 && std::strcmp(argv[5], "all") == 0;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> wf(static_cast<size_t>(m * k));
  for (float& v : wf) v = dist(rng);
  std::vector<uint16_t> w16(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w16[i] = ember::F32ToF16(wf[i]);
  std::vector<std::vector<uint8_t>> quantized;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    const size_t row = ember::DTypeRowBytes(t, k);
    quantized.emplace_back(row * static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r)
      cpu::QuantizeRow(t, wf.data() + r * k, k, quantized.back().data() + r * row);
  }
  const DType kquants[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  std::vector<std::vector<uint8_t>> packed;
  for (DType t : kquants) {
    packed.emplace_back(ember::DTypeRowBytes(t, k) * static_cast<size_t>(m));
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : packed.back()) b = static_cast<uint8_t>(byte(rng));
    const size_t block = ember::DTypeRowBytes(t, 256);
    const uint16_t scale = ember::F32ToF16(0.001f);
    for (size_t off = 0; off < packed.back().size(); off += block)
      for (size_t at : t == DType::kQ6_K ? std::vector<size_t>{208} : std::vector<size_t>{0, 2})
        std::memcpy(packed.back().data() + off + at, &scale, 2);
  }
  cpu::ThreadPool pool(threads);
  std::printf("threads %d, prefill integer dot: %s\n", threads, cpu::QuantDotIsaName());
  std::printf("| type  | kernel             |    n |     k |     m | GFLOP/s | median  | GB/s w | best ms  |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t n : ns) {
    std::vector<float> x(static_cast<size_t>(n * k)), out(static_cast<size_t>(n * m));
    for (float& v : x) v = dist(rng) * 50.0f;
    Measure("f16", "exact f32", x.data(), n, k, w16.data(), DType::kF16, m, w16.size() * 2,
            out.data(), pool);
    std::vector<Variant> variants = {
        {std::string("int8 x ") + cpu::QuantDotIsaName()},
        {"float32 x", cpu::QuantKernel::kFloatX, cpu::QuantIsa::kAuto}};
    if (all) {
      variants.push_back({"int8 x avx2", cpu::QuantKernel::kInt8X, cpu::QuantIsa::kAvx2});
      if (cpu::CpuHasQuantIsa(cpu::QuantIsa::kAvxVnni))
        variants.push_back({"int8 x avxvnni", cpu::QuantKernel::kInt8X, cpu::QuantIsa::kAvxVnni});
    }
    for (size_t t = 0; t < 2; ++t) {
      const DType dtype = t == 0 ? DType::kQ8_0 : DType::kQ4_0;
      for (const Variant& v : variants) {
        cpu::SetQuantKernel(v.kernel, v.isa);
        Measure(ember::DTypeName(dtype), v.label, x.data(), n, k, quantized[t].data(), dtype, m,
                quantized[t].size(), out.data(), pool);
      }
      cpu::SetQuantKernel(cpu::QuantKernel::kInt8X, cpu::QuantIsa::kAuto);
    }
    if (k % 256 != 0) continue;
    Measure("f32", "exact f32", x.data(), n, k, wf.data(), DType::kF32, m, wf.size() * 4,
            out.data(), pool);
    for (size_t t = 0; t < packed.size(); ++t) {
      for (const Variant& v : variants) {
        cpu::SetQuantKernel(v.kernel, v.isa);
        Measure(ember::DTypeName(kquants[t]), v.label, x.data(), n, k, packed[t].data(),
                kquants[t], m, packed[t].size(), out.data(), pool);
      }
      cpu::SetQuantKernel(cpu::QuantKernel::kInt8X, cpu::QuantIsa::kAuto);
    }
  }
  return 0;
}
