// The JSON Schema keywords enforced through automata and rewrites: pattern (a search over the
// decoded string, JSON escapes included), format, lengths with them, integer and number bounds,
// allOf, $ref beside other keywords, prefixItems, nullable; what stays unsupported names its
// keyword and path; and random token walks on real vocabularies never strand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "sampling/json_schema.h"

namespace ember {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const CompiledJsonSchema> Compile(const std::string& schema) {
  auto c = CompileJsonSchema(json::parse(schema), "schema");
  EXPECT_TRUE(c.ok()) << c.message();
  return c.ok() ? *c : nullptr;
}

// The text is a complete document of the schema.
bool Accepts(const CompiledJsonSchema& schema, const std::string& text) {
  JsonSchemaMachine m(&schema);
  for (char c : text)
    if (!m.Step(static_cast<uint8_t>(c))) return false;
  return m.Done();
}

void ExpectDocuments(const std::string& schema, const std::vector<std::string>& good,
                     const std::vector<std::string>& bad) {
  SCOPED_TRACE(schema);
  auto s = Compile(schema);
  ASSERT_NE(s, nullptr);
  for (const std::string& doc : good) EXPECT_TRUE(Accepts(*s, doc)) << doc;
  for (const std::string& doc : bad) EXPECT_FALSE(Accepts(*s, doc)) << doc;
}

TEST(SchemaKeywordsTest, PatternMatchesTheDecodedString) {
  ExpectDocuments(
      R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z]+\"?\\n?$"}}})",
      {R"({"s": "abc"})", R"({"s": "abc\""})", R"({"s": "ab\n"})", R"({"s": "ab\"\n"})",
       R"({"s": "ab\u000a"})", R"({"s": "a\u000A"})"},
      {R"({"s": "ab\\n"})", R"({"s": "Ab"})", R"({"s": ""})", R"({"s": "ab\n\n"})",
       R"({"s": "ab\u0041"})", "{\"s\": \"ab\n\"}"});
  // Unanchored: a search.
  ExpectDocuments(
      R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "\\d{2}"}}})",
      {R"({"s": "ab12cd"})", R"({"s": "12"})", R"({"s": "é99👍"})"},
      {R"({"s": "a1b2"})", R"({"s": ""})"});
  ExpectDocuments(
      R"({"type": "object", "properties": {"p": {"type": "string", "pattern": "^\\\\/$"}}})",
      {R"({"p": "\\/"})", R"({"p": "\\\/"})"}, {R"({"p": "/"})", R"({"p": "\/"})"});
}

TEST(SchemaKeywordsTest, FormatsAndLengthsTogether) {
  ExpectDocuments(R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                      "u": {"type": "string", "format": "uuid"}}})",
                  {R"({"d": "2024-02-28"})", R"({"u": "123e4567-e89b-12d3-a456-426614174000"})"},
                  {R"({"d": "2024-02-30"})", R"({"d": ""})", R"({"u": "123"})"});
  ExpectDocuments(
      R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-c]+$",
                      "minLength": 2, "maxLength": 3}}})",
      {R"({"s": "ab"})", R"({"s": "abc"})"},
      {R"({"s": "a"})", R"({"s": "abca"})", R"({"s": "ax"})"});
  // Lengths count code points; an escape is one.
  ExpectDocuments(R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "é|\\n",
                      "maxLength": 2}}})",
                  {R"({"s": "éé"})", R"({"s": "\n\n"})", R"({"s": "é"})"},
                  {R"({"s": "ééé"})", R"({"s": "x\n\n"})"});
  // An impossible combination is refused when compiled, naming it.
  auto c =
      CompileJsonSchema(json::parse(R"({"type": "object", "properties": {"s": {"type": "string",
      "pattern": "^(ab)+$", "minLength": 3, "maxLength": 3}}})"),
                        "schema");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.message(),
            "schema.properties.s (minLength/maxLength with pattern/format): no string matches the "
            "pattern");
}

TEST(SchemaKeywordsTest, IntegerBoundsAreExact) {
  const char* schemas[] = {
      R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": -7, "maximum": 42}}})",
      R"({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": -7, "exclusiveMaximum": 42}}})",
      R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": -7.5, "maximum": 41.9}}})",
      R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": -7, "exclusiveMinimum": true}}})",
      R"({"type": "object", "properties": {"n": {"type": "integer", "maximum": 0}}})",
  };
  auto in = [](int i, int n) {
    switch (i) {
      case 0:
        return n >= -7 && n <= 42;
      case 1:
        return n > -7 && n < 42;
      case 2:
        return n >= -7 && n <= 41;
      case 3:
        return n > -7;
      default:
        return n <= 0;
    }
  };
  for (int i = 0; i < 5; ++i) {
    auto s = Compile(schemas[i]);
    ASSERT_NE(s, nullptr);
    for (int n = -200; n <= 200; ++n)
      EXPECT_EQ(Accepts(*s, "{\"n\": " + std::to_string(n) + "}"), in(i, n))
          << schemas[i] << " " << n;
    EXPECT_FALSE(Accepts(*s, R"({"n": 1.0})"));
  }
  auto none =
      CompileJsonSchema(json::parse(R"({"type": "object", "properties": {"n": {"type": "integer",
      "minimum": 5, "exclusiveMaximum": 5}}})"),
                        "schema");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.message().rfind("schema.properties.n.minimum: no integer", 0), 0u)
      << none.message();
}

TEST(SchemaKeywordsTest, IntegerMultiplesAreExact) {
  for (
      const char* schema :
      {R"({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7, "minimum": -50, "exclusiveMaximum": 100}}})",
       R"({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 5}}})"}) {
    auto s = Compile(schema);
    ASSERT_NE(s, nullptr);
    const bool bounded = std::string(schema).find("minimum") != std::string::npos;
    const int k = bounded ? 7 : 5;
    for (int n = -200; n <= 200; ++n) {
      const bool in = n % k == 0 && (!bounded || (n >= -50 && n < 100));
      EXPECT_EQ(Accepts(*s, "{\"n\": " + std::to_string(n) + "}"), in) << schema << " " << n;
    }
    EXPECT_FALSE(Accepts(*s, R"({"n": -0})"));
    EXPECT_FALSE(Accepts(*s, R"({"n": 07})"));
  }
}

TEST(SchemaKeywordsTest, NumberBoundsAreSound) {
  ExpectDocuments(
      R"({"type": "object", "properties": {"x": {"type": "number", "minimum": -1, "maximum": 2}}})",
      {R"({"x": 0})", R"({"x": 2})", R"({"x": -1})", R"({"x": 1.75})", R"({"x": -0.5})",
       R"({"x": 0.0})"},
      {R"({"x": 2.5})", R"({"x": -1.5})", R"({"x": 3})", R"({"x": 1e0})", R"({"x": -2})"});
}

TEST(SchemaKeywordsTest, AllOfRefSiblingsPrefixItemsNullable) {
  ExpectDocuments(
      R"({"$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
      "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"name": {"type": "string", "maxLength": 3}}, "required": ["name"]}]})",
      {R"({"id": 1, "name": "abc"})"},
      {R"({"id": 1})", R"({"name": "abc"})", R"({"id": 1, "name": "abcd"})"});
  // The same property in two branches: both schemas apply.
  ExpectDocuments(
      R"({"type": "object", "allOf": [{"properties": {"n": {"type": "integer", "minimum": 0}}},
      {"properties": {"n": {"type": "integer", "maximum": 9}}}]})",
      {R"({"n": 0})", R"({"n": 9})", "{}"}, {R"({"n": 10})", R"({"n": -1})"});
  ExpectDocuments(R"({"$defs": {"P": {"type": "object", "properties": {"a": {"type": "string"}}}},
      "type": "object", "properties": {"p": {"$ref": "#/$defs/P", "required": ["a"], "description": "x"}}})",
                  {R"({"p": {"a": "x"}})"}, {R"({"p": {}})"});
  ExpectDocuments(
      R"({"type": "object", "properties": {"t": {"type": "array", "prefixItems": [{"type": "integer"},
      {"type": "string"}], "items": false, "minItems": 1}}})",
      {R"({"t": [1, "a"]})", R"({"t": [1]})"},
      {R"({"t": []})", R"({"t": [1, "a", 2]})", R"({"t": ["a"]})"});
  ExpectDocuments(
      R"({"type": "object", "properties": {"t": {"type": "array", "prefixItems": [{"const": "x"}],
      "items": {"type": "boolean"}}}})",
      {R"({"t": ["x", true, false]})", R"({"t": []})"},
      {R"({"t": [true]})", R"({"t": ["x", "x"]})"});
  ExpectDocuments(R"({"type": "object", "properties": {"a": {"type": "string", "nullable": true},
      "b": {"enum": ["x"], "nullable": true}, "c": {"type": "object", "nullable": true}}})",
                  {R"({"a": null, "b": null, "c": null})", R"({"a": "s", "b": "x", "c": {}})"},
                  {R"({"a": 1})", R"({"b": "y"})"});
  // A type list keeps each type's own keywords: the null branch ignores properties.
  ExpectDocuments(
      R"({"type": "object", "properties": {"o": {"type": ["object", "null"], "properties":
      {"k": {"type": "integer"}}, "required": ["k"]}}})",
      {R"({"o": null})", R"({"o": {"k": 1}})"}, {R"({"o": {}})"});
}

TEST(SchemaKeywordsTest, UnsupportedKeywordsNameTheirPath) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "object", "properties": {"d": {"type": "string", "format": "hostname"}}})",
       "schema.properties.d.format: the format 'hostname' is not supported"},
      {R"j({"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=a)"}}})j",
       "schema.properties.s.pattern: lookaround"},
      {R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "(a|b)*a(a|b){20}"}}})",
       "schema.properties.s.pattern: the pattern needs more than"},
      {R"({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.01}}})",
       "schema.properties.n.multipleOf: only integers from 1 to 1000 are supported"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}}})",
       "schema.properties.n.multipleOf: no string matches"},
      {R"({"type": "object", "properties": {"n": {"uniqueItems": true}}})",
       "schema.properties.n.uniqueItems: true is supported only for arrays whose items are an "
       "inline enum or const"},
      {R"({"type": "object", "properties": {"n": {"not": {}}}})",
       "schema.properties.n.not: not {} allows no value"},
      {R"({"type": "object", "properties": {"n": {"not": true}}})",
       "schema.properties.n.not: not true allows no value"},
      {R"({"type": "object", "properties": {"n": {"type": "number", "not": {"type": "integer"}}}})",
       "schema.properties.n.not: excluding integers from numbers is not supported"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 3}}}})",
       "schema.properties.n.not: not of const/enum is supported beside enum/const and on a string"},
      {R"({"type": "object", "properties": {"n": {"type": "string", "not": {"minLength": 3}}}})",
       "schema.properties.n.not: supported: not of type, of const/enum, of required/properties"},
      {R"({"type": "object", "properties": {"n": {"type": "object", "not": {"required": ["a"]}}}})",
       "schema.properties.n.not: not of required/properties is supported only on an object schema "
       "with properties"},
      {R"({"type": "object", "properties": {"n": {"enum": ["a"], "not": {"const": "a"}}}})",
       "schema.properties.n.not: excludes every enum/const value"},
      {R"({"type": "object", "properties": {"n": {"if": {"minimum": 2}, "then": {}}}})",
       "schema.properties.n.if: the else branch needs the negation of if, which is not supported "
       "(supported: not of type"},
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match one value"},
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "string"}, {"type": "string",
          "maxLength": 3}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "boolean"}, {"type": "object",
          "properties": {"a": {"type": "string"}}}, {"type": "object", "properties": {"b": {}}}]}}})",
       "schema.properties.n.oneOf: branches [1] and [2] may both match"},
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "string"}, {"minLength": 2}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "integer", "maximum": 10},
          {"type": "integer", "minimum": 10}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "object", "properties":
          {"k": {"const": "a"}}, "required": ["k"]}, {"type": "object", "properties":
          {"k": {"enum": ["b", "a"]}}, "required": ["k"]}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      {R"({"type": "object", "properties": {"n": {"type": "object", "minProperties": 1}}})",
       "schema.properties.n.minProperties: is supported only on an object schema with properties"},
      {R"({"type": "object", "properties": {"n": {"additionalProperties": {"type": "string"},
          "patternProperties": {"^a": {}}}}})",
       "schema.properties.n.patternProperties: is supported only on an object schema with"},
      {R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2})",
       "schema.minProperties: is supported where the required properties reach it"},
      {R"({"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1})",
       "schema.maxProperties: is supported only where it allows every property (here 2)"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["a"], "propertyNames":
          {"maxLength": 0}})",
       "schema.propertyNames: the required property 'a' fails it: no value"},
      {R"({"type": "object", "properties": {"a": {}}, "propertyNames": {"not": {"const": "b"}}})",
       "schema.propertyNames.not: propertyNames supports type string, enum/const, pattern"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["a"], "dependentRequired":
          {"a": ["z"]}})",
       "schema.dependentRequired.a: a dependent is not a property: no value"},
      {R"({"type": "object", "properties": {"e": {"enum": [{}], "minProperties": 1}}})",
       "schema.properties.e.minProperties: is not supported beside enum"},
      // A branch rewritten from not / minProperties may allow more than its machine writes: the
      // other branch's values ("s"; {"zzz": 1}, valid under minProperties) may match it.
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "string"}, {"properties":
          {"a": {}}, "not": {"type": "null"}}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "object", "properties": {"zzz":
          {"type": "integer"}}, "required": ["zzz"]}, {"type": "object", "properties": {"a": {}},
          "minProperties": 1}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      // A format's regex is narrower than the format (no February 29): nothing is proven by it.
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"type": "string", "pattern":
          "^2024-02-29$"}, {"type": "string", "format": "date"}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      // Object literals are equal in any key order.
      {R"({"type": "object", "properties": {"n": {"oneOf": [{"const": {"a": 1, "b": 2}},
          {"enum": [{"b": 2, "a": 1.0}]}]}}})",
       "schema.properties.n.oneOf: branches [0] and [1] may both match"},
      {R"({"type": "string"})", "schema: the root schema must be an object"},
      {R"({"anyOf": [{"type": "object"}, {"type": "null"}]})",
       "schema: the root schema must be an object"},
      {R"({"type": "object", "properties": {"n": {"anyOf": [{"type": "array", "uniqueItems": true},
          {"type": "null"}]}}})",
       "schema.properties.n.anyOf[0].uniqueItems: true is supported only"},
      {R"({"type": "object", "properties": {"n": {"type": "array", "items": {"type": "string"},
          "uniqueItems": true}}})",
       "schema.properties.n.uniqueItems: true is supported only"},
      {R"({"type": "object", "properties": {"n": {"type": "array", "items": {"enum": [1, 2]},
          "minItems": 3, "uniqueItems": true}}})",
       "schema.properties.n.minItems: exceeds the number of distinct items"},
      {R"({"type": "object", "allOf": [{"properties": {"a": {"pattern": "x"}}}, {"properties": {"a": {"pattern": "y"}}}]})",
       "schema.properties.a.allOf[1].pattern: allOf branches with different 'pattern' values"},
      {R"({"type": "object", "allOf": [{"properties": {"a": {}}, "additionalProperties": false}, {"properties": {"b": {}}}]})",
       "schema.allOf[1].properties.b: another allOf branch has additionalProperties false"},
      {R"({"allOf": [{"type": "object"}, {"type": "string"}]})",
       "schema.allOf[1].type: the branches' types"},
      {R"({"type": "object", "properties": {"e": {"enum": ["a"], "pattern": "a"}}})",
       "schema.properties.e.pattern: is not supported beside enum"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1e19}}})",
       "schema.properties.n.minimum: bounds beyond"},
      {R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$", "maxLength": 20000}}})",
       "schema.properties.s (minLength/maxLength with pattern/format): the pattern"},
  };
  for (const auto& [schema, prefix] : cases) {
    auto c = CompileJsonSchema(json::parse(schema), "schema");
    ASSERT_FALSE(c.ok()) << schema;
    EXPECT_EQ(c.message().rfind(prefix, 0), 0u) << c.message();
  }
  // then / else without if have no effect (JSON Schema): accepted.
  EXPECT_TRUE(CompileJsonSchema(json::parse(R"({"type": "object", "properties": {"n": {"then":
      {"maxLength": 2}, "else": {}}}})"), "schema").ok());
  // uniqueItems false is the default and constrains nothing: accepted.
  EXPECT_TRUE(CompileJsonSchema(json::parse(R"({"type": "object", "properties": {"n": {"type":
      "array", "items": {"type": "integer"}, "uniqueItems": false}}})"), "schema").ok());
}

// Each schema with documents it accepts and refuses (a complete document of the machine).
struct DocumentsCase {
  const char* schema;
  std::vector<std::string> good, bad;
};

// oneOf is compiled where its branches provably exclude each other; the machine then follows them
// as anyOf, which is exact (the refused overlaps are in UnsupportedKeywordsNameTheirPath).
TEST(SchemaKeywordsTest, OneOfWithExclusiveBranches) {
  const DocumentsCase cases[] = {
      {R"({"type": "object", "properties": {"v": {"oneOf": [{"type": "string"}, {"type": "integer"},
          {"type": "array", "items": {"type": "boolean"}}]}}, "required": ["v"]})",
       {R"({"v": "s"})", R"({"v": 3})", R"({"v": [true]})"}, {R"({"v": 1.5})", R"({"v": null})"}},
      // A discriminator: distinct consts of a required property.
      {R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type":
          "integer"}}, "required": ["kind", "x"]}, {"type": "object", "properties": {"kind":
          {"enum": ["b", "c"]}, "y": {"type": "string"}}, "required": ["kind"]}]})",
       {R"({"kind": "a", "x": 1})", R"({"kind": "c"})", R"({"kind": "b", "y": "s"})"},
       {R"({"kind": "a"})", R"({"kind": "d"})", R"({"kind": "b", "x": 1})", "[]"}},
      // Open objects: each branch's machine never writes the other's required key.
      {R"({"type": "object", "properties": {"v": {"oneOf": [{"type": "object", "properties": {"a":
          {"type": "integer"}}, "required": ["a"]}, {"type": "object", "properties": {"b": {"type":
          "integer"}}, "required": ["b"]}]}}})",
       {R"({"v": {"a": 1}})", R"({"v": {"b": 2}})", "{}"}, {R"({"v": {"a": 1, "b": 2}})", R"({"v": {}})"}},
      // Literals no other branch accepts; disjoint patterns; disjoint integer ranges.
      {R"({"type": "object", "properties": {"v": {"oneOf": [{"type": "string", "maxLength": 2,
          "pattern": "^[a-z]*$"}, {"enum": ["long-name", 7]}, {"type": "string", "pattern": "^x{3}$"}]}}})",
       {R"({"v": "ab"})", R"({"v": "long-name"})", R"({"v": 7})", R"({"v": "xxx"})"},
       {R"({"v": "abc"})", R"({"v": 8})", R"({"v": "xxxx"})"}},
      {R"({"type": "object", "properties": {"v": {"oneOf": [{"type": "integer", "maximum": 9},
          {"type": "integer", "minimum": 10, "multipleOf": 5}]}}})",
       {R"({"v": 9})", R"({"v": -3})", R"({"v": 15})"}, {R"({"v": 11})", R"({"v": 1.5})"}},
      // A one-byte literal sharing its byte with a number (a literal's end moved the frame on).
      {R"({"type": "object", "properties": {"v": {"oneOf": [{"enum": [7, "a"]}, {"type": "integer",
          "minimum": 10}]}, "w": {"type": "array", "items": {"anyOf": [{"const": 7}, {"type":
          "integer"}]}}}})",
       {R"({"v": 7})", R"({"v": 75})", R"({"w": [7, 75, 7]})"},
       {R"({"v": 75,1]})", R"({"v": 8})", R"({"w": [75}})"}},
      {R"({"type": "object", "properties": {"v": {"type": "array", "oneOf": [{"maxItems": 1},
          {"minItems": 2}]}}})",
       {}, {}},
  };
  for (const DocumentsCase& c : cases) {
    if (c.good.empty()) {  // `type` beside oneOf stays refused
      EXPECT_FALSE(CompileJsonSchema(json::parse(c.schema), "schema").ok()) << c.schema;
      continue;
    }
    ExpectDocuments(c.schema, c.good, c.bad);
  }
}

TEST(SchemaKeywordsTest, NotIsRewrittenExactly) {
  const DocumentsCase cases[] = {
      {R"({"type": "object", "properties": {"s": {"type": "string", "not": {"const": "x"}}}})",
       {R"({"s": "xy"})", R"({"s": ""})", R"({"s": "y"})", R"({"s": "\\x"})"}, {R"({"s": "x"})"}},
      {R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3, "not": {"enum":
          ["ab", "a", "é", 5]}}}})",
       {R"({"s": ""})", R"({"s": "abc"})", R"({"s": "b"})", R"({"s": "aa"})", R"({"s": "éé"})"},
       {R"({"s": "a"})", R"({"s": "ab"})", R"({"s": "é"})", R"({"s": "abcd"})"}},
      {R"({"type": "object", "properties": {"e": {"enum": ["a", "b", 1], "not": {"enum": ["b", 1.0]}},
          "b": {"type": "boolean", "not": {"const": true}}}})",
       {R"({"e": "a"})", R"({"b": false})"}, {R"({"e": "b"})", R"({"e": 1})", R"({"b": true})"}},
      {R"({"type": "object", "properties": {"n": {"not": {"type": ["string", "object"]}},
          "m": {"type": ["string", "null"], "not": {"type": "null"}}}})",
       {R"({"n": 1})", R"({"n": null})", R"({"n": [1]})", R"({"n": true})", R"({"m": "s"})"},
       {R"({"n": "s"})", R"({"n": {}})", R"({"m": null})"}},
      {R"({"type": "object", "properties": {"t": {"type": ["string", "null"], "not": {"const": "x"}}}})",
       {R"({"t": "y"})", R"({"t": null})"}, {R"({"t": "x"})"}},
      // not of required: never both; not of a property's value: present with another value.
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "not": {"required": ["a", "b"]}})",
       {R"({"a": 1})", R"({"b": 2})", "{}"}, {R"({"a": 1, "b": 2})"}},
      {R"({"type": "object", "properties": {"k": {"enum": ["x", "y", "z"]}, "n": {"type": "integer"}},
          "not": {"properties": {"k": {"const": "x"}}}})",
       {R"({"k": "y"})", R"({"k": "z", "n": 1})"}, {R"({"k": "x"})", "{}", R"({"n": 1})"}},
      // Two nots (allOf) exclude both.
      {R"({"type": "object", "properties": {"s": {"type": "string", "allOf": [{"not": {"const": "a"}},
          {"not": {"const": "b"}}]}}})",
       {R"({"s": "c"})", R"({"s": "ab"})"}, {R"({"s": "a"})", R"({"s": "b"})"}},
  };
  for (const DocumentsCase& c : cases) ExpectDocuments(c.schema, c.good, c.bad);
}

TEST(SchemaKeywordsTest, ObjectKeywordsOnListedProperties) {
  const DocumentsCase cases[] = {
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "minProperties": 1, "maxProperties": 2})",
       {R"({"a": 1})", R"({"b": 2})", R"({"a": 1, "b": 2})"}, {"{}"}},
      {R"({"type": "object", "properties": {"ab": {}, "b": {}, "Cd": {}}, "propertyNames": {"pattern":
          "^[a-z]+$", "maxLength": 1}})",
       {R"({"b": 1})", "{}"}, {R"({"ab": 1})", R"({"Cd": 1})"}},
      {R"({"type": "object", "properties": {"x_n": {"type": "integer"}, "y": {"type": "integer"}},
          "patternProperties": {"_n$": {"minimum": 0}, "^x": {"maximum": 5}}})",
       {R"({"x_n": 5, "y": -1})"}, {R"({"x_n": -1})", R"({"x_n": 6})"}},
      {R"({"type": "object", "properties": {"card": {"type": "string"}, "billing": {"type": "string"},
          "cvv": {"type": "string"}, "name": {"type": "string"}}, "required": ["name"],
          "dependentRequired": {"card": ["billing", "cvv"], "name": ["name"], "cvv": ["card"]}})",
       {R"({"name": "n"})", R"({"card": "c", "billing": "b", "cvv": "v", "name": "n"})",
        R"({"billing": "b", "name": "n"})"},
       {R"({"card": "c", "name": "n"})", R"({"cvv": "v", "name": "n"})",
        R"({"card": "c", "billing": "b", "name": "n"})"}},
      // With a type list, only the object branch reads them.
      {R"({"type": "object", "properties": {"o": {"type": ["object", "null"], "properties": {"a":
          {"type": "integer"}}, "minProperties": 1}}})",
       {R"({"o": null})", R"({"o": {"a": 1}})"}, {R"({"o": {}})"}},
  };
  for (const DocumentsCase& c : cases) ExpectDocuments(c.schema, c.good, c.bad);
}

TEST(SchemaKeywordsTest, IfThenElseOnADiscriminator) {
  const DocumentsCase cases[] = {
      {R"({"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"},
          "y": {"type": "string"}}, "required": ["kind"], "if": {"properties": {"kind": {"const":
          "a"}}}, "then": {"required": ["x"]}, "else": {"required": ["y"]}})",
       {R"({"kind": "a", "x": 1})", R"({"kind": "b", "y": "s"})", R"({"kind": "a", "x": 1, "y": "s"})"},
       {R"({"kind": "a"})", R"({"kind": "b", "x": 1})", R"({"kind": "b"})", R"({"kind": "c", "y": ""})"}},
      // if with required: without the key, else applies (here: nothing).
      {R"({"type": "object", "properties": {"p": {"type": "string"}, "q": {"type": "integer"}},
          "if": {"properties": {"p": {"const": "yes"}}, "required": ["p"]}, "then": {"required": ["q"]}})",
       {R"({"p": "yes", "q": 1})", "{}", R"({"p": "no"})", R"({"q": 1})"}, {R"({"p": "yes"})"}},
      {R"({"type": "object", "properties": {"n": {"type": ["integer", "string"], "if": {"type":
          "integer"}, "then": {"minimum": 5}, "else": {"maxLength": 1}}}})",
       {R"({"n": 5})", R"({"n": "a"})"}, {R"({"n": 4})", R"({"n": "ab"})"}},
      {R"({"type": "object", "properties": {"n": {"if": {"type": "string"}, "then": {"maxLength": 2},
          "else": {"type": "integer"}}}})",
       {R"({"n": "ab"})", R"({"n": 3})"}, {R"({"n": "abc"})", R"({"n": 1.5})", R"({"n": null})"}},
  };
  for (const DocumentsCase& c : cases) ExpectDocuments(c.schema, c.good, c.bad);
}

}  // namespace
}  // namespace ember
