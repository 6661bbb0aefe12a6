// The object keywords structured output enforces by rewriting an object schema with
// `properties` (the machine writes only those, in order: json_schema.h), done before the object
// is compiled. Each rewrite is exact for the values the machine writes:
//  - propertyNames (type string, enum/const, pattern, format, minLength/maxLength): a property
//    whose name fails it is never written (a required one: no value, an error);
//  - patternProperties: each listed property whose name a pattern matches also takes that
//    pattern's schema (allOf);
//  - maxProperties: enforced where it allows every listed property (else an error);
//  - minProperties: enforced where the required properties reach it, and for 1 as anyOf of
//    "the first property written is this one" (at most 8; the branches exclude each other);
//  - dependentRequired: a required trigger adds its dependents to required; an optional one
//    splits into anyOf[without it, with it and its dependents required].
// On an object without properties (any keys) they are refused, naming the keyword, except where
// they constrain nothing (minProperties 0, empty lists). Pure functions over the client's JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace ember {

// The keywords above: an object schema that has one of them goes through RewriteObjectKeywords.
bool HasObjectRewriteKeyword(const nlohmann::ordered_json& s);

// `s` (an object schema: `type` "object" or implied) without those keywords; `path` names errors.
Result<nlohmann::ordered_json> RewriteObjectKeywords(const nlohmann::ordered_json& s,
                                                     const std::string& path);

}  // namespace ember
