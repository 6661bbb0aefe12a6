// Sampling one row of logits without sorting it: the reference ("CPU twin") of the CUDA
// backend's SampleRows kernel, with the host sampler's semantics (sampling/weighted_row.h):
// weights w = exp((logit - max) / T) (NaN and w < 2^-126 count as zero), rank order (w desc,
// id asc); top-k keeps the first k; top-p then keeps a token iff the kept mass ranked above it
// is < top_p * (mass kept by top-k); min-p drops w < min_p; the draw is the first kept token at
// which the running mass exceeds u * kept mass. Every filter keeps a prefix of the rank order,
// so each step is a search for a weight threshold (binary search over the float's bits, each
// probe one pass of counts/masses over the row) plus a count of ties, which maps onto one GPU
// thread block per row with block-wide reductions. ApplyLogitEditsToRows is the twin of the
// logits processors' kernel (cuda/logit_edits.cu), ApplyTokenMasksToRows of the token masks'
// (cuda/token_masks.cu). Pure functions; thread-safe.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace ember {

// The first index of the row's maximum, NaN never winning, 0 for an all-NaN row: the greedy
// choice of the backends' ArgmaxRows and of the host sampler (sampling/processors.h Argmax).
int32_t RowArgmax(std::span<const float> logits);

// The reference ApplyLogitEdits (Backend::ApplyLogitEdits' semantics, used by the CPU backend and
// by the host sampler): x[e.row * cols + e.token] = ApplyLogitEdit(..., e.op, e.value) for each
// edit in list order. x [rows, cols]. An edit outside x is an error naming it (x unchanged).
Status ApplyLogitEditsToRows(std::span<float> x, int64_t cols, std::span<const LogitEdit> edits);
// The check of ApplyLogitEditsToRows (every backend's): each edit inside [rows, cols], op known.
Status CheckLogitEdits(int64_t rows, int64_t cols, std::span<const LogitEdit> edits);
// The reference ApplyTokenMasks (Backend::ApplyTokenMasks' semantics, the twin of the CUDA
// token_masks kernel): x[m.row * cols + t] = -inf for each column t that m does not allow. x
// [rows, cols]. A mask outside x or of the wrong length is an error naming it (x unchanged).
Status ApplyTokenMasksToRows(std::span<float> x, int64_t cols, std::span<const RowMask> masks);
// The check of ApplyTokenMasksToRows (every backend's): each row inside [0, rows), each mask
// ceil(cols / 32) words.
Status CheckTokenMasks(int64_t rows, int64_t cols, std::span<const RowMask> masks);
// Calls fn(id), ascending, for every id in [0, n) whose bit in `words` (RowMask's layout: bit
// id % 32 of word id / 32, 1 = allowed) is 0: word by word, only the zero bits, so it costs
// O(words + masked ids). The bits past n in the last word are ignored.
template <typename Fn>
void ForEachMaskedId(std::span<const uint32_t> words, size_t n, Fn&& fn) {
  for (size_t w = 0; w < words.size(); ++w) {
    uint32_t zeros = ~words[w];
    if (w + 1 == words.size() && n % 32 != 0) zeros &= (uint32_t{1} << (n % 32)) - 1;
    for (; zeros != 0; zeros &= zeros - 1) fn(w * 32 + static_cast<size_t>(std::countr_zero(zeros)));
  }
}

// The token for one row. logits [vocab]; a row without a finite maximum (all -inf, or +inf
// present) answers its argmax like the host sampler. Requires params.temperature > 0.
int32_t ThresholdSample(std::span<const float> logits, const RowSampling& params);

}  // namespace ember
