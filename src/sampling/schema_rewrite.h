// Rewrites of a JSON Schema's JSON into the subset CompileJsonSchema reads directly
// (json_schema.h), done before a subschema is compiled:
//  - MergeAllOf: `allOf` as one schema, the intersection of its branches (and the keywords beside
//    it). Local `$ref` branches are resolved (RefTarget). Merged: properties (a property in
//    several branches becomes the allOf of its schemas), required (union), type (intersection of
//    the lists), the lower bounds minimum / exclusiveMinimum / minLength / minItems (the largest),
//    the upper ones (the smallest), additionalProperties false (then no branch may name a property
//    the closed branch lacks), items (allOf of both); equal values of any other keyword. Anything
//    else is an error naming the keyword and the branch: two different patterns, enums, anyOf ...
//    enum and const intersect (the values in both), two `not`s become not of their anyOf.
//  - WithoutNullable: OpenAPI's `nullable: true` as a type list / enum / anyOf with null.
//  - WithoutIf: `if`/`then`/`else` as anyOf[allOf[rest, if, then], allOf[rest, not if, else]]
//    (exact: an instance satisfies if or its negation); then/else without if are dropped (they
//    have no effect).
//  - WithoutNot: `not` as the positive schema it leaves, exactly, where the form allows:
//    not of type (the type list less those; integers out of numbers is refused), of const/enum
//    (taken out of an enum/const, a boolean's values, or kept as {"not": {"enum": [strings]}} on
//    a string schema for its automaton), of required/properties on an object schema with
//    properties (anyOf: an object without one of the required keys, or with one property whose
//    value is not the subschema's, `not` again), of anyOf of those (one after the other), and
//    beside anyOf/oneOf (moved into each branch). Anything else is an error naming the path.
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

// `s` (an object with "if", "then" or "else") without them; an error naming `if` where its
// negation is not a form WithoutNot supports (beside the rest of `s`).
Result<nlohmann::ordered_json> WithoutIf(const nlohmann::ordered_json& s,
                                         const nlohmann::ordered_json& root,
                                         const std::string& path);

// `s` (an object with "not") as a schema without it, or (a string schema excluding strings) the
// canonical form {..., "not": {"enum": [strings]}}, which WithoutNot returns unchanged.
Result<nlohmann::ordered_json> WithoutNot(const nlohmann::ordered_json& s,
                                          const nlohmann::ordered_json& root,
                                          const std::string& path);

// JSON Schema's equality: numbers by value (1 == 1.0), object keys in any order.
bool JsonEqual(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);

// `v` is of the JSON Schema type `type` ("integer": a number without fraction, 1.0 too).
bool JsonHasType(const nlohmann::ordered_json& v, const std::string& type);

}  // namespace ember
