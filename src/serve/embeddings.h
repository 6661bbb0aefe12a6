// POST /v1/embeddings: parses and validates the body (input as a string, strings, token ids or
// arrays of ids; model; encoding_format float | base64; dimensions; user), tokenizes text inputs
// with the tokenizer's special tokens added (as sentence-transformers does), submits each input
// to the engine as one embedding request (GenerationRequest::pooling, per the served model's
// EmbeddingSupport; at most kEmbeddingWave in flight, the rest as those finish) so the engine
// batches them as prefill-only rows, and answers once every input's pooled vector came back. The response is an AsyncResponse its connection polls (no
// thread waits); a client that goes away cancels the inputs still running. Parse/submit on an
// HTTP worker thread; the response on its connection's strand.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"
#include "serve/http_transport.h"
#include "serve/request_builder.h"

namespace ember::serve {

// At most this many inputs in one request (OpenAI's limit).
inline constexpr size_t kMaxEmbeddingInputs = 2048;
// At most this many of one request's inputs are in the engine (queued or running) at once; the
// rest are submitted as those finish.
inline constexpr size_t kEmbeddingWave = 256;

struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids, one list per input
  bool base64 = false;                       // encoding_format "base64"
  std::optional<int32_t> dimensions;         // truncate (then re-normalize) to this many values
};

// The body's fields checked against the served model (a 400 naming the field, or 404 for a
// foreign `model`); text inputs tokenized; inputs longer than the served context refused naming
// their index.
std::variant<EmbeddingRequest, ApiError> PrepareEmbeddings(const ServedModel& model,
                                                           const RequestJson& body);

// OpenAI's base64 encoding of an embedding: the little-endian float32 bytes, base64 (RFC 4648).
std::string Base64Floats(std::span<const float> values);

// The response body for `vectors` (one per input, in order; already truncated).
nlohmann::json EmbeddingsResponse(const std::string& model_name,
                                  const std::vector<std::vector<float>>& vectors, bool base64,
                                  int64_t prompt_tokens);

// The whole route, after auth: parse, prepare, submit; the answer comes as an AsyncResponse.
// shutting_down: answer 503.
Handled HandleEmbeddings(const ServedModel& model, const HttpRequest& req, bool shutting_down);

}  // namespace ember::serve
