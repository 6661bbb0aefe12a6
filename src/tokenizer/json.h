// Small helpers over simdjson's DOM for reading tokenizer.json: optional fields, typed getters
// whose errors name the field. The elements borrow the parser's memory: use them only while the
// parser that produced them is alive. Stateless; thread-compatible.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace ember::tok {

using Json = simdjson::dom::element;

// The field `key` of `obj`, or nullopt when obj is not an object, lacks it, or it is null.
inline std::optional<Json> JsonField(Json obj, std::string_view key) {
  Json v;
  if (obj.at_key(key).get(v) != simdjson::SUCCESS || v.is_null()) return std::nullopt;
  return v;
}

inline Result<std::string_view> JsonString(Json obj, std::string_view key, std::string_view ctx) {
  std::string_view s;
  auto f = JsonField(obj, key);
  if (!f || f->get_string().get(s) != simdjson::SUCCESS)
    return Status::Error(std::string(ctx) + ": expected a string field '" + std::string(key) + "'");
  return s;
}

inline std::string JsonStringOr(Json obj, std::string_view key, std::string_view dflt) {
  std::string_view s;
  auto f = JsonField(obj, key);
  if (!f || f->get_string().get(s) != simdjson::SUCCESS) return std::string(dflt);
  return std::string(s);
}

inline bool JsonBoolOr(Json obj, std::string_view key, bool dflt) {
  bool b;
  auto f = JsonField(obj, key);
  if (!f || f->get_bool().get(b) != simdjson::SUCCESS) return dflt;
  return b;
}

inline int64_t JsonIntOr(Json obj, std::string_view key, int64_t dflt) {
  int64_t v;
  auto f = JsonField(obj, key);
  if (!f || f->get_int64().get(v) != simdjson::SUCCESS) return dflt;
  return v;
}

inline std::string JsonTypeOf(Json obj) { return JsonStringOr(obj, "type", ""); }

}  // namespace ember::tok
