#include "engine/pooling.h"

#include <algorithm>
#include <cmath>

#include "util/check.h"

namespace ember {

const char* PoolingKindName(PoolingKind kind) {
  switch (kind) {
    case PoolingKind::kNone:
      return "none";
    case PoolingKind::kLastToken:
      return "last";
    case PoolingKind::kMean:
      return "mean";
    case PoolingKind::kCls:
      return "cls";
  }
  return "none";
}

bool PoolingReadsEarlyRows(PoolingKind kind) {
  return kind == PoolingKind::kMean || kind == PoolingKind::kCls;
}

PositionRange PooledPositions(PoolingKind kind, int32_t prompt_len, int32_t first_pos,
                              int32_t num_rows) {
  const int32_t end = std::min(first_pos + num_rows, prompt_len);
  PositionRange wanted;  // the positions pooling reads over the whole prompt
  switch (kind) {
    case PoolingKind::kNone:
      return {};
    case PoolingKind::kLastToken:
      wanted = {prompt_len - 1, prompt_len};
      break;
    case PoolingKind::kMean:
      wanted = {0, prompt_len};
      break;
    case PoolingKind::kCls:
      wanted = {0, 1};
      break;
  }
  const int32_t begin = std::max(first_pos, wanted.begin);
  const int32_t stop = std::min(end, wanted.end);
  if (stop <= begin) return {};
  return {begin, stop};
}

void L2Normalize(std::span<float> v) {
  double sum_sq = 0.0;
  for (float x : v) sum_sq += static_cast<double>(x) * x;
  if (sum_sq == 0.0) return;
  const double inv = 1.0 / std::sqrt(sum_sq);
  for (float& x : v) x = static_cast<float>(x * inv);
}

std::vector<float> TruncateEmbedding(std::span<const float> v, int32_t dimensions) {
  CHECK(dimensions >= 1 && static_cast<size_t>(dimensions) <= v.size())
      << "TruncateEmbedding: " << dimensions << " of " << v.size();
  std::vector<float> out(v.begin(), v.begin() + dimensions);
  L2Normalize(out);
  return out;
}

void PoolingAccumulator::Add(std::span<const float> rows, int32_t dim) {
  CHECK(dim > 0 && rows.size() % static_cast<size_t>(dim) == 0);
  if (sum_.empty()) sum_.assign(static_cast<size_t>(dim), 0.0);
  CHECK_EQ(sum_.size(), static_cast<size_t>(dim));
  for (size_t r = 0; r < rows.size(); r += static_cast<size_t>(dim)) {
    for (size_t j = 0; j < sum_.size(); ++j) sum_[j] += rows[r + j];
    ++num_rows_;
  }
}

void PoolingAccumulator::Reset() {
  sum_.clear();
  num_rows_ = 0;
}

std::vector<float> PoolingAccumulator::Finish(const PoolingSpec& spec) const {
  if (num_rows_ == 0) return {};
  // Last-token and CLS pooling add exactly one row; mean divides the sum by the row count.
  const double scale = spec.kind == PoolingKind::kMean ? 1.0 / num_rows_ : 1.0;
  std::vector<float> out(sum_.size());
  for (size_t j = 0; j < sum_.size(); ++j) out[j] = static_cast<float>(sum_[j] * scale);
  if (spec.normalize) L2Normalize(out);
  return out;
}

}  // namespace ember
