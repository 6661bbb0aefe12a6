// Hostile and unsatisfiable schemas: nesting 20,000 deep (in the JSON, in subschemas, through
// $ref chains) is an error, not a stack overflow; objects/arrays nest at most kMaxFrames in a
// schema; not/if/object-keyword rewrites (256) and oneOf proofs (64 branches, 256 automaton
// products) are bounded; every schema that allows no value is refused when compiled, naming keyword and path;
// and a compiled schema's machine never strands: it starts a value only where it can finish.
// Over the fixtures' real tokenizers, a fresh constraint always allows a token.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "sampling/json_constraint.h"
#include "sampling/json_schema.h"
#include "sampling/tool_call_constraint.h"
#include "tokenizer/tokenizer.h"
#include "util/json_bounds.h"
#include "util/testing.h"

namespace ember {
namespace {

using json = nlohmann::ordered_json;

// (Parsed with ParseOrderedJsonBounded: ordered_json::parse is quadratic in an object's keys.)
Result<std::shared_ptr<const CompiledJsonSchema>> CompileText(const std::string& text) {
  auto parsed = ParseOrderedJsonBounded(text, 1 << 20);
  EXPECT_TRUE(parsed.ok()) << parsed.message();
  if (!parsed.ok()) return parsed.status();
  return CompileJsonSchema(*parsed, "schema");
}

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// `ok` with text that scans, or why not.
bool Scans(const CompiledJsonSchema& schema, const std::string& text, bool* done = nullptr) {
  JsonSchemaMachine m(&schema);
  for (char c : text)
    if (!m.Step(static_cast<uint8_t>(c))) return false;
  if (done) *done = m.Done();
  return true;
}

void ExpectError(const std::string& schema, const std::string& path, const std::string& words) {
  auto c = CompileText(schema);
  ASSERT_FALSE(c.ok()) << schema.substr(0, 200);
  EXPECT_EQ(c.message().rfind(path + ":", 0), 0u) << c.message();
  EXPECT_NE(c.message().find(words), std::string::npos) << c.message();
}

TEST(JsonSchemaHostile, DeepJsonIsAnError) {
  constexpr int kDeep = 20000;
  // 20,000 nested "items" schemas, and a 20,000-deep enum value.
  ExpectError(R"({"type": "object", "properties": {"a": )" + Repeat(R"({"items": )", kDeep) + "{}" +
                  std::string(kDeep, '}') + "}}",
              "schema", "nests deeper than 128");
  ExpectError(R"({"type": "object", "properties": {"a": {"enum": [)" + std::string(kDeep, '[') +
                  std::string(kDeep, ']') + "]}}}",
              "schema", "nests deeper than 128");
}

TEST(JsonSchemaHostile, RewritesAndOneOfProofsAreBounded) {
  // if/then/else copies its object into two branches: nested 14 deep, 2^14 copies of the leaf.
  std::string nested = R"({"type": "string"})";
  for (int i = 0; i < 14; ++i) {
    nested = R"({"type": "object", "properties": {"k": {"type": "boolean"}, "p": )" + nested +
             R"(}, "if": {"properties": {"k": {"const": true}}}, "then": {"required": ["p"]}})";
  }
  auto c = CompileText(nested);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find(".properties.p: more than 256 not/if/object-keyword rewrites in one "
                             "schema"),
            std::string::npos)
      << c.message();
  // 65 oneOf branches; 64 pattern branches whose every pair needs an automaton product.
  std::string many;
  for (int i = 0; i < 65; ++i) {
    if (i > 0) many += ",";
    many += R"({"const": )" + std::to_string(i) + "}";
  }
  ExpectError(R"({"type": "object", "properties": {"a": {"oneOf": [)" + many + "]}}}",
              "schema.properties.a.oneOf", "at most 64 branches");
  std::string patterns;
  for (int i = 0; i < 64; ++i) {
    if (i > 0) patterns += ",";
    patterns += R"({"type": "string", "pattern": "^)" + std::to_string(i) + R"(x$"})";
  }
  ExpectError(R"({"type": "object", "properties": {"a": {"oneOf": [)" + patterns + "]}}}",
              "schema.properties.a.oneOf", "may both match one value");
}

TEST(JsonSchemaHostile, LongRefChainsAndUnionNestingAreErrors) {
  // 20,000 definitions, each a one-branch union of the next: shallow JSON, deep compile.
  constexpr int kDefs = 20000;
  std::string defs;
  for (int i = 0; i < kDefs; ++i)
    defs += "\"d" + std::to_string(i) + R"(": {"anyOf": [{"$ref": "#/$defs/d)" +
            std::to_string(i + 1) + "\"}]},";
  defs += "\"d" + std::to_string(kDefs) + R"(": {"type": "string"})";
  ExpectError(R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": {)" +
                  defs + "}}",
              "schema.$defs.d62.anyOf[0]", "subschemas nest deeper than 64");
  // anyOf inside anyOf, 100 deep (JSON depth 200).
  ExpectError(R"({"type": "object", "properties": {"a": )" + Repeat(R"({"anyOf": [)", 100) +
                  R"({"type": "string"})" + Repeat("]}", 100) + "}}",
              "schema", "nests deeper than 128");
}

TEST(JsonSchemaHostile, ContainersNestAtMostKMaxFrames) {
  auto objects = [](int n) {  // n nested objects, the root included
    return Repeat(R"({"type": "object", "properties": {"a": )", n - 1) + R"({"type": "object"})" +
           Repeat("}}", n - 1);
  };
  const int max = JsonSchemaMachine::kMaxFrames;
  EXPECT_TRUE(CompileText(objects(max)).ok());
  ExpectError(objects(max + 1), "schema" + Repeat(".properties.a", max),
              "objects and arrays nest deeper than 16");
  const std::string arrays = R"({"type": "object", "properties": {"a": )" +
                             Repeat(R"({"type": "array", "items": )", max) + "{}" +
                             std::string(static_cast<size_t>(max), '}') + "}}";
  ExpectError(arrays, "schema.properties.a" + Repeat(".items", max - 1),
              "objects and arrays nest deeper than 16");
  // 1,000 deep: refused (it was accepted before).
  EXPECT_FALSE(CompileText(objects(1000)).ok());
}

TEST(JsonSchemaHostile, UnsatisfiableSchemasAreRefused) {
  const std::string obj = R"({"type": "object", "properties": {"a": )";
  const std::string req = R"(}, "required": ["a"]})";
  const std::pair<std::string, std::string> cases[] = {
      {obj + R"({"type": []})" + req, "schema.properties.a.type"},
      {R"({"type": "object", "properties": {"a": {"type": []}}})", "schema.properties.a.type"},
      {obj + R"({"type": "string", "enum": [1, 2, null]})" + req, "schema.properties.a.enum"},
      {obj + R"({"type": ["integer", "null"], "enum": ["x", 1.5]})" + req, "schema.properties.a.enum"},
      {obj + R"({"type": "boolean", "const": "true"})" + req, "schema.properties.a.const"},
      {obj + R"({"enum": ["abc", "de"], "minLength": 4})" + req, "schema.properties.a.enum"},
      {obj + R"({"enum": ["x"], "type": []})" + req, "schema.properties.a.type"},
      {obj + R"({"type": "string", "minLength": 5, "maxLength": 4})" + req,
       "schema.properties.a.minLength"},
      {obj + R"({"type": "array", "minItems": 3, "maxItems": 2})" + req,
       "schema.properties.a.minItems"},
      {R"({"type": "object", "properties": {"b": {}}, "required": ["a"]})", "schema.required"},
      {R"({"type": "object", "additionalProperties": false, "required": ["a"]})", "schema.required"},
      {obj + "false" + req, "schema.properties.a"},
      {R"({"type": "object", "properties": {"a": {"enum": [1], "properties": {}}}})",
       "schema.properties.a.properties"},
      // A required property that recurses forever, directly or through an array of minItems 1.
      {R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})", "schema"},
      {R"({"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#"},
          "minItems": 1}}, "required": ["k"]})",
       "schema"},
      // A union whose branches only lead back to each other has no value.
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"],
          "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}]}, "B": {"anyOf": [{"$ref": "#/$defs/A"}]}}})",
       "schema"},
  };
  for (const auto& [schema, path] : cases) {
    auto c = CompileText(schema);
    ASSERT_FALSE(c.ok()) << schema;
    EXPECT_EQ(c.message().rfind(path + ":", 0), 0u) << c.message();
  }
  // Satisfiable neighbours compile, and enum values are filtered by type and length.
  auto s = CompileText(obj + R"({"type": "string", "enum": ["abc", 1, "de", null], "minLength": 3})" + req);
  ASSERT_TRUE(s.ok()) << s.message();
  bool done = false;
  EXPECT_TRUE(Scans(**s, R"({"a": "abc"})", &done) && done);
  EXPECT_FALSE(Scans(**s, R"({"a": 1)"));
  EXPECT_FALSE(Scans(**s, R"({"a": "de")"));
  EXPECT_TRUE(CompileText(obj + R"({"type": "integer", "enum": [1.0, "x"]})" + req).ok());
}

TEST(JsonSchemaHostile, ValuesStartOnlyWhereTheyCanFinish) {
  // An optional property with no value is never offered.
  auto dead = CompileText(R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"},
      "b": {"type": "integer"}}, "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}]},
      "B": {"anyOf": [{"$ref": "#/$defs/A"}]}}})");
  ASSERT_TRUE(dead.ok()) << dead.message();
  EXPECT_FALSE(Scans(**dead, R"({"a")"));
  bool done = false;
  EXPECT_TRUE(Scans(**dead, R"({"b": 1})", &done) && done);

  // "box" needs 2 frames; "kids" holds objects of this schema. An object at depth d (frames
  // open) may write "box" only while d + 2 <= 16, and open a kid only while d + 2 <= 16.
  auto tree = CompileText(R"({"type": "object", "properties": {
      "kids": {"type": "array", "items": {"$ref": "#"}},
      "box": {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "integer"},
              "minItems": 1}}, "required": ["x"]}}})");
  ASSERT_TRUE(tree.ok()) << tree.message();
  const std::string to13 = Repeat(R"({"kids": [)", 6) + "{";  // an object at depth 13
  const std::string to15 = Repeat(R"({"kids": [)", 7) + "{";  // at depth 15
  EXPECT_TRUE(Scans(**tree, to13 + R"("box": {"x": [1]})"));
  EXPECT_FALSE(Scans(**tree, to15 + R"("box")"));
  EXPECT_TRUE(Scans(**tree, to15 + R"("kids": [])"));
  EXPECT_FALSE(Scans(**tree, to15 + R"("kids": [{)"));
  EXPECT_TRUE(Scans(**tree, to15 + R"("kids": []})" + Repeat("]}", 7), &done) && done);
}

// The machines' state is bounded: 20,000 opening brackets in the output are refused at a fixed
// depth (JsonScanner::kMaxDepth for untyped values, kMaxFrames for the schema's containers).
TEST(JsonSchemaHostile, DeepOutputIsRefusedAtAFixedDepth) {
  const std::string deep(20000, '[');
  auto any = CompileText(R"({"type": "object", "properties": {"a": {}}})");
  ASSERT_TRUE(any.ok()) << any.message();
  JsonSchemaMachine m(any->get());
  int taken = 0;
  for (const char c : R"({"a": )" + deep) {
    if (!m.Step(static_cast<uint8_t>(c))) break;
    ++taken;
  }
  EXPECT_EQ(taken, 6 + JsonScanner::kMaxDepth);
  auto tree = CompileText(R"({"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#"}}}})");
  ASSERT_TRUE(tree.ok()) << tree.message();
  EXPECT_FALSE(Scans(**tree, Repeat(R"({"k": [)", 10000)));
  ToolCallPattern pattern;
  pattern.calls.push_back({"<call>", nullptr});
  ToolCallMachine call(&pattern);
  taken = 0;
  for (const char c : std::string(R"(<call>{"a": )") + deep) {
    if (!call.Step(static_cast<uint8_t>(c))) break;
    ++taken;
  }
  EXPECT_EQ(taken, 12 + JsonScanner::kMaxDepth - 1);  // the object itself is one level
}

// Over each fixture tokenizer's vocabulary: JSON mode, schemas and forced tool calls can start.
TEST(JsonSchemaHostile, FreshConstraintsAllowATokenWithRealVocabularies) {
  for (const char* name : {"llama2", "llama3", "qwen3", "gemma3", "deepseek_v3", "gptoss"}) {
    SCOPED_TRACE(name);
    const std::string dir = testing::TokenizersDir() + "/" + name;
    EMBER_REQUIRE_DIR(dir);
    auto tok = Tokenizer::Load(dir);
    ASSERT_TRUE(tok.ok()) << tok.message();
    std::vector<std::optional<std::string>> bytes(static_cast<size_t>((*tok)->vocab_size()));
    for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) bytes[static_cast<size_t>(id)] = (*tok)->TokenBytes(id);
    auto texts = TokenTexts::Build(std::move(bytes));
    EXPECT_TRUE(CheckConstraintCanStart(JsonObjectConstraint(texts), "response_format").ok());
    for (const char* schema :
         {R"({"type": "object", "properties": {"a": {"enum": ["\u00e9", 1]}}, "required": ["a"]})",
          R"({"type": "object", "additionalProperties": {"type": "array", "items": {"type": "null"}}})"}) {
      auto compiled = CompileText(schema);
      ASSERT_TRUE(compiled.ok()) << compiled.message();
      EXPECT_TRUE(CheckConstraintCanStart(*MakeJsonSchemaConstraint(texts, *compiled), "schema").ok());
    }
    ToolCallPattern pattern;
    pattern.calls.push_back({"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", nullptr});
    pattern.tail = "}\n</tool_call>";
    EXPECT_TRUE(CheckConstraintCanStart(*MakeToolCallConstraint(texts, pattern), "tool_choice").ok());
  }
  // A vocabulary that cannot spell the head's first byte: refused up front, naming the field.
  auto texts = TokenTexts::Build({std::string("{"), std::string("}"), std::string("a")});
  ToolCallPattern pattern;
  pattern.calls.push_back({"<call>", nullptr});
  const Status st = CheckConstraintCanStart(*MakeToolCallConstraint(texts, pattern), "tool_choice");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("tool_choice: ", 0), 0u) << st.message();
}

}  // namespace
}  // namespace ember
