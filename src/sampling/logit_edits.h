// The logits processors of one row (logit_bias, repetition / presence / frequency penalties, DRY,
// the min_tokens mask) as a sparse list of LogitEdits (backend/logit_edit.h), so they can be
// applied where the logits live: Sample() applies the same list on the host, a backend applies it
// before ArgmaxRows / SampleRows. Same result bit for bit as processors.h's passes in Sample()'s
// order (bias, penalties, DRY, mask): each element's edits are grouped and kept in that order, and
// edits of distinct elements commute. Thread-safe (scratch is thread_local).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/logit_edit.h"
#include "sampling/sampler.h"

namespace ember {

// Appends row `row`'s edits for the sequence's next token to `edits`:
//   - one kAdd per logit_bias entry (a repeated id keeps its entries, in request order);
//   - per id seen so far (state.seen_ids(), with penalties on): kRepetition when
//     repetition_penalty != 1, then kSubtract by frequency * count + presence when its output
//     count > 0 and that amount is not +0 (an identity) (after that id's kAdds);
//   - per DRY candidate (dry.h, over state.dry_window()): one kSubtract by its penalty, after
//     that id's other edits;
//   - while fewer than min_tokens tokens were accepted: one kMask per distinct stop id, and no
//     other edit for that id (the mask overwrites whatever came before).
// Size: at most |logit_bias| + 2 * |seen ids| + |DRY candidates| + |stop ids| edits of 16 bytes.
// seen ids are the distinct prompt ids (repetition penalty only) plus the distinct output ids, so
// a 4k-token prompt with a repetition penalty costs up to ~64 KiB per row per step. Appends
// nothing when the request has no processors (the common case).
void AppendLogitEdits(const SamplingParams& params, const SamplerState& state, int32_t row,
                      std::vector<LogitEdit>& edits);

}  // namespace ember
