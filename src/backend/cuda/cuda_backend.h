// The CUDA backend (NVIDIA Hopper, sm_90a): implements the ops-level Backend interface with
// weights resident on one GPU (bf16 for matrices, f32 for norms/biases/rope tables; or all f32
// in the f32 compute mode used for parity tests; the KV pool is bf16 in the bf16 mode where the
// batch-invariant attention kernel serves the head dim, else f32), cuBLAS GEMMs (a bf16 GEMV
// for n <= 8) and our own kernels. Ops are recorded and enqueued on one stream at the next sync
// point (CopyToHost, BeginStep), decode steps as replayed CUDA graphs; the host only waits in
// CopyToHost. Not thread-safe: one thread drives it. No CUDA headers here, so callers compile
// without the toolkit's includes.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "util/status.h"

namespace ember {

// Number of CUDA devices this build's kernels run on (compute capability 9.0); each other device
// present is named in a warning. 0 when the driver/runtime is missing or reports an error, so
// `--device auto` then falls back to the CPU (and `--device cuda` fails with the reason).
int CudaDeviceCount();

// A backend on CUDA device `device`. f32_compute: keep weights in float32 and run float32 GEMMs
// (no TF32) for parity with the CPU backend; otherwise 2-D weights are converted to bf16 once at
// upload and GEMMs run bf16 x bf16 -> f32. Errors (no GPU, bad index) name the device.
Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, bool f32_compute);

struct CudaBackendOptions {
  bool f32_compute = false;
  // Replay decode steps (every row a single token) as CUDA graphs, keyed by everything their
  // launches depend on; other steps launch op by op.
  bool cuda_graphs = true;
  // Time every op with CUDA events (forces op-by-op launches; for benchmarks).
  bool profile_ops = false;
  // bf16 mode: every row's result is bitwise independent of the step it is computed in (which
  // other rows share the step, chunk boundaries, decode vs prefill step). Attention always is
  // (attention_invariant.cu); this switch puts every MatMul on the fixed-order tensor-core GEMM
  // (gemm_invariant.cu), which is slower than the default GEMV (<= 8 rows) / cuBLAS paths whose
  // rows differ in the last bits between batch sizes (docs/perf.md has the cost).
  bool batch_invariant = false;
  // Tests: keep the KV pool float32 in the bf16 mode (by default it is bf16 where the
  // batch-invariant attention kernel serves the head dim). That kernel rounds f32 K/V to bf16 RN
  // as it stages them, so both pools give bitwise the same attention.
  bool kv_f32 = false;
};
Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, const CudaBackendOptions& options);

// Free and total memory of `device` in bytes, for sizing the KV pool from a memory fraction.
struct CudaMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
Result<CudaMemoryInfo> CudaGetMemoryInfo(int device);

// Tests and benchmarks: how often decode steps were captured as / replayed from CUDA graphs.
struct CudaGraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
};
CudaGraphStats CudaGetGraphStats(Backend& backend);

// With profile_ops: GPU time per op kind since creation ("MatMul(gemv)", "Attention", ...).
struct CudaOpTime {
  std::string op;
  double total_ms = 0;
  int64_t calls = 0;
};
std::vector<CudaOpTime> CudaGetOpProfile(Backend& backend);

// Tests and benchmarks: copies host floats into a float32 tensor of a CUDA backend (synchronous).
Status CudaCopyFromHost(Backend& backend, std::span<const float> host, const Tensor& dst);

}  // namespace ember
