#include "sampling/weighted_row.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "sampling/row_math.h"
#include "util/check.h"

namespace ember {
namespace {

// Lower weight bound of each band; band b holds kBandLow[b] <= w < kBandLow[b - 1].
constexpr float kBandLow[4] = {0x1.0p-4f, 0x1.0p-10f, 0x1.0p-20f,
                               std::numeric_limits<float>::min()};
// Bands bigger than this are split into weight buckets before anything is sorted.
constexpr size_t kSmallBand = 1024;

int BandOf(float w) {
  return w >= kBandLow[0] ? 0 : w >= kBandLow[1] ? 1 : w >= kBandLow[2] ? 2 : w >= kBandLow[3] ? 3 : 4;
}
// 16 buckets per octave, ordered like the weights (w > 0).
uint32_t BucketOf(float w) { return std::bit_cast<uint32_t>(w) >> 19; }

constexpr size_t kLanes = 16;

// w[i] = exp((w[i] - max) * inv_temperature) for i < n (a multiple of kLanes), and per lane the
// count and mass of weights >= each band's lower bound. A separate function with restrict
// pointers so that GCC vectorises it (the band loop is unrolled by hand for the same reason).
[[gnu::noinline]] void WeighLanes(float* __restrict w, size_t n, float max, float inv_temperature,
                int32_t (*__restrict counts)[kLanes], float (*__restrict masses)[kLanes]) {
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
  // lower bound, and the matching masses (float lanes per block, summed in double).
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
    size_t i = vector_end;
    for (; i < end; ++i) {
      const float x = ExpNonPositive((w[i] - max) * inv_temperature);
      w[i] = x;
      for (int band = 0; band < kNumBands; ++band) {
        const bool in = x >= kBandLow[band];
        counts[band][0] += in;
        masses[band][0] += in ? x : 0.0f;
      }
    }
    int32_t previous = 0;
    for (int band = 0; band < kNumBands; ++band) {
      int32_t count = 0;
      double mass = 0.0;
      for (size_t j = 0; j < kLanes; ++j) {
        count += counts[band][j];
        mass += masses[band][j];
      }
      block_band_count_[block * kNumBands + static_cast<size_t>(band)] = count - previous;
      previous = count;
      count_at_least[static_cast<size_t>(band)] += count;
      mass_at_least[static_cast<size_t>(band)] += mass;
    }
  }
  for (size_t band = 0; band < kNumBands; ++band) {
    band_count_[band] = count_at_least[band] - (band ? count_at_least[band - 1] : 0);
    band_mass_[band] = mass_at_least[band] - (band ? mass_at_least[band - 1] : 0.0);
    views_[band].built = false;
  }
  CHECK_GT(band_count_[0], 0);  // the max has weight exactly 1

  end_band_ = kNumBands - 1;
  while (band_count_[static_cast<size_t>(end_band_)] == 0) --end_band_;
  end_full_ = true;
  end_segment_ = 0;
  end_index_ = 0;
  kept_count_ = count_at_least[kNumBands - 1];
  kept_mass_ = mass_at_least[kNumBands - 1];
  return true;
}

WeightedRow::BandView& WeightedRow::View(int band) {
  BandView& view = views_[static_cast<size_t>(band)];
  if (view.built) return view;
  view.built = true;
  view.ids.clear();
  view.segments.clear();
  const float* w = weights_.data();
  for (size_t block = 0; block * kBlock < weights_.size(); ++block) {
    if (block_band_count_[block * kNumBands + static_cast<size_t>(band)] == 0) continue;
    const size_t end = std::min(weights_.size(), (block + 1) * kBlock);
    for (size_t i = block * kBlock; i < end; ++i) {
      if (BandOf(w[i]) == band) view.ids.push_back(static_cast<int32_t>(i));
    }
  }
  const auto n = static_cast<int64_t>(view.ids.size());
  CHECK_EQ(n, band_count_[static_cast<size_t>(band)]);
  if (view.ids.size() <= kSmallBand) {
    view.segments.push_back({0, n, band_mass_[static_cast<size_t>(band)],
                             kBandLow[band], false});
    return view;
  }
  // Counting sort by weight bucket, highest bucket first; ids stay ascending within a bucket.
  uint32_t low = ~0u, high = 0;
  for (int32_t id : view.ids) {
    low = std::min(low, BucketOf(w[id]));
    high = std::max(high, BucketOf(w[id]));
  }
  const size_t num_buckets = high - low + 1;
  std::vector<int64_t> offset(num_buckets + 1, 0);
  std::vector<double> mass(num_buckets, 0.0);
  for (int32_t id : view.ids) {
    const size_t slot = high - BucketOf(w[id]);
    ++offset[slot + 1];
    mass[slot] += w[id];
  }
  for (size_t slot = 0; slot < num_buckets; ++slot) {
    if (offset[slot + 1] > 0) {
      const auto bucket = static_cast<uint32_t>(high - slot);
      view.segments.push_back({offset[slot], offset[slot] + offset[slot + 1], mass[slot],
                               std::bit_cast<float>(bucket << 19), false});
    }
    offset[slot + 1] += offset[slot];
  }
  std::vector<int32_t> grouped(view.ids.size());
  for (int32_t id : view.ids) grouped[static_cast<size_t>(offset[high - BucketOf(w[id])]++)] = id;
  view.ids.swap(grouped);
  return view;
}

void WeightedRow::SortSegment(BandView& view, Segment& segment) {
  if (segment.sorted) return;
  const float* w = weights_.data();
  std::sort(view.ids.begin() + segment.begin, view.ids.begin() + segment.end,
            [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
  segment.sorted = true;
}

template <typename PassGroup, typename Visit>
std::optional<WeightedRow::Stop> WeightedRow::Walk(PassGroup&& pass_group, Visit&& visit) {
  for (int band = 0; band <= end_band_; ++band) {
    const auto b = static_cast<size_t>(band);
    if (band_count_[b] == 0) continue;
    const bool band_whole = band < end_band_ || end_full_;
    if (band_whole && pass_group(band_count_[b], band_mass_[b], kBandLow[b])) continue;
    BandView& view = View(band);
    const int last_segment =
        band_whole ? static_cast<int>(view.segments.size()) - 1 : end_segment_;
    for (int s = 0; s <= last_segment; ++s) {
      Segment& segment = view.segments[static_cast<size_t>(s)];
      const bool segment_whole = band_whole || s < end_segment_;
      const int64_t n = segment_whole ? segment.end - segment.begin : end_index_;
      if (n == 0) continue;
      if (segment_whole && pass_group(n, segment.mass, segment.min_weight)) continue;
      SortSegment(view, segment);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t id = view.ids[static_cast<size_t>(segment.begin + i)];
        if (visit(id, weights_[static_cast<size_t>(id)])) return Stop{band, s, i, id};
      }
    }
  }
  return std::nullopt;
}

void WeightedRow::CutBefore(const Stop& stop) {
  end_band_ = stop.band;
  end_full_ = false;
  end_segment_ = stop.segment;
  end_index_ = stop.index;
}

void WeightedRow::CutAfter(const Stop& stop) {
  CutBefore(stop);
  ++end_index_;
}

void WeightedRow::ApplyTopK(int32_t k) {
  if (k <= 0 || k >= kept_count_) return;
  int64_t passed = 0;
  double mass = 0.0;
  const auto stop = Walk(
      [&](int64_t n, double m, float) {
        if (passed + n >= k) return false;
        passed += n;
        mass += m;
        return true;
      },
      [&](int32_t, float w) {
        mass += w;
        return ++passed == k;
      });
  CHECK(stop.has_value());
  CutAfter(*stop);
  kept_count_ = k;
  kept_mass_ = mass;
}

void WeightedRow::ApplyTopP(float top_p) {
  if (top_p >= 1.0f) return;
  // Keep a token iff the kept mass strictly above it is < p * total (vLLM drops a token when
  // the ascending cumulative sum up to it is <= 1 - p); so the top token is always kept.
  const double target = static_cast<double>(top_p) * kept_mass_;
  double above = 0.0;
  int64_t passed = 0;
  const auto stop = Walk(
      [&](int64_t n, double m, float) {
        if (above + m >= target) return false;
        above += m;
        passed += n;
        return true;
      },
      [&](int32_t, float w) {
        if (above >= target) return true;
        above += w;
        ++passed;
        return false;
      });
  if (!stop) return;
  CutBefore(*stop);
  kept_count_ = passed;
  kept_mass_ = above;
}

void WeightedRow::ApplyMinP(float min_p) {
  if (min_p <= 0.0f) return;
  double mass = 0.0;
  int64_t passed = 0;
  const auto stop = Walk(
      [&](int64_t n, double m, float min_weight) {
        if (min_weight < min_p) return false;
        mass += m;
        passed += n;
        return true;
      },
      [&](int32_t, float w) {
        if (w < min_p) return true;
        mass += w;
        ++passed;
        return false;
      });
  if (!stop) return;
  CutBefore(*stop);  // never empty: the top token has w == 1 >= min_p
  kept_count_ = passed;
  kept_mass_ = mass;
}

int32_t WeightedRow::Draw(double u) {
  double target = u * kept_mass_;
  int32_t last = -1;
  const auto stop = Walk(
      [&](int64_t, double m, float) {
        if (target >= m) {
          target -= m;
          return true;
        }
        return false;
      },
      [&](int32_t id, float w) {
        if (target < w) return true;
        target -= w;
        last = id;
        return false;
      });
  if (stop) return stop->id;
  // Only rounding gets here (u close to 1, group masses summed in id order): the last kept token.
  return last >= 0 && last == KeptIds().back() ? last : KeptIds().back();
}

std::vector<int32_t> WeightedRow::KeptIds() {
  std::vector<int32_t> kept;
  Walk([](int64_t, double, float) { return false; },
       [&](int32_t id, float) {
         kept.push_back(id);
         return false;
       });
  return kept;
}

}  // namespace ember
