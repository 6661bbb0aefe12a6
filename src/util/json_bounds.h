// Bounded JSON parsing for text that comes from the network. JsonNestingDepth is a linear,
// iterative, allocation-free scan (it counts '[' and '{' outside strings, escapes included), so a
// body nested deeper than a limit is refused before any recursive code sees it; the Parse*
// functions build the document with an iterative SAX builder that stops past the depth limit,
// and the ordered variant inserts each key in amortised O(1) (nlohmann::ordered_json's own parse
// searches every object linearly per key: quadratic in the number of keys). Stateless; any thread.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace ember {

// The deepest nesting of arrays/objects in `text` ("[]" is 1, "1" is 0). Stops scanning as soon
// as the depth exceeds `stop_above` and returns that depth (stop_above + 1). Not a validator: on
// malformed text it still returns the nesting its brackets imply.
int JsonNestingDepth(std::string_view text, int stop_above = 1 << 30);

// Error "JSON nests deeper than MAX (arrays and objects)" when JsonNestingDepth > max_depth.
// `what` names the text in the message ("the request body", "tools[0].function.parameters").
Status CheckJsonDepth(std::string_view text, int max_depth, std::string_view what = "JSON");

// Parses `text`. Errors: "nests deeper than N arrays/objects", "invalid JSON: <nlohmann's
// message>". The
// ordered variant keeps key order (a repeated key keeps its first place and its last value, as
// ordered_json::parse does) in time linear in the number of keys.
Result<nlohmann::json> ParseJsonBounded(std::string_view text, int max_depth);
Result<nlohmann::ordered_json> ParseOrderedJsonBounded(std::string_view text, int max_depth);

// The deepest nesting of an already-built document (iterative; scalars are 0).
template <typename Json>
int JsonValueDepth(const Json& value);

}  // namespace ember
