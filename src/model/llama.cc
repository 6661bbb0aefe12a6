// The Llama-style decoder as backend ops: llama (incl. llama3 rope), mistral (sliding window),
// qwen2 (q/k/v bias), qwen3 (per-head q/k RMSNorm), qwen3_moe (qwen3 with mixture-of-experts
// MLPs), phi3 (fused projections, split into row views at load; partial rotary), gpt_oss
// (q/k/v/o biases, attention sinks, YaRN rope, sliding/full layers, biased experts with a
// clamped SwiGLU: AttentionParams::sinks, MoeExperts). Pre-norm blocks:
//   x = embed(tokens)
//   per layer:  x += o(attn(rope(q(norm(x))), rope(k(..)), v(..)))
//               x += down(silu(gate(norm(x))) * up(..))
//               (MoE layers: x += MoeMlp(norm(x)), router included: Backend::MoeMlp)
//   (each projection of a row with a LoRA adapter: += (in A^T) B^T, Backend::LoraDelta)
//   logits = lm_head(norm(x))[logits_rows]   (hidden-state rows: norm(x)[rows], no lm_head)
#include <algorithm>

#include "model/architecture.h"

namespace ember {

Status ForwardLlama(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs) {
  const ModelConfig& c = *m.config;
  Backend& be = *m.backend;
  const int64_t n = plan.num_tokens();
  const int64_t d = c.hidden_size;

  // Buffers: see DecoderActivations (architecture.h).
  // delta from AllocMatMulOutput unless a MoeMlp or a biased o projection writes it.
  const bool matmul_delta =
      std::none_of(m.layers.begin(), m.layers.end(),
                   [](const LayerWeights& w) { return w.moe() || w.bo.has_value(); });
  auto [x, xn, q, k, v, att, delta, gate, up, act] =
      AllocDecoderActivations(be, c, n, matmul_delta);

  be.Embedding(m.embed, c.embedding_scale, x);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& w = m.layers[l];
    // ---- attention block ----
    if (l == 0) be.RmsNorm(x, w.attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xn);
    else be.AddRmsNorm(x, delta, w.attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xn);
    const MatMulPart qkv[] = {{&w.wq, w.bq ? &*w.bq : nullptr, q},
                              {&w.wk, w.bk ? &*w.bk : nullptr, k},
                              {&w.wv, w.bv ? &*w.bv : nullptr, v}};
    ProjectWithLora(m, l, xn, qkv, {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV});
    AttentionCore(be, c, w, static_cast<int32_t>(l), RmsNormKind::kPlain, q, k, v, att);
    const MatMulPart o_proj[] = {{&w.wo, w.bo ? &*w.bo : nullptr, delta}};
    ProjectWithLora(m, l, att, o_proj, {LoraTarget::kO});
    // ---- MLP block ----
    if (w.moe()) {  // its input stays float32 (xn may be a bf16 GEMM operand)
      Tensor xm = be.Alloc({n, d});
      be.AddRmsNorm(x, delta, w.post_attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xm);
      be.MoeMlp(xm, w.experts, delta);
      continue;
    }
    be.AddRmsNorm(x, delta, w.post_attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xn);
    GateUpWithLora(m, l, xn, GateActivation::kSilu, gate, up, act);
    const MatMulPart down_proj[] = {{&w.w_down, nullptr, delta}};
    ProjectWithLora(m, l, act, down_proj, {LoraTarget::kDown});
  }
  return FinishStep(m, x, delta, xn, RmsNormKind::kPlain, 0.0f, plan, outputs);
}

}  // namespace ember
