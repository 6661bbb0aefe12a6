// SpecAdapt: one sequence's speculation policy: how many tokens to draft next, from what its
// verifications measured. It estimates the per-token acceptance rate p (a draft token is the
// target's with probability p, given that the ones before it were): a decaying count of the
// tokens kept over the tokens judged (the kept ones and the first rejected one; nothing is
// learnt of the tokens after it). The draft length is the largest k <= K whose k-th token is
// still kept with probability p^k >= kMinKeep (a token drafted past that costs a verification
// row, and for a draft model a draft forward, for little expected gain); at least 1. It starts
// at K (p estimated 1). When drafting does not pay (kMaxMisses verifications in a row accepting
// nothing while the estimate is below kPauseBelow — a good source misses three times in a row
// now and then — or kMaxEmpty steps in a row with nothing to propose) the sequence stops
// drafting for a cool-down that doubles each time it happens again (kMinPause .. kMaxPause
// steps), and is reset by a verification that accepts.
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
  static constexpr double kMinKeep = 0.2;
  static constexpr double kPauseBelow = 0.5;
  // Each verification's weight in the estimate decays by this factor per later verification.
  static constexpr double kDecay = 0.9;

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
  // The estimated acceptance rate p (1 before any verification).
  double Estimate() const { return judged_ > 0 ? kept_ / judged_ : 1.0; }
  // The length the estimate asks for (1..max_draft_).
  int32_t LengthForEstimate() const;

  int32_t max_draft_;
  int32_t draft_len_;
  double kept_ = 0, judged_ = 0;  // decaying counts of draft tokens kept and judged
  int32_t misses_ = 0;  // verifications in a row that accepted nothing
  int32_t empty_ = 0;   // steps in a row with no proposal
  int32_t pause_left_ = 0;
  int32_t next_pause_ = kMinPause;
};

}  // namespace ember
