// CudaBackend, the class behind CreateCudaBackend (cuda_backend.h), internal to the CUDA backend.
// Its member functions are defined by concern: cuda_backend.cc (lifetime, weights, KV pool, rope
// tables, the step arena, the op profile), cuda_step_io.cc (the plan's upload, staging, ids and
// logits back to the host), cuda_matmul.cc (MatMul, MatMulGroup, GateUpActivation),
// cuda_lora.cc (LoRA slots and LoraDelta), cuda_kv_upload.cc (the prompt cache's staged block
// uploads),
// cuda_attention.cc (Rope, WriteKv, Attention and their fused forms), cuda_pointwise.cc (embedding,
// norms, activations, elementwise ops), cuda_moe.cc (MoeMlp). Every op CHECKs its shapes and
// records its launch (StepRecorder) with every value it depends on as the graph key; nothing
// reaches the GPU before Flush() (LoraDelta's row tables are staged on the host as the op is
// recorded and copied by Flush, in one upload ahead of the launches). Not thread-safe: one thread
// drives a backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_block_upload.h"
#include "backend/cuda/lora.h"
#include "backend/cuda/runtime_switches.h"
#include "backend/cuda/step_recorder.h"

namespace ember::cuda {

inline uint64_t U(int64_t v) {
  return static_cast<uint64_t>(v);
}
inline uint64_t U(OpKind kind) {
  return static_cast<uint64_t>(kind);
}
ElemType ToElemType(DType t);

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
  bool accumulate = false;  // out += x W^T (beta 1; never the skinny GEMM)
};

// A cuBLAS MatMul op: up to kMaxParts GEMMs of one x (the parts of a MatMulGroup: q/k/v,
// gate/up). The first part runs on the step's stream, the others on the side stream at the same
// time (the streams fork after x's conversion and join before the op ends). The small GEMMs of a
// decode step do not fill the GPU alone, so running them side by side takes less time than in a
// row (gemm_bench and a slightly faster decode, docs/perf.md).
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

// Which kernel a MatMul of one weight takes (CudaBackend::MatMulPathOf).
enum class MatMulPath : uint8_t {
  kGemv,       // one row: the bandwidth-bound GEMV (gemv.cu)
  kInvariant,  // the fixed-order tensor-core GEMM (gemm_invariant.cu)
  kCublas,     // cuBLAS, or the skinny wgmma GEMM (a CublasGroup)
};

// The GEMV / invariant-GEMM launch over the parts of one x that MatMulGroup is assembling.
struct PartsLaunch {
  MatMulPath path = MatMulPath::kGemv;
  const float* x = nullptr;
  int64_t n = 0, k = 0;
  void* scratch = nullptr;  // kInvariant: x in bf16 (GemmInvariantScratchBytes)
  size_t hint = 0;          // kGemv: this launch's entry of CudaBackend::gemv_next_
  int num_parts = 0;
  std::array<GemvPart, kGemvMaxParts> parts{};
  std::optional<GemvLora> lora;  // kGemv: a batch-1 LoRA update inside the launch
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& options, RuntimeSwitches switches);
  ~CudaBackend() override;

  std::string name() const override {
    return std::string("cuda:") + std::to_string(device_) + (f32_compute_ ? " (f32)" : " (bf16)");
  }
  cudaStream_t stream() const { return stream_.get(); }
  // Enqueues every recorded op (the host-visible sync points call this first).
  void Flush() {
    LoraSendStaged();  // the recorded LoraDelta ops' tables, ahead of their launches
    recorder_.Flush(use_graphs_ && max_query_len_ <= 1);
    gemv_next_.clear();  // the flushed launches are gone: a later GEMV is nobody's prefetch
  }
  const std::vector<StepRecorder::OpTime>& op_times() const { return recorder_.op_times(); }
  CudaGraphStats graph_stats() const {
    return {recorder_.graph_captures(), recorder_.graph_replays()};
  }
  // EMBER_CUDA_PROFILE_OUT: the op totals, after a line with the steps and rows they cover.
  void AppendOpProfile(const std::string& path) const;

  // ---- set-up (cuda_backend.cc) ----
  Result<Tensor> UploadWeight(const std::string& name, DType dtype, std::span<const int64_t> shape,
                              const void* host_data) override;
  Result<Tensor> UploadF32Weight(const std::string& name, std::span<const int64_t> shape,
                                 const float* host_data) override;
  Status AllocateKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                        int32_t num_kv_heads, int32_t head_dim) override;
  int64_t KvElementBytes(int32_t head_dim) const override { return KvBf16(head_dim) ? 2 : 4; }
  // KV-cache formats: per layer the pool's own type (bf16 or f32, as KvElementBytes says), int8,
  // fp8 or int4 (kv_quant.h rows, head-major within a block as on the CPU: kernels.h's
  // KvLayerView; int4 Hadamard-rotated unless the format says not). Other dtypes (f16, the other
  // of f32/bf16) are refused, naming the dtype and device.
  Status SetKvFormat(const KvFormat& format, int32_t head_dim) override;
  int64_t KvTokenBytes(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim) const override;
  std::string KvFormatText(int32_t head_dim) const override;
  // Block copies for the prompt cache (cuda_kv_upload.cc). To the host: on the step stream
  // (after the recorded ops and the staged uploads), one gather kernel, one copy and one wait per
  // 32 MiB of records. From the host: the record is staged in page-locked memory and returns at
  // once; the staged records go to the GPU as one copy and one scatter kernel when a staging half
  // fills, and before anything reads the pool (BeginStep, CopyKvBlocksToHost).
  int64_t KvBlockBytes() const override;
  Status CopyKvBlockToHost(int32_t block_id, std::span<uint8_t> out) override;
  Status CopyKvBlocksToHost(std::span<const int32_t> blocks,
                            std::span<const std::span<uint8_t>> outs) override;
  Status CopyKvBlockFromHost(int32_t block_id, std::span<const uint8_t> in) override;
  // The RAM tier's records: page-locked and mapped (cudaHostAlloc), so the gather writes into
  // them and the scatter reads from them over the bus, with no staging copy. CopyKvBlocksToHost
  // takes that path when every output lies in such memory; CopyKvBlockFromPinned queues the
  // block for the next send (SendKvUploads: after the staged half, before the step reads the
  // pool); PinnedReadsDone polls the event behind the last send's scatter.
  bool HasPinnedHost() const override { return true; }
  void* AllocPinnedHost(size_t bytes) override;
  void FreePinnedHost(void* p) override;
  Status CopyKvBlockFromPinned(int32_t block_id, std::span<const uint8_t> in) override;
  bool PinnedReadsDone(bool wait) override;
  Result<int32_t> CreateRope(const RopeSpec& spec) override;
  Tensor Alloc(std::initializer_list<int64_t> shape) override;
  Tensor AllocMatMulInput(std::initializer_list<int64_t> shape) override;
  Tensor AllocMatMulOutput(std::initializer_list<int64_t> shape) override;
  Result<BackendMemory> MemoryInfo() const override;
  std::span<float> HostBuffer(size_t count) override;
  // 1, 2, 4, 8, then every multiple of 8 to 256 (vLLM's buckets): at most 35 x 2 graphs (one per
  // staging half: the plan and ids buffers alternate), inside the recorder's cache of 128. Larger
  // decode steps are captured at their own size.
  std::vector<int32_t> DecodeGraphBuckets() const override;

  // ---- step input and output (cuda_step_io.cc) ----
  Status BeginStep(const BatchPlan& plan) override;
  void GatherLogitsRows(const Tensor& x, Tensor out) override;
  Status CopyToHost(const Tensor& t, std::span<float> out) override;
  std::string MtpUnsupported() const override { return ""; }
  Status CopyFromHost(std::span<const float> in, Tensor out) override;
  Status ZeroRows(Tensor x, std::span<const int32_t> rows) override;
  Status ApplyLogitEdits(Tensor x, std::span<const LogitEdit> edits) override;
  Status ApplyTokenMasks(Tensor x, std::span<const RowMask> masks) override;
  Status ArgmaxRows(const Tensor& x, std::span<int32_t> ids) override;
  Status SampleRows(const Tensor& x, std::span<const int32_t> rows,
                    std::span<const RowSampling> params, std::span<int32_t> ids) override;
  bool prefers_backend_sampling() const override { return true; }
  void DeferStepIds() override;
  void DropStepIds() override;
  Status WaitIds() override;

  // ---- matrix products (cuda_matmul.cc) ----
  void MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) override;
  void MatMulGroup(const Tensor& x, std::span<const MatMulPart> parts) override;
  void GateUpActivation(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                        GateActivation activation, Tensor gate, Tensor up, Tensor out) override;

  // ---- attention (cuda_attention.cc) ----
  void Rope(int32_t rope_id, Tensor q, Tensor k) override;
  void WriteKv(int32_t layer, const Tensor& k, const Tensor& v) override;
  void Attention(const AttentionParams& params, const Tensor& q, Tensor out) override;
  void RopeWriteKv(int32_t rope_id, int32_t layer, Tensor q, Tensor k, const Tensor& v) override;
  void RopeWriteKvAttention(int32_t rope_id, const AttentionParams& params, Tensor q, Tensor k,
                            const Tensor& v, Tensor out) override;

  // ---- pointwise and row-wise ops (cuda_pointwise.cc) ----
  void Embedding(const Tensor& table, float scale, Tensor out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
               Tensor out) override;
  void AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                  RmsNormKind kind, Tensor out) override;
  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void Add(const Tensor& a, const Tensor& b, Tensor out) override;
  void Softcap(Tensor x, float cap) override;

  // ---- LoRA adapters (cuda_lora.cc) ----
  std::string LoraUnsupported() const override { return ""; }
  Result<std::vector<Tensor>> UploadLoraSlot(int32_t slot,
                                             std::span<const LoraHostMatrix> matrices) override;
  void LoraDelta(const Tensor& x, std::span<const LoraSegment> segments, Tensor out) override;
  void LoraDeltaGroup(const Tensor& x, std::span<const LoraPart> parts) override;
  void MatMulGroupLora(const Tensor& x, std::span<const MatMulPart> parts,
                       std::span<const LoraPart> lora) override;
  void GateUpActivationLora(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                            GateActivation activation, Tensor gate, Tensor up, Tensor out,
                            std::span<const LoraPart> lora) override;

  // ---- mixture of experts (cuda_moe.cc) ----
  std::string MoeUnsupported(int32_t num_experts, int32_t top_k, int64_t d,
                             int64_t inter) const override;
  void MoeMlp(const Tensor& x, const MoeExperts& experts, Tensor out) override;
  bool TakesMxfp4Experts() const override { return !f32_compute_; }

  // ---- recurrent layers (cuda_recurrent.cc; recurrent.cu): state slots in one device buffer ----
  std::string RecurrentUnsupported() const override { return ""; }
  std::string StateSnapshotsUnsupported() const override { return ""; }
  Status AllocateStateSlots(int32_t num_slots, int64_t floats_per_slot) override;
  Status CopyStateSlot(int32_t src, int32_t dst) override;
  Status CopyStateSlotToHost(int32_t slot, std::span<uint8_t> out) override;
  Status CopyStateSlotFromHost(int32_t slot, std::span<const uint8_t> in) override;
  Status CausalConv1dSilu(Tensor x, const Tensor& weight, int64_t state_offset) override;
  Status GatedDeltaRule(const GatedDeltaParams& params, const Tensor& qkv, const Tensor& ba,
                        Tensor out) override;
  Status SigmoidGateMul(Tensor x, const Tensor& gate) override;

  // ---- multi-head latent attention (cuda_mla.cc; mla_attention.cu): the latent pool is the KV
  // pool with one f32 tensor per layer of [block_size, 1, latent + rope dims] rows ----
  Status AllocateLatentKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                              int32_t width) override;
  bool TakesMla() const override { return true; }
  void MlaAttention(int32_t rope_id, const MlaParams& params, Tensor q, const Tensor& c,
                    const Tensor& k_rope, Tensor out) override;

 private:
  // UploadWeight's copy: `host_data` (dtype) stored as `stored` on the device.
  Result<Tensor> UploadWeightAs(const std::string& name, DType dtype,
                                std::span<const int64_t> shape, const void* host_data,
                                DType stored);
  // ---- the step workspace (cuda_backend.cc) ----
  void* ArenaAlloc(size_t bytes);
  // An arena region that one op kind's calls of a step share (their launches run in stream
  // order): StepRegionOf hands out the step's region, allocating it at the step's first call and
  // again when a call needs more bytes than it holds.
  struct StepRegion {
    uint64_t step = 0;
    size_t bytes = 0;
    unsigned char* data = nullptr;
  };
  unsigned char* StepRegionOf(StepRegion& region, size_t bytes);
  Tensor AllocOf(DType dtype, std::initializer_list<int64_t> shape);
  // Whether a MatMul over `rows` rows takes the cuBLAS path with bf16 operands: then its x may be
  // a bf16 AllocMatMulInput buffer and its out a bf16 AllocMatMulOutput buffer (the GEMV and the
  // invariant GEMM read and write f32 rows).
  bool Bf16MatMulInput(int64_t rows) const {
    return !f32_compute_ && !batch_invariant_ && rows > kDecodeGemmMaxRows;
  }

  // ---- matrix products (cuda_matmul.cc) ----
  MatMulPath MatMulPathOf(const Tensor& x, const Tensor& weight) const;
  // Adds the part to `launch` (a GEMV / invariant-GEMM launch over x) or starts a new launch in
  // it (recording the one it held): the first part of a launch takes its scratch and, for the
  // GEMV, its prefetch entry.
  void AddToPartsLaunch(MatMulPath path, const Tensor& x, const GemvPart& part,
                        std::optional<PartsLaunch>& launch);
  void RecordPartsLaunch(const PartsLaunch& launch);
  // Adds the part to `group` (a cuBLAS op over x) when it can share its converted x, else records
  // the group held and starts a new one.
  void AddToCublasGroup(const Tensor& x, const Tensor& weight, const void* bias, Tensor out,
                        std::optional<CublasGroup>& group, bool accumulate = false);
  void RecordCublasGroup(const CublasGroup& g);
  // The checks MatMul makes of its operands; returns the product's rows.
  int64_t CheckMatMul(const Tensor& x, const Tensor& weight, const Tensor* bias,
                      const Tensor& out) const;
  void GatedActivation(const Tensor& gate, const Tensor& up, Tensor out, bool gelu);
  // Whether GateUpActivation runs as the one gated GEMV launch, and that launch (with biases:
  // f32 rows of gate's and up's width, or null).
  bool GatedGemvFits(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& gate,
                     const Tensor& up, const Tensor& out) const;
  void RecordGatedGemv(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                       GateActivation activation, Tensor gate, Tensor up, Tensor out,
                       const float* bias_gate, const float* bias_up,
                       const GemvLora* lora = nullptr);
  void RecordGemvWithLora(const Tensor& x, std::span<const MatMulPart> parts, const GemvLora& lora);

  // ---- LoRA (cuda_lora.cc) ----
  // The slot whose storage holds `p` (a matrix UploadLoraSlot made); `hint` is tried first.
  int32_t LoraSlotOf(const void* p, int32_t hint) const;
  // Appends `bytes` to the step's staged LoRA tables; returns their device address (valid for
  // the step; the bytes reach it at the next Flush, ahead of the launches recorded before it).
  void* LoraStage(const void* src, size_t bytes);
  void LoraSendStaged();
  // LoraDeltaGroup's work; bases non-null: each part's out = bases[p] (a row, or null: zeros) +
  // its update, for every row (LoraDeltaArgs::overwrite).
  void LoraUpdate(const Tensor& x, std::span<const LoraPart> parts, const float* const* bases);
  void RecordLoraDelta(const Tensor& x, std::span<const LoraPart> parts, DType wdtype, bool x_vec,
                       bool w_vec, const float* const* bases);
  struct LoraTables {
    DType wdtype = DType::kF32;
    bool x_vec = false, w_vec = false;  // LoraDeltaArgs's
  };
  LoraTables BuildLoraTables(const Tensor& x, std::span<const LoraPart> parts);
  const int32_t* StageLoraRows();
  std::optional<GemvLora> StageGemvLora(const Tensor& x, std::span<const LoraPart> lora,
                                        std::span<float* const> outs);
  // Whether `seg` of a LoraDeltaGroup over x takes cuBLAS GEMMs (RecordLoraGemms): at least
  // switches_.lora_gemm_rows rows, where the base MatMuls are cuBLAS's (bf16 x and weights).
  bool LoraGemmSegment(const Tensor& x, const LoraSegment& seg) const;
  bool RecordLoraGemms(const Tensor& x, std::span<const LoraPart> parts, LoraPart* rest);
  // The call as GEMMs over the stacks of its parts' sites (lora_stacks_); false, nothing
  // recorded, where it does not fit (EMBER_LORA_STACKED_ROWS, bf16 x, every segment stacked).
  // overwrite: out = the update for every row (beta 0; 0 for rows without one), every part
  // stacked, for a MatMul that then adds x W^T (MatMulGroupAfterLora).
  bool RecordLoraStacked(const Tensor& x, std::span<const LoraPart> parts, bool overwrite = false);
  // MatMulGroupLora of EMBER_LORA_UPDATE_FIRST_ROWS rows or more: the stacked update written
  // into the outputs first, then the cuBLAS GEMMs adding x W^T to it (beta 1), so the outputs
  // are read once, inside the compute-bound GEMM; false, nothing recorded, where it does not fit.
  bool MatMulGroupAfterLora(const Tensor& x, std::span<const MatMulPart> parts,
                            std::span<const LoraPart> lora);
  // MatMulGroup; accumulate (null: none) marks the parts whose out already holds an addend.
  void RecordMatMulGroup(const Tensor& x, std::span<const MatMulPart> parts,
                         const bool* accumulate);
  // Lays lora_stacks_ out again for the slots' matrices (lora_slot_matrices_) where their sites,
  // ranks or slot count changed, else rewrites `slot`'s columns only. Device-synchronous.
  void UpdateLoraStacks(int32_t slot);

  // ---- attention (cuda_attention.cc) ----
  cuda::KvLayerView KvLayer(int32_t layer, int32_t num_kv_heads, int32_t head_dim) const;
  // Bytes of one block of `layer`'s K (or V) tensor: block_size x kv_heads rows of its dtype.
  int64_t KvLayerBlockBytes(int32_t layer) const;
  // The KV pool is bf16 in the bf16 mode when the batch-invariant attention kernel serves the
  // head dim (it rounds K/V to bf16 RN anyway; the f32 kernels read f32 pools), unless kv_f32.
  bool KvBf16(int32_t head_dim) const {
    return !f32_compute_ && !kv_f32_ && AttentionInvariantSupported(head_dim);
  }
  // Rope's checks; returns its rope table and q's heads.
  const DeviceRope& CheckRope(int32_t rope_id, const Tensor& q, const Tensor& k,
                              int32_t* num_heads) const;
  void CheckWriteKv(const Tensor& k, const Tensor& v) const;
  // An Attention call's checked operands.
  struct AttentionCall {
    AttentionArgs args;
    KvLayerView kv;
    const float* q = nullptr;
    float* out = nullptr;
  };
  AttentionCall PrepareAttention(const AttentionParams& params, const Tensor& q,
                                 const Tensor& out) const;
  // The step's launches of the invariant attention, one per run of one block shape (empty: one
  // launch for the whole step).
  std::vector<AttentionRun> AttentionRuns(const AttentionArgs& args) const;
  // The batch-invariant attention; with `rope`, as one launch that also rotates q and k and
  // writes k and v (the caller checked AttentionInvariantCanFuseRope and a single run).
  void AttentionInvariant(const AttentionCall& call, const RopeKvInput* rope);
  void AttentionInvariantLaunch(const AttentionCall& call, const PlanView& plan,
                                int32_t max_query_len, int32_t splits, float* partials);
  void AttentionF32(const AttentionParams& params, const AttentionCall& call);
  // dst [rows, n] = H src per row (LaunchHadamardRows): an int4-rotated layer's q and output.
  void RecordHadamardRows(const float* src, float* dst, int64_t rows, int32_t n);

  // The pool's geometry once kv_dtypes_ and the layer count are set: kv_layer_offset_ for
  // `tensors` tensors per layer (2: K and V; 1: the latent pool), then the zeroed allocation.
  Status AllocatePool(int32_t num_layers, int32_t num_blocks, int32_t tensors);

  // ---- mixture of experts (cuda_moe.cc) ----
  // Whether MoeMlp runs the experts on tensor cores (moe.cu): in the bf16 mode, with
  // batch_invariant for every step (one path for every step size), else where
  // cuda::MoeMmaPays (small steps run faster on the SIMT kernels); switches_.moe_mma forces it.
  bool MoeOnTensorCores(int64_t rows, int32_t top_k, int32_t num_experts, bool mxfp4) const;
  void CheckMoeMlp(const Tensor& x, const MoeExperts& experts, const Tensor& out) const;
  // The device table of an expert set's weight pointers (uploaded at its first use).
  const DeviceBuffer& MoeTable(const MoeExperts& experts, int64_t d, int64_t inter);
  // Points a's scratch buffers into the step arena (shared by the step's MoE layers).
  void MoeScratch(MoeArgs& a, int64_t rows, int64_t d, int64_t inter);

  // ---- step input and output (cuda_step_io.cc) ----
  // Grows both step_ids_ buffers to `rows` ids (waits for the streams; their ids are kept).
  void EnsureStepIds(int64_t rows);
  // Stages the plan (plan_host_, plan_) and uploads it into the current half's plan_device_.
  void UploadStepPlan(const BatchPlan& plan);
  void GrowPlanBuffers(const BatchPlan& plan);
  // Waits for the stream and both copy streams.
  void SyncAllStreams();
  struct StagingHalf;
  // Where `bytes` go in h.upload (bump allocation; grows it, after SyncAllStreams, when full).
  size_t StageOffset(StagingHalf& h, size_t bytes);
  // Copies `bytes` from the host to `dst` on the stream through the current half (the call does
  // not wait for the device).
  void Upload(void* dst, const void* src, size_t bytes);
  // Reserves `bytes` of the current half for the caller to fill (an upload gathered from several
  // places) and copy from before anything else is staged.
  unsigned char* Stage(size_t bytes);
  // Copies the plan (plan_host_'s first `bytes`) into the current half's plan_device_ on
  // upload_stream_; the stream waits for it.
  void UploadPlan(size_t bytes);
  // Copies the step's first `rows` ids back into the current half's ids (on ids_stream_, behind
  // the step's ops); returns them. Read them after WaitIdsCopied().
  const int32_t* CopyIdsBack(int64_t rows);
  void WaitIdsCopied();
  struct IdsDelivery;
  IdsDelivery& StepDelivery();

  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  static constexpr int32_t kMaxGraphBucket = 256;
  // ArgmaxRows's split shape (ArgmaxScratch): steps of up to kArgmaxSplitRows rows of up to
  // kArgmaxSplitChunks * 2,048 columns; float maxima, int32 indices, then the zeroed counters.
  static constexpr int32_t kArgmaxSplitRows = 32;
  static constexpr int32_t kArgmaxSplitChunks = 128;

  // ---- settings ----
  int device_;
  bool f32_compute_;
  bool use_graphs_;
  // bf16 mode: MatMul in one reduction order per row (gemm_invariant.cu), in every step
  // (always_invariant_: CudaBackendOptions::batch_invariant) or in this one (BatchPlan::
  // batch_invariant, set by BeginStep).
  const bool always_invariant_;
  bool batch_invariant_;
  bool kv_f32_;           // tests: an f32 KV pool in the bf16 mode too
  RuntimeSwitches switches_;
  int num_sms_ = 132;
  bool warned_attention_variant_ = false;  // logged once: no invariant kernel for head_dim

  // ---- streams, handles and the recorder ----
  Stream stream_;
  CublasHandle cublas_;
  StepRecorder recorder_;
  DeviceBuffer cublas_workspace_;
  // The second stream of a MatMulGroup's cuBLAS op (CublasGroup): its own cuBLAS handle and
  // workspace; fork_ and join_ order it after the group's x and before the group's readers.
  Stream side_stream_;
  CublasHandle cublas_side_;
  DeviceBuffer cublas_side_workspace_;
  Event fork_, join_;
  // The plan's upload and the ids' copy back run on streams of their own, off the step's critical
  // path: a decode step's plan (into its half's plan_device_, free once the step two back has
  // ended) is copied while the step before it still computes, and its ids go to the host while the
  // next step computes. Between two decode graphs the stream then only waits on events.
  Stream upload_stream_, ids_stream_;

  // ---- weights, rope tables, KV pool ----
  std::vector<DeviceBuffer> weights_;
  std::vector<DeviceRope> ropes_;
  // KV pool: per layer K then V, each num_blocks blocks of KvLayerBlockBytes: [block_size,
  // num_kv_heads, head_dim] bf16 (KvBf16(kv_head_dim_)) or f32, or a quantized layer's
  // [num_kv_heads, block_size] rows (kv_dtypes_). Layer l's K starts at kv_layer_offset_[l].
  DeviceBuffer kv_pool_;
  std::vector<KvDType> kv_dtypes_;  // per layer, resolved (no kAuto); empty: never set
  bool kv_rotate_int4_ = true;      // int4 layers hold Hadamard-rotated rows (KvFormat)
  std::vector<size_t> kv_layer_offset_;
  int32_t kv_layers_ = 0, kv_blocks_ = 0, kv_block_size_ = 0, kv_heads_ = 0, kv_head_dim_ = 0;
  int32_t kv_tensors_ = 2;  // per layer: K and V; 1 for the latent pool (AllocateLatentKvPool)
  // Recurrent state slots (AllocateStateSlots): [state_slots_, state_floats_] f32.
  DeviceBuffer state_;
  int32_t state_slots_ = 0;
  int64_t state_floats_ = 0;
  // MoeMlp: per expert set (keyed by its first gate weight) the device arrays of the experts'
  // gate, up and down pointers (then scale and bias pointers), uploaded at its first use.
  std::vector<std::pair<const void*, DeviceBuffer>> moe_tables_;
  // MoeMlp's scratch (route, schedule, activations): one arena region per step, shared by the
  // step's MoE layers (their launches run in stream order), grown when a layer needs more.
  StepRegion moe_scratch_;
  // MlaAttention's tensor-core path: q_lat and o_lat of one chunk of tokens (bf16).
  StepRegion mla_scratch_;

  // ---- prompt-cache block uploads (cuda_kv_upload.cc) ----
  // Sends what is queued for the pool: the current half's staged records (SendStagedUploads: one
  // copy, one ScatterKvBlocks, then the halves switch), then the page-locked queue
  // (SendPinnedUploads).
  void SendKvUploads();
  void SendStagedUploads();
  // The pool's segment table (one per layer's K and V, in the record's order).
  void FillKvSegments(KvBlockSegment* segments) const;
  // Two page-locked halves, each up to kv_upload_capacity_ records of kv_upload_record_bytes_,
  // then their block ids and the pool's segment table; `sent` is recorded behind the half's
  // scatter, so the half is refilled only once the GPU has read it.
  struct KvUploadHalf {
    PinnedBytes bytes;
    std::vector<int32_t> blocks;  // staged block ids, in record order
    Event sent;
  };
  std::array<KvUploadHalf, 2> kv_upload_;
  int kv_upload_half_ = 0;
  size_t kv_upload_record_bytes_ = 0, kv_upload_capacity_ = 0;
  DeviceBuffer kv_upload_device_;           // one half's bytes (the halves take turns, in order)
  std::vector<int32_t> kv_upload_index_;    // by block id: 1 + its record in the current half
  // CopyKvBlocksToHost's staging (the upload half's layout: records, block ids, segments).
  PinnedBytes kv_download_host_;
  DeviceBuffer kv_download_device_;
  // CopyKvBlockFromPinned's queue: blocks and their records' device addresses, sent after the
  // staged half by SendKvUploads; `table` (page-locked) and `device` hold a send's addresses, ids
  // and segments; `read` is recorded behind its scatter (the table is rewritten after it).
  struct KvPinnedUploads {
    std::vector<int32_t> blocks;
    std::vector<const unsigned char*> records;
    PinnedBytes table;
    DeviceBuffer device;
    Event read;
  };
  KvPinnedUploads kv_pinned_;
  std::vector<int32_t> kv_pinned_index_;  // by block id: 1 + its entry in kv_pinned_.blocks
  // Sends kv_pinned_'s queue (one table copy, one scatter from host memory).
  void SendPinnedUploads();
  // A table for records that lie elsewhere (page-locked host records): their device addresses,
  // the block ids and the pool's segments, written into `host` and copied to `device` (both
  // grown; `host` must be free: its previous copy complete) on the step stream. The device
  // pointers of its three parts.
  struct KvAddressTable {
    unsigned char* const* records;
    const int32_t* blocks;
    const KvBlockSegment* segments;
  };
  KvAddressTable UploadKvAddressTable(std::span<const unsigned char* const> records,
                                      std::span<const int32_t> blocks, PinnedBytes& host,
                                      DeviceBuffer& device);

  // ---- LoRA adapters ----
  std::vector<DeviceBuffer> lora_slots_;  // by LoraSet slot: its matrices (UploadLoraSlot)
  // GemvLora::sync: kGemvLoraSyncPairs counter pairs (zeroed once, zero between launches), the
  // step's n-th fused launch taking pair n.
  static constexpr size_t kGemvLoraSyncPairs = 1024;
  DeviceBuffer gemv_lora_sync_;
  uint64_t gemv_lora_step_ = 0;
  size_t gemv_lora_launches_ = 0;
  int32_t lora_rank_cap_ = 0;             // the largest rank a LoraDelta has seen (grids, t)
  // LoraDelta's tables for one call: row -> slot (-1 none) and per part and slot its LoraEntry.
  std::vector<int32_t> lora_rows_;
  std::vector<LoraEntry> lora_entries_;
  // Per segment index (parts in order), the slot found last: BuildLoraTables's lookup hint, and
  // RecordLoraStacked's record of each segment's slot between its two passes.
  std::vector<int32_t> lora_seg_slot_;
  // RecordLoraGemms: per part, the segments it leaves to the BGMV kernels.
  std::array<std::vector<LoraSegment>, kMaxLoraKernelParts> lora_rest_;
  // The step's staged tables: an arena region (lora_stage_dev_) and its host image; LoraStage
  // appends, LoraSendStaged (Flush) uploads what was appended since. The region is sized from
  // the largest step so far (a power of two), so a step of the same shape stages at the same
  // addresses.
  uint64_t lora_stage_step_ = 0;
  unsigned char* lora_stage_dev_ = nullptr;
  std::vector<unsigned char> lora_stage_host_;
  size_t lora_stage_cap_ = 0, lora_stage_used_ = 0, lora_stage_sent_ = 0;
  size_t lora_stage_total_ = 0, lora_stage_hint_ = 0;
  // The last row table staged this step (a call with the same rows reuses it).
  std::vector<int32_t> lora_staged_rows_;  // lora_rows_, then the rows' order (StageLoraRows)
  std::vector<int32_t> lora_order_first_;  // StageLoraRows's counting sort
  std::vector<int32_t> lora_last_rows_;
  const int32_t* lora_last_rows_dev_ = nullptr;
  std::vector<uint64_t> lora_key_;  // LoraDelta's graph key
  // LoraDelta's t [rows, parts * lora_rank_cap_] f32: one arena region per step, shared by its
  // calls.
  StepRegion lora_t_;
  // The stacked form (RecordLoraStacked): per site (a projection, LoraHostMatrix::site), every
  // slot's a and b side by side in bf16, copied from the slots' storage: a [slots * rank, k]
  // (slot s's rows from s * rank), b [m, slots * rank] (its columns from s * rank), zero where a
  // slot's rank is smaller or it has no matrix for the site; rank the largest slot rank rounded
  // up to 8. Kept in site order, a stacks before b stacks, so the a stacks of consecutive sites
  // (q, k, v) are adjacent. Empty in the f32 mode and where device memory is short.
  struct LoraSlotMatrix {
    int64_t site;
    const void* a;
    const void* b;
    int32_t rank;
    int64_t k, m;
  };
  std::vector<std::vector<LoraSlotMatrix>> lora_slot_matrices_;  // by slot: its sited matrices
  struct LoraStack {
    int64_t site, k, m;
    unsigned char* a;
    unsigned char* b;
  };
  std::vector<LoraStack> lora_stacks_;
  DeviceBuffer lora_stack_buffer_;
  int32_t lora_stack_slots_ = 0, lora_stack_rank_ = 0;
  struct LoraStackRef {
    int32_t stack, slot;
  };
  std::unordered_map<const void*, LoraStackRef> lora_stack_of_;  // a slot matrix's a -> its stack
  std::vector<int32_t> lora_part_rows_;  // RecordLoraStacked's [part][row] slots
  // Per part count, the step's last staged table (a call with the same table reuses it).
  struct LoraStagedPartRows {
    uint64_t step = 0;
    std::vector<int32_t> rows;
    const int32_t* dev = nullptr;
  };
  std::array<LoraStagedPartRows, kMaxLoraKernelParts> lora_part_rows_staged_;
  StepRegion lora_tb_;  // its masked t, bf16

  // ---- the step: plan, workspace, ids ----
  // The step's plan: host staging, device copy and the host facts launches need.
  // Fixed-capacity regions so the device addresses (baked into graphs) only change on growth.
  std::vector<int32_t> plan_host_;
  int64_t plan_cap_tokens_ = 0, plan_cap_seqs_ = 0, plan_cap_tables_ = 0;
  std::array<DeviceBuffer, 2> plan_device_;  // by staging half
  PlanView plan_;
  int32_t max_query_len_ = 0;
  int32_t max_context_len_ = 0;
  bool state_slots_shared_ = false;  // two of the step's sequences share a state slot
  std::vector<int32_t> query_lens_;  // the step's rows per sequence (host copy of the plan's)
  bool in_step_ = false;
  uint64_t steps_begun_ = 0;
  int64_t profiled_rows_ = 0;  // the rows of the steps begun (steps_begun_)
  // Step workspace: bump allocation over chunks; merged into one chunk at BeginStep.
  std::vector<DeviceBuffer> arena_chunks_;
  size_t arena_offset_ = 0;  // into arena_chunks_.back()
  // The invariant GEMM's bf16 copy of x (GemmInvariantScratchBytes): one arena buffer per step,
  // shared by the step's launches (all on the main stream, in order; each converts its x after
  // the launch before it ends) and replaced by a larger one where a launch needs more. Without
  // the sharing a batch-invariant 8,192-row step of an 8B model took ~14 GB of scratch.
  void* gemm_scratch_ = nullptr;
  size_t gemm_scratch_bytes_ = 0;
  // Per GEMV launch recorded since the last Flush, in order: its prefetch target (the next
  // GEMV launch's weights; the last one's stays empty). A launch reads its entry at Flush, after
  // the whole step is recorded.
  std::vector<GemvPrefetch> gemv_next_;

  DeviceBuffer sample_args_;  // SampleRows' params + rows, grown on demand
  DeviceBuffer logit_edits_;  // ApplyLogitEdits' edits, grown on demand
  // ApplyTokenMasks' rows then bits, by staging half (uploaded on upload_stream_ beside the
  // step's forward, once the half's last mask kernel has read the buffer), grown on demand.
  std::array<DeviceBuffer, 2> token_masks_;
  DeviceBuffer argmax_scratch_;
  // The ids ArgmaxRows / SampleRows make, by logits row: [plan_cap_tokens_] int32, one buffer per
  // staging half (a step writes its half's, and its embedding reads the previous step's as
  // plan_.fed_ids), at fixed addresses (the decode graphs hold them): so the copy of a step's ids
  // to the host can run beside the next step, which writes the other buffer.
  std::array<DeviceBuffer, 2> step_ids_;
  // Page-locked memory of alternate steps (half_ is the current step's): the sources of the
  // step's uploads (plan, sampling parameters, logit edits, token masks; bump-allocated) and its
  // ids copied back. `copied` is recorded on the stream behind the half's last upload,
  // `ids_copied` on ids_stream_ behind its ids' copy: the next step may fill the other half while
  // this one's copies are still queued, which lets a step launch before the host has read the
  // previous step's ids. `step_end` marks the end of the half's step on the stream (recorded when the
  // next step begins), `uploaded` its plan's upload, `masks_uploaded` its token masks' upload
  // and `masks_read` their kernel (token_masks_), `ids_ready` its ids.
  struct StagingHalf {
    PinnedBytes upload;
    size_t used = 0;
    PinnedBytes ids;
    Event copied, ids_copied, step_end, uploaded, masks_uploaded, masks_read, ids_ready;
  };
  std::array<StagingHalf, 2> staging_;
  int half_ = 0;
  // Deferred ids (DeferStepIds): what WaitIds fills for each step, oldest first.
  struct IdsDelivery {
    int half = 0;
    std::span<int32_t> argmax;   // ArgmaxRows: every row
    std::span<int32_t> sampled;  // SampleRows: sampled[r] for r in sample_rows
    std::vector<int32_t> sample_rows;
  };
  std::deque<IdsDelivery> deliveries_;
  bool defer_ids_ = false;                 // the current step's ids go to deliveries_
  uint64_t delivery_step_ = ~uint64_t{0};  // the step deliveries_.back() belongs to
  // HostBuffer's page-locked memory (device-to-host copies at full speed), grown on demand.
  PinnedBytes host_buffer_;
};

}  // namespace ember::cuda
