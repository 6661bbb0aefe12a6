// CudaBackend: the Backend interface on one GPU. Weights live in DeviceBuffers for the backend's
// lifetime; the per-step workspace is a bump arena of device chunks that is reset (and merged
// into one chunk when a step overflowed) at BeginStep; every op is queued on one stream.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/rope_table.h"

namespace ember {
namespace {

using cuda::DeviceBuffer;
using cuda::ElemType;

ElemType ToElemType(DType t) {
  switch (t) {
    case DType::kF16: return ElemType::kF16;
    case DType::kBF16: return ElemType::kBF16;
    case DType::kF32: return ElemType::kF32;
    case DType::kI32: break;
  }
  CHECK(false) << "no element type for " << DTypeName(t);
  return ElemType::kF32;
}

cudaDataType_t ToCudaType(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kI32: break;
  }
  CHECK(false) << "no cuBLAS type for " << DTypeName(t);
  return CUDA_R_32F;
}

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { CUDA_CHECK(cudaStreamDestroy(stream_)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    CUBLAS_CHECK(cublasCreate(&handle_));
    CUBLAS_CHECK(cublasSetStream(handle_, stream));
  }
  ~CublasHandle() { CUBLAS_CHECK(cublasDestroy(handle_)); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

struct DeviceRope {
  RopeSpec spec;
  DeviceBuffer cos, sin;  // each [max_positions, rotary_dim / 2] f32
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, bool f32_compute)
      : device_(device), f32_compute_(f32_compute), cublas_(stream_.get()) {
    CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  }
  ~CudaBackend() override { CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

  std::string name() const override {
    return std::string("cuda:") + std::to_string(device_) + (f32_compute_ ? " (f32)" : " (bf16)");
  }
  cudaStream_t stream() const { return stream_.get(); }

  Result<Tensor> UploadWeight(const std::string& name, DType dtype, std::span<const int64_t> shape,
                              const void* host_data) override;
  Status AllocateKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                        int32_t num_kv_heads, int32_t head_dim) override;
  Result<int32_t> CreateRope(const RopeSpec& spec) override;
  Status BeginStep(const BatchPlan& plan) override;
  Tensor Alloc(std::initializer_list<int64_t> shape) override;
  void Embedding(const Tensor& table, float scale, Tensor out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
               Tensor out) override;
  void AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                  RmsNormKind kind, Tensor out) override;
  void MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) override;
  void Rope(int32_t rope_id, Tensor q, Tensor k) override;
  void WriteKv(int32_t layer, const Tensor& k, const Tensor& v) override;
  void Attention(const AttentionParams& params, const Tensor& q, Tensor out) override;
  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void Add(const Tensor& a, const Tensor& b, Tensor out) override;
  void Softcap(Tensor x, float cap) override;
  void GatherLogitsRows(const Tensor& x, Tensor out) override;
  Status CopyToHost(const Tensor& t, std::span<float> out) override;

 private:
  void* ArenaAlloc(size_t bytes);
  cuda::KvLayerView KvLayer(int32_t layer, int32_t num_kv_heads, int32_t head_dim) const;

  int device_;
  bool f32_compute_;
  int num_sms_ = 132;
  Stream stream_;
  CublasHandle cublas_;

  std::vector<DeviceBuffer> weights_;
  std::vector<DeviceRope> ropes_;

  // KV pool: [num_layers][K, V][num_blocks, block_size, num_kv_heads, head_dim] f32.
  DeviceBuffer kv_pool_;
  int32_t kv_layers_ = 0, kv_blocks_ = 0, kv_block_size_ = 0, kv_heads_ = 0, kv_head_dim_ = 0;

  // The step's plan: host staging, device copy and the host facts launches need.
  std::vector<int32_t> plan_host_;
  DeviceBuffer plan_device_;
  cuda::PlanView plan_;
  int32_t max_query_len_ = 0;
  int32_t max_context_len_ = 0;
  bool in_step_ = false;

  // Step workspace: bump allocation over chunks; merged into one chunk at BeginStep.
  std::vector<DeviceBuffer> arena_chunks_;
  size_t arena_offset_ = 0;  // into arena_chunks_.back()
};

Result<Tensor> CudaBackend::UploadWeight(const std::string& name, DType dtype,
                                         std::span<const int64_t> shape, const void* host_data) {
  if (shape.empty() || shape.size() > 4)
    return Status::Error("weight " + name + ": expected 1 to 4 dims, got " +
                         std::to_string(shape.size()));
  if (dtype == DType::kI32)
    return Status::Error("weight " + name + ": I32 weights are not supported");
  Tensor t;
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) return Status::Error("weight " + name + ": non-positive dim");
    t.shape[i] = shape[i];
  }
  // Matrices go to bf16 (the GEMM/embedding operand type); norms and biases stay f32.
  t.dtype = (f32_compute_ || shape.size() == 1) ? DType::kF32 : DType::kBF16;
  const int64_t n = t.numel();
  DeviceBuffer buffer(t.nbytes());
  const size_t src_bytes = static_cast<size_t>(n) * DTypeSize(dtype);
  if (dtype == t.dtype) {
    CUDA_CHECK(cudaMemcpy(buffer.data(), host_data, src_bytes, cudaMemcpyHostToDevice));
  } else {
    DeviceBuffer staging(src_bytes);
    CUDA_CHECK(cudaMemcpy(staging.data(), host_data, src_bytes, cudaMemcpyHostToDevice));
    cuda::LaunchConvert(staging.data(), ToElemType(dtype), buffer.data(), ToElemType(t.dtype), n,
                        stream_.get());
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  }
  t.data = buffer.data();
  weights_.push_back(std::move(buffer));
  return t;
}

Status CudaBackend::AllocateKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                                   int32_t num_kv_heads, int32_t head_dim) {
  CHECK(kv_pool_.data() == nullptr) << "AllocateKvPool called twice";
  if (num_layers <= 0 || num_blocks <= 0 || block_size <= 0 || num_kv_heads <= 0 ||
      head_dim <= 0 || head_dim > cuda::kMaxHeadDim)
    return Status::Error("KV pool: bad geometry (head_dim must be <= " +
                         std::to_string(cuda::kMaxHeadDim) + ")");
  const size_t bytes = 2 * sizeof(float) * static_cast<size_t>(num_layers) * num_blocks *
                       block_size * num_kv_heads * head_dim;
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > free_bytes)
    return Status::Error("KV pool: " + std::to_string(bytes) + " bytes requested, only " +
                         std::to_string(free_bytes) + " free on cuda:" + std::to_string(device_));
  kv_pool_ = DeviceBuffer(bytes);
  CUDA_CHECK(cudaMemsetAsync(kv_pool_.data(), 0, bytes, stream_.get()));
  kv_layers_ = num_layers;
  kv_blocks_ = num_blocks;
  kv_block_size_ = block_size;
  kv_heads_ = num_kv_heads;
  kv_head_dim_ = head_dim;
  return Status::Ok();
}

Result<int32_t> CudaBackend::CreateRope(const RopeSpec& spec) {
  EMBER_ASSIGN_OR_RETURN(cuda::RopeTable table, cuda::BuildRopeTable(spec));
  DeviceRope rope;
  rope.spec = spec;
  rope.cos = DeviceBuffer(table.cos.size() * sizeof(float));
  rope.sin = DeviceBuffer(table.sin.size() * sizeof(float));
  CUDA_CHECK(cudaMemcpy(rope.cos.data(), table.cos.data(), rope.cos.bytes(),
                        cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(rope.sin.data(), table.sin.data(), rope.sin.bytes(),
                        cudaMemcpyHostToDevice));
  ropes_.push_back(std::move(rope));
  return static_cast<int32_t>(ropes_.size() - 1);
}

Status CudaBackend::BeginStep(const BatchPlan& plan) {
  if (kv_pool_.data() != nullptr) {
    const std::string err = plan.Validate(kv_blocks_);
    if (!err.empty()) return Status::Error("BatchPlan: " + err);
  }
  // Workspace: if the last step spilled into several chunks, merge them into one.
  if (arena_chunks_.size() > 1) {
    size_t total = 0;
    for (const DeviceBuffer& c : arena_chunks_) total += c.bytes();
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    arena_chunks_.clear();
    arena_chunks_.emplace_back(total);
  }
  arena_offset_ = 0;

  // Device layout (int32): seqs [num_seqs][4] first (int4-aligned), then token_ids, positions,
  // slot_mapping, token_seq, block_tables, logits_rows.
  const int32_t num_tokens = plan.num_tokens(), num_seqs = plan.num_seqs();
  plan_host_.clear();
  max_query_len_ = 0;
  max_context_len_ = 0;
  std::vector<int32_t> token_seq(static_cast<size_t>(num_tokens), 0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const SequenceSlice& q = plan.seqs[static_cast<size_t>(s)];
    plan_host_.insert(plan_host_.end(),
                      {q.query_start, q.query_len, q.context_len, q.block_table_start});
    max_query_len_ = std::max(max_query_len_, q.query_len);
    max_context_len_ = std::max(max_context_len_, q.context_len);
    for (int32_t i = q.query_start; i < q.query_start + q.query_len && i < num_tokens; ++i)
      token_seq[static_cast<size_t>(i)] = s;
  }
  const size_t off_tokens = plan_host_.size();
  auto append = [&](const std::vector<int32_t>& v) {
    const size_t off = plan_host_.size();
    plan_host_.insert(plan_host_.end(), v.begin(), v.end());
    return off;
  };
  append(plan.token_ids);
  const size_t off_positions = append(plan.positions);
  const size_t off_slots = append(plan.slot_mapping);
  const size_t off_token_seq = append(token_seq);
  const size_t off_tables = append(plan.block_tables);
  const size_t off_logits = append(plan.logits_rows);
  const size_t bytes = std::max<size_t>(plan_host_.size(), 1) * sizeof(int32_t);
  if (plan_device_.bytes() < bytes) {
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    plan_device_ = DeviceBuffer(std::max(bytes * 2, size_t{1} << 16));
  }
  CUDA_CHECK(cudaMemcpyAsync(plan_device_.data(), plan_host_.data(),
                             plan_host_.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                             stream_.get()));
  const int32_t* base = plan_device_.as<int32_t>();
  plan_.seqs = reinterpret_cast<const int4*>(base);
  plan_.token_ids = base + off_tokens;
  plan_.positions = base + off_positions;
  plan_.slot_mapping = base + off_slots;
  plan_.token_seq = base + off_token_seq;
  plan_.block_tables = base + off_tables;
  plan_.logits_rows = base + off_logits;
  plan_.num_tokens = num_tokens;
  plan_.num_seqs = num_seqs;
  plan_.num_logits_rows = static_cast<int32_t>(plan.logits_rows.size());
  plan_.block_size = plan.block_size;
  if (kv_pool_.data() != nullptr) CHECK_EQ(plan.block_size, kv_block_size_);
  in_step_ = true;
  return Status::Ok();
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

Tensor CudaBackend::Alloc(std::initializer_list<int64_t> shape) {
  CHECK(in_step_) << "Alloc before BeginStep";
  CHECK(shape.size() >= 1 && shape.size() <= 4);
  Tensor t;
  t.dtype = DType::kF32;
  t.ndim = static_cast<int32_t>(shape.size());
  size_t i = 0;
  for (int64_t d : shape) {
    CHECK_GE(d, 0);
    t.shape[i++] = d;
  }
  t.data = ArenaAlloc(t.nbytes());
  return t;
}

void CudaBackend::Embedding(const Tensor& table, float scale, Tensor out) {
  CHECK_EQ(out.rows(), plan_.num_tokens);
  CHECK_EQ(out.cols(), table.cols());
  cuda::LaunchEmbedding(table.data, ToElemType(table.dtype), table.rows(), table.cols(), scale,
                        plan_, static_cast<float*>(out.data), stream_.get());
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
                          Tensor out) {
  CHECK(x.dtype == DType::kF32 && weight.dtype == DType::kF32 && out.dtype == DType::kF32);
  CHECK_EQ(x.numel(), out.numel());
  CHECK_EQ(weight.numel(), x.cols());
  cuda::LaunchRmsNorm(static_cast<const float*>(x.data), nullptr, nullptr,
                      static_cast<const float*>(weight.data), eps,
                      kind == RmsNormKind::kOnePlusWeight, x.rows(), x.cols(),
                      static_cast<float*>(out.data), stream_.get());
}

void CudaBackend::AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                             RmsNormKind kind, Tensor out) {
  CHECK_EQ(residual.numel(), delta.numel());
  CHECK_EQ(residual.numel(), out.numel());
  CHECK_EQ(weight.numel(), residual.cols());
  CHECK(weight.dtype == DType::kF32);
  cuda::LaunchRmsNorm(nullptr, static_cast<float*>(residual.data),
                      static_cast<const float*>(delta.data),
                      static_cast<const float*>(weight.data), eps,
                      kind == RmsNormKind::kOnePlusWeight, residual.rows(), residual.cols(),
                      static_cast<float*>(out.data), stream_.get());
}

void CudaBackend::MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) {
  const int64_t n = x.rows(), k = x.cols(), m = weight.rows();
  CHECK_EQ(weight.cols(), k) << "MatMul " << ShapeString(x) << " x " << ShapeString(weight);
  CHECK_EQ(out.rows(), n);
  CHECK_EQ(out.cols(), m);
  CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
  if (n == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  const void* b_operand = x.data;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (weight.dtype == DType::kF32) {
    // Parity mode: true fp32 FMA (never TF32).
    compute = CUBLAS_COMPUTE_32F_PEDANTIC;
  } else {
    void* converted = ArenaAlloc(static_cast<size_t>(n * k) * DTypeSize(weight.dtype));
    cuda::LaunchConvert(x.data, ElemType::kF32, converted, ToElemType(weight.dtype), n * k,
                        stream_.get());
    b_operand = converted;
  }
  // Row-major out[n, m] = x[n, k] W[m, k]^T  ==  column-major out^T[m, n] = W^T' x^T.
  const cudaDataType_t wt = ToCudaType(weight.dtype);
  CUBLAS_CHECK(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m),
                            static_cast<int>(n), static_cast<int>(k), &alpha, weight.data, wt,
                            static_cast<int>(k), b_operand, wt, static_cast<int>(k), &beta,
                            out.data, CUDA_R_32F, static_cast<int>(m), compute,
                            CUBLAS_GEMM_DEFAULT));
  if (bias != nullptr) {
    CHECK_EQ(bias->numel(), m);
    CHECK(bias->dtype == DType::kF32);
    cuda::LaunchAddBias(static_cast<float*>(out.data), static_cast<const float*>(bias->data), n, m,
                        stream_.get());
  }
}

void CudaBackend::Rope(int32_t rope_id, Tensor q, Tensor k) {
  CHECK(rope_id >= 0 && rope_id < static_cast<int32_t>(ropes_.size()));
  const DeviceRope& rope = ropes_[static_cast<size_t>(rope_id)];
  const int64_t per_token = static_cast<int64_t>(plan_.num_tokens) * rope.spec.head_dim;
  CHECK_GT(per_token, 0);
  CHECK_EQ(q.numel() % per_token, 0);
  CHECK_EQ(k.numel() % per_token, 0);
  cuda::LaunchRope(static_cast<float*>(q.data), static_cast<float*>(k.data),
                   static_cast<int32_t>(q.numel() / per_token),
                   static_cast<int32_t>(k.numel() / per_token), rope.spec.head_dim,
                   rope.spec.rotary_dim, rope.cos.as<float>(), rope.sin.as<float>(),
                   rope.spec.max_positions, plan_, stream_.get());
}

cuda::KvLayerView CudaBackend::KvLayer(int32_t layer, int32_t num_kv_heads,
                                       int32_t head_dim) const {
  CHECK(kv_pool_.data() != nullptr) << "KV pool not allocated";
  CHECK(layer >= 0 && layer < kv_layers_);
  CHECK_EQ(num_kv_heads, kv_heads_);
  CHECK_EQ(head_dim, kv_head_dim_);
  const size_t per_tensor = static_cast<size_t>(kv_blocks_) * kv_block_size_ * kv_heads_ *
                            kv_head_dim_;
  float* base = kv_pool_.as<float>() + 2 * per_tensor * static_cast<size_t>(layer);
  return cuda::KvLayerView{base, base + per_tensor, kv_heads_, kv_head_dim_};
}

void CudaBackend::WriteKv(int32_t layer, const Tensor& k, const Tensor& v) {
  CHECK_EQ(k.numel(), static_cast<int64_t>(plan_.num_tokens) * kv_heads_ * kv_head_dim_);
  CHECK_EQ(v.numel(), k.numel());
  cuda::LaunchWriteKv(static_cast<const float*>(k.data), static_cast<const float*>(v.data),
                      KvLayer(layer, kv_heads_, kv_head_dim_), plan_, stream_.get());
}

void CudaBackend::Attention(const AttentionParams& params, const Tensor& q, Tensor out) {
  CHECK_GT(params.num_kv_heads, 0);
  CHECK_EQ(params.num_heads % params.num_kv_heads, 0);
  const int64_t width = static_cast<int64_t>(params.num_heads) * params.head_dim;
  CHECK_EQ(q.numel(), plan_.num_tokens * width);
  CHECK_EQ(out.numel(), plan_.num_tokens * width);
  const cuda::KvLayerView kv = KvLayer(params.layer, params.num_kv_heads, params.head_dim);
  const cuda::AttentionArgs args{params.num_heads, params.num_kv_heads, params.head_dim,
                                 params.scale,     params.sliding_window, params.softcap};
  const float* qp = static_cast<const float*>(q.data);
  float* op = static_cast<float*>(out.data);
  if (max_query_len_ <= 1) {
    // Decode: split the keys when there are too few (row, head) blocks to fill the GPU.
    const int64_t row_blocks = static_cast<int64_t>(plan_.num_tokens) * params.num_heads;
    int64_t visible = max_context_len_;
    if (params.sliding_window > 0) visible = std::min<int64_t>(visible, params.sliding_window);
    int64_t splits = std::min<int64_t>((visible + 255) / 256,
                                       (2 * num_sms_ + row_blocks - 1) / row_blocks);
    splits = std::clamp<int64_t>(splits, 1, 64);
    float* partials = nullptr;
    const int64_t floats = cuda::DecodePartialsFloats(plan_.num_tokens, params.num_heads,
                                                      params.head_dim,
                                                      static_cast<int32_t>(splits));
    if (floats > 0) partials = static_cast<float*>(ArenaAlloc(static_cast<size_t>(floats) * 4));
    cuda::LaunchAttentionDecode(args, qp, kv, plan_, static_cast<int32_t>(splits), partials, op,
                                stream_.get());
  } else {
    cuda::LaunchAttentionPrefill(args, qp, kv, plan_, max_query_len_, op, stream_.get());
  }
}

void CudaBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  CHECK_EQ(gate.numel(), up.numel());
  CHECK_EQ(gate.numel(), out.numel());
  cuda::LaunchGatedActivation(static_cast<const float*>(gate.data),
                              static_cast<const float*>(up.data), static_cast<float*>(out.data),
                              gate.numel(), /*gelu=*/false, stream_.get());
}

void CudaBackend::GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) {
  CHECK_EQ(gate.numel(), up.numel());
  CHECK_EQ(gate.numel(), out.numel());
  cuda::LaunchGatedActivation(static_cast<const float*>(gate.data),
                              static_cast<const float*>(up.data), static_cast<float*>(out.data),
                              gate.numel(), /*gelu=*/true, stream_.get());
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  CHECK_EQ(a.numel(), b.numel());
  CHECK_EQ(a.numel(), out.numel());
  cuda::LaunchAdd(static_cast<const float*>(a.data), static_cast<const float*>(b.data),
                  static_cast<float*>(out.data), a.numel(), stream_.get());
}

void CudaBackend::Softcap(Tensor x, float cap) {
  CHECK_GT(cap, 0.f);
  cuda::LaunchSoftcap(static_cast<float*>(x.data), cap, x.numel(), stream_.get());
}

void CudaBackend::GatherLogitsRows(const Tensor& x, Tensor out) {
  CHECK_EQ(x.rows(), plan_.num_tokens);
  CHECK_EQ(out.rows(), plan_.num_logits_rows);
  CHECK_EQ(out.cols(), x.cols());
  cuda::LaunchGatherRows(static_cast<const float*>(x.data), x.cols(), plan_,
                         static_cast<float*>(out.data), stream_.get());
}

Status CudaBackend::CopyToHost(const Tensor& t, std::span<float> out) {
  CHECK(t.dtype == DType::kF32);
  CHECK_EQ(static_cast<int64_t>(out.size()), t.numel());
  CUDA_CHECK(cudaMemcpyAsync(out.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost,
                             stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::Ok();
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, bool f32_compute) {
  const int count = CudaDeviceCount();
  if (count == 0) return Status::Error("--device cuda: no CUDA device is available");
  if (device < 0 || device >= count)
    return Status::Error("cuda device " + std::to_string(device) + " does not exist (" +
                         std::to_string(count) + " present)");
  CUDA_CHECK(cudaSetDevice(device));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device, f32_compute));
}

Result<CudaMemoryInfo> CudaGetMemoryInfo(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count)
    return Status::Error("cuda device " + std::to_string(device) + " does not exist");
  CUDA_CHECK(cudaSetDevice(device));
  CudaMemoryInfo info;
  CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

Status CudaCopyFromHost(Backend& backend, std::span<const float> host, const Tensor& dst) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  if (cuda_backend == nullptr) return Status::Error("CudaCopyFromHost: not a CUDA backend");
  CHECK(dst.dtype == DType::kF32);
  CHECK_EQ(static_cast<int64_t>(host.size()), dst.numel());
  CUDA_CHECK(cudaMemcpyAsync(dst.data, host.data(), dst.nbytes(), cudaMemcpyHostToDevice,
                             cuda_backend->stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_backend->stream()));
  return Status::Ok();
}

}  // namespace ember
