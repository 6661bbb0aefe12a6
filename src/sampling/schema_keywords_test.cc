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
      {R"({"type": "object", "properties": {"n": {"not": {}}}})", "schema.properties.n.not:"},
      {R"({"type": "object", "properties": {"n": {"not": {"type": "string"}}}})",
       "schema.properties.n.not: the keyword 'not' is not supported"},
      {R"({"type": "object", "properties": {"n": {"if": {"type": "string"},
          "then": {"maxLength": 2}, "else": {"type": "integer"}}}})",
       "schema.properties.n.if: the keyword 'if' is not supported"},
      {R"({"type": "object", "properties": {"n": {"then": {"maxLength": 2}}}})",
       "schema.properties.n.then: the keyword 'then' is not supported"},
      {R"({"type": "object", "properties": {"n": {"type": "array", "else": {}}}})",
       "schema.properties.n.else: the keyword 'else' is not supported"},
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
  // uniqueItems false is the default and constrains nothing: accepted.
  EXPECT_TRUE(CompileJsonSchema(json::parse(R"({"type": "object", "properties": {"n": {"type":
      "array", "items": {"type": "integer"}, "uniqueItems": false}}})"), "schema").ok());
}

}  // namespace
}  // namespace ember
