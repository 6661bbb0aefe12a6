// What a caller hands the engine (GenerationRequest) and what comes back on the request's
// ResponseStream (TokenEvent). Plain value types, safe to move between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/pooling.h"
#include "sampling/sampler.h"
#include "sampling/token_constraint.h"

namespace ember {

struct AdapterInfo;  // engine/adapter_registry.h

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  // New tokens per sample. 0: the prompt is only computed (its blocks are committed to the prefix
  // cache, its prompt logprobs delivered when asked); each sample then ends with kLength and no
  // token.
  int32_t max_tokens = 16;
  int32_t n = 1;                           // parallel samples sharing one prompt prefill
  std::vector<int32_t> stop_token_ids;     // in addition to the model's eos ids
  bool ignore_eos = false;                 // when true the model's eos ids do not stop
  uint64_t cache_namespace = 0;            // prefix-cache namespace (Submit folds in the adapter)
  // The LoRA adapter by its registered name ("" or "none": the base model). Submit resolves it
  // (an unknown name is refused) into `lora` and folds its digest into cache_namespace.
  std::string adapter;
  std::shared_ptr<const AdapterInfo> lora;  // set by Engine::Submit
  // Per-request cache isolation (vLLM's cache_salt): only requests with the same salt (and
  // namespace) share cached KV, in the pool and on disk. Engine::Submit folds it into
  // cache_namespace (CacheNamespaceOf); the disk keys also digest the salt itself.
  std::string cache_salt;
  // Structured output: which token may come next (token_constraint.h); each sample runs a clone.
  // Its vocabulary must be the model's. A constrained sample ends ("stop") when it is complete.
  std::shared_ptr<const TokenConstraint> constraint;
  // Prompt logprobs: -1 off; 0: each prompt token's own logprob; N (<= kMaxTopLogprobs): also the
  // top N alternatives. The raw model's (no logits processor applies), computed once per request
  // (not per sample) from every prompt row's logits, so the prompt takes no prefix-cache hit.
  int32_t prompt_logprobs = -1;
  // Embedding request (pooling.kind != kNone): the prompt is computed and nothing is generated
  // (max_tokens 0, n 1, no prompt_logprobs, no constraint; ValidateRequest). Its one event carries
  // the pooled final hidden state (TokenEvent::embedding) with finish kStop. Mean and CLS pooling
  // take no prefix-cache hit (they read early rows' hidden states, which the cache does not keep);
  // last-token pooling may (the prompt's last row is always computed).
  PoolingSpec pooling;
  // Speculative decoding for this request when the engine has it on (EngineConfig::speculation);
  // false turns it off for this request alone (the API's `speculative_decoding: false`).
  bool speculate = true;
};

// The logprob of one prompt token given the tokens before it: log_softmax of the logits of the
// position before it (TokenLogprobs in sampler.h, the same computation as a generated token's).
struct PromptLogprob {
  float logprob = 0.0f;
  int32_t rank = 0;  // 1-based place of the token in the order of top_logprobs (LogprobRank)
  std::vector<TokenLogprob> top_logprobs;  // desc by logprob, ties by lower id
};

// One generated token of one sample. The last event of a sample has finish != kNone; a sample
// that ends without a token (cancelled before it produced one) sends token_id = -1.
struct TokenEvent {
  int32_t sample_index = 0;
  int32_t token_id = -1;
  float logprob = 0.0f;                    // when the request asked for logprobs
  std::vector<TokenLogprob> top_logprobs;
  FinishReason finish = FinishReason::kNone;
  // The token is a stop id (an EOS id or a request stop id; finish is then kStop): counted in
  // usage, not part of the text. A kStop finish without it (a completed output constraint) ends
  // the sample after a token that is.
  bool stop_token = false;
  int64_t time_ns = 0;                     // steady_clock when the engine emitted it
  // Set on the first event of sample 0 when the request asked for prompt logprobs (whatever `n`):
  // entry i is prompt position i + 1's (the first token has none), prompt_ids.size() - 1 entries.
  // Absent when sample 0 ended (cancelled, failed) before its prompt was computed.
  std::optional<std::vector<PromptLogprob>> prompt_logprobs;
  // An embedding request's pooled vector ([hidden_size] float32), on its one (finishing) event.
  std::vector<float> embedding;
};

struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;      // prompt tokens served from the prefix cache (first sample)
  int32_t completion_tokens = 0;  // over all samples
  // Speculative decoding ran for this request (the engine has it on and the request did not turn
  // it off): drafted tokens kept in the output, and drafted tokens verified and dropped.
  bool speculative = false;
  int32_t accepted_prediction_tokens = 0, rejected_prediction_tokens = 0;
  // Jump-forward ran for this request (a token constraint, no logprobs, the engine has it on):
  // tokens appended without sampling because the constraint allowed only them (over all
  // samples; counted in completion_tokens too).
  bool jump_forward = false;
  int32_t forced_tokens = 0;
};

// Why Submit refused a request; maps to HTTP 400 / 429 / 503.
struct SubmitError {
  enum class Code { kInvalidRequest, kQueueFull, kShuttingDown };
  Code code = Code::kInvalidRequest;
  std::string message;
  std::string param;  // the offending request field, when one is to blame
};

}  // namespace ember
