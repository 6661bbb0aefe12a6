// JSON mode (`response_format: {"type": "json_object"}`): the sample's text must be one JSON
// object (RFC 8259): it starts with "{", has whitespace only between tokens, and nothing after it.
//
// JsonScanner is a byte-level pushdown recogniser of that language: Step() says whether a byte
// may come next and advances; Done() says the top-level object is closed. Strings must be valid
// UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) without raw control
// characters; numbers follow the JSON grammar; nesting is limited to kMaxDepth containers.
// Insignificant whitespace (outside strings, between tokens) is bounded so that a weak model
// cannot spend its budget on it: each run is empty, one space, or one newline followed by at most
// kMaxIndent spaces/tabs (llama.cpp's JSON grammar rule; StepWhitespace, shared with schemas).
// Its state is a few bytes, copied freely.
//
// ByteMachineConstraint applies a byte machine (JsonScanner, or one that embeds it) to tokens: a
// token is allowed when every byte of its text (Tokenizer::TokenBytes, mid-stream form) is;
// tokens without text (specials, EOS) never are, and the sample ends as soon as the machine is
// done. Allowed() walks the tokens in byte order as a trie: a prefix is stepped once for all the
// tokens that share it, and once a byte is refused every token sharing that prefix is refused
// without a step (a refused first byte jumps past its whole group). Between a JSON string's
// characters every string-safe token is allowed without a step (a copy of their bits) and only
// the others are walked; inside a string with an automaton (a pattern), tokens without quote,
// backslash or control bytes step the automaton alone, not the whole machine. Masks are cached
// by state (MaskCache), built as bits (the form a backend applies: AllowedBits copies them).
// JsonObjectConstraint is JSON mode: the machine is a JsonScanner.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sampling/regex_dfa.h"
#include "sampling/token_constraint.h"
#include "util/check.h"
#include "util/status.h"

namespace ember {

// One byte of insignificant whitespace: true if `c` (a JSON whitespace byte) may extend the run
// `*run` (0: none yet; 1: after a lone space or tab; 2 + k: after a newline and k indent bytes).
inline constexpr int kMaxIndent = 20;
inline bool StepWhitespace(uint8_t c, uint8_t* run) {
  if (c == '\n') {
    if (*run != 0) return false;
    *run = 2;
    return true;
  }
  if (c != ' ' && c != '\t') return false;  // '\r' never: one newline form
  if (*run == 0) {
    *run = 1;
    return true;
  }
  if (*run < 2 || *run >= 2 + kMaxIndent) return false;
  ++*run;
  return true;
}

class JsonScanner {
 public:
  static constexpr int kMaxDepth = 64;

  // A scanner of one JSON value of any kind (not only an object), for schemas' untyped and
  // scalar values. A number at the top level never reports Done (the byte after it decides):
  // its owner asks NumberComplete() before stepping a byte that cannot continue it.
  static JsonScanner AnyValue() {
    JsonScanner s;
    s.mode_ = kValue;
    return s;
  }

  bool Step(uint8_t c);  // false (state unchanged or garbage; discard the copy) if c may not come
  bool Done() const { return mode_ == kDone; }
  bool InPlainString() const { return mode_ == kString; }  // between characters of a string
  // Appends the state's bytes (everything Step and Done depend on) to *key: equal keys, equal
  // futures. For caching masks by state.
  void AppendKey(std::string* key) const;
  // A top-level number that could end here (digits after the sign, the dot or the exponent).
  bool NumberComplete() const {
    return depth_ == 0 &&
           (mode_ == kNumZero || mode_ == kNumInt || mode_ == kNumFrac || mode_ == kNumExp);
  }

 private:
  enum Mode : uint8_t {
    kStart, kObjectOpen, kObjectKey, kColon, kValue, kArrayOpen, kAfterValue, kString, kEscape,
    kHex, kUtf8, kLiteral, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign,
    kNumExp, kDone
  };
  bool StartValue(uint8_t c);
  bool Push(bool array);
  void EndValue();
  bool Close(bool array);
  // One more digit of a number part that may have `limit` (false at the limit).
  bool CountDigit(int limit) {
    if (count_ >= limit) return false;
    ++count_;
    return true;
  }

  uint64_t stack_ = 0;  // bit d - 1: the container at depth d is an array
  uint8_t depth_ = 0;
  Mode mode_ = kStart;
  uint8_t count_ = 0;   // kHex / kUtf8: bytes still to come; kLiteral: bytes matched;
                        // kNumInt / kNumFrac / kNumExp: digits of the part so far
  uint8_t literal_ = 0;  // kLiteral: 0 true, 1 false, 2 null
  uint8_t lo_ = 0x80, hi_ = 0xBF;  // kUtf8: the next continuation byte's range
  uint8_t ws_run_ = 0;
  bool key_ = false;     // the string being read is an object key
};

// Ids in the order of their bytes (a flattened trie): for each, the length of the prefix it
// shares with the one before it (0 for the first), and the index of the next entry whose first
// byte differs (where a walk goes when a first byte is refused). The texts are stored again, in
// this order and back to back, so that a walk reads memory in sequence (a vocabulary's texts
// by id are megabytes of scattered strings).
struct TokenTrie {
  std::vector<int32_t> ids;
  std::vector<int32_t> shared_prefix;
  std::vector<int32_t> next_first_byte;
  std::string text;              // entry i's text is text[offsets[i], offsets[i + 1])
  std::vector<uint32_t> offsets;  // ids.size() + 1
  std::string_view Text(size_t i) const {
    return std::string_view(text).substr(offsets[i], offsets[i + 1] - offsets[i]);
  }
};

// `ids` (each with text in `bytes`) as a trie in byte order.
TokenTrie MakeTokenTrie(std::vector<int32_t> ids,
                        const std::vector<std::optional<std::string>>& bytes);
// The same in the order given (no sort): walks are still exact, prefixes shared only with the
// entry before; for ids that are almost in byte order already.
TokenTrie TokenTrieInOrder(std::vector<int32_t> ids,
                           const std::vector<std::optional<std::string>>& bytes);

// The text of every token id (nullopt: no text, never allowed), shared by all JSON samples.
struct TokenTexts {
  std::vector<std::optional<std::string>> bytes;
  // 1: whole characters of string content (valid UTF-8, no '"', '\\' or control character):
  // allowed anywhere between a string's characters without scanning. Also as bits (id % 64 of
  // word id / 64), copied as a mask's start, and their count.
  std::vector<uint8_t> string_safe;
  std::vector<uint64_t> string_safe_bits;
  int64_t num_string_safe = 0;
  // The string-safe ids by their number of characters (code points): [c] lists those of c.
  // Inside a string with a length bound, the ones that fit the room left.
  std::vector<std::vector<int32_t>> string_safe_by_chars;
  TokenTrie all;              // every id with text
  TokenTrie not_string_safe;  // the ids with text that are not string-safe
  // Raw-safe: no '"', '\\' or byte < 0x20 (UTF-8 may be cut): inside a string with an automaton
  // every byte of such a token is one automaton step.
  TokenTrie raw_safe, not_raw_safe;
  static std::shared_ptr<const TokenTexts> Build(std::vector<std::optional<std::string>> bytes);
};

// Masks as bits (bit id % 64 of word id / 64) and back, a word at a time.
void PackMask(const std::vector<uint8_t>& allowed, std::vector<uint64_t>* bits);
void UnpackMask(const std::vector<uint64_t>& bits, size_t size, std::vector<uint8_t>* allowed);
// 64-bit mask words of a `size`-id mask as the ceil(size / 32) 32-bit words of PackAllowedBits'
// form (token_constraint.h): the same bits, copied.
void MaskWords32(const std::vector<uint64_t>& bits, size_t size, std::vector<uint32_t>* words);

// Masks already computed, by machine state: a mask depends only on the state (Machine::
// AppendKey) and the vocabulary, and a sample revisits few states (inside a long string, one).
// Shared by a constraint's clones (all samples of a request), thread-safe, bounded: masks are
// kept as bits (~19 KB for a 152k vocabulary, 32 of them at most: ~600 KB per request) and it
// forgets everything when full.
class MaskCache {
 public:
  static constexpr size_t kMaxEntries = 32;
  struct Entry {
    std::shared_ptr<const std::vector<uint64_t>> bits;  // bit id % 64 of word id / 64
    size_t size = 0;                                    // the mask's length
    int64_t count = 0;
  };
  // The entry for `key` (bits null if not cached): shared, not copied.
  Entry Lookup(const std::string& key) const;
  void Insert(const std::string& key, Entry entry);
  // Writes the mask for `key` into *allowed and returns its count; -1 if not cached.
  int64_t Find(const std::string& key, std::vector<uint8_t>* allowed) const;
  // The same as packed 32-bit words (PackAllowedBits' form, token_constraint.h): a copy of the
  // cached words, no byte per token.
  int64_t FindBits(const std::string& key, std::vector<uint32_t>* bits) const;
  void Insert(const std::string& key, const std::vector<uint8_t>& allowed, int64_t count);

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
};

// Steps `m` through every byte of `bytes`; false at the first byte it refuses.
template <typename Machine>
bool StepAll(Machine& m, std::string_view bytes) {
  for (char ch : bytes)
    if (!m.Step(static_cast<uint8_t>(ch))) return false;
  return true;
}

// Machine: a small copyable value with bool Step(uint8_t), bool Done(), bool InPlainString()
// (true only between the characters of a JSON string, where every string-safe token fits) and
// AppendKey(std::string*) (its state's bytes: masks are cached by them). Optionally
// `const RegexDfa* StringDfa(int32_t* state)`: non-null inside a string whose raw-safe bytes
// are exactly steps of that automaton (from *state); and `bool InBoundedString(uint32_t* room)`:
// between the characters of a string where a string-safe token fits iff it has at most *room
// characters.
// `keep_alive` owns whatever the machine points to (it is copied with every clone).
// A machine whose language is not self-delimiting (a regex) also has bool CanEnd(): the text so
// far is complete but may go on; then the `end_ids` (the model's end-of-sequence tokens) are
// allowed too, and accepting one completes the output.
template <typename Machine>
class ByteMachineConstraint : public TokenConstraint {
 public:
  explicit ByteMachineConstraint(std::shared_ptr<const TokenTexts> texts, Machine start = {},
                                 std::shared_ptr<const void> keep_alive = nullptr,
                                 std::vector<int32_t> end_ids = {})
      : texts_(std::move(texts)),
        keep_alive_(std::move(keep_alive)),
        cache_(std::make_shared<MaskCache>()),
        end_ids_(std::make_shared<const std::vector<int32_t>>(std::move(end_ids))),
        machine_(start) {
    CHECK(texts_ != nullptr);
  }
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<ByteMachineConstraint>(*this);
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(texts_->bytes.size()); }
  int64_t Allowed(std::vector<uint8_t>& allowed) const override;
  int64_t AllowedBits(std::vector<uint32_t>& bits) const override;
  // From the state's mask (cached for the next step's Allowed / AllowedBits), no byte per token.
  int32_t ForcedToken() const override;
  bool Accept(int32_t id) override {
    if (ended_ || id < 0 || static_cast<size_t>(id) >= texts_->bytes.size()) return false;
    if (CanEnd() && IsEndId(id)) return ended_ = true;
    const std::optional<std::string>& b = texts_->bytes[static_cast<size_t>(id)];
    return b && !b->empty() && StepAll(machine_, *b);
  }
  bool Done() const override { return ended_ || machine_.Done(); }

 private:
  // The mask of the state (not Done()) from the cache, or computed (ComputeMask) and cached.
  MaskCache::Entry StateMask() const;
  // The state's mask as bits (id % 64 of word id / 64), built as bits; returns its count.
  int64_t ComputeMask(std::vector<uint64_t>& bits) const;
  // Walks `trie`'s tokens through the machine; sets and returns the allowed ones.
  int64_t WalkMachine(const TokenTrie& trie, std::vector<uint64_t>& bits) const;
  // Walks `trie`'s tokens through `dfa` from `state` alone.
  int64_t WalkDfa(const TokenTrie& trie, const RegexDfa& dfa, int32_t state,
                  std::vector<uint64_t>& bits) const;
  const RegexDfa* StringDfa(int32_t* state) const {
    if constexpr (requires(const Machine& m, int32_t* s) { m.StringDfa(s); }) {
      return machine_.StringDfa(state);
    } else {
      return nullptr;
    }
  }
  bool InBoundedString(uint32_t* room) const {
    if constexpr (requires(const Machine& m, uint32_t* r) { m.InBoundedString(r); }) {
      return machine_.InBoundedString(room);
    } else {
      return false;
    }
  }
  bool CanEnd() const {
    if constexpr (requires(const Machine& m) { m.CanEnd(); }) {
      return machine_.CanEnd();
    } else {
      return false;
    }
  }
  // An end id, allowed only where the machine CanEnd (a token with text stays a text token).
  bool IsEndId(int32_t id) const {
    return !texts_->bytes[static_cast<size_t>(id)].has_value() &&
           std::find(end_ids_->begin(), end_ids_->end(), id) != end_ids_->end();
  }

  std::shared_ptr<const TokenTexts> texts_;
  std::shared_ptr<const void> keep_alive_;
  std::shared_ptr<MaskCache> cache_;
  std::shared_ptr<const std::vector<int32_t>> end_ids_;
  Machine machine_;
  bool ended_ = false;  // an end id was accepted
};

// Calls visit(id, state) for every token of `trie` whose bytes `step` accepts from `start`
// (with the state after its last byte), sharing the work of common prefixes: step(state, byte)
// advances a copy of the state and returns false on a refused byte (every token with that prefix
// is then skipped). State is a byte machine or an automaton's state; returns the tokens visited.
template <typename State, typename Step, typename Visit>
int64_t WalkTokenTrieVisit(const TokenTrie& trie, const State& start, Step step, Visit visit) {
  // states[d]: the state after the first d bytes of the token at hand, valid for d <= valid.
  thread_local std::vector<State> states;
  states.resize(1);
  states[0] = start;
  size_t valid = 0;
  size_t refused_at = SIZE_MAX;  // the last stepped token's byte that was refused
  int64_t count = 0;
  for (size_t i = 0; i < trie.ids.size(); ++i) {
    const auto id = static_cast<size_t>(trie.ids[i]);
    const auto shared = static_cast<size_t>(trie.shared_prefix[i]);
    // Shares the refused byte's whole prefix: refused too (and valid stays within that prefix).
    if (refused_at != SIZE_MAX && shared > refused_at) continue;
    refused_at = SIZE_MAX;
    valid = std::min(valid, shared);
    const std::string_view bytes = trie.Text(i);
    if (states.size() < bytes.size() + 1) states.resize(bytes.size() + 1);
    size_t d = valid;
    for (; d < bytes.size(); ++d) {
      states[d + 1] = states[d];
      if (!step(states[d + 1], static_cast<uint8_t>(bytes[d]))) break;
    }
    if (d == 0) {  // a refused first byte: its whole group is
      i = static_cast<size_t>(trie.next_first_byte[i]) - 1;
      valid = 0;
      continue;
    }
    if (d < bytes.size()) {
      refused_at = d;
      valid = d;
      continue;
    }
    valid = bytes.size();
    visit(id, states[bytes.size()]);
    ++count;
  }
  return count;
}

// Sets in `bits` (bit id % 64 of word id / 64) every token of `trie` whose bytes `step` accepts
// from `start`.
template <typename State, typename Step>
int64_t WalkTokenTrie(const TokenTrie& trie, const State& start, Step step,
                      std::vector<uint64_t>& bits) {
  return WalkTokenTrieVisit(trie, start, step, [&bits](size_t id, const State&) {
    bits[id / 64] |= uint64_t{1} << (id % 64);
  });
}

template <typename Machine>
int64_t ByteMachineConstraint<Machine>::WalkMachine(const TokenTrie& trie,
                                                    std::vector<uint64_t>& bits) const {
  return WalkTokenTrie(
      trie, machine_, [](Machine& m, uint8_t byte) { return m.Step(byte); }, bits);
}

template <typename Machine>
int64_t ByteMachineConstraint<Machine>::WalkDfa(const TokenTrie& trie, const RegexDfa& dfa,
                                                int32_t state, std::vector<uint64_t>& bits) const {
  return WalkTokenTrie(
      trie, state,
      [&dfa](int32_t& s, uint8_t byte) { return (s = dfa.Next(s, byte)) != RegexDfa::kDead; },
      bits);
}

// Built as bits from the start (a copy of the string-safe bits, trie walks setting bits), so the
// cache keeps it as it is and the backend's form is a copy of it.
template <typename Machine>
int64_t ByteMachineConstraint<Machine>::ComputeMask(std::vector<uint64_t>& bits) const {
  const TokenTexts& t = *texts_;
  const size_t vocab = t.bytes.size();
  int64_t count = 0;
  int32_t dfa_state = 0;
  uint32_t room = 0;
  if (machine_.InPlainString() ||
      (InBoundedString(&room) && room + 1 >= t.string_safe_by_chars.size())) {
    bits = t.string_safe_bits;
    count = t.num_string_safe + WalkMachine(t.not_string_safe, bits);
  } else if (InBoundedString(&room)) {
    // The string-safe ids of at most `room` characters: set those, or clear the longer ones from
    // a copy of all of them, whichever touches fewer ids (with a small room, the longer ones).
    const auto& by_chars = t.string_safe_by_chars;
    int64_t fit = 0;
    for (uint32_t chars = 1; chars <= room; ++chars)
      fit += static_cast<int64_t>(by_chars[chars].size());
    if (fit <= t.num_string_safe - fit) {
      bits.assign((vocab + 63) / 64, 0);
      for (uint32_t chars = 1; chars <= room; ++chars)
        for (int32_t id : by_chars[chars])
          bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
    } else {
      bits = t.string_safe_bits;
      for (size_t chars = 0; chars < by_chars.size(); chars = chars == 0 ? room + 1 : chars + 1)
        for (int32_t id : by_chars[chars])
          bits[static_cast<size_t>(id) / 64] &= ~(uint64_t{1} << (id % 64));
    }
    count = fit + WalkMachine(t.not_string_safe, bits);
  } else if (const RegexDfa* dfa = StringDfa(&dfa_state)) {
    bits.assign((vocab + 63) / 64, 0);
    count = WalkDfa(t.raw_safe, *dfa, dfa_state, bits) + WalkMachine(t.not_raw_safe, bits);
  } else {
    bits.assign((vocab + 63) / 64, 0);
    count = WalkMachine(t.all, bits);
  }
  if (CanEnd()) {
    for (int32_t id : *end_ids_) {
      if (id < 0 || static_cast<size_t>(id) >= vocab || !IsEndId(id)) continue;
      const auto i = static_cast<size_t>(id);
      count += ((bits[i / 64] >> (i % 64)) & 1) == 0;
      bits[i / 64] |= uint64_t{1} << (i % 64);
    }
  }
  return count;
}

template <typename Machine>
MaskCache::Entry ByteMachineConstraint<Machine>::StateMask() const {
  std::string key;
  machine_.AppendKey(&key);
  if (MaskCache::Entry hit = cache_->Lookup(key); hit.bits != nullptr) return hit;
  auto bits = std::make_shared<std::vector<uint64_t>>();
  const int64_t count = ComputeMask(*bits);
  MaskCache::Entry mask{std::move(bits), texts_->bytes.size(), count};
  cache_->Insert(key, mask);
  return mask;
}

template <typename Machine>
int64_t ByteMachineConstraint<Machine>::Allowed(std::vector<uint8_t>& allowed) const {
  if (Done()) {
    allowed.assign(texts_->bytes.size(), 0);
    return 0;
  }
  const MaskCache::Entry mask = StateMask();
  UnpackMask(*mask.bits, mask.size, &allowed);
  return mask.count;
}

// The cached (or computed) bits, copied: no byte per token on the way.
template <typename Machine>
int64_t ByteMachineConstraint<Machine>::AllowedBits(std::vector<uint32_t>& bits) const {
  if (Done()) {
    bits.assign((texts_->bytes.size() + 31) / 32, 0);
    return 0;
  }
  const MaskCache::Entry mask = StateMask();
  MaskWords32(*mask.bits, mask.size, &bits);
  return mask.count;
}

template <typename Machine>
int32_t ByteMachineConstraint<Machine>::ForcedToken() const {
  if (Done()) return -1;
  const MaskCache::Entry mask = StateMask();
  if (mask.count != 1) return -1;
  const std::vector<uint64_t>& bits = *mask.bits;
  for (size_t w = 0; w < bits.size(); ++w)
    if (bits[w] != 0)
      return static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits[w])));
  return -1;
}

using JsonObjectConstraint = ByteMachineConstraint<JsonScanner>;

// An error naming `path` when a fresh constraint allows no token: the output could not even
// start with this model's vocabulary (a tool-call head or a literal whose first bytes no token
// spells). Check it when the request is built, before admission, so that it is a 400 and not an
// error mid-generation. Computes the first mask, which the constraint caches for its first step.
Status CheckConstraintCanStart(const TokenConstraint& constraint, const std::string& path);

}  // namespace ember
