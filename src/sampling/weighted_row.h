// WeightedRow: one processed row of logits turned into unnormalised probabilities
// w = exp((logit - max) / temperature) (the top token has w == 1), organised so that top-k,
// top-p, min-p and the inverse-CDF draw never sort the whole vocabulary.
//
// Rank order is (w desc, id asc); every filter keeps a PREFIX of it. Tokens fall into 4 bands by
// weight ([2^-4, 1], [2^-10, 2^-4), [2^-20, 2^-10), (0, 2^-20)); counts and masses of the bands
// (and per-512-token-block band counts) come from the same vectorised pass that computes the
// weights. A band is only materialised when a walk must look inside it: its members are gathered
// from the blocks that hold any, and a large band is split into 16-per-octave weight buckets
// (segments), each sorted only when a walk enters it. Weights below 2^-126 count as zero.
// Not thread-safe: use one WeightedRow per thread, reused across rows.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace ember {

class WeightedRow {
 public:
  // Rewrites `logits` in place into weights (the span must outlive the filters and Draw).
  // Requires temperature > 0. Returns false, leaving `logits` untouched, when the row has no
  // finite maximum (all -inf, or +inf present): the caller falls back to argmax. NaN -> weight 0.
  bool Build(std::span<float> logits, float temperature);

  // Filters, applied in the order called (the sampler calls top-k, top-p, min-p, as HF does).
  void ApplyTopK(int32_t k);    // k <= 0: off
  void ApplyTopP(float top_p);  // keep the smallest prefix whose mass reaches top_p of the kept
                                // mass (>= 1: off); the top token is always kept
  void ApplyMinP(float min_p);  // drop w < min_p (the top weight is 1); <= 0: off

  // Inverse CDF over the kept tokens in rank order: the first token at which the running mass
  // exceeds u * kept_mass(). u in [0, 1).
  int32_t Draw(double u);

  double kept_mass() const { return kept_mass_; }
  int64_t num_kept() const { return kept_count_; }
  std::vector<int32_t> KeptIds();  // in rank order (tests, debugging)
  std::span<const float> weights() const { return weights_; }

 private:
  static constexpr int kNumBands = 4;  // weighted_row.cc's band loop is unrolled for 4
  static constexpr size_t kBlock = 512;

  struct Segment {
    int64_t begin, end;  // into BandView::ids
    double mass;
    float min_weight;  // every member has w >= min_weight
    bool sorted;
  };
  struct BandView {
    bool built = false;
    std::vector<int32_t> ids;  // grouped by segment, segments in rank order
    std::vector<Segment> segments;
  };
  struct Stop {
    int band, segment;
    int64_t index;
    int32_t id;
  };

  // Visits kept tokens in rank order. A group (a whole band, then a whole segment) that is
  // entirely kept is offered to pass_group(count, mass, min_weight), which returns true to pass
  // it whole (and accounts for it); otherwise the walk descends and calls visit(id, w) per token,
  // which returns true to stop there. Returns the stop, or nullopt when the walk ran off the end.
  template <typename PassGroup, typename Visit>
  std::optional<Stop> Walk(PassGroup&& pass_group, Visit&& visit);
  BandView& View(int band);
  void SortSegment(BandView& view, Segment& segment);
  void CutBefore(const Stop& stop);  // keep the tokens ranked before `stop`
  void CutAfter(const Stop& stop);   // keep the tokens up to and including `stop`

  std::span<float> weights_;
  std::array<int64_t, kNumBands> band_count_{};
  std::array<double, kNumBands> band_mass_{};
  std::vector<int32_t> block_band_count_;  // [num_blocks, kNumBands]
  std::array<BandView, kNumBands> views_;

  // Kept prefix: bands < end_band_ whole; end_band_ whole if end_full_, else its segments
  // < end_segment_ and the first end_index_ tokens of segment end_segment_ (sorted).
  int end_band_ = 0;
  bool end_full_ = true;
  int end_segment_ = 0;
  int64_t end_index_ = 0;
  double kept_mass_ = 0.0;
  int64_t kept_count_ = 0;
};

}  // namespace ember
