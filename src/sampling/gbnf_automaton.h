// The recogniser of a GBNF grammar (gbnf_grammar.h) over UTF-8 bytes: a pushdown automaton over
// a set of stacks, made deterministic lazily. A stack is a node (an element position and the
// node below it, hash-consed, so equal stacks are one id); a state is the sorted set of stacks
// that can be in after the bytes so far, each with a byte element on top (or the empty stack:
// the text is complete). Next(state, byte) advances every stack whose top accepts the byte,
// then settles them (pops finished alternatives, expands rule references, with a reference at
// the end of its alternative reusing the stack below: right recursion does not grow it), and
// interns the resulting set; transitions are cached per (state, byte class), so a walk of
// token texts steps an int like a DFA.
//
// Invariants: a state is never empty (no byte leads to one: kDead instead) and, since every
// rule derives some finite text (ParseGbnf refuses the others), every state can be completed:
// a walk never dead-ends. The grammar has no left recursion (refused), so settling terminates.
// Bounds (hostile grammars): a state holds at most kMaxStacks stacks, the automaton at most
// kMaxStates states and kMaxNodes stack nodes, and one budget window (ResetBudget) does at most
// kMaxWork settling steps; past any of them error() is set and every later step is kDead.
//
// Local walks (the token masks' shared part) start from a stack cut to its top frames over the
// kPopNode sentinel (Truncate), which reads no byte: a state holding it means the frames kept
// could all have ended there.
//
// Not thread-safe: its owner serialises calls (gbnf_constraint.h holds a mutex).
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sampling/gbnf_grammar.h"

namespace ember {

class GbnfAutomaton {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kAcceptNode = 0;  // the empty stack: the text is complete
  static constexpr int32_t kPopNode = 1;     // a local walk's sentinel bottom
  static constexpr size_t kMaxStacks = 1024;
  static constexpr size_t kMaxStates = 200000;
  static constexpr size_t kMaxNodes = 2000000;
  static constexpr int64_t kMaxWork = 5000000;

  explicit GbnfAutomaton(std::shared_ptr<const GbnfGrammar> grammar);

  int32_t start() const { return start_; }
  int32_t Next(int32_t state, uint8_t byte) {
    const size_t at = static_cast<size_t>(state) * num_classes_ + grammar_->byte_class[byte];
    if (next_[at] != kUnknown) return next_[at];
    const int32_t next = Compute(state, byte);  // may grow next_
    if (error_.empty()) next_[at] = next;
    return next;
  }
  // The state after `text` from `state`, or kDead.
  int32_t Walk(int32_t state, std::string_view text);
  std::span<const int32_t> Stacks(int32_t state) const {
    const auto s = static_cast<size_t>(state);
    return std::span<const int32_t>(set_nodes_).subspan(set_offsets_[s],
                                                         set_offsets_[s + 1] - set_offsets_[s]);
  }
  // The text may end here (the empty stack is in the set; sets are sorted, so it comes first).
  bool Accepting(int32_t state) const { return Stacks(state)[0] == kAcceptNode; }
  // The text is complete and nothing may follow.
  bool Terminal(int32_t state) const { return Stacks(state).size() == 1 && Accepting(state); }
  bool HasPop(int32_t state) const {
    for (int32_t node : Stacks(state).first(std::min<size_t>(2, Stacks(state).size())))
      if (node == kPopNode) return true;
    return false;
  }
  // The stack `node` cut to its top `depth` frames over the pop sentinel (a node id; the node
  // itself when it has no more frames than that), and the state of that one stack.
  // *below: the stack under the frames kept (kAcceptNode when nothing was cut).
  int32_t Truncate(int32_t node, int depth, int32_t* below);
  int32_t StateOf(int32_t node);
  // The bytes that may come first once the stack `node` resumes (settled; kDead-safe: none
  // for the accept node).
  std::bitset<256> FirstBytesBelow(int32_t node);
  // The bytes that may follow, in any context, the frames of a cut stack (Truncate) once they all
  // end: FOLLOW of its bottom frame's rule. Empty for a stack that was not cut.
  const std::bitset<256>& CutFollow(int32_t cut) const;

  void ResetBudget() { work_ = 0; }
  const std::string& error() const { return error_; }
  size_t num_states() const { return set_offsets_.size() - 1; }

 private:
  static constexpr int32_t kUnknown = -2;
  int32_t Node(int32_t pos, int32_t parent);
  // Settles the pending (pos, parent) pairs of work_list_ into out_ (stack nodes).
  void Settle();
  int32_t Intern(std::vector<int32_t>& nodes);  // sorts; the state id or kDead
  int32_t Compute(int32_t state, uint8_t byte);
  int32_t Fail(const std::string& message);

  void ComputeFollow();

  std::shared_ptr<const GbnfGrammar> grammar_;
  std::vector<int32_t> rule_of_;            // [elements]: the rule an element belongs to
  std::vector<std::bitset<256>> follow_;    // [rules]: FOLLOW sets over bytes
  std::bitset<256> none_;
  size_t num_classes_ = 1;
  std::vector<int32_t> node_pos_, node_parent_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<uint32_t> set_offsets_{0};
  std::vector<int32_t> set_nodes_;
  std::unordered_map<std::string, int32_t> set_ids_;
  std::vector<int32_t> next_;  // [states, classes]: kUnknown, kDead or the next state
  int32_t start_ = 0;
  // Scratch of Compute / Settle.
  std::vector<std::pair<int32_t, int32_t>> work_list_;
  std::unordered_set<uint64_t> visited_;
  std::vector<int32_t> out_;
  int64_t work_ = 0;
  std::string error_;
};

}  // namespace ember
