#include "backend/threshold_sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

namespace ember {
namespace {

// The row's weights as the kernel computes them, and its passes.
class Row {
 public:
  Row(std::span<const float> logits, float max, float temperature)
      : logits_(logits), max_(max), inv_t_(1.0f / temperature) {}

  float W(size_t i) const {
    const float l = logits_[i];
    if (std::isnan(l)) return 0.0f;
    const float w = std::exp((l - max_) * inv_t_);
    return w < std::numeric_limits<float>::min() ? 0.0f : w;
  }
  // Count and mass of the weights > t (strict) or >= t.
  void Above(float t, bool strict, int64_t* count, double* mass) const {
    *count = 0;
    *mass = 0.0;
    for (size_t i = 0; i < logits_.size(); ++i) {
      const float w = W(i);
      if (strict ? w > t : w >= t) {
        ++*count;
        *mass += w;
      }
    }
  }
  // The id of the r-th (1-based) token of weight exactly t, in id order.
  int32_t NthTie(float t, int64_t r) const {
    int32_t last = -1;
    for (size_t i = 0; i < logits_.size(); ++i) {
      if (W(i) == t) {
        last = static_cast<int32_t>(i);
        if (--r == 0) break;
      }
    }
    return last;
  }
  size_t size() const { return logits_.size(); }

 private:
  std::span<const float> logits_;
  float max_, inv_t_;
};

// The largest positive float t in (0, 1] with pred(t); pred must be monotone (true below some
// point) and true at `low`.
template <typename Pred>
float LargestWhere(float low, Pred pred) {
  uint32_t lo = std::bit_cast<uint32_t>(low), hi = std::bit_cast<uint32_t>(1.0f);
  if (pred(1.0f)) return 1.0f;
  while (hi - lo > 1) {  // pred(lo) true, pred(hi) false
    const uint32_t mid = lo + (hi - lo) / 2;
    if (pred(std::bit_cast<float>(mid)))
      lo = mid;
    else
      hi = mid;
  }
  return std::bit_cast<float>(lo);
}

// A rank-order prefix: every weight > t, then the first `ties` tokens of weight t (id order).
struct Prefix {
  float t = 0.0f;
  int64_t ties = 0;
};

// The first n tokens of the rank order (n >= 1, n <= tokens with w > 0).
Prefix FirstN(const Row& row, int64_t n) {
  const float t = LargestWhere(std::numeric_limits<float>::min(), [&](float x) {
    int64_t c;
    double m;
    row.Above(x, false, &c, &m);
    return c >= n;
  });
  int64_t above;
  double mass;
  row.Above(t, true, &above, &mass);
  return {t, n - above};
}

// Tokens of weight exactly t.
int64_t Ties(const Row& row, float t) {
  int64_t at_least, above;
  double m;
  row.Above(t, false, &at_least, &m);
  row.Above(t, true, &above, &m);
  return at_least - above;
}

double Mass(const Row& row, const Prefix& p) {
  int64_t c;
  double m;
  row.Above(p.t, true, &c, &m);
  return m + static_cast<double>(p.ties) * p.t;
}

// Mass of the part of `kept` with weight >= x.
double MassAtLeast(const Row& row, const Prefix& kept, float x) {
  if (x > kept.t) {
    int64_t c;
    double m;
    row.Above(x, false, &c, &m);
    return m;
  }
  return Mass(row, kept);
}

}  // namespace

int32_t RowArgmax(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[static_cast<size_t>(best)]))
      best = static_cast<int32_t>(i);
  return best < 0 ? 0 : best;
}

int32_t ThresholdSample(std::span<const float> logits, const RowSampling& params) {
  float max = -std::numeric_limits<float>::infinity();
  for (float l : logits)
    if (l > max) max = l;
  if (!std::isfinite(max)) return RowArgmax(logits);
  const Row row(logits, max, params.temperature);

  int64_t positive;
  double total;
  row.Above(0.0f, true, &positive, &total);
  // Top-k, then top-p on its mass, then min-p: each a prefix; the kept set is the shortest.
  int64_t kept_len = positive;
  Prefix kept = {0.0f, 0};  // every w > 0
  if (params.top_k > 0 && params.top_k < positive) {
    kept = FirstN(row, params.top_k);
    kept_len = params.top_k;
  }
  if (params.top_p < 1.0f) {
    const double target = static_cast<double>(params.top_p) * Mass(row, kept);
    // The level where the kept mass ranked above a token first reaches the target.
    const float t = LargestWhere(kept.t > 0.0f ? kept.t : std::numeric_limits<float>::min(),
                                 [&](float x) { return MassAtLeast(row, kept, x) >= target; });
    int64_t above;
    double mass_above;
    row.Above(t, true, &above, &mass_above);
    // Ties at t kept while the mass before them is < target.
    int64_t ties = static_cast<int64_t>(std::ceil((target - mass_above) / t));
    const int64_t available = t == kept.t ? kept.ties : Ties(row, t);
    ties = std::clamp<int64_t>(ties, 1, std::max<int64_t>(available, 1));
    kept_len = std::min(kept_len, above + ties);
  }
  if (params.min_p > 0.0f) {
    int64_t at_least;
    double m;
    row.Above(params.min_p, false, &at_least, &m);
    kept_len = std::min(kept_len, std::max<int64_t>(at_least, 1));
  }
  if (kept_len < positive) kept = FirstN(row, kept_len);

  const double target = params.u * Mass(row, kept);
  // The level of the first token where the running mass exceeds the target.
  const float t = LargestWhere(kept.t > 0.0f ? kept.t : std::numeric_limits<float>::min(),
                               [&](float x) { return MassAtLeast(row, kept, x) > target; });
  int64_t above;
  double mass_above;
  row.Above(t, true, &above, &mass_above);
  const int64_t available = t == kept.t ? kept.ties : Ties(row, t);
  int64_t r = static_cast<int64_t>(std::floor((target - mass_above) / t)) + 1;
  r = std::clamp<int64_t>(r, 1, std::max<int64_t>(available, 1));
  return row.NthTie(t, r);
}

Status CheckLogitEdits(int64_t rows, int64_t cols, std::span<const LogitEdit> edits) {
  for (size_t i = 0; i < edits.size(); ++i) {
    const LogitEdit& e = edits[i];
    if (e.row < 0 || e.row >= rows || e.token < 0 || e.token >= cols ||
        static_cast<uint32_t>(e.op) > static_cast<uint32_t>(LogitEditOp::kMask)) {
      return Status::Error("logit edit " + std::to_string(i) + " (row " + std::to_string(e.row) +
                           ", token " + std::to_string(e.token) + ", op " +
                           std::to_string(static_cast<int32_t>(e.op)) + ") is outside [" +
                           std::to_string(rows) + ", " + std::to_string(cols) + "] logits");
    }
  }
  return Status::Ok();
}

Status ApplyLogitEditsToRows(std::span<float> x, int64_t cols, std::span<const LogitEdit> edits) {
  const int64_t rows = cols > 0 ? static_cast<int64_t>(x.size()) / cols : 0;
  EMBER_RETURN_IF_ERROR(CheckLogitEdits(rows, cols, edits));
  for (const LogitEdit& e : edits) {
    float& v = x[static_cast<size_t>(e.row * cols + e.token)];
    v = ApplyLogitEdit(v, e.op, e.value);
  }
  return Status::Ok();
}

Status CheckTokenMasks(int64_t rows, int64_t cols, std::span<const RowMask> masks) {
  const auto words = static_cast<size_t>((cols + 31) / 32);
  for (size_t i = 0; i < masks.size(); ++i) {
    const RowMask& m = masks[i];
    if (m.row < 0 || m.row >= rows || m.bits.size() != words) {
      return Status::Error("token mask " + std::to_string(i) + " (row " + std::to_string(m.row) +
                           ", " + std::to_string(m.bits.size()) + " words) does not fit [" +
                           std::to_string(rows) + ", " + std::to_string(cols) + "] logits (" +
                           std::to_string(words) + " words a row)");
    }
  }
  return Status::Ok();
}

Status ApplyTokenMasksToRows(std::span<float> x, int64_t cols, std::span<const RowMask> masks) {
  const int64_t rows = cols > 0 ? static_cast<int64_t>(x.size()) / cols : 0;
  EMBER_RETURN_IF_ERROR(CheckTokenMasks(rows, cols, masks));
  const auto n = static_cast<size_t>(cols);
  for (const RowMask& m : masks) {
    float* row = x.data() + static_cast<size_t>(m.row) * n;
    ForEachMaskedId(m.bits, n, [&](size_t id) {
      row[id] = ApplyLogitEdit(row[id], LogitEditOp::kMask, 0.0f);
    });
  }
  return Status::Ok();
}

}  // namespace ember
