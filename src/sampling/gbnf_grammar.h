// GBNF grammars (llama.cpp's `grammar`, vLLM's `guided_grammar`): ParseGbnf reads the grammar
// text and compiles it to a byte-level context-free grammar, GbnfGrammar, that gbnf_automaton.h
// recognises one UTF-8 byte at a time.
//
// The syntax: rules `name ::= body` (names of letters, digits, '-' and '_'; a rule ends where the
// next `name ::=` starts, so alternatives may continue on the following lines); alternation `|`;
// grouping `( ... )`; postfix `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`; string literals "..." with
// the escapes \\ \" \' \[ \] \- \/ \n \r \t \xHH \uHHHH \UHHHHHHHH (code points); character
// classes [a-z0-9_] and negated [^...] with the same escapes; `.` (any code point); `#` comments
// to the end of the line. `root` is the start rule. Characters are code points, matched as their
// UTF-8 encodings (never surrogates, never invalid UTF-8).
//
// Refused with an error naming the rule and the line/column: syntax errors (unbalanced
// parentheses or quotes, a bad escape, a bad repetition), an undefined rule, a rule defined
// twice, no `root`, an empty grammar, a rule that derives no finite text (`a ::= "x" a`), left
// recursion (a rule that can reach itself before reading a byte, other than as the last element:
// `expr ::= expr "+" term`), and bounds for hostile input: at most kMaxGrammarBytes of text,
// groups nested kMaxDepth deep, repetition counts up to kMaxRepeat, kMaxElements elements once
// repetitions are expanded. Pure functions; the result is immutable and shared across threads.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace ember {

struct GbnfGrammar {
  static constexpr size_t kMaxGrammarBytes = 64 * 1024;
  static constexpr int kMaxDepth = 64;
  static constexpr int32_t kMaxRepeat = 1000;
  static constexpr size_t kMaxElements = 100000;

  enum Kind : uint8_t {
    kBytes,  // one byte of byte_sets[arg]
    kRule,   // rule `arg`
    kEnd,    // the end of an alternative
  };
  struct Element {
    Kind kind = kEnd;
    int32_t arg = 0;
  };
  // Every alternative is a run of elements ending with kEnd; alternatives[r] lists rule r's
  // first elements. Rules past the user's are generated (groups, repetitions, classes).
  std::vector<Element> elements;
  std::vector<std::bitset<256>> byte_sets;
  std::vector<std::vector<int32_t>> alternatives;
  std::vector<std::string> names;  // per rule: its name, or the user rule it was generated in
  int32_t root = 0;
  // Bytes no byte set tells apart share a class: automata index transitions by class.
  std::array<uint8_t, 256> byte_class{};
  int32_t num_classes = 1;
};

// Parses and compiles `text`; an error names `path` (the request field), the rule and the
// position.
Result<std::shared_ptr<const GbnfGrammar>> ParseGbnf(std::string_view text,
                                                     const std::string& path);

}  // namespace ember
