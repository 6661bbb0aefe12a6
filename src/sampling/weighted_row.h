// WeightedRow: one processed row of logits turned into unnormalised probabilities
// w = exp((logit - max) / temperature) (the top token has w == 1), organised so that top-k,
// top-p, min-p and the inverse-CDF draw never sort the whole vocabulary.
//
// Rank order is (w desc, id asc); every filter keeps a PREFIX of it, recorded as the first
// excluded token. Tokens fall into 4 bands by weight ([2^-4, 1], [2^-10, 2^-4), [2^-20, 2^-10),
// (0, 2^-20)) whose counts and masses (and per-512-token-block counts) come from the same
// vectorised pass that computes the weights. The weight intervals form a tree expanded only where
// a walk must look inside: a small band is gathered into a leaf; a large band is split into
// weight buckets by two passes over its blocks (histogram, then ids placed per child); a large
// child is counting-sorted into 16-per-octave buckets; a leaf is sorted only when a walk enters
// it. Top-k is a selection pass instead (a k-best buffer, or nth_element for large k), after
// which the kept set is an explicit sorted list. Weights below 2^-126 count as zero.
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
  // The kept ids in ascending id order: one pass over the row (or a sort of the explicit top-k
  // list), no tree walk. For filters that need the whole kept set (distribution_filters.h).
  void KeptIdsByIdOrder(std::vector<int32_t>* ids) const;
  std::span<const float> weights() const { return weights_; }
  size_t num_tree_nodes() const { return nodes_.size(); }  // bands + expanded nodes (tests)

 private:
  static constexpr int kNumBands = 4;
  static constexpr size_t kBlock = 512;

  // A weight interval [low, high) of the row. Inner nodes list children (consecutive in nodes_,
  // descending weight); leaves own ids_[ids_begin, ids_end), sorted in rank order once visited.
  struct Node {
    float low, high;
    int64_t count;
    double mass;
    int band, depth;
    bool expanded = false, leaf = false, sorted = false;
    int32_t first_child = 0, num_children = 0;
    int64_t ids_begin = 0, ids_end = 0;
  };
  struct Stop {
    int32_t id;
    float weight;
    int64_t index;  // position in top_ when the kept set is explicit
  };

  // Visits kept tokens in rank order. A node entirely kept is first offered to
  // pass_group(count, mass, low), which returns true to pass it whole (and accounts for it);
  // otherwise the walk descends and calls visit(id, w) per token, which returns true to stop.
  // Returns the stop, or nullopt when the walk ran off the end of the kept tokens.
  template <typename PassGroup, typename Visit>
  std::optional<Stop> Walk(PassGroup& pass_group, Visit& visit);
  template <typename PassGroup, typename Visit>
  std::optional<Stop> WalkNode(int32_t index, PassGroup& pass_group, Visit& visit);
  void Expand(int32_t index);
  void GatherBand(int32_t index);  // a small band becomes a leaf: gather its ids
  void Split(int32_t index);       // a large band: weight-bucket children with their ids
  void Bucketize(int32_t index);   // a large non-band node: 16-per-octave leaf children
  bool Kept(int32_t id, float w) const {
    return !has_cut_ || w > cut_weight_ || (w == cut_weight_ && id < cut_id_);
  }
  void CutBefore(const Stop& stop) {
    if (explicit_) top_.resize(static_cast<size_t>(stop.index));
    has_cut_ = true;
    cut_weight_ = stop.weight;
    cut_id_ = stop.id;
  }

  std::span<float> weights_;
  std::vector<int32_t> block_band_count_;  // [num_blocks, kNumBands]
  std::vector<Node> nodes_;                // [0, kNumBands) are the bands
  std::vector<int32_t> ids_;               // nodes' ids (bands have none)
  std::vector<int32_t> scratch_ids_;

  // After top-k the kept set is explicit: top_ holds it in rank order and walks use it instead
  // of the tree (top-k is a selection over the row, never a tree walk).
  bool explicit_ = false;
  std::vector<int32_t> top_;
  // Kept tokens: those ranked before (cut_weight_, cut_id_), or all when !has_cut_.
  bool has_cut_ = false;
  float cut_weight_ = 0.0f;
  int32_t cut_id_ = 0;
  double kept_mass_ = 0.0;
  int64_t kept_count_ = 0;
};

}  // namespace ember
