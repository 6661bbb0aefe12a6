#include "engine/spec_adapt.h"

#include <algorithm>

namespace ember {

void SpecAdapt::Record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  empty_ = 0;
  kept_ = kept_ * kDecay + accepted;
  judged_ = judged_ * kDecay + accepted + (accepted < drafted ? 1 : 0);
  draft_len_ = LengthForEstimate();
  if (accepted > 0) {
    misses_ = 0;
    next_pause_ = kMinPause;
    return;
  }
  if (++misses_ >= kMaxMisses && Estimate() < kPauseBelow) Pause();
}

int32_t SpecAdapt::LengthForEstimate() const {
  const double p = Estimate();
  int32_t k = 1;
  double keep = p;  // p^k: the k-th token's chance to be kept
  while (k < max_draft_ && keep * p >= kMinKeep) {
    keep *= p;
    ++k;
  }
  return k;
}

void SpecAdapt::RecordEmpty() {
  if (++empty_ >= kMaxEmpty) Pause();
}

void SpecAdapt::Pause() {
  pause_left_ = next_pause_;
  next_pause_ = std::min(next_pause_ * 2, kMaxPause);
  misses_ = 0;
  empty_ = 0;
  draft_len_ = std::max(1, max_draft_ / 2);
}

}  // namespace ember
