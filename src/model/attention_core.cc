#include "model/architecture.h"

#include <initializer_list>
#include <string>
#include <vector>

namespace ember {

DecoderActivations AllocDecoderActivations(Backend& be, const ModelConfig& c, int64_t n,
                                           bool matmul_delta) {
  bool dense = c.num_experts == 0;
  for (uint8_t moe : c.moe_layers) dense |= moe == 0;
  const int64_t d = c.hidden_size, inter = dense ? c.intermediate_size : 1;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  return DecoderActivations{be.Alloc({n, d}),
                            be.AllocMatMulInput({n, d}),
                            be.Alloc({n, q_dim}),
                            be.Alloc({n, kv_dim}),
                            be.Alloc({n, kv_dim}),
                            be.Alloc({n, q_dim}),
                            matmul_delta ? be.AllocMatMulOutput({n, d}) : be.Alloc({n, d}),
                            be.AllocMatMulOutput({n, inter}),
                            be.AllocMatMulOutput({n, inter}),
                            be.AllocMatMulInput({n, inter})};
}

int64_t DecoderActivationBytesPerRow(const ModelConfig& c) {
  const int64_t d = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  // x, xn, delta, the final norm's output; q, att; k, v; gate, up, act.
  int64_t floats = 4 * d + 2 * q_dim + 2 * kv_dim + 3 * inter;
  if (c.num_experts > 0)
    floats += d + c.num_experts +
              int64_t{c.num_experts_per_tok} * (c.moe_intermediate_size + d + 4);
  if (c.mla())  // q LoRA, q, c, k_rope, att (v wide); the MoE input and the shared experts' MLP
    floats += c.q_lora_rank + int64_t{c.num_heads} * (c.qk_nope_head_dim + c.qk_rope_head_dim) +
              c.kv_lora_rank + c.qk_rope_head_dim + int64_t{c.num_heads} * c.v_head_dim + d +
              3 * int64_t{c.moe_shared_experts} * c.moe_intermediate_size + d;
  if (c.linear.num_value_heads > 0) {  // qwen3_next: the q gate, DeltaNet and shared-expert rows
    const int64_t v_width = int64_t{c.linear.num_value_heads} * c.linear.value_head_dim;
    floats += q_dim + c.linear.conv_dim() + 2 * v_width + 2 * c.linear.num_value_heads + d + 1 +
              3 * c.shared_expert_intermediate_size;
  }
  return 4 * floats;
}

Tensor FinalNormOut(Backend& be, const Tensor& xn) {
  return xn.dtype == DType::kF32 ? xn : be.Alloc({xn.rows(), xn.cols()});
}

void AttentionCore(Backend& be, const ModelConfig& c, const LayerWeights& w, int32_t layer,
                   RmsNormKind norm_kind, Tensor q, Tensor k, const Tensor& v, Tensor att) {
  const int64_t n = q.dim(0);
  const int64_t hd = c.head_dim;
  if (w.q_norm) {  // qwen3, gemma3: RMSNorm over each head's vector before RoPE
    Tensor q_heads = q.Reshape({n * c.num_heads, hd});
    Tensor k_heads = k.Reshape({n * c.num_kv_heads, hd});
    be.RmsNorm(q_heads, *w.q_norm, c.rms_norm_eps, norm_kind, q_heads);
    be.RmsNorm(k_heads, *w.k_norm, c.rms_norm_eps, norm_kind, k_heads);
  }
  AttentionParams ap;
  ap.layer = layer;
  ap.num_heads = c.num_heads;
  ap.num_kv_heads = c.num_kv_heads;
  ap.head_dim = c.head_dim;
  ap.scale = c.attention_scale;
  ap.sliding_window = w.sliding_window;
  ap.softcap = c.attn_logit_softcapping;  // 0 (none) outside gemma2
  ap.sinks = w.sinks ? &*w.sinks : nullptr;
  // RoPE on q and k, k and v into the KV pool, attention of q over the pool.
  be.RopeWriteKvAttention(w.rope_id, ap, q.Reshape({n, c.num_heads, hd}), k, v, att);
}

namespace {

// FinishStep's logits rows: gathered from the final norm's output, the LM head on all but the
// hidden-state rows, EmitLogits, CopyHiddenRows.
Status LogitsAndHiddenRows(const Model::Impl& m, const Tensor& normed, float final_softcap,
                           int64_t num_logits, const StepOutputs& outputs) {
  const ModelConfig& c = *m.config;
  Backend& be = *m.backend;
  Tensor hidden = be.Alloc({num_logits, c.hidden_size});  // final hidden state of the logits rows
  be.GatherLogitsRows(normed, hidden);
  // The last outputs.hidden_rows rows are hidden-state rows (embeddings): no LM head.
  const int64_t lm_rows = num_logits - outputs.hidden_rows;
  if (lm_rows > 0) {
    Tensor out = be.Alloc({lm_rows, c.vocab_size});
    be.MatMul(hidden.RowSlice(0, lm_rows), m.lm_head, nullptr, out);
    if (final_softcap > 0.0f) be.Softcap(out, final_softcap);
    EMBER_RETURN_IF_ERROR(EmitLogits(be, out, outputs));
  }
  return CopyHiddenRows(be, hidden, outputs);
}

}  // namespace

// The step's LoRA updates of `layer`'s projections `targets` (targets[i] writes outs[i]) into
// `parts`, those with segments only; returns how many.
static size_t LoraPartsOf(const Model::Impl& m, size_t layer,
                          std::initializer_list<LoraTarget> targets, std::span<const Tensor> outs,
                          LoraPart (&parts)[kMaxLoraParts]) {
  CHECK_EQ(outs.size(), targets.size());
  CHECK_LE(targets.size(), kMaxLoraParts);
  if (m.lora == nullptr) return 0;
  size_t count = 0, i = 0;
  for (const LoraTarget target : targets) {
    const std::span<const LoraSegment> segments =
        m.lora->Segments(static_cast<int32_t>(layer), target);
    if (!segments.empty()) parts[count++] = LoraPart{segments, outs[i]};
    ++i;
  }
  return count;
}

void ProjectWithLora(const Model::Impl& m, size_t layer, const Tensor& x,
                     std::span<const MatMulPart> products,
                     std::initializer_list<LoraTarget> targets) {
  CHECK_EQ(products.size(), targets.size());
  CHECK_LE(products.size(), kMaxLoraParts);
  Tensor outs[kMaxLoraParts];
  for (size_t i = 0; i < products.size(); ++i) outs[i] = products[i].out;
  LoraPart parts[kMaxLoraParts];
  const size_t count =
      LoraPartsOf(m, layer, targets, std::span<const Tensor>(outs, products.size()), parts);
  if (count == 0 && products.size() == 1) {
    m.backend->MatMul(x, *products[0].weight, products[0].bias, products[0].out);
  } else if (count == 0) {
    m.backend->MatMulGroup(x, products);
  } else {
    m.backend->MatMulGroupLora(x, products, std::span<const LoraPart>(parts, count));
  }
}

void GateUpWithLora(const Model::Impl& m, size_t layer, const Tensor& xn, GateActivation activation,
                    Tensor gate, Tensor up, Tensor act) {
  const LayerWeights& w = m.layers[layer];
  const bool lora = m.lora != nullptr && (m.lora->StepTargets(LoraTarget::kGate) ||
                                          m.lora->StepTargets(LoraTarget::kUp));
  if (!lora) {
    m.backend->GateUpActivation(xn, w.w_gate, w.w_up, activation, gate, up, act);
    return;
  }
  const Tensor outs[] = {gate, up};
  LoraPart parts[kMaxLoraParts];
  const size_t count = LoraPartsOf(m, layer, {LoraTarget::kGate, LoraTarget::kUp}, outs, parts);
  m.backend->GateUpActivationLora(xn, w.w_gate, w.w_up, activation, gate, up, act,
                                  std::span<const LoraPart>(parts, count));
}

Status FinishStep(const Model::Impl& m, Tensor x, const Tensor& delta, const Tensor& xn,
                  RmsNormKind kind, float final_softcap, const BatchPlan& plan,
                  const StepOutputs& outputs) {
  const ModelConfig& c = *m.config;
  Backend& be = *m.backend;
  const int64_t num_logits = static_cast<int64_t>(plan.logits_rows.size());
  Tensor normed = FinalNormOut(be, xn);
  be.AddRmsNorm(x, delta, m.final_norm, c.rms_norm_eps, kind, normed);
  if (num_logits > 0) {
    EMBER_RETURN_IF_ERROR(LogitsAndHiddenRows(m, normed, final_softcap, num_logits, outputs));
  }
  // x is now every row's last hidden state before the final norm (MTP drafts read it).
  if (outputs.final_hidden.empty()) return Status::Ok();
  return be.CopyToHost(x, outputs.final_hidden);
}

Status MtpInput(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs,
                Tensor x) {
  const ModelConfig& c = *m.config;
  Backend& be = *m.backend;
  const MtpWeights& w = *m.mtp;
  const int64_t n = plan.num_tokens(), d = c.hidden_size;
  Tensor e = be.Alloc({n, d}), en = be.AllocMatMulInput({n, d});
  Tensor h = be.Alloc({n, d}), hn = be.AllocMatMulInput({n, d}), part = be.Alloc({n, d});
  be.Embedding(m.embed, c.embedding_scale, e);
  if (w.zero_position_zero) {
    std::vector<int32_t> first_rows;
    for (int32_t r = 0; r < plan.num_tokens(); ++r)
      if (plan.positions[static_cast<size_t>(r)] == 0) first_rows.push_back(r);
    EMBER_RETURN_IF_ERROR(be.ZeroRows(e, first_rows));  // RmsNorm keeps a zero row zero
  }
  be.RmsNorm(e, w.enorm, c.rms_norm_eps, w.norm_kind, en);
  EMBER_RETURN_IF_ERROR(be.CopyFromHost(outputs.mtp_hidden, h));
  be.RmsNorm(h, w.hnorm, c.rms_norm_eps, w.norm_kind, hn);
  be.MatMul(en, w.e_proj, nullptr, x);
  be.MatMul(hn, w.h_proj, nullptr, part);
  be.Add(x, part, x);
  return Status::Ok();
}

Status CopyHiddenRows(Backend& be, const Tensor& hidden, const StepOutputs& outputs) {
  if (outputs.hidden_rows == 0) return Status::Ok();
  return be.CopyToHost(hidden.RowSlice(hidden.rows() - outputs.hidden_rows, outputs.hidden_rows),
                       outputs.hidden);
}

Status EmitLogits(Backend& be, const Tensor& logits, const StepOutputs& outputs) {
  if (outputs.row_kinds.empty()) {
    if (!outputs.edits.empty() || !outputs.token_masks.empty())
      return Status::Error("StepOutputs: logit edits or token masks without row_kinds");
    return be.CopyToHost(logits, outputs.logits);
  }
  const int64_t rows = logits.rows(), vocab = logits.cols();
  const auto kind = [&](int64_t r) { return outputs.row_kinds[static_cast<size_t>(r)]; };
  bool any_argmax = false;
  std::vector<int32_t> sample_rows;
  std::vector<RowSampling> sample_params;
  for (int64_t r = 0; r < rows; ++r) {
    any_argmax |= kind(r) == RowOutput::kArgmax;
    if (kind(r) == RowOutput::kSample) {
      sample_rows.push_back(static_cast<int32_t>(r));
      sample_params.push_back(outputs.sampling[static_cast<size_t>(r)]);
    }
  }
  if (!outputs.edits.empty()) {
    for (const LogitEdit& e : outputs.edits) {
      if (e.row < 0 || e.row >= rows || kind(e.row) == RowOutput::kCopy)
        return Status::Error("StepOutputs: logit edit of row " + std::to_string(e.row) +
                             ", which is not a kArgmax/kSample row");
    }
    EMBER_RETURN_IF_ERROR(be.ApplyLogitEdits(logits, outputs.edits));
  }
  // The masks after the processors' edits: the host sampler's order (sampler.h).
  if (!outputs.token_masks.empty()) {
    for (const RowMask& m : outputs.token_masks) {
      if (m.row < 0 || m.row >= rows || kind(m.row) == RowOutput::kCopy)
        return Status::Error("StepOutputs: token mask of row " + std::to_string(m.row) +
                             ", which is not a kArgmax/kSample row");
    }
    EMBER_RETURN_IF_ERROR(be.ApplyTokenMasks(logits, outputs.token_masks));
  }
  if (any_argmax) EMBER_RETURN_IF_ERROR(be.ArgmaxRows(logits, outputs.ids));
  if (!sample_rows.empty())
    EMBER_RETURN_IF_ERROR(be.SampleRows(logits, sample_rows, sample_params, outputs.ids));
  // The kCopy rows' logits, one copy per run of consecutive rows.
  for (int64_t r = 0; r < rows;) {
    if (kind(r) != RowOutput::kCopy) {
      ++r;
      continue;
    }
    int64_t end = r + 1;
    while (end < rows && kind(end) == RowOutput::kCopy) ++end;
    EMBER_RETURN_IF_ERROR(
        be.CopyToHost(logits.RowSlice(r, end - r),
                      outputs.logits.subspan(static_cast<size_t>(r * vocab),
                                             static_cast<size_t>((end - r) * vocab))));
    r = end;
  }
  return Status::Ok();
}

}  // namespace ember
