#include "engine/spec_adapt.h"

#include <algorithm>

namespace ember {

void SpecAdapt::Record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  empty_ = 0;
  if (accepted >= drafted) {
    draft_len_ = std::min(draft_len_ + 1, max_draft_);
  } else {
    draft_len_ = std::clamp(accepted + 1, 1, max_draft_);
  }
  if (accepted > 0) {
    misses_ = 0;
    next_pause_ = kMinPause;
    return;
  }
  if (++misses_ >= kMaxMisses) Pause();
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
