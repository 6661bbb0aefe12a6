#include "sampling/schema_object_rewrite.h"

#include <algorithm>

#include "sampling/regex_dfa.h"
#include "sampling/schema_regexes.h"

namespace ember {

namespace {

using json = nlohmann::ordered_json;

constexpr size_t kMaxSplit = 8;  // anyOf branches a rewrite may add (JsonSchemaMachine::kMaxPaths)

Status Refuse(const std::string& path, const std::string& what) {
  return Status::Error(path + ": " + what);
}

bool Listed(const json& s) {
  return s.contains("properties") && s["properties"].is_object() && !s["properties"].empty();
}

json Required(const json& s) {
  return s.contains("required") && s["required"].is_array() ? s["required"] : json::array();
}

bool Has(const json& list, const std::string& name) {
  return std::find(list.begin(), list.end(), json(name)) != list.end();
}

void Require(json& s, const std::string& name) {
  if (!s.contains("required")) s["required"] = json::array();
  if (!Has(s["required"], name)) s["required"].push_back(name);
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

// Whether the property name `name` is valid against the propertyNames schema `names`.
Result<bool> NameAllowed(const json& names, const std::string& name, const std::string& path) {
  for (const auto& [key, value] : names.items()) {
    if (key == "title" || key == "description" || key == "$comment") continue;
    if (key == "type") {
      if (value != json("string")) return false;  // names are strings
    } else if (key == "enum" || key == "const") {
      const json list = key == "const" ? json::array({value}) : value;
      if (!list.is_array()) return Refuse(path + "." + key, "must be an array");
      if (std::find(list.begin(), list.end(), json(name)) == list.end()) return false;
    } else if (key == "minLength" || key == "maxLength") {
      if (!value.is_number_unsigned()) return Refuse(path + "." + key, "must be a non-negative integer");
      const uint64_t n = CodePoints(name), bound = value.get<uint64_t>();
      if (key == "minLength" ? n < bound : n > bound) return false;
    } else if (key == "pattern" || key == "format") {
      if (!value.is_string()) return Refuse(path + "." + key, "must be a string");
      std::string regex = value.get<std::string>();
      if (key == "format") {
        const std::optional<std::string> f = FormatRegex(regex);
        if (!f) return Refuse(path + ".format", "the format '" + regex + "' is not supported");
        regex = *f;
      }
      auto dfa = CompileRegex(regex, key == "pattern" ? RegexMatch::kSearch : RegexMatch::kWhole,
                              path + "." + key);
      if (!dfa.ok() && dfa.message().find("no string matches") != std::string::npos) return false;
      if (!dfa.ok()) return dfa.status();
      if (!(*dfa)->Matches(name)) return false;
    } else {
      return Refuse(path + "." + key, "propertyNames supports type string, enum/const, pattern, "
                                      "format, minLength and maxLength");
    }
  }
  return true;
}

Status PropertyNames(json& s, const std::string& path) {
  const json names = s["propertyNames"];
  s.erase("propertyNames");
  if (names == json(true)) return Status::Ok();
  json& props = s["properties"];
  const json required = Required(s);
  for (auto it = props.begin(); it != props.end();) {
    bool allowed = false;
    if (names.is_object()) {
      EMBER_ASSIGN_OR_RETURN(allowed, NameAllowed(names, it.key(), path));
    } else if (!names.is_boolean()) {
      return Refuse(path, "must be a schema");
    }
    if (allowed) {
      ++it;
      continue;
    }
    if (Has(required, it.key()))
      return Refuse(path, "the required property '" + it.key() + "' fails it: no value");
    it = props.erase(it);
  }
  return Status::Ok();
}

Status PatternProperties(json& s, const std::string& path) {
  const json patterns = s["patternProperties"];
  s.erase("patternProperties");
  if (!patterns.is_object()) return Refuse(path, "must be an object");
  for (const auto& [pattern, sub] : patterns.items()) {
    EMBER_ASSIGN_OR_RETURN(auto dfa, CompileRegex(pattern, RegexMatch::kSearch, path + "." + pattern));
    for (auto& [name, schema] : s["properties"].items())
      if (dfa->Matches(name)) schema = json{{"allOf", json::array({schema, sub})}};
  }
  return Status::Ok();
}

// One dependentRequired entry at a time; an optional trigger splits the schema (the branches keep
// the other entries, rewritten when compiled).
Result<json> DependentRequired(json s, const std::string& path) {
  json deps = s["dependentRequired"];
  s.erase("dependentRequired");
  if (!deps.is_object()) return Refuse(path, "must be an object of name lists");
  const json& props = s["properties"];
  for (auto it = deps.begin(); it != deps.end(); it = deps.erase(it)) {
    const std::string trigger = it.key();
    if (!it.value().is_array()) return Refuse(path + "." + trigger, "must be an array of names");
    if (!props.contains(trigger)) continue;  // never written
    bool writable = true, all_required = true;
    for (const json& d : it.value()) {
      if (!d.is_string()) return Refuse(path + "." + trigger, "must be an array of names");
      writable = writable && props.contains(d.get<std::string>());
      all_required = all_required && Has(Required(s), d.get<std::string>());
    }
    const bool required = Has(Required(s), trigger);
    if (!writable) {  // a dependent is never written: nor is the trigger
      if (required) return Refuse(path + "." + trigger, "a dependent is not a property: no value");
      s["properties"].erase(trigger);
      continue;
    }
    if (all_required) continue;
    json with = s;
    for (const json& d : it.value()) Require(with, d.get<std::string>());
    Require(with, trigger);
    if (required) {
      s = std::move(with);
      continue;
    }
    json without = s;
    without["properties"].erase(trigger);
    deps.erase(it);
    if (!deps.empty()) {
      with["dependentRequired"] = deps;
      without["dependentRequired"] = deps;
    }
    return json{{"anyOf", json::array({std::move(without), std::move(with)})}};
  }
  return s;
}

Result<json> PropertyCounts(json s, const std::string& path) {
  const size_t listed = s["properties"].size(), required = Required(s).size();
  if (s.contains("maxProperties")) {
    const json m = s["maxProperties"];
    s.erase("maxProperties");
    if (!m.is_number_unsigned()) return Refuse(path + ".maxProperties", "must be a non-negative integer");
    if (m.get<uint64_t>() < required)
      return Refuse(path + ".maxProperties", "is below the number of required properties: no value");
    if (m.get<uint64_t>() < listed) {
      return Refuse(path + ".maxProperties", "is supported only where it allows every property "
                                             "(here " + std::to_string(listed) + ")");
    }
  }
  if (!s.contains("minProperties")) return s;
  const json m = s["minProperties"];
  s.erase("minProperties");
  if (!m.is_number_unsigned()) return Refuse(path + ".minProperties", "must be a non-negative integer");
  if (m.get<uint64_t>() <= required) return s;
  if (m.get<uint64_t>() > listed)
    return Refuse(path + ".minProperties", "exceeds the number of properties: no value");
  if (m.get<uint64_t>() != 1 || listed > kMaxSplit) {
    return Refuse(path + ".minProperties", "is supported where the required properties reach it, "
                                           "and 1 on at most 8 optional properties");
  }
  // Branch i: the first property written is the i-th (the earlier ones absent), so the branches
  // exclude each other from the first key on and the machine follows one path after it.
  json branches = json::array();
  std::vector<std::string> names;
  for (const auto& [name, sub] : s["properties"].items()) names.push_back(name);
  for (size_t i = 0; i < names.size(); ++i) {
    json one = s;
    for (size_t j = 0; j < i; ++j) one["properties"].erase(names[j]);
    Require(one, names[i]);
    branches.push_back(std::move(one));
  }
  return json{{"anyOf", std::move(branches)}};
}

}  // namespace

bool HasObjectRewriteKeyword(const json& s) {
  for (const char* k : {"minProperties", "maxProperties", "dependentRequired", "propertyNames",
                        "patternProperties"})
    if (s.contains(k)) return true;
  return false;
}

Result<json> RewriteObjectKeywords(const json& s_in, const std::string& path) {
  json s = s_in;
  if (!Listed(s)) {
    if (s.contains("minProperties") && s["minProperties"] == json(0)) s.erase("minProperties");
    for (const char* k : {"dependentRequired", "patternProperties"})
      if (s.contains(k) && s[k].is_object() && s[k].empty()) s.erase(k);
    for (const auto& [key, value] : s.items()) {
      if (HasObjectRewriteKeyword(json{{key, value}})) {
        return Refuse(path + "." + key, "is supported only on an object schema with properties "
                                        "(structured output writes no others)");
      }
    }
    return s;
  }
  if (s.contains("propertyNames")) EMBER_RETURN_IF_ERROR(PropertyNames(s, path + ".propertyNames"));
  if (s.contains("patternProperties"))
    EMBER_RETURN_IF_ERROR(PatternProperties(s, path + ".patternProperties"));
  if (s.contains("dependentRequired")) {
    EMBER_ASSIGN_OR_RETURN(s, DependentRequired(std::move(s), path + ".dependentRequired"));
    if (s.contains("anyOf")) return s;  // the branches carry the count keywords
  }
  return PropertyCounts(std::move(s), path);
}

}  // namespace ember
