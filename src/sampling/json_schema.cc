#include "sampling/json_schema.h"

#include <algorithm>
#include <bitset>
#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "sampling/regex_dfa.h"
#include "sampling/schema_disjoint.h"
#include "sampling/schema_object_rewrite.h"
#include "sampling/schema_regexes.h"
#include "sampling/schema_rewrite.h"
#include "util/check.h"
#include "util/json_bounds.h"

namespace ember {

namespace {

using json = nlohmann::ordered_json;
using FirstBytes = std::bitset<256>;

}  // namespace

std::string_view JsonSchemaKindStarts(JsonSchemaNode::Kind kind) {
  switch (kind) {
    case JsonSchemaNode::kAny: return "{[\"-0123456789tfn";
    case JsonSchemaNode::kObject: return "{";
    case JsonSchemaNode::kArray: return "[";
    case JsonSchemaNode::kString: return "\"";
    case JsonSchemaNode::kNumber: case JsonSchemaNode::kInteger: return "-0123456789";
    case JsonSchemaNode::kBoolean: return "tf";
    case JsonSchemaNode::kNull: return "n";
    case JsonSchemaNode::kLiterals: case JsonSchemaNode::kUnion: break;
  }
  return "";
}

namespace {

// Keywords that only describe a value: accepted and ignored. (`format` constrains the value —
// a "date" must be a date —, so it is refused like any other keyword the machine cannot enforce.)
const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {
      "title",    "description", "default",  "examples", "$schema",    "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",  "definitions"};
  return k;
}
const std::set<std::string>& Understood() {
  static const std::set<std::string> k = {
      "type",       "enum",      "const",         "properties",       "required",
      "additionalProperties",    "items",         "prefixItems",      "additionalItems",
      "minItems",   "maxItems",  "minLength",     "maxLength",        "pattern",
      "format",     "minimum",   "maximum",       "exclusiveMinimum", "exclusiveMaximum",
      "anyOf",      "oneOf",     "allOf",         "$ref",             "nullable",
      "multipleOf", "uniqueItems", "not",           "if",               "then",
      "else",       "minProperties", "maxProperties", "dependentRequired", "propertyNames",
      "patternProperties"};
  return k;
}

// Subschemas (properties, items, anyOf/oneOf, $ref chains) nest at most this deep while
// compiling; the schema's JSON text at most kMaxSchemaJsonDepth.
constexpr int kMaxSubschemaDepth = 64;
constexpr int kMaxSchemaJsonDepth = 128;
constexpr uint8_t kNoValue = JsonSchemaMachine::kMaxFrames + 1;  // min_frames: nothing fits
// oneOf proofs (schema_disjoint.h): branches per oneOf, automaton products per schema.
constexpr size_t kMaxOneOfBranches = 64;
constexpr int kMaxProofIntersections = 256;
// Rewrites of not / if / object keywords per schema (each may copy its schema into branches).
constexpr int kMaxRewrites = 256;

class Compiler {
 public:
  Compiler(const json& root, std::string root_path) : root_(root), root_path_(std::move(root_path)) {}

  Result<int32_t> Node(const json& s, const std::string& path);
  Status FinishUnions();
  Status CheckOneOf() const;
  Status UniqueItems(JsonSchemaNode& node, const json& s, const std::string& path);
  std::vector<uint8_t> MinFrames() const;
  std::vector<JsonSchemaNode> TakeNodes() { return std::move(nodes_); }
  std::vector<std::shared_ptr<const RegexDfa>> TakeDfas() { return std::move(dfas_); }

 private:
  int32_t Allocate() {
    nodes_.emplace_back();
    branches_.emplace_back();
    paths_.emplace_back();
    facts_.emplace_back();
    return static_cast<int32_t>(nodes_.size() - 1);
  }
  Result<int32_t> Ref(const std::string& ref, const std::string& path);
  Status Fill(int32_t id, const json& s, const std::string& path);
  Result<bool> Rewrite(int32_t id, const json& s, const std::string& path);
  // Fill with a rewritten schema; `narrowed`: its machine may leave out values `s` allowed.
  Status FillNarrowed(int32_t id, const json& s, bool narrowed, const std::string& path) {
    if (++rewrites_ > kMaxRewrites) {
      return Status::Error(path + ": more than " + std::to_string(kMaxRewrites) +
                           " not/if/object-keyword rewrites in one schema");
    }
    EMBER_RETURN_IF_ERROR(Fill(id, s, path));
    facts_[static_cast<size_t>(id)].narrowed |= narrowed;
    return Status::Ok();
  }
  Status FillObject(JsonSchemaNode& node, const json& s, bool& closed, const std::string& path);
  Status FillArray(JsonSchemaNode& node, const json& s, const std::string& path);
  Status FillLiterals(JsonSchemaNode& node, const json& s, const std::string& path);
  Status StringAutomaton(JsonSchemaNode& node, const json& s, const std::string& path);
  Status NumberAutomaton(JsonSchemaNode& node, const json& s, bool integer, const std::string& path);
  int32_t AddDfa(std::shared_ptr<const RegexDfa> dfa) {
    dfas_.push_back(std::move(dfa));
    return static_cast<int32_t>(dfas_.size() - 1);
  }
  Status FillContainer(JsonSchemaNode& node, const json& s, const std::string& type, bool& closed,
                       const std::string& path);
  std::vector<FirstBytes> AllStarts() const;

  const json& root_;
  std::string root_path_;  // names the root in errors
  int depth_ = 0;       // Node() calls open on the compile path
  int containers_ = 0;  // objects and arrays open on the compile path
  int rewrites_ = 0;    // FillNarrowed calls (kMaxRewrites)
  std::vector<JsonSchemaNode> nodes_;
  std::vector<std::vector<int32_t>> branches_;  // kUnion: the branch nodes, resolved at the end
  std::vector<std::string> paths_;              // kUnion: where, for errors
  std::vector<SchemaNodeFacts> facts_;          // what the nodes drop (schema_disjoint.h)
  std::vector<int32_t> one_ofs_;                // the kUnion nodes of a oneOf
  std::map<std::string, int32_t> refs_;
  std::vector<std::shared_ptr<const RegexDfa>> dfas_;
};

Status Unsupported(const std::string& path, const std::string& what) {
  return Status::Error(path + ": " + what);
}

Result<int32_t> Compiler::Ref(const std::string& ref, const std::string& path) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  const json* target = RefTarget(root_, ref);
  if (target == nullptr)
    return Unsupported(path + ".$ref", "'" + ref +
                                           "' is not a definition of this schema (only "
                                           "local #/$defs/NAME, #/definitions/NAME and # are)");
  // Allocated before it is filled, so that a recursive reference finds it. Errors inside name
  // the definition's own path ("schema.$defs.Node.properties.x").
  const int32_t id = Allocate();
  refs_[ref] = id;
  std::string target_path = root_path_;
  for (size_t at = 1; at < ref.size();) {
    const size_t next = std::min(ref.find('/', at + 1), ref.size());
    target_path.push_back('.');
    target_path.append(ref, at + 1, next - at - 1);
    at = next;
  }
  EMBER_RETURN_IF_ERROR(Fill(id, *target, target_path));
  return id;
}

Result<int32_t> Compiler::Node(const json& s, const std::string& path) {
  if (depth_ >= kMaxSubschemaDepth) {
    return Unsupported(path, "subschemas nest deeper than " + std::to_string(kMaxSubschemaDepth) +
                                 " (properties, items, anyOf/oneOf and $ref chains)");
  }
  struct Open {
    int& depth;
    explicit Open(int& d) : depth(++d) {}
    ~Open() { --depth; }
  } open(depth_);
  if (s.is_object() && s.contains("$ref")) {
    if (!s["$ref"].is_string()) return Unsupported(path + ".$ref", "must be a string");
    json rest = s;
    rest.erase("$ref");
    bool beside = false;
    for (const auto& [key, value] : rest.items()) beside |= Annotations().count(key) == 0;
    if (!beside) return Ref(s["$ref"].get<std::string>(), path);
    // Keywords beside $ref apply too (draft 2019+): the allOf of the two.
    const json both = {{"allOf", json::array({json{{"$ref", s["$ref"]}}, rest})}};
    const int32_t id = Allocate();
    EMBER_RETURN_IF_ERROR(Fill(id, both, path));
    return id;
  }
  const int32_t id = Allocate();
  EMBER_RETURN_IF_ERROR(Fill(id, s, path));
  return id;
}

Status Compiler::FillObject(JsonSchemaNode& node, const json& s, bool& closed,
                            const std::string& path) {
  node.kind = JsonSchemaNode::kObject;
  std::set<std::string> required;
  if (const auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) return Unsupported(path + ".required", "must be an array of names");
    for (const json& name : *it) {
      if (!name.is_string()) return Unsupported(path + ".required", "must be an array of names");
      required.insert(name.get<std::string>());
    }
  }
  if (const auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) return Unsupported(path + ".properties", "must be an object");
    if (it->size() > 64) return Unsupported(path + ".properties", "at most 64 are supported");
    for (const auto& [name, sub] : it->items()) {
      JsonSchemaNode::Property p;
      p.key = json(name).dump();
      EMBER_ASSIGN_OR_RETURN(p.node, Node(sub, path + ".properties." + name));
      p.required = required.erase(name) > 0;
      node.properties.push_back(std::move(p));
    }
  }
  if (!required.empty())
    return Unsupported(path + ".required", "'" + *required.begin() + "' is not in properties");
  node.any_keys = node.properties.empty();
  if (const auto it = s.find("additionalProperties"); it != s.end()) {
    if (it->is_boolean()) {
      node.any_keys = node.any_keys && it->get<bool>();
      closed = !it->get<bool>();
    } else if (node.properties.empty()) {
      EMBER_ASSIGN_OR_RETURN(node.values, Node(*it, path + ".additionalProperties"));
    }
    // With properties, only they are generated: any additionalProperties allows that.
  }
  return Status::Ok();
}

// uniqueItems true: enforced where the items are an inline enum/const of at most 64 values (the
// machine keeps a bit per value written); otherwise a 400 naming it.
Status Compiler::UniqueItems(JsonSchemaNode& node, const json& s, const std::string& path) {
  const auto it = s.find("uniqueItems");
  if (it == s.end()) return Status::Ok();
  if (!it->is_boolean()) return Unsupported(path + ".uniqueItems", "must be a boolean");
  if (!it->get<bool>()) return Status::Ok();
  const JsonSchemaNode* items =
      node.items >= 0 ? &nodes_[static_cast<size_t>(node.items)] : nullptr;
  if (!node.prefix_items.empty() || items == nullptr ||
      items->kind != JsonSchemaNode::kLiterals || items->literals.size() > 64) {
    return Unsupported(path + ".uniqueItems",
                       "true is supported only for arrays whose items are an inline enum or const "
                       "of at most 64 values (no prefixItems)");
  }
  if (static_cast<size_t>(node.min_items) > items->literals.size())
    return Unsupported(path + ".minItems", "exceeds the number of distinct items: no array fits");
  node.unique_items = true;
  return Status::Ok();
}

Status Compiler::FillArray(JsonSchemaNode& node, const json& s, const std::string& path) {
  node.kind = JsonSchemaNode::kArray;
  // A tuple: prefixItems then items (2020-12), or items as a list then additionalItems (older).
  const bool old_tuple = s.contains("items") && s["items"].is_array();
  const char* prefix_key = old_tuple ? "items" : "prefixItems";
  const char* rest_key = old_tuple ? "additionalItems" : "items";
  if (const auto it = s.find(prefix_key); it != s.end()) {
    if (!it->is_array() || it->size() > 64)
      return Unsupported(path + "." + prefix_key, "must be an array of at most 64 schemas");
    for (size_t i = 0; i < it->size(); ++i) {
      EMBER_ASSIGN_OR_RETURN(int32_t item,
                             Node((*it)[i], path + "." + prefix_key + "[" + std::to_string(i) + "]"));
      node.prefix_items.push_back(item);
    }
  }
  bool closed = false;
  if (const auto it = s.find(rest_key); it != s.end()) {
    if (it->is_boolean() && !it->get<bool>()) {
      closed = true;
    } else {
      EMBER_ASSIGN_OR_RETURN(node.items, Node(*it, path + "." + rest_key));
    }
  }
  for (const char* key : {"minItems", "maxItems"}) {
    const auto it = s.find(key);
    if (it == s.end()) continue;
    if (!it->is_number_unsigned())
      return Unsupported(path + "." + key, "must be a non-negative integer");
    const uint64_t v = it->get<uint64_t>();
    if (key[1] == 'i') {
      if (v > 65535) return Unsupported(path + ".minItems", "at most 65535 is supported");
      node.min_items = static_cast<int32_t>(v);
    } else {
      node.max_items = static_cast<int32_t>(std::min<uint64_t>(v, 65535));
    }
  }
  if (closed) node.max_items = std::min<int32_t>(node.max_items, static_cast<int32_t>(node.prefix_items.size()));
  EMBER_RETURN_IF_ERROR(UniqueItems(node, s, path));
  if (node.min_items > node.max_items)
    return Unsupported(path + ".minItems", "exceeds maxItems (or the tuple's length): no array fits");
  return Status::Ok();
}

// The keywords compiled as another schema (schema_rewrite.h): nullable, if/then/else, allOf, not.
// True when `s` was one and node `id` is filled.
Result<bool> Compiler::Rewrite(int32_t id, const json& s, const std::string& path) {
  if (s.contains("nullable")) {
    EMBER_RETURN_IF_ERROR(Fill(id, WithoutNullable(s), path));
    return true;
  }
  if (s.contains("if") || s.contains("then") || s.contains("else")) {
    EMBER_ASSIGN_OR_RETURN(json plain, WithoutIf(s, root_, path));
    EMBER_RETURN_IF_ERROR(FillNarrowed(id, plain, true, path));
    return true;
  }
  if (s.contains("allOf")) {
    EMBER_ASSIGN_OR_RETURN(json merged, MergeAllOf(s, root_, path));
    EMBER_RETURN_IF_ERROR(Fill(id, merged, path));
    return true;
  }
  if (!s.contains("not")) return false;
  EMBER_ASSIGN_OR_RETURN(json positive, WithoutNot(s, root_, path));
  if (positive == s) return false;  // strings excluded from a string (StringAutomaton)
  // Exact beside a named type or literals for the forms type / const / enum (not objects).
  const json& n = s["not"];
  bool exact = s.contains("type") || s.contains("enum") || s.contains("const");
  if (n.is_object()) {
    for (auto it = n.begin(); it != n.end(); ++it)
      exact = exact && (it.key() == "type" || it.key() == "enum" || it.key() == "const");
  }
  EMBER_RETURN_IF_ERROR(FillNarrowed(id, positive, !exact, path));
  return true;
}

Status Compiler::Fill(int32_t id, const json& s, const std::string& path) {
  JsonSchemaNode node;
  if (s.is_boolean()) {
    if (!s.get<bool>()) return Unsupported(path, "the schema false allows no value");
    nodes_[static_cast<size_t>(id)] = std::move(node);  // kAny
    return Status::Ok();
  }
  if (!s.is_object()) return Unsupported(path, "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items()) {
    if (Understood().count(key) == 0 && Annotations().count(key) == 0)
      return Unsupported(path + "." + key, "the keyword '" + key + "' is not supported");
  }
  EMBER_ASSIGN_OR_RETURN(const bool rewritten, Rewrite(id, s, path));
  if (rewritten) return Status::Ok();
  if (s.contains("$ref"))
    return Unsupported(path + ".$ref", "keywords beside $ref are not supported");
  if (s.contains("enum") || s.contains("const")) {
    EMBER_RETURN_IF_ERROR(FillLiterals(node, s, path));
    nodes_[static_cast<size_t>(id)] = std::move(node);
    facts_[static_cast<size_t>(id)].typed = true;
    return Status::Ok();
  }
  if (const auto it = s.find("type"); it != s.end() && it->is_array() && it->empty())
    return Unsupported(path + ".type", "an empty list of types allows no value");
  const char* union_key = s.contains("anyOf") ? "anyOf" : s.contains("oneOf") ? "oneOf" : nullptr;
  if (union_key != nullptr || (s.contains("type") && s["type"].is_array())) {
    std::vector<int32_t> branches;
    if (union_key != nullptr) {
      if (s.contains("type") || (s.contains("anyOf") && s.contains("oneOf")))
        return Unsupported(path + "." + union_key,
                           "is supported only without type or the other of anyOf/oneOf");
      const json& list = s[union_key];
      if (!list.is_array() || list.empty())
        return Unsupported(path + "." + union_key, "must be a non-empty array");
      for (size_t i = 0; i < list.size(); ++i) {
        EMBER_ASSIGN_OR_RETURN(
            int32_t b, Node(list[i], path + "." + union_key + "[" + std::to_string(i) + "]"));
        branches.push_back(b);
      }
    } else {
      for (const json& t : s["type"]) {
        json single = s;
        single["type"] = t;
        EMBER_ASSIGN_OR_RETURN(int32_t b, Node(single, path + ".type"));
        branches.push_back(b);
      }
    }
    node.kind = JsonSchemaNode::kUnion;
    nodes_[static_cast<size_t>(id)] = std::move(node);
    branches_[static_cast<size_t>(id)] = std::move(branches);
    paths_[static_cast<size_t>(id)] =
        path + (union_key != nullptr ? std::string(".") + union_key : ".type");
    if (union_key != nullptr && std::string_view(union_key) == "oneOf") one_ofs_.push_back(id);
    return Status::Ok();
  }
  const bool object_keys = s.contains("properties") || s.contains("required") ||
                           s.contains("additionalProperties") || HasObjectRewriteKeyword(s);
  const bool array_keys = s.contains("items") || s.contains("prefixItems") ||
                          s.contains("minItems") || s.contains("maxItems") ||
                          s.contains("uniqueItems");
  // Without a type, object or array keywords say which.
  std::string type = object_keys ? "object" : array_keys ? "array" : "";
  if (const auto it = s.find("type"); it != s.end()) {
    if (!it->is_string())
      return Unsupported(path + ".type", "must be a string or an array of strings");
    type = it->get<std::string>();
  }
  // Keywords of other types than `type` do not apply to its values (JSON Schema): a type list's
  // branches each read their own.
  SchemaNodeFacts facts{s.contains("type"), false};
  if (type == "object" && HasObjectRewriteKeyword(s)) {
    EMBER_ASSIGN_OR_RETURN(json plain, RewriteObjectKeywords(s, path));
    return FillNarrowed(id, plain, s.contains("minProperties"), path);
  }
  if (type == "object" || type == "array") {
    EMBER_RETURN_IF_ERROR(FillContainer(node, s, type, facts.closed, path));
  } else if (type == "string") {
    node.kind = JsonSchemaNode::kString;
    facts.narrowed = s.contains("format");  // its regex is an approximation (schema_regexes.h)
    for (const char* key : {"minLength", "maxLength"}) {
      const auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_number_unsigned() || it->get<uint64_t>() > INT32_MAX)
        return Unsupported(path + "." + key, "must be a non-negative integer");
      (key[1] == 'i' ? node.min_length : node.max_length) = it->get<int32_t>();
    }
    if (node.min_length > node.max_length)
      return Unsupported(path + ".minLength", "exceeds maxLength: no string fits");
    EMBER_RETURN_IF_ERROR(StringAutomaton(node, s, path));
  } else if (type == "number" || type == "integer") {
    node.kind = type == "number" ? JsonSchemaNode::kNumber : JsonSchemaNode::kInteger;
    EMBER_RETURN_IF_ERROR(NumberAutomaton(node, s, type == "integer", path));
  } else if (type == "boolean") {
    node.kind = JsonSchemaNode::kBoolean;
  } else if (type == "null") {
    node.kind = JsonSchemaNode::kNull;
  } else if (!type.empty()) {
    return Unsupported(path + ".type", "unknown type '" + type + "'");
  }
  nodes_[static_cast<size_t>(id)] = std::move(node);
  facts_[static_cast<size_t>(id)] = facts;
  return Status::Ok();
}

Status Compiler::FillContainer(JsonSchemaNode& node, const json& s, const std::string& type,
                               bool& closed, const std::string& path) {
  if (containers_ >= JsonSchemaMachine::kMaxFrames) {
    return Unsupported(path, "objects and arrays nest deeper than " +
                                 std::to_string(JsonSchemaMachine::kMaxFrames) + " in this schema");
  }
  ++containers_;
  Status st = type == "object" ? FillObject(node, s, closed, path) : FillArray(node, s, path);
  --containers_;
  return st;
}

std::vector<uint32_t> DecodeUtf8(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? b : b & (0x7F >> n);
    for (int k = 1; k < n && i + static_cast<size_t>(k) < s.size(); ++k)
      cp = (cp << 6) | (static_cast<uint8_t>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

// Every string but the `excluded` ones (valid UTF-8, at most 64): at each prefix of an excluded
// string, the prefix itself unless excluded, or a character that leaves the prefixes and then
// anything.
Result<std::shared_ptr<const RegexDfa>> ExcludedStrings(const std::vector<std::string>& excluded,
                                                        const std::string& path) {
  size_t bytes = 0;
  for (const std::string& e : excluded) bytes += e.size();
  if (excluded.size() > 64 || bytes > 4096)
    return Unsupported(path, "at most 64 excluded strings of 4096 bytes in all are supported");
  std::map<std::vector<uint32_t>, std::pair<bool, CodePointRanges>> prefixes;  // excluded, next
  for (const std::string& e : excluded) {
    const std::vector<uint32_t> cps = DecodeUtf8(e);
    for (size_t n = 0; n <= cps.size(); ++n) {
      auto& [member, next] = prefixes[std::vector<uint32_t>(cps.begin(), cps.begin() + n)];
      if (n == cps.size()) member = true;
      else next.emplace_back(cps[n], cps[n]);
    }
  }
  RegexSyntax x;
  const int32_t anything = x.Repeat(x.Set(AnyCodePoint()), 0, -1);
  std::vector<int32_t> allowed;
  for (const auto& [prefix, entry] : prefixes) {
    std::vector<int32_t> chars;
    for (const uint32_t cp : prefix) chars.push_back(x.Set({{cp, cp}}));
    if (!entry.first) allowed.push_back(x.Concat(chars));
    chars.push_back(x.Set(NegateCodePoints(NormalizeCodePoints(entry.second))));
    chars.push_back(anything);
    allowed.push_back(x.Concat(std::move(chars)));
  }
  return RegexDfa::Compile(x, x.Alternate(std::move(allowed)), path);
}

// pattern and format as automata over the decoded string; with one of them, the length bounds
// join the automaton (an intersection), where a counter would not know which lengths the
// pattern can still reach.
Status Compiler::StringAutomaton(JsonSchemaNode& node, const json& s, const std::string& path) {
  std::vector<std::shared_ptr<const RegexDfa>> parts;
  if (const auto it = s.find("pattern"); it != s.end()) {
    if (!it->is_string()) return Unsupported(path + ".pattern", "must be a string");
    EMBER_ASSIGN_OR_RETURN(auto dfa, CompileRegex(it->get<std::string>(), RegexMatch::kSearch,
                                                  path + ".pattern"));
    parts.push_back(std::move(dfa));
  }
  if (const auto it = s.find("format"); it != s.end()) {
    if (!it->is_string()) return Unsupported(path + ".format", "must be a string");
    const std::optional<std::string> regex = FormatRegex(it->get<std::string>());
    if (!regex) {
      return Unsupported(path + ".format", "the format '" + it->get<std::string>() +
                                               "' is not supported (supported: " +
                                               SupportedFormats() + ")");
    }
    EMBER_ASSIGN_OR_RETURN(auto dfa, CompileRegex(*regex, RegexMatch::kWhole, path + ".format"));
    parts.push_back(std::move(dfa));
  }
  if (const auto it = s.find("not"); it != s.end()) {  // {"enum": [strings]} (WithoutNot)
    std::vector<std::string> excluded;
    for (const json& v : (*it)["enum"]) excluded.push_back(v.get<std::string>());
    EMBER_ASSIGN_OR_RETURN(auto dfa, ExcludedStrings(excluded, path + ".not"));
    parts.push_back(std::move(dfa));
  }
  if (parts.empty()) return Status::Ok();
  const std::string both = path + " (minLength/maxLength with pattern/format)";
  if (node.min_length > 0 || node.max_length < INT32_MAX) {
    RegexSyntax lengths;
    const int32_t root =
        lengths.Repeat(lengths.Set(AnyCodePoint()), node.min_length,
                       node.max_length == INT32_MAX ? -1 : node.max_length);
    EMBER_ASSIGN_OR_RETURN(auto dfa, RegexDfa::Compile(lengths, root, both));
    parts.push_back(std::move(dfa));
  }
  std::shared_ptr<const RegexDfa> whole = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    EMBER_ASSIGN_OR_RETURN(whole, RegexDfa::Intersect(*whole, *parts[i],
                                                      parts.size() == 2 && node.min_length == 0 &&
                                                              node.max_length == INT32_MAX
                                                          ? path + " (pattern with format)"
                                                          : both));
  }
  node.dfa = AddDfa(std::move(whole));
  return Status::Ok();
}

// minimum / maximum / exclusiveMinimum / exclusiveMaximum as an automaton over the number's text
// (schema_regexes.h), and the digit limits for every number. Bounds are rounded inward to
// integers: exact for integers; for numbers the documented approximation (decimals only where
// their whole unit interval fits).
Status Compiler::NumberAutomaton(JsonSchemaNode& node, const json& s, bool integer,
                                 const std::string& path) {
  constexpr double kLimit = 1e18;
  std::optional<int64_t> lo, hi;
  bool any = false;
  for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    const auto it = s.find(key);
    if (it == s.end() || it->is_boolean()) continue;  // draft 4's boolean exclusive* below
    if (!it->is_number()) return Unsupported(path + "." + key, "must be a number");
    any = true;
    const std::string_view name(key);
    const bool lower = name == "minimum" || name == "exclusiveMinimum";
    const std::string other = std::string("exclusive") + (lower ? "Minimum" : "Maximum");
    const bool exclusive = name.starts_with("exclusive") ||
                           (s.contains(other) && s[other].is_boolean() && s[other].get<bool>());
    const double x = it->get<double>();
    if (lower ? x < -kLimit : x > kLimit) continue;  // no bound within reach
    if (std::fabs(x) > kLimit)
      return Unsupported(path + "." + key, "bounds beyond ±10^18 are not supported");
    const auto bound = static_cast<int64_t>(lower ? (exclusive ? std::floor(x) + 1 : std::ceil(x))
                                                  : (exclusive ? std::ceil(x) - 1 : std::floor(x)));
    if (lower) lo = lo ? std::max(*lo, bound) : bound;
    if (!lower) hi = hi ? std::min(*hi, bound) : bound;
  }
  const std::string where = !any ? path : path + "." + (lo ? "minimum" : "maximum");
  std::shared_ptr<const RegexDfa> multiples;
  if (const auto it = s.find("multipleOf"); it != s.end()) {
    // An integer k: the multiples of k (integers, also for "number": a sound subset).
    const double k = it->is_number() ? it->get<double>() : 0;
    const bool whole = k >= 1 && k <= double(RegexDfa::kMaxDivisor) && std::trunc(k) == k;
    if (!whole) {
      return Unsupported(path + ".multipleOf", "only integers from 1 to " +
                                                   std::to_string(RegexDfa::kMaxDivisor) +
                                                   " are supported");
    }
    multiples = RegexDfa::Multiples(static_cast<int64_t>(k));
    integer = true;
  }
  if (!lo && !hi && !multiples) {  // the digit limits alone (schema_regexes.h)
    const std::string regex = integer ? IntegerRangeRegex(lo, hi) : UnboundedNumberRegex();
    EMBER_ASSIGN_OR_RETURN(auto dfa, CompileRegex(regex, RegexMatch::kWhole, where));
    node.dfa = AddDfa(std::move(dfa));
    return Status::Ok();
  }
  if (lo && hi && *lo > *hi)
    return Unsupported(where, "no " + std::string(integer ? "integer" : "value") +
                                  " lies within the bounds (number bounds are rounded inward "
                                  "to integers)");
  const std::string regex = integer ? IntegerRangeRegex(lo, hi) : NumberRangeRegex(lo, hi);
  EMBER_ASSIGN_OR_RETURN(auto dfa, CompileRegex(regex, RegexMatch::kWhole, where));
  if (multiples) {
    EMBER_ASSIGN_OR_RETURN(dfa, RegexDfa::Intersect(*dfa, *multiples, path + ".multipleOf"));
  }
  node.dfa = AddDfa(std::move(dfa));
  return Status::Ok();
}

// The length of a JSON string in code points (what minLength / maxLength count).
size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}


// enum / const: the values that also satisfy the schema's type and string lengths; none is an
// error (the schema allows no value).
Status Compiler::FillLiterals(JsonSchemaNode& node, const json& s, const std::string& path) {
  const std::string key = s.contains("const") ? "const" : "enum";
  if (s.contains("const") && s.contains("enum"))
    return Unsupported(path + ".enum", "enum beside const is not supported");
  for (const char* other : {"properties", "required", "additionalProperties", "items", "prefixItems",
                            "minItems", "maxItems", "anyOf", "oneOf", "pattern", "format",
                            "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                            "multipleOf", "minProperties", "maxProperties", "dependentRequired",
                            "propertyNames", "patternProperties"}) {
    if (s.contains(other))
      return Unsupported(path + "." + other, "is not supported beside " + key);
  }
  std::vector<const json*> values;
  if (key == "const") {
    values.push_back(&s["const"]);
  } else {
    if (!s["enum"].is_array() || s["enum"].empty())
      return Unsupported(path + ".enum", "must be a non-empty array");
    for (const json& v : s["enum"]) values.push_back(&v);
  }
  std::vector<std::string> types;
  if (const auto it = s.find("type"); it != s.end()) {
    for (const json& t : it->is_array() ? *it : json::array({*it})) {
      static const std::set<std::string> kTypes = {"string", "number", "integer", "boolean",
                                                   "null",   "object", "array"};
      if (!t.is_string() || kTypes.count(t.get<std::string>()) == 0)
        return Unsupported(path + ".type", "must name JSON types (\"string\", \"integer\", ...)");
      types.push_back(t.get<std::string>());
    }
    if (types.empty()) return Unsupported(path + ".type", "an empty list of types allows no value");
  }
  uint64_t min_length = 0, max_length = UINT64_MAX;
  for (const char* bound : {"minLength", "maxLength"}) {
    const auto it = s.find(bound);
    if (it == s.end()) continue;
    if (!it->is_number_unsigned()) return Unsupported(path + "." + bound, "must be a non-negative integer");
    (bound[1] == 'i' ? min_length : max_length) = it->get<uint64_t>();
  }
  node.kind = JsonSchemaNode::kLiterals;
  for (const json* v : values) {
    const bool typed = types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) {
                         return JsonHasType(*v, t);
                       });
    if (!typed) continue;
    if (v->is_string()) {
      const size_t length = CodePoints(v->get<std::string>());
      if (length < min_length || length > max_length) continue;
    }
    node.literals.push_back(v->dump());
  }
  if (node.literals.empty()) {
    return Unsupported(path + "." + key,
                       "no value satisfies the schema's type and length keywords: the schema "
                       "allows no value");
  }
  std::sort(node.literals.begin(), node.literals.end());
  node.literals.erase(std::unique(node.literals.begin(), node.literals.end()), node.literals.end());
  return Status::Ok();
}

// The first bytes of each node's values. A union's are its branches' (through unions, a cycle of
// unions adds nothing): a worklist over the union edges, each set growing at most 256 times.
std::vector<FirstBytes> Compiler::AllStarts() const {
  const size_t n = nodes_.size();
  std::vector<FirstBytes> starts(n);
  std::vector<std::vector<int32_t>> unions_of(n);  // node -> the unions it is a branch of
  for (size_t id = 0; id < n; ++id) {
    const JsonSchemaNode& node = nodes_[id];
    if (node.kind == JsonSchemaNode::kLiterals) {
      for (const std::string& l : node.literals) starts[id].set(static_cast<uint8_t>(l[0]));
    } else if (node.kind == JsonSchemaNode::kUnion) {
      for (int32_t b : branches_[id]) unions_of[static_cast<size_t>(b)].push_back(static_cast<int32_t>(id));
    } else {
      for (char c : JsonSchemaKindStarts(node.kind)) starts[id].set(static_cast<uint8_t>(c));
    }
  }
  std::vector<int32_t> pending;
  for (size_t id = 0; id < n; ++id)
    if (starts[id].any()) pending.push_back(static_cast<int32_t>(id));
  while (!pending.empty()) {
    const auto id = static_cast<size_t>(pending.back());
    pending.pop_back();
    for (int32_t u : unions_of[id]) {
      const FirstBytes grown = starts[static_cast<size_t>(u)] | starts[id];
      if (grown == starts[static_cast<size_t>(u)]) continue;
      starts[static_cast<size_t>(u)] = grown;
      pending.push_back(u);
    }
  }
  return starts;
}

// Per union and first byte, the non-union nodes reachable through its branches (nested unions
// flattened; a cycle of unions adds nothing) whose values may start with that byte: one is the
// branch, several are followed together by the machine (JsonSchemaMachine), at most kMaxPaths.
Status Compiler::FinishUnions() {
  const std::vector<FirstBytes> starts = AllStarts();
  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (nodes_[id].kind != JsonSchemaNode::kUnion) continue;
    // The union's leaves, in branch order (depth first), each once.
    std::vector<int32_t> leaves, stack = {static_cast<int32_t>(id)};
    std::vector<uint8_t> seen(nodes_.size(), 0);
    while (!stack.empty()) {
      const auto u = static_cast<size_t>(stack.back());
      stack.pop_back();
      if (seen[u]) continue;
      seen[u] = 1;
      if (nodes_[u].kind != JsonSchemaNode::kUnion) {
        leaves.push_back(static_cast<int32_t>(u));
        continue;
      }
      const std::vector<int32_t>& branches = branches_[u];
      for (auto it = branches.rbegin(); it != branches.rend(); ++it) stack.push_back(*it);
    }
    JsonSchemaNode& node = nodes_[id];
    node.branch_by_first_byte.fill(-1);
    node.shared_branches.clear();
    std::map<std::vector<int32_t>, int32_t> list_index;  // equal lists are stored once
    for (int c = 0; c < 256; ++c) {
      std::vector<int32_t> takers;
      for (int32_t leaf : leaves)
        if (starts[static_cast<size_t>(leaf)].test(static_cast<size_t>(c))) takers.push_back(leaf);
      if (takers.empty()) continue;
      if (takers.size() == 1) {
        node.branch_by_first_byte[static_cast<size_t>(c)] = takers[0];
        continue;
      }
      if (takers.size() > static_cast<size_t>(JsonSchemaMachine::kMaxPaths)) {
        return Unsupported(paths_[id], "more than " +
                                           std::to_string(JsonSchemaMachine::kMaxPaths) +
                                           " branches can start with the same byte ('" +
                                           std::string(1, static_cast<char>(c)) + "')");
      }
      auto [it, added] =
          list_index.try_emplace(takers, static_cast<int32_t>(node.shared_branches.size()));
      if (added) node.shared_branches.push_back(takers);
      node.branch_by_first_byte[static_cast<size_t>(c)] = -2 - it->second;
    }
  }
  return Status::Ok();
}

// oneOf is followed as anyOf (JsonSchemaMachine), which is exact only where no value the machine
// writes for one branch is valid against another: proven per ordered pair (schema_disjoint.h), else
// the schema is refused naming the pair.
Status Compiler::CheckOneOf() const {
  const SchemaGraph graph{nodes_, branches_, facts_, dfas_};
  int intersections = kMaxProofIntersections;
  for (const int32_t id : one_ofs_) {
    const std::vector<int32_t>& branches = branches_[static_cast<size_t>(id)];
    if (branches.size() > kMaxOneOfBranches) {
      return Unsupported(paths_[static_cast<size_t>(id)],
                         "at most " + std::to_string(kMaxOneOfBranches) +
                             " branches are supported (each pair is proven exclusive)");
    }
    for (size_t i = 0; i < branches.size(); ++i) {
      for (size_t j = 0; j < branches.size(); ++j) {
        if (i == j || MachineExcludes(graph, branches[i], branches[j], &intersections)) continue;
        return Unsupported(
            paths_[static_cast<size_t>(id)],
            "branches [" + std::to_string(std::min(i, j)) + "] and [" +
                std::to_string(std::max(i, j)) +
                "] may both match one value, and oneOf needs exactly one (supported where the "
                "branches provably exclude each other: different types, different const/enum "
                "values of a required property, disjoint literals, patterns or ranges; use anyOf "
                "if overlapping is fine)");
      }
    }
  }
  return Status::Ok();
}

// For each node, the fewest machine frames (open objects/arrays) a value of it needs, kNoValue
// when none fits in kMaxFrames (or it has no value at all: a required recursion, a union whose
// branches all lead back to it). Values only fall, each at most kNoValue times: a worklist.
std::vector<uint8_t> Compiler::MinFrames() const {
  const size_t n = nodes_.size();
  std::vector<uint8_t> frames(n, kNoValue);
  std::vector<std::vector<int32_t>> users(n);  // node -> the nodes whose value depends on it
  auto edges = [&](size_t id, auto&& visit) {
    const JsonSchemaNode& node = nodes_[id];
    if (node.kind == JsonSchemaNode::kObject) {
      for (const auto& p : node.properties)
        if (p.required) visit(p.node);
    } else if (node.kind == JsonSchemaNode::kArray) {
      const auto num_prefix = static_cast<int32_t>(node.prefix_items.size());
      for (int32_t i = 0; i < std::min(node.min_items, num_prefix); ++i)
        visit(node.prefix_items[static_cast<size_t>(i)]);
      if (node.min_items > num_prefix && node.items >= 0) visit(node.items);
    } else if (node.kind == JsonSchemaNode::kUnion) {
      for (int32_t b : node.branch_by_first_byte)
        if (b >= 0) visit(b);
      for (const std::vector<int32_t>& shared : node.shared_branches)
        for (int32_t b : shared) visit(b);
    }
  };
  auto evaluate = [&](size_t id) -> uint8_t {
    const JsonSchemaNode& node = nodes_[id];
    auto at = [&](int32_t b) { return b < 0 ? uint8_t{0} : frames[static_cast<size_t>(b)]; };
    int best = 0;
    switch (node.kind) {
      case JsonSchemaNode::kObject:
      case JsonSchemaNode::kArray:
        best = 0;
        edges(id, [&](int32_t b) { best = std::max<int>(best, at(b)); });
        return static_cast<uint8_t>(std::min<int>(best + 1, kNoValue));
      case JsonSchemaNode::kUnion:
        best = kNoValue;
        edges(id, [&](int32_t b) { best = std::min<int>(best, at(b)); });
        return static_cast<uint8_t>(best);
      default:
        return 0;
    }
  };
  for (size_t id = 0; id < n; ++id)
    edges(id, [&](int32_t b) { users[static_cast<size_t>(b)].push_back(static_cast<int32_t>(id)); });
  std::vector<int32_t> pending(n);
  for (size_t id = 0; id < n; ++id) pending[id] = static_cast<int32_t>(n - 1 - id);
  while (!pending.empty()) {
    const auto id = static_cast<size_t>(pending.back());
    pending.pop_back();
    const uint8_t value = evaluate(id);
    if (value >= frames[id]) continue;
    frames[id] = value;
    for (int32_t u : users[id]) pending.push_back(u);
  }
  return frames;
}

// An object, or a union whose every branch starts with '{' (objects, object literals).
bool ObjectsOnly(const JsonSchemaNode& node) {
  if (node.kind != JsonSchemaNode::kUnion) return node.kind == JsonSchemaNode::kObject;
  for (int c = 0; c < 256; ++c)
    if (c != '{' && node.branch_by_first_byte[static_cast<size_t>(c)] != -1) return false;
  return true;
}

}  // namespace

Result<std::shared_ptr<const CompiledJsonSchema>> CompileJsonSchema(const json& schema,
                                                                    const std::string& path) {
  // Compiling copies and prints parts of the schema (recursively): bound its depth first.
  if (JsonValueDepth(schema) > kMaxSchemaJsonDepth) {
    return Unsupported(path, "nests deeper than " + std::to_string(kMaxSchemaJsonDepth) +
                                 " arrays/objects");
  }
  Compiler compiler(schema, path);
  EMBER_ASSIGN_OR_RETURN(int32_t root, compiler.Node(schema, path));
  EMBER_RETURN_IF_ERROR(compiler.CheckOneOf());
  EMBER_RETURN_IF_ERROR(compiler.FinishUnions());
  auto out = std::make_shared<CompiledJsonSchema>();
  out->min_frames = compiler.MinFrames();
  out->nodes = compiler.TakeNodes();
  out->dfas = compiler.TakeDfas();
  if (out->nodes.size() > 65535) return Unsupported(path, "the schema is too large");
  if (!ObjectsOnly(out->nodes[static_cast<size_t>(root)])) {
    return Unsupported(path, "the root schema must be an object (\"type\": \"object\", or "
                             "anyOf/oneOf/if of objects)");
  }
  if (out->min_frames[static_cast<size_t>(root)] > JsonSchemaMachine::kMaxFrames) {
    return Unsupported(path, "the schema allows no value that nests at most " +
                                 std::to_string(JsonSchemaMachine::kMaxFrames) +
                                 " objects/arrays deep (a required property or item recurses, "
                                 "or a union has no branch with a value)");
  }
  out->root = root;
  return std::shared_ptr<const CompiledJsonSchema>(std::move(out));
}

}  // namespace ember
