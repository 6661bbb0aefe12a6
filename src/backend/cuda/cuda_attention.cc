// CudaBackend's attention ops: Rope, WriteKv, Attention and the fused RopeWriteKv (one launch:
// rope.cu's arithmetic, write_kv.cu's stores) and RopeWriteKvAttention (a decode step's
// batch-invariant attention that rotates q and k and writes k and v itself). The bf16 mode runs
// the batch-invariant kernel (attention_invariant.cu) for every head dim it serves; the f32
// decode / prefill kernels serve the parity mode and the other head dims.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/kv_quant.h"
#include "util/log.h"

namespace ember::cuda {

const DeviceRope& CudaBackend::CheckRope(int32_t rope_id, const Tensor& q, const Tensor& k,
                                         int32_t* num_heads) const {
  CHECK(rope_id >= 0 && rope_id < static_cast<int32_t>(ropes_.size()));
  const DeviceRope& rope = ropes_[static_cast<size_t>(rope_id)];
  const int64_t per_token = static_cast<int64_t>(plan_.num_tokens) * rope.spec.head_dim;
  CHECK_GT(per_token, 0);
  CHECK_EQ(q.numel() % per_token, 0);
  CHECK_EQ(k.numel() % per_token, 0);
  *num_heads = static_cast<int32_t>(q.numel() / per_token);
  return rope;
}

void CudaBackend::CheckWriteKv(const Tensor& k, const Tensor& v) const {
  CHECK_EQ(k.numel(), static_cast<int64_t>(plan_.num_tokens) * kv_heads_ * kv_head_dim_);
  CHECK_EQ(v.numel(), k.numel());
}

void CudaBackend::Rope(int32_t rope_id, Tensor q, Tensor k) {
  int32_t num_heads = 0;
  const DeviceRope& rope = CheckRope(rope_id, q, k, &num_heads);
  const int64_t per_token = static_cast<int64_t>(plan_.num_tokens) * rope.spec.head_dim;
  const int32_t num_kv_heads = static_cast<int32_t>(k.numel() / per_token);
  const RopeDims dims = RopeDims::Of(rope.spec);  // (the closure holds no whole RopeSpec)
  const float* cos = rope.cos.as<float>();
  const float* sin = rope.sin.as<float>();
  const PlanView plan = plan_;
  recorder_.Record(OpKind::kRope,
                   {KeyOf(q.data), KeyOf(k.data), U(num_heads), U(num_kv_heads), U(dims.head_dim),
                    U(dims.rotary_dim), KeyOf(cos), KeyOf(sin), U(dims.max_positions),
                    KeyOf(plan.positions), U(plan.num_tokens)},
                   [=](cudaStream_t st) {
                     LaunchRope(static_cast<float*>(q.data), static_cast<float*>(k.data), num_heads,
                                num_kv_heads, dims.head_dim, dims.rotary_dim, cos, sin,
                                dims.max_positions, plan, st);
                   });
}

KvLayerView CudaBackend::KvLayer(int32_t layer, int32_t num_kv_heads, int32_t head_dim) const {
  CHECK(kv_pool_.data() != nullptr) << "KV pool not allocated";
  CHECK(layer >= 0 && layer < kv_layers_);
  CHECK_EQ(num_kv_heads, kv_heads_);
  CHECK_EQ(head_dim, kv_head_dim_);
  const KvDType dtype = kv_dtypes_[static_cast<size_t>(layer)];
  const size_t tensor_bytes = static_cast<size_t>(KvLayerBlockBytes(layer)) * kv_blocks_;
  unsigned char* base = kv_pool_.as<unsigned char>() + kv_layer_offset_[static_cast<size_t>(layer)];
  KvLayerView view{reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + tensor_bytes),
                   kv_heads_, kv_head_dim_, dtype == KvDType::kBF16};
  if (dtype == KvDType::kInt8 || dtype == KvDType::kFP8 || dtype == KvDType::kInt4) {
    view.quant = dtype == KvDType::kInt8  ? KvQuant::kInt8
                 : dtype == KvDType::kFP8 ? KvQuant::kFP8
                                          : KvQuant::kInt4;
    view.row_bytes = static_cast<int32_t>(KvRowBytes(dtype, kv_head_dim_));
    view.block_size = kv_block_size_;
    view.rotated = dtype == KvDType::kInt4 && kv_rotate_int4_;
    view.direct = switches_.kv_direct;
  }
  return view;
}

void CudaBackend::WriteKv(int32_t layer, const Tensor& k, const Tensor& v) {
  CheckWriteKv(k, v);
  const KvLayerView kv = KvLayer(layer, kv_heads_, kv_head_dim_);
  const PlanView plan = plan_;
  recorder_.Record(OpKind::kWriteKv,
                   {KeyOf(k.data), KeyOf(v.data), KeyOf(kv.k), KeyOf(kv.v),
                    KeyOf(plan.slot_mapping), U(plan.num_tokens)},
                   [=](cudaStream_t st) {
                     LaunchWriteKv(static_cast<const float*>(k.data),
                                   static_cast<const float*>(v.data), kv, plan, st);
                   });
}

// One launch where the rope table's head dim is the pool's (always, for a model's own rope).
void CudaBackend::RopeWriteKv(int32_t rope_id, int32_t layer, Tensor q, Tensor k, const Tensor& v) {
  int32_t num_heads = 0;
  const DeviceRope& rope = CheckRope(rope_id, q, k, &num_heads);
  CheckWriteKv(k, v);
  if (rope.spec.head_dim != kv_head_dim_) {
    Backend::RopeWriteKv(rope_id, layer, q, k, v);
    return;
  }
  const KvLayerView kv = KvLayer(layer, kv_heads_, kv_head_dim_);
  const PlanView plan = plan_;
  const RopeDims dims = RopeDims::Of(rope.spec);
  const float* cos = rope.cos.as<float>();
  const float* sin = rope.sin.as<float>();
  float* qp = static_cast<float*>(q.data);
  float* kp = static_cast<float*>(k.data);
  const float* vp = static_cast<const float*>(v.data);
  recorder_.Record(
      OpKind::kRopeWriteKv,
      {KeyOf(qp), KeyOf(kp), KeyOf(vp), U(num_heads), U(kv_heads_), U(dims.head_dim),
       U(dims.rotary_dim), KeyOf(cos), KeyOf(sin), U(dims.max_positions), KeyOf(kv.k), KeyOf(kv.v),
       U(kv.bf16), KeyOf(plan.positions), KeyOf(plan.slot_mapping), U(plan.num_tokens)},
      [=](cudaStream_t st) {
        LaunchRopeWriteKv(qp, kp, vp, num_heads, dims.rotary_dim, cos, sin, dims.max_positions, kv,
                          plan, st);
      });
}

CudaBackend::AttentionCall CudaBackend::PrepareAttention(const AttentionParams& params,
                                                         const Tensor& q, const Tensor& out) const {
  CHECK_GT(params.num_kv_heads, 0);
  CHECK_EQ(params.num_heads % params.num_kv_heads, 0);
  const int64_t width = static_cast<int64_t>(params.num_heads) * params.head_dim;
  CHECK_EQ(q.numel(), plan_.num_tokens * width);
  CHECK_EQ(out.numel(), plan_.num_tokens * width);
  AttentionCall call;
  call.kv = KvLayer(params.layer, params.num_kv_heads, params.head_dim);
  if (params.sinks != nullptr) {
    CHECK(params.sinks->dtype == DType::kF32 && params.sinks->numel() == params.num_heads)
        << "attention sinks " << ShapeString(*params.sinks) << " " << DTypeName(params.sinks->dtype)
        << ", want [" << params.num_heads << "] F32";
  }
  call.args = AttentionArgs{
      params.num_heads,
      params.num_kv_heads,
      params.head_dim,
      params.scale,
      params.sliding_window,
      params.softcap,
      params.sinks != nullptr ? static_cast<const float*>(params.sinks->data) : nullptr};
  call.q = static_cast<const float*>(q.data);
  call.out = static_cast<float*>(out.data);
  return call;
}

// bf16 mode: always the batch-invariant kernel (as fast as or faster than per-step split-K decode
// and flash prefill kernels in every measured shape, docs/perf.md); the f32 kernels serve the
// parity mode and head dims it does not support.
// A layer of Hadamard-rotated int4 rows (KvLayerView::rotated) attends with H q (into the step's
// arena: q stays the caller's) and gets H o, rotated back in place: kv_quant.h's identities.
void CudaBackend::Attention(const AttentionParams& params, const Tensor& q, Tensor out) {
  AttentionCall call = PrepareAttention(params, q, out);
  const int64_t rows = int64_t{plan_.num_tokens} * params.num_heads;
  if (call.kv.rotated) {
    float* rotated_q = static_cast<float*>(ArenaAlloc(static_cast<size_t>(q.numel()) * 4));
    RecordHadamardRows(call.q, rotated_q, rows, params.head_dim);
    call.q = rotated_q;
  }
  if (!f32_compute_ && AttentionInvariantSupported(params.head_dim)) {
    AttentionInvariant(call, nullptr);
  } else {
    AttentionF32(params, call);
  }
  if (call.kv.rotated) RecordHadamardRows(call.out, call.out, rows, params.head_dim);
}

void CudaBackend::RecordHadamardRows(const float* src, float* dst, int64_t rows, int32_t n) {
  recorder_.Record(OpKind::kHadamardRows, {KeyOf(src), KeyOf(dst), U(rows), U(n)},
                   [=](cudaStream_t st) { LaunchHadamardRows(src, dst, rows, n, st); });
}

// A decode step's invariant attention takes the rotation and the KV write over: one launch
// instead of two, the same bits (RopeWriteKvFoldsIntoDecodeAttention); q and k are then left
// unrotated. Where it cannot (prefill and mixed steps, f32 pools, partial rotary, ...): the
// RopeWriteKv launch, then Attention.
void CudaBackend::RopeWriteKvAttention(int32_t rope_id, const AttentionParams& params, Tensor q,
                                       Tensor k, const Tensor& v, Tensor out) {
  int32_t num_heads = 0;
  const DeviceRope& rope = CheckRope(rope_id, q, k, &num_heads);
  CheckWriteKv(k, v);
  const AttentionCall call = PrepareAttention(params, q, out);
  const bool folds =
      rope.spec.head_dim == kv_head_dim_ && !f32_compute_ &&
      AttentionInvariantSupported(params.head_dim) && AttentionRuns(call.args).size() <= 1 &&
      AttentionInvariantCanFuseRope(call.args, rope.spec.rotary_dim, max_query_len_, call.kv);
  if (!folds) {
    Backend::RopeWriteKvAttention(rope_id, params, q, k, v, out);
    return;
  }
  const RopeKvInput in{static_cast<const float*>(k.data), static_cast<const float*>(v.data),
                       rope.cos.as<float>(), rope.sin.as<float>(), rope.spec.rotary_dim};
  AttentionInvariant(call, &in);
}

// A step whose sequences need different block shapes (a mixed step: decode rows beside a
// prompt's chunk) launches the kernel once per run of consecutive sequences of one shape. Why: one
// launch sized for the longest sequence would give every decode sequence the prefill shape (one
// busy warp of four) and a grid of mostly empty blocks (15 of 16 row tiles of each decode
// sequence at a 512-row chunk); per-run launches cut mixed steps' attention time (docs/perf.md).
// The shapes give the same bits (attention_invariant.cu).
std::vector<AttentionRun> CudaBackend::AttentionRuns(const AttentionArgs& args) const {
  const int32_t group = args.num_heads / args.num_kv_heads;
  return AttentionInvariantRuns(query_lens_, group, args.head_dim);
}

// One kernel for every step shape (see attention_invariant.cu). Split mode (one block per fixed
// key split, then a fold kernel) only when the row tiles alone would leave SMs idle; it gives the
// same bits as the sequential mode. Its partials (per row, head and split: head_dim + 2 floats)
// may take up to kMaxSplitPartialsBytes of the step's arena: enough for 16 decode rows at a 128k
// context or a 16-row prompt chunk after a 128k prefix (a prefix-cache hit's suffix), the shapes
// where a few row tiles would otherwise each stream a whole long context alone (at 8 MB, 11
// decode rows at 32k did: 31 ms a step for 45 GB, 1.5 TB/s).
constexpr int64_t kMaxSplitPartialsBytes = int64_t{128} << 20;

void CudaBackend::AttentionInvariant(const AttentionCall& call, const RopeKvInput* rope) {
  const AttentionArgs& args = call.args;
  const int64_t group = args.num_heads / args.num_kv_heads;
  const std::vector<AttentionRun> runs = AttentionRuns(args);
  if (runs.size() > 1) {
    CHECK(rope == nullptr) << "a RoPE-fused attention of several block shapes";
    for (const AttentionRun& run : runs) {
      PlanView sub = plan_;
      sub.seqs += run.first_seq;
      sub.num_seqs = run.num_seqs;
      // Sequential mode only: the split mode's fold kernel runs over every token of the step.
      AttentionInvariantLaunch(call, sub, run.max_query_len, 0, nullptr);
    }
    return;
  }
  const PlanView plan = plan_;
  const int32_t max_query_len = max_query_len_;
  const int64_t rows_per_block = AttentionInvariantRowsPerBlock(args.head_dim);
  const int64_t blocks = (max_query_len * group + rows_per_block - 1) / rows_per_block *
                         args.num_kv_heads * plan.num_seqs;
  const int32_t max_splits = (max_context_len_ + kInvariantSplitKeys - 1) / kInvariantSplitKeys;
  int32_t splits = 0;
  float* partials = nullptr;
  if (max_splits > 1 && blocks < num_sms_) {
    const int64_t floats = AttentionInvariantPartialsFloats(plan.num_tokens, args.num_heads,
                                                            args.head_dim, max_splits);
    if (floats * 4 <= kMaxSplitPartialsBytes) {
      splits = max_splits;
      partials = static_cast<float*>(ArenaAlloc(static_cast<size_t>(floats) * 4));
    }
  }
  if (rope == nullptr) {
    AttentionInvariantLaunch(call, plan, max_query_len, splits, partials);
    return;
  }
  const KvLayerView kv = call.kv;
  const float* qp = call.q;
  float* op = call.out;
  const RopeKvInput in = *rope;
  recorder_.Record(
      OpKind::kRopeAttention, {KeyOf(qp),           KeyOf(op),           KeyOf(kv.k),
                               KeyOf(kv.v),         U(args.num_heads),   U(args.num_kv_heads),
                               U(args.head_dim),    KeyOf(args.scale),   U(args.sliding_window),
                               KeyOf(args.softcap), KeyOf(args.sinks),   U(splits),
                               KeyOf(partials),     KeyOf(plan.seqs),    U(plan.num_tokens),
                               U(plan.num_seqs),    U(plan.block_size),  KeyOf(in.k),
                               KeyOf(in.v),         KeyOf(in.cos_table), KeyOf(plan.slot_mapping)},
      [=](cudaStream_t st) {
        LaunchAttentionInvariant(args, qp, kv, plan, max_query_len, splits, partials, op, &in, st);
      });
}

void CudaBackend::AttentionInvariantLaunch(const AttentionCall& call, const PlanView& plan,
                                           int32_t max_query_len, int32_t splits, float* partials) {
  const AttentionArgs args = call.args;
  const KvLayerView kv = call.kv;
  const float* qp = call.q;
  float* op = call.out;
  // 1000 + splits tells these launches from the f32 kernels' (AttentionF32).
  recorder_.Record(
      OpKind::kAttention,
      {KeyOf(qp), KeyOf(op), KeyOf(kv.k), KeyOf(kv.v), U(args.num_heads), U(args.num_kv_heads),
       U(args.head_dim), KeyOf(args.scale), U(args.sliding_window), KeyOf(args.softcap),
       KeyOf(args.sinks), U(1000 + splits), KeyOf(partials), U(max_query_len), KeyOf(plan.seqs),
       U(plan.num_tokens), U(plan.num_seqs), U(plan.block_size)},
      [=](cudaStream_t st) {
        LaunchAttentionInvariant(args, qp, kv, plan, max_query_len, splits, partials, op, nullptr,
                                 st);
      });
}

// The parity mode's kernels (f32 pools): split-K decode, or the flash prefill kernel.
void CudaBackend::AttentionF32(const AttentionParams& params, const AttentionCall& call) {
  const AttentionArgs args = call.args;
  const KvLayerView kv = call.kv;
  const float* qp = call.q;
  float* op = call.out;
  CHECK(!kv.bf16);  // the f32 kernels read float32 pools
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
    int64_t s =
        std::min<int64_t>((visible + 63) / 64, (4 * num_sms_ + row_blocks - 1) / row_blocks);
    splits = static_cast<int32_t>(std::clamp<int64_t>(s, 1, 64));
    const int64_t floats =
        DecodePartialsFloats(plan_.num_tokens, params.num_heads, params.head_dim, splits);
    if (floats > 0) partials = static_cast<float*>(ArenaAlloc(static_cast<size_t>(floats) * 4));
  }
  const int32_t max_query_len = max_query_len_;
  const PlanView plan = plan_;
  recorder_.Record(
      OpKind::kAttention,
      {KeyOf(qp), KeyOf(op), KeyOf(kv.k), KeyOf(kv.v), U(args.num_heads), U(args.num_kv_heads),
       U(args.head_dim), KeyOf(args.scale), U(args.sliding_window), KeyOf(args.softcap),
       KeyOf(args.sinks), U(splits), KeyOf(partials), U(max_query_len), KeyOf(plan.seqs),
       U(plan.num_tokens), U(plan.num_seqs), U(plan.block_size)},
      [=](cudaStream_t st) {
        if (splits > 0) {
          LaunchAttentionDecode(args, qp, kv, plan, splits, partials, op, st);
        } else {
          LaunchAttentionPrefill(args, qp, kv, plan, max_query_len, op, st);
        }
      });
}

}  // namespace ember::cuda
