// Structured output with a JSON Schema (`response_format` json_schema, `guided_json`,
// `json_schema`, strict tool parameters): the sample's text must be one JSON value valid against
// the schema. CompileJsonSchema (json_schema.cc) turns the supported subset into a graph of nodes;
// JsonSchemaMachine (json_schema_machine.cc) is the byte machine of that language for
// ByteMachineConstraint (json_constraint.h).
//
// Supported: `type` (a name or a list; each type reads only its own keywords), `enum`, `const`,
// `properties` + `required` (properties are written in the schema's order; optional ones may be
// left out; no others are generated), `additionalProperties` (a schema for the values of an
// object without `properties`), `items`, `prefixItems` (and the older `items` list with
// `additionalItems`), `minItems`, `maxItems`, `minLength`, `maxLength` (code points; an escape is
// one), `pattern` (regex_syntax.h's subset, searched over the decoded string), `format`
// (schema_regexes.h), `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` and integer
// `multipleOf` (a digit automaton; exact for integers, rounded inward for numbers), `allOf` and
// `nullable`, `not` and `if`/`then`/`else` in the forms schema_rewrite.h turns into positive
// schemas, the object keywords of schema_object_rewrite.h, `anyOf` / `oneOf` / type lists
// (branches that start alike are followed together: JsonSchemaMachine below; `oneOf` only where
// its branches provably exclude each other, schema_disjoint.h, so anyOf is exact), local `$ref` (`#/$defs/N`,
// `#/definitions/N`, `#`; recursion allowed; keywords beside it apply too), and annotations that
// do not constrain (`title`, `description`, `default`, `examples`, ..., and `uniqueItems:
// false`), `uniqueItems: true` where the items are an inline enum/const of at most 64 values
// (each written at most once). Anything else that would constrain the value (other forms of
// `not`, overlapping `oneOf`, other `uniqueItems: true`, `contains`, an unknown format, ...) is an
// error naming the keyword and its path, never a silent no-op. The root must be an object schema
// or a union of objects. Strings with a pattern
// or format, and every number, run on a RegexDfa (numbers within 18 + 16 digits and a two-digit
// exponent); whitespace between tokens follows StepWhitespace (json_constraint.h).
//
// Bounds (client schemas): the schema's JSON nests at most 128 deep and its subschemas at most
// 64 (through $ref chains too); objects and arrays written in the schema nest at most kMaxFrames
// (16) deep, an error naming the path. A recursive $ref may describe deeper values: the machine
// generates them up to kMaxFrames, starting a value only where it can be completed.
// Unsatisfiable schemas are refused when compiled, naming keyword and path: an empty type list,
// an enum/const with no value of the schema's type and lengths, minLength > maxLength, minItems
// > maxItems, a required property not in properties, `false`, and a root with no value within
// kMaxFrames (a required recursion). So a compiled schema's machine can always finish.
//
// The compiled schema is immutable and shared; the machine borrows it (the constraint owns it)
// and is a small value copied freely.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sampling/json_constraint.h"
#include "sampling/regex_dfa.h"
#include "sampling/token_constraint.h"
#include "util/status.h"

namespace ember {

struct JsonSchemaNode {
  enum Kind : uint8_t {
    kAny,
    kObject,
    kArray,
    kString,
    kNumber,
    kInteger,
    kBoolean,
    kNull,
    kLiterals,
    kUnion
  };
  struct Property {
    std::string key;  // JSON text of the key with its quotes, e.g. "\"name\""
    int32_t node = 0;
    bool required = false;
  };
  Kind kind = kAny;
  // kObject: properties in order; without properties, any keys whose values match `values`.
  std::vector<Property> properties;
  bool any_keys = false;  // kObject without properties: any keys (additionalProperties not false)
  int32_t values = -1;    // ... whose values match this node (-1: any value)
  // kArray
  int32_t items = -1;  // -1: any value
  int32_t min_items = 0, max_items = INT32_MAX;
  // kArray with uniqueItems: its items are `items`, a kLiterals node of at most 64 values, each
  // written at most once (JsonSchemaPath::unique_used_).
  bool unique_items = false;
  // kArray: prefixItems' nodes (item i < size follows prefix_items[i], later ones `items`).
  std::vector<int32_t> prefix_items;
  // kString: bounds on the number of characters (code points; an escape is one).
  int32_t min_length = 0, max_length = INT32_MAX;
  // kString, kInteger, kNumber: the value's automaton in CompiledJsonSchema::dfas (-1: none).
  // A string's runs over its decoded UTF-8 (pattern, format, and with them the lengths, which
  // then are folded in); a number's over its JSON text (minimum/maximum).
  int32_t dfa = -1;
  // kLiterals: the compact JSON text of each allowed value, sorted.
  std::vector<std::string> literals;
  // kUnion: for each first byte, the one (non-union) branch node that may start with it, -1 for
  // none, or -2 - k when several may: shared_branches[k] lists them (nested unions flattened).
  std::array<int32_t, 256> branch_by_first_byte{};
  std::vector<std::vector<int32_t>> shared_branches;
};

struct CompiledJsonSchema {
  std::vector<JsonSchemaNode> nodes;
  // Per node: the fewest open objects/arrays a value of it needs (JsonSchemaMachine::kMaxFrames
  // + 1: no value fits). The machine starts a value only where it fits, so it never strands.
  std::vector<uint8_t> min_frames;
  int32_t root = 0;  // an object node
  std::vector<std::shared_ptr<const RegexDfa>> dfas;
};

// The bytes a value of a scalar or container kind may start with (not kLiterals / kUnion, whose
// first bytes are their literals' and branches').
std::string_view JsonSchemaKindStarts(JsonSchemaNode::Kind kind);

// `path` names the schema in errors (e.g. "response_format.json_schema.schema"). The schema is an
// ordered_json: properties are generated in the order the client wrote them. (json_schema.cc;
// the machine is in json_schema_machine.cc.)
Result<std::shared_ptr<const CompiledJsonSchema>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, const std::string& path);

// One interpretation of the bytes so far: a stack of open objects/arrays with the schema node of
// each, and the leaf being read. Where a union has several branches that start with the byte
// that starts its value, the path takes branch `0` and reports num_forks(); the other branches
// are StartAlternative(i) of a copy (JsonSchemaMachine keeps the set).
class JsonSchemaPath {
 public:
  static constexpr int kMaxFrames = 16;

  JsonSchemaPath() = default;
  explicit JsonSchemaPath(const CompiledJsonSchema* schema);  // borrowed

  bool Step(uint8_t c);  // false if c may not come (the state is then garbage)
  // The number of branches the last Step could have started (0 or 1: no choice was made).
  int num_forks() const { return num_forks_; }
  // On a copy of a path whose last Step made a choice among num_forks() branches: starts the
  // value with branch `index` (>= 1) instead. False if that branch refuses the byte.
  bool StartAlternative(int index);
  bool Done() const { return done_; }
  void AppendKey(std::string* key) const;  // the state's bytes (json_constraint.h)
  // (Not inside a string whose length is bounded: there every token must be counted.)
  bool InPlainString() const {
    return leaf_ == kLeafScanner && !bounded_ && scanner_.InPlainString();
  }
  // Between the characters of a string with length bounds: *room more characters fit.
  bool InBoundedString(uint32_t* room) const {
    if (leaf_ != kLeafScanner || !bounded_ || !scanner_.InPlainString()) return false;
    const auto max = static_cast<uint32_t>(schema_->nodes[leaf_node_].max_length);
    *room = chars_ >= max ? 0 : max - chars_;
    return true;
  }
  // Between the characters of a string with an automaton (not in an escape): a byte without
  // quote, backslash or control character is exactly a step of the returned automaton.
  const RegexDfa* StringDfa(int32_t* state) const {
    if (leaf_ != kLeafDfaString || escape_ != 0) return nullptr;
    *state = dfa_state_;
    return &LeafDfa();
  }

 private:
  enum Phase : uint8_t {
    kObjectOpen,   // after '{': a key, or '}' when nothing required is left
    kObjectKey,    // after ',': a key
    kColon,        // after a key
    kMemberValue,  // after ':': the value
    kAfterMember,  // ',' or '}'
    kArrayOpen,    // after '[': an item or ']'
    kArrayItem,    // after ',': an item
    kAfterItem,    // ',' or ']'
  };
  struct Frame {
    uint16_t node;
    Phase phase;
    uint8_t pad;
    uint16_t index;  // object: next property; array: items so far
    uint16_t value;  // object: the node of the member being read (+1; 0: any)
  };
  // kLeafDfaString: a string value with an automaton (after its opening quote); kLeafDfaNumber:
  // a number with one.
  enum Leaf : uint8_t { kLeafNone, kLeafScanner, kLeafLiteral, kLeafKey, kLeafDfaString, kLeafDfaNumber };
  enum LiteralStep : uint8_t { kLiteralTook, kLiteralRefused, kLiteralEnded };

  bool StartValue(int32_t node, uint8_t c);
  bool StartBranch(int32_t node, uint8_t c);  // a non-union node (or -1: any value)
  // The innermost frame is a uniqueItems array reading an item (its literals are unique_used_'s).
  bool InUniqueItem() const;
  // Some literal of the unique array's items in [lo, hi) is not written yet.
  bool AnyUnused(uint16_t lo, uint16_t hi) const;
  bool StepDfaString(uint8_t c);
  // Some byte in [lo, hi] continues the string's automaton (an escape's choices).
  bool DfaTakesAny(uint8_t lo, uint8_t hi) const;
  const RegexDfa& LeafDfa() const {
    return *schema_->dfas[static_cast<size_t>(schema_->nodes[leaf_node_].dfa)];
  }
  bool StepStructure(uint8_t c);
  LiteralStep StepLiteral(uint8_t c);
  bool StepKey(uint8_t c);
  void ValueDone();
  bool CanClose(const Frame& f) const;
  uint64_t KeyCandidates(const Frame& f) const;
  // A value of `node` (-1: any value) can still be completed from the current depth.
  bool Fits(int32_t node) const {
    return node < 0 || depth_ + schema_->min_frames[static_cast<size_t>(node)] <= kMaxFrames;
  }

  const CompiledJsonSchema* schema_ = nullptr;
  std::array<Frame, kMaxFrames> frames_{};
  uint8_t depth_ = 0;
  Leaf leaf_ = kLeafNone;
  bool bounded_ = false;  // the leaf scanner reads a string with length bounds (leaf_node_)
  uint16_t leaf_node_ = 0;
  uint32_t chars_ = 0;  // bounded_: characters so far
  bool done_ = false;
  uint8_t ws_run_ = 0;
  JsonScanner scanner_;
  uint16_t lit_node_ = 0, lit_lo_ = 0, lit_hi_ = 0, lit_pos_ = 0;  // kLeafLiteral
  uint64_t key_mask_ = 0;                                          // kLeafKey: keys still possible
  // kLeafDfaString / kLeafDfaNumber (leaf_node_ is the node): the automaton's state; in a string,
  // the escape being read (0 none, 1 after a backslash, 2..4 after "u", "u0", "u00", 5 after
  // "u00X" with escape_value_ = X * 16).
  int32_t dfa_state_ = 0;
  uint8_t escape_ = 0, escape_value_ = 0;
  // The literals already written in the innermost array when it has uniqueItems (bit i: its items
  // node's literal i); part of the key only there.
  uint64_t unique_used_ = 0;
  // The last Step's choice among a union's shared branches (not part of the state's key).
  uint8_t num_forks_ = 0, fork_depth_ = 0, fork_byte_ = 0;
  int32_t fork_union_ = -1, fork_list_ = -1;
  Frame fork_frame_{};  // the innermost frame before the choice (depth > 0)
};

// The byte machine of a compiled schema: the set of live JsonSchemaPaths (one, unless union
// branches that start alike are still all possible: `anyOf` / `oneOf` / type lists whose branches
// share first bytes are followed together, each path dropped when a byte rules it out; `oneOf`
// compiles only with exclusive branches, so following it as `anyOf` is exact). Identical paths
// merge. At most kMaxPaths live at once: more (look-alike unions nested in look-alike unions)
// are dropped, so every output stays valid but some valid instances become unreachable. A value
// type copied freely (copies only the live paths).
class JsonSchemaMachine {
 public:
  static constexpr int kMaxFrames = JsonSchemaPath::kMaxFrames;
  static constexpr int kMaxPaths = 8;

  JsonSchemaMachine() = default;
  explicit JsonSchemaMachine(const CompiledJsonSchema* schema)
      : num_paths_(1) {
    paths_[0] = JsonSchemaPath(schema);
  }
  JsonSchemaMachine(const JsonSchemaMachine& other) { *this = other; }
  JsonSchemaMachine& operator=(const JsonSchemaMachine& other) {
    num_paths_ = other.num_paths_;
    for (int i = 0; i < num_paths_; ++i) paths_[i] = other.paths_[i];
    return *this;
  }

  bool Step(uint8_t c);  // false if c may not come (the state is then garbage)
  bool Done() const {
    for (int i = 0; i < num_paths_; ++i)
      if (paths_[i].Done()) return true;
    return false;
  }
  void AppendKey(std::string* key) const;
  // The fast paths of one path; with several live, none (every byte is stepped).
  bool InPlainString() const { return num_paths_ == 1 && paths_[0].InPlainString(); }
  bool InBoundedString(uint32_t* room) const {
    return num_paths_ == 1 && paths_[0].InBoundedString(room);
  }
  const RegexDfa* StringDfa(int32_t* state) const {
    return num_paths_ == 1 ? paths_[0].StringDfa(state) : nullptr;
  }
  int num_paths() const { return num_paths_; }

 private:
  std::array<JsonSchemaPath, kMaxPaths> paths_{};
  int num_paths_ = 0;
};

// JSON-schema structured output over `texts` (json_constraint.h).
std::shared_ptr<TokenConstraint> MakeJsonSchemaConstraint(
    std::shared_ptr<const TokenTexts> texts, std::shared_ptr<const CompiledJsonSchema> schema);

}  // namespace ember
