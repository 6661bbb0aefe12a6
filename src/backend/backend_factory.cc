#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul_bf16.h"
#include "backend/cuda_loader.h"

namespace ember {

bool CpuHasBf16Dot() { return cpu::HasBf16Dot(); }

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
  cpu.bf16_matmul = choice.cpu_bf16_matmul;
  cpu.chunked_delta_rule = choice.cpu_chunked_delta_rule;
  return MakeCpuBackend(cpu);
}

}  // namespace ember
