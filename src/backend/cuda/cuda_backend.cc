// CudaBackend's lifetime, set-up and workspace: construction (streams, cuBLAS handles, the
// recorder), weight upload, the KV pool, rope tables, the per-step bump arena and the buffers
// ops allocate from it, the op profile, and the factory functions of cuda_backend.h. The class
// itself is declared in cuda_backend_impl.h.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/kv_quant.h"
#include "backend/rope_table.h"
#include "util/half.h"
#include "util/log.h"

namespace ember {
namespace cuda {
namespace {

// The rows of a buffer seen as a matrix: the product of every dimension but the last.
int64_t MatrixRows(std::initializer_list<int64_t> shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape.begin()[i];
  return rows;
}

std::vector<CudaOpTime> NamedOpTimes(const std::vector<StepRecorder::OpTime>& times) {
  std::vector<CudaOpTime> out;
  for (const StepRecorder::OpTime& t : times)
    out.push_back(CudaOpTime{OpKindName(t.kind), t.total_ms, t.calls});
  return out;
}

}  // namespace

ElemType ToElemType(DType t) {
  switch (t) {
    case DType::kF16:
      return ElemType::kF16;
    case DType::kBF16:
      return ElemType::kBF16;
    case DType::kF32:
      return ElemType::kF32;
    case DType::kI32:
    case DType::kU8:
    case DType::kQ8_0:  // block-quantized weights never reach CUDA (UploadWeight refuses them)
    case DType::kQ4_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      break;
  }
  CHECK(false) << "no element type for " << DTypeName(t);
  return ElemType::kF32;
}

CudaBackend::CudaBackend(int device, const CudaBackendOptions& options, RuntimeSwitches switches)
    : device_(device),
      f32_compute_(options.f32_compute),
      use_graphs_(options.cuda_graphs && switches.graphs),
      always_invariant_(options.batch_invariant && !options.f32_compute),
      batch_invariant_(always_invariant_),
      kv_f32_(options.kv_f32),
      switches_(std::move(switches)),
      cublas_(stream_.get()),
      recorder_(stream_.get(), /*max_graphs=*/128),
      cublas_workspace_(kCublasWorkspaceBytes),
      cublas_side_(side_stream_.get()),
      cublas_side_workspace_(kCublasWorkspaceBytes),
      argmax_scratch_(size_t{kArgmaxSplitRows} * kArgmaxSplitChunks * 8 +
                      kArgmaxSplitRows * sizeof(unsigned)) {
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  CUDA_CHECK(cudaMemset(argmax_scratch_.data(), 0, argmax_scratch_.bytes()));
  // cuBLAS must not allocate while a graph is being captured: give it a fixed workspace.
  CUBLAS_CHECK(
      cublasSetWorkspace(cublas_.get(), cublas_workspace_.data(), cublas_workspace_.bytes()));
  CUBLAS_CHECK(cublasSetWorkspace(cublas_side_.get(), cublas_side_workspace_.data(),
                                  cublas_side_workspace_.bytes()));
  recorder_.set_profiling(options.profile_ops || !switches_.profile_out.empty());
  SkinnyGemmWarmUp();  // its kernels' attributes, before any graph capture
}

CudaBackend::~CudaBackend() {
  LoraSendStaged();
  recorder_.Flush(false);
  SyncAllStreams();
  if (!switches_.profile_out.empty()) AppendOpProfile(switches_.profile_out);
#ifdef EMBER_CUDA_TRACE
  if (!switches_.trace_out.empty()) DumpStepTrace(switches_.trace_out.c_str());
#endif
}

std::vector<int32_t> CudaBackend::DecodeGraphBuckets() const {
  std::vector<int32_t> buckets;
  if (!use_graphs_ || recorder_.profiling()) return buckets;
  for (int32_t b = 1; b <= kMaxGraphBucket; b = b < 8 ? 2 * b : b + 8) buckets.push_back(b);
  return buckets;
}

Result<Tensor> CudaBackend::UploadF32Weight(const std::string& name,
                                            std::span<const int64_t> shape,
                                            const float* host_data) {
  return UploadWeightAs(name, DType::kF32, shape, host_data, DType::kF32);
}

Result<Tensor> CudaBackend::UploadWeight(const std::string& name, DType dtype,
                                         std::span<const int64_t> shape, const void* host_data) {
  // Matrices go to bf16 (the GEMM/embedding operand type); norms and biases stay f32; bytes
  // (packed MXFP4 experts) stay bytes.
  const DType stored = dtype == DType::kU8                   ? DType::kU8
                       : (f32_compute_ || shape.size() == 1) ? DType::kF32
                                                             : DType::kBF16;
  return UploadWeightAs(name, dtype, shape, host_data, stored);
}

Result<Tensor> CudaBackend::UploadWeightAs(const std::string& name, DType dtype,
                                           std::span<const int64_t> shape, const void* host_data,
                                           DType stored) {
  if (shape.empty() || shape.size() > 4)
    return Status::Error("weight " + name + ": expected 1 to 4 dims, got " +
                         std::to_string(shape.size()));
  if (dtype == DType::kI32)
    return Status::Error("weight " + name + ": I32 weights are not supported");
  if (IsBlockQuantized(dtype))  // (TakesQuantizedWeights is false: loaders dequantize for CUDA)
    return Status::Error("weight " + name + ": the CUDA backend has no kernels for " +
                         DTypeName(dtype) + " weights");
  Tensor t;
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) return Status::Error("weight " + name + ": non-positive dim");
    t.shape[i] = shape[i];
  }
  t.dtype = stored;
  const int64_t n = t.numel();
  Flush();
  DeviceBuffer buffer(t.nbytes());
  const size_t src_bytes = static_cast<size_t>(n) * DTypeSize(dtype);
  // Copies go on our stream (it does not synchronise with the legacy default stream).
  if (dtype == t.dtype) {
    CUDA_CHECK(cudaMemcpyAsync(buffer.data(), host_data, src_bytes, cudaMemcpyHostToDevice,
                               stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  } else {
    DeviceBuffer staging(src_bytes);
    CUDA_CHECK(cudaMemcpyAsync(staging.data(), host_data, src_bytes, cudaMemcpyHostToDevice,
                               stream_.get()));
    LaunchConvert(staging.data(), ToElemType(dtype), buffer.data(), ToElemType(t.dtype), n,
                  stream_.get());
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  }
  t.data = buffer.data();
  weights_.push_back(std::move(buffer));
  return t;
}

Status CudaBackend::SetKvFormat(const KvFormat& format, int32_t head_dim) {
  if (kv_pool_.data() != nullptr) return Status::Error("SetKvFormat after AllocateKvPool");
  const KvDType own = KvBf16(head_dim) ? KvDType::kBF16 : KvDType::kF32;
  std::vector<KvDType> layers;
  for (size_t l = 0; l < format.layers.size(); ++l) {
    const KvDType t = format.layers[l] == KvDType::kAuto ? own : format.layers[l];
    const std::string what =
        "--kv-cache-dtype " + std::string(KvDTypeName(t)) + " (layer " + std::to_string(l) + "): ";
    if (t != own && t != KvDType::kInt8 && t != KvDType::kFP8 && t != KvDType::kInt4)
      return Status::Error(what + "not supported on the " + name() + " backend yet (its KV " +
                           "cache takes " + KvDTypeName(own) + ", int8, fp8 or int4 here)");
    if ((t == KvDType::kInt8 || t == KvDType::kFP8) && head_dim % 4 != 0)
      return Status::Error(what + "the " + name() + " backend needs a head_dim that is a " +
                           "multiple of 4 for int8 / fp8 KV rows, got " + std::to_string(head_dim));
    if (t == KvDType::kInt4) {
      const std::string why = KvHeadDimUnsupported(t, head_dim);
      if (!why.empty()) return Status::Error(what + why);
    }
    layers.push_back(t);
  }
  kv_dtypes_ = std::move(layers);
  kv_rotate_int4_ = format.rotate_int4;
  return Status::Ok();
}

int64_t CudaBackend::KvTokenBytes(int32_t num_layers, int32_t num_kv_heads,
                                  int32_t head_dim) const {
  if (kv_dtypes_.empty()) return Backend::KvTokenBytes(num_layers, num_kv_heads, head_dim);
  CHECK_EQ(static_cast<int32_t>(kv_dtypes_.size()), num_layers);
  int64_t bytes = 0;
  for (KvDType t : kv_dtypes_) bytes += 2 * int64_t{num_kv_heads} * KvRowBytes(t, head_dim);
  return bytes;
}

std::string CudaBackend::KvFormatText(int32_t head_dim) const {
  if (kv_dtypes_.empty()) return Backend::KvFormatText(head_dim);
  return KvFormat{kv_dtypes_, kv_rotate_int4_}.Describe();
}

int64_t CudaBackend::KvLayerBlockBytes(int32_t layer) const {
  return int64_t{kv_block_size_} * kv_heads_ *
         KvRowBytes(kv_dtypes_[static_cast<size_t>(layer)], kv_head_dim_);
}

Status CudaBackend::AllocateKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                                   int32_t num_kv_heads, int32_t head_dim) {
  CHECK(kv_pool_.data() == nullptr) << "AllocateKvPool called twice";
  Flush();
  if (num_layers <= 0 || num_blocks <= 0 || block_size <= 0 || num_kv_heads <= 0 || head_dim <= 0 ||
      head_dim > kMaxHeadDim)
    return Status::Error(
        "KV pool: bad geometry (head_dim must be <= " + std::to_string(kMaxHeadDim) + ")");
  if (kv_dtypes_.empty())
    kv_dtypes_.assign(static_cast<size_t>(num_layers),
                      KvBf16(head_dim) ? KvDType::kBF16 : KvDType::kF32);
  if (static_cast<int32_t>(kv_dtypes_.size()) != num_layers)
    return Status::Error("the KV format has " + std::to_string(kv_dtypes_.size()) +
                         " layers, the pool " + std::to_string(num_layers));
  kv_block_size_ = block_size;
  kv_heads_ = num_kv_heads;
  kv_head_dim_ = head_dim;
  return AllocatePool(num_layers, num_blocks, 2);
}

Status CudaBackend::AllocatePool(int32_t num_layers, int32_t num_blocks, int32_t tensors) {
  size_t bytes = 0;
  kv_layer_offset_.clear();
  for (int32_t l = 0; l < num_layers; ++l) {
    // 256-byte aligned layers: a quantized layer's tensors may end off a 16-byte boundary (odd
    // block sizes), and the kernels' 16-byte copies need aligned tensors.
    bytes = (bytes + 255) / 256 * 256;
    kv_layer_offset_.push_back(bytes);
    bytes += static_cast<size_t>(tensors) * static_cast<size_t>(KvLayerBlockBytes(l)) *
             static_cast<size_t>(num_blocks);
  }
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > free_bytes)
    return Status::Error("KV pool: " + std::to_string(bytes) + " bytes requested, only " +
                         std::to_string(free_bytes) + " free on cuda:" + std::to_string(device_));
  kv_pool_ = DeviceBuffer(bytes);
  CUDA_CHECK(cudaMemsetAsync(kv_pool_.data(), 0, bytes, stream_.get()));
  kv_layers_ = num_layers;
  kv_blocks_ = num_blocks;
  kv_tensors_ = tensors;
  return Status::Ok();
}

int64_t CudaBackend::KvBlockBytes() const {
  if (kv_pool_.data() == nullptr) return 0;
  int64_t bytes = 0;
  for (int32_t l = 0; l < kv_layers_; ++l) bytes += kv_tensors_ * KvLayerBlockBytes(l);
  return bytes;
}

Result<int32_t> CudaBackend::CreateRope(const RopeSpec& spec) {
  EMBER_ASSIGN_OR_RETURN(RopeTable table, BuildRopeTable(spec));
  DeviceRope rope;
  rope.spec = spec;
  rope.cos = DeviceBuffer(table.cos.size() * sizeof(float));
  rope.sin = DeviceBuffer(table.sin.size() * sizeof(float));
  Flush();
  CUDA_CHECK(cudaMemcpyAsync(rope.cos.data(), table.cos.data(), rope.cos.bytes(),
                             cudaMemcpyHostToDevice, stream_.get()));
  CUDA_CHECK(cudaMemcpyAsync(rope.sin.data(), table.sin.data(), rope.sin.bytes(),
                             cudaMemcpyHostToDevice, stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  ropes_.push_back(std::move(rope));
  return static_cast<int32_t>(ropes_.size() - 1);
}

void* CudaBackend::ArenaAlloc(size_t bytes) {
  bytes = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (arena_chunks_.empty() || arena_offset_ + bytes > arena_chunks_.back().bytes()) {
    const size_t last = arena_chunks_.empty() ? 0 : arena_chunks_.back().bytes();
    arena_chunks_.emplace_back(std::max({bytes, 2 * last, size_t{64} << 20}));
    arena_offset_ = 0;
  }
  void* p = static_cast<uint8_t*>(arena_chunks_.back().data()) + arena_offset_;
  arena_offset_ += bytes;
  return p;
}

unsigned char* CudaBackend::StepRegionOf(StepRegion& region, size_t bytes) {
  if (region.step != steps_begun_ || region.bytes < bytes) {
    region.data = static_cast<unsigned char*>(ArenaAlloc(bytes));
    region.bytes = bytes;
    region.step = steps_begun_;
  }
  return region.data;
}

Tensor CudaBackend::Alloc(std::initializer_list<int64_t> shape) {
  return AllocOf(DType::kF32, shape);
}

// bf16 where MatMul takes the cuBLAS path (Bf16MatMulInput): the producing op rounds its f32
// result once, and MatMul needs no conversion pass of its own (the same bits, a third of the
// bytes). f32 elsewhere.
Tensor CudaBackend::AllocMatMulInput(std::initializer_list<int64_t> shape) {
  return AllocOf(Bf16MatMulInput(MatrixRows(shape)) ? DType::kBF16 : DType::kF32, shape);
}

// bf16 where MatMul takes the cuBLAS path, as AllocMatMulInput: cuBLAS writes the bf16 result
// (rounded RN from its f32 accumulators) and its reader reads half the bytes (a faster prefill,
// docs/perf.md).
Tensor CudaBackend::AllocMatMulOutput(std::initializer_list<int64_t> shape) {
  return AllocOf(Bf16MatMulInput(MatrixRows(shape)) ? DType::kBF16 : DType::kF32, shape);
}

Tensor CudaBackend::AllocOf(DType dtype, std::initializer_list<int64_t> shape) {
  CHECK(in_step_) << "Alloc before BeginStep";
  CHECK(shape.size() >= 1 && shape.size() <= 4);
  Tensor t;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  size_t i = 0;
  for (int64_t d : shape) {
    CHECK_GE(d, 0);
    t.shape[i++] = d;
  }
  t.data = ArenaAlloc(t.nbytes());
  return t;
}

std::span<float> CudaBackend::HostBuffer(size_t count) {
  host_buffer_.Reserve(count * sizeof(float));
  return {reinterpret_cast<float*>(host_buffer_.data()), count};
}

Result<BackendMemory> CudaBackend::MemoryInfo() const {
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  BackendMemory m;
  m.free_bytes = static_cast<int64_t>(free_bytes);
  m.total_bytes = static_cast<int64_t>(total_bytes);
  m.device = true;
  return m;
}

void CudaBackend::AppendOpProfile(const std::string& path) const {
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    LOG_WARN << "EMBER_CUDA_PROFILE_OUT: cannot open " << path;
    return;
  }
  std::fprintf(f, "# %s: %lld steps, %lld rows; op, calls, GPU ms in all\n", name().c_str(),
               static_cast<long long>(steps_begun_), static_cast<long long>(profiled_rows_));
  for (const CudaOpTime& t : NamedOpTimes(op_times()))
    std::fprintf(f, "%s %lld %.3f\n", t.op.c_str(), static_cast<long long>(t.calls), t.total_ms);
  std::fclose(f);
}

}  // namespace cuda

namespace {

// Devices the runtime sees, whatever their kind (0 when there is no driver or device).
int CudaDevicesPresent() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

// Why `device` cannot run this build's kernels (built for compute capability 9.0, sm_90a:
// wgmma, bulk copies), or "" when it can.
std::string UnusableReason(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cuda device " + std::to_string(device) + ": its properties cannot be read";
  }
  if (prop.major == 9 && prop.minor == 0) return "";
  return "cuda device " + std::to_string(device) + " is " + prop.name + " (compute capability " +
         std::to_string(prop.major) + "." + std::to_string(prop.minor) +
         "); this build's kernels run only on compute capability 9.0 (Hopper: H100, H200)";
}

}  // namespace

int CudaDeviceCount() {
  const int present = CudaDevicesPresent();
  int usable = 0;
  for (int d = 0; d < present; ++d) {
    const std::string why = UnusableReason(d);
    if (why.empty()) {
      ++usable;
    } else {
      LOG_WARN << why;
    }
  }
  return usable;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, const CudaBackendOptions& options) {
  const int count = CudaDevicesPresent();
  if (count == 0) return Status::Error("--device cuda: no CUDA device is available");
  if (device < 0 || device >= count)
    return Status::Error("cuda device " + std::to_string(device) + " does not exist (" +
                         std::to_string(count) + " present)");
  if (std::string why = UnusableReason(device); !why.empty())
    return Status::Error("--device cuda: " + why);
  CUDA_CHECK(cudaSetDevice(device));
  return std::unique_ptr<Backend>(std::make_unique<cuda::CudaBackend>(
      device, options, cuda::RuntimeSwitches::FromEnvironment()));
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, bool f32_compute) {
  CudaBackendOptions options;
  options.f32_compute = f32_compute;
  return CreateCudaBackend(device, options);
}

Result<CudaMemoryInfo> CudaGetMemoryInfo(int device) {
  const int count = CudaDevicesPresent();
  if (device < 0 || device >= count)
    return Status::Error("cuda device " + std::to_string(device) + " does not exist");
  CUDA_CHECK(cudaSetDevice(device));
  CudaMemoryInfo info;
  CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

std::vector<CudaOpTime> CudaGetOpProfile(Backend& backend) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (cuda_backend == nullptr) return {};
  return cuda::NamedOpTimes(cuda_backend->op_times());
}

CudaGraphStats CudaGetGraphStats(Backend& backend) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  return cuda_backend == nullptr ? CudaGraphStats{} : cuda_backend->graph_stats();
}

Status CudaCopyFromHost(Backend& backend, std::span<const float> host, const Tensor& dst) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  if (cuda_backend == nullptr) return Status::Error("CudaCopyFromHost: not a CUDA backend");
  CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16) << DTypeName(dst.dtype);
  CHECK_EQ(static_cast<int64_t>(host.size()), dst.numel());
  cuda_backend->Flush();
  std::vector<uint16_t> bits;  // a bf16 destination: rounded RN on the host
  if (dst.dtype == DType::kBF16) {
    bits.resize(host.size());
    std::transform(host.begin(), host.end(), bits.begin(), F32ToBf16);
  }
  CUDA_CHECK(cudaMemcpyAsync(
      dst.data,
      bits.empty() ? static_cast<const void*>(host.data()) : static_cast<const void*>(bits.data()),
      dst.nbytes(), cudaMemcpyHostToDevice, cuda_backend->stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_backend->stream()));
  return Status::Ok();
}

}  // namespace ember
