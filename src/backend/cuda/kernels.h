// Launchers for the CUDA backend's kernels, one op per .cu file (kernel, then its launcher).
// All launchers enqueue on `stream` and check the launch; pointers are device pointers. Shapes
// are in the comments; "rows x d" tensors are row-major and contiguous. The per-step plan is
// passed as a PlanView of device arrays uploaded by BeginStep.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/lora.h"

namespace ember::cuda {

// Device copies of one step's BatchPlan (see backend/batch_plan.h).
struct PlanView {
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens]
  const int32_t* token_seq = nullptr;     // [num_tokens] index of the row's sequence
  const int4* seqs = nullptr;             // [num_seqs] {query_start, query_len, context_len,
                                          //             block_table_start}
  const int32_t* block_tables = nullptr;  // concatenated block ids
  const int32_t* logits_rows = nullptr;   // [num_logits_rows]
  // The ids the previous step made, by logits row: a token id -1 - r reads fed_ids[r].
  const int32_t* fed_ids = nullptr;
  const int32_t* state_slots = nullptr;   // [num_seqs] SequenceSlice::state_slot
  const int32_t* snapshot_slots = nullptr;  // [num_seqs] SequenceSlice::snapshot_slot (-1: none)
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  int32_t num_logits_rows = 0;
  int32_t block_size = 16;
};

// The quantized KV row types the CUDA pool stores (backend/kv_quant.h's layouts: head_dim
// int8 or FP8 E4M3 values, then a float32 scale, KvRowBytes = head_dim + 4; int4: head_dim / 2
// bytes of nibbles, then an f16 scale per group of 32 values, or of head_dim when smaller).
enum class KvQuant : uint8_t { kNone = 0, kInt8 = 1, kFP8 = 2, kInt4 = 3 };

// One layer's paged K and V. quant kNone: each [num_blocks, block_size, num_kv_heads, head_dim],
// float32 or, when bf16 is set, bf16 (k and v then point at __nv_bfloat16 elements and are only
// reinterpreted). quant kInt8 / kFP8 / kInt4: bytes, rows of row_bytes in the CPU backend's order,
// head-major within a block ([num_blocks, num_kv_heads, block_size] rows; kv_rows.cuh's
// KvQuantRowOffset), so a block's bytes (KvBlockBytes, the disk tier's records) are laid out as
// the CPU's, and a head's rows of one block are one contiguous span. Every
// kernel that reads or writes the pool takes every kind: write_kv.cu quantizes on write,
// attention_invariant.cu stages the rows and converts them to its bf16 tiles, the f32
// decode / prefill kernels convert each value as they load it. rotated (int4 only): the rows hold
// H x (kv_quant.h's Hadamard rotation), quantized so by write_kv.cu; the attention kernels read
// them as stored, the caller rotates q before and the output after (LaunchHadamardRows).
struct KvLayerView {
  float* k = nullptr;
  float* v = nullptr;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  bool bf16 = false;
  KvQuant quant = KvQuant::kNone;
  int32_t row_bytes = 0;   // quantized: bytes per row
  int32_t block_size = 0;  // quantized: the pool's tokens per block
  bool rotated = false;    // kInt4: the rows hold H x
  // kInt8 / kFP8 at head dim 128: the batch-invariant attention reads the bytes as direct f16
  // operands (attention_invariant.cu; RuntimeSwitches::kv_direct), else through bf16 tiles.
  bool direct = false;
};

enum class ElemType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// ---- convert.cu ----
// dst[i] = src[i] converted (f32/f16/bf16 -> f32 or bf16).   n elements
void LaunchConvert(const void* src, ElemType src_type, void* dst, ElemType dst_type, int64_t n,
                   cudaStream_t stream);

// ---- gemv.cu ----
// One row: out[m] = W[m, k] x[k] (+ bias[m]), W bf16, x/out f32, for up to kGemvMaxParts
// weights sharing x in one launch (q/k/v, gate/up): out_i = W_i x + bias_i. Needs k % 8 == 0 and
// 16-byte aligned x and W.
constexpr int kGemvMaxParts = 3;
bool GemvBf16Supported(const void* x, const void* w, int64_t k);
struct GemvPart {
  const void* w = nullptr;       // [m, k] bf16, 16-byte aligned
  const float* bias = nullptr;   // [m] or null
  float* out = nullptr;          // [n, m] (the GEMV: n = 1)
  int64_t m = 0;
};
// The next GEMV's weights (w null: none known): the launch's last wave of warps, once done,
// asks the L2 for the first bytes of them, so the DRAM keeps streaming while this launch drains
// and the kernels between the two run.
struct GemvPrefetch {
  const void* w = nullptr;
  int64_t bytes = 0;
};
// With `gated.out`: parts 0 and 1 are the gate and up of an MLP (equal m), and the launch also
// writes gated.out[i] = act(gate_i) * up_i (gated.cuh), as LaunchGatedActivation would.
struct GemvGatedOut {
  float* out = nullptr;
  bool gelu = false;
};
// A batch-1 LoRA update inside the GEMV launch (the ring kernel; GemvLoraFused says whether it
// takes the launch): GEMV part p's rows get t_i b_i^T added, i = lora_of[p] (-1: none), where
// t_i = x a_i^T, a_i / b_i (bf16) the entry of LoRA part i for the row's slot. The tables are
// LoraDeltaArgs's (lora.h), staged before the step: *row_entry the slot (-1: no update at all),
// entries [parts][num_slots]. t: scratch [parts * rank_cap] f32; sync: two unsigned counters,
// zero before the launch, zero again after it.
struct GemvLora {
  const int32_t* row_entry = nullptr;
  const LoraEntry* entries = nullptr;
  int32_t num_slots = 0, parts = 0, rank_cap = 0;
  int32_t lora_of[kGemvMaxParts] = {-1, -1, -1};
  float* t = nullptr;
  unsigned* sync = nullptr;
};
bool GemvLoraFused(int64_t total_rows, int64_t k, bool gated);
void LaunchGemvBf16Multi(const float* x, const GemvPart* parts, int num_parts, int64_t k,
                         GemvPrefetch next, cudaStream_t stream, GemvGatedOut gated = {},
                         const GemvLora* lora = nullptr);
// Whether a gated launch of m-row gate and up parts is one kernel (else it is the GEMV, then the
// activation kernel).
bool GemvGatedFused(int64_t m, int64_t k);

// ---- moe.cu ----
// Backend::MoeMlp: out = the router's top-k experts of each row of x, weighted (see moe.cu).
// gate/up/down: device arrays of num_experts weight pointers ([inter, d], [inter, d], [d, inter];
// bf16 or f32 per w_bf16, 16-byte aligned); gate_bias/up_bias/down_bias: null, or device arrays of
// num_experts f32 vector pointers ([inter], [inter], [d]; all three or none). The scratch buffers
// are sized by MoeMaxTiles and the row count; everything stays on the device (graph-capturable).
constexpr int kMoeTileRows = 4;               // pairs (row, expert) per tile
constexpr int kMoeMaxSmem = 128 << 10;  // bytes of staged rows per block (d up to 8,192: DeepSeek-V3)
constexpr int kMoeMaxExperts = 32 * 32;       // the route kernel's per-lane masks cover 32 each
constexpr int kMoeMaxTopK = 32;
// The default mode's choice of the experts' kernels for a step of `pairs` (row, expert) pairs:
// tensor cores from one pair per expert on average (two with MXFP4 weights, whose conversion
// costs more), the SIMT kernels below (they read each chosen expert once with less start-up;
// the thresholds are the measured crossover, docs/perf.md).
inline bool MoeMmaPays(int64_t pairs, int32_t num_experts, bool mxfp4) {
  return pairs >= (mxfp4 ? 2 : 1) * static_cast<int64_t>(num_experts);
}
// How MoeMlp's route kernel chooses and weights the experts of a row: MoeRoute (softmax, top k,
// normalize), or with `grouped` MoeRouteGrouped (deepseek_v3: MoeArgs::router_bias is then the
// score bias, added to the choice rather than the logits; `groups` groups of which top_groups
// are kept, weights times scale; groups <= 64). backend/moe_route.h. Small: the launch closure
// holds MoeArgs inline.
struct MoeRouteSpec {
  float scale = 1.0f;
  int16_t groups = 1, top_groups = 1;
  bool normalize = false;
  bool grouped = false;
};

struct MoeArgs {
  const void* router = nullptr;   // [num_experts, d], bf16 or f32 as the experts
  const float* x = nullptr;       // [rows, d]
  const void* const* gate = nullptr;
  const void* const* up = nullptr;
  const void* const* down = nullptr;
  const float* router_bias = nullptr;  // [num_experts] or null; grouped: the score bias
  const float* const* gate_bias = nullptr;       // [num_experts] pointers or null, as up/down
  const float* const* up_bias = nullptr;
  const float* const* down_bias = nullptr;
  // false: act = silu(g) * u; true: the clamped SwiGLU of MoeActivation::kClampedSwiglu.
  bool clamped_swiglu = false;
  float swiglu_limit = 7.0f, swiglu_alpha = 1.702f;
  bool w_bf16 = true;  // the router's (and, unless mxfp4, the experts') type: bf16, else f32
  // The experts on tensor cores (bf16 or MXFP4 weights; B rows rounded to bf16), else the SIMT
  // kernels (f32 activations). Either way a row's bits do not depend on the step's other rows.
  bool mma = false;
  // MXFP4 experts (gpt-oss checkpoints kept packed): gate/up/down point at [out, in / 2] bytes
  // of E2M1 pairs and *_scales at [out, in / 32] E8M0 bytes (d and inter multiples of 32).
  bool mxfp4 = false;
  const void* const* gate_scales = nullptr;  // [num_experts] pointers, as gate (mxfp4 only)
  const void* const* up_scales = nullptr;
  const void* const* down_scales = nullptr;
  int64_t rows = 0, d = 0, inter = 0;
  int32_t num_experts = 0, top_k = 0;
  MoeRouteSpec route;
  int32_t max_tiles = 0;  // MoeMaxTiles(rows, top_k, num_experts)
  // Scratch: logits [rows, num_experts], [rows * top_k] each, tiles [3 * max_tiles], num_tiles
  // [1], act [rows * top_k, inter] (f32-sized), y [rows * top_k, d] (f32).
  float* logits = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  int32_t* sorted = nullptr;
  int32_t* pair_pos = nullptr;
  int32_t* tiles = nullptr;
  int32_t* num_tiles = nullptr;
  float* act = nullptr;
  float* y = nullptr;
  float* out = nullptr;  // [rows, d] f32
};
int32_t MoeMaxTiles(int64_t rows, int32_t top_k, int32_t num_experts);
// Whether the SIMT kernels take a step of `pairs` (row, expert) pairs by pair (small steps: no
// schedule, the combine folded into down) rather than by tile; the same bits either way. Why:
// small decode steps run much faster by pair than through the tile kernels (docs/perf.md).
bool MoeByPair(int64_t pairs, int32_t num_experts);
// The shapes LaunchMoeMlp takes (up to kMoeMaxExperts experts, top k <= kMoeMaxTopK, d and inter
// multiples of 8 whose tile rows fit kMoeMaxSmem).
bool MoeSupported(int32_t num_experts, int32_t top_k, int64_t d, int64_t inter);
void PrepareMoeKernels();  // once, before the first launch (not during a graph capture)
void LaunchMoeMlp(const MoeArgs& args, cudaStream_t stream);

// ---- recurrent.cu (qwen3_next's gated DeltaNet; Backend::CausalConv1dSilu, GatedDeltaRule) ----
// State slots: [num_slots, slot_floats] f32; a sequence's slot is plan.state_slots[s]. A sequence
// whose rows start at position 0 (context_len == query_len) starts from zeros. serial_seqs: the
// plan's sequences share slots (padding rows) and are walked in plan order by one block column.
// A sequence with a snapshot slot (plan.snapshot_slots[s] >= 0) also leaves the state after each
// of its rows but the last in slots snapshot_slot + row (speculative decoding's rollback).
constexpr int32_t kMaxConvKernel = 8;      // conv taps the conv kernel takes
constexpr int32_t kMaxDeltaKeyDim = 256;   // k_head_dim the delta-rule kernel takes
// x [num_tokens, channels] in place; weight [channels, kernel]; the window [kernel - 1,
// channels] at state_offset of the slot.
void LaunchCausalConv1dSilu(float* x, int64_t channels, const float* weight, int32_t kernel,
                            float* state, int64_t slot_floats, int64_t state_offset,
                            const PlanView& plan, bool serial_seqs, cudaStream_t stream);
struct GatedDeltaArgs {
  int32_t num_k_heads = 0, num_v_heads = 0, k_dim = 0, v_dim = 0;
  const float* qkv = nullptr;      // [num_tokens, 2 * num_k_heads * k_dim + num_v_heads * v_dim]
  const float* ba = nullptr;       // [num_tokens, 2 * num_v_heads]
  const float* a_log = nullptr;    // [num_v_heads]
  const float* dt_bias = nullptr;  // [num_v_heads]
  float* state = nullptr;          // the slots
  int64_t slot_floats = 0, state_offset = 0;  // the layer's [num_v_heads, k_dim, v_dim]
  float* out = nullptr;            // [num_tokens, num_v_heads * v_dim]
  // > 0: a sequence of at least this many rows (and no snapshot slot) runs the chunked form
  // (kDeltaChunk rows a chunk, matrix products: the same values to float rounding, not the same
  // bits, so only in steps that need not be batch-invariant); 0: every row by the recurrence.
  int32_t chunked_min_rows = 0;
};
constexpr int32_t kDeltaChunk = 64;            // rows per chunk of the chunked form
constexpr int32_t kDeltaChunkMaxKeyDim = 128;  // k_head_dim the chunked form takes
// The chunked form's min rows for these heads (0: it does not take them).
int32_t GatedDeltaChunkedMinRows(int32_t k_dim);
void LaunchGatedDeltaRule(const GatedDeltaArgs& args, const PlanView& plan, bool serial_seqs,
                          cudaStream_t stream);
// x[r, j] *= sigmoid(gate[r, j / (cols / groups)]).   x [rows, cols], gate [rows, groups]
void LaunchSigmoidGateMul(float* x, const float* gate, int64_t rows, int64_t cols, int64_t groups,
                          cudaStream_t stream);

// ---- mla_attention.cu (deepseek_v3; Backend::MlaAttention) ----
// One layer's latent pool: [num_blocks * block_size, latent_dim + rope_dim] f32 rows.
struct MlaArgs {
  int32_t num_heads = 0, nope_dim = 0, rope_dim = 0, v_dim = 0, latent_dim = 0;
  float scale = 1.0f;
  bool rope_interleave = false;
  const float* cos = nullptr;  // [max_positions, rope_dim / 2]
  const float* sin = nullptr;
  int32_t max_positions = 0;
  float* q = nullptr;             // [num_tokens, num_heads, nope_dim + rope_dim], rotated in place
  const float* c = nullptr;       // [num_tokens, latent_dim]
  const float* k_rope = nullptr;  // [num_tokens, rope_dim]
  const float* kv_b = nullptr;    // [num_heads * (nope_dim + v_dim), latent_dim]
  float* pool = nullptr;
  int64_t num_slots = 0;
  float* out = nullptr;           // [num_tokens, num_heads * v_dim]
};
constexpr int32_t kMlaMaxLatent = 1024;  // latent_dim the attention kernel takes
constexpr int32_t kMlaMaxRope = 128;     // rope_dim
// Rotates, writes [c | k_rope] at plan.slot_mapping, then a block per (row, head) attends with
// the up-projection absorbed (backend/cpu/mla_attention.h's order of terms).
void LaunchMlaAttention(const MlaArgs& args, const PlanView& plan, cudaStream_t stream);
// The bf16 mode's tensor-core form (mla_attention.cu): the same rotation and pool write, then per
// chunk of chunk_tokens tokens q_lat = W_uk^T q_nope, the attention over the latent rows shared by
// a sequence's rows and heads, out = W_uv o_lat; bf16 operands, f32 accumulation, each row's
// arithmetic independent of the step's other rows. q_lat / o_lat: scratch of chunk_tokens *
// num_heads * latent_dim bf16 each. MlaFlashSupported: the shapes it takes ((latent + rope) % 4
// == 0, latent + rope <= 640 and latent <= 512 once padded to 16). m_tiles 1, 2 or 4 fixes the
// attention's 16-row m-tiles per block (0: by the step's rows; the results are the same).
// Key splits: keys (a multiple of 32; 0: none) per split, count = splits of the longest context,
// partials [chunk rows, count, latent + 2] f32 (kMlaSplitPartialsBytes at most per chunk).
struct MlaSplits {
  int32_t keys = 0;
  int32_t count = 1;
  float* partials = nullptr;
};
constexpr int64_t kMlaFlashChunkBytes = int64_t{128} << 20;  // q_lat's bytes per chunk at most
constexpr int64_t kMlaSplitPartialsBytes = int64_t{512} << 20;
bool MlaFlashSupported(const MlaArgs& args);
int32_t MlaFlashChunkTokens(const MlaArgs& args, int32_t num_tokens, int32_t num_splits);
void LaunchMlaAttentionFlash(const MlaArgs& args, const PlanView& plan, int32_t max_query_len,
                             void* q_lat, void* o_lat, const MlaSplits& splits,
                             int32_t chunk_tokens, int32_t num_sms, int32_t m_tiles,
                             cudaStream_t stream);

// ---- embedding.cu ----
// out[i, :] = table[token_ids[i], :] * scale (token_ids[i] = -1 - r: plan.fed_ids[r]).
// table [vocab, d], out [num_tokens, d]
void LaunchEmbedding(const void* table, ElemType table_type, int64_t vocab, int64_t d, float scale,
                     const PlanView& plan, float* out, cudaStream_t stream);

// ---- rms_norm.cu ----
// If residual != null: residual += delta first. out = residual / rms * (w or 1 + w).
// x/residual, delta, out [rows, d]; weight [d] f32; delta f32, or bf16 (delta_bf16). out: f32
// (may alias x), or bf16 (out_bf16: each value rounded RN, the bits of the f32 output converted).
void LaunchRmsNorm(const float* x, float* residual, const void* delta, bool delta_bf16,
                   const float* weight, float eps, bool one_plus_weight, int64_t rows, int64_t d,
                   void* out, bool out_bf16, cudaStream_t stream);

// ---- rope.cu ----
// Rotates q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim] in place
// at plan.positions with cos/sin tables [max_positions, rotary_dim / 2] (HF rotate-half).
void LaunchRope(float* q, float* k, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                int32_t rotary_dim, const float* cos_table, const float* sin_table,
                int32_t max_positions, const PlanView& plan, cudaStream_t stream);

// ---- activation.cu ----
// out = act(gate) * up, act = silu or gelu_tanh.   all [n] flat; gate and up f32, or bf16
// (in_bf16); out f32, or bf16 (out_bf16: rounded RN from the f32 result).
void LaunchGatedActivation(const void* gate, const void* up, bool in_bf16, void* out, bool out_bf16,
                           int64_t n, bool gelu, cudaStream_t stream);

// ---- elementwise.cu ----
// Occupies the stream for about `ns` nanoseconds (lets the host queue a profiled step ahead).
void LaunchSpin(int64_t ns, cudaStream_t stream);
void LaunchAdd(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
void LaunchSoftcap(float* x, float cap, int64_t n, cudaStream_t stream);
// out[r, c] += bias[c].   out [rows, cols]
void LaunchAddBias(float* out, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// ---- gather_rows.cu ----
// out[j, :] = x[plan.logits_rows[j], :].   x [num_tokens, d], out [num_logits_rows, d]
void LaunchGatherRows(const float* x, int64_t d, const PlanView& plan, float* out,
                      cudaStream_t stream);

// ---- write_kv.cu ----
// Writes k, v [num_tokens, num_kv_heads, head_dim] into the layer's pool at plan.slot_mapping.
void LaunchWriteKv(const float* k, const float* v, const KvLayerView& kv, const PlanView& plan,
                   cudaStream_t stream);
// LaunchRope then LaunchWriteKv of the rotated k, in one launch (the same bits); k and v have
// the pool's heads and head dim.
void LaunchRopeWriteKv(float* q, float* k, const float* v, int32_t num_heads, int32_t rotary_dim,
                       const float* cos_table, const float* sin_table, int32_t max_positions,
                       const KvLayerView& kv, const PlanView& plan, cudaStream_t stream);
// dst [rows, n] = H src per row (kv_quant.h's HadamardRotate: the same bits), n a power of two
// <= kMaxHeadDim; dst may be src. An int4-rotated layer's q before its attention and its output
// after.
void LaunchHadamardRows(const float* src, float* dst, int64_t rows, int32_t n, cudaStream_t stream);

// ---- attention (attention_decode.cu, attention_prefill.cu) ----
struct AttentionArgs {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // <= kMaxHeadDim
  float scale = 1.0f;
  int32_t sliding_window = 0;
  float softcap = 0.0f;
  // Learned attention sinks [num_heads] f32, or null (AttentionParams::sinks): head h's softmax
  // denominator gains exp(sinks[h] - max), in the units of the scaled (and capped) scores. Read
  // once per row at its final normalisation, so null costs a uniform branch.
  const float* sinks = nullptr;
};
constexpr int32_t kMaxHeadDim = 256;

// One query row per block column: every row of the plan attends through its sequence's block
// table; keys split across `num_splits` blocks (split-K) and merged through `partials`
// (>= DecodePartialsFloats floats; unused when num_splits == 1).
// q [num_tokens, num_heads, head_dim], out [num_tokens, num_heads * head_dim].
int64_t DecodePartialsFloats(int32_t num_tokens, int32_t num_heads, int32_t head_dim,
                             int32_t num_splits);
void LaunchAttentionDecode(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                           const PlanView& plan, int32_t num_splits, float* partials, float* out,
                           cudaStream_t stream);

// Tiles of query rows of one sequence share K/V tiles in shared memory (causal, sliding window,
// softcap, GQA). max_query_len: the longest query_len in the plan.
void LaunchAttentionPrefill(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                            const PlanView& plan, int32_t max_query_len, float* out,
                            cudaStream_t stream);

// ---- argmax.cu ----
#ifdef EMBER_CUDA_TRACE
// The step timeline's stamps (pdl.cuh, TraceStamp), sorted by time, into the file at `path`.
void DumpStepTrace(const char* path);
#endif

// ids[r] = first index of the maximum of row r (NaN never wins; 0 for an all-NaN row).
// x [rows, cols] float32; ids [rows] int32 on the device. With `scratch` (device memory the
// caller keeps, counters zeroed once), up to max_rows rows take the split shape (argmax.cu).
struct ArgmaxScratch {
  float* max = nullptr;         // [max_rows * max_chunks]
  int32_t* index = nullptr;     // [max_rows * max_chunks]
  unsigned* counters = nullptr;  // [max_rows], zero between launches
  int32_t max_rows = 0;
  int32_t max_chunks = 0;
};
void LaunchArgmaxRows(const float* x, int64_t rows, int64_t cols, int32_t* ids,
                      const ArgmaxScratch* scratch, cudaStream_t stream);

// ---- sample_rows.cu ----
// One sampled row's parameters (the layout of ember::RowSampling).
struct SampleRowParams {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  double u;
};
// ids[rows[j]] = the token drawn from row rows[j] of x (backend/threshold_sampling.h's
// algorithm). x [*, cols] float32; rows, params [num_rows], ids [rows of x] on the device.
void LaunchSampleRows(const float* x, int64_t cols, const int32_t* rows,
                      const SampleRowParams* params, int32_t num_rows, int32_t* ids,
                      cudaStream_t stream);

}  // namespace ember::cuda

// ---- attention_invariant.cu (batch-invariant attention) ----
namespace ember::cuda {
// Every row's result is bitwise independent of the other rows of the step: key tiles of 64 at
// absolute positions, the online-softmax state restarted every kInvariantSplitKeys keys and the
// split states folded in split order. num_splits == 0: sequential mode (one block walks all of
// its rows' splits); > 0: split mode (a block per split, >= ceil(max context / split keys),
// partials >= AttentionInvariantPartialsFloats floats, a combine kernel folds them). Both modes
// give identical bits. Head dims: multiples of 16 up to kMaxHeadDim.
// q [num_tokens, num_heads, head_dim], out [num_tokens, num_heads * head_dim].
constexpr int32_t kInvariantSplitKeys = 512;
bool AttentionInvariantSupported(int32_t head_dim);
int32_t AttentionInvariantRowsPerBlock(int32_t head_dim);  // (token, head) rows per block
int64_t AttentionInvariantPartialsFloats(int32_t num_tokens, int32_t num_heads,
                                         int32_t head_dim, int32_t num_splits);
// The step's RoPE and K/V store done by the attention kernel itself (LaunchAttentionInvariant's
// `rope`; else q must be rotated and the K/V stored already, LaunchRopeWriteKv): q and k
// unrotated, k and v [num_tokens, num_kv_heads, head_dim] f32, the cos/sin tables of
// LaunchRope. The same bits as LaunchRopeWriteKv then attention. Only where
// AttentionInvariantCanFuseRope: decode steps (one row per sequence) over a bf16 pool, full
// rotary, head dims 64 and 128, the GQA group in one block.
struct RopeKvInput {
  const float* k = nullptr;
  const float* v = nullptr;
  const float* cos_table = nullptr;
  const float* sin_table = nullptr;
  int32_t rotary_dim = 0;
};
bool AttentionInvariantCanFuseRope(const AttentionArgs& args, int32_t rotary_dim,
                                   int32_t max_query_len, const KvLayerView& kv);
void LaunchAttentionInvariant(const AttentionArgs& args, const float* q, const KvLayerView& kv,
                              const PlanView& plan, int32_t max_query_len, int32_t num_splits,
                              float* partials, float* out, const RopeKvInput* rope,
                              cudaStream_t stream);
// Consecutive sequences that LaunchAttentionInvariant gives one block shape (by their rows per
// KV head: query_len * group): a launch per run takes each sequence in its own shape. Empty when
// the step needs one shape only or more than kMaxAttentionRuns runs (then one launch for all).
struct AttentionRun {
  int32_t first_seq = 0;
  int32_t num_seqs = 0;
  int32_t max_query_len = 0;
};
constexpr size_t kMaxAttentionRuns = 4;
std::vector<AttentionRun> AttentionInvariantRuns(const std::vector<int32_t>& query_lens,
                                                 int32_t group, int32_t head_dim);
}  // namespace ember::cuda

// ---- logit_edits.cu ----
namespace ember {
struct LogitEdit;  // backend/logit_edit.h
}  // namespace ember
namespace ember::cuda {
// x[e.row, e.token] = ApplyLogitEdit(x[e.row, e.token], e.op, e.value) for each edit, in place:
// one thread per run of consecutive edits of one element, applied in list order (distinct
// elements in parallel). x [*, cols] float32; edits [num_edits] on the device.
void LaunchLogitEdits(float* x, int64_t cols, const LogitEdit* edits, int32_t num_edits,
                      cudaStream_t stream);
// x[rows[j], t] = -inf for each column t whose bit in masks[j] is 0 (bit t % 32 of word t / 32,
// TokenMaskAllows), the other elements untouched: one thread per (mask, column). x [*, cols]
// float32; rows [num_masks] int32 and masks [num_masks][ceil(cols / 32)] uint32 on the device.
void LaunchTokenMasks(float* x, int64_t cols, const int32_t* rows, const uint32_t* masks,
                      int32_t num_masks, cudaStream_t stream);
}  // namespace ember::cuda

// ---- gemm_invariant.cu (batch-invariant bf16 GEMM) ----
namespace ember::cuda {
// Tensor-core GEMM: out_i[n, m_i] = x[n, k] W_i[m_i, k]^T (+ bias_i) for num_parts
// (<= kGemvMaxParts) weights sharing x, one launch. Every output element's bits depend only on
// its row of x, its row of W, k and its bias: never on n, the other rows or the kernel variant
// chosen (one mma chain over ascending k16 steps, x rounded to bf16 RN). Any k and alignment (a
// slow generic kernel when k % 8 != 0 or a pointer is not 16-byte aligned).
// x_bf16: device scratch of GemmInvariantScratchBytes(n, k) bytes, 16-byte aligned (null when
// that is 0); x [n, k] f32, W_i [m_i, k] bf16, bias_i [m_i] f32 or null, out_i [n, m_i] f32.
constexpr int64_t kGemmSkinnyMaxRows = 32;
// The default (not batch-invariant) mode's MatMul for 2..kDecodeGemmMaxRows rows; cuBLAS above.
constexpr int64_t kDecodeGemmMaxRows = 8;
int64_t GemmInvariantScratchBytes(int64_t n, int64_t k);
// tiled_variant 1 (RuntimeSwitches::gemm_tiled_variant, an A/B knob): the 128 x 128 tile with 4
// stages of k32 instead of 3 of k64, the same bits.
void LaunchGemmInvariant(const float* x, void* x_bf16, const GemvPart* parts, int num_parts,
                         int64_t n, int64_t k, int tiled_variant, cudaStream_t stream);
}  // namespace ember::cuda
