#include "sampling/regex_constraint.h"

#include "util/check.h"

namespace ember {

std::shared_ptr<TokenConstraint> MakeRegexConstraint(std::shared_ptr<const TokenTexts> texts,
                                                     std::shared_ptr<const RegexDfa> dfa,
                                                     std::vector<int32_t> end_ids) {
  CHECK(dfa != nullptr);
  const RegexDfa* raw = dfa.get();
  return std::make_shared<ByteMachineConstraint<RegexMachine>>(std::move(texts), RegexMachine(raw),
                                                               std::move(dfa), std::move(end_ids));
}

}  // namespace ember
