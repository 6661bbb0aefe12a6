// A deterministic automaton over the UTF-8 bytes of the texts a regular expression matches
// (regex_syntax.h): structured output steps it one byte at a time, and a token is allowed when
// all its bytes have a transition (json_constraint.h's trie walk). CompileRegex builds it
// eagerly (Thompson NFA over byte ranges, then subset construction over byte classes), bounded:
// at most kMaxNfaStates NFA states and kMaxStates DFA states, else an error naming the limit, so
// a hostile pattern ((a|b)*a(a|b){20}, a{1000}{1000}) costs bounded time and memory.
//
// Invariants: every transition leads to a live state (one from which an accepting state is
// reachable; transitions to others are removed), so a machine stepping it never dead-ends; the
// start state is live (a pattern that matches nothing is an error); only valid UTF-8 (no
// surrogates, no overlong forms) is accepted. Immutable once built: shared freely across threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/regex_syntax.h"
#include "util/status.h"

namespace ember {

// A byte range [lo, hi] per position: the UTF-8 encodings of a run of code points.
using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;
// Splits the code points [lo, hi] (no surrogates) into runs whose encodings are products of byte
// ranges, appended to *out (shared with GBNF grammars' character classes).
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>* out);

class RegexDfa {
 public:
  static constexpr int32_t kMaxStates = 10000;
  static constexpr int32_t kMaxNfaStates = 250000;
  static constexpr int32_t kDead = -1;

  int32_t start() const { return start_; }
  int32_t num_states() const { return static_cast<int32_t>(accepting_.size()); }
  // The state after `byte` from `state`, or kDead.
  int32_t Next(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * num_classes_ + byte_class_[byte]];
  }
  bool Accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  // Accepting, and no byte may follow: the match is complete.
  bool Terminal(int32_t state) const {
    return Accepting(state) && !has_next_[static_cast<size_t>(state)];
  }
  // The whole of `text` is a match (tests).
  bool Matches(std::string_view text) const;

  // The DFA of syntax.nodes[root]. `path` names the pattern in errors.
  static Result<std::shared_ptr<const RegexDfa>> Compile(const RegexSyntax& syntax, int32_t root,
                                                         const std::string& path);
  // Canonical JSON integers (no leading zeros, no "-0") divisible by `k` (1..kMaxDivisor):
  // the remainder so far is the state (JSON Schema's integer multipleOf).
  static constexpr int64_t kMaxDivisor = 1000;
  static std::shared_ptr<const RegexDfa> Multiples(int64_t k);
  // JSON numbers without exponent that are multiples of p / 10^scale (p in 1..kMaxDivisor,
  // scale >= 1; JSON Schema's fractional multipleOf, e.g. 0.25 = 25 / 10^2): the text's value
  // times 10^scale is an integer n divisible by p. The state is n's remainder mod p so far and
  // the number of fraction digits read; past `scale` fraction digits only zeros follow (1.50).
  // Leading zeros and "-0" are left to the range regex it is intersected with; no digit limit.
  // An error naming `path` when it would need more than kMaxStates states.
  static Result<std::shared_ptr<const RegexDfa>> DecimalMultiples(int64_t p, int scale,
                                                                  const std::string& path);
  // The texts both match (product construction, the same bounds).
  static Result<std::shared_ptr<const RegexDfa>> Intersect(const RegexDfa& a, const RegexDfa& b,
                                                           const std::string& path);

 private:
  // Drops transitions into dead states, fills has_next_; an error when the start is dead.
  Status Trim(const std::string& path);
  // The states and transitions of DecimalMultiples (scale 0: Multiples' integers), untrimmed.
  void BuildMultiples(int64_t p, int scale);

  std::array<uint8_t, 256> byte_class_{};
  size_t num_classes_ = 1;
  std::vector<int32_t> next_;  // [num_states, num_classes_]: the next state or kDead
  std::vector<uint8_t> accepting_, has_next_;  // [num_states]
  int32_t start_ = 0;
};

enum class RegexMatch {
  kWhole,   // the text is a match (guided_regex, guided_choice); ^ and $ change nothing
  kSearch,  // the text contains a match (JSON Schema's `pattern`)
};

// ParseRegex + RegexDfa::Compile.
Result<std::shared_ptr<const RegexDfa>> CompileRegex(std::string_view pattern, RegexMatch match,
                                                     const std::string& path);

}  // namespace ember
