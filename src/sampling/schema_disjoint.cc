#include "sampling/schema_disjoint.h"

#include "sampling/schema_rewrite.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace ember {

namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxDepth = 8;

enum class Family : uint8_t { kObject, kArray, kString, kNumber, kBoolean, kNull, kNone };

Family FamilyOf(JsonSchemaNode::Kind kind) {
  switch (kind) {
    case JsonSchemaNode::kObject: return Family::kObject;
    case JsonSchemaNode::kArray: return Family::kArray;
    case JsonSchemaNode::kString: return Family::kString;
    case JsonSchemaNode::kNumber: case JsonSchemaNode::kInteger: return Family::kNumber;
    case JsonSchemaNode::kBoolean: return Family::kBoolean;
    case JsonSchemaNode::kNull: return Family::kNull;
    default: return Family::kNone;
  }
}

Family FamilyOf(const json& v) {
  if (v.is_object()) return Family::kObject;
  if (v.is_array()) return Family::kArray;
  if (v.is_string()) return Family::kString;
  if (v.is_number()) return Family::kNumber;
  if (v.is_boolean()) return Family::kBoolean;
  return Family::kNull;
}

bool DfaAccepts(const RegexDfa& dfa, const std::string& text) {
  int32_t state = dfa.start();
  for (const char c : text) {
    state = dfa.Next(state, static_cast<uint8_t>(c));
    if (state == RegexDfa::kDead) return false;
  }
  return dfa.Accepting(state);
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

class Prover {
 public:
  Prover(const SchemaGraph& g, int* intersections) : g_(g), intersections_(intersections) {}

  // No value the machine writes for `a` is valid against `b` (-1: any value).
  bool Excludes(int32_t a, int32_t b, int depth) const;

 private:
  const JsonSchemaNode& N(int32_t id) const { return g_.nodes[static_cast<size_t>(id)]; }
  // `v` may be valid against `n` (machine: may be written by n's machine, which writes only
  // values of its kind, and of an object only its properties).
  bool Admits(const json& v, int32_t n, bool machine, int depth) const;
  bool AdmitsObject(const json& v, int32_t n, bool machine, int depth) const;
  bool AdmitsArray(const json& v, const JsonSchemaNode& node, bool machine, int depth) const;
  bool ObjectsExclude(int32_t a, int32_t b, int depth) const;
  bool ArraysExclude(const JsonSchemaNode& a, const JsonSchemaNode& b, int depth) const;
  bool DfasDisjoint(int32_t x, int32_t y) const {
    if (x < 0 || y < 0 || *intersections_ <= 0) return false;
    --*intersections_;
    auto both = RegexDfa::Intersect(*g_.dfas[static_cast<size_t>(x)],
                                    *g_.dfas[static_cast<size_t>(y)], "oneOf");
    return !both.ok() && both.message().find("no string matches") != std::string::npos;
  }

  const SchemaGraph& g_;
  int* intersections_;
};

bool Prover::Admits(const json& v, int32_t n, bool machine, int depth) const {
  if (n < 0 || depth > kMaxDepth) return true;
  if (!machine && g_.facts[static_cast<size_t>(n)].narrowed) return true;
  const JsonSchemaNode& node = N(n);
  switch (node.kind) {
    case JsonSchemaNode::kAny: return true;
    case JsonSchemaNode::kUnion:
      for (int32_t b : g_.branches[static_cast<size_t>(n)])
        if (Admits(v, b, machine, depth + 1)) return true;
      return false;
    case JsonSchemaNode::kLiterals:
      for (const std::string& l : node.literals)
        if (JsonEqual(json::parse(l), v)) return true;
      return false;
    default: break;
  }
  if (FamilyOf(node.kind) != FamilyOf(v))
    return !machine && !g_.facts[static_cast<size_t>(n)].typed;
  switch (node.kind) {
    case JsonSchemaNode::kString: {
      const std::string s = v.get<std::string>();
      const size_t length = CodePoints(s);
      if (length < static_cast<size_t>(node.min_length) ||
          length > static_cast<size_t>(node.max_length))
        return false;
      return node.dfa < 0 || DfaAccepts(*g_.dfas[static_cast<size_t>(node.dfa)], s);
    }
    case JsonSchemaNode::kInteger: {
      if (v.is_number_float()) return std::trunc(v.get<double>()) == v.get<double>();
      const std::string text = v.dump();  // canonical: the automaton is exact on it
      return text.size() > 18 || DfaAccepts(*g_.dfas[static_cast<size_t>(node.dfa)], text);
    }
    case JsonSchemaNode::kObject: return AdmitsObject(v, n, machine, depth);
    case JsonSchemaNode::kArray: return AdmitsArray(v, node, machine, depth);
    default: return true;  // numbers (bounds rounded inward: unsure), booleans, null
  }
}

bool Prover::AdmitsObject(const json& v, int32_t n, bool machine, int depth) const {
  const JsonSchemaNode& node = N(n);
  size_t listed = 0;
  for (const JsonSchemaNode::Property& p : node.properties) {
    const std::string key = json::parse(p.key).get<std::string>();
    const auto it = v.find(key);
    if (it == v.end()) {
      if (p.required) return false;
      continue;
    }
    ++listed;
    if (!Admits(*it, p.node, machine, depth + 1)) return false;
  }
  if (listed == v.size()) return true;
  // Other keys: the machine writes them only for an object without properties.
  if (machine ? !node.properties.empty() || !node.any_keys : g_.facts[static_cast<size_t>(n)].closed)
    return false;
  if (!node.properties.empty()) return true;
  for (const auto& [key, value] : v.items())
    if (!Admits(value, node.values, machine, depth + 1)) return false;
  return true;
}

bool Prover::AdmitsArray(const json& v, const JsonSchemaNode& node, bool machine,
                         int depth) const {
  // maxItems is kept at most 65535: above, the schema's own bound is unknown here.
  const bool bounded = machine || node.max_items < 65535;
  if (v.size() < static_cast<size_t>(node.min_items) ||
      (bounded && v.size() > static_cast<size_t>(node.max_items)))
    return false;
  for (size_t i = 0; i < v.size(); ++i) {
    const int32_t item = i < node.prefix_items.size() ? node.prefix_items[i] : node.items;
    if (!Admits(v[i], item, machine, depth + 1)) return false;
  }
  return true;
}

bool Prover::ObjectsExclude(int32_t a, int32_t b, int depth) const {
  const JsonSchemaNode& na = N(a);
  const JsonSchemaNode& nb = N(b);
  // Whether the machine of `a` may write `key`, and the node of its value.
  auto written = [&](const std::string& key, int32_t* value) {
    if (na.properties.empty()) {
      *value = na.values;
      return na.any_keys;
    }
    for (const JsonSchemaNode::Property& p : na.properties)
      if (p.key == key) return *value = p.node, true;
    return false;
  };
  for (const JsonSchemaNode::Property& q : nb.properties) {
    if (!q.required) continue;
    int32_t value = -1;
    if (!written(q.key, &value) || Excludes(value, q.node, depth + 1)) return true;
  }
  for (const JsonSchemaNode::Property& p : na.properties) {
    if (!p.required) continue;  // written always: b must allow it
    bool found = false;
    for (const JsonSchemaNode::Property& q : nb.properties) {
      if (q.key != p.key) continue;
      found = true;
      if (Excludes(p.node, q.node, depth + 1)) return true;
    }
    if (found) continue;
    if (g_.facts[static_cast<size_t>(b)].closed) return true;
    if (nb.properties.empty() && nb.values >= 0 && Excludes(p.node, nb.values, depth + 1))
      return true;
  }
  return false;
}

bool Prover::ArraysExclude(const JsonSchemaNode& a, const JsonSchemaNode& b, int depth) const {
  const int32_t b_max = b.max_items >= 65535 ? INT32_MAX : b.max_items;
  if (a.max_items < b.min_items || b_max < a.min_items) return true;
  if (a.min_items == 0) return false;
  const int32_t a0 = a.prefix_items.empty() ? a.items : a.prefix_items[0];
  const int32_t b0 = b.prefix_items.empty() ? b.items : b.prefix_items[0];
  return Excludes(a0, b0, depth + 1);
}

bool Prover::Excludes(int32_t a, int32_t b, int depth) const {
  if (a < 0 || b < 0 || depth > kMaxDepth || g_.facts[static_cast<size_t>(b)].narrowed) return false;
  const JsonSchemaNode& na = N(a);
  const JsonSchemaNode& nb = N(b);
  if (na.kind == JsonSchemaNode::kUnion || nb.kind == JsonSchemaNode::kUnion) {
    const bool split_a = na.kind == JsonSchemaNode::kUnion;
    for (int32_t branch : g_.branches[static_cast<size_t>(split_a ? a : b)])
      if (!Excludes(split_a ? branch : a, split_a ? b : branch, depth + 1)) return false;
    return true;
  }
  if (na.kind == JsonSchemaNode::kAny || nb.kind == JsonSchemaNode::kAny) return false;
  if (na.kind == JsonSchemaNode::kLiterals || nb.kind == JsonSchemaNode::kLiterals) {
    const bool list_a = na.kind == JsonSchemaNode::kLiterals;
    for (const std::string& l : (list_a ? na : nb).literals)
      if (Admits(json::parse(l), list_a ? b : a, !list_a, depth + 1)) return false;
    return true;
  }
  if (FamilyOf(na.kind) != FamilyOf(nb.kind)) return g_.facts[static_cast<size_t>(b)].typed;
  switch (na.kind) {
    case JsonSchemaNode::kObject: return ObjectsExclude(a, b, depth);
    case JsonSchemaNode::kArray: return ArraysExclude(na, nb, depth);
    case JsonSchemaNode::kString:
      return na.max_length < nb.min_length || nb.max_length < na.min_length ||
             DfasDisjoint(na.dfa, nb.dfa);
    case JsonSchemaNode::kInteger:  // integer automata are exact on canonical integers
      return nb.kind == JsonSchemaNode::kInteger && DfasDisjoint(na.dfa, nb.dfa);
    default: return false;
  }
}

}  // namespace

bool MachineExcludes(const SchemaGraph& g, int32_t a, int32_t b, int* intersections) {
  return Prover(g, intersections).Excludes(a, b, 0);
}

}  // namespace ember
