// Model::Load (config + generation defaults + weights -> backend tensors) and Model::Forward
// (validates the plan, then runs the family's forward pass from llama.cc / gemma.cc /
// deepseek.cc).
#include "model/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

#include "backend/cpu/matmul.h"  // ConvertToF32
#include "model/architecture.h"
#include "model/gguf_model.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "model/weight_convert.h"
#include "util/log.h"
#include "util/mapped_file.h"
#include "util/parallel.h"
#include "util/sha256.h"

namespace ember {
namespace {

bool IsGemma(const ModelConfig& c) {
  return c.model_type == "gemma2" || c.model_type == "gemma3_text";
}

class Uploader {
 public:
  // `quantize`: --quantize's type for the projections (model/quantize.h), quantized on the host
  // into buffers kept in `keep`.
  Uploader(const WeightStore& store, Backend& backend, std::optional<DType> quantize,
           std::vector<std::vector<uint8_t>>& keep)
      : store_(store), backend_(backend), quantize_(quantize), keep_(keep) {}

  Result<Tensor> Get(const std::string& name, std::vector<int64_t> shape) {
    EMBER_ASSIGN_OR_RETURN(TensorView view, store_.GetWithShape(name, shape));
    int64_t numel = 1;
    for (int64_t d : view.shape) numel *= d;
    if (quantize_ && IsQuantizedProjection(name)) {
      const std::string flag = "--quantize " + std::string(DTypeName(*quantize_));
      if (!backend_.TakesQuantizedWeights(*quantize_))
        return Status::Error(flag + ": the " + backend_.name() + " backend has no kernels for " +
                             DTypeName(*quantize_) + " weights (run it with --device cpu)");
      EMBER_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                             QuantizeMatrix(view, *quantize_, flag, std::thread::hardware_concurrency()));
      return Converted(name, *quantize_, view.shape, std::move(bytes), numel, keep_);
    }
    num_parameters += numel;
    return backend_.UploadWeight(name, view.dtype, view.shape, view.data);
  }
  // A tensor the loader built on the host (`bytes` of dtype and shape): uploaded, and kept in
  // `keep` when the backend points into host memory. Counts as `parameters` checkpoint elements.
  Result<Tensor> Converted(const std::string& name, DType dtype, std::vector<int64_t> shape,
                           std::vector<uint8_t> bytes, int64_t parameters,
                           std::vector<std::vector<uint8_t>>& keep) {
    num_parameters += parameters;
    EMBER_ASSIGN_OR_RETURN(Tensor t, backend_.UploadWeight(name, dtype, shape, bytes.data()));
    if (backend_.KeepsHostWeights()) keep.push_back(std::move(bytes));
    return t;
  }
  // Converted, for a float32 tensor an own kernel reads as float32 (Backend::UploadF32Weight).
  Result<Tensor> ConvertedF32(const std::string& name, std::vector<int64_t> shape,
                              std::vector<uint8_t> bytes, int64_t parameters,
                              std::vector<std::vector<uint8_t>>& keep) {
    num_parameters += parameters;
    EMBER_ASSIGN_OR_RETURN(Tensor t, backend_.UploadF32Weight(
                                         name, shape, reinterpret_cast<const float*>(bytes.data())));
    if (backend_.KeepsHostWeights()) keep.push_back(std::move(bytes));
    return t;
  }
  Result<TensorView> View(const std::string& name, std::vector<int64_t> shape) const {
    return store_.GetWithShape(name, std::move(shape));
  }
  Result<TensorView> Packed(const std::string& name, std::vector<int64_t> shape) const {
    return store_.GetPacked(name, std::move(shape));
  }
  bool Has(const std::string& name) const { return store_.Has(name); }
  Backend& backend() const { return backend_; }
  Result<std::optional<Tensor>> GetOptional(const std::string& name, std::vector<int64_t> shape,
                                            bool wanted) {
    if (!wanted) return std::optional<Tensor>();
    EMBER_ASSIGN_OR_RETURN(Tensor t, Get(name, std::move(shape)));
    return std::optional<Tensor>(t);
  }
  int64_t num_parameters = 0;

 private:
  const WeightStore& store_;
  Backend& backend_;
  std::optional<DType> quantize_;
  std::vector<std::vector<uint8_t>>& keep_;
};

RopeSpec MakeRopeSpec(const ModelConfig& c, const RopeConfig& r) {
  RopeSpec spec;
  spec.type = r.type == "llama3"   ? RopeSpec::Type::kLlama3
              : r.type == "linear" ? RopeSpec::Type::kLinear
              : r.type == "yarn"   ? RopeSpec::Type::kYarn
                                   : RopeSpec::Type::kDefault;
  spec.head_dim = c.head_dim;
  spec.rotary_dim = c.rotary_dim;
  spec.theta = r.theta;
  spec.factor = r.factor;
  spec.low_freq_factor = r.low_freq_factor;
  spec.high_freq_factor = r.high_freq_factor;
  spec.original_max_positions = r.original_max_position_embeddings;
  spec.beta_fast = r.beta_fast;
  spec.beta_slow = r.beta_slow;
  spec.truncate = r.truncate;
  spec.attention_factor = r.attention_factor;
  spec.max_positions = c.max_position_embeddings;
  spec.freq_factors = r.freq_factors;
  return spec;
}

bool SameRope(const RopeConfig& a, const RopeConfig& b) {
  return a.type == b.type && a.theta == b.theta && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.truncate == b.truncate &&
         a.attention_factor == b.attention_factor && a.freq_factors == b.freq_factors;
}

// A mixture-of-experts MLP (qwen3_moe): the router mlp.gate and each expert's projections.
Status LoadExperts(const ModelConfig& c, const std::string& prefix, Uploader& up,
                   LayerWeights* w) {
  const int64_t d = c.hidden_size, inter = c.moe_intermediate_size;
  EMBER_ASSIGN_OR_RETURN(w->experts.router,
                         up.Get(prefix + "mlp.gate.weight", {c.num_experts, d}));
  w->experts.top_k = c.num_experts_per_tok;
  w->experts.normalize = c.norm_topk_prob;
  for (int32_t e = 0; e < c.num_experts; ++e) {
    const std::string p = prefix + "mlp.experts." + std::to_string(e) + ".";
    EMBER_ASSIGN_OR_RETURN(Tensor gate, up.Get(p + "gate_proj.weight", {inter, d}));
    EMBER_ASSIGN_OR_RETURN(Tensor up_proj, up.Get(p + "up_proj.weight", {inter, d}));
    EMBER_ASSIGN_OR_RETURN(Tensor down, up.Get(p + "down_proj.weight", {d, inter}));
    w->experts.gate.push_back(gate);
    w->experts.up.push_back(up_proj);
    w->experts.down.push_back(down);
  }
  return Status::Ok();
}

// deepseek_v3's attention (multi-head latent attention; LayerWeights' MLA fields): the q LoRA
// (q_a_proj, q_a_layernorm, q_b_proj) or q_proj, kv_a_proj_with_mqa split into its latent and
// rope rows, kv_a_layernorm, kv_b_proj converted to float32 on the host (MlaParams::kv_b), o_proj.
Status LoadMlaAttention(const ModelConfig& c, const std::string& prefix, Uploader& up,
                        LayerWeights* w, std::vector<std::vector<uint8_t>>& keep) {
  const int64_t d = c.hidden_size, heads = c.num_heads, rank = c.kv_lora_rank;
  const int64_t rope = c.qk_rope_head_dim, qk = c.qk_nope_head_dim + rope;
  const std::string p = prefix + "self_attn.";
  if (c.q_lora_rank > 0) {
    EMBER_ASSIGN_OR_RETURN(w->q_a, up.GetOptional(p + "q_a_proj.weight", {c.q_lora_rank, d}, true));
    EMBER_ASSIGN_OR_RETURN(w->q_a_norm,
                           up.GetOptional(p + "q_a_layernorm.weight", {c.q_lora_rank}, true));
    EMBER_ASSIGN_OR_RETURN(w->q_b,
                           up.GetOptional(p + "q_b_proj.weight", {heads * qk, c.q_lora_rank}, true));
  } else {
    EMBER_ASSIGN_OR_RETURN(w->wq, up.Get(p + "q_proj.weight", {heads * qk, d}));
  }
  EMBER_ASSIGN_OR_RETURN(Tensor kv_a, up.Get(p + "kv_a_proj_with_mqa.weight", {rank + rope, d}));
  w->kv_a = kv_a.RowSlice(0, rank);
  w->k_rope_proj = kv_a.RowSlice(rank, rope);
  EMBER_ASSIGN_OR_RETURN(w->kv_a_norm, up.Get(p + "kv_a_layernorm.weight", {rank}));
  const int64_t kv_b_rows = heads * (c.qk_nope_head_dim + c.v_head_dim);
  EMBER_ASSIGN_OR_RETURN(TensorView kv_b, up.View(p + "kv_b_proj.weight", {kv_b_rows, rank}));
  std::vector<uint8_t> bytes(static_cast<size_t>(kv_b_rows * rank) * sizeof(float));
  cpu::ConvertToF32(kv_b.data, kv_b.dtype, kv_b_rows * rank, reinterpret_cast<float*>(bytes.data()));
  EMBER_ASSIGN_OR_RETURN(w->kv_b, up.ConvertedF32(p + "kv_b_proj.weight", {kv_b_rows, rank},
                                                  std::move(bytes), kv_b_rows * rank, keep));
  EMBER_ASSIGN_OR_RETURN(w->wo, up.Get(p + "o_proj.weight", {d, heads * c.v_head_dim}));
  return Status::Ok();
}

// deepseek_v3's router extras (MoeRouting::kSigmoidGrouped) and shared experts.
Status LoadGroupedRouting(const ModelConfig& c, const std::string& prefix, Uploader& up,
                          LayerWeights* w) {
  MoeExperts& x = w->experts;
  x.routing = c.moe_routing;
  x.groups = c.moe_groups;
  x.top_groups = c.moe_top_groups;
  x.scale = c.moe_routed_scale;
  EMBER_ASSIGN_OR_RETURN(x.score_bias, up.GetOptional(prefix + "mlp.gate.e_score_correction_bias",
                                                      {c.num_experts}, true));
  if (c.moe_shared_experts <= 0) return Status::Ok();
  // The shared experts as one MLP in the layer's dense slots (architecture.h).
  const int64_t d = c.hidden_size;
  const int64_t inter = int64_t{c.moe_shared_experts} * c.moe_intermediate_size;
  const std::string p = prefix + "mlp.shared_experts.";
  EMBER_ASSIGN_OR_RETURN(w->w_gate, up.Get(p + "gate_proj.weight", {inter, d}));
  EMBER_ASSIGN_OR_RETURN(w->w_up, up.Get(p + "up_proj.weight", {inter, d}));
  EMBER_ASSIGN_OR_RETURN(w->w_down, up.Get(p + "down_proj.weight", {d, inter}));
  return Status::Ok();
}

// gpt_oss's experts, stored fused in the x W layout: gate_up_proj [E, d, 2 inter] (gate and up
// interleaved by column: gate = [..., 0::2], up = [..., 1::2]), gate_up_proj_bias [E, 2 inter],
// down_proj [E, inter, d], down_proj_bias [E, d]; rearranged on the host into per-expert
// [out, in] rows of the checkpoint's dtype and float32 biases. The router is mlp.router.
// OpenAI's own checkpoints store the two matrices as MXFP4 instead, already as [out, in] rows
// (gate_up_proj_blocks [E, 2 inter, d / 32, 16] and _scales [E, 2 inter, d / 32], gate and up
// interleaved by row; down_proj_blocks [E, d, inter / 32, 16], _scales): kept packed where the
// backend takes them (Backend::TakesMxfp4Experts: the CPU, CUDA's bf16 mode), else dequantized to
// bf16.
Status LoadGptOssExperts(const ModelConfig& c, const std::string& prefix, Uploader& up,
                         LayerWeights* w, std::vector<std::vector<uint8_t>>& keep) {
  const int64_t d = c.hidden_size, inter = c.moe_intermediate_size, num = c.num_experts;
  MoeExperts& x = w->experts;
  EMBER_ASSIGN_OR_RETURN(x.router, up.Get(prefix + "mlp.router.weight", {num, d}));
  EMBER_ASSIGN_OR_RETURN(x.router_bias, up.GetOptional(prefix + "mlp.router.bias", {num}, true));
  x.top_k = c.num_experts_per_tok;
  x.normalize = c.norm_topk_prob;
  x.activation = c.moe_activation;
  x.swiglu_limit = c.swiglu_limit;
  const std::string p = prefix + "mlp.experts.";
  EMBER_ASSIGN_OR_RETURN(TensorView gate_up_bias,
                         up.View(p + "gate_up_proj_bias", {num, 2 * inter}));
  EMBER_ASSIGN_OR_RETURN(TensorView down_bias, up.View(p + "down_proj_bias", {num, d}));
  // Per expert e, the [out, in] rows of one part (0 gate, 1 up, 2 down), of type `dtype`.
  std::function<std::vector<uint8_t>(int64_t, int)> rows;
  // Packed MXFP4 (Backend::TakesMxfp4Experts): per expert e, the scale rows of a part.
  std::function<std::vector<uint8_t>(int64_t, int)> scale_rows;
  DType dtype = DType::kBF16;
  if (up.Has(p + "gate_up_proj_blocks")) {  // MXFP4
    if (d % 32 != 0 || inter % 32 != 0)
      return Status::Error(p +
                           "gate_up_proj_blocks: MXFP4 needs hidden_size and "
                           "intermediate_size to be multiples of 32");
    EMBER_ASSIGN_OR_RETURN(TensorView gu_blocks,
                           up.Packed(p + "gate_up_proj_blocks", {num, 2 * inter, d / 32, 16}));
    EMBER_ASSIGN_OR_RETURN(TensorView gu_scales,
                           up.Packed(p + "gate_up_proj_scales", {num, 2 * inter, d / 32}));
    EMBER_ASSIGN_OR_RETURN(TensorView dn_blocks,
                           up.Packed(p + "down_proj_blocks", {num, d, inter / 32, 16}));
    EMBER_ASSIGN_OR_RETURN(TensorView dn_scales,
                           up.Packed(p + "down_proj_scales", {num, d, inter / 32}));
    for (const TensorView* v : {&gu_blocks, &gu_scales, &dn_blocks, &dn_scales})
      if (v->dtype != DType::kU8)
        return Status::Error(v->file + ": tensor \"" + v->name + "\": MXFP4 data must be U8");
    // Expert e's part (0 gate, 1 up, 2 down) in the packed tensors: its first row's blocks and
    // scales, k, and which rows (gate is every even row of gate_up, up every odd one).
    struct PackedRows {
      const uint8_t* blocks;
      const uint8_t* scales;
      int64_t k, first, stride, count;
    };
    auto packed_rows = [=](int64_t e, int part) {
      const bool gu = part < 2;
      const int64_t k = gu ? d : inter;
      const int64_t at = e * (gu ? 2 * inter : d) * (k / 32);  // (row, block) index
      return PackedRows{static_cast<const uint8_t*>(gu ? gu_blocks.data : dn_blocks.data) + at * 16,
                        static_cast<const uint8_t*>(gu ? gu_scales.data : dn_scales.data) + at, k,
                        gu ? part : 0, gu ? 2 : 1, gu ? inter : d};
    };
    if (up.backend().TakesMxfp4Experts()) {
      dtype = DType::kU8;
      rows = [=](int64_t e, int part) {
        const PackedRows q = packed_rows(e, part);
        return GatherRows(q.blocks, q.k / 2, q.first, q.stride, q.count);
      };
      scale_rows = [=](int64_t e, int part) {
        const PackedRows q = packed_rows(e, part);
        return GatherRows(q.scales, q.k / 32, q.first, q.stride, q.count);
      };
    } else {
      rows = [=](int64_t e, int part) {
        const PackedRows q = packed_rows(e, part);
        return DequantizeMxfp4Rows(q.blocks, q.scales, q.k, q.first, q.stride, q.count);
      };
    }
  } else {
    EMBER_ASSIGN_OR_RETURN(TensorView gate_up, up.View(p + "gate_up_proj", {num, d, 2 * inter}));
    EMBER_ASSIGN_OR_RETURN(TensorView down, up.View(p + "down_proj", {num, inter, d}));
    if (gate_up.dtype != down.dtype)
      return Status::Error(down.file + ": tensor \"" + down.name +
                           "\": dtype differs from gate_up_proj's");
    dtype = gate_up.dtype;
    rows = [=](int64_t e, int part) {
      const size_t elem = DTypeSize(gate_up.dtype);
      if (part == 2)
        return TransposeColumns(
            static_cast<const uint8_t*>(down.data) + static_cast<size_t>(e * inter * d) * elem,
            inter, d, 0, 1, d, elem);
      return TransposeColumns(
          static_cast<const uint8_t*>(gate_up.data) + static_cast<size_t>(e * d * 2 * inter) * elem,
          d, 2 * inter, part, 2, inter, elem);
    };
  }
  // The biases as f32, each tensor converted once; an expert's bias is every stride-th value.
  std::vector<float> gu_bias(static_cast<size_t>(num * 2 * inter));
  std::vector<float> dn_bias(static_cast<size_t>(num * d));
  cpu::ConvertToF32(gate_up_bias.data, gate_up_bias.dtype, num * 2 * inter, gu_bias.data());
  cpu::ConvertToF32(down_bias.data, down_bias.dtype, num * d, dn_bias.data());
  auto bias = [&](const std::string& name, const float* first, int64_t stride,
                  int64_t count) -> Result<Tensor> {
    std::vector<uint8_t> bytes(static_cast<size_t>(count) * sizeof(float));
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(bytes.data() + i * sizeof(float), first + i * stride, sizeof(float));
    return up.Converted(name, DType::kF32, {count}, std::move(bytes), count, keep);
  };
  // The rearrangement (or dequantization) runs on every core, a few experts at a time (a
  // gpt-oss-20b layer is 1.6 GB of them); uploads stay in expert order.
  const int64_t batch = std::max<int64_t>(1, std::thread::hardware_concurrency());
  std::vector<std::vector<uint8_t>> parts;
  // Packed: [out, in / 2] bytes plus [out, in / 32] scales per matrix.
  const bool packed = dtype == DType::kU8;
  auto cols = [&](int64_t in) { return packed ? in / 2 : in; };
  for (int64_t e = 0; e < num; ++e) {
    const int64_t slot = e % batch;
    if (slot == 0) {
      const int64_t count = std::min(batch, num - e);
      parts.assign(static_cast<size_t>(3 * count), {});
      ForEachOnThreads(parts.size(), static_cast<size_t>(batch), [&](size_t i) {
        parts[i] = rows(e + static_cast<int64_t>(i) / 3, static_cast<int>(i % 3));
      });
    }
    auto part = [&](int which) { return std::move(parts[static_cast<size_t>(3 * slot + which)]); };
    const std::string n = p + std::to_string(e) + ".";
    auto scales = [&](const std::string& name, int which, int64_t out, int64_t in,
                      std::vector<Tensor>& to) -> Status {
      if (!packed) return Status::Ok();
      EMBER_ASSIGN_OR_RETURN(
          Tensor t, up.Converted(name, DType::kU8, {out, in / 32}, scale_rows(e, which), 0, keep));
      to.push_back(t);
      return Status::Ok();
    };
    for (int half = 0; half < 2; ++half) {  // 0: gate (even columns), 1: up (odd)
      EMBER_ASSIGN_OR_RETURN(Tensor t, up.Converted(n + (half == 0 ? "gate" : "up"), dtype,
                                                    {inter, cols(d)}, part(half), inter * d, keep));
      (half == 0 ? x.gate : x.up).push_back(t);
      EMBER_RETURN_IF_ERROR(scales(n + (half == 0 ? "gate_scales" : "up_scales"), half, inter, d,
                                   half == 0 ? x.gate_scales : x.up_scales));
      EMBER_ASSIGN_OR_RETURN(Tensor b, bias(n + (half == 0 ? "gate_bias" : "up_bias"),
                                            gu_bias.data() + e * 2 * inter + half, 2, inter));
      (half == 0 ? x.gate_bias : x.up_bias).push_back(b);
    }
    EMBER_ASSIGN_OR_RETURN(
        Tensor dt, up.Converted(n + "down", dtype, {d, cols(inter)}, part(2), d * inter, keep));
    x.down.push_back(dt);
    EMBER_RETURN_IF_ERROR(scales(n + "down_scales", 2, d, inter, x.down_scales));
    EMBER_ASSIGN_OR_RETURN(Tensor db, bias(n + "down_bias", dn_bias.data() + e * d, 1, d));
    x.down_bias.push_back(db);
  }
  return Status::Ok();
}

// ---- qwen3_next (qwen3_next.cc runs these weights) ----
using RowRanges = std::vector<std::pair<int64_t, int64_t>>;

// Rows `ranges` of the checkpoint matrix `view` (rows of `cols`), uploaded as one [rows, cols].
Result<Tensor> UploadRowRanges(Uploader& up, const TensorView& view, const std::string& name,
                               int64_t cols, const RowRanges& ranges,
                               std::vector<std::vector<uint8_t>>& keep) {
  int64_t rows = 0;
  for (const auto& range : ranges) rows += range.second;
  const auto row_bytes = static_cast<int64_t>(DTypeRowBytes(view.dtype, cols));
  return up.Converted(
      name, view.dtype, {rows, cols},
      ConcatRowRanges(static_cast<const uint8_t*>(view.data), row_bytes, ranges), rows * cols,
      keep);
}

// A checkpoint tensor converted to float32 on the host (small vectors and the conv taps).
Result<Tensor> UploadF32(Uploader& up, const std::string& name, std::vector<int64_t> shape,
                         std::vector<int64_t> as_shape, std::vector<std::vector<uint8_t>>& keep) {
  EMBER_ASSIGN_OR_RETURN(TensorView view, up.View(name, std::move(shape)));
  int64_t numel = 1;
  for (int64_t dim : as_shape) numel *= dim;
  std::vector<uint8_t> bytes(static_cast<size_t>(numel) * sizeof(float));
  cpu::ConvertToF32(view.data, view.dtype, numel, reinterpret_cast<float*>(bytes.data()));
  return up.ConvertedF32(name, std::move(as_shape), std::move(bytes), numel, keep);
}

// q_proj [2 q_dim, hidden]: per head, head_dim query rows then head_dim gate rows.
Status LoadGatedQuery(const ModelConfig& c, const std::string& p, Uploader& up, LayerWeights* w,
                      std::vector<std::vector<uint8_t>>& keep) {
  const int64_t hd = c.head_dim, heads = c.num_heads, d = c.hidden_size;
  const std::string name = p + "self_attn.q_proj.weight";
  EMBER_ASSIGN_OR_RETURN(TensorView q, up.View(name, {2 * heads * hd, d}));
  RowRanges query, gate;
  for (int64_t h = 0; h < heads; ++h) {
    query.push_back({2 * h * hd, hd});
    gate.push_back({2 * h * hd + hd, hd});
  }
  EMBER_ASSIGN_OR_RETURN(w->wq, UploadRowRanges(up, q, name + " (query)", d, query, keep));
  EMBER_ASSIGN_OR_RETURN(w->wq_gate, UploadRowRanges(up, q, name + " (gate)", d, gate, keep));
  return Status::Ok();
}

// linear_attn.*: in_proj_qkvz's rows come per key head g as [q (dk) | k (dk) | v (r dv) | z
// (r dv)] and in_proj_ba's as [b (r) | a (r)], r = value heads per key head; regrouped by part.
Status LoadLinearAttention(const ModelConfig& c, const std::string& p, int64_t state_offset,
                           Uploader& up, LayerWeights* w,
                           std::vector<std::vector<uint8_t>>& keep) {
  const LinearAttentionConfig& la = c.linear;
  const int64_t d = c.hidden_size, kh = la.num_key_heads, vh = la.num_value_heads;
  const int64_t dk = la.key_head_dim, dv = la.value_head_dim, r = vh / kh;
  const int64_t group = 2 * dk + 2 * r * dv, conv_dim = la.conv_dim();
  const std::string a = p + "linear_attn.";
  LinearAttentionWeights L;
  L.state_offset = state_offset;
  EMBER_ASSIGN_OR_RETURN(TensorView qkvz, up.View(a + "in_proj_qkvz.weight", {kh * group, d}));
  RowRanges qkv, z;
  for (int64_t g = 0; g < kh; ++g) qkv.push_back({g * group, dk});
  for (int64_t g = 0; g < kh; ++g) qkv.push_back({g * group + dk, dk});
  for (int64_t g = 0; g < kh; ++g) qkv.push_back({g * group + 2 * dk, r * dv});
  for (int64_t g = 0; g < kh; ++g) z.push_back({g * group + 2 * dk + r * dv, r * dv});
  EMBER_ASSIGN_OR_RETURN(L.in_qkv,
                         UploadRowRanges(up, qkvz, a + "in_proj_qkvz (qkv)", d, qkv, keep));
  EMBER_ASSIGN_OR_RETURN(L.in_z, UploadRowRanges(up, qkvz, a + "in_proj_qkvz (z)", d, z, keep));
  EMBER_ASSIGN_OR_RETURN(TensorView ba, up.View(a + "in_proj_ba.weight", {2 * vh, d}));
  RowRanges ba_rows;
  for (int64_t g = 0; g < kh; ++g) ba_rows.push_back({g * 2 * r, r});
  for (int64_t g = 0; g < kh; ++g) ba_rows.push_back({g * 2 * r + r, r});
  EMBER_ASSIGN_OR_RETURN(L.in_ba, UploadRowRanges(up, ba, a + "in_proj_ba", d, ba_rows, keep));
  EMBER_ASSIGN_OR_RETURN(L.conv, UploadF32(up, a + "conv1d.weight", {conv_dim, 1, la.conv_kernel},
                                           {conv_dim, la.conv_kernel}, keep));
  EMBER_ASSIGN_OR_RETURN(L.a_log, UploadF32(up, a + "A_log", {vh}, {vh}, keep));
  EMBER_ASSIGN_OR_RETURN(L.dt_bias, UploadF32(up, a + "dt_bias", {vh}, {vh}, keep));
  EMBER_ASSIGN_OR_RETURN(L.norm, up.Get(a + "norm.weight", {dv}));
  EMBER_ASSIGN_OR_RETURN(L.out, up.Get(a + "out_proj.weight", {d, vh * dv}));
  w->linear = std::move(L);
  return Status::Ok();
}

// mlp.shared_expert.{gate,up,down}_proj into w_gate/w_up/w_down, and mlp.shared_expert_gate.
Status LoadSharedExpert(const ModelConfig& c, const std::string& p, Uploader& up,
                        LayerWeights* w) {
  const int64_t d = c.hidden_size, inter = c.shared_expert_intermediate_size;
  const std::string s = p + "mlp.shared_expert.";
  EMBER_ASSIGN_OR_RETURN(w->w_gate, up.Get(s + "gate_proj.weight", {inter, d}));
  EMBER_ASSIGN_OR_RETURN(w->w_up, up.Get(s + "up_proj.weight", {inter, d}));
  EMBER_ASSIGN_OR_RETURN(w->w_down, up.Get(s + "down_proj.weight", {d, inter}));
  EMBER_ASSIGN_OR_RETURN(w->shared_expert_gate,
                         up.Get(p + "mlp.shared_expert_gate.weight", {1, d}));
  return Status::Ok();
}

// A line per quarter of the layers while a checkpoint of at least 1 GiB loads (smaller ones load
// in well under a second).
void LogLoadProgress(int32_t layers_done, int32_t num_layers, int64_t file_bytes) {
  if (file_bytes < (int64_t{1} << 30) || num_layers < 4) return;
  const int32_t quarter = layers_done * 4 / num_layers;
  if (quarter == (layers_done - 1) * 4 / num_layers || quarter == 4) return;
  LOG_INFO << "loaded " << layers_done << " of " << num_layers << " layers ("
           << quarter * 25 << "% of " << (file_bytes >> 20) << " MiB)";
}

// Where LoadWeights finds the tensors outside the decoder layers, and the checkpoint index of
// layer 0 (an MTP module: MtpNames).
struct WeightNames {
  std::string embed, lm_head = "lm_head.weight", final_norm = "model.norm.weight";
  std::string layers = "model.layers.";  // layer l is layers + (l + first_layer) + "."
  int32_t first_layer = 0;
};

WeightNames ModelNames(const ModelConfig& c, const WeightStore& store) {
  WeightNames names;
  // Tied checkpoints may store the matrix under either name (tinystories keeps lm_head.weight).
  names.embed = store.Has("model.embed_tokens.weight") || !c.tie_word_embeddings
                    ? "model.embed_tokens.weight"
                    : "lm_head.weight";
  return names;
}

// ---- multi-token prediction (ModelLoadOptions::mtp_module) ----
// The MTP module of a deepseek_v3 checkpoint is its layer N = num_hidden_layers; qwen3_next's
// is mtp.* (one full-attention layer mtp.layers.0).
std::string MtpPrefix(const ModelConfig& main) {
  return main.model_type == "qwen3_next" ? "mtp."
                                         : "model.layers." + std::to_string(main.num_layers) + ".";
}

// The module's input tensors under MtpPrefix: embedding norm, hidden norm, projection.
struct MtpInputNames {
  std::string enorm, hnorm, proj;
};
MtpInputNames MtpInputNamesOf(const ModelConfig& main) {
  if (main.model_type == "qwen3_next")
    return {"pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "fc.weight"};
  return {"enorm.weight", "hnorm.weight", "eh_proj.weight"};
}

// Turns the model's config into its MTP module's (one layer: the checkpoint's layer N, a mixture
// of experts when N >= first_k_dense_replace, as the layer N of a deeper model would be), after
// checking that the checkpoint has one; errors name the model type or the missing tensors.
Status MtpModuleConfig(ModelConfig* c, const WeightStore& store, const std::string& source) {
  const bool next = c->model_type == "qwen3_next";
  if (c->model_type != "deepseek_v3" && !next)
    return Status::Error(source + ": model_type \"" + c->model_type +
                         "\" has no multi-token-prediction module Ember can load (deepseek_v3 "
                         "with num_nextn_predict_layers >= 1, qwen3_next's mtp.*)");
  if (!next && c->num_nextn_predict_layers < 1)
    return Status::Error(source + ": num_nextn_predict_layers is 0 (the "
                         "checkpoint declares no multi-token-prediction module)");
  const std::string p = MtpPrefix(*c);
  const MtpInputNames in = MtpInputNamesOf(*c);
  const std::string block = next ? "layers.0." : "";
  std::string missing;
  for (const std::string& name :
       {in.enorm, in.hnorm, in.proj, std::string(next ? "norm.weight" : "shared_head.norm.weight"),
        block + "input_layernorm.weight", block + "post_attention_layernorm.weight"})
    if (!store.Has(p + name)) missing += (missing.empty() ? "" : ", ") + p + name;
  if (!missing.empty())
    return Status::Error(source + ": the checkpoint has no multi-token-"
                         "prediction weights (" +
                         (next ? std::string("model_type qwen3_next")
                               : "num_nextn_predict_layers " +
                                     std::to_string(c->num_nextn_predict_layers)) +
                         ", but " + missing +
                         " not found; conversions that drop them, e.g. transformers', cannot "
                         "draft with mtp)");
  // deepseek_v3's module is a MoE block when N >= first_k_dense_replace (also where every main
  // layer is dense: a cut model's N can reach it); qwen3_next's is a MoE full-attention layer.
  const bool moe = next ? c->num_experts > 0 : c->num_layers >= c->first_dense_layers;
  c->moe_layers.assign(1, moe ? 1 : 0);
  c->layer_types.assign(1, LayerType::kFullAttention);
  c->num_layers = 1;
  return Status::Ok();
}

// An MTP module's names: layer 0 is the checkpoint's layer N; its own embed_tokens and
// shared_head.head when stored (the real checkpoint's equal the main model's), else the main
// model's; shared_head.norm as the final norm.
WeightNames MtpNames(const ModelConfig& main, const WeightStore& store) {
  WeightNames names = ModelNames(main, store);
  const std::string p = MtpPrefix(main);
  if (main.model_type == "qwen3_next") {  // mtp.layers.0, mtp.norm; the main embedding and head
    names.layers = p + "layers.";
    names.final_norm = p + "norm.weight";
    return names;
  }
  names.first_layer = main.num_layers;
  if (store.Has(p + "embed_tokens.weight")) names.embed = p + "embed_tokens.weight";
  if (store.Has(p + "shared_head.head.weight")) names.lm_head = p + "shared_head.head.weight";
  names.final_norm = p + "shared_head.norm.weight";
  return names;
}

Status LoadWeights(const ModelConfig& c, const WeightStore& store, Backend& be,
                   std::optional<DType> quantize, const WeightNames& names, Model::Impl* m) {
  Uploader up(store, be, quantize, m->host_weights);
  const int64_t d = c.hidden_size, hd = c.head_dim, inter = c.intermediate_size;
  const int64_t q_dim = c.num_heads * hd, kv_dim = c.num_kv_heads * hd, vocab = c.vocab_size;
  EMBER_ASSIGN_OR_RETURN(m->embed, up.Get(names.embed, {vocab, d}));
  if (c.tie_word_embeddings && names.lm_head == "lm_head.weight")
    m->lm_head = m->embed;
  else {
    EMBER_ASSIGN_OR_RETURN(m->lm_head, up.Get(names.lm_head, {vocab, d}));
  }
  EMBER_ASSIGN_OR_RETURN(m->final_norm, up.Get(names.final_norm, {d}));

  EMBER_ASSIGN_OR_RETURN(int32_t global_rope, be.CreateRope(MakeRopeSpec(c, c.rope)));
  int32_t local_rope = global_rope;
  if (!SameRope(c.rope, c.rope_local)) {
    EMBER_ASSIGN_OR_RETURN(local_rope, be.CreateRope(MakeRopeSpec(c, c.rope_local)));
  }
  const bool gemma = IsGemma(c);
  int64_t state_offset = 0;  // floats into a state slot (linear-attention layers)
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = names.layers + std::to_string(l + names.first_layer) + ".";
    LayerWeights w;
    EMBER_ASSIGN_OR_RETURN(w.attn_norm, up.Get(p + "input_layernorm.weight", {d}));
    EMBER_ASSIGN_OR_RETURN(w.post_attn_norm, up.Get(p + "post_attention_layernorm.weight", {d}));
    const bool linear = c.layer_types[static_cast<size_t>(l)] == LayerType::kLinearAttention;
    w.kv_layer = KvLayerIndex(c, l);
    if (c.mla()) {
      EMBER_RETURN_IF_ERROR(LoadMlaAttention(c, p, up, &w, m->host_weights));
    } else if (linear) {
      EMBER_RETURN_IF_ERROR(
          LoadLinearAttention(c, p, state_offset, up, &w, m->host_weights));
      state_offset += c.linear.state_floats();
    } else if (c.fused_qkv) {  // phi3: rows [q | k | v] and [gate | up] of one matrix each
      EMBER_ASSIGN_OR_RETURN(Tensor qkv,
                             up.Get(p + "self_attn.qkv_proj.weight", {q_dim + 2 * kv_dim, d}));
      w.wq = qkv.RowSlice(0, q_dim);
      w.wk = qkv.RowSlice(q_dim, kv_dim);
      w.wv = qkv.RowSlice(q_dim + kv_dim, kv_dim);
      EMBER_ASSIGN_OR_RETURN(Tensor gate_up, up.Get(p + "mlp.gate_up_proj.weight", {2 * inter, d}));
      w.w_gate = gate_up.RowSlice(0, inter);
      w.w_up = gate_up.RowSlice(inter, inter);
    } else {
      if (c.attn_output_gate) {
        EMBER_RETURN_IF_ERROR(LoadGatedQuery(c, p, up, &w, m->host_weights));
      } else {
        EMBER_ASSIGN_OR_RETURN(w.wq, up.Get(p + "self_attn.q_proj.weight", {q_dim, d}));
      }
      EMBER_ASSIGN_OR_RETURN(w.wk, up.Get(p + "self_attn.k_proj.weight", {kv_dim, d}));
      EMBER_ASSIGN_OR_RETURN(w.wv, up.Get(p + "self_attn.v_proj.weight", {kv_dim, d}));
    }
    if (!c.mla() && !linear) {
      EMBER_ASSIGN_OR_RETURN(w.wo, up.Get(p + "self_attn.o_proj.weight", {d, q_dim}));
    }
    if (!c.moe_layers.empty() && c.moe_layers[static_cast<size_t>(l)] != 0) {
      if (c.moe_biased) {
        EMBER_RETURN_IF_ERROR(LoadGptOssExperts(c, p, up, &w, m->host_weights));
      } else {
        EMBER_RETURN_IF_ERROR(LoadExperts(c, p, up, &w));
      }
      if (c.moe_routing == MoeRouting::kSigmoidGrouped) {
        EMBER_RETURN_IF_ERROR(LoadGroupedRouting(c, p, up, &w));
      }
      if (c.shared_expert_intermediate_size > 0)
        EMBER_RETURN_IF_ERROR(LoadSharedExpert(c, p, up, &w));
    } else {
      if (!c.fused_qkv) {
        EMBER_ASSIGN_OR_RETURN(w.w_gate, up.Get(p + "mlp.gate_proj.weight", {inter, d}));
        EMBER_ASSIGN_OR_RETURN(w.w_up, up.Get(p + "mlp.up_proj.weight", {inter, d}));
      }
      EMBER_ASSIGN_OR_RETURN(w.w_down, up.Get(p + "mlp.down_proj.weight", {d, inter}));
    }
    const bool attn_bias = c.attention_bias && !linear;
    EMBER_ASSIGN_OR_RETURN(w.bq,
                           up.GetOptional(p + "self_attn.q_proj.bias", {q_dim}, attn_bias));
    EMBER_ASSIGN_OR_RETURN(w.bk,
                           up.GetOptional(p + "self_attn.k_proj.bias", {kv_dim}, attn_bias));
    EMBER_ASSIGN_OR_RETURN(w.bv,
                           up.GetOptional(p + "self_attn.v_proj.bias", {kv_dim}, attn_bias));
    EMBER_ASSIGN_OR_RETURN(w.bo,
                           up.GetOptional(p + "self_attn.o_proj.bias", {d}, c.o_bias && !linear));
    EMBER_ASSIGN_OR_RETURN(w.sinks,
                           up.GetOptional(p + "self_attn.sinks", {c.num_heads}, c.attention_sinks));
    EMBER_ASSIGN_OR_RETURN(
        w.q_norm, up.GetOptional(p + "self_attn.q_norm.weight", {hd}, c.qk_norm && !linear));
    EMBER_ASSIGN_OR_RETURN(
        w.k_norm, up.GetOptional(p + "self_attn.k_norm.weight", {hd}, c.qk_norm && !linear));
    EMBER_ASSIGN_OR_RETURN(w.pre_ffn_norm,
                           up.GetOptional(p + "pre_feedforward_layernorm.weight", {d}, gemma));
    EMBER_ASSIGN_OR_RETURN(w.post_ffn_norm,
                           up.GetOptional(p + "post_feedforward_layernorm.weight", {d}, gemma));
    const bool sliding = c.layer_types[static_cast<size_t>(l)] == LayerType::kSlidingAttention;
    w.sliding_window = sliding ? c.sliding_window : 0;
    w.rope_id = sliding ? local_rope : global_rope;
    m->layers.push_back(std::move(w));
    LogLoadProgress(l + 1, c.num_layers, store.total_file_bytes());
  }
  m->num_parameters = up.num_parameters;
  return Status::Ok();
}

// An MTP module's input weights (MtpWeights): enorm, hnorm, and eh_proj [hidden, 2 hidden] split
// on the host into its embedding and hidden column halves, float32.
Status LoadMtpWeights(const ModelConfig& main, const WeightStore& store, Backend& be,
                      Model::Impl* m) {
  Uploader up(store, be, std::nullopt, m->host_weights);
  const int64_t d = main.hidden_size;
  const std::string p = MtpPrefix(main);
  const MtpInputNames in = MtpInputNamesOf(main);
  MtpWeights w;
  if (main.model_type == "qwen3_next") {
    w.norm_kind = RmsNormKind::kOnePlusWeight;
    w.zero_position_zero = false;
  }
  EMBER_ASSIGN_OR_RETURN(w.enorm, up.Get(p + in.enorm, {d}));
  EMBER_ASSIGN_OR_RETURN(w.hnorm, up.Get(p + in.hnorm, {d}));
  EMBER_ASSIGN_OR_RETURN(TensorView eh, up.View(p + in.proj, {d, 2 * d}));
  const size_t row_bytes = DTypeRowBytes(eh.dtype, 2 * d);
  std::vector<float> row(static_cast<size_t>(2 * d));
  std::vector<uint8_t> halves[2];
  for (auto& half : halves) half.resize(static_cast<size_t>(d * d) * sizeof(float));
  for (int64_t r = 0; r < d; ++r) {
    cpu::ConvertToF32(static_cast<const uint8_t*>(eh.data) + static_cast<size_t>(r) * row_bytes,
                      eh.dtype, 2 * d, row.data());
    for (int part = 0; part < 2; ++part)
      std::memcpy(halves[part].data() + static_cast<size_t>(r * d) * sizeof(float),
                  row.data() + part * d, static_cast<size_t>(d) * sizeof(float));
  }
  EMBER_ASSIGN_OR_RETURN(w.e_proj, up.Converted(p + in.proj + "[:, :hidden]", DType::kF32,
                                                {d, d}, std::move(halves[0]), d * d,
                                                m->host_weights));
  EMBER_ASSIGN_OR_RETURN(w.h_proj, up.Converted(p + in.proj + "[:, hidden:]", DType::kF32,
                                                {d, d}, std::move(halves[1]), d * d,
                                                m->host_weights));
  m->mtp = w;
  m->num_parameters += up.num_parameters;
  return Status::Ok();
}

// What Model::Load reads before it touches the backend.
struct Checkpoint {
  ModelConfig config;
  GenerationDefaults generation;
  std::unique_ptr<WeightStore> weights;
  std::string config_source;  // the file the config came from (for messages)
  std::string config_digest;  // SHA-256 of config.json's text (HF folders; GGUF: empty)
};

// The text Model::KvFingerprint digests: what decides the bits of a KV block.
std::string KvFingerprintText(const ModelConfig& c, const Checkpoint& ckpt,
                              const WeightStore& weights, const Backend& backend,
                              const ModelLoadOptions& opts) {
  std::ostringstream out;
  out << "ember kv layout " << Model::kKvLayoutVersion
      << " (per layer K then V rows [block_size, num_kv_heads, head_dim])\n"
      << "model_type " << c.model_type << " layers " << c.num_layers << " heads " << c.num_heads
      << " kv_heads " << c.num_kv_heads << " head_dim " << c.head_dim << " hidden "
      << c.hidden_size << " vocab " << c.vocab_size << " rope " << c.rope.type << " "
      << c.rope.theta << " " << c.rope.factor << " local " << c.rope_local.theta
      << " sliding_window " << c.sliding_window << "\n"
      << (c.mla() ? "mla latent pool (per layer [block_size, kv_lora_rank + qk_rope_head_dim]) "
                    "kv_lora_rank " + std::to_string(c.kv_lora_rank) + " qk_rope_head_dim " +
                        std::to_string(c.qk_rope_head_dim) + " rope_interleave " +
                        std::to_string(c.rope_interleave) + "\n"
                  : std::string())
      << "config " << (ckpt.config_digest.empty() ? "(gguf metadata)" : ckpt.config_digest)
      << "\n"
      << weights.Fingerprint() << "backend " << backend.name() << " kv_element_bytes "
      << backend.KvElementBytes(c.head_dim) << " kv_dtypes " << backend.KvFormatText(c.head_dim)
      << " quantize "
      << (opts.quantize ? DTypeName(*opts.quantize) : "none") << " cpu_matmul "
      << CpuMatmulName(opts.cpu_matmul) << " cuda_f32_compute " << opts.cuda_f32_compute
      << " cuda_batch_invariant " << opts.cuda_batch_invariant << "\n";
  return out.str();
}

// A Hugging Face folder: config.json (or opts.config_file), generation_config.json, safetensors.
Result<Checkpoint> ReadHuggingFaceCheckpoint(const std::string& dir, const ModelLoadOptions& opts) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::Error(dir + ": model directory not found (expected a folder or a .gguf file)");
  Checkpoint ckpt;
  ckpt.config_source = dir + "/" + opts.config_file;
  if (!FileExists(ckpt.config_source)) return Status::Error(ckpt.config_source + ": file not found");
  EMBER_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(ckpt.config_source));
  EMBER_ASSIGN_OR_RETURN(ckpt.config, ParseModelConfig(config_text, ckpt.config_source));
  ckpt.config_digest = HexOf(Sha256Of(config_text));
  const std::string gen_path = dir + "/generation_config.json";
  std::string gen_text;
  if (FileExists(gen_path)) {
    EMBER_ASSIGN_OR_RETURN(gen_text, ReadFileToString(gen_path));
  }
  EMBER_ASSIGN_OR_RETURN(ckpt.generation, ParseGenerationConfig(gen_text, gen_path, ckpt.config));
  EMBER_ASSIGN_OR_RETURN(ckpt.weights, WeightStore::Open(dir));
  return ckpt;
}

// One GGUF file: config and generation defaults from its metadata, its tensors (gguf_model.h).
Result<Checkpoint> ReadGgufCheckpoint(const std::string& path, const Backend& backend) {
  EMBER_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  auto shared = std::make_shared<const GgufFile>(std::move(file));
  Checkpoint ckpt;
  ckpt.config_source = path;
  EMBER_ASSIGN_OR_RETURN(ckpt.config, GgufModelConfig(*shared));
  ckpt.generation = GgufGenerationDefaults(ckpt.config);
  std::string summary;
  const KeepQuantized keep = [&backend](DType t) { return backend.TakesQuantizedWeights(t); };
  EMBER_ASSIGN_OR_RETURN(ckpt.weights, OpenGgufWeights(shared, ckpt.config, keep, &summary));
  LOG_INFO << summary;
  return ckpt;
}

}  // namespace

Model::~Model() = default;

Status Model::EnableLora(int32_t max_loras, int32_t max_rank) {
  CHECK(lora_ == nullptr);
  EMBER_ASSIGN_OR_RETURN(lora_, LoraSet::Create(backend_.get(), &config_, max_loras, max_rank));
  impl_->lora = lora_.get();
  return Status::Ok();
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& dir, const ModelLoadOptions& opts) {
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(opts));
  return Load(dir, std::move(backend), opts);
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                           std::unique_ptr<Backend> backend,
                                           const ModelLoadOptions& opts) {
  CHECK(backend != nullptr);
  auto model = std::unique_ptr<Model>(new Model());
  EMBER_ASSIGN_OR_RETURN(
      Checkpoint checkpoint,
      IsGgufFile(dir) ? ReadGgufCheckpoint(dir, *backend) : ReadHuggingFaceCheckpoint(dir, opts));
  model->config_ = std::move(checkpoint.config);
  model->generation_ = std::move(checkpoint.generation);
  model->weights_ = std::move(checkpoint.weights);
  const std::string& config_path = checkpoint.config_source;
  model->backend_ = std::move(backend);
  WeightNames names = ModelNames(model->config_, *model->weights_);
  const ModelConfig main_config = model->config_;
  if (opts.mtp_module) {
    names = MtpNames(model->config_, *model->weights_);
    EMBER_RETURN_IF_ERROR(MtpModuleConfig(&model->config_, *model->weights_, config_path));
    if (const std::string why = model->backend_->MtpUnsupported(); !why.empty())
      return Status::Error(config_path + ": " + why + "; run it with --device cpu");
    model->mtp_module_ = true;
  }
  if (const ModelConfig& c = model->config_;
      (c.mla() || c.moe_routing != MoeRouting::kSoftmax) && !model->backend_->TakesMla())
    return Status::Error(config_path + ": model_type \"" + c.model_type +
                         "\" (multi-head latent attention) is not supported on the " +
                         model->backend_->name() + " backend yet; run it with --device cpu");
  if (const ModelConfig& c = model->config_; RecurrentStateFloats(c) > 0) {
    const std::string why = model->backend_->RecurrentUnsupported();
    if (!why.empty())
      return Status::Error(config_path + ": model_type \"" + c.model_type + "\": " + why +
                           "; run it with --device cpu");
  }
  if (const ModelConfig& c = model->config_; c.num_experts > 0) {
    const std::string why = model->backend_->MoeUnsupported(
        c.num_experts, c.num_experts_per_tok, c.hidden_size, c.moe_intermediate_size);
    if (!why.empty())
      return Status::Error(config_path + ": model_type \"" + c.model_type +
                           "\" (mixture of experts): " + why +
                           (model->backend_->name() == "cpu" ? "" : "; run it with --device cpu"));
  }
  EMBER_ASSIGN_OR_RETURN(const KvFormat kv_format,
                         ResolveKvFormat(opts.kv_cache, KvLayerCount(model->config_)));
  if (model->config_.mla()) {  // the latent pool is float32 rows of [c | k_rope]
    for (KvDType t : kv_format.layers)
      if (t != KvDType::kAuto && t != KvDType::kF32)
        return Status::Error("--kv-cache-dtype " + std::string(KvDTypeName(t)) +
                             ": not supported with multi-head latent attention (model_type \"" +
                             model->config_.model_type + "\") yet; its latent KV pool is f32");
  }
  EMBER_RETURN_IF_ERROR(model->backend_->SetKvFormat(kv_format, model->config_.head_dim));
  model->impl_ = std::make_unique<Impl>();
  model->impl_->config = &model->config_;
  model->impl_->backend = model->backend_.get();
  const auto start = std::chrono::steady_clock::now();
  LOG_INFO << "loading " << dir << ": " << (model->weights_->total_file_bytes() >> 20)
           << " MiB of " << model->config_.torch_dtype << " weights, "
           << model->config_.num_layers << " layers, onto the " << model->backend_->name()
           << " backend";
  EMBER_RETURN_IF_ERROR(
      LoadWeights(model->config_, *model->weights_, *model->backend_, opts.quantize, names,
                  model->impl_.get()));
  if (opts.mtp_module) {
    EMBER_RETURN_IF_ERROR(
        LoadMtpWeights(main_config, *model->weights_, *model->backend_, model->impl_.get()));
  }
  model->kv_fingerprint_ =
      KvFingerprintText(model->config_, checkpoint, *model->weights_, *model->backend_, opts);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG_INFO << "loaded " << model->impl_->num_parameters << " parameters in " << seconds << " s";
  return model;
}

int64_t Model::KvBytesPerToken() const {
  if (config_.mla()) {  // the latent pool: [c | k_rope] per layer, no V, float32 on every backend
    const int32_t width = config_.kv_lora_rank + config_.qk_rope_head_dim;
    return int64_t{config_.num_layers} * width * static_cast<int64_t>(sizeof(float));
  }
  return backend_->KvTokenBytes(KvLayerCount(config_), config_.num_kv_heads, config_.head_dim);
}

std::string Model::KvDTypes() const {
  if (config_.mla()) return "f32";  // the latent pool, on every backend
  return backend_->KvFormatText(config_.head_dim);
}

int64_t Model::StepWorkspaceBytes(int64_t step_tokens, int64_t logits_rows) const {
  // A logits row: float32 logits and its gathered hidden row (at most as wide).
  const int64_t logits = logits_rows * config_.vocab_size * 4 * 2;
  return 2 * (step_tokens * DecoderActivationBytesPerRow(config_) + logits) + (int64_t{512} << 20);
}

Result<BackendMemory> Model::MemoryInfo() const {
  return backend_->MemoryInfo();
}

int64_t Model::WeightBytes() const {
  return weights_->total_file_bytes();
}
int64_t Model::NumParameters() const {
  return impl_->num_parameters;
}

Status Model::AllocateKvCache(int32_t num_blocks, int32_t block_size, int32_t num_state_slots) {
  if (num_kv_blocks_ != 0) return Status::Error("AllocateKvCache called twice");
  if (config_.mla()) {
    EMBER_RETURN_IF_ERROR(backend_->AllocateLatentKvPool(
        config_.num_layers, num_blocks, block_size,
        config_.kv_lora_rank + config_.qk_rope_head_dim));
  } else {
    EMBER_RETURN_IF_ERROR(backend_->AllocateKvPool(KvLayerCount(config_), num_blocks, block_size,
                                                   config_.num_kv_heads, config_.head_dim));
  }
  if (const int64_t floats = RecurrentStateFloats(config_); floats > 0) {
    EMBER_RETURN_IF_ERROR(backend_->AllocateStateSlots(num_state_slots, floats));
    num_state_slots_ = num_state_slots;
  }
  num_kv_blocks_ = num_blocks;
  kv_block_size_ = block_size;
  return Status::Ok();
}

int64_t Model::StateBytesPerSequence() const {
  return RecurrentStateFloats(config_) * static_cast<int64_t>(sizeof(float));
}

Status Model::CopyStateSlot(int32_t src, int32_t dst) {
  if (num_state_slots_ == 0) return Status::Error("CopyStateSlot: the model has no state slots");
  if (src < 0 || src >= num_state_slots_ || dst < 0 || dst >= num_state_slots_)
    return Status::Error("CopyStateSlot: slot " + std::to_string(src) + " -> " +
                         std::to_string(dst) + " outside the " + std::to_string(num_state_slots_) +
                         " allocated");
  return backend_->CopyStateSlot(src, dst);
}

namespace {
Status CheckHostStateCopy(int32_t slot, int32_t num_slots, size_t bytes, int64_t want) {
  if (num_slots == 0) return Status::Error("state slot copy: the model has no state slots");
  if (slot < 0 || slot >= num_slots)
    return Status::Error("state slot copy: slot " + std::to_string(slot) + " outside the " +
                         std::to_string(num_slots) + " allocated");
  if (static_cast<int64_t>(bytes) != want)
    return Status::Error("state slot copy: " + std::to_string(bytes) + " bytes, a slot holds " +
                         std::to_string(want));
  return Status::Ok();
}
}  // namespace

Status Model::CopyStateSlotToHost(int32_t slot, std::span<uint8_t> out) {
  EMBER_RETURN_IF_ERROR(
      CheckHostStateCopy(slot, num_state_slots_, out.size(), StateBytesPerSequence()));
  return backend_->CopyStateSlotToHost(slot, out);
}

Status Model::CopyStateSlotFromHost(int32_t slot, std::span<const uint8_t> in) {
  EMBER_RETURN_IF_ERROR(
      CheckHostStateCopy(slot, num_state_slots_, in.size(), StateBytesPerSequence()));
  return backend_->CopyStateSlotFromHost(slot, in);
}

int64_t Model::KvBlockBytes() const {
  return backend_->KvBlockBytes();
}
Status Model::CopyKvBlocksToHost(std::span<const int32_t> blocks,
                                 std::span<const std::span<uint8_t>> outs) {
  return backend_->CopyKvBlocksToHost(blocks, outs);
}
Status Model::CopyKvBlockFromHost(int32_t block_id, std::span<const uint8_t> in) {
  return backend_->CopyKvBlockFromHost(block_id, in);
}

bool Model::HasPinnedHost() const { return backend_->HasPinnedHost(); }

void* Model::AllocPinnedHost(size_t bytes) { return backend_->AllocPinnedHost(bytes); }

void Model::FreePinnedHost(void* p) { backend_->FreePinnedHost(p); }

Status Model::CopyKvBlockFromPinned(int32_t block_id, std::span<const uint8_t> in) {
  return backend_->CopyKvBlockFromPinned(block_id, in);
}

bool Model::PinnedReadsDone(bool wait) { return backend_->PinnedReadsDone(wait); }

Status Model::Forward(const BatchPlan& plan, std::span<float> logits) {
  return Forward(plan, StepOutputs{logits, {}, {}, {}});
}

Status Model::Forward(const BatchPlan& plan, const StepOutputs& outputs) {
  const std::span<float> logits = outputs.logits;
  if (outputs.hidden_rows < 0 ||
      static_cast<size_t>(outputs.hidden_rows) > plan.logits_rows.size() ||
      outputs.hidden.size() !=
          static_cast<size_t>(outputs.hidden_rows) * static_cast<size_t>(config_.hidden_size))
    return Status::Error("StepOutputs: hidden_rows " + std::to_string(outputs.hidden_rows) +
                         " needs a [rows, hidden_size] span within the plan's logits rows");
  if (outputs.hidden_rows > 0 && outputs.defer_ids)
    return Status::Error("StepOutputs: defer_ids with hidden-state rows");
  const size_t hidden_floats =
      static_cast<size_t>(plan.num_tokens()) * static_cast<size_t>(config_.hidden_size);
  if (!outputs.final_hidden.empty() &&
      (outputs.final_hidden.size() != hidden_floats || outputs.defer_ids))
    return Status::Error("StepOutputs: final_hidden needs [num_tokens, hidden_size] floats and "
                         "no defer_ids");
  if (mtp_module_ ? outputs.mtp_hidden.size() != hidden_floats : !outputs.mtp_hidden.empty())
    return Status::Error(mtp_module_ ? "StepOutputs: an MTP module's step needs mtp_hidden "
                                       "[num_tokens, hidden_size]"
                                     : "StepOutputs: mtp_hidden for a model that is not an "
                                       "MTP module");
  // The rows that go through the LM head (the hidden-state rows are the plan's last).
  const size_t rows = plan.logits_rows.size() - static_cast<size_t>(outputs.hidden_rows);
  if (!outputs.row_kinds.empty() && (outputs.row_kinds.size() != rows ||
                                     outputs.ids.size() != rows || outputs.sampling.size() != rows))
    return Status::Error("StepOutputs: row_kinds/sampling/ids need one entry per logits row (" +
                         std::to_string(rows) + ")");
  if (num_kv_blocks_ == 0) return Status::Error("Forward before AllocateKvCache");
  if (plan.block_size != kv_block_size_)
    return Status::Error("plan block_size " + std::to_string(plan.block_size) +
                         " != KV block size " + std::to_string(kv_block_size_));
  if (std::string bad = plan.Validate(num_kv_blocks_); !bad.empty())
    return Status::Error("invalid BatchPlan: " + bad);
  if (logits.size() != rows * static_cast<size_t>(config_.vocab_size))
    return Status::Error("logits span has " + std::to_string(logits.size()) + " floats, expected " +
                         std::to_string(rows) + " x vocab " +
                         std::to_string(config_.vocab_size));
  for (int32_t id : plan.token_ids) {
    if (id >= config_.vocab_size)
      return Status::Error("token id " + std::to_string(id) + " outside the vocabulary (" +
                           std::to_string(config_.vocab_size) + ")");
    if (id < 0) {
      const int64_t r = -1 - static_cast<int64_t>(id);
      if (r >= static_cast<int64_t>(made_ids_.size()) || made_ids_[static_cast<size_t>(r)] == 0)
        return Status::Error("fed token id " + std::to_string(id) + " names logits row " +
                             std::to_string(r) + ", for which the last step made no id");
    }
  }
  if (outputs.defer_ids) {
    if (outputs.row_kinds.empty() && rows > 0)
      return Status::Error("StepOutputs: defer_ids without row_kinds");
    for (RowOutput kind : outputs.row_kinds)
      if (kind == RowOutput::kCopy)
        return Status::Error("StepOutputs: defer_ids with a kCopy row");
  }
  for (const SequenceSlice& seq : plan.seqs)
    if (num_state_slots_ > 0 && (seq.state_slot < 0 || seq.state_slot >= num_state_slots_))
      return Status::Error("state slot " + std::to_string(seq.state_slot) + " outside the " +
                           std::to_string(num_state_slots_) + " allocated");
  for (const SequenceSlice& seq : plan.seqs) {
    if (seq.snapshot_slot < 0) continue;
    if (num_state_slots_ == 0 || seq.snapshot_slot + seq.query_len - 1 > num_state_slots_)
      return Status::Error("snapshot slots " + std::to_string(seq.snapshot_slot) + " + " +
                           std::to_string(seq.query_len - 1) + " outside the " +
                           std::to_string(num_state_slots_) + " allocated state slots");
    const std::string why = backend_->StateSnapshotsUnsupported();
    if (!why.empty()) return Status::Error(why);
  }
  for (int32_t pos : plan.positions)
    if (pos >= config_.max_position_embeddings)
      return Status::Error("position " + std::to_string(pos) + " beyond max_position_embeddings " +
                           std::to_string(config_.max_position_embeddings));
  made_ids_.clear();  // fed tokens name only the step just before theirs
  if (plan.num_tokens() == 0) {
    // (A deferred step must reach the backend: each one is paired with a WaitIds.)
    if (outputs.defer_ids) return Status::Error("StepOutputs: defer_ids for a plan without rows");
    return Status::Ok();
  }
  for (const SequenceSlice& seq : plan.seqs)
    if (seq.lora_slot >= 0 && (lora_ == nullptr || seq.lora_slot >= lora_->max_loras()))
      return Status::Error("plan: lora_slot " + std::to_string(seq.lora_slot) +
                           " without such a LoRA slot (Model::EnableLora)");
  EMBER_RETURN_IF_ERROR(backend_->BeginStep(plan));
  if (lora_ != nullptr) lora_->BeginStep(plan);
  if (outputs.defer_ids) backend_->DeferStepIds();
  Status st = config_.mla()                      ? ForwardDeepseek(*impl_, plan, outputs)
              : IsGemma(config_)                   ? ForwardGemma(*impl_, plan, outputs)
              : config_.model_type == "qwen3_next" ? ForwardQwen3Next(*impl_, plan, outputs)
                                                   : ForwardLlama(*impl_, plan, outputs);
  if (!st.ok()) {
    if (outputs.defer_ids) backend_->DropStepIds();
    return st;
  }
  for (RowOutput kind : outputs.row_kinds) made_ids_.push_back(kind != RowOutput::kCopy);
  return Status::Ok();
}

}  // namespace ember
