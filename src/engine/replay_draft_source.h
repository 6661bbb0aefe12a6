// ReplayDraftSource, for tests and benchmarks only (no flag or request reaches it): proposes a
// sequence's known future — the target's own greedy continuation, recorded by a run without
// speculation — with wrong tokens injected, so verification sees kept, rejected and fully
// accepted drafts, and speculation's speed can be measured against a chosen acceptance rate on
// random-weight models of real shapes (bench/spec_bench.cc). A history whose prompt and output
// so far match no recorded run gets no proposal. Header-only; engine thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/draft_source.h"

namespace ember {

class ReplayDraftSource : public DraftSource {
 public:
  struct Run {
    std::vector<int32_t> prompt, continuation;
  };
  // Which proposed tokens are wrong (replaced by the next id): every `error_every`-th token
  // proposed (> 0), or else each token independently with probability 1 - `acceptance` (a hash
  // of its run and position decides, so a rerun proposes the same tokens).
  struct Errors {
    int32_t error_every = 0;
    double acceptance = 1.0;
  };
  ReplayDraftSource(std::vector<Run> runs, int32_t vocab, Errors errors)
      : runs_(std::move(runs)), vocab_(vocab), errors_(errors) {}

  std::string name() const override { return "replay"; }
  void Propose(kv::SeqId, std::span<const int32_t> tokens, int32_t max_tokens,
               std::vector<int32_t>* out) override {
    out->clear();
    for (size_t r = 0; r < runs_.size(); ++r) {
      const auto& [prompt, continuation] = runs_[r];
      if (tokens.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), tokens.begin()))
        continue;
      const size_t done = tokens.size() - prompt.size();
      if (done > continuation.size() ||
          !std::equal(tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), tokens.end(),
                      continuation.begin()))
        continue;
      for (size_t j = done; j < continuation.size() && out->size() < size_t(max_tokens); ++j) {
        int32_t t = continuation[j];
        if (Wrong(r, j)) t = (t + 1) % vocab_;
        out->push_back(t);
      }
      return;
    }
  }

 private:
  bool Wrong(size_t run, size_t position) {
    if (errors_.error_every > 0) return ++proposed_ % errors_.error_every == 0;
    uint64_t h = (uint64_t{run} << 32 | position) * 0x9E3779B97F4A7C15ull;  // splitmix64
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return static_cast<double>(h >> 11) * 0x1.0p-53 >= errors_.acceptance;
  }

  std::vector<Run> runs_;
  int32_t vocab_;
  Errors errors_;
  int64_t proposed_ = 0;
};

}  // namespace ember
