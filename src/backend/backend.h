// Backend: the ops-level interface every compute backend (CPU, CUDA) implements. A model's
// architecture file describes its forward pass as a sequence of these ops over opaque Tensor
// handles; the backend owns all memory (weights, KV pool, per-step workspace) and may run ops
// asynchronously — the host never reads device data mid-forward, only via CopyLogitsToHost at the
// end of a step. Invariants: weights are uploaded once before the first step; BeginStep is called
// exactly once per step with that step's BatchPlan and every op of the step reads it implicitly
// (token ids, positions, slot mapping, block tables, logits rows). Not thread-safe: one thread
// (the engine thread) drives a backend.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/batch_plan.h"
#include "backend/kv_format.h"
#include "backend/logit_edit.h"  // LogitEdit, ApplyLogitEdit (Backend::ApplyLogitEdits)
#include "util/status.h"

namespace ember {

// kU8: packed checkpoint bytes (MXFP4 blocks and scales), read by the loader, never a backend
// tensor. kQ8_0, kQ4_0: block-quantized weight matrices in ggml's layouts (blocks of 32 values
// along a row; Q8_0 = f16 scale d + 32 int8, value q * d, 34 bytes; Q4_0 = f16 scale d + 16
// bytes of nibbles, element j in the low nibble of byte j and j + 16 in its high nibble, value
// (q - 8) * d, 18 bytes). kQ4_K, kQ5_K, kQ6_K: ggml's k-quants, super-blocks of 256 values
// (Q4_K 144 bytes, Q5_K 176, Q6_K 210; layouts in backend/cpu/matmul_kquant.h). Only as weights
// of backends that take them (TakesQuantizedWeights), with a row length that is a multiple of
// the block (DTypeBlockValues: 32, or 256 for the k-quants).
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kU8, kQ8_0, kQ4_0, kQ4_K, kQ5_K, kQ6_K };

// Bytes per element; CHECK-fails for block-quantized types (use DTypeRowBytes).
size_t DTypeSize(DType dtype);
// "F32", "F16", "BF16", "I32", "U8" (safetensors spelling), "Q8_0", "Q4_0", "Q4_K", ... (GGUF's).
const char* DTypeName(DType dtype);
bool IsBlockQuantized(DType dtype);  // kQ8_0, kQ4_0, kQ4_K, kQ5_K, kQ6_K
bool IsKQuant(DType dtype);          // kQ4_K, kQ5_K, kQ6_K
// Values per block of a block-quantized type (32; 256 for the k-quants); 1 otherwise.
int64_t DTypeBlockValues(DType dtype);
// Bytes of a row of `cols` elements (cols % DTypeBlockValues == 0; CHECKed).
size_t DTypeRowBytes(DType dtype, int64_t cols);

// A handle to backend-owned memory: row-major, contiguous, up to 4 dims. Copying a Tensor copies
// the handle, not the data. For a CPU backend `data` is a host pointer (for weights: straight
// into the checkpoint's mmap); for a GPU backend a device pointer the host must not dereference.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int32_t ndim = 0;
  std::array<int64_t, 4> shape{};

  int64_t dim(int32_t i) const { return shape[static_cast<size_t>(i)]; }
  int64_t numel() const;
  int64_t rows() const { return numel() / cols(); }  // product of all but the last dim
  int64_t cols() const { return ndim == 0 ? 1 : shape[static_cast<size_t>(ndim - 1)]; }
  size_t nbytes() const { return static_cast<size_t>(rows()) * DTypeRowBytes(dtype, cols()); }
  // Same data viewed with another shape (numel must match; CHECKed).
  Tensor Reshape(std::initializer_list<int64_t> new_shape) const;
  // Rows [first, first + count) of a tensor viewed as [rows(), cols()] (a view, no copy).
  Tensor RowSlice(int64_t first, int64_t count) const;
};

std::string ShapeString(const Tensor& t);  // e.g. "[512, 64]"

// One sampled row's parameters for Backend::SampleRows (the host sampler's semantics; see
// backend/threshold_sampling.h): temperature > 0; top_k <= 0, top_p >= 1, min_p <= 0 are off;
// u is the request's uniform draw in [0, 1) for this token.
struct RowSampling {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double u = 0.0;
};

// One row's allowed-token mask for Backend::ApplyTokenMasks: `bits` [ceil(cols / 32)], bit
// t % 32 of word t / 32 is 1 where token t is allowed (TokenMaskAllows, logit_edit.h); the bits
// past the last column are ignored. The span borrows the caller's words for the call.
struct RowMask {
  int32_t row = 0;
  std::span<const uint32_t> bits;
};

struct BackendMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
  bool device = false;  // true: dedicated accelerator memory (budgeted by a fraction of total)
};

// How to turn positions into rotation angles. Built once into a cos/sin table of
// [max_positions, rotary_dim / 2].
struct RopeSpec {
  enum class Type { kDefault, kLinear, kLlama3, kYarn };
  Type type = Type::kDefault;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;  // <= head_dim; the first rotary_dim dims rotate (partial rotary)
  double theta = 10000.0;
  double factor = 1.0;             // kLinear, kLlama3
  double low_freq_factor = 1.0;    // kLlama3
  double high_freq_factor = 4.0;   // kLlama3
  int32_t original_max_positions = 8192;  // kLlama3, kYarn: the pre-extension context
  double beta_fast = 32.0, beta_slow = 1.0;  // kYarn: the correction range, in rotations
  bool truncate = true;            // kYarn: round the correction range out to whole dims
  double attention_factor = 1.0;   // every type: cos and sin are multiplied by it (YaRN's mscale)
  int32_t max_positions = 0;       // table length; positions >= this are a CHECK failure
  // Empty, or [rotary_dim / 2] divisors applied to each inverse frequency after the type's scaling
  // (a GGUF file's rope_freqs.weight: llama.cpp stores Llama 3.1's scaling that way).
  std::vector<float> freq_factors;
};

struct AttentionParams {
  int32_t layer = 0;             // which layer's K/V in the pool
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;      // num_heads % num_kv_heads == 0 (GQA)
  int32_t head_dim = 0;
  float scale = 1.0f;            // usually 1/sqrt(head_dim); gemma: query_pre_attn_scalar^-0.5
  int32_t sliding_window = 0;    // 0: full causal; W: key pos k visible from q iff q - k < W
  float softcap = 0.0f;          // 0: none; else scores = softcap * tanh(scores / softcap)
  // Learned attention sinks (gpt_oss): [num_heads] float32 logits, or null. Head h's softmax
  // gains a term exp(sinks[h]) in its denominator (a key every row sees, with no value), so the
  // weights of the real keys sum to less than 1. Compared with the scaled (and capped) scores.
  const Tensor* sinks = nullptr;
};

// Multi-head latent attention (Backend::MlaAttention, deepseek_v3). Per head h the query is
// [q_nope (nope_dim) | q_rope (rope_dim)], the key [k_nope_h | k_rope] and the value v_h, where
// k_nope_h = W_uk[h] c and v_h = W_uv[h] c expand a token's latent c [latent_dim] (kv_b_proj's
// rows: head h's nope_dim W_uk rows, then its v_dim W_uv rows) and k_rope [rope_dim] is one
// roped key shared by every head. The pool keeps only [c | k_rope] per token and layer.
struct MlaParams {
  int32_t layer = 0;
  int32_t num_heads = 0;
  int32_t nope_dim = 0, rope_dim = 0, v_dim = 0, latent_dim = 0;
  float scale = 1.0f;             // softmax scale of q . k
  bool rope_interleave = false;   // rope dims (of q and k) as pairs: de-interleaved, then rotated
  const Tensor* kv_b = nullptr;   // [num_heads * (nope_dim + v_dim), latent_dim] float32
};

// One gated DeltaNet layer's recurrence (Backend::GatedDeltaRule; qwen3_next's linear attention).
// Key head kh serves value heads [kh * r, (kh + 1) * r), r = num_v_heads / num_k_heads.
struct GatedDeltaParams {
  int32_t num_k_heads = 0, num_v_heads = 0, k_head_dim = 0, v_head_dim = 0;
  const Tensor* a_log = nullptr;    // [num_v_heads] float32
  const Tensor* dt_bias = nullptr;  // [num_v_heads] float32
  // Where this layer's matrices [num_v_heads, k_head_dim, v_head_dim] start in a state slot, in
  // floats (Backend::AllocateStateSlots).
  int64_t state_offset = 0;
};

enum class RmsNormKind { kPlain, kOnePlusWeight };  // y = x/rms * w   or   x/rms * (1 + w)

// The gated activation of a dense MLP (Backend::GateUpActivation): SiluMul or GeluTanhMul.
enum class GateActivation : uint8_t { kSilu, kGeluTanh };

// One product of Backend::MatMulGroup: out = x weight^T (+ bias), as MatMul's arguments.
struct MatMulPart {
  const Tensor* weight = nullptr;
  const Tensor* bias = nullptr;  // or null
  Tensor out;
};

// One row segment of Backend::LoraDelta: rows [first_row, first_row + rows) take one LoRA
// adapter's update out += (x a^T) b^T, a [rank, k] and b [m, rank] float32 weights (the adapter's
// scale folded into b).
struct LoraSegment {
  int64_t first_row = 0, rows = 0;
  const Tensor* a = nullptr;
  const Tensor* b = nullptr;
};

// One output of Backend::LoraDeltaGroup: out += its segments' updates of the group's x.
struct LoraPart {
  std::span<const LoraSegment> segments;
  Tensor out;
};
constexpr size_t kMaxLoraParts = 3;  // the most parts of one LoraDeltaGroup (q, k, v)

// One float32 host matrix [rows, cols] of a LoRA slot's upload (Backend::UploadLoraSlot).
// site: which projection the matrix adapts, the same number in every slot (LoraSet: layer * 7 +
// target; -1 unknown). A backend may keep each site's matrices of every slot side by side (CUDA's
// stacks); a matrix of site -1 is applied on its own.
struct LoraHostMatrix {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t site = -1;
};

// The gated activation of an expert, act(g, u) for its gate and up values.
enum class MoeActivation : uint8_t {
  kSilu,           // silu(g) * u
  kClampedSwiglu,  // gpt_oss: g' = min(g, limit), u' = clamp(u, -limit, limit),
                   // act = (u' + 1) * g' * sigmoid(alpha * g')
};

// How a router's logits choose and weight the experts (moe_route.h).
enum class MoeRouting : uint8_t {
  kSoftmax,         // MoeRoute: softmax, top k, optionally renormalised
  kSigmoidGrouped,  // MoeRouteGrouped (deepseek_v3): sigmoid scores, biased choice in groups
};

// One mixture-of-experts MLP (Backend::MoeMlp): the router [num_experts, d] scores the experts
// of a row x (logits router x (+ router_bias), in float32), expert e maps it to
// down[e] act(gate[e] x + gate_bias[e], up[e] x + up_bias[e]) + down_bias[e];
// gate[e], up[e] [inter, d], down[e] [d, inter]; biases float32 [inter], [inter], [d].
struct MoeExperts {
  Tensor router;
  std::optional<Tensor> router_bias;   // [num_experts] (gpt_oss)
  std::vector<Tensor> gate, up, down;  // one per expert
  std::vector<Tensor> gate_bias, up_bias, down_bias;  // empty, or one per expert (gpt_oss)
  // MXFP4 experts kept packed (Backend::TakesMxfp4Experts; gpt-oss checkpoints): gate/up/down are
  // kU8 [out, in / 2] (two FP4 E2M1 values per byte, low nibble first) and these kU8
  // [out, in / 32] (each block of 32 values times 2^(scale - 127)). Empty otherwise.
  std::vector<Tensor> gate_scales, up_scales, down_scales;
  MoeActivation activation = MoeActivation::kSilu;
  float swiglu_limit = 7.0f;   // kClampedSwiglu
  float swiglu_alpha = 1.702f;  // kClampedSwiglu
  int32_t top_k = 0;           // experts per row
  bool normalize = false;      // renormalise the top k probabilities to sum 1
  // kSigmoidGrouped (MoeRouteGrouped's parameters): score_bias [num_experts] float32
  // (e_score_correction_bias), `groups` groups of which the best `top_groups`, weights * scale.
  MoeRouting routing = MoeRouting::kSoftmax;
  std::optional<Tensor> score_bias;
  int32_t groups = 1, top_groups = 1;
  float scale = 1.0f;
  bool biased() const { return !gate_bias.empty(); }
  bool mxfp4() const { return !gate_scales.empty(); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- set-up (before the first step) ----
  // Makes `host_data` (dtype, shape; row-major) available as a weight. The CPU backend keeps the
  // pointer (it must outlive the backend: the model keeps the mmap); a GPU backend copies.
  // kU8 data (packed MXFP4 experts, TakesMxfp4Experts) stays bytes.
  virtual Result<Tensor> UploadWeight(const std::string& name, DType dtype,
                                      std::span<const int64_t> shape, const void* host_data) = 0;
  // A float32 weight that an own kernel reads as float32 whatever its shape (the conv taps of
  // CausalConv1dSilu, MLA's kv_b): unlike UploadWeight, a GPU backend keeps a matrix float32.
  virtual Result<Tensor> UploadF32Weight(const std::string& name, std::span<const int64_t> shape,
                                         const float* host_data) {
    return UploadWeight(name, DType::kF32, shape, host_data);
  }
  // True when UploadWeight keeps `host_data` (so weights the loader converted on the host must
  // live as long as the backend); false when it copies them.
  virtual bool KeepsHostWeights() const { return false; }
  // True when UploadWeight takes matrices of this block-quantized dtype (kQ8_0, kQ4_0, k-quants) and MatMul
  // and Embedding read them as they are; loaders dequantize (or refuse to quantize) otherwise.
  virtual bool TakesQuantizedWeights(DType /*dtype*/) const { return false; }
  // The paged KV pool: per layer K and V, each [num_blocks, block_size, num_kv_heads, head_dim]
  // of KvElementBytes(head_dim)-byte elements (float32, or bf16 on CUDA), or, for a layer of a
  // quantized SetKvFormat dtype, block_size * num_kv_heads rows of kv_quant.h's KvRowBytes per
  // block (their order within a block is the backend's: the CPU's are head-major). Called once.
  virtual Status AllocateKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                                int32_t num_kv_heads, int32_t head_dim) = 0;
  // The multi-head latent attention pool (MlaAttention) instead: per layer one tensor
  // [num_blocks, block_size, width] (width = latent + rope dims: the latent c and the roped
  // shared key of each token), no V. KvBlockBytes and the block copies then hold, per layer, the
  // block's [block_size, width] rows. Called once, instead of AllocateKvPool; this default
  // refuses (a backend without MlaAttention).
  virtual Status AllocateLatentKvPool(int32_t num_layers, int32_t num_blocks, int32_t block_size,
                                      int32_t width);
  // Whether this backend has MlaAttention and the latent pool (models with MLA are refused at
  // load otherwise).
  virtual bool TakesMla() const { return false; }
  // ---- multi-token-prediction modules (ModelLoadOptions::mtp_module: --spec-method mtp): their
  // step takes hidden states from the host. A backend without these ops refuses such a module at
  // load (MtpUnsupported non-empty: why).
  virtual std::string MtpUnsupported() const;
  // out = `in` (float32 host rows, out's size), ordered with the step's ops.
  virtual Status CopyFromHost(std::span<const float> in, Tensor out);
  // Rows `rows` of the float32 matrix x become zero.
  virtual Status ZeroRows(Tensor x, std::span<const int32_t> rows);
  // Bytes per element of the KV pool AllocateKvPool makes for `head_dim` (sizes it from a budget).
  virtual int64_t KvElementBytes(int32_t /*head_dim*/) const { return 4; }
  // ---- KV-cache formats (kv_format.h; --kv-cache-dtype): set once, before AllocateKvPool and
  // before the sizing calls read it. Errors name the flag and the dtype the backend cannot store.
  // The default takes only its own pool type: kAuto, or the dtype KvElementBytes says (f32 or
  // bf16); a backend with quantized pools overrides the three calls. ----
  virtual Status SetKvFormat(const KvFormat& format, int32_t head_dim);
  // Bytes of one token's K and V over every layer of the pool (sizes it from a budget).
  virtual int64_t KvTokenBytes(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim) const {
    return 2LL * num_layers * num_kv_heads * head_dim * KvElementBytes(head_dim);
  }
  // The pool's dtypes as text (KvFormat::Describe of what it stores: "f32", "bf16", "int8", ...).
  virtual std::string KvFormatText(int32_t head_dim) const {
    return KvElementBytes(head_dim) == 2 ? "bf16" : "f32";
  }
  // ---- KV blocks to and from host memory (the prompt cache's tiers below the pool) ----
  // Bytes of one block's K/V over every layer, as the two copies below lay them out: for each
  // layer in order its K rows then its V rows of the block, each [block_size, num_kv_heads,
  // head_dim] of KvElementBytes (or the block's rows of the layer's quantized format as the pool
  // holds them, scales included). 0 when the pool is not allocated or the backend has no copies.
  virtual int64_t KvBlockBytes() const { return 0; }
  // Copies block `block_id` of the pool into `out` [KvBlockBytes()], after every op enqueued so
  // far; returns once `out` is filled.
  virtual Status CopyKvBlockToHost(int32_t block_id, std::span<uint8_t> out);
  // The same for many blocks at once (outs[i] receives blocks[i]); a GPU backend copies them in
  // a few transfers with one wait each, rather than one per block. Default: one by one.
  virtual Status CopyKvBlocksToHost(std::span<const int32_t> blocks,
                                    std::span<const std::span<uint8_t>> outs);
  // Writes `in` [KvBlockBytes()] into block `block_id` of the pool, after every op enqueued so far
  // and before every later one; `in` may be reused once it returns.
  virtual Status CopyKvBlockFromHost(int32_t block_id, std::span<const uint8_t> in);
  // Page-locked host memory (the RAM tier's records): the device reads and writes it itself, so
  // CopyKvBlocksToHost into it and CopyKvBlockFromPinned out of it need no staging copy. Null
  // when the backend has none (the CPU: plain memory is as fast). Free: after the device's last
  // use of it. Any thread.
  virtual bool HasPinnedHost() const { return false; }
  virtual void* AllocPinnedHost(size_t /*bytes*/) { return nullptr; }
  virtual void FreePinnedHost(void* /*p*/) {}
  // CopyKvBlockFromHost for `in` within AllocPinnedHost memory, which the device may read after
  // this returns: `in` must stay unchanged until PinnedReadsDone(). Default: CopyKvBlockFromHost
  // (read before it returns).
  virtual Status CopyKvBlockFromPinned(int32_t block_id, std::span<const uint8_t> in) {
    return CopyKvBlockFromHost(block_id, in);
  }
  // Whether every CopyKvBlockFromPinned so far has read its bytes (polls; wait: waits for it).
  virtual bool PinnedReadsDone(bool /*wait*/) { return true; }
  // Builds a cos/sin table; returns its id for Rope().
  virtual Result<int32_t> CreateRope(const RopeSpec& spec) = 0;

  // ---- one step ----
  // Uploads the plan and resets the workspace (tensors from Alloc of the previous step die).
  virtual Status BeginStep(const BatchPlan& plan) = 0;
  // A float32 activation buffer from the step workspace (contents undefined).
  virtual Tensor Alloc(std::initializer_list<int64_t> shape) = 0;
  // A step buffer that only MatMul reads (as x) and only RmsNorm, AddRmsNorm (out), SiluMul and
  // GeluTanhMul (out) write. Its element type is the backend's choice: float32 (this default),
  // or the GEMM operand type (the CUDA bf16 mode at cuBLAS row counts: the writer rounds once
  // and MatMul converts nothing, with the bits a conversion would give). Those ops accept it.
  virtual Tensor AllocMatMulInput(std::initializer_list<int64_t> shape) { return Alloc(shape); }
  // A step buffer that only MatMul writes (out, with no bias) and only SiluMul, GeluTanhMul
  // (gate, up) and AddRmsNorm (delta) read: the MLP's gate and up projections, a block's output
  // projection. Its element type is the backend's choice: float32 (this default), or the GEMM's
  // 16-bit type (the CUDA bf16 mode at cuBLAS row counts: half the bytes written and read back).
  // Those ops accept it.
  virtual Tensor AllocMatMulOutput(std::initializer_list<int64_t> shape) { return Alloc(shape); }

  // out[i, :] = table[plan.token_ids[i], :] * scale.   table [vocab, d], out [num_tokens, d]
  virtual void Embedding(const Tensor& table, float scale, Tensor out) = 0;
  // Row-wise RMSNorm over the last dim. x, out [rows, d] (out may alias x), weight [d].
  virtual void RmsNorm(const Tensor& x, const Tensor& weight, float eps, RmsNormKind kind,
                       Tensor out) = 0;
  // residual += delta; out = RmsNorm(residual).   all [rows, d]
  virtual void AddRmsNorm(Tensor residual, const Tensor& delta, const Tensor& weight, float eps,
                          RmsNormKind kind, Tensor out) = 0;
  // out = x W^T (+ bias).   x [n, k] f32, W [m, k] f32/f16/bf16, bias [m] or null, out [n, m].
  // Each output element is computed in an order independent of n (batch-invariant).
  virtual void MatMul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor out) = 0;
  // Rotates q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim] in
  // place at plan.positions (HF rotate-half layout, first rotary_dim dims).
  virtual void Rope(int32_t rope_id, Tensor q, Tensor k) = 0;
  // Writes k, v [num_tokens, num_kv_heads, head_dim] of `layer` at plan.slot_mapping.
  virtual void WriteKv(int32_t layer, const Tensor& k, const Tensor& v) = 0;
  // Paged attention: row i of sequence s attends to positions [0, positions[i]] of s (window
  // limited) through s's block table. q [num_tokens, num_heads, head_dim],
  // out [num_tokens, num_heads * head_dim].
  virtual void Attention(const AttentionParams& params, const Tensor& q, Tensor out) = 0;
  // Multi-head latent attention over the latent pool (AllocateLatentKvPool; MlaParams): rotates
  // q's rope dims and k_rope at plan.positions with table rope_id, writes [c | k_rope] of each
  // row at plan.slot_mapping, then row i of sequence s attends to positions [0, positions[i]] of
  // s with scores scale * (q_nope . k_nope_h + q_rope . k_rope). q [num_tokens, num_heads,
  // nope_dim + rope_dim] (rotated in place), c [num_tokens, latent_dim] (normalised),
  // k_rope [num_tokens, rope_dim], out [num_tokens, num_heads * v_dim]. The default CHECK-fails
  // (TakesMla false: such models are refused at load).
  virtual void MlaAttention(int32_t rope_id, const MlaParams& params, Tensor q, const Tensor& c,
                            const Tensor& k_rope, Tensor out);
  // out = silu(gate) * up   /   out = gelu_tanh(gate) * up.   all [rows, d]
  virtual void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) = 0;
  virtual void GeluTanhMul(const Tensor& gate, const Tensor& up, Tensor out) = 0;

  // ---- fused operations: each is named by the ops it stands for, and its default (backend.cc)
  // runs exactly those ops in that order; a backend overrides it where it has fewer launches
  // that give the same results ----
  // MatMul(x, part.weight, part.bias, part.out) for each part in order: the projections of one
  // input (q/k/v, gate/up). At most kMaxMatMulGroupParts parts.
  static constexpr size_t kMaxMatMulGroupParts = 3;
  virtual void MatMulGroup(const Tensor& x, std::span<const MatMulPart> parts);
  // Rope(rope_id, q, k) then WriteKv(layer, k, v).
  virtual void RopeWriteKv(int32_t rope_id, int32_t layer, Tensor q, Tensor k, const Tensor& v);
  // RopeWriteKv(rope_id, params.layer, q, k, v) then Attention(params, q, out). A backend that
  // folds the rotation into the attention may leave q and k unrotated: they are this op's only.
  virtual void RopeWriteKvAttention(int32_t rope_id, const AttentionParams& params, Tensor q,
                                    Tensor k, const Tensor& v, Tensor out);
  // MatMulGroup(x, {w_gate -> gate, w_up -> up}) then SiluMul / GeluTanhMul(gate, up, out):
  // the dense MLP's first half. gate and up are written too.
  virtual void GateUpActivation(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                GateActivation activation, Tensor gate, Tensor up, Tensor out);
  // GateUpActivation with the step's LoRA updates of gate and up (lora: parts whose out is gate
  // or up) added before the activation. The default: MatMulGroupLora, then SiluMul / GeluTanhMul.
  virtual void GateUpActivationLora(const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                                    GateActivation activation, Tensor gate, Tensor up, Tensor out,
                                    std::span<const LoraPart> lora);
  // Mixture of experts: per row i, the router's logits l_i = router x[i] (+ router_bias;
  // float32 throughout: a routing decision is the most rounding-sensitive step of the layer),
  // the experts E_i = MoeRoute(l_i, top_k, normalize) (moe_route.h; MoeRouteGrouped for
  // kSigmoidGrouped, which only backends with TakesMla take: the loader refuses it elsewhere)
  // with weights p_e, and
  // out[i] = sum over E_i in ascending expert order of p_e * expert_e(x[i]) (transformers'
  // order; MoeExperts defines expert_e). x, out [rows, d] float32. Only for shapes
  // MoeUnsupported accepts (models it refuses are refused at load).
  virtual void MoeMlp(const Tensor& x, const MoeExperts& experts, Tensor out);
  // Whether MoeMlp takes MXFP4 experts (MoeExperts::mxfp4); else the loader dequantizes them.
  virtual bool TakesMxfp4Experts() const { return false; }
  // Why this backend cannot run such an MoeMlp ("" when it can).
  virtual std::string MoeUnsupported(int32_t num_experts, int32_t top_k, int64_t d,
                                     int64_t inter) const;
  // ---- recurrent layers (qwen3_next's gated DeltaNet). Per-sequence state lives in state slots
  // (SequenceSlice::state_slot names one): float32, `floats_per_slot` each, laid out by the
  // model (each op takes its offset). An op zeroes its part of a sequence's state before the
  // sequence's rows when they start at position 0 (context_len == query_len): a sequence that
  // starts over (new, or preempted and recomputed) starts from the zero state; a later chunk
  // continues from the state its previous chunk left. Sequences of one plan may share a slot
  // (padding rows): they run in plan order. The defaults return an error naming the backend (it
  // has no such layers) ----
  // Why this backend cannot run recurrent layers ("" when it can; refused at load).
  virtual std::string RecurrentUnsupported() const;
  // Why this backend cannot keep per-row state snapshots (SequenceSlice::snapshot_slot: the
  // state after each row but the last also copied to consecutive slots; speculative decoding's
  // rollback) ("" when it can; the engine refuses speculation on a recurrent model otherwise).
  virtual std::string StateSnapshotsUnsupported() const;
  // Called once, before the first step of a model with recurrent layers.
  virtual Status AllocateStateSlots(int32_t num_slots, int64_t floats_per_slot);
  // Copies state slot `src` over slot `dst` (the whole slot), after every op enqueued so far and
  // before every later one: the engine's recurrent-state checkpoints (kv/state_checkpoints.h).
  virtual Status CopyStateSlot(int32_t src, int32_t dst);
  // Copies state slot `slot` (the whole slot: floats_per_slot float32 as the model lays them out)
  // into `out` [floats_per_slot * 4 bytes], after every op enqueued so far; returns once `out` is
  // filled. And the reverse: writes `in` over slot `slot`, after every op enqueued so far and
  // before every later one (`in` may be reused once it returns). The prompt cache's RAM and disk
  // tiers keep state checkpoints this way (engine/state_tier.h).
  virtual Status CopyStateSlotToHost(int32_t slot, std::span<uint8_t> out);
  virtual Status CopyStateSlotFromHost(int32_t slot, std::span<const uint8_t> in);
  // The two copies' argument check, for implementations: `slot` in [0, slots) and `bytes` one
  // slot's (floats_per_slot float32).
  static Status CheckStateSlotCopy(int32_t slot, size_t bytes, int32_t slots,
                                   int64_t floats_per_slot);
  // Causal depthwise conv1d then SiLU, in place, per sequence: x[t, c] = silu(sum over taps j of
  // weight[c, j] * in[t - (K - 1) + j, c]) where in before the sequence's first row of this step
  // is its conv window (the last K - 1 inputs; zeros at the start), which it then updates.
  // x [num_tokens, C] float32, weight [C, K] float32; the window [K - 1, C] at state_offset.
  virtual Status CausalConv1dSilu(Tensor x, const Tensor& weight, int64_t state_offset);
  // The gated delta rule, token by token per sequence and value head h (key head kh):
  //   q = l2norm(q_kh) / sqrt(k_head_dim), k = l2norm(k_kh)   (x / sqrt(sum x^2 + 1e-6))
  //   g = -exp(a_log[h]) * softplus(a[h] + dt_bias[h]),  beta = sigmoid(b[h])
  //   S = S * exp(g);  S += k (beta (v_h - S^T k))^T;  out_h = S^T q
  // (S [k_head_dim, v_head_dim], per sequence and value head, in its state slot).
  // qkv [num_tokens, 2 * num_k_heads * k_head_dim + num_v_heads * v_head_dim] (q, k, v heads
  // concatenated, the conv's output), ba [num_tokens, 2 * num_v_heads] (b then a),
  // out [num_tokens, num_v_heads * v_head_dim].
  virtual Status GatedDeltaRule(const GatedDeltaParams& params, const Tensor& qkv, const Tensor& ba,
                                Tensor out);
  // x[r, j] *= sigmoid(gate[r, j / (x.cols / gate.cols)]): each gate value scales a run of
  // columns (qwen3_next's attention output gate: one per column; the shared expert's: one per
  // row). x [rows, c], gate [rows, g], c % g == 0.
  virtual Status SigmoidGateMul(Tensor x, const Tensor& gate);

  // LoRA adapters (model/lora_set.h): for each segment, out[rows] += (x[rows] a^T) b^T, as
  // MatMul(x rows, a) then MatMul(., b) then Add (this default; rows outside every segment are
  // untouched). x [n, k] (a MatMul input), out [n, m] float32 (a projection's output). Each row's
  // result depends on that row alone (batch-invariant).
  virtual void LoraDelta(const Tensor& x, std::span<const LoraSegment> segments, Tensor out);
  // LoraDelta for up to kMaxLoraParts outputs of one input (q/k/v, gate/up), each part's rows
  // and results as its own LoraDelta's; the same result as those calls (this default makes
  // them). A row takes the same adapter in every part that names it.
  virtual void LoraDeltaGroup(const Tensor& x, std::span<const LoraPart> parts);
  // MatMulGroup(x, parts), then LoraDeltaGroup(x, lora) (this default), where every lora part's
  // out is one of parts' outs. A backend may fold the updates into the products instead (CUDA, for
  // one row on its GEMV: each update becomes that projection's bias, computed before the GEMV).
  virtual void MatMulGroupLora(const Tensor& x, std::span<const MatMulPart> parts,
                               std::span<const LoraPart> lora);
  // Why this backend cannot apply LoRA adapters ("" when it can; the default says it cannot:
  // a backend opts in where LoraDelta runs as documented on its step buffers).
  virtual std::string LoraUnsupported() const;
  // Makes the matrices of the adapter loaded into LoRA slot `slot` (model/lora_set.h) available
  // as weights, one tensor per matrix in order (LoraSegment's a and b). The slot's earlier
  // tensors are dead afterwards: the caller loads a slot only when no request holds it, and a
  // backend that copies reuses the slot's storage in place (grown when the new adapter is
  // larger), after the steps still reading it have ended. The default calls UploadWeight per
  // matrix: right for a backend that keeps host pointers (the caller keeps the data while the
  // slot holds it: KeepsHostWeights); one that copies must override it (UploadWeight never frees).
  virtual Result<std::vector<Tensor>> UploadLoraSlot(int32_t slot,
                                                     std::span<const LoraHostMatrix> matrices);
  // out = a + b (out may alias a).
  virtual void Add(const Tensor& a, const Tensor& b, Tensor out) = 0;
  // x = cap * tanh(x / cap), in place.
  virtual void Softcap(Tensor x, float cap) = 0;
  // out[j, :] = x[plan.logits_rows[j], :].   x [num_tokens, d], out [num_logits_rows, d]
  virtual void GatherLogitsRows(const Tensor& x, Tensor out) = 0;
  // Ends the step: copies a float32 tensor to the host (waits for the device).
  virtual Status CopyToHost(const Tensor& t, std::span<float> out) = 0;
  // Ends the step like CopyToHost, but brings back one id per row: ids[j] = the index of the
  // largest value of row j of x (the lowest such index on ties; NaN never wins; 0 when a row is
  // all NaN) — the sampler's greedy choice, without moving the logits. x [rows, cols] float32.
  virtual Status ArgmaxRows(const Tensor& x, std::span<int32_t> ids) = 0;
  // Ends the step like ArgmaxRows for sampled rows: ids[rows[j]] = the token drawn from row
  // rows[j] of x with params[j] (ThresholdSample's algorithm); the other ids are left as they are.
  // x [num_rows, vocab] float32, ids [num_rows].
  virtual Status SampleRows(const Tensor& x, std::span<const int32_t> rows,
                            std::span<const RowSampling> params, std::span<int32_t> ids) = 0;
  // The logits processors of the rows whose token the backend makes (ArgmaxRows / SampleRows
  // next): x[e.row, e.token] = ApplyLogitEdit(x[e.row, e.token], e.op, e.value) for each edit,
  // in place, before those calls (the edits are uploaded with the call: 16 bytes each). The edits
  // of one element are consecutive in `edits` and apply in list order; sampling/logit_edits.h
  // builds such lists. Errors name an edit outside x. x [rows, vocab] float32.
  virtual Status ApplyLogitEdits(Tensor x, std::span<const LogitEdit> edits) = 0;
  // The token masks (structured output) of rows whose token the backend makes, after their
  // ApplyLogitEdits and before ArgmaxRows / SampleRows, as the host sampler orders them (its
  // processors, then the constraint's mask): x[m.row, t] = -inf wherever m's bit t is 0, the
  // other elements untouched (the bits are uploaded with the call: 4 bytes per 32 columns per
  // row). Errors name a row outside x or bits of the wrong length. x [rows, vocab] float32.
  virtual Status ApplyTokenMasks(Tensor x, std::span<const RowMask> masks) = 0;
  // True when SampleRows is cheaper than copying the rows to the host sampler (a GPU).
  virtual bool prefers_backend_sampling() const { return false; }
  // ---- device-fed steps (the engine launches a step before it reads the previous one's ids) ----
  // A plan token id -1 - r (any negative id) is fed: the id the previous step's ArgmaxRows /
  // SampleRows made for its logits row r, taken where those ids are, so the host need not know it
  // (Model::Forward checks that row r made one). After DeferStepIds() the current step's
  // ArgmaxRows and SampleRows enqueue their work and return without waiting: their id spans must
  // stay valid until WaitIds() fills them. BeginStep ends the deferral; at most two steps may
  // have unread ids. A backend that computes ids at once (the CPU) fills them at once.
  virtual void DeferStepIds() {}
  // Forgets the current step's deferred ids (the step failed): WaitIds will not fill them.
  virtual void DropStepIds() {}
  // Waits for the oldest step whose ids were deferred and fills its spans; Ok when none is left.
  virtual Status WaitIds() { return Status::Ok(); }
  // The row counts of decode steps (one row per sequence) that this backend replays from a
  // captured graph, ascending; empty where it captures nothing. The engine pads a decode step to
  // the smallest bucket that holds it (with rows whose outputs it drops) and runs every bucket it
  // can use once before serving, so no step pays a capture.
  virtual std::vector<int32_t> DecodeGraphBuckets() const { return {}; }
  // The memory this backend allocates from, now (after the weights were uploaded): the GPU's for
  // a device backend, the host's (MemAvailable/MemTotal) for the CPU. Sizes the default KV pool.
  virtual Result<BackendMemory> MemoryInfo() const = 0;
  // Host memory for CopyToHost destinations that the device writes at full speed (page-locked on
  // a GPU): `count` floats, valid until the next call, contents unspecified.
  virtual std::span<float> HostBuffer(size_t count) = 0;
};

}  // namespace ember
