// Small readers for the fields of a JSON request body (the utility and embeddings routes): each
// checks one field's JSON type and range and returns a 400 ApiError naming the field, so these
// routes answer every bad field the way the OpenAI routes do. An absent field leaves the output
// untouched. Stateless functions; any thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "serve/api_error.h"
#include "serve/openai_schema.h"

namespace ember::serve {

using FieldError = std::optional<ApiError>;

// The body must be a JSON object whose keys are all `known`; else a 400 naming the first other.
FieldError CheckFields(const RequestJson& body, std::initializer_list<const char*> known);
FieldError ReadBool(const RequestJson& body, const char* name, std::optional<bool>* out);
FieldError ReadString(const RequestJson& body, const char* name, std::optional<std::string>* out);
// An integer in [lo, hi] (a float with a fraction, a string or a bool is refused).
FieldError ReadInt(const RequestJson& body, const char* name, int64_t lo, int64_t hi,
                   std::optional<int64_t>* out);
// A token id in [0, vocab_size) at `path` (for messages: "tokens[3]").
FieldError CheckTokenId(const RequestJson& v, const std::string& path, const std::string& param,
                        int32_t vocab_size, int32_t* out);
// `model` names the served model (or is absent / empty): else OpenAI's 404 model_not_found.
FieldError CheckServedModelName(const std::optional<std::string>& model,
                                const std::string& served_name);

}  // namespace ember::serve
