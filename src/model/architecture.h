// Internal to model/: the weights of a decoder as backend tensors, and the per-family forward
// passes (llama.cc: llama/mistral/qwen2/qwen3/qwen3_moe/phi3/gpt_oss; gemma.cc:
// gemma2/gemma3_text; deepseek.cc: deepseek_v3; qwen3_next.cc: qwen3_next). Built once by
// Model::Load; Forward functions run one step on the model's backend. Not thread-safe (the engine
// thread only).
#pragma once

#include <initializer_list>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/lora_set.h"
#include "model/model.h"

namespace ember {

// A gated DeltaNet layer (qwen3_next linear_attn.*). The checkpoint groups in_proj_qkvz's rows
// per key head ([q | k | v.. | z..] each) and in_proj_ba's ([b.. | a..]); the loader regroups
// them by part, so q, k, v are the conv's channel order and one MatMulGroup splits them.
struct LinearAttentionWeights {
  Tensor in_qkv;          // [conv_dim, hidden]: every q head, every k head, every v head
  Tensor in_z;            // [num_v_heads * v_dim, hidden]  the output gate
  Tensor in_ba;           // [2 * num_v_heads, hidden]  b (beta) rows, then a (decay) rows
  Tensor conv;            // [conv_dim, kernel] float32
  Tensor a_log, dt_bias;  // [num_v_heads] float32
  Tensor norm;            // [v_dim]  RMSNormGated weight (plain w, not 1 + w)
  Tensor out;             // [hidden, num_v_heads * v_dim]
  int64_t state_offset = 0;  // its conv window in a state slot; the recurrent matrices follow
};

struct LayerWeights {
  Tensor attn_norm;                          // [hidden]  input_layernorm
  Tensor wq, wk, wv, wo;                     // [q_dim, hidden], [kv_dim, hidden] x2, [hidden, q_dim]
  std::optional<Tensor> bq, bk, bv;          // [q_dim], [kv_dim], [kv_dim] (qwen2)
  std::optional<Tensor> bo;                  // [hidden] o_proj bias (ModelConfig::o_bias)
  std::optional<Tensor> sinks;               // [num_heads] attention sinks (gpt_oss)
  std::optional<Tensor> q_norm, k_norm;      // [head_dim] (qwen3, gemma3)
  Tensor post_attn_norm;                     // [hidden]  llama: before MLP; gemma: after attention
  std::optional<Tensor> pre_ffn_norm, post_ffn_norm;  // [hidden] (gemma)
  // [inter, hidden] x2, [hidden, inter]: the dense MLP; in a MoE layer the shared expert beside
  // the routed ones where the model has one (qwen3_next: shared_expert_intermediate_size, gated
  // by shared_expert_gate below; deepseek_v3: n_shared_experts * moe_intermediate_size)
  Tensor w_gate, w_up, w_down;
  MoeExperts experts;  // a mixture-of-experts MLP when it has experts (qwen3_moe: mlp.gate,
                       // mlp.experts.E.{gate,up,down}_proj; gpt_oss: mlp.router, mlp.experts.*)
  bool moe() const { return !experts.gate.empty(); }
  // qwen3_next: linear-attention layers (no wq..wo); q_proj's gate rows (attn_output_gate);
  // the shared expert's gate [1, hidden] (the expert itself is w_gate, w_up, w_down above).
  std::optional<LinearAttentionWeights> linear;
  Tensor wq_gate;                            // [q_dim, hidden]
  std::optional<Tensor> shared_expert_gate;
  int32_t kv_layer = 0;                      // its index in the KV pool (KvLayerIndex)
  int32_t rope_id = 0;                       // global or local rope table
  // Multi-head latent attention (deepseek_v3, ModelConfig::mla; wq/wk/wv unused, wo
  // [hidden, heads * v_head_dim]): q = q_b(norm(q_a x)) (q_a [q_lora, hidden], q_b
  // [heads * (nope + rope), q_lora]) or wq x without a q LoRA; c = norm(kv_a x) and k_rope =
  // k_rope_proj x, the two row views of kv_a_proj_with_mqa; kv_b [heads * (nope + v), kv_lora]
  // float32 (MlaParams::kv_b).
  std::optional<Tensor> q_a, q_a_norm, q_b;
  Tensor kv_a, k_rope_proj, kv_a_norm, kv_b;
  int32_t sliding_window = 0;                // 0: full attention
};

// A multi-token-prediction module's input (ModelLoadOptions::mtp_module): x = e_proj
// enorm(embed(token)) + h_proj hnorm(hidden), e_proj and h_proj the column halves of eh_proj
// [hidden, 2 hidden] (embedding half first, as DeepSeek-V3 and Qwen3-Next concatenate), each
// [hidden, hidden] float32. deepseek_v3 (eh_proj, enorm, hnorm): plain norms, the embedding half
// zeroed at position 0 (vLLM's deepseek_mtp.py); qwen3_next (mtp.fc, mtp.pre_fc_norm_*): (1 + w)
// norms, no mask.
struct MtpWeights {
  Tensor enorm, hnorm;    // [hidden]
  Tensor e_proj, h_proj;  // [hidden, hidden]
  RmsNormKind norm_kind = RmsNormKind::kPlain;
  bool zero_position_zero = true;
};

struct Model::Impl {
  const ModelConfig* config = nullptr;
  Backend* backend = nullptr;
  Tensor embed;     // [vocab, hidden]
  Tensor lm_head;   // [vocab, hidden] (== embed when tied)
  Tensor final_norm;  // [hidden]
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;  // an MTP module's input projection (deepseek.cc)
  int64_t num_parameters = 0;  // elements of every uploaded checkpoint tensor
  // Weights the loader rearranged on the host (gpt_oss experts), kept while the backend points
  // into them (Backend::KeepsHostWeights).
  std::vector<std::vector<uint8_t>> host_weights;
  // The LoRA adapters (Model::EnableLora), or null; BeginStep'd by Model::Forward.
  LoraSet* lora = nullptr;
};

// The per-step activation buffers of a decoder, from the backend's step workspace (gate, up and
// act only as wide as a dense MLP needs: [n, 1] when every layer's MLP is a mixture of experts).
struct DecoderActivations {
  Tensor x;      // [n, hidden]  residual stream
  Tensor xn;     // [n, hidden]  normalised input of the next block's projections
                 //              (AllocMatMulInput: MatMul is its only reader)
  Tensor q;      // [n, num_heads * head_dim]
  Tensor k;      // [n, num_kv_heads * head_dim]
  Tensor v;      // [n, num_kv_heads * head_dim]
  Tensor att;    // [n, num_heads * head_dim]  attention output, heads concatenated
  Tensor delta;  // [n, hidden]  a block's contribution to the residual
  Tensor gate;   // [n, intermediate]  (AllocMatMulOutput: MatMul writes it, the gated
  Tensor up;     // [n, intermediate]   activation reads it)
  Tensor act;    // [n, intermediate]  act(gate) * up, the down projection's input
};
// matmul_delta: only MatMul without a bias writes delta and only AddRmsNorm reads it (no layer is
// a mixture of experts, none has an output-projection bias, delta is not normalised in place):
// delta comes from AllocMatMulOutput.
DecoderActivations AllocDecoderActivations(Backend& be, const ModelConfig& c, int64_t n,
                                           bool matmul_delta = false);
// Upper bound of one step row's activation bytes, at float32: the DecoderActivations above (x,
// xn, q, k, v, att, delta, gate, up, act), the final norm's output (FinalNormOut) and, with
// experts, Backend::MoeMlp's per-row scratch (its f32 input, the router logits, and per routed
// expert its activation and output). gate/up/act count intermediate_size wide even where
// AllocDecoderActivations makes them [n, 1] (every layer a mixture of experts): the GPU limits
// were measured with that margin. Model::StepWorkspaceBytes is its one user.
int64_t DecoderActivationBytesPerRow(const ModelConfig& c);
// The final norm's output buffer: the logits rows are gathered from it as f32, so xn itself
// unless xn is a bf16 GEMM operand (AllocMatMulInput), else a new [n, hidden] f32 buffer.
Tensor FinalNormOut(Backend& be, const Tensor& xn);

// The attention core shared by every dense family: optional per-head q/k RMSNorm (`norm_kind`),
// then RoPE, the KV write at the plan's slots and paged attention into `att` as one
// Backend::RopeWriteKvAttention (q and k may read unrotated afterwards).
// q [n, num_heads * head_dim], k and v [n, num_kv_heads * head_dim], att [n, num_heads * head_dim].
void AttentionCore(Backend& be, const ModelConfig& c, const LayerWeights& w, int32_t layer,
                   RmsNormKind norm_kind, Tensor q, Tensor k, const Tensor& v, Tensor att);

// The projections of one input (x) of `layer` (targets[i] names products[i]'s projection): the
// products, each output plus the step's LoRA updates of its projection, if any (one
// Backend::MatMulGroupLora); without updates, MatMul (one product) or MatMulGroup.
void ProjectWithLora(const Model::Impl& m, size_t layer, const Tensor& x,
                     std::span<const MatMulPart> products,
                     std::initializer_list<LoraTarget> targets);
// `layer`'s dense gated MLP input half: act = activation(gate) * up with gate = xn w_gate^T and
// up = xn w_up^T, each plus the step's LoRA updates of its projection before the activation
// (Backend::GateUpActivationLora) where the step has any, else Backend::GateUpActivation.
void GateUpWithLora(const Model::Impl& m, size_t layer, const Tensor& xn, GateActivation activation,
                    Tensor gate, Tensor up, Tensor act);

// The end of every family's step: residual x += delta, the final norm (of `kind`; into xn's
// f32 view, FinalNormOut), the logits rows gathered, the LM head on all but the hidden-state
// rows (then soft-capped when final_softcap > 0), EmitLogits, CopyHiddenRows, then x (every
// row's hidden state before the final norm) to StepOutputs::final_hidden when asked.
Status FinishStep(const Model::Impl& m, Tensor x, const Tensor& delta, const Tensor& xn,
                  RmsNormKind kind, float final_softcap, const BatchPlan& plan,
                  const StepOutputs& outputs);

// Ends a step: the argmax-only rows' ids (computed by the backend) and every other row's logits
// to the host, per `outputs`. logits [logits_rows, vocab] on the backend.
Status EmitLogits(Backend& be, const Tensor& logits, const StepOutputs& outputs);

// Copies the hidden-state rows (StepOutputs::hidden_rows: the last rows of `hidden`, the final
// hidden states of the logits rows, [logits_rows, hidden] f32) to the host; called after
// EmitLogits, so the step's logits rows are done first.
Status CopyHiddenRows(Backend& be, const Tensor& hidden, const StepOutputs& outputs);

// An MTP module's step input (MtpWeights) into x [n, hidden], in place of the embedding.
Status MtpInput(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs,
                Tensor x);

// One step over the plan already given to BeginStep; delivers the logits rows per `outputs`.
Status ForwardLlama(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs);
Status ForwardGemma(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs);
Status ForwardDeepseek(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs);
Status ForwardQwen3Next(const Model::Impl& m, const BatchPlan& plan, const StepOutputs& outputs);

}  // namespace ember
