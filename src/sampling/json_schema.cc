#include "sampling/json_schema.h"

#include <algorithm>
#include <bitset>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "util/check.h"

namespace ember {

namespace {

using json = nlohmann::ordered_json;
using FirstBytes = std::bitset<256>;

bool IsWhitespace(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool IsDigit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool IsNumberByte(uint8_t c) {
  return IsDigit(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
}

// The bytes a value of a scalar or container kind may start with (not kLiterals / kUnion, whose
// first bytes are their literals' and branches').
std::string_view KindStarts(JsonSchemaNode::Kind kind) {
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

// Keywords that only describe a value: accepted and ignored.
const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {
      "title",    "description", "default",  "examples",  "format", "$schema",    "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",  "definitions"};
  return k;
}
const std::set<std::string>& Understood() {
  static const std::set<std::string> k = {
      "type",  "enum",     "const",    "properties", "required",  "additionalProperties",
      "items", "minItems", "maxItems", "minLength",  "maxLength", "anyOf",
      "oneOf", "$ref"};
  return k;
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}

  Result<int32_t> Node(const json& s, const std::string& path);
  Status FinishUnions();
  std::vector<JsonSchemaNode> TakeNodes() { return std::move(nodes_); }

 private:
  int32_t Allocate() {
    nodes_.emplace_back();
    branches_.emplace_back();
    paths_.emplace_back();
    return static_cast<int32_t>(nodes_.size() - 1);
  }
  Result<int32_t> Ref(const std::string& ref, const std::string& path);
  Status Fill(int32_t id, const json& s, const std::string& path);
  Status FillObject(JsonSchemaNode& node, const json& s, const std::string& path);
  Status FillArray(JsonSchemaNode& node, const json& s, const std::string& path);
  FirstBytes StartsOf(int32_t id, std::vector<uint8_t>& visiting) const;

  const json& root_;
  std::vector<JsonSchemaNode> nodes_;
  std::vector<std::vector<int32_t>> branches_;  // kUnion: the branch nodes, resolved at the end
  std::vector<std::string> paths_;              // kUnion: where, for errors
  std::map<std::string, int32_t> refs_;
};

Status Unsupported(const std::string& path, const std::string& what) {
  return Status::Error(path + ": " + what);
}

Result<int32_t> Compiler::Ref(const std::string& ref, const std::string& path) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  const json* target = nullptr;
  if (ref == "#") {
    target = &root_;
  } else {
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p(prefix);
      if (!ref.starts_with(p)) continue;
      const std::string name = ref.substr(p.size());
      const std::string section = p.substr(2, p.size() - 3);
      if (root_.contains(section) && root_[section].is_object() && root_[section].contains(name))
        target = &root_[section][name];
    }
  }
  if (target == nullptr)
    return Unsupported(path + ".$ref", "'" + ref +
                                           "' is not a definition of this schema (only "
                                           "local #/$defs/NAME, #/definitions/NAME and # are)");
  // Allocated before it is filled, so that a recursive reference finds it.
  const int32_t id = Allocate();
  refs_[ref] = id;
  EMBER_RETURN_IF_ERROR(Fill(id, *target, ref));
  return id;
}

Result<int32_t> Compiler::Node(const json& s, const std::string& path) {
  if (s.is_object() && s.contains("$ref")) {
    for (const auto& [key, value] : s.items()) {
      if (key != "$ref" && Annotations().count(key) == 0)
        return Unsupported(path + "." + key, "keywords beside $ref are not supported");
    }
    if (!s["$ref"].is_string()) return Unsupported(path + ".$ref", "must be a string");
    return Ref(s["$ref"].get<std::string>(), path);
  }
  const int32_t id = Allocate();
  EMBER_RETURN_IF_ERROR(Fill(id, s, path));
  return id;
}

Status Compiler::FillObject(JsonSchemaNode& node, const json& s, const std::string& path) {
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
    } else if (node.properties.empty()) {
      EMBER_ASSIGN_OR_RETURN(node.values, Node(*it, path + ".additionalProperties"));
    }
    // With properties, only they are generated: any additionalProperties allows that.
  }
  return Status::Ok();
}

Status Compiler::FillArray(JsonSchemaNode& node, const json& s, const std::string& path) {
  node.kind = JsonSchemaNode::kArray;
  if (const auto it = s.find("items"); it != s.end()) {
    if (it->is_array())
      return Unsupported(path + ".items", "a list of item schemas (a tuple) is not supported");
    EMBER_ASSIGN_OR_RETURN(node.items, Node(*it, path + ".items"));
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
  if (node.min_items > node.max_items)
    return Unsupported(path + ".minItems", "exceeds maxItems: no array fits");
  return Status::Ok();
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
  if (s.contains("$ref"))
    return Unsupported(path + ".$ref", "keywords beside $ref are not supported");
  if (s.contains("enum") || s.contains("const")) {
    node.kind = JsonSchemaNode::kLiterals;
    if (s.contains("const")) {
      node.literals.push_back(s["const"].dump());
    } else {
      if (!s["enum"].is_array() || s["enum"].empty())
        return Unsupported(path + ".enum", "must be a non-empty array");
      for (const json& v : s["enum"]) node.literals.push_back(v.dump());
    }
    std::sort(node.literals.begin(), node.literals.end());
    node.literals.erase(std::unique(node.literals.begin(), node.literals.end()),
                        node.literals.end());
    nodes_[static_cast<size_t>(id)] = std::move(node);
    return Status::Ok();
  }
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
    return Status::Ok();
  }
  const bool object_keys =
      s.contains("properties") || s.contains("required") || s.contains("additionalProperties");
  const bool array_keys = s.contains("items") || s.contains("minItems") || s.contains("maxItems");
  // Without a type, object or array keywords say which.
  std::string type = object_keys ? "object" : array_keys ? "array" : "";
  if (const auto it = s.find("type"); it != s.end()) {
    if (!it->is_string())
      return Unsupported(path + ".type", "must be a string or an array of strings");
    type = it->get<std::string>();
  }
  if ((object_keys && type != "object") || (array_keys && type != "array"))
    return Unsupported(path + ".type", "'" + type + "' does not go with object or array keywords");
  if (type == "object") {
    EMBER_RETURN_IF_ERROR(FillObject(node, s, path));
  } else if (type == "array") {
    EMBER_RETURN_IF_ERROR(FillArray(node, s, path));
  } else if (type == "string") {
    node.kind = JsonSchemaNode::kString;
    for (const char* key : {"minLength", "maxLength"}) {
      const auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_number_unsigned() || it->get<uint64_t>() > INT32_MAX)
        return Unsupported(path + "." + key, "must be a non-negative integer");
      (key[1] == 'i' ? node.min_length : node.max_length) = it->get<int32_t>();
    }
    if (node.min_length > node.max_length)
      return Unsupported(path + ".minLength", "exceeds maxLength: no string fits");
  } else if (type == "number") {
    node.kind = JsonSchemaNode::kNumber;
  } else if (type == "integer") {
    node.kind = JsonSchemaNode::kInteger;
  } else if (type == "boolean") {
    node.kind = JsonSchemaNode::kBoolean;
  } else if (type == "null") {
    node.kind = JsonSchemaNode::kNull;
  } else if (!type.empty()) {
    return Unsupported(path + ".type", "unknown type '" + type + "'");
  }
  nodes_[static_cast<size_t>(id)] = std::move(node);
  return Status::Ok();
}

FirstBytes Compiler::StartsOf(int32_t id, std::vector<uint8_t>& visiting) const {
  FirstBytes out;
  const JsonSchemaNode& n = nodes_[static_cast<size_t>(id)];
  if (n.kind == JsonSchemaNode::kLiterals) {
    for (const std::string& l : n.literals) out.set(static_cast<uint8_t>(l[0]));
  } else if (n.kind == JsonSchemaNode::kUnion) {
    if (visiting[static_cast<size_t>(id)]) return out;  // a union that reaches itself adds nothing
    visiting[static_cast<size_t>(id)] = 1;
    for (int32_t b : branches_[static_cast<size_t>(id)]) out |= StartsOf(b, visiting);
    visiting[static_cast<size_t>(id)] = 0;
  } else {
    for (char c : KindStarts(n.kind)) out.set(static_cast<uint8_t>(c));
  }
  return out;
}

Status Compiler::FinishUnions() {
  std::vector<uint8_t> visiting(nodes_.size(), 0);
  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (nodes_[id].kind != JsonSchemaNode::kUnion) continue;
    nodes_[id].branch_by_first_byte.fill(-1);
    for (int32_t b : branches_[id]) {
      const FirstBytes starts = StartsOf(b, visiting);
      for (int c = 0; c < 256; ++c) {
        if (!starts.test(static_cast<size_t>(c))) continue;
        int32_t& slot = nodes_[id].branch_by_first_byte[static_cast<size_t>(c)];
        if (slot != -1 && slot != b)
          return Unsupported(paths_[id], "branches that can start with the same byte ('" +
                                             std::string(1, static_cast<char>(c)) +
                                             "') are not supported (branches must differ in type)");
        slot = b;
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<const CompiledJsonSchema>> CompileJsonSchema(const json& schema,
                                                                    const std::string& path) {
  Compiler compiler(schema);
  EMBER_ASSIGN_OR_RETURN(int32_t root, compiler.Node(schema, path));
  EMBER_RETURN_IF_ERROR(compiler.FinishUnions());
  auto out = std::make_shared<CompiledJsonSchema>();
  out->nodes = compiler.TakeNodes();
  if (out->nodes.size() > 65535) return Unsupported(path, "the schema is too large");
  if (out->nodes[static_cast<size_t>(root)].kind != JsonSchemaNode::kObject)
    return Unsupported(path, "the root schema must be an object (\"type\": \"object\")");
  out->root = root;
  return std::shared_ptr<const CompiledJsonSchema>(std::move(out));
}

JsonSchemaMachine::JsonSchemaMachine(const CompiledJsonSchema* schema) : schema_(schema) {}

uint64_t JsonSchemaMachine::KeyCandidates(const Frame& f) const {
  const auto& props = schema_->nodes[f.node].properties;
  uint64_t mask = 0;
  for (size_t j = f.index; j < props.size(); ++j) {
    mask |= uint64_t{1} << j;
    if (props[j].required) break;  // properties come in order: a required one cannot be skipped
  }
  return mask;
}

bool JsonSchemaMachine::CanClose(const Frame& f) const {
  const auto& props = schema_->nodes[f.node].properties;
  for (size_t j = f.index; j < props.size(); ++j)
    if (props[j].required) return false;
  return true;
}

void JsonSchemaMachine::ValueDone() {
  if (depth_ == 0) {
    done_ = true;
    return;
  }
  Frame& f = frames_[depth_ - 1];
  if (f.phase == kMemberValue) {
    f.phase = kAfterMember;
  } else {
    ++f.index;
    f.phase = kAfterItem;
  }
}

bool JsonSchemaMachine::StartValue(int32_t node_id, uint8_t c) {
  auto scan = [this](bool integer, uint8_t first) {
    scanner_ = JsonScanner::AnyValue();
    integer_ = integer;
    bounded_ = false;
    leaf_ = kLeafScanner;
    return scanner_.Step(first);
  };
  if (node_id < 0) return scan(false, c);
  const JsonSchemaNode& n = schema_->nodes[static_cast<size_t>(node_id)];
  const bool starts = KindStarts(n.kind).find(static_cast<char>(c)) != std::string_view::npos;
  switch (n.kind) {
    case JsonSchemaNode::kAny:
      return scan(false, c);
    case JsonSchemaNode::kObject:
    case JsonSchemaNode::kArray: {
      if (!starts || depth_ >= kMaxFrames) return false;
      frames_[depth_++] = Frame{static_cast<uint16_t>(node_id),
                                n.kind == JsonSchemaNode::kObject ? kObjectOpen : kArrayOpen, 0,
                                0, 0};
      return true;
    }
    case JsonSchemaNode::kString:
      if (!starts || !scan(false, c)) return false;
      bounded_ = n.min_length > 0 || n.max_length < INT32_MAX;
      leaf_node_ = static_cast<uint16_t>(node_id);
      chars_ = 0;
      return true;
    case JsonSchemaNode::kNumber:
    case JsonSchemaNode::kBoolean:
    case JsonSchemaNode::kNull:
      return starts && scan(false, c);
    case JsonSchemaNode::kInteger:
      return starts && scan(true, c);
    case JsonSchemaNode::kLiterals:
      leaf_ = kLeafLiteral;
      lit_node_ = static_cast<uint16_t>(node_id);
      lit_lo_ = 0;
      lit_hi_ = static_cast<uint16_t>(n.literals.size());
      lit_pos_ = 0;
      return StepLiteral(c) == kLiteralTook;
    case JsonSchemaNode::kUnion: {
      const int32_t branch = n.branch_by_first_byte[c];
      return branch >= 0 && StartValue(branch, c);
    }
  }
  return false;
}

JsonSchemaMachine::LiteralStep JsonSchemaMachine::StepLiteral(uint8_t c) {
  const std::vector<std::string>& lits = schema_->nodes[lit_node_].literals;
  // [lit_lo_, lit_hi_) share their first lit_pos_ bytes; one of exactly that length sorts first.
  const bool first_complete = lits[lit_lo_].size() == lit_pos_;
  const auto begin = lits.begin() + lit_lo_ + (first_complete ? 1 : 0),
             end = lits.begin() + lit_hi_;
  const size_t pos = lit_pos_;
  const auto lo = std::partition_point(
      begin, end, [&](const std::string& l) { return static_cast<uint8_t>(l[pos]) < c; });
  const auto hi = std::partition_point(
      lo, end, [&](const std::string& l) { return static_cast<uint8_t>(l[pos]) == c; });
  if (lo == hi) {
    if (!first_complete) return kLiteralRefused;
    leaf_ = kLeafNone;  // a number literal ended; c belongs to what follows
    ValueDone();
    return kLiteralEnded;
  }
  lit_lo_ = static_cast<uint16_t>(lo - lits.begin());
  lit_hi_ = static_cast<uint16_t>(hi - lits.begin());
  ++lit_pos_;
  if (lit_hi_ - lit_lo_ == 1 && lits[lit_lo_].size() == lit_pos_) {
    leaf_ = kLeafNone;  // nothing can follow within the literal
    ValueDone();
  }
  return kLiteralTook;
}

bool JsonSchemaMachine::StepKey(uint8_t c) {
  Frame& f = frames_[depth_ - 1];
  const auto& props = schema_->nodes[f.node].properties;
  uint64_t mask = 0;
  int32_t complete = -1;
  for (uint64_t m = key_mask_; m != 0; m &= m - 1) {
    const int j = __builtin_ctzll(m);
    const std::string& key = props[static_cast<size_t>(j)].key;
    if (key.size() > lit_pos_ && static_cast<uint8_t>(key[lit_pos_]) == c) {
      mask |= uint64_t{1} << j;
      if (key.size() == lit_pos_ + 1u) complete = j;
    }
  }
  if (mask == 0) return false;
  key_mask_ = mask;
  ++lit_pos_;
  if (complete >= 0) {  // a key ends with its quote, so no other key continues it
    leaf_ = kLeafNone;
    f.index = static_cast<uint16_t>(complete + 1);
    f.value = static_cast<uint16_t>(props[static_cast<size_t>(complete)].node + 1);
    f.phase = kColon;
  }
  return true;
}

bool JsonSchemaMachine::StepStructure(uint8_t c) {
  if (depth_ == 0) return StartValue(schema_->root, c);  // the output starts with the value itself
  Frame& f = frames_[depth_ - 1];
  if (IsWhitespace(c)) return ++ws_run_ <= JsonScanner::kMaxWhitespaceRun;
  ws_run_ = 0;
  const JsonSchemaNode& n = schema_->nodes[f.node];
  auto close = [this]() {
    --depth_;
    ValueDone();
    return true;
  };
  auto start_key = [&]() {
    if (n.properties.empty()) {
      if (!n.any_keys) return false;
      f.phase = kColon;  // after the key's string, which the scanner reads
      f.value = static_cast<uint16_t>(n.values + 1);
      scanner_ = JsonScanner::AnyValue();
      integer_ = false;
      bounded_ = false;
      leaf_ = kLeafScanner;
      return scanner_.Step(c);
    }
    key_mask_ = KeyCandidates(f);
    if (key_mask_ == 0) return false;
    leaf_ = kLeafKey;
    lit_pos_ = 0;
    return StepKey(c);
  };
  switch (f.phase) {
    case kObjectOpen:
      if (c == '}') return CanClose(f) && close();
      [[fallthrough]];
    case kObjectKey:
      return c == '"' && start_key();
    case kColon:
      if (c != ':') return false;
      f.phase = kMemberValue;
      return true;
    case kMemberValue:
      return StartValue(static_cast<int32_t>(f.value) - 1, c);
    case kAfterMember:
      if (c == '}') return CanClose(f) && close();
      if (c != ',') return false;
      if (!n.properties.empty() && KeyCandidates(f) == 0) return false;
      if (n.properties.empty() && !n.any_keys) return false;
      f.phase = kObjectKey;
      return true;
    case kArrayOpen:
      if (c == ']') return n.min_items == 0 && close();
      [[fallthrough]];
    case kArrayItem:
      return f.index < n.max_items && StartValue(n.items, c);
    case kAfterItem:
      if (c == ']') return f.index >= n.min_items && close();
      if (c != ',' || f.index >= n.max_items) return false;
      f.phase = kArrayItem;
      return true;
  }
  return false;
}

void JsonSchemaMachine::AppendKey(std::string* key) const {
  auto put = [key](auto v) { key->append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(depth_);
  for (int d = 0; d < depth_; ++d) {
    const Frame& f = frames_[d];
    put(f.node);
    put(static_cast<uint8_t>(f.phase));
    put(f.index);
    put(f.value);
  }
  put(static_cast<uint8_t>(leaf_));
  put(static_cast<uint8_t>(done_));
  put(ws_run_);
  switch (leaf_) {
    case kLeafScanner:
      put(static_cast<uint8_t>(integer_));
      put(static_cast<uint8_t>(bounded_));
      if (bounded_) {
        put(leaf_node_);
        put(chars_);
      }
      scanner_.AppendKey(key);
      break;
    case kLeafLiteral:
      put(lit_node_);
      put(lit_lo_);
      put(lit_hi_);
      put(lit_pos_);
      break;
    case kLeafKey:
      put(key_mask_);
      put(lit_pos_);
      break;
    case kLeafNone:
      break;
  }
}

bool JsonSchemaMachine::Step(uint8_t c) {
  if (done_) return false;
  switch (leaf_) {
    case kLeafScanner:
      if (scanner_.NumberComplete() && !IsNumberByte(c)) {
        leaf_ = kLeafNone;  // the number ended; c belongs to what follows
        ValueDone();
        break;
      }
      if (integer_ && (c == '.' || c == 'e' || c == 'E')) return false;
      if (bounded_ && scanner_.InPlainString()) {  // c closes the string or starts a character
        const JsonSchemaNode& n = schema_->nodes[leaf_node_];
        if (c == '"' ? chars_ < static_cast<uint32_t>(n.min_length)
                     : ++chars_ > static_cast<uint32_t>(n.max_length))
          return false;
      }
      if (!scanner_.Step(c)) return false;
      if (scanner_.Done()) {
        leaf_ = kLeafNone;
        // A map key's string ends in the kColon phase; any other scanned string is a value.
        if (depth_ == 0 || frames_[depth_ - 1].phase != kColon) ValueDone();
      }
      return true;
    case kLeafLiteral:
      switch (StepLiteral(c)) {
        case kLiteralTook:
          return true;
        case kLiteralRefused:
          return false;
        case kLiteralEnded:
          break;
      }
      break;
    case kLeafKey:
      return StepKey(c);
    case kLeafNone:
      break;
  }
  return StepStructure(c);
}

std::shared_ptr<TokenConstraint> MakeJsonSchemaConstraint(
    std::shared_ptr<const TokenTexts> texts, std::shared_ptr<const CompiledJsonSchema> schema) {
  CHECK(schema != nullptr);
  const CompiledJsonSchema* raw = schema.get();
  return std::make_shared<ByteMachineConstraint<JsonSchemaMachine>>(
      std::move(texts), JsonSchemaMachine(raw), std::move(schema));
}

}  // namespace ember
