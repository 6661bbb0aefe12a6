// JSON-schema structured output: unsupported keywords are errors that name their path; the byte
// machine accepts documents valid against the schema and refuses invalid ones; and a token
// constraint's random walks only ever write documents that parse and that an independent
// validator (written here, over the same subset) accepts.
#include "sampling/json_schema.h"

#include "sampling/constraint_walk.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace ember {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const CompiledJsonSchema> Compile(const std::string& schema) {
  auto c = CompileJsonSchema(json::parse(schema), "schema");
  EXPECT_TRUE(c.ok()) << c.message();
  return c.ok() ? *c : nullptr;
}

struct Scan {
  bool prefix_ok;
  bool done;
};
Scan ScanText(const CompiledJsonSchema& schema, const std::string& text) {
  JsonSchemaMachine m(&schema);
  for (char c : text)
    if (!m.Step(static_cast<uint8_t>(c))) return {false, false};
  return {true, m.Done()};
}

const char* kPerson = R"({
  "type": "object", "title": "Person",
  "properties": {
    "name": {"type": "string", "description": "full name"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "kind": {"enum": ["a", "b", 12, 1, null]},
    "opt": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    "flag": {"type": ["boolean", "null"]},
    "extra": {}
  },
  "required": ["name", "age"],
  "additionalProperties": false})";

TEST(JsonSchemaTest, AcceptsValidDocuments) {
  auto s = Compile(kPerson);
  ASSERT_NE(s, nullptr);
  for (
      const std::string doc :
      {R"({"name": "x", "age": 3})", R"({"name":"Zoë \"Z\"","age":-12,"tags":[],"kind":"b"})",
       R"({"name": "x", "age": 0, "tags": ["a", "b"], "kind": 12, "opt": 1.5e3, "flag": true})",
       R"({"name": "x", "age": 7, "kind": 1, "opt": null, "flag": null, "extra": [1, {"k": "v"}]})",
       "{\n  \"name\": \"x\",\n  \"age\": 3\n}", R"({"name": "x", "age": 3, "kind": null})"}) {
    const Scan r = ScanText(*s, doc);
    EXPECT_TRUE(r.prefix_ok && r.done) << doc;
  }
}

TEST(JsonSchemaTest, RefusesInvalidDocuments) {
  auto s = Compile(kPerson);
  ASSERT_NE(s, nullptr);
  for (const std::string doc :
       {R"({"name": "x"})", R"({"age": 3, "name": "x"})", R"({"name": "x", "age": 3.5})",
        R"({"name": "x", "age": 1e3})", R"({"name": 1, "age": 3})",
        R"({"name": "x", "age": 3, "tags": ["a", "b", "c"]})",
        R"({"name": "x", "age": 3, "kind": "c"})", R"({"name": "x", "age": 3, "kind": 123})",
        R"({"name": "x", "age": 3, "other": 1})", R"({"name": "x", "age": 3, "opt": "s"})",
        R"({"name": "x", "age": 3, "flag": 0})", R"({"name": "x", "age": 3,})",
        R"( {"name": "x", "age": 3})", R"({"name": "x", "age": 3} )",
        R"({"name": "x", "name": "y", "age": 3})", R"([])"}) {
    const Scan r = ScanText(*s, doc);
    EXPECT_FALSE(r.prefix_ok && r.done) << doc;
  }
  // Prefixes stay open; "1" may still become "12" in the enum.
  for (const std::string prefix : {R"({"name": "x", "age": 3, "kind": 1)", R"({"na)", "{"}) {
    const Scan r = ScanText(*s, prefix);
    EXPECT_TRUE(r.prefix_ok && !r.done) << prefix;
  }
}

TEST(JsonSchemaTest, StringLengthsCountCharacters) {
  auto s = Compile(R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 2,
      "maxLength": 3}, "t": {"type": ["string", "null"], "maxLength": 1}}})");
  ASSERT_NE(s, nullptr);
  for (const std::string ok :
       {R"({"s": "ab"})", R"({"s": "abc"})", R"({"s": "é中"})", R"({"s": "\n\u00e9x"})",
        R"({"t": null})", R"({"t": "x"})", R"({"t": ""})"})
    EXPECT_TRUE(ScanText(*s, ok).done) << ok;
  for (const std::string bad : {R"({"s": "a"})", R"({"s": "abcd"})", R"({"s": "é中👍x"})",
                                R"({"s": "\n\n\n\n"})", R"({"t": "xy"})"})
    EXPECT_FALSE(ScanText(*s, bad).prefix_ok && ScanText(*s, bad).done) << bad;
}

TEST(JsonSchemaTest, RecursiveRefsAndMaps) {
  auto tree = Compile(R"({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
      "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
      "required": ["value"]}}})");
  ASSERT_NE(tree, nullptr);
  EXPECT_TRUE(
      ScanText(*tree, R"({"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]})")
          .done);
  EXPECT_FALSE(ScanText(*tree, R"({"value": 1, "children": [{"children": []}]})").prefix_ok);
  auto map = Compile(R"({"type": "object", "additionalProperties": {"type": "number"}})");
  ASSERT_NE(map, nullptr);
  EXPECT_TRUE(ScanText(*map, R"({"a": 1, "b c": -2.5})").done);
  EXPECT_TRUE(ScanText(*map, R"({})").done);
  EXPECT_FALSE(ScanText(*map, R"({"a": "1"})").prefix_ok);
  auto closed = Compile(R"({"type": "object", "additionalProperties": false})");
  ASSERT_NE(closed, nullptr);
  EXPECT_TRUE(ScanText(*closed, "{}").done);
  EXPECT_FALSE(ScanText(*closed, R"({"a")").prefix_ok);
  // Deeper than the machine's frames cannot be generated (and is refused, not mis-scanned).
  std::string deep, close;
  for (int i = 0; i <= JsonSchemaMachine::kMaxFrames; ++i)
    deep += R"({"value": 1, "children": [)", close += "]}";
  EXPECT_FALSE(ScanText(*tree, deep).prefix_ok);
}

// A definition that is itself a reference (an alias, annotations beside it allowed) is its
// target; keywords beside such a reference narrow it; aliases that loop are refused by name.
TEST(JsonSchemaTest, DefinitionsThatAreReferences) {
  auto alias = Compile(R"({"type": "object", "properties": {"v": {"$ref": "#/$defs/A"},
      "w": {"$ref": "#/$defs/B"}}, "required": ["v", "w"], "$defs": {"A": {"$ref": "#/$defs/B",
      "description": "an alias"}, "B": {"$ref": "#/$defs/C", "minimum": 3}, "C": {"type": "integer"}}})");
  ASSERT_NE(alias, nullptr);
  EXPECT_TRUE(ScanText(*alias, R"({"v": 3, "w": 40})").done);
  EXPECT_FALSE(ScanText(*alias, R"({"v": "x")").prefix_ok);
  EXPECT_FALSE(ScanText(*alias, R"({"v": 2, "w": 4})").done);
  EXPECT_FALSE(ScanText(*alias, R"({"v": 4, "w": 2})").done);
  // Aliases that loop have no value: refused where required, never offered where optional.
  for (const char* loop : {R"({"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}})",
                           R"({"$ref": "#/$defs/A"}})"}) {
    const std::string head = R"({"type": "object", "properties": {"v": {"$ref": "#/$defs/A"},
        "w": {"type": "integer"}}, )";
    auto required = CompileJsonSchema(
        json::parse(head + R"("required": ["v"], "$defs": {"A": )" + loop + "}"), "schema");
    ASSERT_FALSE(required.ok()) << loop;
    EXPECT_EQ(required.message().rfind("schema:", 0), 0u) << required.message();
    auto optional = Compile(head + R"("$defs": {"A": )" + loop + "}");
    ASSERT_NE(optional, nullptr) << loop;
    EXPECT_FALSE(ScanText(*optional, R"({"v")").prefix_ok);
    EXPECT_TRUE(ScanText(*optional, R"({"w": 1})").done);
  }
}

TEST(JsonSchemaTest, UnsupportedSchemasNameThePath) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}})",
       "schema.properties.a.pattern"},
      {R"({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.3333}}})",
       "schema.properties.n.multipleOf"},
      {R"({"type": "string"})", "schema"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"const": "1"}, {"const": "2"},
          {"const": "3"}, {"const": "4"}, {"const": "5"}, {"const": "6"}, {"const": "7"},
          {"const": "8"}, {"const": "9"}]}}})",
       "schema.properties.a.anyOf"},  // 9 branches may start with '"': more than 8
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})",
       "schema.properties.a.$ref"},
      {R"({"type": "object", "required": ["a"]})", "schema.required"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{"enum": [1]}, {"enum": [2]}]}}})",
       "schema.properties.a.allOf[1].enum"},
      {R"({"type": "object", "properties": {"a": {"type": "date"}}})", "schema.properties.a.type"},
      {R"({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}})",
       "schema.properties.a.uniqueItems"},
      {R"({"type": "object", "properties": {"a": false}})", "schema.properties.a"},
      // An unknown `format` constrains the value too: refused, never ignored.
      {R"({"type": "object", "properties": {"d": {"type": "string", "format": "duration"}}})",
       "schema.properties.d.format"},
  };
  for (const auto& [schema, path] : cases) {
    auto c = CompileJsonSchema(json::parse(schema), "schema");
    ASSERT_FALSE(c.ok()) << schema;
    EXPECT_EQ(c.message().rfind(std::string(path) + ":", 0), 0u) << c.message();
  }
}

// An independent validator of the subset the tests use.
bool Valid(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string name = s["$ref"].get<std::string>().substr(std::string("#/$defs/").size());
    return Valid(v, root["$defs"][name], root);
  }
  if (v.is_string() && s.contains("maxLength")) {
    size_t chars = 0;
    for (unsigned char c : v.get<std::string>()) chars += (c & 0xC0) != 0x80;
    if (chars > s["maxLength"].get<size_t>()) return false;
  }
  if (s.contains("enum")) {
    for (const json& e : s["enum"])
      if (e == v) return true;
    return false;
  }
  if (s.contains("const") && s["const"] != v) return false;
  for (const char* key : {"anyOf", "oneOf"}) {  // oneOf as anyOf: the tests' branches exclude
    if (!s.contains(key)) continue;
    for (const json& b : s[key])
      if (Valid(v, b, root)) return true;
    return false;
  }
  if (s.contains("type")) {
    const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool any = false;
    for (const json& t : types) {
      const std::string n = t.get<std::string>();
      any |= (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
             (n == "string" && v.is_string()) || (n == "number" && v.is_number()) ||
             (n == "integer" && v.is_number_integer()) || (n == "boolean" && v.is_boolean()) ||
             (n == "null" && v.is_null());
    }
    if (!any) return false;
  }
  if (v.is_object() && s.contains("properties")) {
    for (const auto& [key, value] : v.items()) {
      if (!s["properties"].contains(key)) return false;
      if (!Valid(value, s["properties"][key], root)) return false;
    }
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
  }
  if (v.is_array()) {
    if (v.size() > s.value("maxItems", size_t{1000000})) return false;
    if (v.size() < s.value("minItems", size_t{0})) return false;
    for (const json& item : v)
      if (s.contains("items") && !Valid(item, s["items"], root)) return false;
  }
  return true;
}

TEST(JsonSchemaTest, TokenWalksWriteValidDocuments) {
  const json schema = json::parse(R"({"type": "object", "$defs": {"P": {"type": "object",
      "properties": {"x": {"type": "number"}, "y": {"enum": [1, 12, "s", true]}}, "required": ["x"]}},
      "properties": {"id": {"type": "integer"}, "name": {"type": ["string", "null"], "maxLength": 3},
                     "ps": {"type": "array", "items": {"$ref": "#/$defs/P"}, "minItems": 1, "maxItems": 3},
                     "ok": {"type": "boolean"}},
      "required": ["id", "ps"]})");
  auto compiled = CompileJsonSchema(schema, "schema");
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  std::vector<std::optional<std::string>> pieces = {std::nullopt,  "{",
                                                    "}",           "[",
                                                    "]",           "\"",
                                                    ":",           ",",
                                                    " ",           "\n",
                                                    "\"id\"",      "\": ",
                                                    "id",          "name",
                                                    "ps",          "\"x\": ",
                                                    "x",           "y",
                                                    "1",           "12",
                                                    "2",           "-",
                                                    ".",           "5",
                                                    "e",           "true",
                                                    "null",        "nul",
                                                    "l",           "s",
                                                    "ok",          "\": [{\"",
                                                    "}]",          "}, {",
                                                    "\\",          "é",
                                                    std::string(), "\"ok\": false}"};
  for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(std::string(1, c));
  auto texts = TokenTexts::Build(pieces);
  std::mt19937 rng(5);
  std::vector<uint8_t> allowed;
  int completed = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::shared_ptr<TokenConstraint> walk = MakeJsonSchemaConstraint(texts, *compiled);
    // Lean on structure so that walks close their objects.
    const std::string text = testing::CheckedWalk(
        *walk, pieces, [&](const std::string& t) { return ScanText(**compiled, t).prefix_ok; },
        testing::StructureLeaningPick(pieces, rng, {"}", "]", "\"", ","}),
        150);
    if (!walk->Done()) continue;
    ++completed;
    const json doc = json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    EXPECT_TRUE(Valid(doc, schema, schema)) << text;
  }
  EXPECT_GT(completed, 5);
}

// Union branches that start alike are followed together: two objects both starting
// {"type": ..., a string or an enum of strings, integer vs number.
const char* kShapes = R"({"type": "object", "properties": {
  "shape": {"anyOf": [
    {"type": "object", "properties": {"type": {"const": "circle"}, "r": {"type": "number"}},
     "required": ["type", "r"], "additionalProperties": false},
    {"type": "object", "properties": {"type": {"const": "rect"}, "w": {"type": "number"},
     "h": {"type": "number"}}, "required": ["type", "w", "h"], "additionalProperties": false},
    {"type": "object", "properties": {"type": {"const": "circle"}, "d": {"type": "integer"}},
     "required": ["type", "d"], "additionalProperties": false}]},
  "tag": {"oneOf": [{"type": "string", "maxLength": 2}, {"enum": ["long-name"]}]},
  "n": {"anyOf": [{"type": "integer", "maximum": 9}, {"type": "number", "minimum": 100}]}},
  "required": ["shape"], "additionalProperties": false})";

TEST(JsonSchemaTest, UnionBranchesThatStartAlikeAreFollowedTogether) {
  auto s = Compile(kShapes);
  ASSERT_NE(s, nullptr);
  for (const std::string doc :
       {R"({"shape": {"type": "circle", "r": 1.5}})",
        R"({"shape": {"type": "rect", "w": 1, "h": 2}})",
        R"({"shape": {"type": "circle", "d": 4}})",
        R"({"shape": {"type": "rect", "w": 1, "h": 2}, "tag": "ab"})",
        R"({"shape": {"type": "circle", "r": 0}, "tag": "long-name"})",
        R"({"shape": {"type": "circle", "r": 0}, "n": 7})",
        R"({"shape": {"type": "circle", "r": 0}, "n": 123.5})"}) {
    const Scan r = ScanText(*s, doc);
    EXPECT_TRUE(r.prefix_ok && r.done) << doc;
  }
  for (const std::string doc : {
           R"({"shape": {"type": "square")",              // no branch has it
           R"({"shape": {"type": "circle", "w")",         // w is rect's
           R"({"shape": {"type": "rect", "r")",           // r is circle's
           R"({"shape": {"type": "circle", "d": 1.5)",    // d is an integer
           R"({"shape": {"type": "rect", "w": 1})",       // h is required
           R"({"shape": {"type": "circle", "r": 1, "d")", // each branch closes after its own
           R"({"shape": {"type": "circle", "r": 1}, "tag": "abc")",  // neither branch
           R"({"shape": {"type": "circle", "r": 1}, "n": 12,)",      // 10..99: neither
           R"({"shape": {"type": "circle", "r": 1}, "n": 9.5,)",
       }) {
    const Scan r = ScanText(*s, doc);
    EXPECT_FALSE(r.prefix_ok && r.done) << doc;
  }
  // Merged again once the union's value is over: one path, not several.
  JsonSchemaMachine m(s.get());
  for (char c : std::string(R"({"shape": {"type": ")"))
    ASSERT_TRUE(m.Step(static_cast<uint8_t>(c)));
  EXPECT_EQ(m.num_paths(), 3);
  for (char c : std::string(R"(circle", )")) ASSERT_TRUE(m.Step(static_cast<uint8_t>(c)));
  EXPECT_EQ(m.num_paths(), 2);
  for (char c : std::string(R"("r": 1}, )")) ASSERT_TRUE(m.Step(static_cast<uint8_t>(c)));
  EXPECT_EQ(m.num_paths(), 1);
  for (char c : std::string(R"("n": 5)")) ASSERT_TRUE(m.Step(static_cast<uint8_t>(c)));
  EXPECT_EQ(m.num_paths(), 2);  // an integer <= 9, or the start of a number >= 100 (500)
  ASSERT_TRUE(m.Step('}'));
  EXPECT_EQ(m.num_paths(), 1);
  EXPECT_TRUE(m.Done());
}

TEST(JsonSchemaTest, TokenWalksThroughLookAlikeBranchesWriteValidDocuments) {
  const json schema = json::parse(kShapes);
  auto compiled = CompileJsonSchema(schema, "schema");
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  std::vector<std::optional<std::string>> pieces = {
      std::nullopt, "{", "}", "\"", ":", ",", " ", "{\"type\": \"", "shape", "\"shape\": ",
      "type", "circle", "rect", "\", \"", "r", "w", "h", "d", "1", "2", "12", "100", ".", "5",
      "tag", "n", "long", "-name", "ab", "\": ", "}}", "}, "};
  for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(std::string(1, c));
  auto texts = TokenTexts::Build(pieces);
  std::mt19937 rng(11);
  int completed = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::shared_ptr<TokenConstraint> walk = MakeJsonSchemaConstraint(texts, *compiled);
    const std::string text = testing::CheckedWalk(
        *walk, pieces, [&](const std::string& t) { return ScanText(**compiled, t).prefix_ok; },
        testing::StructureLeaningPick(pieces, rng, {"}", "\"", ","}),
        120);
    if (!walk->Done()) continue;
    ++completed;
    const json doc = json::parse(text, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    EXPECT_TRUE(Valid(doc, schema, schema)) << text;
  }
  EXPECT_GT(completed, 10);
}

// uniqueItems over an enum: each value at most once, never a dead end (a value already written
// cannot be started; ',' needs a value left).
TEST(JsonSchemaTest, UniqueItemsOverAnEnum) {
  auto s = Compile(R"({"type": "object", "properties": {"tags": {"type": "array",
      "items": {"enum": ["a", "ab", 1, 12, true]}, "uniqueItems": true, "minItems": 1}},
      "required": ["tags"]})");
  ASSERT_NE(s, nullptr);
  for (const std::string doc : {R"({"tags": ["a"]})", R"({"tags": ["a", "ab", 1, 12, true]})",
                                R"({"tags": [12, 1, "ab"]})", R"({"tags": [1,12]})"}) {
    const Scan r = ScanText(*s, doc);
    EXPECT_TRUE(r.prefix_ok && r.done) << doc;
  }
  for (const std::string doc : {R"({"tags": ["a", "a")", R"({"tags": [12, 12)",
                                R"({"tags": [true, tr)", R"({"tags": []})",
                                R"({"tags": ["a", "ab", 1, 12, true,)"}) {
    const Scan r = ScanText(*s, doc);
    EXPECT_FALSE(r.prefix_ok) << doc;
  }
  // "1" written: "12" may still start with '1'; "12" written: "1" still may.
  EXPECT_TRUE(ScanText(*s, R"({"tags": [1, 12]})").done);
  EXPECT_TRUE(ScanText(*s, R"({"tags": [12, 1]})").done);
  EXPECT_TRUE(ScanText(*s, R"({"tags": [1, 1)").prefix_ok);  // 12 may still follow
  EXPECT_FALSE(ScanText(*s, R"({"tags": [1, 1]})").prefix_ok);
}

}  // namespace
}  // namespace ember
