#include "serve/dialect_fields.h"

namespace ember::serve {

ApiError MissingField(const std::string& path) {
  return InvalidRequest(path + ": Field required", path, "missing_required_parameter");
}

std::string ItemPath(const std::string& path, size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

std::optional<std::string> RenamedPath(const std::string& name, const std::string& from,
                                       const std::string& to) {
  if (name.rfind(from, 0) != 0) return std::nullopt;
  const char next = name.size() > from.size() ? name[from.size()] : '\0';
  if (next != '\0' && next != '.' && next != '[' && next != ':' && next != ' ') return std::nullopt;
  return to + name.substr(from.size());
}

MaybeApiError PassCacheSalt(FieldReader& r, RequestJson* chat_body) {
  const RequestJson* salt = r.Get("cache_salt");
  if (salt == nullptr) return std::nullopt;
  if (!salt->is_string()) return FieldTypeError(r.Path("cache_salt"), "a string", *salt);
  (*chat_body)["cache_salt"] = *salt;
  return std::nullopt;
}

std::string StringField(const nlohmann::json& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string SseNamedEvent(const std::string& name, const nlohmann::json& data) {
  return "event: " + name +
         "\ndata: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

const RequestJson* FieldReader::Get(const std::string& name) {
  known_.insert(name);
  auto it = object_.find(name);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

MaybeApiError FieldReader::Required(const std::string& name, const RequestJson** out) {
  *out = Get(name);
  if (*out == nullptr) return MissingField(Path(name));
  return std::nullopt;
}

MaybeApiError FieldReader::String(const std::string& name, std::string* out) {
  const RequestJson* v = Get(name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return FieldTypeError(Path(name), "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

MaybeApiError FieldReader::Bool(const std::string& name, std::optional<bool>* out) {
  const RequestJson* v = Get(name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return FieldTypeError(Path(name), "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

MaybeApiError FieldReader::Int(const std::string& name, int64_t lo, int64_t hi,
                               std::optional<int64_t>* out) {
  const RequestJson* v = Get(name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) return FieldTypeError(Path(name), "an integer", *v);
  const bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX};
  const int64_t x = too_big ? INT64_MAX : v->get<int64_t>();
  if (too_big || x < lo || x > hi) {
    return InvalidRequest(Path(name) + ": must be in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "], got " + v->dump(),
                          Path(name));
  }
  *out = x;
  return std::nullopt;
}

MaybeApiError FieldReader::Object(const std::string& name, const RequestJson** out) {
  *out = Get(name);
  if (*out != nullptr && !(*out)->is_object())
    return FieldTypeError(Path(name), "an object", **out);
  return std::nullopt;
}

MaybeApiError FieldReader::Array(const std::string& name, const RequestJson** out) {
  *out = Get(name);
  if (*out != nullptr && !(*out)->is_array()) return FieldTypeError(Path(name), "an array", **out);
  return std::nullopt;
}

MaybeApiError FieldReader::CheckUnknown() const {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (known_.count(it.key()) == 0) {
      return InvalidRequest(Path(it.key()) +
                                ": Extra inputs are not permitted (this server does "
                                "not implement this field)",
                            Path(it.key()), "unknown_parameter");
    }
  }
  return std::nullopt;
}

}  // namespace ember::serve
