#include "util/json_bounds.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ember {

int JsonNestingDepth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > stop_above) return deepest;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return deepest;
}

Status CheckJsonDepth(std::string_view text, int max_depth, std::string_view what) {
  if (JsonNestingDepth(text, max_depth) <= max_depth) return Status::Ok();
  return Status::Error(std::string(what) + ": nests deeper than " + std::to_string(max_depth) +
                       " arrays/objects");
}

namespace {

// Builds a document from nlohmann's iterative SAX events, refusing containers past max_depth.
// Objects of an ordered_json get their keys appended (duplicates resolved once, at the object's
// end), never looked up per key.
template <typename Json>
class BoundedBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;
  static constexpr bool kOrdered = std::is_same_v<Json, nlohmann::ordered_json>;

  explicit BoundedBuilder(int max_depth) : max_depth_(max_depth) {}

  bool null() { return Place(Json(nullptr)) != nullptr; }
  bool boolean(bool v) { return Place(Json(v)) != nullptr; }
  bool number_integer(number_integer_t v) { return Place(Json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) { return Place(Json(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) { return Place(Json(v)) != nullptr; }
  bool string(string_t& v) { return Place(Json(std::move(v))) != nullptr; }
  bool binary(binary_t& v) { return Place(Json::binary(std::move(v))) != nullptr; }
  bool start_object(std::size_t) { return Open(Json::value_t::object); }
  bool key(string_t& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if constexpr (kOrdered) KeepLastOfRepeatedKeys(*stack_.back());
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return Open(Json::value_t::array); }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    if (error_.empty()) error_ = e.what();
    return false;
  }

  Json& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  bool Open(typename Json::value_t kind) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      error_ = "nests deeper than " + std::to_string(max_depth_) + " arrays/objects";
      return false;
    }
    Json* placed = Place(Json(kind));
    stack_.push_back(placed);
    return true;
  }

  // Puts `v` where the document is at; returns where it now lives.
  Json* Place(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    auto& object = parent.template get_ref<typename Json::object_t&>();
    if constexpr (kOrdered) {
      auto& items = static_cast<std::vector<std::pair<const std::string, Json>>&>(object);
      items.emplace_back(std::move(key_), std::move(v));
      return &items.back().second;
    } else {
      Json& slot = object[std::move(key_)];
      slot = std::move(v);
      return &slot;
    }
  }

  // ordered_json::parse semantics for a repeated key: its first place, its last value.
  static void KeepLastOfRepeatedKeys(Json& object_json) {
    using Items = std::vector<std::pair<const std::string, Json>>;
    auto& object = object_json.template get_ref<typename Json::object_t&>();
    Items& items = static_cast<Items&>(object);
    if (items.size() < 2) return;
    std::vector<std::string_view> keys;
    keys.reserve(items.size());
    for (const auto& item : items) keys.emplace_back(item.first);
    std::sort(keys.begin(), keys.end());
    if (std::adjacent_find(keys.begin(), keys.end()) == keys.end()) return;
    std::unordered_map<std::string_view, size_t> last;
    for (size_t i = 0; i < items.size(); ++i) last[items[i].first] = i;
    typename Json::object_t rebuilt;
    Items& kept = static_cast<Items&>(rebuilt);
    for (size_t i = 0; i < items.size(); ++i) {
      size_t& last_index = last.at(items[i].first);
      if (last_index == SIZE_MAX) continue;  // placed already
      kept.emplace_back(items[i].first, std::move(items[last_index].second));
      last_index = SIZE_MAX;
    }
    object = std::move(rebuilt);
  }

  int max_depth_;
  Json root_;
  std::vector<Json*> stack_;  // the open containers, outermost first
  string_t key_;
  std::string error_;
};

template <typename Json>
Result<Json> ParseBounded(std::string_view text, int max_depth) {
  // The pre-scan stops at the limit without allocating; the builder checks again as it goes.
  if (JsonNestingDepth(text, max_depth) > max_depth)
    return Status::Error("nests deeper than " + std::to_string(max_depth) + " arrays/objects");
  BoundedBuilder<Json> builder(max_depth);
  const bool ok = Json::sax_parse(text, &builder, nlohmann::json::input_format_t::json,
                                  /*strict=*/true);
  if (!ok) {
    return Status::Error("invalid JSON: " +
                         (builder.error().empty() ? std::string("parse error") : builder.error()));
  }
  return std::move(builder.root());
}

}  // namespace

Result<nlohmann::json> ParseJsonBounded(std::string_view text, int max_depth) {
  return ParseBounded<nlohmann::json>(text, max_depth);
}

Result<nlohmann::ordered_json> ParseOrderedJsonBounded(std::string_view text, int max_depth) {
  return ParseBounded<nlohmann::ordered_json>(text, max_depth);
}

template <typename Json>
int JsonValueDepth(const Json& value) {
  std::vector<std::pair<const Json*, int>> pending = {{&value, 0}};
  int deepest = 0;
  while (!pending.empty()) {
    const auto [v, depth] = pending.back();
    pending.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const Json& child : *v) pending.emplace_back(&child, depth + 1);
  }
  return deepest;
}

template int JsonValueDepth<nlohmann::json>(const nlohmann::json&);
template int JsonValueDepth<nlohmann::ordered_json>(const nlohmann::ordered_json&);

}  // namespace ember
