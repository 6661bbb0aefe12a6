// DeepSeek-V3 (deepseek_v3) as backend ops: multi-head latent attention (MLA) and mixture-of-
// experts MLPs with grouped sigmoid routing and shared experts, after first_k_dense_replace
// dense layers. Pre-norm blocks like llama.cc:
//   x = embed(tokens)
//   per layer:  q = q_b(norm(q_a(norm(x))))            (or q_proj without a q LoRA)
//               c = norm(kv_a(norm(x)));  k_rope = k_rope_proj(norm(x))
//               x += o(MlaAttention(q, c, k_rope))      (the KV pool keeps only c and k_rope)
//               x += MoeMlp(norm(x)) + shared(norm(x))  (dense layers: down(silu(gate) * up))
//   logits = lm_head(norm(x))[logits_rows]
// A multi-token-prediction module (ModelLoadOptions::mtp_module, one layer) replaces the
// embedding by x = eh_proj([enorm(embed(tokens)) | hnorm(StepOutputs::mtp_hidden)]) (MtpInput).
// The q_a / kv_a norms use eps 1e-6 (transformers builds them without the config's eps).
#include "model/architecture.h"

namespace ember {
namespace {

constexpr float kLatentNormEps = 1e-6f;

// The attention block of layer l: xn [n, hidden] in, att [n, heads * v_head_dim] out.
void MlaBlock(Backend& be, const ModelConfig& c, const LayerWeights& w, int32_t layer,
              const Tensor& xn, Tensor att) {
  const int64_t n = xn.rows();
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  Tensor q = be.Alloc({n, c.num_heads * qk});
  Tensor lat = be.Alloc({n, c.kv_lora_rank});
  Tensor k_rope = be.Alloc({n, c.qk_rope_head_dim});
  if (w.q_a) {
    Tensor qa = be.Alloc({n, c.q_lora_rank});
    const MatMulPart parts[] = {{&*w.q_a, nullptr, qa}, {&w.kv_a, nullptr, lat},
                                {&w.k_rope_proj, nullptr, k_rope}};
    be.MatMulGroup(xn, parts);
    be.RmsNorm(qa, *w.q_a_norm, kLatentNormEps, RmsNormKind::kPlain, qa);
    be.MatMul(qa, *w.q_b, nullptr, q);
  } else {
    const MatMulPart parts[] = {{&w.wq, nullptr, q}, {&w.kv_a, nullptr, lat},
                                {&w.k_rope_proj, nullptr, k_rope}};
    be.MatMulGroup(xn, parts);
  }
  be.RmsNorm(lat, w.kv_a_norm, kLatentNormEps, RmsNormKind::kPlain, lat);
  MlaParams p;
  p.layer = layer;
  p.num_heads = c.num_heads;
  p.nope_dim = c.qk_nope_head_dim;
  p.rope_dim = c.qk_rope_head_dim;
  p.v_dim = c.v_head_dim;
  p.latent_dim = c.kv_lora_rank;
  p.scale = c.attention_scale;
  p.rope_interleave = c.rope_interleave;
  p.kv_b = &w.kv_b;
  be.MlaAttention(w.rope_id, p, q, lat, k_rope, att);
}

}  // namespace

Status ForwardDeepseek(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs) {
  const ModelConfig& c = *m.config;
  Backend& be = *m.backend;
  const int64_t n = plan.num_tokens();
  const int64_t d = c.hidden_size, inter = c.intermediate_size;
  const int64_t shared = int64_t{c.moe_shared_experts} * c.moe_intermediate_size;
  Tensor x = be.Alloc({n, d});
  Tensor xn = be.AllocMatMulInput({n, d});
  Tensor att = be.Alloc({n, int64_t{c.num_heads} * c.v_head_dim});
  Tensor delta = be.Alloc({n, d});

  if (m.mtp) {
    EMBER_RETURN_IF_ERROR(MtpInput(m, plan, outputs, x));
  } else {
    be.Embedding(m.embed, c.embedding_scale, x);
  }
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& w = m.layers[l];
    if (l == 0) be.RmsNorm(x, w.attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xn);
    else be.AddRmsNorm(x, delta, w.attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xn);
    MlaBlock(be, c, w, static_cast<int32_t>(l), xn, att);
    be.MatMul(att, w.wo, nullptr, delta);
    if (!w.moe()) {
      be.AddRmsNorm(x, delta, w.post_attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xn);
      Tensor gate = be.AllocMatMulOutput({n, inter}), up = be.AllocMatMulOutput({n, inter});
      Tensor act = be.AllocMatMulInput({n, inter});
      be.GateUpActivation(xn, w.w_gate, w.w_up, GateActivation::kSilu, gate, up, act);
      be.MatMul(act, w.w_down, nullptr, delta);
      continue;
    }
    Tensor xm = be.Alloc({n, d});  // the MoE input stays float32
    be.AddRmsNorm(x, delta, w.post_attn_norm, c.rms_norm_eps, RmsNormKind::kPlain, xm);
    be.MoeMlp(xm, w.experts, delta);
    if (shared > 0) {  // routed + shared (w_gate, w_up, w_down), transformers' order
      Tensor gate = be.AllocMatMulOutput({n, shared}), up = be.AllocMatMulOutput({n, shared});
      Tensor act = be.AllocMatMulInput({n, shared});
      Tensor out = be.Alloc({n, d});
      be.GateUpActivation(xm, w.w_gate, w.w_up, GateActivation::kSilu, gate, up, act);
      be.MatMul(act, w.w_down, nullptr, out);
      be.Add(delta, out, delta);
    }
  }
  return FinishStep(m, x, delta, xn, RmsNormKind::kPlain, 0.0f, plan, outputs);
}

}  // namespace ember
