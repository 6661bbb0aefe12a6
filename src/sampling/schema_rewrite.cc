#include "sampling/schema_rewrite.h"

#include <algorithm>
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
  return k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems";
}
bool IsUpperBound(const std::string& k) {
  return k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems";
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

Status MergeInto(json& a, const json& b, const std::string& path) {
  EMBER_RETURN_IF_ERROR(CheckClosed(a, b, path));
  EMBER_RETURN_IF_ERROR(CheckClosed(b, a, path));
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
    } else {
      return Refuse(path + "." + key, "allOf branches with different '" + key +
                                          "' values cannot be intersected (not supported)");
    }
  }
  return Status::Ok();
}

}  // namespace

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
