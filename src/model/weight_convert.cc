#include "model/weight_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/check.h"
#include "util/half.h"

namespace ember {

std::vector<uint8_t> TransposeColumns(const void* src, int64_t k, int64_t cols, int64_t first,
                                      int64_t stride, int64_t rows, size_t elem) {
  CHECK(k > 0 && rows > 0 && stride > 0 && first >= 0 && first + (rows - 1) * stride < cols)
      << "columns " << first << " + " << stride << " * [0, " << rows << ") of " << cols;
  CHECK(elem == 1 || elem == 2 || elem == 4);
  const auto* in = static_cast<const uint8_t*>(src);
  std::vector<uint8_t> out(static_cast<size_t>(rows * k) * elem);
  // Tiles of 64 x 64 so both sides stay in cache (a gpt-oss-20b layer is ~1.6 GB of experts).
  constexpr int64_t kTile = 64;
  for (int64_t j0 = 0; j0 < rows; j0 += kTile) {
    const int64_t j1 = std::min(rows, j0 + kTile);
    for (int64_t r0 = 0; r0 < k; r0 += kTile) {
      const int64_t r1 = std::min(k, r0 + kTile);
      for (int64_t j = j0; j < j1; ++j) {
        const uint8_t* col = in + static_cast<size_t>(first + j * stride) * elem;
        uint8_t* dst = out.data() + static_cast<size_t>(j * k) * elem;
        for (int64_t r = r0; r < r1; ++r)
          std::memcpy(dst + static_cast<size_t>(r) * elem,
                      col + static_cast<size_t>(r * cols) * elem, elem);
      }
    }
  }
  return out;
}

std::vector<uint8_t> DequantizeMxfp4Rows(const uint8_t* blocks, const uint8_t* scales, int64_t k,
                                         int64_t first, int64_t stride, int64_t count) {
  CHECK(k % 32 == 0 && count > 0 && stride > 0 && first >= 0) << "k " << k;
  static constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int64_t groups = k / 32;
  std::vector<uint8_t> out(static_cast<size_t>(count * k) * 2);
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j * stride;
    for (int64_t g = 0; g < groups; ++g) {
      const int exponent = static_cast<int>(scales[row * groups + g]) - 127;
      const uint8_t* b = blocks + (row * groups + g) * 16;
      uint16_t* o = dst + j * k + g * 32;
      for (int i = 0; i < 16; ++i) {
        o[2 * i] = F32ToBf16(std::ldexp(kE2M1[b[i] & 0x0f], exponent));
        o[2 * i + 1] = F32ToBf16(std::ldexp(kE2M1[b[i] >> 4], exponent));
      }
    }
  }
  return out;
}

std::vector<uint8_t> GatherRows(const uint8_t* src, int64_t row_bytes, int64_t first,
                                int64_t stride, int64_t count) {
  CHECK(row_bytes > 0 && count > 0 && stride > 0 && first >= 0);
  std::vector<uint8_t> out(static_cast<size_t>(count * row_bytes));
  for (int64_t j = 0; j < count; ++j)
    std::memcpy(out.data() + j * row_bytes, src + (first + j * stride) * row_bytes,
                static_cast<size_t>(row_bytes));
  return out;
}

std::vector<uint8_t> ConcatRowRanges(const uint8_t* src, int64_t row_bytes,
                                     const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<uint8_t> out;
  for (const auto& [first, count] : ranges)
    out.insert(out.end(), src + first * row_bytes, src + (first + count) * row_bytes);
  return out;
}

}  // namespace ember
