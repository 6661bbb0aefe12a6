// Regex-guided output (`guided_regex`, `guided_choice`, `structured_outputs.regex|choice`): the
// sample's whole text must match a regular expression (regex_dfa.h, RegexMatch::kWhole).
// RegexMachine steps the DFA one byte at a time for ByteMachineConstraint (json_constraint.h:
// the trie walk and the per-state mask cache). The sample ends by itself once no byte can follow
// a match (RegexDfa::Terminal); in an accepting state that may still go on, the model's
// end-of-sequence ids (`end_ids`) are allowed too, and choosing one completes the output. The
// machine's state is one int, copied freely; the DFA is shared and immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sampling/json_constraint.h"
#include "sampling/regex_dfa.h"
#include "sampling/token_constraint.h"

namespace ember {

class RegexMachine {
 public:
  RegexMachine() = default;
  explicit RegexMachine(const RegexDfa* dfa) : dfa_(dfa), state_(dfa->start()) {}  // borrowed

  bool Step(uint8_t c) {
    const int32_t next = dfa_->Next(state_, c);
    if (next == RegexDfa::kDead) return false;
    state_ = next;
    return true;
  }
  bool Done() const { return dfa_->Terminal(state_); }
  bool CanEnd() const { return dfa_->Accepting(state_); }  // an end id may come now
  bool InPlainString() const { return false; }
  void AppendKey(std::string* key) const {
    key->append(reinterpret_cast<const char*>(&state_), sizeof(state_));
  }

 private:
  const RegexDfa* dfa_ = nullptr;
  int32_t state_ = 0;
};

std::shared_ptr<TokenConstraint> MakeRegexConstraint(std::shared_ptr<const TokenTexts> texts,
                                                     std::shared_ptr<const RegexDfa> dfa,
                                                     std::vector<int32_t> end_ids);

}  // namespace ember
