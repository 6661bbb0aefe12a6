// What a caller hands the engine (GenerationRequest) and what comes back on the request's
// ResponseStream (TokenEvent). Plain value types, safe to move between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "sampling/token_constraint.h"

namespace ember {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_tokens = 16;                 // new tokens per sample
  int32_t n = 1;                           // parallel samples sharing one prompt prefill
  std::vector<int32_t> stop_token_ids;     // in addition to the model's eos ids
  bool ignore_eos = false;                 // when true the model's eos ids do not stop
  uint64_t cache_namespace = 0;            // prefix-cache namespace (adapter id, later)
  // Structured output: which token may come next (token_constraint.h); each sample runs a clone.
  // Its vocabulary must be the model's. A constrained sample ends ("stop") when it is complete.
  std::shared_ptr<const TokenConstraint> constraint;
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
};

struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;      // prompt tokens served from the prefix cache (first sample)
  int32_t completion_tokens = 0;  // over all samples
};

// Why Submit refused a request; maps to HTTP 400 / 429 / 503.
struct SubmitError {
  enum class Code { kInvalidRequest, kQueueFull, kShuttingDown };
  Code code = Code::kInvalidRequest;
  std::string message;
  std::string param;  // the offending request field, when one is to blame
};

}  // namespace ember
