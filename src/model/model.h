// Model: a loaded checkpoint (a Hugging Face folder's config + mmapped safetensors, or one GGUF
// file) bound to a backend, as
// the engine sees it: one Forward per step over a BatchPlan, logits out. The model owns the
// backend, the weight mappings and the paged KV pool. Not thread-safe: the engine drives it from
// one thread (its engine thread); config()/generation_defaults() are immutable after Load.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_factory.h"
#include "backend/batch_plan.h"
#include "util/status.h"

namespace ember {

class LoraSet;
class WeightStore;

struct GenerationDefaults {  // from generation_config.json (absent fields: nullopt)
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k, max_new_tokens;
  std::vector<int32_t>
      eos_token_ids;  // generation_config eos_token_id (int or list), else config's
  std::optional<int32_t> bos_token_id;
  std::optional<bool> do_sample;
};

// kLinearAttention: a gated DeltaNet layer (qwen3_next), no KV in the paged pool; its per-sequence
// conv and recurrent state lives in the backend's state slots (Backend::AllocateStateSlots).
enum class LayerType { kFullAttention, kSlidingAttention, kLinearAttention };

// Gated DeltaNet linear attention (qwen3_next's linear_* keys): num_key_heads q/k heads of
// key_head_dim, num_value_heads v heads of value_head_dim (a multiple of the key heads: each key
// head serves num_value_heads / num_key_heads value heads), a causal depthwise conv of conv_kernel
// taps over the concatenated q, k, v channels.
struct LinearAttentionConfig {
  int32_t num_key_heads = 0, num_value_heads = 0, key_head_dim = 0, value_head_dim = 0;
  int32_t conv_kernel = 0;
  int64_t conv_dim() const {
    return 2 * int64_t{num_key_heads} * key_head_dim + int64_t{num_value_heads} * value_head_dim;
  }
  // Floats of one layer's state per sequence: the conv window [conv_kernel - 1, conv_dim] and
  // the recurrent matrices [num_value_heads, key_head_dim, value_head_dim].
  int64_t state_floats() const {
    return (conv_kernel - 1) * conv_dim() +
           int64_t{num_value_heads} * key_head_dim * value_head_dim;
  }
};

// The rope of one kind of layer (gemma3 has a local one for sliding layers).
struct RopeConfig {
  std::string type = "default";  // default | linear | llama3 | yarn
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int32_t original_max_position_embeddings = 0;
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  bool truncate = true;                      // yarn
  double attention_factor = 1.0;  // cos/sin multiplier (yarn: given, or from factor and mscale)
  double mscale_all_dim = 0.0;    // yarn: 0 or the config's mscale_all_dim (deepseek_v3's scale)
  std::vector<float> freq_factors;  // GGUF rope_freqs.weight: inverse frequency divisors (RopeSpec)
};

// Everything the forward pass needs from config.json, normalised across the 4.x and 5.x layouts.
struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2 | qwen3 | qwen3_moe | phi3 | gemma2 |
                           // gemma3_text | gpt_oss | deepseek_v3 | qwen3_next
  int32_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0, num_heads = 0,
          num_kv_heads = 0, head_dim = 0;
  int32_t max_position_embeddings = 0;  // context length
  float rms_norm_eps = 1e-6f;
  int32_t rotary_dim = 0;              // head_dim * partial_rotary_factor
  RopeConfig rope;                     // full-attention layers (and all layers but gemma3's)
  RopeConfig rope_local;               // sliding layers (gemma3: rope_local_base_freq)
  int32_t sliding_window = 0;          // 0: none
  std::vector<LayerType> layer_types;  // [num_layers]
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (qwen2; llama attention_bias)
  bool o_bias = false;          // o_proj bias (attention_bias outside qwen2: llama, qwen3, gpt_oss)
  bool attention_sinks = false;  // per-head learned sink logits, self_attn.sinks (gpt_oss)
  bool qk_norm = false;         // per-head q/k RMSNorm before rope (qwen3, gemma3)
  bool fused_qkv = false;       // phi3 qkv_proj + gate_up_proj
  // Gemma family: (1+w) RMSNorm, sqrt(hidden) embedding scale, pre/post norms, gelu-tanh.
  bool gemma_norms = false;
  bool gelu_tanh = false;  // hidden_act / hidden_activation gelu_pytorch_tanh
  float embedding_scale = 1.0f;
  float attention_scale = 0.0f;         // query_pre_attn_scalar^-0.5, else 1/sqrt(head_dim)
  float attn_logit_softcapping = 0.0f;  // 0: none
  float final_logit_softcapping = 0.0f;
  // Mixture of experts (qwen3_moe, gpt_oss): the MLP of a layer with moe_layers[l] set is
  // num_experts experts of moe_intermediate_size, num_experts_per_tok of them per token, chosen by
  // a router (softmax over the experts, top k, renormalised to sum 1 when norm_topk_prob; gpt_oss's
  // softmax over the top k logits is the same weights).
  int32_t num_experts = 0;  // 0: every layer is dense
  int32_t num_experts_per_tok = 0, moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  // gpt_oss: biased router and experts, fused interleaved gate_up_proj, clamped SwiGLU.
  bool moe_biased = false;
  MoeActivation moe_activation = MoeActivation::kSilu;
  float swiglu_limit = 7.0f;
  std::vector<uint8_t> moe_layers;  // [num_layers]; empty when num_experts == 0
  // deepseek_v3's router (MoeRouting::kSigmoidGrouped: sigmoid scores, e_score_correction_bias
  // for the choice only, the best topk_group of n_group groups, weights times
  // routed_scaling_factor) and its always-on shared experts (one MLP of n_shared_experts *
  // moe_intermediate_size beside the routed ones).
  MoeRouting moe_routing = MoeRouting::kSoftmax;
  int32_t moe_groups = 1, moe_top_groups = 1, moe_shared_experts = 0;
  float moe_routed_scale = 1.0f;
  // Multi-head latent attention (deepseek_v3; kv_lora_rank > 0): q through a q_lora_rank
  // bottleneck (0: one q_proj), K/V from a kv_lora_rank latent (what the KV pool stores, with one
  // shared roped key of qk_rope_head_dim), per head qk_nope_head_dim + qk_rope_head_dim query/key
  // dims and v_head_dim values; head_dim and rotary_dim are qk_rope_head_dim (the rope's width).
  int32_t q_lora_rank = 0, kv_lora_rank = 0;
  int32_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = false;  // the rope dims come as pairs (de-interleaved before rotating)
  bool mla() const { return kv_lora_rank > 0; }
  // qwen3_next: a shared expert of this width beside the routed ones (gated by
  // sigmoid(shared_expert_gate x)); 0: none.
  int32_t shared_expert_intermediate_size = 0;
  // qwen3_next: q_proj also makes a per-head output gate (rows per head: head_dim of query, then
  // head_dim of gate); attention output *= sigmoid(gate). RMSNorms are (1 + w).
  bool attn_output_gate = false;
  LinearAttentionConfig linear;  // layers of LayerType::kLinearAttention (qwen3_next)
  std::string torch_dtype;  // "bfloat16", "float16", "float32" (informational)
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  // deepseek_v3: multi-token-prediction modules stored after the decoder layers
  // (num_nextn_predict_layers; ModelLoadOptions::mtp_module), 0: none.
  int32_t num_nextn_predict_layers = 0;
  // deepseek_v3: layers before this one are dense (first_k_dense_replace); the MTP module, stored
  // as layer num_layers, is a mixture of experts when num_layers >= this.
  int32_t first_dense_layers = 0;
};

// Layers whose K/V live in the paged pool (every layer but kLinearAttention ones), and the pool
// index of layer l (-1 for a linear-attention layer).
int32_t KvLayerCount(const ModelConfig& c);
int32_t KvLayerIndex(const ModelConfig& c, int32_t layer);
// Floats of one sequence's recurrent state over every linear-attention layer (0: none).
int64_t RecurrentStateFloats(const ModelConfig& c);

// Parses config.json text. `source` names the file in errors.
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);
Result<GenerationDefaults> ParseGenerationConfig(const std::string& json_text,
                                                 const std::string& source,
                                                 const ModelConfig& config);
// The model_type values ParseModelConfig accepts, comma separated.
std::string SupportedModelTypes();

// What one step delivers for each logits row (plan.logits_rows order): its logits on the host
// (kCopy), or only a token computed by the backend where the logits are: the argmax (kArgmax)
// or a draw with the row's RowSampling (kSample, Backend::SampleRows), after the row's logits
// processors (`edits`, Backend::ApplyLogitEdits) and then its token mask (`token_masks`,
// Backend::ApplyTokenMasks) were applied where the logits are.
enum class RowOutput : uint8_t { kCopy = 0, kArgmax = 1, kSample = 2 };
struct StepOutputs {
  std::span<float> logits;                // [rows, vocab] float32; kCopy rows filled
  std::span<const RowOutput> row_kinds;   // empty (every row kCopy) or one per row
  std::span<const RowSampling> sampling;  // [rows] with row_kinds: used by kSample rows
  std::span<int32_t> ids;  // [rows] with row_kinds: the token of kArgmax/kSample rows
  // Processors of kArgmax/kSample rows (sampling/logit_edits.h); an edit of a kCopy row is an
  // error (the host applies those rows' processors itself).
  std::span<const LogitEdit> edits = {};
  // Token masks (structured output) of kArgmax/kSample rows, applied after the edits; a mask of
  // a kCopy row is an error (the host masks those rows itself).
  std::span<const RowMask> token_masks = {};
  // Forward returns once the step is enqueued; `ids` is filled by Model::WaitIds (and must stay
  // valid until then). Only for steps without kCopy rows (Backend::DeferStepIds).
  bool defer_ids = false;
  // Hidden-state rows (embedding requests): the LAST hidden_rows of plan.logits_rows take no LM
  // head; their final hidden states (after the final norm) are copied into `hidden`
  // [hidden_rows, hidden_size] float32. logits / row_kinds / sampling / ids cover only the
  // logits rows before them. Never with defer_ids.
  int32_t hidden_rows = 0;
  std::span<float> hidden = {};
  // Multi-token prediction (engine/model_draft_source.h, --spec-method mtp). final_hidden: every
  // plan row's last hidden state BEFORE the final norm, [plan.num_tokens(), hidden_size] float32
  // (empty: not wanted; never with defer_ids). mtp_hidden: an MTP module's input
  // (Model::is_mtp_module), per plan row the hidden state it conditions on, [num_tokens,
  // hidden_size]; required by an MTP module, refused by any other model.
  std::span<float> final_hidden = {};
  std::span<const float> mtp_hidden = {};
};

// How to load a model: the backend to build (BackendChoice, for the convenience Load) and the
// config file's name.
struct ModelLoadOptions : BackendChoice {
  // File name of the config inside the folder (tests load config.v4.json too).
  std::string config_file = "config.json";
  // --quantize: the linear projections of a float checkpoint become this block-quantized type at
  // load (model/quantize.h; a backend without kernels for it refuses). nullopt: as stored.
  std::optional<DType> quantize;
  // --kv-cache-dtype / --kv-cache-dtype-layers: the KV pool's format per layer (kv_format.h),
  // resolved and handed to the backend (Backend::SetKvFormat) at load: it decides
  // KvBytesPerToken, KvBlockBytes and KvFingerprint. Default: the backend's own (auto).
  KvCacheSpec kv_cache;
  // Load the checkpoint's multi-token-prediction module instead of the model (--spec-method mtp;
  // deepseek_v3 with num_nextn_predict_layers >= 1): a one-layer Model of the same family whose
  // layer 0 is the checkpoint's layer num_hidden_layers (model.layers.N.*: its decoder block,
  // enorm, hnorm, eh_proj, shared_head.norm as the final norm, shared_head.head / embed_tokens
  // when stored, else the main model's lm_head / embed_tokens). Its Forward takes
  // StepOutputs::mtp_hidden: per row x = eh_proj([enorm(embed(token)) | hnorm(hidden)]), the
  // embedding half zeroed at position 0 (vLLM's deepseek_mtp.py), then the block and the head.
  // qwen3_next's (mtp.layers.0, mtp.fc, mtp.pre_fc_norm_embedding / _hidden, mtp.norm; (1 + w)
  // norms, no mask) loads too, though speculation refuses qwen3_next. Refused with a message
  // naming the missing tensors or the model type otherwise.
  bool mtp_module = false;
};

class Model {
 public:
  // Loads the checkpoint `dir` onto `backend` (which the model then owns): a Hugging Face folder
  // (config.json + safetensors) or one .gguf file (model/gguf_model.h).
  static Result<std::unique_ptr<Model>> Load(const std::string& dir,
                                             std::unique_ptr<Backend> backend,
                                             const ModelLoadOptions& opts);
  // The same on a new backend of opts' choice (CreateBackend).
  static Result<std::unique_ptr<Model>> Load(const std::string& dir, const ModelLoadOptions& opts);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  // Loaded with ModelLoadOptions::mtp_module (its Forward needs StepOutputs::mtp_hidden).
  bool is_mtp_module() const { return mtp_module_; }
  const GenerationDefaults& generation_defaults() const { return generation_; }
  // K+V, all layers, in the pool's format (Backend::KvTokenBytes: f32 on the CPU, bf16 on CUDA,
  // or ModelLoadOptions::kv_cache's dtypes); with multi-head latent attention the latent pool's
  // [kv_lora_rank + qk_rope_head_dim] per layer instead.
  int64_t KvBytesPerToken() const;
  // The pool's dtypes as text ("f32", "int8", "bf16 (layers 0-1), int8 (2-21)"; /stats).
  std::string KvDTypes() const;
  Result<BackendMemory> MemoryInfo() const;  // the backend's memory, now
  // Where to receive a step's logits (Backend::HostBuffer: page-locked on a GPU).
  std::span<float> HostLogitsBuffer(size_t count) { return backend_->HostBuffer(count); }
  // True when RowOutput::kSample beats copying logits to the host sampler (a GPU backend).
  bool prefers_backend_sampling() const { return backend_->prefers_backend_sampling(); }
  std::vector<int32_t> DecodeGraphBuckets() const { return backend_->DecodeGraphBuckets(); }
  // Device memory a step of `step_tokens` rows with `logits_rows` logits rows may take beyond the
  // weights and the KV pool: its activations (DecoderActivationBytesPerRow) and logits, twice for
  // the backend's scratch (bf16 copies, split-K partials), plus 512 MiB for libraries and graphs.
  // The one definition of a step's workspace; the engine sizes its limits and the KV pool by it.
  int64_t StepWorkspaceBytes(int64_t step_tokens, int64_t logits_rows) const;
  // Bytes of all weight files (what the mapping pins), and the parameter count.
  int64_t WeightBytes() const;
  int64_t NumParameters() const;
  // Call once before Forward. Models with recurrent layers (qwen3_next) also get
  // `num_state_slots` state slots (Backend::AllocateStateSlots; SequenceSlice::state_slot names
  // one); others ignore it.
  Status AllocateKvCache(int32_t num_blocks, int32_t block_size, int32_t num_state_slots = 1);
  int32_t num_kv_blocks() const { return num_kv_blocks_; }
  // Bytes of one sequence's recurrent state (0 for a model without recurrent layers): what a
  // running sequence takes beyond its KV blocks.
  int64_t StateBytesPerSequence() const;
  bool has_recurrent_state() const { return StateBytesPerSequence() > 0; }
  int32_t num_state_slots() const { return num_state_slots_; }
  // Why the backend cannot keep per-row state snapshots (speculative decoding's rollback on a
  // model with recurrent layers; Backend::StateSnapshotsUnsupported), "" when it can.
  std::string StateSnapshotsUnsupported() const { return backend_->StateSnapshotsUnsupported(); }
  // Copies recurrent-state slot `src` over `dst` in stream order (Backend::CopyStateSlot).
  Status CopyStateSlot(int32_t src, int32_t dst);
  // One state slot's StateBytesPerSequence bytes to and from host memory, in stream order
  // (Backend::CopyStateSlotToHost / FromHost): the prompt cache's state checkpoints.
  Status CopyStateSlotToHost(int32_t slot, std::span<uint8_t> out);
  Status CopyStateSlotFromHost(int32_t slot, std::span<const uint8_t> in);
  // The prompt cache's view of the pool (Backend::KvBlockBytes and the block copies): one block's
  // K/V over every layer to and from host memory. KvBlockBytes is 0 when the backend has none.
  int64_t KvBlockBytes() const;
  Status CopyKvBlocksToHost(std::span<const int32_t> blocks,
                            std::span<const std::span<uint8_t>> outs);
  Status CopyKvBlockFromHost(int32_t block_id, std::span<const uint8_t> in);
  // Page-locked memory and the copies from it (Backend::AllocPinnedHost, CopyKvBlockFromPinned,
  // PinnedReadsDone): the RAM tier's records on a GPU.
  bool HasPinnedHost() const;
  void* AllocPinnedHost(size_t bytes);
  void FreePinnedHost(void* p);
  Status CopyKvBlockFromPinned(int32_t block_id, std::span<const uint8_t> in);
  bool PinnedReadsDone(bool wait);
  // What decides the bits of this model's KV blocks, as text: the layout version, the
  // architecture's shapes, config.json's digest, the weights' (WeightStore::Fingerprint), the
  // backend, its KV element size and per-layer dtypes (--kv-cache-dtype) and the load options
  // that change results (--quantize, --cpu-matmul, CUDA modes). The prompt cache digests it (with the block size) so a disk
  // record is never read by another model, dtype or layout.
  const std::string& KvFingerprint() const { return kv_fingerprint_; }
  // Bumped whenever the block layout of CopyKvBlockToHost, the meaning of its bytes or the bytes
  // a quantizer writes change (2: int4's least-error step).
  static constexpr int kKvLayoutVersion = 2;
  int32_t kv_block_size() const { return kv_block_size_; }
  // One step. logits: [plan.logits_rows.size(), vocab_size] float32, row-major, filled in order.
  Status Forward(const BatchPlan& plan, std::span<float> logits);
  // One step where some rows need only a token (greedy rows, or sampled rows without logits
  // processors): the backend computes it where the logits are; only kCopy rows are copied.
  // A plan token id -1 - r is fed: the id the previous Forward made for its logits row r
  // (a kArgmax / kSample row of that step; anything else is an error).
  Status Forward(const BatchPlan& plan, const StepOutputs& outputs);
  // Turns on LoRA adapters: a pool of max_loras slots of rank <= max_rank (model/lora_set.h),
  // refused by a backend or family that cannot apply them. Once, before the first Forward.
  Status EnableLora(int32_t max_loras, int32_t max_rank);
  LoraSet* lora() { return lora_.get(); }  // null until EnableLora
  // Waits for the oldest Forward with defer_ids and fills its ids (Backend::WaitIds).
  Status WaitIds() { return backend_->WaitIds(); }

  struct Impl;  // the architecture's weights and forward pass (model/*.cc)

 private:
  Model() = default;
  ModelConfig config_;
  GenerationDefaults generation_;
  std::unique_ptr<WeightStore> weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<LoraSet> lora_;
  int32_t num_kv_blocks_ = 0;
  int32_t kv_block_size_ = 0;
  int32_t num_state_slots_ = 0;
  bool mtp_module_ = false;
  std::string kv_fingerprint_;
  // Per logits row of the last Forward: whether it made an id that a fed token may name.
  std::vector<uint8_t> made_ids_;
};

}  // namespace ember
