// Qwen3-Next (qwen3_next) as backend ops: a hybrid of gated DeltaNet linear-attention layers
// and gated full-attention layers (LayerType), every RMSNorm but the DeltaNet's output norm
// zero-centred (x/rms * (1 + w)), MoE MLPs with a sigmoid-gated shared expert.
//   x = embed(tokens)
//   per layer:  x += mixer(norm(x));  x += moe(norm(x)) + sigmoid(sg norm(x)) * shared(norm(x))
//   full-attention mixer:  q|gate = q_proj(h) (per head), q/k (1+w)-normed per head, partial
//     RoPE, paged attention over the layer's KV (KvLayerIndex), o_proj(att * sigmoid(gate))
//   linear mixer (gated DeltaNet):  qkv = conv1d_silu(in_qkv(h)) (causal, state carried),
//     core = GatedDeltaRule(qkv, b, a) (state carried), o = out_proj(rmsnorm(core) * silu(z))
//   logits = lm_head(norm(x))[logits_rows]   (hidden-state rows: norm(x)[rows], no lm_head;
//   FinishStep, as every family)
// The per-sequence conv windows and recurrent matrices live in the backend's state slots
// (LinearAttentionWeights::state_offset; SequenceSlice::state_slot).
#include "model/architecture.h"

namespace ember {
namespace {

struct LinearBuffers {
  Tensor qkv;   // [n, conv_dim]
  Tensor z;     // [n, num_v_heads * v_dim]
  Tensor ba;    // [n, 2 * num_v_heads]
  Tensor core;  // [n, num_v_heads * v_dim]
};

// The gated DeltaNet mixer of one layer: h [n, hidden] -> out [n, hidden].
Status LinearAttention(Backend& be, const ModelConfig& c, const LinearAttentionWeights& w,
                       const Tensor& h, const LinearBuffers& b, Tensor out) {
  const LinearAttentionConfig& la = c.linear;
  const MatMulPart parts[] = {{&w.in_qkv, nullptr, b.qkv}, {&w.in_z, nullptr, b.z},
                              {&w.in_ba, nullptr, b.ba}};
  be.MatMulGroup(h, parts);
  EMBER_RETURN_IF_ERROR(be.CausalConv1dSilu(b.qkv, w.conv, w.state_offset));
  GatedDeltaParams p;
  p.num_k_heads = la.num_key_heads;
  p.num_v_heads = la.num_value_heads;
  p.k_head_dim = la.key_head_dim;
  p.v_head_dim = la.value_head_dim;
  p.a_log = &w.a_log;
  p.dt_bias = &w.dt_bias;
  p.state_offset = w.state_offset + (la.conv_kernel - 1) * la.conv_dim();
  EMBER_RETURN_IF_ERROR(be.GatedDeltaRule(p, b.qkv, b.ba, b.core));
  // RMSNormGated: w * x/rms per value head, times silu(z).
  Tensor heads = b.core.Reshape({b.core.rows() * la.num_value_heads, la.value_head_dim});
  be.RmsNorm(heads, w.norm, c.rms_norm_eps, RmsNormKind::kPlain, heads);
  be.SiluMul(b.z, b.core, b.core);
  be.MatMul(b.core, w.out, nullptr, out);
  return Status::Ok();
}

// out = down(silu(gate(h)) * up(h)) with the layer's w_gate/w_up/w_down (the dense MLP of an
// mlp_only layer, or the shared expert).
Status SwiGlu(Backend& be, const LayerWeights& w, const Tensor& h, Tensor out) {
  const int64_t n = h.rows(), width = w.w_gate.rows();
  Tensor g = be.Alloc({n, width}), u = be.Alloc({n, width}), a = be.Alloc({n, width});
  be.GateUpActivation(h, w.w_gate, w.w_up, GateActivation::kSilu, g, u, a);
  be.MatMul(a, w.w_down, nullptr, out);
  return Status::Ok();
}

}  // namespace

Status ForwardQwen3Next(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs) {
  const ModelConfig& c = *m.config;
  const LinearAttentionConfig& la = c.linear;
  Backend& be = *m.backend;
  const auto kNorm = RmsNormKind::kOnePlusWeight;
  const float eps = c.rms_norm_eps;
  const int64_t n = plan.num_tokens();
  const int64_t d = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t v_width = int64_t{la.num_value_heads} * la.value_head_dim;

  Tensor x = be.Alloc({n, d}), xn = be.Alloc({n, d}), delta = be.Alloc({n, d});
  Tensor q = be.Alloc({n, q_dim}), gate = be.Alloc({n, q_dim}), att = be.Alloc({n, q_dim});
  Tensor k = be.Alloc({n, kv_dim}), v = be.Alloc({n, kv_dim});
  const LinearBuffers lin{be.Alloc({n, la.conv_dim()}), be.Alloc({n, v_width}),
                          be.Alloc({n, 2 * int64_t{la.num_value_heads}}), be.Alloc({n, v_width})};
  Tensor shared = be.Alloc({n, d}), shared_gate = be.Alloc({n, 1});

  if (m.mtp) {  // its multi-token-prediction module (one full-attention layer)
    EMBER_RETURN_IF_ERROR(MtpInput(m, plan, outputs, x));
  } else {
    be.Embedding(m.embed, c.embedding_scale, x);
  }
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& w = m.layers[l];
    // ---- token mixer ----
    if (l == 0) be.RmsNorm(x, w.attn_norm, eps, kNorm, xn);
    else be.AddRmsNorm(x, delta, w.attn_norm, eps, kNorm, xn);
    if (w.linear) {
      EMBER_RETURN_IF_ERROR(LinearAttention(be, c, *w.linear, xn, lin, delta));
    } else {
      const MatMulPart qgk[] = {{&w.wq, nullptr, q}, {&w.wq_gate, nullptr, gate},
                                {&w.wk, nullptr, k}};
      be.MatMulGroup(xn, qgk);
      be.MatMul(xn, w.wv, nullptr, v);
      AttentionCore(be, c, w, w.kv_layer, kNorm, q, k, v, att);
      EMBER_RETURN_IF_ERROR(be.SigmoidGateMul(att, gate));
      be.MatMul(att, w.wo, nullptr, delta);
    }
    // ---- MLP ----
    be.AddRmsNorm(x, delta, w.post_attn_norm, eps, kNorm, xn);
    if (!w.moe()) {  // mlp_only_layers: a dense MLP
      EMBER_RETURN_IF_ERROR(SwiGlu(be, w, xn, delta));
      continue;
    }
    be.MoeMlp(xn, w.experts, delta);
    if (w.shared_expert_gate) {  // delta += sigmoid(sg xn) * shared_expert(xn)
      EMBER_RETURN_IF_ERROR(SwiGlu(be, w, xn, shared));
      be.MatMul(xn, *w.shared_expert_gate, nullptr, shared_gate);
      EMBER_RETURN_IF_ERROR(be.SigmoidGateMul(shared, shared_gate));
      be.Add(delta, shared, delta);
    }
  }
  return FinishStep(m, x, delta, xn, kNorm, 0.0f, plan, outputs);
}

}  // namespace ember
