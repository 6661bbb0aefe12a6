#include "engine/draft_source.h"

#include <algorithm>

#include "util/check.h"

namespace ember {

void ProposeFromHistory(std::span<const int32_t> tokens, int32_t min_ngram, int32_t max_ngram,
                        int32_t max_tokens, std::vector<int32_t>* out) {
  out->clear();
  const auto size = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return;
  for (int64_t n = std::min<int64_t>(max_ngram, size - 1); n >= min_ngram; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(size - n));
    // Earlier occurrences, latest first: the first with max_tokens followers, else the one with
    // the most followers (the earliest).
    int64_t best = -1;
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      best = start;
      if (size - (start + n) >= max_tokens) break;
    }
    if (best < 0) continue;
    const int64_t follow = best + n;  // < size: the suffix itself starts later
    const int64_t count = std::min<int64_t>(max_tokens, size - follow);
    out->assign(tokens.begin() + follow, tokens.begin() + follow + count);
    return;
  }
}

void DraftSource::ProposeAll(std::span<const DraftJob> jobs,
                             std::span<const kv::SeqId> /*running*/) {
  for (const DraftJob& job : jobs) Propose(job.seq, job.tokens, job.max_tokens, job.out);
}

NgramDraftSource::NgramDraftSource(int32_t min_ngram, int32_t max_ngram)
    : min_ngram_(min_ngram), max_ngram_(max_ngram) {
  CHECK(min_ngram >= 1 && min_ngram <= max_ngram) << min_ngram << ".." << max_ngram;
}

void NgramDraftSource::Propose(kv::SeqId /*seq*/, std::span<const int32_t> tokens,
                               int32_t max_tokens, std::vector<int32_t>* out) {
  ProposeFromHistory(tokens, min_ngram_, max_ngram_, max_tokens, out);
}

}  // namespace ember
