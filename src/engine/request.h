// What a caller hands the engine (GenerationRequest) and what comes back on the request's
// ResponseStream (TokenEvent). Plain value types, safe to move between threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sampling/sampler.h"

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
};

// One generated token of one sample. The last event of a sample has finish != kNone; a sample
// that ends without a token (cancelled before it produced one) sends token_id = -1.
struct TokenEvent {
  int32_t sample_index = 0;
  int32_t token_id = -1;
  float logprob = 0.0f;                    // when the request asked for logprobs
  std::vector<TokenLogprob> top_logprobs;
  FinishReason finish = FinishReason::kNone;
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
