// The regular expressions of structured output (`guided_regex`, a JSON schema's `pattern`,
// `format`): ParseRegex reads an ECMA-262 pattern (the `u`-flag reading: a character is a code
// point) into a small syntax tree over code-point sets, which regex_dfa compiles to a byte-level
// DFA over UTF-8.
//
// The subset: literals; escapes \t \n \r \v \f \0 \xHH \uHHHH (surrogate pairs joined) \u{H..}
// and escaped punctuation; classes [...] and [^...] with ranges and \d \D \w \W \s \S inside;
// \d \D \w \W \s \S; `.` (any code point but the line terminators \n \r U+2028 U+2029); groups
// (...), (?:...), (?<name>...); alternation |; quantifiers ? * + {n} {n,} {n,m} (a lazy `?` after
// one is accepted: it changes which match a search finds, never the set of matching strings);
// ^ at the start of the pattern or of a top-level alternative and $ at its end. Refused with an
// error that names the construct and its position: backreferences (\1, \k<name>), lookaround
// ((?=, (?!, (?<=, (?<!), word boundaries (\b \B), ^ or $ anywhere else, flags-like groups,
// Unicode property escapes (\p{..}), lone surrogates. Bounds (hostile patterns): at most
// kMaxPatternBytes bytes, groups nested at most kMaxGroupDepth deep, counted repetition at most
// kMaxRepeat.
//
// A match of the whole text (guided_regex: the output is the match) ignores ^ and $; a search
// (JSON Schema's `pattern`: the string contains a match) puts "any text" before each top-level
// alternative not anchored by ^ and after each not anchored by $ (RegexSyntax::Search). Pure
// functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace ember {

// Sorted, disjoint, non-adjacent ranges of code points [lo, hi] (never surrogates).
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

struct RegexNode {
  enum Kind : uint8_t { kEmpty, kSet, kConcat, kAlternate, kRepeat };
  Kind kind = kEmpty;
  CodePointRanges set;            // kSet
  std::vector<int32_t> children;  // kConcat, kAlternate: node ids; kRepeat: one
  int32_t min = 0, max = -1;      // kRepeat: -1 unbounded
};

// A parsed pattern: nodes_[root] is the whole pattern.
struct RegexSyntax {
  static constexpr size_t kMaxPatternBytes = 4096;
  static constexpr int kMaxGroupDepth = 64;
  static constexpr int32_t kMaxRepeat = 1000;

  std::vector<RegexNode> nodes;
  int32_t root = 0;
  // Each top-level alternative's anchors (a search surrounds the unanchored sides with any text).
  struct Branch {
    int32_t node = 0;
    bool anchored_start = false, anchored_end = false;
  };
  std::vector<Branch> branches;

  int32_t Add(RegexNode node);
  int32_t Set(CodePointRanges set) {
    return Add(RegexNode{RegexNode::kSet, std::move(set), {}, 0, -1});
  }
  int32_t Concat(std::vector<int32_t> children);
  int32_t Alternate(std::vector<int32_t> children);
  int32_t Repeat(int32_t child, int32_t min, int32_t max);
  // The root for a search: each unanchored side of a branch gets "any code points".
  int32_t Search();
};

// Sorts and merges `r` and drops surrogates.
CodePointRanges NormalizeCodePoints(CodePointRanges r);
// Every code point (no surrogates) not in `r` (normalized).
CodePointRanges NegateCodePoints(const CodePointRanges& r);

// Any code point (every scalar value): what a search pads with and a length bound counts.
CodePointRanges AnyCodePoint();

// Parses `pattern`; an error names `path` ("guided_regex", "schema.properties.a.pattern"), the
// construct and its byte offset.
Result<RegexSyntax> ParseRegex(std::string_view pattern, const std::string& path);

// `text` as a pattern matching exactly it (ECMA-262 syntax characters escaped): guided_choice.
std::string EscapeRegexLiteral(std::string_view text);

}  // namespace ember
