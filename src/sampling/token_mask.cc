#include "sampling/token_mask.h"

#include "backend/threshold_sampling.h"  // ForEachMaskedId

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
  ForEachMaskedId(bits, static_cast<size_t>(vocab_size),
                  [&](size_t id) { masked.push_back(static_cast<int32_t>(id)); });
}

}  // namespace ember
