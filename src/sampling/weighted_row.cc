#include "sampling/weighted_row.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <limits>

#include "sampling/row_math.h"
#include "util/check.h"

namespace ember {
namespace {

// Lower weight bound of each band; band b holds kBandLow[b] <= w < kBandLow[b - 1].
constexpr float kBandLow[4] = {0x1.0p-4f, 0x1.0p-10f, 0x1.0p-20f,
                               std::numeric_limits<float>::min()};
constexpr float kAboveAll = 2.0f;  // upper bound of band 0 (every weight is <= 1)
// Nodes with more tokens than this are split (bands) or bucketed (others) before sorting.
constexpr int64_t kSmallNode = 1024;
// Top-k up to this uses a k-best buffer (one comparison per token); larger k, nth_element.
constexpr int32_t kTopKBuffer = 256;
constexpr size_t kLanes = 16;

// 16 buckets per octave, ordered like the weights (w > 0).
uint32_t BucketOf(float w) {
  return std::bit_cast<uint32_t>(w) >> 19;
}

// w[i] = exp((w[i] - max) * inv_temperature) for i < n (a multiple of kLanes), and per lane the
// count and mass of weights >= each band's lower bound. A separate non-inlined function with
// restrict pointers and the band loop unrolled by hand: otherwise GCC does not vectorise it.
[[gnu::noinline]] void WeighLanes(float* __restrict w, size_t n, float max, float inv_temperature,
                                  int32_t (*__restrict counts)[kLanes],
                                  float (*__restrict masses)[kLanes]) {
  static_assert(std::size(kBandLow) == 4);
  for (size_t i = 0; i < n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const float x = ExpNonPositive((w[i + j] - max) * inv_temperature);
      w[i + j] = x;
      const float in0 = x >= kBandLow[0] ? x : 0.0f;
      const float in1 = x >= kBandLow[1] ? x : 0.0f;
      const float in2 = x >= kBandLow[2] ? x : 0.0f;
      const float in3 = x >= kBandLow[3] ? x : 0.0f;
      counts[0][j] += in0 > 0.0f;
      masses[0][j] += in0;
      counts[1][j] += in1 > 0.0f;
      masses[1][j] += in1;
      counts[2][j] += in2 > 0.0f;
      masses[2][j] += in2;
      counts[3][j] += in3 > 0.0f;
      masses[3][j] += in3;
    }
  }
}

}  // namespace

bool WeightedRow::Build(std::span<float> logits, float temperature) {
  CHECK(temperature > 0.0f);
  const float max = RowMax(logits);  // NaN never wins
  if (!std::isfinite(max)) return false;
  weights_ = logits;

  // One vectorised pass: weights, plus per block the number of tokens at or above each band's
  // lower bound, and the matching masses (float lanes within a block, summed in double).
  const float inv_temperature = 1.0f / temperature;
  float* w = logits.data();
  const size_t size = logits.size();
  const size_t num_blocks = (size + kBlock - 1) / kBlock;
  block_band_count_.assign(num_blocks * kNumBands, 0);
  std::array<int64_t, kNumBands> count_at_least{};
  std::array<double, kNumBands> mass_at_least{};
  for (size_t block = 0; block < num_blocks; ++block) {
    const size_t begin = block * kBlock, end = std::min(size, begin + kBlock);
    int32_t counts[kNumBands][kLanes] = {};
    float masses[kNumBands][kLanes] = {};
    const size_t vector_end = begin + (end - begin) / kLanes * kLanes;
    WeighLanes(w + begin, vector_end - begin, max, inv_temperature, counts, masses);
    for (size_t i = vector_end; i < end; ++i) {
      const float x = ExpNonPositive((w[i] - max) * inv_temperature);
      w[i] = x;
      for (int band = 0; band < kNumBands; ++band) {
        const bool in = x >= kBandLow[band];
        counts[band][0] += in;
        masses[band][0] += in ? x : 0.0f;
      }
    }
    int32_t previous = 0;
    for (size_t band = 0; band < kNumBands; ++band) {
      int32_t count = 0;
      double mass = 0.0;
      for (size_t j = 0; j < kLanes; ++j) {
        count += counts[band][j];
        mass += masses[band][j];
      }
      block_band_count_[block * kNumBands + band] = count - previous;
      previous = count;
      count_at_least[band] += count;
      mass_at_least[band] += mass;
    }
  }

  nodes_.clear();
  ids_.clear();
  explicit_ = false;
  top_.clear();
  for (int band = 0; band < kNumBands; ++band) {
    const auto b = static_cast<size_t>(band);
    Node node;
    node.low = kBandLow[b];
    node.high = band == 0 ? kAboveAll : kBandLow[b - 1];
    node.count = count_at_least[b] - (band ? count_at_least[b - 1] : 0);
    node.mass = mass_at_least[b] - (band ? mass_at_least[b - 1] : 0.0);
    node.band = band;
    node.depth = 0;
    nodes_.push_back(node);
  }
  CHECK_GT(nodes_[0].count, 0);  // the max has weight exactly 1
  has_cut_ = false;
  kept_count_ = count_at_least[kNumBands - 1];
  kept_mass_ = mass_at_least[kNumBands - 1];
  return true;
}

void WeightedRow::Expand(int32_t index) {
  Node& node = nodes_[static_cast<size_t>(index)];
  node.expanded = true;
  if (node.depth == 0) {
    if (node.count > kSmallNode) {
      Split(index);
    } else {
      GatherBand(index);
    }
  } else if (node.count > kSmallNode) {
    Bucketize(index);
  } else {
    node.leaf = true;
  }
}

void WeightedRow::GatherBand(int32_t index) {
  const Node node = nodes_[static_cast<size_t>(index)];
  const float* w = weights_.data();
  const size_t size = weights_.size();
  const size_t begin = ids_.size();
  ids_.resize(begin + static_cast<size_t>(node.count) + kBlock);  // slack for branchless writes
  size_t n = begin;
  for (size_t block = 0; block * kBlock < size; ++block) {
    if (block_band_count_[block * kNumBands + static_cast<size_t>(node.band)] == 0) continue;
    const size_t end = std::min(size, (block + 1) * kBlock);
    for (size_t i = block * kBlock; i < end; ++i) {
      ids_[n] = static_cast<int32_t>(i);
      n += (w[i] >= node.low) & (w[i] < node.high);
    }
  }
  CHECK_EQ(static_cast<int64_t>(n - begin), node.count);
  ids_.resize(n);
  Node& leaf = nodes_[static_cast<size_t>(index)];
  leaf.leaf = true;
  leaf.ids_begin = static_cast<int64_t>(begin);
  leaf.ids_end = static_cast<int64_t>(n);
}

void WeightedRow::Split(int32_t index) {
  const Node node = nodes_[static_cast<size_t>(index)];
  // Children are buckets of the float bit pattern: 4 per octave in the upper bands, one per two
  // octaves in the tail band (which spans ~106 octaves), so at most ~64 children.
  const int shift = node.band == kNumBands - 1 ? 24 : 21;
  const float top = std::min(node.high, std::nextafter(1.0f, 2.0f));  // weights are <= 1
  const uint32_t first = std::bit_cast<uint32_t>(node.low) >> shift;
  const uint32_t last = std::bit_cast<uint32_t>(std::nextafter(top, 0.0f)) >> shift;
  const size_t num_buckets = last - first + 1;
  // Pass 1: one histogram per lane (i % kLanes), so consecutive tokens never wait on the same
  // counter. Slot = (last - bucket): highest weights first.
  std::vector<int64_t> counts(num_buckets * kLanes, 0);
  std::vector<double> masses(num_buckets * kLanes, 0.0);
  const float* w = weights_.data();
  const size_t size = weights_.size();
  auto in_node = [&](float x) { return x >= node.low && x < node.high; };
  auto slot_of = [&](float x) { return last - (std::bit_cast<uint32_t>(x) >> shift); };
  for (size_t block = 0; block * kBlock < size; ++block) {
    if (block_band_count_[block * kNumBands + static_cast<size_t>(node.band)] == 0) continue;
    const size_t end = std::min(size, (block + 1) * kBlock);
    for (size_t i = block * kBlock; i < end; ++i) {
      const float x = w[i];
      if (!in_node(x)) continue;
      const size_t lane_slot = slot_of(x) * kLanes + i % kLanes;
      ++counts[lane_slot];
      masses[lane_slot] += x;
    }
  }
  // Pass 2: place each member's id in its child's range; each (child, lane) has its own cursor
  // for the same reason (leaves are sorted when visited, so the order inside does not matter).
  std::vector<int64_t> cursor(num_buckets * kLanes);
  int64_t next = static_cast<int64_t>(ids_.size());
  const auto first_child = static_cast<int32_t>(nodes_.size());
  for (size_t slot = 0; slot < num_buckets; ++slot) {
    Node child;
    child.ids_begin = next;
    child.count = 0;
    child.mass = 0.0;
    for (size_t j = 0; j < kLanes; ++j) {
      cursor[slot * kLanes + j] = next;
      next += counts[slot * kLanes + j];
      child.count += counts[slot * kLanes + j];
      child.mass += masses[slot * kLanes + j];
    }
    child.ids_end = next;
    if (child.count == 0) continue;
    const auto bucket = static_cast<uint32_t>(last - slot);
    child.low = std::max(node.low, std::bit_cast<float>(bucket << shift));
    child.high = std::min(node.high, std::bit_cast<float>((bucket + 1) << shift));
    child.band = node.band;
    child.depth = node.depth + 1;
    nodes_.push_back(child);
  }
  CHECK_EQ(next - static_cast<int64_t>(ids_.size()), node.count);
  ids_.resize(static_cast<size_t>(next));
  for (size_t block = 0; block * kBlock < size; ++block) {
    if (block_band_count_[block * kNumBands + static_cast<size_t>(node.band)] == 0) continue;
    const size_t end = std::min(size, (block + 1) * kBlock);
    for (size_t i = block * kBlock; i < end; ++i) {
      const float x = w[i];
      if (!in_node(x)) continue;
      ids_[static_cast<size_t>(cursor[slot_of(x) * kLanes + i % kLanes]++)] =
          static_cast<int32_t>(i);
    }
  }
  Node& parent = nodes_[static_cast<size_t>(index)];
  parent.first_child = first_child;
  parent.num_children = static_cast<int32_t>(nodes_.size()) - first_child;
}

void WeightedRow::Bucketize(int32_t index) {
  const Node node = nodes_[static_cast<size_t>(index)];
  const float* w = weights_.data();
  const int64_t begin = node.ids_begin, end = node.ids_end;
  // Counting sort of the node's ids by 16-per-octave weight bucket, highest first. Each
  // non-empty bucket becomes a leaf child.
  uint32_t low = ~0u, high = 0;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t bucket = BucketOf(w[ids_[static_cast<size_t>(i)]]);
    low = std::min(low, bucket);
    high = std::max(high, bucket);
  }
  // Per-lane counters and cursors, as in Split.
  const size_t num_buckets = high - low + 1;
  std::vector<int64_t> counts(num_buckets * kLanes, 0);
  std::vector<double> masses(num_buckets * kLanes, 0.0);
  for (int64_t i = begin; i < end; ++i) {
    const int32_t id = ids_[static_cast<size_t>(i)];
    const size_t lane_slot = (high - BucketOf(w[id])) * kLanes + static_cast<size_t>(i) % kLanes;
    ++counts[lane_slot];
    masses[lane_slot] += w[id];
  }
  std::vector<int64_t> cursor(num_buckets * kLanes);
  int64_t next = 0;
  const auto first_child = static_cast<int32_t>(nodes_.size());
  for (size_t slot = 0; slot < num_buckets; ++slot) {
    Node child;
    child.ids_begin = begin + next;
    child.count = 0;
    child.mass = 0.0;
    for (size_t j = 0; j < kLanes; ++j) {
      cursor[slot * kLanes + j] = next;
      next += counts[slot * kLanes + j];
      child.count += counts[slot * kLanes + j];
      child.mass += masses[slot * kLanes + j];
    }
    child.ids_end = begin + next;
    if (child.count == 0) continue;
    const auto bucket = static_cast<uint32_t>(high - slot);
    child.low = std::max(node.low, std::bit_cast<float>(bucket << 19));
    child.high = std::min(node.high, std::bit_cast<float>((bucket + 1) << 19));
    child.band = node.band;
    child.depth = node.depth + 1;
    child.expanded = child.leaf = true;
    nodes_.push_back(child);
  }
  scratch_ids_.resize(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) {
    const int32_t id = ids_[static_cast<size_t>(i)];
    const size_t lane_slot = (high - BucketOf(w[id])) * kLanes + static_cast<size_t>(i) % kLanes;
    scratch_ids_[static_cast<size_t>(cursor[lane_slot]++)] = id;
  }
  std::copy(scratch_ids_.begin(), scratch_ids_.end(), ids_.begin() + begin);
  Node& parent = nodes_[static_cast<size_t>(index)];
  parent.first_child = first_child;
  parent.num_children = static_cast<int32_t>(nodes_.size()) - first_child;
}

template <typename PassGroup, typename Visit>
std::optional<WeightedRow::Stop> WeightedRow::WalkNode(int32_t index, PassGroup& pass_group,
                                                       Visit& visit) {
  {
    const Node& node = nodes_[static_cast<size_t>(index)];
    if (node.count == 0 || (has_cut_ && node.high <= cut_weight_)) return std::nullopt;
    const bool whole = !has_cut_ || node.low > cut_weight_;
    if (whole && pass_group(node.count, node.mass, node.low)) return std::nullopt;
    if (!node.expanded) Expand(index);  // may grow nodes_: `node` is not used below
  }
  Node& node = nodes_[static_cast<size_t>(index)];
  if (!node.leaf) {
    const int32_t first = node.first_child, last = first + node.num_children;
    for (int32_t child = first; child < last; ++child) {
      if (auto stop = WalkNode(child, pass_group, visit)) return stop;
    }
    return std::nullopt;
  }
  const auto first = ids_.begin() + node.ids_begin, last = ids_.begin() + node.ids_end;
  const float* w = weights_.data();
  if (!node.sorted) {
    std::sort(first, last,
              [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
    node.sorted = true;
  }
  for (auto it = first; it != last; ++it) {
    const float weight = w[*it];
    if (!Kept(*it, weight)) break;
    if (visit(*it, weight)) return Stop{*it, weight, 0};
  }
  return std::nullopt;
}

template <typename PassGroup, typename Visit>
std::optional<WeightedRow::Stop> WeightedRow::Walk(PassGroup& pass_group, Visit& visit) {
  if (explicit_) {
    for (size_t i = 0; i < top_.size(); ++i) {
      const int32_t id = top_[i];
      const float weight = weights_[static_cast<size_t>(id)];
      if (visit(id, weight)) return Stop{id, weight, static_cast<int64_t>(i)};
    }
    return std::nullopt;
  }
  for (int32_t band = 0; band < kNumBands; ++band) {
    if (auto stop = WalkNode(band, pass_group, visit)) return stop;
  }
  return std::nullopt;
}

void WeightedRow::ApplyTopK(int32_t k) {
  if (k <= 0 || k >= kept_count_) return;
  const float* w = weights_.data();
  const auto ranks_before = [w](int32_t a, int32_t b) {
    return w[a] > w[b] || (w[a] == w[b] && a < b);
  };
  std::vector<int32_t> best;
  if (explicit_) {
    best.assign(top_.begin(), top_.begin() + k);
  } else if (k <= kTopKBuffer) {
    // One pass keeping the k best in rank order. Ids arrive ascending, so a later token beats
    // the current k-th only with a strictly larger weight.
    best.reserve(static_cast<size_t>(k) + 1);
    float kth = 0.0f;  // weight of best.back() once full; weights <= 0 never qualify
    for (size_t i = 0; i < weights_.size(); ++i) {
      const float weight = w[i];
      if (!(weight > kth) || weight < std::numeric_limits<float>::min()) continue;
      const auto id = static_cast<int32_t>(i);
      if (!Kept(id, weight)) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), id, ranks_before), id);
      if (best.size() > static_cast<size_t>(k)) best.pop_back();
      if (best.size() == static_cast<size_t>(k)) kth = w[best.back()];
    }
  } else {
    for (size_t i = 0; i < weights_.size(); ++i) {
      const auto id = static_cast<int32_t>(i);
      if (w[i] >= std::numeric_limits<float>::min() && Kept(id, w[i])) best.push_back(id);
    }
    std::nth_element(best.begin(), best.begin() + k, best.end(), ranks_before);
    best.resize(static_cast<size_t>(k));
    std::sort(best.begin(), best.end(), ranks_before);
  }
  CHECK_EQ(best.size(), static_cast<size_t>(k));
  top_ = std::move(best);
  explicit_ = true;
  kept_count_ = k;
  kept_mass_ = 0.0;
  for (int32_t id : top_) kept_mass_ += w[id];
}

void WeightedRow::ApplyTopP(float top_p) {
  if (top_p >= 1.0f) return;
  // Keep a token iff the kept mass strictly above it is < p * total (vLLM drops a token when
  // the ascending cumulative sum up to it is <= 1 - p); so the top token is always kept.
  const double target = static_cast<double>(top_p) * kept_mass_;
  double above = 0.0;
  int64_t passed = 0;
  auto pass_group = [&](int64_t n, double m, float) {
    if (above + m >= target) return false;
    above += m;
    passed += n;
    return true;
  };
  auto visit = [&](int32_t, float w) {
    if (above >= target) return true;
    above += w;
    ++passed;
    return false;
  };
  const auto stop = Walk(pass_group, visit);
  if (!stop) return;
  CutBefore(*stop);
  kept_count_ = passed;
  kept_mass_ = above;
}

void WeightedRow::ApplyMinP(float min_p) {
  if (min_p <= 0.0f) return;
  double mass = 0.0;
  int64_t passed = 0;
  auto pass_group = [&](int64_t n, double m, float low) {
    if (low < min_p) return false;
    mass += m;
    passed += n;
    return true;
  };
  auto visit = [&](int32_t, float w) {
    if (w < min_p) return true;
    mass += w;
    ++passed;
    return false;
  };
  const auto stop = Walk(pass_group, visit);
  if (!stop) return;
  CutBefore(*stop);  // never empties the set: the top token has w == 1 >= min_p
  kept_count_ = passed;
  kept_mass_ = mass;
}

int32_t WeightedRow::Draw(double u) {
  double target = u * kept_mass_;
  auto pass_group = [&](int64_t, double m, float) {
    if (target < m) return false;
    target -= m;
    return true;
  };
  auto visit = [&](int32_t, float w) {
    if (target < w) return true;
    target -= w;
    return false;
  };
  if (const auto stop = Walk(pass_group, visit)) return stop->id;
  // Only rounding gets here (u close to 1; group masses are summed in id order, not rank
  // order): take the last kept token.
  return KeptIds().back();
}

std::vector<int32_t> WeightedRow::KeptIds() {
  std::vector<int32_t> kept;
  auto pass_group = [](int64_t, double, float) { return false; };
  auto visit = [&](int32_t id, float) {
    kept.push_back(id);
    return false;
  };
  Walk(pass_group, visit);
  return kept;
}

void WeightedRow::KeptIdsByIdOrder(std::vector<int32_t>* ids) const {
  ids->clear();
  if (explicit_) {
    ids->assign(top_.begin(), top_.end());
    std::sort(ids->begin(), ids->end());
    return;
  }
  const float min_weight = kBandLow[kNumBands - 1];  // below it a weight counts as zero
  for (size_t i = 0; i < weights_.size(); ++i) {
    const float w = weights_[i];
    const auto id = static_cast<int32_t>(i);
    if (w >= min_weight && Kept(id, w)) ids->push_back(id);
  }
}

}  // namespace ember
