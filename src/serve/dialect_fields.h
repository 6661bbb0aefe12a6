// What the API dialects (Anthropic Messages, OpenAI Responses) share. FieldReader: strict reading
// of one JSON object of a request body: typed getters whose errors are 400s naming the field's
// full path (`messages[2].content[0].text`), nulls read as absent, and CheckUnknown, which names
// the first field nothing asked for; the object must outlive the reader, one reader per object.
// Also path renaming for errors and named SSE events. Pure functions otherwise; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"
#include "serve/openai_schema.h"

namespace ember::serve {

using MaybeApiError = std::optional<ApiError>;

#define EMBER_DIALECT_TRY(expr)                           \
  do {                                                    \
    if (auto _dialect_err = (expr)) return *_dialect_err; \
  } while (0)

ApiError MissingField(const std::string& path);
// `path[index]`
std::string ItemPath(const std::string& path, size_t index);

// `name` with its leading path `from` (whole segments) replaced by `to`; nullopt when `name`
// does not start with `from`.
std::optional<std::string> RenamedPath(const std::string& name, const std::string& from,
                                       const std::string& to);
// o[key] when it is a string, else "" (absent, null, another type, o not an object).
std::string StringField(const nlohmann::json& o, const char* key);
// "event: NAME\ndata: JSON\n\n"
std::string SseNamedEvent(const std::string& name, const nlohmann::json& data);

// The chat messages a dialect's body translates into, each with the dialect's path it came from
// (for errors PrepareChat finds in it).
struct ChatMessageList {
  RequestJson list = RequestJson::array();
  std::vector<std::string> paths;
  void Push(RequestJson message, std::string path) {
    list.push_back(std::move(message));
    paths.push_back(std::move(path));
  }
};

class FieldReader {
 public:
  FieldReader(const RequestJson& object, std::string path)
      : object_(object), path_(std::move(path)) {}

  // The field's value (null when absent or null); marks it as read.
  const RequestJson* Get(const std::string& name);
  std::string Path(const std::string& name) const {
    return path_.empty() ? name : path_ + "." + name;
  }
  // A field that must be present (and not null).
  MaybeApiError Required(const std::string& name, const RequestJson** out);
  MaybeApiError String(const std::string& name, std::string* out);
  MaybeApiError Bool(const std::string& name, std::optional<bool>* out);
  MaybeApiError Int(const std::string& name, int64_t lo, int64_t hi, std::optional<int64_t>* out);
  // Objects and arrays (null when absent).
  MaybeApiError Object(const std::string& name, const RequestJson** out);
  MaybeApiError Array(const std::string& name, const RequestJson** out);
  // The first field nothing read: a 400 naming it.
  MaybeApiError CheckUnknown() const;

 private:
  const RequestJson& object_;
  std::string path_;
  std::set<std::string> known_;
};

// Copies the body's `cache_salt` (vLLM's field: requests share cached prompt KV only with the same
// salt, in the pool and the tiers below it) into the chat body, where the chat path checks it as
// on /v1/chat/completions (a non-empty string of at most kMaxCacheSaltBytes). A 400 when it is
// not a string. Marks the field read.
MaybeApiError PassCacheSalt(FieldReader& r, RequestJson* chat_body);

}  // namespace ember::serve
