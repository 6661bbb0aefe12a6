// CudaBackend: the Backend interface on one GPU. Weights live in DeviceBuffers for the backend's
// lifetime; the per-step workspace is a bump arena of device chunks that is reset (and merged
// into one chunk when a step overflowed) at BeginStep; every op is queued on one stream.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/gemm_skinny.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_recorder.h"
#include "backend/rope_table.h"
#include "backend/threshold_sampling.h"  // CheckLogitEdits
#include "util/half.h"
#include "util/log.h"

namespace ember {
namespace {

using cuda::DeviceBuffer;
using cuda::ElemType;
using cuda::KeyOf;

uint64_t U(int64_t v) { return static_cast<uint64_t>(v); }

// The rows of a buffer seen as a matrix: the product of every dimension but the last.
int64_t MatrixRows(std::initializer_list<int64_t> shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape.begin()[i];
  return rows;
}

ElemType ToElemType(DType t) {
  switch (t) {
    case DType::kF16: return ElemType::kF16;
    case DType::kBF16: return ElemType::kBF16;
    case DType::kF32: return ElemType::kF32;
    case DType::kI32:
    case DType::kU8:
      break;
  }
  CHECK(false) << "no element type for " << DTypeName(t);
  return ElemType::kF32;
}

cudaDataType_t ToCudaType(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kI32:
    case DType::kU8:
      break;
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

class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() { CUDA_CHECK(cudaEventDestroy(event_)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Page-locked host bytes (copies to and from them neither stage nor wait), grown on demand;
// growing drops the contents.
class PinnedBytes {
 public:
  unsigned char* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  void Reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    data_.reset();
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    data_.reset(static_cast<unsigned char*>(p));
    bytes_ = bytes;
  }

 private:
  struct Deleter {
    void operator()(unsigned char* p) const { CUDA_CHECK(cudaFreeHost(p)); }
  };
  std::unique_ptr<unsigned char, Deleter> data_;
  size_t bytes_ = 0;
};

struct DeviceRope {
  RopeSpec spec;
  DeviceBuffer cos, sin;  // each [max_positions, rotary_dim / 2] f32
};

// What a rope launch needs of its RopeSpec (launch closures stay within InlineOp's capacity).
struct RopeDims {
  int32_t head_dim, rotary_dim, max_positions;
  static RopeDims Of(const RopeSpec& s) { return {s.head_dim, s.rotary_dim, s.max_positions}; }
};

// One GEMM of a cuBLAS MatMul op: out[n, m] = x W^T (+ bias), by cublasGemmEx or the skinny
// wgmma GEMM.
struct CublasPart {
  const void* w = nullptr;
  const void* bias = nullptr;  // f32 [m] or null
  void* out = nullptr;
  int64_t m = 0;
  bool skinny = false;
  bool out_bf16 = false;
};

// A cuBLAS MatMul op: up to kMaxParts GEMMs of one x (consecutive MatMuls of the same x: q/k/v,
// gate/up). The first part runs on the step's stream, the others on the side stream at the same
// time (the streams fork after x's conversion and join before the op ends). The small GEMMs of a
// decode step do not fill the GPU alone: an 8B layer's GEMMs at 128 rows took 162.1 us in a row
// and 156.8 us grouped (gemm_bench; engine +0.5-1% decode, docs/perf.md session 30).
struct CublasGroup {
  static constexpr int kMaxParts = 3;
  const void* x = nullptr;    // f32 x when convert
  void* converted = nullptr;  // x in the weight's type (the GEMMs' operand; null: f32 weights)
  bool convert = false;       // the op converts x into `converted` first
  DType wdtype = DType::kBF16;
  int64_t n = 0, k = 0;
  int num_parts = 0;
  CublasPart parts[kMaxParts];
};

void RunCublasPart(const CublasGroup& g, const CublasPart& p, cublasHandle_t handle,
                   cudaStream_t st) {
  const int64_t n = g.n, k = g.k, m = p.m;
  if (p.skinny) {
    cuda::LaunchSkinnyGemm(static_cast<const __nv_bfloat16*>(g.converted),
                           static_cast<const __nv_bfloat16*>(p.w), static_cast<float*>(p.out), m, n,
                           m, k, st);
  } else {
    // Row-major out[n, m] = x[n, k] W[m, k]^T  ==  column-major out^T[m, n] = W^T x^T.
    const bool f32_weight = g.wdtype == DType::kF32;
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t wt = ToCudaType(g.wdtype);
    CUBLAS_CHECK(cublasGemmEx(
        handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
        static_cast<int>(k), &alpha, p.w, wt, static_cast<int>(k), f32_weight ? g.x : g.converted,
        wt, static_cast<int>(k), &beta, p.out, p.out_bf16 ? CUDA_R_16BF : CUDA_R_32F,
        static_cast<int>(m), f32_weight ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
  if (p.bias != nullptr)
    cuda::LaunchAddBias(static_cast<float*>(p.out), static_cast<const float*>(p.bias), n, m, st);
}

// MatMuls of one x as one op on two streams unless EMBER_CUDA_MATMUL_STREAMS=0 (A/B runs).
bool MatMulStreamsEnabled() {
  static const bool on = cuda::EnvSwitchOn("EMBER_CUDA_MATMUL_STREAMS");
  return on;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options)
      : device_(device),
        f32_compute_(options.f32_compute),
        use_graphs_(options.cuda_graphs),
        batch_invariant_(options.batch_invariant && !options.f32_compute),
        kv_f32_(options.kv_f32),
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
    CUBLAS_CHECK(cublasSetWorkspace(cublas_.get(), cublas_workspace_.data(),
                                    cublas_workspace_.bytes()));
    CUBLAS_CHECK(cublasSetWorkspace(cublas_side_.get(), cublas_side_workspace_.data(),
                                    cublas_side_workspace_.bytes()));
    // EMBER_CUDA_PROFILE_OUT=FILE (diagnostics): time every op kind with events, as profile_ops
    // does, and append the totals to FILE when the backend goes away (a program that cannot
    // call CudaGetOpProfile, such as engine_bench, which reaches the backend through the module).
    if (const char* path = std::getenv("EMBER_CUDA_PROFILE_OUT"); path != nullptr && *path != 0)
      profile_out_ = path;
    recorder_.set_profiling(options.profile_ops || !profile_out_.empty());
    cuda::SkinnyGemmWarmUp();  // its kernels' attributes, before any graph capture
  }
  ~CudaBackend() override {
    recorder_.Flush(false);
    SyncAllStreams();
    if (!profile_out_.empty()) AppendOpProfile(profile_out_);
#ifdef EMBER_CUDA_TRACE
    if (const char* path = std::getenv("EMBER_CUDA_TRACE_OUT"); path != nullptr) {
      cuda::DumpStepTrace(path);
    }
#endif
  }

  std::string name() const override {
    return std::string("cuda:") + std::to_string(device_) + (f32_compute_ ? " (f32)" : " (bf16)");
  }
  cudaStream_t stream() const { return stream_.get(); }
  // Enqueues every recorded op (the host-visible sync points call this first).
  void Flush() {
    recorder_.Flush(use_graphs_ && max_query_len_ <= 1);
    gemv_next_.clear();  // the flushed launches are gone: a later GEMV is nobody's prefetch
  }
  const std::vector<cuda::StepRecorder::OpTime>& op_times() const {
    return recorder_.op_times();
  }
  CudaGraphStats graph_stats() const {
    return {recorder_.graph_captures(), recorder_.graph_replays()};
  }
  // EMBER_CUDA_PROFILE_OUT: the op totals, after a line with the steps and rows they cover.
  void AppendOpProfile(const std::string& path) const;

  Result<Tensor> UploadWeight(const std::string& name, DType dtype, std::span<const int64_t> shape,
                              const void* host_data) override;
  Status AllocateKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                        int32_t num_kv_heads, int32_t head_dim) override;
  int64_t KvElementBytes(int32_t head_dim) const override { return KvBf16(head_dim) ? 2 : 4; }
  Result<int32_t> CreateRope(const RopeSpec& spec) override;
  Status BeginStep(const BatchPlan& plan) override;
  Tensor Alloc(std::initializer_list<int64_t> shape) override;
  Tensor AllocMatMulInput(std::initializer_list<int64_t> shape) override;
  Tensor AllocMatMulOutput(std::initializer_list<int64_t> shape) override;
  void Embedding(const Tensor& table, float scale, Tensor out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
               Tensor out) override;
  void AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                  RmsNormKind kind, Tensor out) override;
  void MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) override;
  void Rope(int32_t rope_id, Tensor q, Tensor k) override;
  void WriteKv(int32_t layer, const Tensor& k, const Tensor& v) override;
  void Attention(const AttentionParams& params, const Tensor& q, Tensor out) override;
  // Records g as one op (replace_last: in place of the last op, a group g grew from).
  void RecordCublasGroup(const CublasGroup& g, bool replace_last);
  void AttentionInvariantLaunch(const cuda::AttentionArgs& args, const float* qp,
                                const cuda::KvLayerView& kv, float* op, const cuda::PlanView& plan,
                                int32_t max_query_len, int32_t splits, float* partials);
  void AttentionInvariant(const cuda::AttentionArgs& args, const float* qp,
                          const cuda::KvLayerView& kv, float* op, int32_t layer);
  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  std::string MoeUnsupported(int32_t num_experts, int32_t top_k, int64_t d,
                             int64_t inter) const override {
    if (cuda::MoeSupported(num_experts, top_k, d, inter)) return "";
    return "the cuda backend's kernels take up to " + std::to_string(cuda::kMoeMaxExperts) +
           " experts, top k <= " + std::to_string(cuda::kMoeMaxTopK) +
           ", and hidden and expert widths that are multiples of 8 and at most " +
           std::to_string(cuda::kMoeMaxSmem / 4 / cuda::kMoeTileRows);
  }
  void MoeMlp(const Tensor& x, const MoeExperts& experts, Tensor out) override;
  bool TakesMxfp4Experts() const override { return !f32_compute_; }
  void Add(const Tensor& a, const Tensor& b, Tensor out) override;
  void Softcap(Tensor x, float cap) override;
  void GatherLogitsRows(const Tensor& x, Tensor out) override;
  Status CopyToHost(const Tensor& t, std::span<float> out) override;
  Status ApplyLogitEdits(Tensor x, std::span<const LogitEdit> edits) override;
  Status ArgmaxRows(const Tensor& x, std::span<int32_t> ids) override;
  Status SampleRows(const Tensor& x, std::span<const int32_t> rows,
                    std::span<const RowSampling> params, std::span<int32_t> ids) override;
  bool prefers_backend_sampling() const override { return true; }
  void DeferStepIds() override {
    defer_ids_ = true;
    StepDelivery();  // one delivery per deferred step, even one that makes no ids
  }
  void DropStepIds() override {
    if (defer_ids_ && delivery_step_ == steps_begun_ && !deliveries_.empty())
      deliveries_.pop_back();
    delivery_step_ = ~uint64_t{0};
    defer_ids_ = false;
  }
  Status WaitIds() override;
  // 1, 2, 4, 8, then every multiple of 8 to 256 (vLLM's buckets): at most 35 x 2 graphs (one per
  // staging half: the plan and ids buffers alternate), inside the recorder's cache of 128. Larger
  // decode steps are captured at their own size.
  std::vector<int32_t> DecodeGraphBuckets() const override {
    std::vector<int32_t> buckets;
    if (!use_graphs_ || recorder_.profiling()) return buckets;
    for (int32_t b = 1; b <= kMaxGraphBucket; b = b < 8 ? 2 * b : b + 8) buckets.push_back(b);
    return buckets;
  }
  Result<BackendMemory> MemoryInfo() const override;
  std::span<float> HostBuffer(size_t count) override;

 private:
  void* ArenaAlloc(size_t bytes);
  Tensor AllocOf(DType dtype, std::initializer_list<int64_t> shape);
  // Whether a MatMul over `rows` rows takes the cuBLAS path with bf16 operands: then its x may be
  // a bf16 AllocMatMulInput buffer (the GEMV and the invariant GEMM read f32 rows).
  bool Bf16MatMulInput(int64_t rows) const {
    return !f32_compute_ && !batch_invariant_ && rows > cuda::kDecodeGemmMaxRows;
  }
  // Whether MoeMlp runs the experts on tensor cores (moe.cu): in the bf16 mode, with
  // batch_invariant for every step (one path for every step size), else where
  // cuda::MoeMmaPays (small steps run faster on the SIMT kernels).
  // EMBER_MOE_MMA=0 / 1 in the environment: never / always (A/B measurements).
  bool MoeOnTensorCores(int64_t rows, int32_t top_k, int32_t num_experts, bool mxfp4) const;
  void GatedActivation(const Tensor& gate, const Tensor& up, Tensor out, bool gelu);
  cuda::KvLayerView KvLayer(int32_t layer, int32_t num_kv_heads, int32_t head_dim) const;
  // The KV pool is bf16 in the bf16 mode when the batch-invariant attention kernel serves the
  // head dim (it rounds K/V to bf16 RN anyway; the f32 kernels read f32 pools), unless kv_f32.
  bool KvBf16(int32_t head_dim) const {
    return !f32_compute_ && !kv_f32_ && cuda::AttentionInvariantSupported(head_dim);
  }

  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  DeviceBuffer sample_args_;  // SampleRows' params + rows, grown on demand
  DeviceBuffer logit_edits_;  // ApplyLogitEdits' edits, grown on demand

  // The ids ArgmaxRows / SampleRows make, by logits row: [plan_cap_tokens_] int32, one buffer per
  // staging half (a step writes its half's, and its embedding reads the previous step's as
  // plan_.fed_ids), at fixed addresses (the decode graphs hold them): so the copy of a step's ids
  // to the host can run beside the next step, which writes the other buffer.
  std::array<DeviceBuffer, 2> step_ids_;
  // Grows both step_ids_ buffers to `rows` ids (waits for the streams; their ids are kept).
  void EnsureStepIds(int64_t rows);
  // Page-locked memory of alternate steps (half_ is the current step's): the sources of the
  // step's uploads (plan, sampling parameters, logit edits; bump-allocated) and its ids copied
  // back. `copied` is recorded on the stream behind the half's last upload, `ids_copied` on
  // ids_stream_ behind its ids' copy: the next step may fill the other half while this one's
  // copies are still queued, which lets a step launch before the host has read the previous
  // step's ids. `step_end` marks the end of the half's step on the stream (recorded when the
  // next step begins), `uploaded` its plan's upload, `ids_ready` its ids.
  struct StagingHalf {
    PinnedBytes upload;
    size_t used = 0;
    PinnedBytes ids;
    Event copied, ids_copied, step_end, uploaded, ids_ready;
  };
  std::array<StagingHalf, 2> staging_;
  int half_ = 0;
  // The plan's upload and the ids' copy back run on streams of their own, off the step's critical
  // path: a decode step's plan (into its half's plan_device_, free once the step two back has
  // ended) is copied while the step before it still computes, and its ids go to the host while the
  // next step computes. Between two decode graphs the stream then only waits on events.
  Stream upload_stream_, ids_stream_;
  // Waits for the stream and both copy streams.
  void SyncAllStreams();
  // Where `bytes` go in h.upload (bump allocation; grows it, after SyncAllStreams, when full).
  size_t StageOffset(StagingHalf& h, size_t bytes);
  // Copies `bytes` from the host to `dst` on the stream through the current half (the call does
  // not wait for the device).
  void Upload(void* dst, const void* src, size_t bytes);
  // Copies the plan (plan_host_'s first `bytes`) into the current half's plan_device_ on
  // upload_stream_; the stream waits for it.
  void UploadPlan(size_t bytes);
  // Copies the step's first `rows` ids back into the current half's ids (on ids_stream_, behind
  // the step's ops); returns them. Read them after WaitIdsCopied().
  const int32_t* CopyIdsBack(int64_t rows);
  void WaitIdsCopied() {
    CUDA_CHECK(cudaEventSynchronize(staging_[static_cast<size_t>(half_)].ids_copied.get()));
  }
  // Deferred ids (DeferStepIds): what WaitIds fills for each step, oldest first.
  struct IdsDelivery {
    int half = 0;
    std::span<int32_t> argmax;          // ArgmaxRows: every row
    std::span<int32_t> sampled;         // SampleRows: sampled[r] for r in sample_rows
    std::vector<int32_t> sample_rows;
  };
  std::deque<IdsDelivery> deliveries_;
  bool defer_ids_ = false;  // the current step's ids go to deliveries_
  uint64_t steps_begun_ = 0;
  uint64_t delivery_step_ = ~uint64_t{0};  // the step deliveries_.back() belongs to
  IdsDelivery& StepDelivery();
  // HostBuffer's page-locked memory (device-to-host copies at full speed), grown on demand.
  PinnedBytes host_buffer_;

  int device_;
  bool f32_compute_;
  bool use_graphs_;
  bool batch_invariant_;  // bf16 mode: MatMul in one reduction order per row (gemm_invariant.cu)
  bool kv_f32_;           // tests: an f32 KV pool in the bf16 mode too
  std::string profile_out_;    // EMBER_CUDA_PROFILE_OUT
  int64_t profiled_rows_ = 0;  // the rows of the steps begun (steps_begun_)
  static constexpr int32_t kMaxGraphBucket = 256;
  bool warned_attention_variant_ = false;  // logged once: no invariant kernel for head_dim
  int num_sms_ = 132;
  Stream stream_;
  CublasHandle cublas_;
  cuda::StepRecorder recorder_;
  DeviceBuffer cublas_workspace_;
  // The second stream of a shared-x MatMul group (CublasGroup): its own cuBLAS handle and
  // workspace; fork_ and join_ order it after the group's x and before the group's readers.
  Stream side_stream_;
  CublasHandle cublas_side_;
  DeviceBuffer cublas_side_workspace_;
  Event fork_, join_;
  // ArgmaxRows's split shape (cuda::ArgmaxScratch): steps of up to kArgmaxSplitRows rows of up to
  // kArgmaxSplitChunks * 2,048 columns; float maxima, int32 indices, then the zeroed counters.
  static constexpr int32_t kArgmaxSplitRows = 32;
  static constexpr int32_t kArgmaxSplitChunks = 128;
  DeviceBuffer argmax_scratch_;

  std::vector<DeviceBuffer> weights_;
  std::vector<DeviceRope> ropes_;
  // MoeMlp: per expert set (keyed by its first gate weight) the device arrays of the experts'
  // gate, up and down pointers (then gate, up and down bias pointers for a biased set), uploaded
  // at its first use.
  std::vector<std::pair<const void*, DeviceBuffer>> moe_tables_;
  // MoeMlp's scratch (route, schedule, activations): one arena region per step, shared by the
  // step's MoE layers (their launches run in stream order), grown when a layer needs more.
  uint64_t moe_scratch_step_ = 0;
  size_t moe_scratch_bytes_ = 0;
  unsigned char* moe_scratch_ = nullptr;

  // KV pool: [num_layers][K, V][num_blocks, block_size, num_kv_heads, head_dim], bf16 when
  // KvBf16(kv_head_dim_), else f32.
  DeviceBuffer kv_pool_;
  int32_t kv_layers_ = 0, kv_blocks_ = 0, kv_block_size_ = 0, kv_heads_ = 0, kv_head_dim_ = 0;

  // The step's plan: host staging, device copy and the host facts launches need.
  // Fixed-capacity regions so the device addresses (baked into graphs) only change on growth.
  std::vector<int32_t> plan_host_;
  int64_t plan_cap_tokens_ = 0, plan_cap_seqs_ = 0, plan_cap_tables_ = 0;
  std::array<DeviceBuffer, 2> plan_device_;  // by staging half
  cuda::PlanView plan_;
  int32_t max_query_len_ = 0;
  int32_t max_context_len_ = 0;
  std::vector<int32_t> query_lens_;  // the step's rows per sequence (host copy of the plan's)
  bool in_step_ = false;

  // The last recorded op when it is a multi-part launch (or a cuBLAS MatMul) over x: a following
  // MatMul of the same x joins the launch (q/k/v, gate/up) or reuses the bf16 copy of x.
  enum class MatMulGroup { kNone, kGemv, kInvariant };  // kNone: a cuBLAS MatMul
  struct LastMatMul {
    uint64_t record = ~uint64_t{0};  // recorder_.records() right after it was recorded
    MatMulGroup group = MatMulGroup::kNone;
    const void* x = nullptr;
    int64_t n = 0, k = 0;
    int num_parts = 0;
    cuda::GemvPart parts[cuda::kGemvMaxParts];
    void* converted = nullptr;  // x in the weight's 16-bit type (cuBLAS; kInvariant's scratch)
    DType converted_type = DType::kF32;
    CublasGroup cublas;  // kNone: the launch as recorded (a following MatMul may join)
  };
  bool LastOpIs(const LastMatMul& l) const {
    return !recorder_.empty() && recorder_.records() == l.record;
  }
  LastMatMul last_matmul_;
  // Per GEMV launch recorded since the last Flush, in order: its prefetch target (the next
  // GEMV launch's weights; the last one's stays empty).
  std::vector<cuda::GemvPrefetch> gemv_next_;
  // The last recorded op when it is a Rope: a WriteKv of its k joins it (one RopeWriteKv launch).
  struct LastRope {
    uint64_t record = ~uint64_t{0};
    float *q = nullptr, *k = nullptr;
    int32_t num_heads = 0, rope_id = 0;
  };
  LastRope last_rope_;
  // The last recorded op when it is a RopeWriteKv: the decode Attention of its q over its layer
  // can take it over (one launch; q and k are then left unrotated, which nothing else reads).
  struct LastRopeKv {
    uint64_t record = ~uint64_t{0};
    const float *q = nullptr, *k = nullptr, *v = nullptr;
    int32_t layer = 0, rope_id = 0;
  };
  LastRopeKv last_rope_kv_;
  // Adds `part` (one weight over x) to a multi-part launch: amends the last recorded op when it
  // is a `group` launch over the same x, else records a new one with `scratch_bytes` of step
  // workspace. `launch` enqueues all parts at once.
  // `next`: the weights of the GEMV launch recorded after this one (kGemv only), filled in when
  // that launch is recorded; the step's ops launch at Flush, after the whole step is recorded.
  using PartsLaunch = void (*)(const float* x, void* scratch, const cuda::GemvPart* parts,
                               int num_parts, int64_t n, int64_t k, const cuda::GemvPrefetch* next,
                               cudaStream_t stream);
  void RecordPartsLaunch(MatMulGroup group, const Tensor& x, int64_t n, int64_t k,
                         const cuda::GemvPart& part, int64_t scratch_bytes, PartsLaunch launch);

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
  // Matrices go to bf16 (the GEMM/embedding operand type); norms and biases stay f32; bytes
  // (packed MXFP4 experts) stay bytes.
  t.dtype = dtype == DType::kU8                   ? DType::kU8
            : (f32_compute_ || shape.size() == 1) ? DType::kF32
                                                  : DType::kBF16;
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
  Flush();
  if (num_layers <= 0 || num_blocks <= 0 || block_size <= 0 || num_kv_heads <= 0 ||
      head_dim <= 0 || head_dim > cuda::kMaxHeadDim)
    return Status::Error("KV pool: bad geometry (head_dim must be <= " +
                         std::to_string(cuda::kMaxHeadDim) + ")");
  const size_t bytes = 2 * static_cast<size_t>(KvElementBytes(head_dim)) *
                       static_cast<size_t>(num_layers) * num_blocks * block_size * num_kv_heads *
                       head_dim;
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

Status CudaBackend::BeginStep(const BatchPlan& plan) {
  Flush();  // the previous step's ops, if nothing read its results
  if (kv_pool_.data() != nullptr) {
    const std::string err = plan.Validate(kv_blocks_);
    if (!err.empty()) return Status::Error("BatchPlan: " + err);
    if (plan.block_size != kv_block_size_)
      return Status::Error("BatchPlan: block_size " + std::to_string(plan.block_size) +
                           " differs from the KV pool's " + std::to_string(kv_block_size_));
  }
  // This step takes the other staging half, last used two steps ago: its ids must have been read
  // and its copies done (they are, unless nothing waited for that step).
  for (const IdsDelivery& d : deliveries_)
    if (d.half != half_) return Status::Error("BeginStep: two earlier steps' ids are unread (WaitIds)");
  // Every op of the current half's step is on the stream (Flush above): mark its end, which the
  // upload into that half's plan buffer two steps on waits for.
  CUDA_CHECK(cudaEventRecord(staging_[static_cast<size_t>(half_)].step_end.get(), stream_.get()));
  half_ ^= 1;
  CUDA_CHECK(cudaEventSynchronize(staging_[static_cast<size_t>(half_)].copied.get()));
  CUDA_CHECK(cudaEventSynchronize(staging_[static_cast<size_t>(half_)].ids_copied.get()));
  staging_[static_cast<size_t>(half_)].used = 0;
  defer_ids_ = false;
  ++steps_begun_;
  // Workspace: if the last step spilled into several chunks, merge them into one.
  if (arena_chunks_.size() > 1) {
    size_t total = 0;
    for (const DeviceBuffer& c : arena_chunks_) total += c.bytes();
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    arena_chunks_.clear();
    arena_chunks_.emplace_back(total);
  }
  arena_offset_ = 0;

  const int32_t num_tokens = plan.num_tokens(), num_seqs = plan.num_seqs();
  profiled_rows_ += num_tokens;
  const int64_t num_tables = static_cast<int64_t>(plan.block_tables.size());
  const int64_t num_logits = static_cast<int64_t>(plan.logits_rows.size());
  auto grow = [](int64_t need, int64_t cap) {
    while (cap < need) cap = std::max<int64_t>(64, cap * 2);
    return cap;
  };
  const int64_t cap_tokens = grow(std::max<int64_t>(num_tokens, num_logits), plan_cap_tokens_);
  const int64_t cap_seqs = grow(num_seqs, plan_cap_seqs_);
  // The tables' room starts large (at least two entries per KV block): the decode graphs hold the
  // plan buffer's address, so it should not move as contexts grow. Only the used part is copied.
  const int64_t cap_tables = grow(
      std::max<int64_t>({num_tables, int64_t{1} << 16, 2 * int64_t{kv_blocks_}}), plan_cap_tables_);
  // Device layout (int32): seqs [cap_seqs][4] (int4-aligned), then token_ids, positions,
  // slot_mapping, token_seq, logits_rows (cap_tokens each), block_tables (cap_tables).
  const int64_t total = 4 * cap_seqs + 5 * cap_tokens + cap_tables;
  if (cap_tokens != plan_cap_tokens_ || cap_seqs != plan_cap_seqs_ ||
      cap_tables != plan_cap_tables_) {
    SyncAllStreams();
    for (DeviceBuffer& b : plan_device_) {
      b = DeviceBuffer(static_cast<size_t>(total) * sizeof(int32_t));
    }
    EnsureStepIds(cap_tokens);
    plan_cap_tokens_ = cap_tokens;
    plan_cap_seqs_ = cap_seqs;
    plan_cap_tables_ = cap_tables;
  }
  // Everything before the tables is rewritten (zeros past the counts), the tables up to num_tables.
  const int64_t used = 4 * cap_seqs + 5 * cap_tokens + num_tables;
  plan_host_.resize(static_cast<size_t>(total));
  std::fill(plan_host_.begin(), plan_host_.begin() + (used - num_tables), 0);
  int32_t* h = plan_host_.data();
  int32_t* h_tokens = h + 4 * cap_seqs;
  int32_t* h_positions = h_tokens + cap_tokens;
  int32_t* h_slots = h_positions + cap_tokens;
  int32_t* h_token_seq = h_slots + cap_tokens;
  int32_t* h_logits = h_token_seq + cap_tokens;
  int32_t* h_tables = h_logits + cap_tokens;
  max_query_len_ = 0;
  max_context_len_ = 0;
  query_lens_.resize(static_cast<size_t>(num_seqs));
  for (int32_t s = 0; s < num_seqs; ++s) {
    const SequenceSlice& q = plan.seqs[static_cast<size_t>(s)];
    query_lens_[static_cast<size_t>(s)] = q.query_len;
    h[4 * s] = q.query_start;
    h[4 * s + 1] = q.query_len;
    h[4 * s + 2] = q.context_len;
    h[4 * s + 3] = q.block_table_start;
    max_query_len_ = std::max(max_query_len_, q.query_len);
    max_context_len_ = std::max(max_context_len_, q.context_len);
    for (int32_t i = q.query_start; i < q.query_start + q.query_len && i < num_tokens; ++i)
      h_token_seq[i] = s;
  }
  std::copy(plan.token_ids.begin(), plan.token_ids.end(), h_tokens);
  std::copy(plan.positions.begin(), plan.positions.end(), h_positions);
  std::copy(plan.slot_mapping.begin(), plan.slot_mapping.end(), h_slots);
  std::copy(plan.logits_rows.begin(), plan.logits_rows.end(), h_logits);
  std::copy(plan.block_tables.begin(), plan.block_tables.end(), h_tables);
  UploadPlan(static_cast<size_t>(used) * sizeof(int32_t));
  const int32_t* base = plan_device_[static_cast<size_t>(half_)].as<int32_t>();
  plan_.seqs = reinterpret_cast<const int4*>(base);
  plan_.token_ids = base + (h_tokens - h);
  plan_.positions = base + (h_positions - h);
  plan_.slot_mapping = base + (h_slots - h);
  plan_.token_seq = base + (h_token_seq - h);
  plan_.logits_rows = base + (h_logits - h);
  plan_.block_tables = base + (h_tables - h);
  plan_.fed_ids = step_ids_[static_cast<size_t>(half_ ^ 1)].as<int32_t>();
  plan_.num_tokens = num_tokens;
  plan_.num_seqs = num_seqs;
  plan_.num_logits_rows = static_cast<int32_t>(num_logits);
  plan_.block_size = plan.block_size;
  in_step_ = true;
  return Status::Ok();
}

void CudaBackend::SyncAllStreams() {
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(upload_stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(ids_stream_.get()));
}

void CudaBackend::EnsureStepIds(int64_t rows) {
  const size_t bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  if (step_ids_[0].bytes() >= bytes) return;
  SyncAllStreams();
  for (DeviceBuffer& ids : step_ids_) {
    DeviceBuffer grown(bytes);
    if (ids.bytes() > 0)
      CUDA_CHECK(cudaMemcpyAsync(grown.data(), ids.data(), ids.bytes(), cudaMemcpyDeviceToDevice,
                                 stream_.get()));
    ids = std::move(grown);  // (freeing the old buffer waits for the copy)
  }
}

size_t CudaBackend::StageOffset(StagingHalf& h, size_t bytes) {
  size_t offset = (h.used + 15) / 16 * 16;
  if (offset + bytes > h.upload.bytes()) {
    // The half's earlier copies read the memory that growing drops: let them finish first.
    SyncAllStreams();
    h.upload.Reserve(std::max({bytes, 2 * h.upload.bytes(), size_t{1} << 20}));
    offset = 0;
  }
  return offset;
}

void CudaBackend::Upload(void* dst, const void* src, size_t bytes) {
  StagingHalf& h = staging_[static_cast<size_t>(half_)];
  const size_t offset = StageOffset(h, bytes);
  std::memcpy(h.upload.data() + offset, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, h.upload.data() + offset, bytes, cudaMemcpyHostToDevice,
                             stream_.get()));
  CUDA_CHECK(cudaEventRecord(h.copied.get(), stream_.get()));
  h.used = offset + bytes;
}

void CudaBackend::UploadPlan(size_t bytes) {
  StagingHalf& h = staging_[static_cast<size_t>(half_)];
  const size_t offset = StageOffset(h, bytes);
  std::memcpy(h.upload.data() + offset, plan_host_.data(), bytes);
  // The half's plan buffer was last read by the step two back (its step_end).
  CUDA_CHECK(cudaStreamWaitEvent(upload_stream_.get(), h.step_end.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(plan_device_[static_cast<size_t>(half_)].data(),
                             h.upload.data() + offset, bytes, cudaMemcpyHostToDevice,
                             upload_stream_.get()));
  CUDA_CHECK(cudaEventRecord(h.uploaded.get(), upload_stream_.get()));
  CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), h.uploaded.get(), 0));
  // Recorded behind the wait: complete once the upload has read the staging bytes.
  CUDA_CHECK(cudaEventRecord(h.copied.get(), stream_.get()));
  h.used = offset + bytes;
}

const int32_t* CudaBackend::CopyIdsBack(int64_t rows) {
  StagingHalf& h = staging_[static_cast<size_t>(half_)];
  const size_t bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  if (h.ids.bytes() < bytes) {
    SyncAllStreams();  // a queued copy may target the old memory
    h.ids.Reserve(std::max<size_t>(bytes, 4096));
  }
  CUDA_CHECK(cudaEventRecord(h.ids_ready.get(), stream_.get()));
  CUDA_CHECK(cudaStreamWaitEvent(ids_stream_.get(), h.ids_ready.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(h.ids.data(), step_ids_[static_cast<size_t>(half_)].data(), bytes,
                             cudaMemcpyDeviceToHost, ids_stream_.get()));
  CUDA_CHECK(cudaEventRecord(h.ids_copied.get(), ids_stream_.get()));
  return reinterpret_cast<const int32_t*>(h.ids.data());
}

CudaBackend::IdsDelivery& CudaBackend::StepDelivery() {
  if (deliveries_.empty() || delivery_step_ != steps_begun_) {
    deliveries_.push_back(IdsDelivery{half_, {}, {}, {}});
    delivery_step_ = steps_begun_;
  }
  return deliveries_.back();
}

Status CudaBackend::WaitIds() {
  if (deliveries_.empty()) return Status::Ok();
  IdsDelivery d = std::move(deliveries_.front());
  deliveries_.pop_front();
  const StagingHalf& h = staging_[static_cast<size_t>(d.half)];
  CUDA_CHECK(cudaEventSynchronize(h.ids_copied.get()));
  const int32_t* ids = reinterpret_cast<const int32_t*>(h.ids.data());
  std::copy(ids, ids + d.argmax.size(), d.argmax.begin());
  for (int32_t r : d.sample_rows) d.sampled[static_cast<size_t>(r)] = ids[r];
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
  return AllocOf(DType::kF32, shape);
}

// bf16 where MatMul takes the cuBLAS path (Bf16MatMulInput): the producing op rounds its f32
// result once, and MatMul needs no conversion pass of its own (the same bits, a third of the
// bytes). f32 elsewhere.
Tensor CudaBackend::AllocMatMulInput(std::initializer_list<int64_t> shape) {
  return AllocOf(Bf16MatMulInput(MatrixRows(shape)) ? DType::kBF16 : DType::kF32, shape);
}

// bf16 where MatMul takes the cuBLAS path, as AllocMatMulInput: cuBLAS writes the bf16 result
// (rounded RN from its f32 accumulators) and its reader reads half the bytes.
// EMBER_CUDA_MATMUL_OUT_BF16=0 keeps them f32 (A/B runs).
Tensor CudaBackend::AllocMatMulOutput(std::initializer_list<int64_t> shape) {
  static const bool enabled = cuda::EnvSwitchOn("EMBER_CUDA_MATMUL_OUT_BF16");
  return AllocOf(enabled && Bf16MatMulInput(MatrixRows(shape)) ? DType::kBF16 : DType::kF32, shape);
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

// Every op below CHECKs its shapes now and records its launch (with the values it depends on as
// the graph key); nothing reaches the GPU before Flush().

void CudaBackend::Embedding(const Tensor& table, float scale, Tensor out) {
  CHECK_EQ(out.rows(), plan_.num_tokens);
  CHECK_EQ(out.cols(), table.cols());
  const cuda::PlanView plan = plan_;
  const ElemType type = ToElemType(table.dtype);
  const int64_t vocab = table.rows(), d = table.cols();
  recorder_.Record({1, KeyOf(table.data), U(static_cast<int>(type)), U(vocab), U(d), KeyOf(scale),
                    KeyOf(plan.token_ids), KeyOf(plan.fed_ids), U(plan.num_tokens),
                    KeyOf(out.data)},
                   [=](cudaStream_t st) {
                     cuda::LaunchEmbedding(table.data, type, vocab, d, scale, plan,
                                           static_cast<float*>(out.data), st);
                   });
}

void CudaBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
                          Tensor out) {
  CHECK(x.dtype == DType::kF32 && weight.dtype == DType::kF32);
  CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
  CHECK_EQ(x.numel(), out.numel());
  CHECK_EQ(weight.numel(), x.cols());
  const bool one_plus = kind == RmsNormKind::kOnePlusWeight;
  const bool out_bf16 = out.dtype == DType::kBF16;
  const int64_t rows = x.rows(), d = x.cols();
  recorder_.Record({2, KeyOf(x.data), KeyOf(weight.data), KeyOf(eps), U(one_plus), U(rows), U(d),
                    KeyOf(out.data), U(out_bf16)},
                   [=](cudaStream_t st) {
                     cuda::LaunchRmsNorm(static_cast<const float*>(x.data), nullptr, nullptr, false,
                                         static_cast<const float*>(weight.data), eps, one_plus,
                                         rows, d, out.data, out_bf16, st);
                   });
}

void CudaBackend::AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                             RmsNormKind kind, Tensor out) {
  CHECK_EQ(residual.numel(), delta.numel());
  CHECK_EQ(residual.numel(), out.numel());
  CHECK_EQ(weight.numel(), residual.cols());
  CHECK(weight.dtype == DType::kF32 && residual.dtype == DType::kF32);
  CHECK(delta.dtype == DType::kF32 || delta.dtype == DType::kBF16) << DTypeName(delta.dtype);
  CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
  const bool one_plus = kind == RmsNormKind::kOnePlusWeight;
  const bool delta_bf16 = delta.dtype == DType::kBF16;
  const bool out_bf16 = out.dtype == DType::kBF16;
  const int64_t rows = residual.rows(), d = residual.cols();
  recorder_.Record({3, KeyOf(residual.data), KeyOf(delta.data), KeyOf(weight.data), KeyOf(eps),
                    U(one_plus), U(rows), U(d), KeyOf(out.data), U(out_bf16), U(delta_bf16)},
                   [=](cudaStream_t st) {
                     cuda::LaunchRmsNorm(nullptr, static_cast<float*>(residual.data), delta.data,
                                         delta_bf16, static_cast<const float*>(weight.data), eps,
                                         one_plus, rows, d, out.data, out_bf16, st);
                   });
}

void CudaBackend::RecordPartsLaunch(MatMulGroup group, const Tensor& x, int64_t n, int64_t k,
                                    const cuda::GemvPart& part, int64_t scratch_bytes,
                                    PartsLaunch launch) {
  LastMatMul& g = last_matmul_;
  const bool join = LastOpIs(g) && g.group == group && g.x == x.data && g.n == n && g.k == k &&
                    g.num_parts < cuda::kGemvMaxParts;
  if (group == MatMulGroup::kGemv && !join) {
    // This launch's weights are the previous GEMV launch's prefetch target.
    if (!gemv_next_.empty()) gemv_next_.back() = cuda::GemvPrefetch{part.w, part.m * k * 2};
    gemv_next_.emplace_back();
  }
  // Read when the op launches (Flush), after the whole step is recorded.
  const std::vector<cuda::GemvPrefetch>* hints = &gemv_next_;
  const size_t hint = gemv_next_.empty() ? 0 : gemv_next_.size() - 1;
  if (!join) {
    g = LastMatMul{};
    g.group = group;
    g.x = x.data;
    g.n = n;
    g.k = k;
    g.converted = scratch_bytes > 0 ? ArenaAlloc(static_cast<size_t>(scratch_bytes)) : nullptr;
  }
  g.parts[g.num_parts++] = part;
  // Tag (the profile's op name): 13 "MatMul(gemv)", 14 "MatMul(gemm)".
  std::array<uint64_t, 6 + 4 * cuda::kGemvMaxParts> key = {
      group == MatMulGroup::kGemv ? 13u : 14u, KeyOf(x.data), U(n), U(k), U(g.num_parts),
      KeyOf(g.converted)};
  size_t key_len = 6;
  for (int i = 0; i < g.num_parts; ++i) {
    key[key_len++] = KeyOf(g.parts[i].w);
    key[key_len++] = KeyOf(g.parts[i].bias);
    key[key_len++] = KeyOf(g.parts[i].out);
    key[key_len++] = U(g.parts[i].m);
  }
  const int num_parts = g.num_parts;
  std::array<cuda::GemvPart, cuda::kGemvMaxParts> parts;
  std::copy(g.parts, g.parts + num_parts, parts.begin());
  const float* xp = static_cast<const float*>(x.data);
  void* scratch = g.converted;
  const bool gemv = group == MatMulGroup::kGemv;
  auto op = [=](cudaStream_t st) {
    launch(xp, scratch, parts.data(), num_parts, n, k, gemv ? &(*hints)[hint] : nullptr, st);
  };
  if (join) {
    recorder_.ReplaceLast(std::span<const uint64_t>(key.data(), key_len), std::move(op));
  } else {
    recorder_.Record(std::span<const uint64_t>(key.data(), key_len), std::move(op));
  }
  g.record = recorder_.records();
}

void CudaBackend::MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) {
  const int64_t n = x.rows(), k = x.cols(), m = weight.rows();
  CHECK_EQ(weight.cols(), k) << "MatMul " << ShapeString(x) << " x " << ShapeString(weight);
  CHECK_EQ(out.rows(), n);
  CHECK_EQ(out.cols(), m);
  // A bf16 out (AllocMatMulOutput) only where the cuBLAS path runs and writes it.
  const bool out_bf16 = out.dtype == DType::kBF16;
  CHECK(out.dtype == DType::kF32 ||
        (out_bf16 && weight.dtype == DType::kBF16 && bias == nullptr && Bf16MatMulInput(n)))
      << "MatMul: out " << DTypeName(out.dtype) << " [" << n << " rows]";
  // A bf16 x (AllocMatMulInput) is already the cuBLAS operand.
  const bool x_bf16 = x.dtype == DType::kBF16;
  CHECK(x.dtype == DType::kF32 || (x_bf16 && weight.dtype == DType::kBF16 && Bf16MatMulInput(n)))
      << "MatMul: x " << DTypeName(x.dtype) << " [" << n << " rows] with "
      << DTypeName(weight.dtype) << " weights";
  if (n == 0) return;
  const void* bias_data = nullptr;
  if (bias != nullptr) {
    CHECK_EQ(bias->numel(), m);
    CHECK(bias->dtype == DType::kF32);
    bias_data = bias->data;
  }
  const cuda::GemvPart part{weight.data, static_cast<const float*>(bias_data),
                            static_cast<float*>(out.data), m};
  // Batch-invariant mode: the fixed-order tensor-core GEMM for every n (gemm_invariant.cu), so a
  // row's bits never depend on the other rows of the step. Default mode: the same kernel for 2..8
  // rows too, where it beats the f32-x GEMV by up to 3x (the GEMV re-reads every x row per weight
  // load; H200, decode ms/step at 4 / 8 rows: 1B 2.26 / 3.73 GEMV vs 1.65 / 1.83, 8B 11.0 / 19.4
  // vs 5.9 / 6.5; docs/perf.md, session 4). Large n share one bf16 copy of x across the parts.
  const bool invariant_gemm = weight.dtype == DType::kBF16 &&
                              (batch_invariant_ || (n >= 2 && n <= cuda::kDecodeGemmMaxRows));
  if (invariant_gemm) {
    RecordPartsLaunch(
        MatMulGroup::kInvariant, x, n, k, part, cuda::GemmInvariantScratchBytes(n, k),
        [](const float* xp, void* scratch, const cuda::GemvPart* parts, int num_parts, int64_t rows,
           int64_t cols, const cuda::GemvPrefetch*, cudaStream_t st) {
          cuda::LaunchGemmInvariant(xp, scratch, parts, num_parts, rows, cols, st);
        });
    return;
  }
  if (weight.dtype == DType::kBF16 && n == 1 && cuda::GemvBf16Supported(x.data, weight.data, k)) {
    // One row (batch-1 decode): a bandwidth-bound GEMV (f32 activations, bias fused).
    RecordPartsLaunch(MatMulGroup::kGemv, x, n, k, part, 0,
                      [](const float* xp, void*, const cuda::GemvPart* parts, int num_parts,
                         int64_t /*rows*/, int64_t cols, const cuda::GemvPrefetch* next,
                         cudaStream_t st) {
                        cuda::LaunchGemvBf16Multi(xp, parts, num_parts, cols, *next, st);
                      });
    return;
  }
  // Parity mode (f32 weights): true fp32 FMA, never TF32. Otherwise the activations are
  // converted to the weight's 16-bit type (once for consecutive MatMuls of one x) and
  // accumulated in f32.
  const bool f32_weight = weight.dtype == DType::kF32;
  LastMatMul& c = last_matmul_;
  const bool reuse = !f32_weight && LastOpIs(c) && c.group == MatMulGroup::kNone && c.x == x.data &&
                     c.n == n && c.k == k && c.converted != nullptr &&
                     c.converted_type == weight.dtype;
  void* converted =
      f32_weight ? nullptr
      : x_bf16   ? x.data
      : reuse    ? c.converted
                 : ArenaAlloc(static_cast<size_t>(n * k) * DTypeSize(weight.dtype));
  const bool convert = !f32_weight && !x_bf16 && !reuse;
  // bf16 GEMMs of a few rows against small weights: the wgmma skinny GEMM where it beats cuBLAS.
  const bool skinny = weight.dtype == DType::kBF16 && !out_bf16 &&
                      cuda::SkinnyGemmPreferred(n, m, k) &&
                      cuda::SkinnyGemmSupported(n, m, k, converted, weight.data);
  // (Its plan queries the occupancy once per shape: here, not while a graph is being captured.)
  if (skinny) (void)cuda::PlanSkinnyGemm(n, m, k);
  const CublasPart gemm{weight.data, bias_data, out.data, m, skinny, out_bf16};
  if (reuse && MatMulStreamsEnabled() && c.cublas.num_parts < CublasGroup::kMaxParts) {
    // The same x as the MatMul just recorded (q/k/v, gate/up): one op of both, the later parts
    // on the side stream while the first runs.
    c.cublas.parts[c.cublas.num_parts++] = gemm;
    RecordCublasGroup(c.cublas, /*replace_last=*/true);
    return;
  }
  CublasGroup group;
  group.x = x.data;
  group.converted = converted;
  group.convert = convert;
  group.wdtype = weight.dtype;
  group.n = n;
  group.k = k;
  group.parts[0] = gemm;
  group.num_parts = 1;
  RecordCublasGroup(group, /*replace_last=*/false);
  c = LastMatMul{};
  c.record = recorder_.records();
  c.x = x.data;
  c.n = n;
  c.k = k;
  c.converted = converted;
  c.converted_type = weight.dtype;
  c.cublas = group;
}

void CudaBackend::RecordCublasGroup(const CublasGroup& g, bool replace_last) {
  std::array<uint64_t, 7 + 6 * CublasGroup::kMaxParts> key{};
  size_t len = 0;
  for (uint64_t v : {uint64_t{4}, KeyOf(g.x), KeyOf(g.converted), U(g.convert),
                     U(static_cast<int>(g.wdtype)), U(g.n), U(g.k)})
    key[len++] = v;
  for (int i = 0; i < g.num_parts; ++i) {
    const CublasPart& p = g.parts[i];
    for (uint64_t v : {KeyOf(p.w), KeyOf(p.bias), KeyOf(p.out), U(p.m), U(p.skinny), U(p.out_bf16)})
      key[len++] = v;
  }
  const cublasHandle_t main = cublas_.get(), side = cublas_side_.get();
  const cudaStream_t side_stream = side_stream_.get();
  const cudaEvent_t fork = fork_.get(), join = join_.get();
  auto launch = [g, main, side, side_stream, fork, join](cudaStream_t st) {
    if (g.convert)
      cuda::LaunchConvert(g.x, ElemType::kF32, g.converted, ToElemType(g.wdtype), g.n * g.k, st);
    if (g.num_parts > 1) {
      CUDA_CHECK(cudaEventRecord(fork, st));
      CUDA_CHECK(cudaStreamWaitEvent(side_stream, fork));
      for (int i = 1; i < g.num_parts; ++i) RunCublasPart(g, g.parts[i], side, side_stream);
    }
    RunCublasPart(g, g.parts[0], main, st);
    if (g.num_parts > 1) {
      CUDA_CHECK(cudaEventRecord(join, side_stream));
      CUDA_CHECK(cudaStreamWaitEvent(st, join));
    }
  };
  const std::span<const uint64_t> k(key.data(), len);
  if (replace_last) {
    recorder_.ReplaceLast(k, launch);
  } else {
    recorder_.Record(k, launch);
  }
}

void CudaBackend::Rope(int32_t rope_id, Tensor q, Tensor k) {
  CHECK(rope_id >= 0 && rope_id < static_cast<int32_t>(ropes_.size()));
  const DeviceRope& rope = ropes_[static_cast<size_t>(rope_id)];
  const int64_t per_token = static_cast<int64_t>(plan_.num_tokens) * rope.spec.head_dim;
  CHECK_GT(per_token, 0);
  CHECK_EQ(q.numel() % per_token, 0);
  CHECK_EQ(k.numel() % per_token, 0);
  const int32_t num_heads = static_cast<int32_t>(q.numel() / per_token);
  const int32_t num_kv_heads = static_cast<int32_t>(k.numel() / per_token);
  const RopeDims dims = RopeDims::Of(rope.spec);  // (the closure holds no whole RopeSpec)
  const float* cos = rope.cos.as<float>();
  const float* sin = rope.sin.as<float>();
  const cuda::PlanView plan = plan_;
  recorder_.Record({5, KeyOf(q.data), KeyOf(k.data), U(num_heads), U(num_kv_heads),
                    U(dims.head_dim), U(dims.rotary_dim), KeyOf(cos), KeyOf(sin),
                    U(dims.max_positions), KeyOf(plan.positions), U(plan.num_tokens)},
                   [=](cudaStream_t st) {
                     cuda::LaunchRope(static_cast<float*>(q.data), static_cast<float*>(k.data),
                                      num_heads, num_kv_heads, dims.head_dim, dims.rotary_dim,
                                      cos, sin, dims.max_positions, plan, st);
                   });
  last_rope_ = LastRope{recorder_.records(), static_cast<float*>(q.data),
                        static_cast<float*>(k.data), num_heads, rope_id};
}

cuda::KvLayerView CudaBackend::KvLayer(int32_t layer, int32_t num_kv_heads,
                                       int32_t head_dim) const {
  CHECK(kv_pool_.data() != nullptr) << "KV pool not allocated";
  CHECK(layer >= 0 && layer < kv_layers_);
  CHECK_EQ(num_kv_heads, kv_heads_);
  CHECK_EQ(head_dim, kv_head_dim_);
  const size_t per_tensor = static_cast<size_t>(kv_blocks_) * kv_block_size_ * kv_heads_ *
                            kv_head_dim_;
  const bool bf16 = KvBf16(kv_head_dim_);
  const size_t tensor_bytes = per_tensor * static_cast<size_t>(KvElementBytes(kv_head_dim_));
  unsigned char* base =
      kv_pool_.as<unsigned char>() + 2 * tensor_bytes * static_cast<size_t>(layer);
  return cuda::KvLayerView{reinterpret_cast<float*>(base),
                           reinterpret_cast<float*>(base + tensor_bytes), kv_heads_, kv_head_dim_,
                           bf16};
}

void CudaBackend::WriteKv(int32_t layer, const Tensor& k, const Tensor& v) {
  CHECK_EQ(k.numel(), static_cast<int64_t>(plan_.num_tokens) * kv_heads_ * kv_head_dim_);
  CHECK_EQ(v.numel(), k.numel());
  const cuda::KvLayerView kv = KvLayer(layer, kv_heads_, kv_head_dim_);
  const cuda::PlanView plan = plan_;
  const LastRope r = last_rope_;
  if (!recorder_.empty() && recorder_.records() == r.record && r.k == k.data &&
      ropes_[static_cast<size_t>(r.rope_id)].spec.head_dim == kv_head_dim_) {
    // Rope(q, k) then WriteKv(k, v): one launch (rope.cu's arithmetic, write_kv.cu's stores).
    const DeviceRope& rope = ropes_[static_cast<size_t>(r.rope_id)];
    const RopeDims dims = RopeDims::Of(rope.spec);
    const float* cos = rope.cos.as<float>();
    const float* sin = rope.sin.as<float>();
    const float* vp = static_cast<const float*>(v.data);
    const std::array<uint64_t, 17> key = {
        15,           KeyOf(r.q),         KeyOf(r.k),       KeyOf(vp),   U(r.num_heads),
        U(kv_heads_), U(dims.head_dim),   U(dims.rotary_dim), KeyOf(cos), KeyOf(sin),
        U(dims.max_positions), KeyOf(kv.k), KeyOf(kv.v),    U(kv.bf16), KeyOf(plan.positions),
        KeyOf(plan.slot_mapping), U(plan.num_tokens)};
    recorder_.ReplaceLast(key, [=](cudaStream_t st) {
      cuda::LaunchRopeWriteKv(r.q, r.k, vp, r.num_heads, dims.rotary_dim, cos, sin,
                              dims.max_positions, kv, plan, st);
    });
    last_rope_kv_ = LastRopeKv{recorder_.records(), r.q, r.k, vp, layer, r.rope_id};
    return;
  }
  recorder_.Record({6, KeyOf(k.data), KeyOf(v.data), KeyOf(kv.k), KeyOf(kv.v),
                    KeyOf(plan.slot_mapping), U(plan.num_tokens)},
                   [=](cudaStream_t st) {
                     cuda::LaunchWriteKv(static_cast<const float*>(k.data),
                                         static_cast<const float*>(v.data), kv, plan, st);
                   });
}

void CudaBackend::Attention(const AttentionParams& params, const Tensor& q, Tensor out) {
  CHECK_GT(params.num_kv_heads, 0);
  CHECK_EQ(params.num_heads % params.num_kv_heads, 0);
  const int64_t width = static_cast<int64_t>(params.num_heads) * params.head_dim;
  CHECK_EQ(q.numel(), plan_.num_tokens * width);
  CHECK_EQ(out.numel(), plan_.num_tokens * width);
  const cuda::KvLayerView kv = KvLayer(params.layer, params.num_kv_heads, params.head_dim);
  if (params.sinks != nullptr) {
    CHECK(params.sinks->dtype == DType::kF32 && params.sinks->numel() == params.num_heads)
        << "attention sinks " << ShapeString(*params.sinks) << " "
        << DTypeName(params.sinks->dtype) << ", want [" << params.num_heads << "] F32";
  }
  const cuda::AttentionArgs args{
      params.num_heads,     params.num_kv_heads, params.head_dim,
      params.scale,         params.sliding_window, params.softcap,
      params.sinks != nullptr ? static_cast<const float*>(params.sinks->data) : nullptr};
  const float* qp = static_cast<const float*>(q.data);
  float* op = static_cast<float*>(out.data);
  const cuda::PlanView plan = plan_;
  // bf16 mode: always the batch-invariant kernel (it measured as fast or faster than the
  // per-step split-K decode and flash prefill kernels it replaced, docs/perf.md); those f32
  // kernels below serve the parity mode and head dims it does not support.
  if (!f32_compute_ && cuda::AttentionInvariantSupported(params.head_dim)) {
    AttentionInvariant(args, qp, kv, op, params.layer);
    return;
  }
  CHECK(!kv.bf16);  // the f32 kernels below read float32 pools
  if (!f32_compute_ && !warned_attention_variant_) {
    warned_attention_variant_ = true;
    LOG_WARN << "cuda: head_dim " << params.head_dim
             << " has no batch-invariant attention kernel (multiples of 16 up to 256); this "
                "model's results depend on the batch";
  }
  int32_t splits = 0;  // 0: the f32 prefill kernel
  float* partials = nullptr;
  if (max_query_len_ <= 1) {
    // Decode: split the keys when there are too few (row, kv head) blocks to fill the GPU.
    const int64_t group = params.num_heads / params.num_kv_heads;
    const int64_t row_blocks =
        static_cast<int64_t>(plan_.num_tokens) * params.num_kv_heads * ((group + 7) / 8);
    int64_t visible = max_context_len_;
    if (params.sliding_window > 0) visible = std::min<int64_t>(visible, params.sliding_window);
    int64_t s = std::min<int64_t>((visible + 63) / 64,
                                  (4 * num_sms_ + row_blocks - 1) / row_blocks);
    splits = static_cast<int32_t>(std::clamp<int64_t>(s, 1, 64));
    const int64_t floats =
        cuda::DecodePartialsFloats(plan_.num_tokens, params.num_heads, params.head_dim, splits);
    if (floats > 0) partials = static_cast<float*>(ArenaAlloc(static_cast<size_t>(floats) * 4));
  }
  const int32_t max_query_len = max_query_len_;
  recorder_.Record({7, KeyOf(qp), KeyOf(op), KeyOf(kv.k), KeyOf(kv.v), U(args.num_heads),
                    U(args.num_kv_heads), U(args.head_dim), KeyOf(args.scale),
                    U(args.sliding_window), KeyOf(args.softcap), KeyOf(args.sinks), U(splits),
                    KeyOf(partials), U(max_query_len), KeyOf(plan.seqs), U(plan.num_tokens),
                    U(plan.num_seqs), U(plan.block_size)},
                   [=](cudaStream_t st) {
                     if (splits > 0) {
                       cuda::LaunchAttentionDecode(args, qp, kv, plan, splits, partials, op, st);
                     } else {
                       cuda::LaunchAttentionPrefill(args, qp, kv, plan, max_query_len, op, st);
                     }
                   });
}

namespace {
// A launch per run of one block shape in mixed steps unless EMBER_ATTN_RUNS=0 (A/B runs).
bool AttentionRunsEnabled() {
  static const bool on = cuda::EnvSwitchOn("EMBER_ATTN_RUNS");
  return on;
}
}  // namespace

// One kernel for every step shape (see attention_invariant.cu). Split mode (one block per fixed
// key split, then a fold kernel) only when the row tiles alone would leave SMs idle; it gives the
// same bits as the sequential mode.
void CudaBackend::AttentionInvariant(const cuda::AttentionArgs& args, const float* qp,
                                     const cuda::KvLayerView& kv, float* op, int32_t layer) {
  const int64_t group = args.num_heads / args.num_kv_heads;
  // A step whose sequences need different block shapes (a mixed step: decode rows beside a
  // prompt's chunk) launches the kernel once per run of consecutive sequences of one shape.
  // One launch sized for the longest sequence gave every decode sequence the prefill shape (one
  // busy warp of four) and a grid of mostly empty blocks (15 of 16 row tiles of each decode
  // sequence at a 512-row chunk). The shapes give the same bits (attention_invariant.cu).
  const std::vector<cuda::AttentionRun> runs =
      AttentionRunsEnabled()
          ? cuda::AttentionInvariantRuns(query_lens_, static_cast<int32_t>(group), args.head_dim)
          : std::vector<cuda::AttentionRun>{};
  if (runs.size() > 1) {
    for (const cuda::AttentionRun& run : runs) {
      cuda::PlanView sub = plan_;
      sub.seqs += run.first_seq;
      sub.num_seqs = run.num_seqs;
      // Sequential mode only: the split mode's fold kernel runs over every token of the step.
      AttentionInvariantLaunch(args, qp, kv, op, sub, run.max_query_len, 0, nullptr);
    }
    return;
  }
  const cuda::PlanView plan = plan_;
  const int32_t max_query_len = max_query_len_;
  const int64_t rows_per_block = cuda::AttentionInvariantRowsPerBlock(args.head_dim);
  const int64_t blocks = (max_query_len * group + rows_per_block - 1) / rows_per_block *
                         args.num_kv_heads * plan.num_seqs;
  const int32_t max_splits =
      (max_context_len_ + cuda::kInvariantSplitKeys - 1) / cuda::kInvariantSplitKeys;
  int32_t splits = 0;
  float* partials = nullptr;
  if (max_splits > 1 && blocks < num_sms_) {
    const int64_t floats = cuda::AttentionInvariantPartialsFloats(plan.num_tokens, args.num_heads,
                                                                  args.head_dim, max_splits);
    if (floats <= (int64_t{8} << 20) / 4) {
      splits = max_splits;
      partials = static_cast<float*>(ArenaAlloc(static_cast<size_t>(floats) * 4));
    }
  }
  // A decode step's attention right after the RopeWriteKv of its q and layer takes it over:
  // one launch instead of two (the same bits; `RopeWriteKvFoldsIntoDecodeAttention`).
  const LastRopeKv& r = last_rope_kv_;
  if (!recorder_.empty() && recorder_.records() == r.record && r.q == qp && r.layer == layer &&
      cuda::AttentionInvariantCanFuseRope(
          args, ropes_[static_cast<size_t>(r.rope_id)].spec.rotary_dim, max_query_len, kv)) {
    const DeviceRope& rope = ropes_[static_cast<size_t>(r.rope_id)];
    const cuda::RopeKvInput in{r.k, r.v, rope.cos.as<float>(), rope.sin.as<float>(),
                               rope.spec.rotary_dim};
    // Op 17 (profiled as "RopeAttention").
    const std::array<uint64_t, 22> key = {
        17,           KeyOf(qp),         KeyOf(op),           KeyOf(kv.k),
        KeyOf(kv.v),  U(args.num_heads), U(args.num_kv_heads), U(args.head_dim),
        KeyOf(args.scale), U(args.sliding_window), KeyOf(args.softcap), KeyOf(args.sinks),
        U(splits),    KeyOf(partials),   KeyOf(plan.seqs),     U(plan.num_tokens),
        U(plan.num_seqs), U(plan.block_size), KeyOf(in.k),     KeyOf(in.v),
        KeyOf(in.cos_table), KeyOf(plan.slot_mapping)};
    recorder_.ReplaceLast(key, [=](cudaStream_t st) {
      cuda::LaunchAttentionInvariant(args, qp, kv, plan, max_query_len, splits, partials, op, &in,
                                     st);
    });
    return;
  }
  AttentionInvariantLaunch(args, qp, kv, op, plan, max_query_len, splits, partials);
}

void CudaBackend::AttentionInvariantLaunch(const cuda::AttentionArgs& args, const float* qp,
                                           const cuda::KvLayerView& kv, float* op,
                                           const cuda::PlanView& plan, int32_t max_query_len,
                                           int32_t splits, float* partials) {
  // Op 7 (profiled as "Attention"); 1000 + splits tells these launches from the per-step ones.
  recorder_.Record({7, KeyOf(qp), KeyOf(op), KeyOf(kv.k), KeyOf(kv.v), U(args.num_heads),
                    U(args.num_kv_heads), U(args.head_dim), KeyOf(args.scale),
                    U(args.sliding_window), KeyOf(args.softcap), KeyOf(args.sinks),
                    U(1000 + splits), KeyOf(partials), U(max_query_len), KeyOf(plan.seqs),
                    U(plan.num_tokens), U(plan.num_seqs), U(plan.block_size)},
                   [=](cudaStream_t st) {
                     cuda::LaunchAttentionInvariant(args, qp, kv, plan, max_query_len, splits,
                                                    partials, op, nullptr, st);
                   });
}

void CudaBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  GatedActivation(gate, up, out, false);
}

void CudaBackend::GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) {
  GatedActivation(gate, up, out, true);
}

void CudaBackend::GatedActivation(const Tensor& gate, const Tensor& up, Tensor out, bool gelu) {
  CHECK_EQ(gate.numel(), up.numel());
  CHECK_EQ(gate.numel(), out.numel());
  CHECK(gate.dtype == up.dtype && (gate.dtype == DType::kF32 || gate.dtype == DType::kBF16))
      << DTypeName(gate.dtype) << ", " << DTypeName(up.dtype);
  CHECK(out.dtype == DType::kF32 || out.dtype == DType::kBF16) << DTypeName(out.dtype);
  const bool in_bf16 = gate.dtype == DType::kBF16;
  const bool out_bf16 = out.dtype == DType::kBF16;
  const int64_t n = gate.numel();
  // Right after the batch-1 GEMV of gate and up (one launch over x): that launch computes the
  // activation too, so the step loses a kernel and its wait (gate and up are still written).
  const LastMatMul& g = last_matmul_;
  if (!out_bf16 && !in_bf16 && LastOpIs(g) && g.group == MatMulGroup::kGemv && g.num_parts == 2 &&
      g.parts[0].out == gate.data && g.parts[1].out == up.data && g.parts[0].m == n &&
      g.parts[1].m == n && cuda::GemvGatedFused(n, g.k)) {
    const std::array<cuda::GemvPart, 2> parts = {g.parts[0], g.parts[1]};
    const float* xp = static_cast<const float*>(g.x);
    const int64_t k = g.k;
    const std::vector<cuda::GemvPrefetch>* hints = &gemv_next_;
    const size_t hint = gemv_next_.size() - 1;  // this GEMV launch's entry
    const cuda::GemvGatedOut gated{static_cast<float*>(out.data), gelu};
    // Tag 16: "MatMul(gemv)+act".
    const std::array<uint64_t, 12> key = {16u,
                                          KeyOf(xp),
                                          U(k),
                                          U(gelu),
                                          KeyOf(out.data),
                                          U(n),
                                          KeyOf(parts[0].w),
                                          KeyOf(parts[0].bias),
                                          KeyOf(parts[0].out),
                                          KeyOf(parts[1].w),
                                          KeyOf(parts[1].bias),
                                          KeyOf(parts[1].out)};
    recorder_.ReplaceLast(key, [=](cudaStream_t st) {
      cuda::LaunchGemvBf16Multi(xp, parts.data(), 2, k, (*hints)[hint], st, gated);
    });
    last_matmul_ = LastMatMul{};  // nothing joins a fused launch
    return;
  }
  recorder_.Record({gelu ? 9u : 8u, KeyOf(gate.data), KeyOf(up.data), KeyOf(out.data), U(n),
                    U(out_bf16), U(in_bf16)},
                   [=](cudaStream_t st) {
                     cuda::LaunchGatedActivation(gate.data, up.data, in_bf16, out.data, out_bf16, n,
                                                 gelu, st);
                   });
}

bool CudaBackend::MoeOnTensorCores(int64_t rows, int32_t top_k, int32_t num_experts,
                                   bool mxfp4) const {
  static const int mode = [] {
    const char* e = std::getenv("EMBER_MOE_MMA");
    return e == nullptr ? -1 : std::atoi(e);
  }();
  if (f32_compute_ || mode == 0) return false;
  if (mode == 1 || batch_invariant_) return true;
  return cuda::MoeMmaPays(rows * top_k, num_experts, mxfp4);
}

void CudaBackend::MoeMlp(const Tensor& x, const MoeExperts& experts, Tensor out) {
  const int64_t rows = x.rows(), d = x.cols();
  const int32_t num_experts = static_cast<int32_t>(experts.gate.size());
  CHECK(num_experts > 0 && experts.up.size() == experts.gate.size() &&
        experts.down.size() == experts.gate.size());
  CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32);
  CHECK(experts.router.rows() == num_experts && experts.router.cols() == d &&
        (experts.router.dtype == experts.gate[0].dtype || experts.mxfp4()))
      << "router " << ShapeString(experts.router) << " " << DTypeName(experts.router.dtype);
  CHECK_EQ(reinterpret_cast<uintptr_t>(experts.router.data) % 16, 0u);
  CHECK_EQ(out.rows(), rows);
  CHECK_EQ(out.cols(), d);
  const bool mxfp4 = experts.mxfp4();
  const int64_t inter = experts.gate[0].rows();
  const DType wtype = experts.gate[0].dtype;
  CHECK(mxfp4 ? wtype == DType::kU8 && experts.router.dtype == DType::kBF16
              : wtype == DType::kBF16 || wtype == DType::kF32)
      << DTypeName(wtype) << (mxfp4 ? " MXFP4 experts" : " experts");
  if (mxfp4) {
    CHECK(!f32_compute_ && d % 32 == 0 && inter % 32 == 0)
        << "MXFP4 experts: d " << d << ", inter " << inter;
    CHECK(experts.up_scales.size() == experts.gate.size() &&
          experts.down_scales.size() == experts.gate.size() &&
          experts.gate_scales.size() == experts.gate.size());
  }
  const bool biased = experts.biased();
  if (experts.router_bias) {
    CHECK(experts.router_bias->dtype == DType::kF32 && experts.router_bias->numel() == num_experts)
        << "router bias " << ShapeString(*experts.router_bias);
  }
  auto table = std::find_if(moe_tables_.begin(), moe_tables_.end(), [&](const auto& t) {
    return t.first == experts.gate[0].data;
  });
  if (table == moe_tables_.end()) {
    // [gate, up, down (, gate_bias, up_bias, down_bias)] x num_experts pointers.
    std::vector<const void*> ptrs;
    // A matrix [out, in]: MXFP4 [out, in / 2] bytes with scales [out, in / 32].
    const int64_t per_byte = mxfp4 ? 2 : 1;
    for (const std::vector<Tensor>* part : {&experts.gate, &experts.up, &experts.down}) {
      for (const Tensor& w : *part) {
        const bool down = part == &experts.down;
        CHECK(w.dtype == wtype && w.rows() == (down ? d : inter) &&
              w.cols() * per_byte == (down ? inter : d))
            << "expert weight " << ShapeString(w) << " " << DTypeName(w.dtype);
        CHECK_EQ(reinterpret_cast<uintptr_t>(w.data) % 16, 0u);
        ptrs.push_back(w.data);
      }
    }
    if (mxfp4) {
      for (const std::vector<Tensor>* part :
           {&experts.gate_scales, &experts.up_scales, &experts.down_scales}) {
        for (const Tensor& sc : *part) {
          const bool down = part == &experts.down_scales;
          CHECK(sc.dtype == DType::kU8 && sc.rows() == (down ? d : inter) &&
                sc.cols() * 32 == (down ? inter : d))
              << "expert scales " << ShapeString(sc) << " " << DTypeName(sc.dtype);
          ptrs.push_back(sc.data);
        }
      }
    }
    if (biased) {
      for (const std::vector<Tensor>* part :
           {&experts.gate_bias, &experts.up_bias, &experts.down_bias}) {
        CHECK_EQ(part->size(), experts.gate.size());
        for (const Tensor& bias : *part) {
          CHECK(bias.dtype == DType::kF32 &&
                bias.numel() == (part == &experts.down_bias ? d : inter))
              << "expert bias " << ShapeString(bias) << " " << DTypeName(bias.dtype);
          ptrs.push_back(bias.data);
        }
      }
    }
    if (moe_tables_.empty()) cuda::PrepareMoeKernels();
    DeviceBuffer buffer(ptrs.size() * sizeof(void*));
    CUDA_CHECK(cudaMemcpy(buffer.data(), ptrs.data(), buffer.bytes(), cudaMemcpyHostToDevice));
    moe_tables_.emplace_back(experts.gate[0].data, std::move(buffer));
    table = moe_tables_.end() - 1;
  }
  cuda::MoeArgs a;
  a.router = experts.router.data;
  a.x = static_cast<const float*>(x.data);
  const auto* ptrs = static_cast<const void* const*>(table->second.data());
  a.gate = ptrs;
  a.up = ptrs + num_experts;
  a.down = ptrs + 2 * num_experts;
  a.router_bias =
      experts.router_bias ? static_cast<const float*>(experts.router_bias->data) : nullptr;
  const int64_t scale_ptrs = mxfp4 ? 3 * num_experts : 0;
  if (mxfp4) {
    a.mxfp4 = true;
    a.gate_scales = ptrs + 3 * num_experts;
    a.up_scales = ptrs + 4 * num_experts;
    a.down_scales = ptrs + 5 * num_experts;
  }
  if (biased) {
    CHECK_EQ(table->second.bytes(), (6 * num_experts + scale_ptrs) * sizeof(void*));  // biased
    const auto* biases = reinterpret_cast<const float* const*>(ptrs + 3 * num_experts + scale_ptrs);
    a.gate_bias = biases;
    a.up_bias = biases + num_experts;
    a.down_bias = biases + 2 * num_experts;
  }
  a.clamped_swiglu = experts.activation == MoeActivation::kClampedSwiglu;
  a.swiglu_limit = experts.swiglu_limit;
  a.swiglu_alpha = experts.swiglu_alpha;
  a.w_bf16 = mxfp4 || wtype == DType::kBF16;
  a.mma = a.w_bf16 && MoeOnTensorCores(rows, experts.top_k, num_experts, mxfp4);
  a.rows = rows;
  a.d = d;
  a.inter = inter;
  a.num_experts = num_experts;
  a.top_k = experts.top_k;
  a.normalize = experts.normalize;
  a.max_tiles = cuda::MoeMaxTiles(rows, experts.top_k, num_experts);
  const size_t pairs = static_cast<size_t>(rows * experts.top_k);
  auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t pair_bytes = align(pairs * 4),
               tile_bytes = align(static_cast<size_t>(a.max_tiles) * 12);
  const size_t act_bytes = align(pairs * static_cast<size_t>(inter) * 4);
  const size_t logit_bytes = align(static_cast<size_t>(rows * num_experts) * 4);
  const size_t need = logit_bytes + 4 * pair_bytes + tile_bytes + 256 + act_bytes +
                      pairs * static_cast<size_t>(d) * 4;
  if (moe_scratch_step_ != steps_begun_ || moe_scratch_bytes_ < need) {
    moe_scratch_ = static_cast<unsigned char*>(ArenaAlloc(need));
    moe_scratch_bytes_ = need;
    moe_scratch_step_ = steps_begun_;
  }
  unsigned char* at = moe_scratch_;
  auto take = [&](size_t bytes) {
    unsigned char* p = at;
    at += bytes;
    return p;
  };
  a.logits = reinterpret_cast<float*>(take(logit_bytes));
  a.ids = reinterpret_cast<int32_t*>(take(pair_bytes));
  a.weights = reinterpret_cast<float*>(take(pair_bytes));
  a.sorted = reinterpret_cast<int32_t*>(take(pair_bytes));
  a.pair_pos = reinterpret_cast<int32_t*>(take(pair_bytes));
  a.tiles = reinterpret_cast<int32_t*>(take(tile_bytes));
  a.num_tiles = reinterpret_cast<int32_t*>(take(256));
  a.act = reinterpret_cast<float*>(take(act_bytes));
  a.y = reinterpret_cast<float*>(take(pairs * static_cast<size_t>(d) * 4));
  a.out = static_cast<float*>(out.data);
  // Op 18 (profiled as "MoeMlp"); the scratch follows from the arena's state, also keyed.
  const uint64_t weights_kind = U(a.w_bf16) | U(a.mxfp4) << 1 | U(a.mma) << 2;
  recorder_.Record({18, KeyOf(a.router), KeyOf(a.x), KeyOf(a.logits), KeyOf(ptrs), weights_kind,
                    U(rows), U(d), U(inter), U(num_experts), U(a.top_k), U(a.normalize),
                    KeyOf(a.ids), KeyOf(a.y), KeyOf(a.out), KeyOf(a.router_bias),
                    KeyOf(a.gate_bias), U(a.clamped_swiglu), KeyOf(a.swiglu_limit),
                    KeyOf(a.swiglu_alpha)},
                   [=](cudaStream_t st) { cuda::LaunchMoeMlp(a, st); });
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  CHECK_EQ(a.numel(), b.numel());
  CHECK_EQ(a.numel(), out.numel());
  const int64_t n = a.numel();
  recorder_.Record({10, KeyOf(a.data), KeyOf(b.data), KeyOf(out.data), U(n)},
                   [=](cudaStream_t st) {
                     cuda::LaunchAdd(static_cast<const float*>(a.data),
                                     static_cast<const float*>(b.data),
                                     static_cast<float*>(out.data), n, st);
                   });
}

void CudaBackend::Softcap(Tensor x, float cap) {
  CHECK_GT(cap, 0.f);
  const int64_t n = x.numel();
  recorder_.Record({11, KeyOf(x.data), KeyOf(cap), U(n)}, [=](cudaStream_t st) {
    cuda::LaunchSoftcap(static_cast<float*>(x.data), cap, n, st);
  });
}

void CudaBackend::GatherLogitsRows(const Tensor& x, Tensor out) {
  CHECK_EQ(x.rows(), plan_.num_tokens);
  CHECK_EQ(out.rows(), plan_.num_logits_rows);
  CHECK_EQ(out.cols(), x.cols());
  const cuda::PlanView plan = plan_;
  const int64_t d = x.cols();
  recorder_.Record({12, KeyOf(x.data), KeyOf(out.data), U(d), KeyOf(plan.logits_rows),
                    U(plan.num_logits_rows)},
                   [=](cudaStream_t st) {
                     cuda::LaunchGatherRows(static_cast<const float*>(x.data), d, plan,
                                            static_cast<float*>(out.data), st);
                   });
}

Status CudaBackend::CopyToHost(const Tensor& t, std::span<float> out) {
  CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16) << DTypeName(t.dtype);
  CHECK_EQ(static_cast<int64_t>(out.size()), t.numel());
  Flush();
  if (t.dtype == DType::kBF16) {  // an AllocMatMulInput buffer (tests): widened on the host
    std::vector<uint16_t> bits(out.size());
    CUDA_CHECK(cudaMemcpyAsync(bits.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost,
                               stream_.get()));
    CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    std::transform(bits.begin(), bits.end(), out.begin(), Bf16ToF32);
    return Status::Ok();
  }
  CUDA_CHECK(cudaMemcpyAsync(out.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost,
                             stream_.get()));
  CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::Ok();
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

static_assert(sizeof(RowSampling) == sizeof(cuda::SampleRowParams) &&
              offsetof(RowSampling, u) == offsetof(cuda::SampleRowParams, u));

Status CudaBackend::SampleRows(const Tensor& x, std::span<const int32_t> rows,
                               std::span<const RowSampling> params, std::span<int32_t> ids) {
  CHECK(x.dtype == DType::kF32);
  CHECK_EQ(rows.size(), params.size());
  CHECK_EQ(static_cast<int64_t>(ids.size()), x.rows());
  for (int32_t r : rows) CHECK(r >= 0 && r < x.rows()) << "SampleRows: row " << r;
  Flush();
  if (rows.empty()) return Status::Ok();
  EnsureStepIds(x.rows());
  // One buffer: params (8-byte aligned) first, then rows.
  const size_t params_bytes = params.size_bytes(), rows_bytes = rows.size_bytes();
  if (sample_args_.bytes() < params_bytes + rows_bytes)
    sample_args_ = DeviceBuffer(params_bytes + rows_bytes);
  char* base = sample_args_.as<char>();
  Upload(base, params.data(), params_bytes);
  Upload(base + params_bytes, rows.data(), rows_bytes);
  cuda::LaunchSampleRows(static_cast<const float*>(x.data), x.cols(),
                         reinterpret_cast<const int32_t*>(base + params_bytes),
                         reinterpret_cast<const cuda::SampleRowParams*>(base),
                         static_cast<int32_t>(rows.size()),
                         step_ids_[static_cast<size_t>(half_)].as<int32_t>(), stream_.get());
  const int32_t* host = CopyIdsBack(x.rows());
  if (defer_ids_) {
    IdsDelivery& d = StepDelivery();
    d.sampled = ids;
    d.sample_rows.assign(rows.begin(), rows.end());
    return Status::Ok();
  }
  WaitIdsCopied();
  for (int32_t r : rows) ids[static_cast<size_t>(r)] = host[r];
  return Status::Ok();
}

static_assert(sizeof(LogitEdit) == 16);

Status CudaBackend::ApplyLogitEdits(Tensor x, std::span<const LogitEdit> edits) {
  CHECK(x.dtype == DType::kF32);
  EMBER_RETURN_IF_ERROR(CheckLogitEdits(x.rows(), x.cols(), edits));
  Flush();
  if (edits.empty()) return Status::Ok();
  CHECK_LE(edits.size(), size_t{INT32_MAX});
  if (logit_edits_.bytes() < edits.size_bytes()) logit_edits_ = DeviceBuffer(edits.size_bytes());
  Upload(logit_edits_.data(), edits.data(), edits.size_bytes());  // `edits` may die after it
  cuda::LaunchLogitEdits(static_cast<float*>(x.data), x.cols(), logit_edits_.as<LogitEdit>(),
                         static_cast<int32_t>(edits.size()), stream_.get());
  return Status::Ok();
}

Status CudaBackend::ArgmaxRows(const Tensor& x, std::span<int32_t> ids) {
  CHECK(x.dtype == DType::kF32);
  CHECK_EQ(static_cast<int64_t>(ids.size()), x.rows());
  EnsureStepIds(x.rows());  // (before the op's key holds the ids' address)
  // Recorded as the step's last op: the decode graph ends with it, a programmatic dependent
  // launch behind the lm_head.
  const size_t cells = size_t{kArgmaxSplitRows} * kArgmaxSplitChunks;
  cuda::ArgmaxScratch scratch;
  scratch.max = argmax_scratch_.as<float>();
  scratch.index = reinterpret_cast<int32_t*>(scratch.max + cells);
  scratch.counters = reinterpret_cast<unsigned*>(scratch.index + cells);
  scratch.max_rows = kArgmaxSplitRows;
  scratch.max_chunks = kArgmaxSplitChunks;
  const float* xp = static_cast<const float*>(x.data);
  const int64_t rows = x.rows(), cols = x.cols();
  int32_t* idp = step_ids_[static_cast<size_t>(half_)].as<int32_t>();
  recorder_.Record({19, KeyOf(xp), U(rows), U(cols), KeyOf(idp), KeyOf(scratch.max)},
                   [=](cudaStream_t st) { cuda::LaunchArgmaxRows(xp, rows, cols, idp, &scratch, st); });
  Flush();
  const int32_t* host = CopyIdsBack(x.rows());
  if (defer_ids_) {
    StepDelivery().argmax = ids;
    return Status::Ok();
  }
  WaitIdsCopied();
  std::copy(host, host + ids.size(), ids.begin());
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

Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, const CudaBackendOptions& options) {
  const int count = CudaDeviceCount();
  if (count == 0) return Status::Error("--device cuda: no CUDA device is available");
  if (device < 0 || device >= count)
    return Status::Error("cuda device " + std::to_string(device) + " does not exist (" +
                         std::to_string(count) + " present)");
  CUDA_CHECK(cudaSetDevice(device));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device, options));
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, bool f32_compute) {
  CudaBackendOptions options;
  options.f32_compute = f32_compute;
  return CreateCudaBackend(device, options);
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

namespace {

std::vector<CudaOpTime> NamedOpTimes(const std::vector<cuda::StepRecorder::OpTime>& times) {
  static const char* const kNames[] = {
      "?",           "Embedding",        "RmsNorm",          "AddRmsNorm",   "MatMul(cublas)",
      "Rope",        "WriteKv",          "Attention",        "SiluMul",      "GeluTanhMul",
      "Add",         "Softcap",          "GatherLogitsRows", "MatMul(gemv)", "MatMul(gemm)",
      "RopeWriteKv", "MatMul(gemv)+act", "RopeAttention",    "MoeMlp",       "ArgmaxRows"};
  std::vector<CudaOpTime> out;
  for (const auto& t : times) {
    const char* name = t.tag < std::size(kNames) ? kNames[t.tag] : "?";
    out.push_back(CudaOpTime{name, t.total_ms, t.calls});
  }
  return out;
}

}  // namespace

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

std::vector<CudaOpTime> CudaGetOpProfile(Backend& backend) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  if (cuda_backend == nullptr) return {};
  return NamedOpTimes(cuda_backend->op_times());
}

CudaGraphStats CudaGetGraphStats(Backend& backend) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  return cuda_backend == nullptr ? CudaGraphStats{} : cuda_backend->graph_stats();
}

Status CudaCopyFromHost(Backend& backend, std::span<const float> host, const Tensor& dst) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  if (cuda_backend == nullptr) return Status::Error("CudaCopyFromHost: not a CUDA backend");
  CHECK(dst.dtype == DType::kF32 || dst.dtype == DType::kBF16) << DTypeName(dst.dtype);
  CHECK_EQ(static_cast<int64_t>(host.size()), dst.numel());
  cuda_backend->Flush();
  std::vector<uint16_t> bits;  // a bf16 destination: rounded RN on the host
  if (dst.dtype == DType::kBF16) {
    bits.resize(host.size());
    std::transform(host.begin(), host.end(), bits.begin(), F32ToBf16);
  }
  CUDA_CHECK(cudaMemcpyAsync(dst.data, bits.empty() ? static_cast<const void*>(host.data())
                                                    : static_cast<const void*>(bits.data()),
                             dst.nbytes(), cudaMemcpyHostToDevice, cuda_backend->stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_backend->stream()));
  return Status::Ok();
}

}  // namespace ember
