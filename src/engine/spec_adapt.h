// SpecAdapt: one sequence's speculation policy: how many tokens to draft next, from what its
// verifications measured. A full acceptance grows the draft length by one (up to the configured
// K); a rejection sets it to what would have sufficed (accepted + 1, at least 1). When drafting
// does not pay (kMaxMisses verifications in a row accepting nothing, or kMaxEmpty steps in a row
// with nothing to propose) the sequence stops drafting for a cool-down that doubles each time it
// happens again (kMinPause .. kMaxPause steps), and is reset by a verification that accepts.
// A plain value owned by its Sequence; engine thread only.
#pragma once

#include <cstdint>

namespace ember {

class SpecAdapt {
 public:
  static constexpr int32_t kMaxMisses = 3;
  static constexpr int32_t kMaxEmpty = 16;
  static constexpr int32_t kMinPause = 8;
  static constexpr int32_t kMaxPause = 256;

  explicit SpecAdapt(int32_t max_draft = 0) : max_draft_(max_draft), draft_len_(max_draft) {}

  // Drafting is paused (cool-down steps left).
  bool paused() const { return pause_left_ > 0; }
  // One step passes for a paused sequence.
  void Tick() {
    if (pause_left_ > 0) --pause_left_;
  }
  // The next draft's length (1..max_draft).
  int32_t draft_len() const { return draft_len_; }
  // A verification of `drafted` > 0 tokens kept `accepted` of them.
  void Record(int32_t drafted, int32_t accepted);
  // A step where the source had nothing to propose.
  void RecordEmpty();

 private:
  void Pause();

  int32_t max_draft_;
  int32_t draft_len_;
  int32_t misses_ = 0;  // verifications in a row that accepted nothing
  int32_t empty_ = 0;   // steps in a row with no proposal
  int32_t pause_left_ = 0;
  int32_t next_pause_ = kMinPause;
};

}  // namespace ember
