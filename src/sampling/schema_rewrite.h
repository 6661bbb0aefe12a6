// Rewrites of a JSON Schema's JSON into the subset CompileJsonSchema reads directly
// (json_schema.h), done before a subschema is compiled:
//  - MergeAllOf: `allOf` as one schema, the intersection of its branches (and the keywords beside
//    it). Local `$ref` branches are resolved (RefTarget). Merged: properties (a property in
//    several branches becomes the allOf of its schemas), required (union), type (intersection of
//    the lists), the lower bounds minimum / exclusiveMinimum / minLength / minItems (the largest),
//    the upper ones (the smallest), additionalProperties false (then no branch may name a property
//    the closed branch lacks), items (allOf of both); equal values of any other keyword. Anything
//    else is an error naming the keyword and the branch: two different patterns, enums, anyOf ...
//  - WithoutNullable: OpenAPI's `nullable: true` as a type list / enum / anyOf with null.
// Errors name the path. Pure functions over the client's JSON; bounded by the schema's depth
// (checked by the caller) and kMaxAllOfDepth for allOf inside allOf branches.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace ember {

inline constexpr int kMaxAllOfDepth = 16;

// The schema a local $ref names (#, #/$defs/NAME, #/definitions/NAME), null if none.
const nlohmann::ordered_json* RefTarget(const nlohmann::ordered_json& root, const std::string& ref);

// `s` (an object with "allOf") as one schema without allOf.
Result<nlohmann::ordered_json> MergeAllOf(const nlohmann::ordered_json& s,
                                          const nlohmann::ordered_json& root,
                                          const std::string& path, int depth = 0);

// `s` (an object with "nullable") without it: null added to its values when true.
nlohmann::ordered_json WithoutNullable(const nlohmann::ordered_json& s);

}  // namespace ember
