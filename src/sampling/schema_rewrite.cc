#include "sampling/schema_rewrite.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace ember {

namespace {

using json = nlohmann::ordered_json;

Status Refuse(const std::string& path, const std::string& what) {
  return Status::Error(path + ": " + what);
}

bool IsAnnotation(const std::string& key) {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples",
                                          "$schema",  "$id",         "$comment", "deprecated",
                                          "readOnly", "writeOnly",   "$defs",    "definitions"};
  return k.count(key) > 0;
}

// A branch of allOf as a plain schema object: $refs followed, nested allOf merged.
Result<json> Resolve(const json& branch, const json& root, const std::string& path, int depth) {
  json b = branch;
  for (int hops = 0; b.is_object() && b.contains("$ref"); ++hops) {
    if (hops > kMaxAllOfDepth) return Refuse(path, "$ref chains longer than 16 inside allOf");
    for (const auto& [key, value] : b.items()) {
      if (key != "$ref" && !IsAnnotation(key))
        return Refuse(path + "." + key, "keywords beside $ref inside allOf are not supported");
    }
    const json* target =
        b["$ref"].is_string() ? RefTarget(root, b["$ref"].get<std::string>()) : nullptr;
    if (target == nullptr) return Refuse(path + ".$ref", "not a local definition of this schema");
    b = *target;
  }
  if (b.is_boolean()) {
    if (!b.get<bool>()) return Refuse(path, "the schema false allows no value");
    return json::object();
  }
  if (!b.is_object()) return Refuse(path, "a schema must be an object or a boolean");
  if (b.contains("allOf")) return MergeAllOf(b, root, path, depth + 1);
  return b;
}

std::vector<std::string> TypeList(const json& t) {
  std::vector<std::string> out;
  for (const json& v : t.is_array() ? t : json::array({t}))
    if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

// "integer" is a "number": their intersection is "integer".
Result<json> MergeTypes(const json& a, const json& b, const std::string& path) {
  const std::vector<std::string> ta = TypeList(a), tb = TypeList(b);
  json out = json::array();
  for (const std::string& x : ta) {
    for (const std::string& y : tb) {
      std::string both = x == y ? x : "";
      if ((x == "number" && y == "integer") || (x == "integer" && y == "number")) both = "integer";
      if (!both.empty() && std::find(out.begin(), out.end(), json(both)) == out.end())
        out.push_back(both);
    }
  }
  if (out.empty()) return Refuse(path + ".type", "the branches' types have no value in common");
  return out.size() == 1 ? out[0] : out;
}

bool IsLowerBound(const std::string& k) {
  return k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems" ||
         k == "minProperties";
}
bool IsUpperBound(const std::string& k) {
  return k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems" ||
         k == "maxProperties";
}

// A branch with additionalProperties false admits only its own properties.
Status CheckClosed(const json& closed, const json& other, const std::string& path) {
  if (!closed.contains("additionalProperties") || closed["additionalProperties"] != json(false))
    return Status::Ok();
  const auto mine = closed.find("properties");
  const auto theirs = other.find("properties");
  if (theirs == other.end() || !theirs->is_object()) return Status::Ok();
  for (auto it = theirs->begin(); it != theirs->end(); ++it) {
    const std::string& name = it.key();
    if (mine == closed.end() || !mine->is_object() || !mine->contains(name))
      return Refuse(path + ".properties." + name,
                    "another allOf branch has additionalProperties false and no property '" + name +
                        "': intersecting them is not supported");
  }
  return Status::Ok();
}

// The values an enum / const allows (null when neither is there).
json Literals(const json& s) {
  if (s.contains("const")) return json::array({s["const"]});
  if (s.contains("enum") && s["enum"].is_array()) return s["enum"];
  return nullptr;
}

bool Contains(const json& list, const json& v) {
  for (const json& x : list)
    if (JsonEqual(x, v)) return true;
  return false;
}

// enum / const of both: the values in both, as an enum.
Status MergeLiterals(json& a, json& b, const std::string& path) {
  const json la = Literals(a), lb = Literals(b);
  if (la.is_null() || lb.is_null()) return Status::Ok();
  json both = json::array();
  for (const json& v : la)
    if (Contains(lb, v)) both.push_back(v);
  if (both.empty()) return Refuse(path + ".enum", "the branches' enum/const values have none in common");
  a.erase("const");
  a["enum"] = std::move(both);
  b.erase("const");
  b.erase("enum");
  return Status::Ok();
}

Status MergeInto(json& a, const json& b_in, const std::string& path) {
  EMBER_RETURN_IF_ERROR(CheckClosed(a, b_in, path));
  EMBER_RETURN_IF_ERROR(CheckClosed(b_in, a, path));
  json b = b_in;
  EMBER_RETURN_IF_ERROR(MergeLiterals(a, b, path));
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) {
      a[key] = value;
      continue;
    }
    json& mine = a[key];
    if (mine == value || IsAnnotation(key)) continue;
    if (key == "properties" && mine.is_object() && value.is_object()) {
      for (const auto& [name, sub] : value.items()) {
        if (!mine.contains(name)) {
          mine[name] = sub;
        } else if (mine[name] != sub) {
          mine[name] = json{{"allOf", json::array({mine[name], sub})}};
        }
      }
    } else if (key == "required" && mine.is_array() && value.is_array()) {
      for (const json& name : value)
        if (std::find(mine.begin(), mine.end(), name) == mine.end()) mine.push_back(name);
    } else if (key == "type") {
      EMBER_ASSIGN_OR_RETURN(mine, MergeTypes(mine, value, path));
    } else if ((IsLowerBound(key) || IsUpperBound(key)) && mine.is_number() && value.is_number()) {
      const bool take = IsLowerBound(key) ? value.get<double>() > mine.get<double>()
                                          : value.get<double>() < mine.get<double>();
      if (take) mine = value;
    } else if (key == "additionalProperties" && (mine == json(false) || value == json(false))) {
      mine = false;
    } else if (key == "items" || key == "additionalProperties") {
      mine = json{{"allOf", json::array({mine, value})}};
    } else if (key == "not") {  // neither: not (either)
      mine = json{{"anyOf", json::array({mine, value})}};
    } else {
      return Refuse(path + "." + key, "allOf branches with different '" + key +
                                          "' values cannot be intersected (not supported)");
    }
  }
  return Status::Ok();
}

// The types the machine may write for `s` (no enum/const): its type list, else the one its
// object / array keywords imply (json_schema.cc), else all.
std::vector<std::string> MachineTypes(const json& s) {
  if (s.contains("type")) return TypeList(s["type"]);
  for (const char* k : {"properties", "required", "additionalProperties", "minProperties",
                        "maxProperties", "dependentRequired", "propertyNames", "patternProperties"})
    if (s.contains(k)) return {"object"};
  for (const char* k : {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})
    if (s.contains(k)) return {"array"};
  return {"object", "array", "string", "number", "boolean", "null"};
}

bool HasAnyType(const json& v, const std::vector<std::string>& types) {
  for (const std::string& t : types)
    if (JsonHasType(v, t)) return true;
  return false;
}

json TypeJson(const std::vector<std::string>& types) {
  return types.size() == 1 ? json(types[0]) : json(types);
}

Result<json> NotType(json rest, const json& type, const std::string& where) {
  std::vector<std::string> excluded = TypeList(type);
  if (Contains(json(excluded), "number")) excluded.push_back("integer");
  auto out = [&](const std::string& t) { return Contains(json(excluded), t); };
  const json literals = Literals(rest);
  if (!literals.is_null()) {
    json kept = json::array();
    for (const json& v : literals)
      if (!HasAnyType(v, excluded)) kept.push_back(v);
    if (kept.empty()) return Refuse(where, "excludes every enum/const value: no value is left");
    rest.erase("const");
    rest["enum"] = std::move(kept);
    return rest;
  }
  std::vector<std::string> types;
  for (const std::string& t : MachineTypes(rest))
    if (!out(t)) types.push_back(t);
  if (out("integer") && Contains(json(types), "number"))
    return Refuse(where, "excluding integers from numbers is not supported");
  if (types.empty()) return Refuse(where, "excludes every type the schema allows: no value is left");
  rest["type"] = TypeJson(types);
  return rest;
}

Result<json> NotLiterals(json rest, const json& excluded_in, const std::string& where) {
  const json literals = Literals(rest);
  if (!literals.is_null()) {
    json kept = json::array();
    for (const json& v : literals)
      if (!Contains(excluded_in, v)) kept.push_back(v);
    if (kept.empty()) return Refuse(where, "excludes every enum/const value: no value is left");
    rest.erase("const");
    rest["enum"] = std::move(kept);
    return rest;
  }
  const std::vector<std::string> types = MachineTypes(rest);
  json excluded = json::array();  // values of other types change nothing
  for (const json& v : excluded_in)
    if (HasAnyType(v, types)) excluded.push_back(v);
  if (excluded.empty()) return rest;
  if (types == std::vector<std::string>{"boolean"}) {
    json kept = json::array();
    for (const bool b : {false, true})
      if (!Contains(excluded, b)) kept.push_back(b);
    if (kept.empty()) return Refuse(where, "excludes both booleans: no value is left");
    rest["enum"] = std::move(kept);
    return rest;
  }
  if (types == std::vector<std::string>{"null"}) return Refuse(where, "excludes null: no value is left");
  if (types == std::vector<std::string>{"string"}) {
    rest["not"] = json{{"enum", excluded}};  // the string's automaton excludes them
    return rest;
  }
  return Refuse(where, "not of const/enum is supported beside enum/const and on a string, "
                       "boolean or null schema; here the values may be of types " +
                           TypeJson(types).dump());
}

// not {properties, required} on an object schema with properties (the machine writes no others):
// the object lacks one required key, or has one of the properties with a value the subschema
// rejects (each such object a branch of an anyOf).
Result<json> NotObject(const json& rest, const json& n, const std::string& where) {
  if (MachineTypes(rest) != std::vector<std::string>{"object"} || !rest.contains("properties") ||
      !rest["properties"].is_object() || rest["properties"].empty()) {
    return Refuse(where, "not of required/properties is supported only on an object schema with "
                         "properties (type object)");
  }
  const json& props = rest["properties"];
  const json required = rest.contains("required") ? rest["required"] : json::array();
  json disjuncts = json::array();
  if (n.contains("required")) {
    std::vector<std::string> before;  // the earlier keys with a branch: present in the later ones
    for (const json& name : n["required"]) {
      if (!name.is_string()) return Refuse(where + ".required", "must be an array of names");
      if (!props.contains(name.get<std::string>())) return rest;  // never written: never all there
      if (Contains(required, name)) continue;
      json d = rest;  // the first missing key is this one (the branches exclude each other)
      d["properties"].erase(name.get<std::string>());
      for (const std::string& b : before) {
        if (!d.contains("required")) d["required"] = json::array();
        d["required"].push_back(b);
      }
      before.push_back(name.get<std::string>());
      disjuncts.push_back(std::move(d));
    }
  }
  if (n.contains("properties")) {
    if (!n["properties"].is_object()) return Refuse(where + ".properties", "must be an object");
    for (const auto& [name, sub] : n["properties"].items()) {
      if (!props.contains(name)) continue;  // never written: its subschema always holds
      json d = rest;
      d["properties"][name] = json{{"allOf", json::array({props[name], json{{"not", sub}}})}};
      if (!Contains(required, name)) {
        if (!d.contains("required")) d["required"] = json::array();
        d["required"].push_back(name);
      }
      disjuncts.push_back(std::move(d));
    }
  }
  if (disjuncts.empty()) return Refuse(where, "every object of the schema matches it: no value is left");
  if (disjuncts.size() == 1) return disjuncts[0];
  return json{{"anyOf", disjuncts}};
}

// Which form of `not` the subschema `n` (resolved, without annotations) is.
bool OnlyKeys(const json& n, std::initializer_list<const char*> allowed) {
  for (const auto& [key, value] : n.items()) {
    bool ok = false;
    for (const char* a : allowed) ok |= key == a;
    if (!ok) return false;
  }
  return true;
}

}  // namespace

bool JsonEqual(const json& a, const json& b) {
  if (!a.is_structured() && !b.is_structured()) return a == b;
  return nlohmann::json::parse(a.dump()) == nlohmann::json::parse(b.dump());
}

bool JsonHasType(const json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  return type == "array" && v.is_array();
}

Result<json> WithoutIf(const json& s, const json& root, const std::string& path) {
  json rest = s;
  for (const char* k : {"if", "then", "else"}) rest.erase(k);
  if (!s.contains("if")) return rest;  // then / else without if have no effect
  const json& cond = s["if"];
  const json then = s.contains("then") ? s["then"] : json(true);
  const json otherwise = s.contains("else") ? s["else"] : json(true);
  if (cond.is_boolean()) return json{{"allOf", json::array({rest, cond.get<bool>() ? then : otherwise})}};
  json negated = rest;  // the else branch needs not(if) beside the schema: refused here, named
  negated["not"] = cond;
  if (auto st = WithoutNot(negated, root, path); !st.ok()) {
    const std::string why = st.message().substr(st.message().find(": ") + 2);
    return Refuse(path + ".if", "the else branch needs the negation of if, which is not supported (" +
                                    why + ")");
  }
  return json{{"anyOf", json::array({json{{"allOf", json::array({rest, cond, then})}},
                                     json{{"allOf", json::array({rest, json{{"not", cond}}, otherwise})}}})}};
}

Result<json> WithoutNot(const json& s, const json& root, const std::string& path) {
  const std::string where = path + ".not";
  json rest = s;
  rest.erase("not");
  const json& raw = s["not"];
  if (raw.is_boolean()) {
    if (raw.get<bool>()) return Refuse(where, "not true allows no value");
    return rest;
  }
  for (const char* u : {"anyOf", "oneOf"}) {  // (A or B) and not N: (A and not N) or (B and not N)
    if (!rest.contains(u) || !rest[u].is_array()) continue;
    for (json& branch : rest[u]) branch = json{{"allOf", json::array({branch, json{{"not", raw}}})}};
    return rest;
  }
  EMBER_ASSIGN_OR_RETURN(json n, Resolve(raw, root, where, 0));
  for (auto it = n.begin(); it != n.end();) it = IsAnnotation(it.key()) ? n.erase(it) : std::next(it);
  if (n.empty()) return Refuse(where, "not {} allows no value");
  if (OnlyKeys(n, {"type"})) return NotType(std::move(rest), n["type"], where);
  if (rest.contains("type") && rest["type"].is_array() && rest["type"].size() > 1 &&
      Literals(rest).is_null()) {  // each type on its own (a type list's branches are so read)
    json branches = json::array();
    for (const json& t : rest["type"]) {
      json one = s;
      one["type"] = t;
      branches.push_back(std::move(one));
    }
    return json{{"anyOf", std::move(branches)}};
  }
  if (n.size() == 1 && (n.contains("const") || n.contains("enum")))
    return NotLiterals(std::move(rest), Literals(n), where);
  if (OnlyKeys(n, {"properties", "required", "type"}) && (!n.contains("type") || n["type"] == "object"))
    return NotObject(rest, n, where);
  if (OnlyKeys(n, {"anyOf"}) && n["anyOf"].is_array()) {  // neither of them: one after the other
    for (const json& branch : n["anyOf"]) {
      if (rest.contains("not")) {  // excluded strings so far: add this branch's
        const json more = Literals(branch);
        if (more.is_null()) return Refuse(where, "not of anyOf mixing const/enum with other forms is not supported");
        for (const json& v : more) rest["not"]["enum"].push_back(v);
        continue;
      }
      rest["not"] = branch;
      EMBER_ASSIGN_OR_RETURN(rest, WithoutNot(rest, root, path));
    }
    return rest;
  }
  return Refuse(where, "supported: not of type, of const/enum, of required/properties on an object "
                       "schema with properties, and anyOf of those");
}

const json* RefTarget(const json& root, const std::string& ref) {
  if (ref == "#") return &root;
  for (const std::string prefix : {"#/$defs/", "#/definitions/"}) {
    if (!ref.starts_with(prefix)) continue;
    const std::string name = ref.substr(prefix.size());
    const std::string section = prefix.substr(2, prefix.size() - 3);
    const auto it = root.find(section);
    if (it == root.end() || !it->is_object()) return nullptr;
    const auto def = it->find(name);
    return def == it->end() ? nullptr : &*def;
  }
  return nullptr;
}

Result<json> MergeAllOf(const json& s, const json& root, const std::string& path, int depth) {
  if (depth > kMaxAllOfDepth) return Refuse(path + ".allOf", "allOf nests deeper than 16");
  const json& list = s["allOf"];
  if (!list.is_array() || list.empty()) return Refuse(path + ".allOf", "must be a non-empty array");
  json merged = s;
  merged.erase("allOf");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string branch_path = path + ".allOf[" + std::to_string(i) + "]";
    EMBER_ASSIGN_OR_RETURN(json branch, Resolve(list[i], root, branch_path, depth));
    EMBER_RETURN_IF_ERROR(MergeInto(merged, branch, branch_path));
  }
  return merged;
}

json WithoutNullable(const json& s) {
  json out = s;
  out.erase("nullable");
  if (s["nullable"] != json(true)) return out;
  if (out.contains("enum") && out["enum"].is_array()) {
    if (std::find(out["enum"].begin(), out["enum"].end(), json(nullptr)) == out["enum"].end())
      out["enum"].push_back(nullptr);
  } else if (out.contains("const")) {
    out["enum"] = json::array({out["const"], nullptr});
    out.erase("const");
  } else if (out.contains("type") && (out["type"].is_string() || out["type"].is_array())) {
    json types = out["type"].is_array() ? out["type"] : json::array({out["type"]});
    if (std::find(types.begin(), types.end(), json("null")) == types.end()) types.push_back("null");
    out["type"] = types;
  } else {
    return json{{"anyOf", json::array({out, json{{"type", "null"}}})}};
  }
  return out;
}

}  // namespace ember
