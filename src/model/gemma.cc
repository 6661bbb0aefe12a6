// Gemma 2 / Gemma 3 (text) as backend ops. Differences from llama.cc: every RMSNorm multiplies by
// (1 + w); the embedding is scaled by sqrt(hidden); each block is sandwiched by a pre- and a
// post-norm; gelu-tanh MLP; attention scale query_pre_attn_scalar^-0.5, optional soft-capping of
// attention scores (gemma2) and final logits; sliding/full layers (gemma3: local rope base on
// sliding layers, per-head q/k norms).
//   x = embed(tokens) * sqrt(hidden)
//   per layer:  x += post_attn_norm(o(attn(norm(x))))
//               x += post_ffn_norm(down(gelu(gate(pre_ffn_norm(x))) * up(..)))
//   (each projection of a row with a LoRA adapter: += (in A^T) B^T, Backend::LoraDelta)
//   logits = softcap(lm_head(norm(x)))[logits_rows]   (hidden-state rows: norm(x)[rows])
#include "model/architecture.h"

namespace ember {

Status ForwardGemma(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs) {
  const ModelConfig& c = *m.config;
  Backend& be = *m.backend;
  const auto kNorm = RmsNormKind::kOnePlusWeight;
  const float eps = c.rms_norm_eps;
  const int64_t n = plan.num_tokens();

  // Buffers: see DecoderActivations (architecture.h) — delta is post-normed here.
  auto [x, xn, q, k, v, att, delta, gate, up, act] = AllocDecoderActivations(be, c, n);

  be.Embedding(m.embed, c.embedding_scale, x);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& w = m.layers[l];
    // ---- attention block ----
    if (l == 0) be.RmsNorm(x, w.attn_norm, eps, kNorm, xn);
    else be.AddRmsNorm(x, delta, w.attn_norm, eps, kNorm, xn);
    const MatMulPart qkv[] = {{&w.wq, nullptr, q}, {&w.wk, nullptr, k}, {&w.wv, nullptr, v}};
    ProjectWithLora(m, l, xn, qkv, {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV});
    AttentionCore(be, c, w, static_cast<int32_t>(l), kNorm, q, k, v, att);
    const MatMulPart o_proj[] = {{&w.wo, nullptr, delta}};
    ProjectWithLora(m, l, att, o_proj, {LoraTarget::kO});
    be.RmsNorm(delta, w.post_attn_norm, eps, kNorm, delta);
    // ---- MLP block ----
    be.AddRmsNorm(x, delta, *w.pre_ffn_norm, eps, kNorm, xn);
    GateUpWithLora(m, l, xn, GateActivation::kGeluTanh, gate, up, act);
    const MatMulPart down_proj[] = {{&w.w_down, nullptr, delta}};
    ProjectWithLora(m, l, act, down_proj, {LoraTarget::kDown});
    be.RmsNorm(delta, *w.post_ffn_norm, eps, kNorm, delta);
  }
  return FinishStep(m, x, delta, xn, kNorm, c.final_logit_softcapping, plan, outputs);
}

}  // namespace ember
