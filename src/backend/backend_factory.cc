#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul_bf16.h"
#include "backend/cpu/matmul_f32fast.h"
#include "backend/cuda_loader.h"

namespace ember {

bool CpuHasBf16Dot() { return cpu::HasBf16Dot(); }
bool CpuHasF32Fast() { return cpu::HasF32Fast(); }
CpuMatmul CpuFastestMatmul() {
  if (cpu::Bf16DotOutrunsF32Fma()) return CpuMatmul::kBf16;
  return cpu::HasF32Fast() ? CpuMatmul::kF32 : CpuMatmul::kExact;
}

Result<std::unique_ptr<Backend>> CreateBackend(const BackendChoice& choice) {
  if (choice.device == DeviceKind::kCuda) {
    CudaBackendOptions cuda;
    cuda.f32_compute = choice.cuda_f32_compute;
    cuda.batch_invariant = choice.cuda_batch_invariant;
    return LoadCudaBackend(choice.cuda_device, cuda);
  }
  CpuBackendOptions cpu;
  cpu.num_threads = choice.num_threads;
  cpu.decode_graph_buckets = choice.cpu_decode_graph_buckets;
  cpu.matmul = choice.cpu_matmul;
  cpu.chunked_delta_rule = choice.cpu_chunked_delta_rule;
  return MakeCpuBackend(cpu);
}

}  // namespace ember
