#include "serve/body_fields.h"

namespace ember::serve {

namespace {

std::string TypeName(const RequestJson& v) {
  return v.type_name();
}

ApiError WrongType(const std::string& name, const char* want, const RequestJson& v) {
  return InvalidRequest(name + ": expected " + want + ", got " + TypeName(v), name, "invalid_type");
}

}  // namespace

FieldError CheckFields(const RequestJson& body, std::initializer_list<const char*> known) {
  if (!body.is_object())
    return InvalidRequest("the request body must be a JSON object, got " + TypeName(body), "",
                          "invalid_type");
  for (const auto& [key, value] : body.items()) {
    bool ok = false;
    for (const char* k : known) ok |= key == k;
    if (!ok) return InvalidRequest("unknown field '" + key + "'", key, "unknown_parameter");
  }
  return std::nullopt;
}

FieldError ReadBool(const RequestJson& body, const char* name, std::optional<bool>* out) {
  const auto it = body.find(name);
  if (it == body.end()) return std::nullopt;
  if (!it->is_boolean()) return WrongType(name, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

FieldError ReadString(const RequestJson& body, const char* name, std::optional<std::string>* out) {
  const auto it = body.find(name);
  if (it == body.end()) return std::nullopt;
  if (!it->is_string()) return WrongType(name, "a string", *it);
  *out = it->get<std::string>();
  return std::nullopt;
}

FieldError ReadInt(const RequestJson& body, const char* name, int64_t lo, int64_t hi,
                   std::optional<int64_t>* out) {
  const auto it = body.find(name);
  if (it == body.end()) return std::nullopt;
  if (!it->is_number_integer()) return WrongType(name, "an integer", *it);
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return InvalidRequest(std::string(name) + ": out of range", name);
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return InvalidRequest(std::string(name) + ": must be in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "], got " + std::to_string(v),
                          name);
  *out = v;
  return std::nullopt;
}

FieldError CheckTokenId(const RequestJson& v, const std::string& path, const std::string& param,
                        int32_t vocab_size, int32_t* out) {
  if (!v.is_number_integer())
    return InvalidRequest(path + ": expected a token id (an integer), got " + TypeName(v), param,
                          "invalid_type");
  const bool in_range = v.is_number_unsigned()
                            ? v.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                            : v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab_size;
  if (!in_range)
    return InvalidRequest(path + ": token id " + v.dump() + " is outside the vocabulary [0, " +
                              std::to_string(vocab_size) + ")",
                          param);
  *out = static_cast<int32_t>(v.get<int64_t>());
  return std::nullopt;
}

FieldError CheckServedModelName(const std::optional<std::string>& model,
                                const std::string& served_name) {
  if (!model || model->empty() || *model == served_name) return std::nullopt;
  return ApiError{
      404, "The model '" + *model + "' does not exist; this server serves '" + served_name + "'",
      "invalid_request_error", "model", "model_not_found"};
}

}  // namespace ember::serve
