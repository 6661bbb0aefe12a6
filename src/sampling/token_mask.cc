#include "sampling/token_mask.h"

#include <bit>

namespace ember {

void TokenMask::Build(const TokenConstraint& constraint, Form build_form, int64_t max_listed) {
  form = build_form;
  vocab_size = constraint.vocab_size();
  masked.clear();
  if (form == Form::kBytes) {
    bits.clear();
    num_allowed = constraint.Allowed(allowed);
    return;
  }
  allowed.clear();
  num_allowed = constraint.AllowedBits(bits);
  if (vocab_size - num_allowed > max_listed) return;
  const auto vocab = static_cast<size_t>(vocab_size);
  for (size_t w = 0; w < bits.size(); ++w) {
    uint32_t zeros = ~bits[w];
    if (w + 1 == bits.size() && vocab % 32 != 0) zeros &= (uint32_t{1} << (vocab % 32)) - 1;
    for (; zeros != 0; zeros &= zeros - 1)
      masked.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(std::countr_zero(zeros))));
  }
}

}  // namespace ember
