// The one place a concrete backend is chosen and built: the CPU backend (linked in) or the CUDA
// backend (libember_cuda.so, loaded at run time by cuda_loader). Layers above hold a `Backend&`
// and never name a concrete backend. Thread-safe (each call builds a new backend).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "util/status.h"

namespace ember {

enum class DeviceKind { kCpu, kCuda };

// What backend to build, with the options of each kind.
struct BackendChoice {
  DeviceKind device = DeviceKind::kCpu;
  int32_t num_threads = 0;  // CPU: 0 = all cores
  int32_t cuda_device = 0;
  bool cuda_f32_compute = false;  // CUDA: f32 weights and GEMMs (parity mode) instead of bf16
  // CUDA bf16: the batch-invariant GEMM too (a row's result never depends on the rest of the
  // step; slower). Attention is batch-invariant either way.
  bool cuda_batch_invariant = false;
  // CPU: the prefill-sized matrix products' kernels (CpuBackendOptions::matmul).
  CpuMatmul cpu_matmul = CpuMatmul::kExact;
  // CPU: the chunked delta rule for long steps (CpuBackendOptions::chunked_delta_rule).
  bool cpu_chunked_delta_rule = false;
  // CPU, tests: CpuBackendOptions::decode_graph_buckets (the engine pads decode steps to them).
  std::vector<int32_t> cpu_decode_graph_buckets;
};

// Whether this CPU has the instructions of CpuMatmul::kBf16 (AVX512_BF16) and of kF32 (AVX-512).
bool CpuHasBf16Dot();
bool CpuHasF32Fast();
// The fastest CpuMatmul this CPU runs: kBf16 where its bf16 dot products clearly outrun its
// float32 FMAs (timed once, cpu::Bf16DotOutrunsF32Fma), else kF32 with AVX-512, else kExact.
CpuMatmul CpuFastestMatmul();

// A new backend of the chosen kind; errors say why (no CUDA module, driver or usable device).
Result<std::unique_ptr<Backend>> CreateBackend(const BackendChoice& choice);

}  // namespace ember
