// QuantizeGgmlRows (ggml_quantize.h). Compiled without floating-point contraction so that every
// rounding step of the Q5 quantizers is ggml's (x * id + 16.5 must not become one fma).
#include "model/ggml_quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <optional>

#include "backend/backend.h"
#include "backend/cpu/matmul_quant.h"  // QuantizeRow
#include "util/check.h"
#include "util/half.h"
#include "util/parallel.h"

namespace ember {
namespace {

constexpr int64_t kQ5Block = 32;

// The backend's block DType for a GGUF type it quantizes, or nullopt.
std::optional<DType> BackendBlockType(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return DType::kQ8_0;
    case GgmlType::kQ4_0:
      return DType::kQ4_0;
    case GgmlType::kQ4_K:
      return DType::kQ4_K;
    case GgmlType::kQ5_K:
      return DType::kQ5_K;
    case GgmlType::kQ6_K:
      return DType::kQ6_K;
    default:
      return std::nullopt;
  }
}

// One Q5_0 / Q5_1 block's quants q[32] (5 bits each) as 4 bytes of high bits (bit j: element j)
// and 16 bytes of nibbles (byte j: element j low, element j + 16 high).
void PackQ5(const uint8_t* q, uint8_t* high_bits, uint8_t* nibbles) {
  uint32_t qh = 0;
  for (int j = 0; j < kQ5Block / 2; ++j) {
    const uint8_t lo = q[j], hi = q[j + kQ5Block / 2];
    nibbles[j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
    qh |= static_cast<uint32_t>((lo & 0x10u) >> 4) << j;
    qh |= static_cast<uint32_t>((hi & 0x10u) >> 4) << (j + kQ5Block / 2);
  }
  std::memcpy(high_bits, &qh, sizeof qh);
}

// Q5_0: d = m / -16 with m the value of largest magnitude (sign kept), q = min(31, trunc(x / d +
// 16.5)); block = f16 d, high bits, nibbles.
void QuantizeQ5_0Block(const float* x, uint8_t* block) {
  float amax = 0.0f, signed_max = 0.0f;
  for (int j = 0; j < kQ5Block; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      signed_max = x[j];
    }
  const float d = signed_max / -16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = F32ToF16(d);
  std::memcpy(block, &h, sizeof h);
  uint8_t q[kQ5Block];
  for (int j = 0; j < kQ5Block; ++j)
    q[j] = static_cast<uint8_t>(
        std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f))));
  PackQ5(q, block + 2, block + 6);
}

// Q5_1: d = (max - min) / 31, q = trunc((x - min) / d + 0.5); block = f16 d, f16 min, high bits,
// nibbles.
void QuantizeQ5_1Block(const float* x, uint8_t* block) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int j = 0; j < kQ5Block; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / ((1 << 5) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t hd = F32ToF16(d), hm = F32ToF16(lo);
  std::memcpy(block, &hd, sizeof hd);
  std::memcpy(block + 2, &hm, sizeof hm);
  uint8_t q[kQ5Block];
  for (int j = 0; j < kQ5Block; ++j) q[j] = static_cast<uint8_t>((x[j] - lo) * id + 0.5f);
  PackQ5(q, block + 4, block + 8);
}

void QuantizeRowAs(GgmlType type, const float* x, int64_t cols, uint8_t* out) {
  if (const std::optional<DType> block_type = BackendBlockType(type))
    return cpu::QuantizeRow(*block_type, x, cols, out);
  if (type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1) {
    const size_t block_bytes = static_cast<size_t>(GgmlTraits(type).type_size);
    for (int64_t b = 0; b < cols / kQ5Block; ++b)
      (type == GgmlType::kQ5_0 ? QuantizeQ5_0Block : QuantizeQ5_1Block)(
          x + b * kQ5Block, out + static_cast<size_t>(b) * block_bytes);
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    if (type == GgmlType::kF32) {
      std::memcpy(out + 4 * c, x + c, 4);
      continue;
    }
    const uint16_t h = type == GgmlType::kF16 ? F32ToF16(x[c]) : F32ToBf16(x[c]);
    std::memcpy(out + 2 * c, &h, 2);
  }
}

}  // namespace

bool CanQuantizeGgml(GgmlType type) {
  return BackendBlockType(type).has_value() || type == GgmlType::kF32 || type == GgmlType::kF16 ||
         type == GgmlType::kBF16 || type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
}

std::vector<uint8_t> QuantizeGgmlRows(std::span<const float> values, int64_t cols, GgmlType type,
                                      size_t threads) {
  CHECK(CanQuantizeGgml(type)) << "QuantizeGgmlRows: " << GgmlTypeName(type);
  CHECK(cols > 0 && values.size() % static_cast<size_t>(cols) == 0);
  const Result<uint64_t> row_bytes = GgmlRowBytes(type, cols);
  CHECK(row_bytes.ok()) << row_bytes.message();
  const size_t rows = values.size() / static_cast<size_t>(cols);
  std::vector<uint8_t> out(rows * *row_bytes);
  ForEachOnThreads(rows, std::max<size_t>(threads, 1), [&](size_t r) {
    QuantizeRowAs(type, values.data() + r * static_cast<size_t>(cols), cols,
                  out.data() + r * *row_bytes);
  });
  return out;
}

}  // namespace ember
