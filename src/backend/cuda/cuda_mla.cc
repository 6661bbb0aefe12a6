// CudaBackend's multi-head latent attention (deepseek_v3): the latent pool (the KV pool with one
// f32 tensor per layer of [c | k_rope] rows, so the block copies move them as the CPU's do) and
// MlaAttention as one recorded op: in the f32 compute mode two launches (the rotation and pool
// write, then a block per (row, head)); in the bf16 mode the tensor-core path
// (LaunchMlaAttentionFlash: per chunk of tokens the absorbed q, the attention over shared latent
// tiles, the output product). Graph-safe: every launch reads the plan from the device.
#include <string>

#include "backend/cuda/cuda_backend_impl.h"

namespace ember::cuda {

Status CudaBackend::AllocateLatentKvPool(int32_t num_layers, int32_t num_blocks,
                                         int32_t block_size, int32_t width) {
  if (kv_pool_.data() != nullptr) return Status::Error("the KV pool is already allocated");
  if (num_layers <= 0 || num_blocks <= 0 || block_size <= 0 || width <= 0)
    return Status::Error("latent KV pool needs positive num_blocks, block_size and width");
  Flush();
  // Float32 rows whatever SetKvFormat resolved (the loader takes only auto / f32 for MLA).
  kv_dtypes_.assign(static_cast<size_t>(num_layers), KvDType::kF32);
  kv_block_size_ = block_size;
  kv_heads_ = 1;
  kv_head_dim_ = width;
  return AllocatePool(num_layers, num_blocks, 1);
}

void CudaBackend::MlaAttention(int32_t rope_id, const MlaParams& p, Tensor q, const Tensor& c,
                               const Tensor& k_rope, Tensor out) {
  CHECK(kv_pool_.data() != nullptr && kv_tensors_ == 1) << "MlaAttention without the latent pool";
  CHECK_EQ(kv_head_dim_, p.latent_dim + p.rope_dim);
  CHECK(p.layer >= 0 && p.layer < kv_layers_) << "MLA layer " << p.layer;
  const int64_t n = plan_.num_tokens;
  CHECK(q.numel() == n * p.num_heads * (p.nope_dim + p.rope_dim) &&
        c.numel() == n * p.latent_dim && k_rope.numel() == n * p.rope_dim &&
        out.numel() == n * p.num_heads * p.v_dim)
      << "MlaAttention shapes: q " << ShapeString(q) << ", c " << ShapeString(c) << ", k_rope "
      << ShapeString(k_rope) << ", out " << ShapeString(out);
  CHECK(q.dtype == DType::kF32 && c.dtype == DType::kF32 && k_rope.dtype == DType::kF32 &&
        out.dtype == DType::kF32);
  CHECK(p.kv_b != nullptr && p.kv_b->dtype == DType::kF32 &&
        p.kv_b->rows() == int64_t{p.num_heads} * (p.nope_dim + p.v_dim) &&
        p.kv_b->cols() == p.latent_dim)
      << "kv_b " << (p.kv_b ? ShapeString(*p.kv_b) : "null");
  CHECK(p.latent_dim <= kMlaMaxLatent && p.nope_dim <= kMlaMaxLatent &&
        p.rope_dim <= kMlaMaxRope && p.rope_dim % 2 == 0)
      << "MLA dims: latent " << p.latent_dim << ", nope " << p.nope_dim << ", rope "
      << p.rope_dim;
  const DeviceRope& table = ropes_.at(static_cast<size_t>(rope_id));
  CHECK_EQ(table.spec.rotary_dim, p.rope_dim);
  MlaArgs a;
  a.num_heads = p.num_heads;
  a.nope_dim = p.nope_dim;
  a.rope_dim = p.rope_dim;
  a.v_dim = p.v_dim;
  a.latent_dim = p.latent_dim;
  a.scale = p.scale;
  a.rope_interleave = p.rope_interleave;
  a.cos = table.cos.as<float>();
  a.sin = table.sin.as<float>();
  a.max_positions = table.spec.max_positions;
  a.q = static_cast<float*>(q.data);
  a.c = static_cast<const float*>(c.data);
  a.k_rope = static_cast<const float*>(k_rope.data);
  a.kv_b = static_cast<const float*>(p.kv_b->data);
  a.pool = reinterpret_cast<float*>(kv_pool_.as<unsigned char>() +
                                    kv_layer_offset_[static_cast<size_t>(p.layer)]);
  a.num_slots = int64_t{kv_blocks_} * kv_block_size_;
  a.out = static_cast<float*>(out.data);
  const PlanView plan = plan_;
  // The bf16 mode's tensor-core path, with its q_lat / o_lat scratch per chunk of tokens (a step
  // region shared by the step's MLA layers); else the f32 kernels.
  const bool flash = !f32_compute_ && switches_.mla_flash && MlaFlashSupported(a);
  // Key splits of switches_.mla_split_keys (a long context's decode rows over many blocks), their
  // partials after q_lat and o_lat. A split row's bits are not the unsplit row's: a step that must
  // be batch-invariant splits every row by position (the same bits in any step), the others only
  // when the rows alone give fewer blocks than SMs (decode; a prefill then skips the partials'
  // round trip).
  int32_t chunk = 0;
  unsigned char *q_lat = nullptr, *o_lat = nullptr;
  MlaSplits splits;
  if (flash) {
    const int64_t row_blocks = (int64_t{max_query_len_} * a.num_heads + 15) / 16 * plan.num_seqs;
    splits.keys = batch_invariant_ || row_blocks < num_sms_ ? switches_.mla_split_keys : 0;
    if (splits.keys > 0) splits.count = (max_context_len_ + splits.keys - 1) / splits.keys;
    chunk = MlaFlashChunkTokens(a, plan.num_tokens, splits.count);
    auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    const size_t half = align(static_cast<size_t>(chunk) * a.num_heads * a.latent_dim * 2);
    const size_t partial_bytes = splits.count > 1 ? align(static_cast<size_t>(chunk) * a.num_heads *
                                                          splits.count * (a.latent_dim + 2) * 4)
                                                  : 0;
    q_lat = StepRegionOf(mla_scratch_, 2 * half + partial_bytes);
    o_lat = q_lat + half;
    if (partial_bytes > 0) splits.partials = reinterpret_cast<float*>(q_lat + 2 * half);
  }
  const int32_t max_query_len = max_query_len_, sms = num_sms_,
                m_tiles = switches_.mla_flash_m_tiles;
  recorder_.Record(
      OpKind::kMlaAttention,
      {U(a.num_heads),     U(a.nope_dim),        U(a.rope_dim),    U(a.v_dim),   U(a.latent_dim),
       KeyOf(a.scale),     U(a.rope_interleave), KeyOf(a.cos),     KeyOf(a.q),   KeyOf(a.c),
       KeyOf(a.k_rope),    KeyOf(a.kv_b),        KeyOf(a.pool),    KeyOf(a.out), KeyOf(plan.seqs),
       U(plan.num_tokens), U(plan.num_seqs),     U(max_query_len), U(flash),     U(chunk),
       KeyOf(q_lat),       U(splits.keys),       U(splits.count)},
      [=](cudaStream_t st) {
        if (chunk > 0) {  // (flash; the closure stays within InlineOp's bytes)
          LaunchMlaAttentionFlash(a, plan, max_query_len, q_lat, o_lat, splits, chunk, sms, m_tiles,
                                  st);
        } else {
          LaunchMlaAttention(a, plan, st);
        }
      });
}

}  // namespace ember::cuda
