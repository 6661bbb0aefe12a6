#include "sampling/json_schema.h"

#include <algorithm>

#include "util/check.h"

namespace ember {

namespace {

bool IsWhitespace(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool IsNumberByte(uint8_t c) {
  return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
}

}  // namespace

JsonSchemaPath::JsonSchemaPath(const CompiledJsonSchema* schema) : schema_(schema) {}

uint64_t JsonSchemaPath::KeyCandidates(const Frame& f) const {
  const auto& props = schema_->nodes[f.node].properties;
  uint64_t mask = 0;
  for (size_t j = f.index; j < props.size(); ++j) {
    // An optional property whose value cannot fit in the frames left is never started.
    if (Fits(props[j].node)) mask |= uint64_t{1} << j;
    if (props[j].required) break;  // properties come in order: a required one cannot be skipped
  }
  return mask;
}

bool JsonSchemaPath::CanClose(const Frame& f) const {
  const auto& props = schema_->nodes[f.node].properties;
  for (size_t j = f.index; j < props.size(); ++j)
    if (props[j].required) return false;
  return true;
}

void JsonSchemaPath::ValueDone() {
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

bool JsonSchemaPath::StartValue(int32_t node_id, uint8_t c) {
  // A union picks its branch by the first byte (nested unions are flattened: FinishUnions). Where
  // several branches may start with c, branch 0 goes on here and the others are forks.
  if (node_id >= 0 && schema_->nodes[static_cast<size_t>(node_id)].kind == JsonSchemaNode::kUnion) {
    const JsonSchemaNode& u = schema_->nodes[static_cast<size_t>(node_id)];
    const int32_t slot = u.branch_by_first_byte[c];
    if (slot == -1) return false;
    if (slot <= -2) {
      const std::vector<int32_t>& shared = u.shared_branches[static_cast<size_t>(-2 - slot)];
      num_forks_ = static_cast<uint8_t>(shared.size());
      fork_depth_ = depth_;
      fork_byte_ = c;
      fork_union_ = node_id;
      fork_list_ = -2 - slot;
      if (depth_ > 0) fork_frame_ = frames_[depth_ - 1];
      return StartBranch(shared[0], c);
    }
    node_id = slot;
  }
  return StartBranch(node_id, c);
}

bool JsonSchemaPath::StartAlternative(int index) {
  CHECK(index > 0 && index < num_forks_);
  const JsonSchemaNode& u = schema_->nodes[static_cast<size_t>(fork_union_)];
  // StartValue is the last thing a Step does: undo what the first branch started (a one-byte
  // literal has ended its value already: the frame it moved on, or done_).
  depth_ = fork_depth_;
  if (depth_ > 0) frames_[depth_ - 1] = fork_frame_;
  done_ = false;
  leaf_ = kLeafNone;
  num_forks_ = 0;
  return StartBranch(u.shared_branches[static_cast<size_t>(fork_list_)][static_cast<size_t>(index)],
                     fork_byte_);
}

bool JsonSchemaPath::StartBranch(int32_t node_id, uint8_t c) {
  auto scan = [this](uint8_t first) {
    scanner_ = JsonScanner::AnyValue();
    bounded_ = false;
    leaf_ = kLeafScanner;
    return scanner_.Step(first);
  };
  if (node_id < 0) return scan(c);
  const JsonSchemaNode& n = schema_->nodes[static_cast<size_t>(node_id)];
  const bool starts =
      JsonSchemaKindStarts(n.kind).find(static_cast<char>(c)) != std::string_view::npos;
  switch (n.kind) {
    case JsonSchemaNode::kAny:
      return scan(c);
    case JsonSchemaNode::kObject:
    case JsonSchemaNode::kArray: {
      if (!starts || !Fits(node_id)) return false;
      frames_[depth_++] =
          Frame{static_cast<uint16_t>(node_id),
                n.kind == JsonSchemaNode::kObject ? kObjectOpen : kArrayOpen, 0, 0, 0};
      if (n.unique_items) unique_used_ = 0;
      return true;
    }
    case JsonSchemaNode::kString:
      if (n.dfa >= 0) {
        if (c != '"') return false;
        leaf_ = kLeafDfaString;
        leaf_node_ = static_cast<uint16_t>(node_id);
        dfa_state_ = LeafDfa().start();
        escape_ = 0;
        return true;
      }
      if (!starts || !scan(c)) return false;
      bounded_ = n.min_length > 0 || n.max_length < INT32_MAX;
      leaf_node_ = static_cast<uint16_t>(node_id);
      chars_ = 0;
      return true;
    case JsonSchemaNode::kNumber:
    case JsonSchemaNode::kInteger:  // always an automaton (at least the digit limits)
      CHECK(n.dfa >= 0);
      leaf_ = kLeafDfaNumber;
      leaf_node_ = static_cast<uint16_t>(node_id);
      dfa_state_ = LeafDfa().Next(LeafDfa().start(), c);
      return dfa_state_ != RegexDfa::kDead;
    case JsonSchemaNode::kBoolean:
    case JsonSchemaNode::kNull:
      return starts && scan(c);
    case JsonSchemaNode::kLiterals:
      leaf_ = kLeafLiteral;
      lit_node_ = static_cast<uint16_t>(node_id);
      lit_lo_ = 0;
      lit_hi_ = static_cast<uint16_t>(n.literals.size());
      lit_pos_ = 0;
      return StepLiteral(c) == kLiteralTook;
    case JsonSchemaNode::kUnion:
      break;  // flattened by the compiler: never a branch
  }
  return false;
}

bool JsonSchemaPath::InUniqueItem() const {
  if (depth_ == 0) return false;
  const Frame& f = frames_[depth_ - 1];
  return (f.phase == kArrayOpen || f.phase == kArrayItem) && schema_->nodes[f.node].unique_items;
}

bool JsonSchemaPath::AnyUnused(uint16_t lo, uint16_t hi) const {
  const uint64_t upto_hi = hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  const uint64_t below_lo = (uint64_t{1} << lo) - 1;  // lo < hi <= 64
  return (upto_hi & ~below_lo & ~unique_used_) != 0;
}

JsonSchemaPath::LiteralStep JsonSchemaPath::StepLiteral(uint8_t c) {
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
  const bool unique = InUniqueItem();
  if (lo == hi) {
    if (!first_complete) return kLiteralRefused;
    if (unique) {  // a uniqueItems array's item: this literal must not have been written
      if (!AnyUnused(lit_lo_, static_cast<uint16_t>(lit_lo_ + 1))) return kLiteralRefused;
      unique_used_ |= uint64_t{1} << lit_lo_;
    }
    leaf_ = kLeafNone;  // a number literal ended; c belongs to what follows
    ValueDone();
    return kLiteralEnded;
  }
  const auto new_lo = static_cast<uint16_t>(lo - lits.begin());
  const auto new_hi = static_cast<uint16_t>(hi - lits.begin());
  // In a uniqueItems array only a prefix of a literal not written yet may go on.
  if (unique && !AnyUnused(new_lo, new_hi)) return kLiteralRefused;
  lit_lo_ = new_lo;
  lit_hi_ = new_hi;
  ++lit_pos_;
  if (lit_hi_ - lit_lo_ == 1 && lits[lit_lo_].size() == lit_pos_) {
    if (unique) unique_used_ |= uint64_t{1} << lit_lo_;
    leaf_ = kLeafNone;  // nothing can follow within the literal
    ValueDone();
  }
  return kLiteralTook;
}

bool JsonSchemaPath::StepKey(uint8_t c) {
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

bool JsonSchemaPath::StepStructure(uint8_t c) {
  if (depth_ == 0) return StartValue(schema_->root, c);  // the output starts with the value itself
  Frame& f = frames_[depth_ - 1];
  if (IsWhitespace(c)) return StepWhitespace(c, &ws_run_);
  ws_run_ = 0;
  const JsonSchemaNode& n = schema_->nodes[f.node];
  auto close = [this]() {
    --depth_;
    ValueDone();
    return true;
  };
  auto start_key = [&]() {
    if (n.properties.empty()) {
      if (!n.any_keys || !Fits(n.values)) return false;
      f.phase = kColon;  // after the key's string, which the scanner reads
      f.value = static_cast<uint16_t>(n.values + 1);
      scanner_ = JsonScanner::AnyValue();
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
      if (n.properties.empty() && (!n.any_keys || !Fits(n.values))) return false;
      f.phase = kObjectKey;
      return true;
    case kArrayOpen:
      if (c == ']') return n.min_items == 0 && close();
      [[fallthrough]];
    case kArrayItem:
      return f.index < n.max_items &&
             StartValue(f.index < n.prefix_items.size() ? n.prefix_items[f.index] : n.items, c);
    case kAfterItem:
      if (c == ']') return f.index >= n.min_items && close();
      if (c != ',' || f.index >= n.max_items) return false;
      if (n.unique_items) {  // another item needs a literal not written yet
        const auto num_literals = schema_->nodes[static_cast<size_t>(n.items)].literals.size();
        if (!AnyUnused(0, static_cast<uint16_t>(num_literals))) return false;
      }
      f.phase = kArrayItem;
      return true;
  }
  return false;
}

void JsonSchemaPath::AppendKey(std::string* key) const {
  auto put = [key](auto v) { key->append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(depth_);
  for (int d = 0; d < depth_; ++d) {
    const Frame& f = frames_[d];
    put(f.node);
    put(static_cast<uint8_t>(f.phase));
    put(f.index);
    put(f.value);
  }
  if (depth_ > 0 && schema_->nodes[frames_[depth_ - 1].node].unique_items) put(unique_used_);
  put(static_cast<uint8_t>(leaf_));
  put(static_cast<uint8_t>(done_));
  put(ws_run_);
  switch (leaf_) {
    case kLeafScanner:
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
    case kLeafDfaString:
    case kLeafDfaNumber:
      put(leaf_node_);
      put(dfa_state_);
      put(escape_);
      put(escape_value_);
      break;
    case kLeafNone:
      break;
  }
}

bool JsonSchemaPath::DfaTakesAny(uint8_t lo, uint8_t hi) const {
  const RegexDfa& dfa = LeafDfa();
  for (int b = lo; b <= hi; ++b)
    if (dfa.Next(dfa_state_, static_cast<uint8_t>(b)) != RegexDfa::kDead) return true;
  return false;
}

// A string's content as its decoded bytes through the automaton. Written raw: printable ASCII
// but the quote and the backslash, and UTF-8 (the automaton accepts only valid sequences).
// Escaped: quote, backslash, slash, and the control characters (b f n r t, the others as u00XX);
// other u escapes are never written. Every character the automaton allows can so be written, and
// each escape is entered only when one of its completions is allowed: the string never strands.
bool JsonSchemaPath::StepDfaString(uint8_t c) {
  const RegexDfa& dfa = LeafDfa();
  auto take = [&](uint8_t decoded) {
    const int32_t next = dfa.Next(dfa_state_, decoded);
    if (next == RegexDfa::kDead) return false;
    dfa_state_ = next;
    escape_ = 0;
    return true;
  };
  switch (escape_) {
    case 0:
      if (c == '"') {
        if (!dfa.Accepting(dfa_state_)) return false;
        leaf_ = kLeafNone;
        ValueDone();
        return true;
      }
      if (c == '\\') {
        escape_ = 1;
        return DfaTakesAny(0x00, 0x1F) || DfaTakesAny('"', '"') || DfaTakesAny('\\', '\\') ||
               DfaTakesAny('/', '/');
      }
      return c >= 0x20 && take(c);
    case 1:
      switch (c) {
        case '"':
        case '\\':
        case '/':
          return take(c);
        case 'b':
          return take('\b');
        case 'f':
          return take('\f');
        case 'n':
          return take('\n');
        case 'r':
          return take('\r');
        case 't':
          return take('\t');
        case 'u':
          escape_ = 2;
          return DfaTakesAny(0x00, 0x1F);
        default:
          return false;
      }
    case 2:
    case 3:
      if (c != '0') return false;
      ++escape_;
      return true;
    case 4:
      if (c != '0' && c != '1') return false;
      escape_value_ = static_cast<uint8_t>((c - '0') * 16);
      escape_ = 5;
      return DfaTakesAny(escape_value_, static_cast<uint8_t>(escape_value_ + 15));
    default: {
      const int h = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      return h >= 0 && take(static_cast<uint8_t>(escape_value_ + h));
    }
  }
}

bool JsonSchemaPath::Step(uint8_t c) {
  num_forks_ = 0;
  if (done_) return false;
  switch (leaf_) {
    case kLeafScanner:
      if (scanner_.NumberComplete() && !IsNumberByte(c)) {
        leaf_ = kLeafNone;  // the number ended; c belongs to what follows
        ValueDone();
        break;
      }
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
    case kLeafDfaString:
      return StepDfaString(c);
    case kLeafDfaNumber:
      if (IsNumberByte(c)) {
        const int32_t next = LeafDfa().Next(dfa_state_, c);
        if (next == RegexDfa::kDead) return false;
        dfa_state_ = next;
        return true;
      }
      if (!LeafDfa().Accepting(dfa_state_)) return false;
      leaf_ = kLeafNone;  // the number ended; c belongs to what follows
      ValueDone();
      break;
    case kLeafNone:
      break;
  }
  return StepStructure(c);
}

bool JsonSchemaMachine::Step(uint8_t c) {
  bool first_ok = false;
  const bool stepped_first = num_paths_ == 1;
  if (stepped_first) {  // the common case: one path, stepped in place
    first_ok = paths_[0].Step(c);
    if (paths_[0].num_forks() <= 1) return first_ok;
  }
  // Each path's successors: itself (when it took c) and, where it chose among union branches,
  // its alternatives; identical ones merge (by their keys), at most kMaxPaths survive.
  std::array<JsonSchemaPath, kMaxPaths> next;
  std::array<std::string, kMaxPaths> keys;
  int num_next = 0;
  auto add = [&](const JsonSchemaPath& path) {
    if (num_next == kMaxPaths) return;
    std::string key;
    path.AppendKey(&key);
    for (int i = 0; i < num_next; ++i)
      if (keys[static_cast<size_t>(i)] == key) return;
    keys[static_cast<size_t>(num_next)] = std::move(key);
    next[static_cast<size_t>(num_next++)] = path;
  };
  for (int i = 0; i < num_paths_; ++i) {
    JsonSchemaPath& path = paths_[static_cast<size_t>(i)];
    const bool ok = stepped_first ? first_ok : path.Step(c);
    const int forks = path.num_forks();
    const JsonSchemaPath chose = path;
    if (ok) add(path);
    for (int k = 1; k < forks; ++k) {
      JsonSchemaPath alternative = chose;
      if (alternative.StartAlternative(k)) add(alternative);
    }
  }
  if (num_next == 0) return false;
  num_paths_ = num_next;
  for (int i = 0; i < num_next; ++i) paths_[static_cast<size_t>(i)] = next[static_cast<size_t>(i)];
  return true;
}

void JsonSchemaMachine::AppendKey(std::string* key) const {
  if (num_paths_ == 1) {
    paths_[0].AppendKey(key);
    return;
  }
  // Several paths: their count, then each key with its size (a set in a deterministic order).
  key->push_back(static_cast<char>(0x80 | num_paths_));
  for (int i = 0; i < num_paths_; ++i) {
    std::string one;
    paths_[static_cast<size_t>(i)].AppendKey(&one);
    const auto size = static_cast<uint32_t>(one.size());
    key->append(reinterpret_cast<const char*>(&size), sizeof(size));
    key->append(one);
  }
}

std::shared_ptr<TokenConstraint> MakeJsonSchemaConstraint(
    std::shared_ptr<const TokenTexts> texts, std::shared_ptr<const CompiledJsonSchema> schema) {
  CHECK(schema != nullptr);
  const CompiledJsonSchema* raw = schema.get();
  return std::make_shared<ByteMachineConstraint<JsonSchemaMachine>>(
      std::move(texts), JsonSchemaMachine(raw), std::move(schema));
}

}  // namespace ember
