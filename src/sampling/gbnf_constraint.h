// Grammar-guided output (`grammar`, `guided_grammar`, `structured_outputs.grammar`): the sample's
// whole text must be a sentence of a GBNF grammar (gbnf_grammar.h), recognised byte by byte by a
// GbnfAutomaton (gbnf_automaton.h). The model's end-of-sequence ids (`end_ids`) are allowed where
// the text so far is a complete sentence, and choosing one completes the output; the sample ends
// by itself where nothing may follow.
//
// A mask is the union, over the stacks of the current state, of what each stack allows: a local
// walk of the whole vocabulary (a TokenTrie, json_constraint.h, over its tokens grouped by the
// grammar's byte classes, built with the grammar: tokens alike class by class are walked once)
// from the stack cut to its top few frames over a sentinel bottom, computed once per cut stack
// and shared by every state (the same loop at any depth of nesting) and every clone. A token the
// local walk reads to its end is allowed whatever lies below; a token the kept frames could only
// read by all ending mid-token (the sentinel was reached after its first byte) is "uncertain", and
// is checked by stepping the real state over its bytes. Masks are also cached by state
// (MaskCache). Inside a string-like loop a mask is thus a copy of the local bits plus the few
// uncertain tokens (those holding the closing quote).
//
// Thread-safety: the clones of one request share the automaton and the local masks behind one
// mutex (Allowed and Accept take it); a clone's own state is one int. A grammar whose parse
// exceeds the automaton's bounds makes Allowed return 0 (the engine ends the sample with an
// error) and error() say which bound.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sampling/gbnf_grammar.h"
#include "sampling/json_constraint.h"
#include "sampling/token_constraint.h"

namespace ember {

struct GbnfShared;

// Compiled grammars by their text, for one vocabulary (a served model's): a request whose grammar
// was seen before shares the earlier requests' automaton and masks (the local masks are the cold
// cost: a walk of the vocabulary each), so only its first request pays them. A new grammar is
// compiled outside the cache's lock. At most kMaxGrammars texts (all forgotten when full); an
// automaton past a quarter of its state bound is replaced by a fresh one for new requests.
// Thread-safe.
class GbnfCache {
 public:
  static constexpr size_t kMaxGrammars = 16;
  GbnfCache(std::shared_ptr<const TokenTexts> texts, std::vector<int32_t> end_ids);
  // A constraint at the start of `text`'s grammar; a parse error names `path`.
  Result<std::shared_ptr<TokenConstraint>> Constraint(std::string_view text,
                                                      const std::string& path);

 private:
  std::mutex mu_;
  std::shared_ptr<const TokenTexts> texts_;
  std::vector<int32_t> end_ids_;
  std::unordered_map<std::string, std::shared_ptr<GbnfShared>> entries_;
};

std::shared_ptr<TokenConstraint> MakeGbnfConstraint(std::shared_ptr<const TokenTexts> texts,
                                                    std::shared_ptr<const GbnfGrammar> grammar,
                                                    std::vector<int32_t> end_ids);

// The bound a constraint of MakeGbnfConstraint hit ("" if none): tests and error messages.
std::string GbnfConstraintError(const TokenConstraint& constraint);

}  // namespace ember
