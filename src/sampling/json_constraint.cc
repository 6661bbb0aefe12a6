#include "sampling/json_constraint.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <string_view>

#include "sampling/json_number_limits.h"
#include "util/check.h"
#include "util/utf8.h"

namespace ember {

namespace {
bool IsWhitespace(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
constexpr const char* kLiterals[3] = {"true", "false", "null"};
constexpr uint8_t kLiteralLengths[3] = {4, 5, 4};
}  // namespace

bool JsonScanner::Push(bool array) {
  if (depth_ >= kMaxDepth) return false;
  const uint64_t bit = uint64_t{1} << depth_;
  stack_ = array ? (stack_ | bit) : (stack_ & ~bit);
  ++depth_;
  mode_ = array ? kArrayOpen : kObjectOpen;
  return true;
}

void JsonScanner::EndValue() { mode_ = depth_ == 0 ? kDone : kAfterValue; }

bool JsonScanner::Close(bool array) {
  const bool top_is_array = (stack_ >> (depth_ - 1)) & 1;
  if (top_is_array != array) return false;
  --depth_;
  EndValue();
  return true;
}

bool JsonScanner::StartValue(uint8_t c) {
  switch (c) {
    case '{': return Push(false);
    case '[': return Push(true);
    case '"':
      mode_ = kString;
      key_ = false;
      return true;
    case '-': mode_ = kNumMinus; return true;
    case '0': mode_ = kNumZero; return true;
    case 't': case 'f': case 'n':
      mode_ = kLiteral;
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      count_ = 1;
      return true;
    default:
      if (c >= '1' && c <= '9') {
        mode_ = kNumInt;
        count_ = 1;
        return true;
      }
      return false;
  }
}

bool JsonScanner::Step(uint8_t c) {
  switch (mode_) {
    case kObjectOpen: case kObjectKey: case kColon: case kValue: case kArrayOpen: case kAfterValue:
      if (IsWhitespace(c)) return StepWhitespace(c, &ws_run_);
      ws_run_ = 0;
      break;
    default:
      break;
  }
  switch (mode_) {
    case kStart:
      return c == '{' && Push(false);  // the output starts with the object itself
    case kObjectOpen:
      if (c == '}') return Close(false);
      [[fallthrough]];
    case kObjectKey:
      if (c != '"') return false;
      mode_ = kString;
      key_ = true;
      return true;
    case kColon:
      if (c != ':') return false;
      mode_ = kValue;
      return true;
    case kArrayOpen:
      if (c == ']') return Close(true);
      [[fallthrough]];
    case kValue:
      return StartValue(c);
    case kAfterValue: {
      const bool in_array = (stack_ >> (depth_ - 1)) & 1;
      if (c == ',') {
        mode_ = in_array ? kValue : kObjectKey;
        return true;
      }
      if (c == '}' || c == ']') return Close(c == ']');
      return false;
    }
    case kString:
      if (c == '"') {
        if (key_) {
          mode_ = kColon;
        } else {
          EndValue();
        }
        return true;
      }
      if (c == '\\') {
        mode_ = kEscape;
        return true;
      }
      if (c < 0x20) return false;
      if (c < 0x80) return true;
      {
        // A UTF-8 lead byte: the continuation bytes to come and the first one's range.
        Utf8Lead lead;
        if (!ParseUtf8Lead(c, &lead)) return false;
        count_ = static_cast<uint8_t>(lead.continuations);
        lo_ = lead.first_lo;
        hi_ = lead.first_hi;
      }
      mode_ = kUtf8;
      return true;
    case kUtf8:
      if (c < lo_ || c > hi_) return false;
      lo_ = 0x80;
      hi_ = 0xBF;
      if (--count_ == 0) mode_ = kString;
      return true;
    case kEscape:
      if (c == 'u') {
        mode_ = kHex;
        count_ = 4;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        mode_ = kString;
        return true;
      }
      return false;
    case kHex:
      if (!IsHex(c)) return false;
      if (--count_ == 0) mode_ = kString;
      return true;
    case kLiteral:
      if (c != static_cast<uint8_t>(kLiterals[literal_][count_])) return false;
      if (++count_ == kLiteralLengths[literal_]) EndValue();
      return true;
    case kNumMinus:
      if (c == '0') {
        mode_ = kNumZero;
        return true;
      }
      if (c >= '1' && c <= '9') {
        mode_ = kNumInt;
        count_ = 1;
        return true;
      }
      return false;
    case kNumInt:
      if (IsDigit(c)) return CountDigit(kJsonMaxIntegerDigits);
      [[fallthrough]];
    case kNumZero:
      if (c == '.') {
        mode_ = kNumDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        mode_ = kNumE;
        return true;
      }
      EndValue();  // the number ended; c belongs to what follows it
      return Step(c);
    case kNumDot:
      if (!IsDigit(c)) return false;
      mode_ = kNumFrac;
      count_ = 1;
      return true;
    case kNumFrac:
      if (IsDigit(c)) return CountDigit(kJsonMaxFractionDigits);
      if (c == 'e' || c == 'E') {
        mode_ = kNumE;
        return true;
      }
      EndValue();
      return Step(c);
    case kNumE:
      if (c == '+' || c == '-') {
        mode_ = kNumESign;
        return true;
      }
      [[fallthrough]];
    case kNumESign:
      if (!IsDigit(c)) return false;
      mode_ = kNumExp;
      count_ = 1;
      return true;
    case kNumExp:
      if (IsDigit(c)) return CountDigit(kJsonMaxExponentDigits);
      EndValue();
      return Step(c);
    case kDone:
      return false;
  }
  return false;
}

void JsonScanner::AppendKey(std::string* key) const {
  // Only what the mode reads: bits of stack_ above depth_, and the counters of other modes, are
  // leftovers (so that, say, every state between a string's characters has one key).
  const uint64_t stack = depth_ == 0 ? 0 : stack_ & (~uint64_t{0} >> (64 - depth_));
  key->append(reinterpret_cast<const char*>(&stack), sizeof(stack));
  uint8_t bytes[] = {depth_, static_cast<uint8_t>(mode_), ws_run_, 0, 0, 0, 0};
  switch (mode_) {
    case kString: case kEscape: bytes[3] = key_; break;
    case kHex: bytes[3] = key_; bytes[4] = count_; break;
    case kUtf8: bytes[3] = key_; bytes[4] = count_; bytes[5] = lo_; bytes[6] = hi_; break;
    case kLiteral: bytes[4] = count_; bytes[5] = literal_; break;
    case kNumInt: case kNumFrac: case kNumExp: bytes[4] = count_; break;
    default: break;
  }
  key->append(reinterpret_cast<const char*>(bytes), sizeof(bytes));
}

void PackMask(const std::vector<uint8_t>& allowed, std::vector<uint64_t>* bits) {
  const size_t n = allowed.size();
  bits->assign((n + 63) / 64, 0);
  size_t id = 0;
  // Eight 0/1 bytes to eight bits: the multiply moves byte k's low bit to bit 56 + k.
  for (; id + 8 <= n; id += 8) {
    uint64_t x;
    std::memcpy(&x, allowed.data() + id, 8);
    const uint64_t byte = ((x & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56;
    (*bits)[id / 64] |= byte << (id % 64);
  }
  for (; id < n; ++id) (*bits)[id / 64] |= uint64_t{allowed[id] != 0} << (id % 64);
}

void UnpackMask(const std::vector<uint64_t>& bits, size_t size, std::vector<uint8_t>* allowed) {
  // kSpread[b]: the eight bits of b as eight 0/1 bytes.
  static const std::array<uint64_t, 256> kSpread = [] {
    std::array<uint64_t, 256> t{};
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) t[static_cast<size_t>(b)] |= uint64_t((b >> k) & 1) << (8 * k);
    return t;
  }();
  allowed->resize(size);
  size_t id = 0;
  for (; id + 8 <= size; id += 8) {
    const uint64_t spread = kSpread[(bits[id / 64] >> (id % 64)) & 0xFF];
    std::memcpy(allowed->data() + id, &spread, 8);
  }
  for (; id < size; ++id) (*allowed)[id] = (bits[id / 64] >> (id % 64)) & 1;
}

void MaskWords32(const std::vector<uint64_t>& bits, size_t size, std::vector<uint32_t>* words) {
  static_assert(std::endian::native == std::endian::little,
                "a uint64 word's bytes are its two uint32 halves, low first");
  words->resize((size + 31) / 32);
  if (words->empty()) return;  // (an empty vector's data() may be null: no memcpy from it)
  std::memcpy(words->data(), bits.data(), words->size() * sizeof(uint32_t));
}

MaskCache::Entry MaskCache::Lookup(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? Entry{} : it->second;
}

void MaskCache::Insert(const std::string& key, Entry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  // Full: one entry goes (not all: a walk that cycles through more states than fit keeps most).
  if (entries_.size() >= kMaxEntries && entries_.count(key) == 0) entries_.erase(entries_.begin());
  entries_[key] = std::move(entry);
}

// Outside the lock: other rows' lookups need not wait for the unpacking or the copy.
int64_t MaskCache::Find(const std::string& key, std::vector<uint8_t>* allowed) const {
  const Entry hit = Lookup(key);
  if (hit.bits == nullptr) return -1;
  UnpackMask(*hit.bits, hit.size, allowed);
  return hit.count;
}

int64_t MaskCache::FindBits(const std::string& key, std::vector<uint32_t>* bits) const {
  const Entry hit = Lookup(key);
  if (hit.bits == nullptr) return -1;
  MaskWords32(*hit.bits, hit.size, bits);
  return hit.count;
}

void MaskCache::Insert(const std::string& key, const std::vector<uint8_t>& allowed, int64_t count) {
  auto bits = std::make_shared<std::vector<uint64_t>>();
  PackMask(allowed, bits.get());
  Insert(key, Entry{std::move(bits), allowed.size(), count});
}

TokenTrie MakeTokenTrie(std::vector<int32_t> ids,
                        const std::vector<std::optional<std::string>>& bytes) {
  auto text = [&bytes](int32_t id) -> const std::string& { return *bytes[static_cast<size_t>(id)]; };
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return text(a) < text(b); });
  return TokenTrieInOrder(std::move(ids), bytes);
}

TokenTrie TokenTrieInOrder(std::vector<int32_t> ids,
                           const std::vector<std::optional<std::string>>& bytes) {
  auto text = [&bytes](int32_t id) -> const std::string& { return *bytes[static_cast<size_t>(id)]; };
  TokenTrie t;
  t.shared_prefix.assign(ids.size(), 0);
  for (size_t i = 1; i < ids.size(); ++i) {
    const std::string& a = text(ids[i - 1]);
    const std::string& b = text(ids[i]);
    const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    t.shared_prefix[i] = static_cast<int32_t>(mismatch.first - a.begin());
  }
  t.next_first_byte.assign(ids.size(), static_cast<int32_t>(ids.size()));
  for (size_t i = ids.size(); i-- > 1;) {
    t.next_first_byte[i - 1] =
        t.shared_prefix[i] == 0 ? static_cast<int32_t>(i) : t.next_first_byte[i];
  }
  t.offsets.reserve(ids.size() + 1);
  t.offsets.push_back(0);
  for (int32_t id : ids) {
    t.text += text(id);
    t.offsets.push_back(static_cast<uint32_t>(t.text.size()));
  }
  t.ids = std::move(ids);
  return t;
}

std::shared_ptr<const TokenTexts> TokenTexts::Build(
    std::vector<std::optional<std::string>> bytes) {
  auto t = std::make_shared<TokenTexts>();
  t->string_safe.assign(bytes.size(), 0);
  // A scanner between the characters of a string value.
  JsonScanner in_string;
  for (char c : std::string("{\"k\":\"")) in_string.Step(static_cast<uint8_t>(c));
  std::vector<int32_t> all, not_string_safe, raw_safe, not_raw_safe;
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (!bytes[id] || bytes[id]->empty()) continue;
    const auto id32 = static_cast<int32_t>(id);
    all.push_back(id32);
    JsonScanner s = in_string;
    t->string_safe[id] = bytes[id]->find_first_of("\"\\") == std::string::npos &&
                         StepAll(s, *bytes[id]) && s.InPlainString();
    if (!t->string_safe[id]) not_string_safe.push_back(id32);
    const bool raw = std::none_of(bytes[id]->begin(), bytes[id]->end(), [](char c) {
      return c == '"' || c == '\\' || static_cast<uint8_t>(c) < 0x20;
    });
    (raw ? raw_safe : not_raw_safe).push_back(id32);
  }
  PackMask(t->string_safe, &t->string_safe_bits);
  t->string_safe_by_chars.resize(1);
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (!t->string_safe[id]) continue;
    size_t chars = 0;
    for (const char c : *bytes[id]) chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    if (t->string_safe_by_chars.size() <= chars) t->string_safe_by_chars.resize(chars + 1);
    t->string_safe_by_chars[chars].push_back(static_cast<int32_t>(id));
  }
  t->num_string_safe = static_cast<int64_t>(all.size() - not_string_safe.size());
  t->all = MakeTokenTrie(std::move(all), bytes);
  t->not_string_safe = MakeTokenTrie(std::move(not_string_safe), bytes);
  t->raw_safe = MakeTokenTrie(std::move(raw_safe), bytes);
  t->not_raw_safe = MakeTokenTrie(std::move(not_raw_safe), bytes);
  t->bytes = std::move(bytes);
  return t;
}

Status CheckConstraintCanStart(const TokenConstraint& constraint, const std::string& path) {
  if (constraint.Done()) return Status::Ok();  // nothing to write
  std::vector<uint8_t> allowed;
  if (constraint.Allowed(allowed) > 0) return Status::Ok();
  return Status::Error(path + ": no token of this model's vocabulary can start the required output");
}

}  // namespace ember
