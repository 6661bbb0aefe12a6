// GGML tensor types as GGUF files store them: the type ids, names, block layouts (elements per
// block, bytes per block) and a row-wise dequantization to float32 for the types Ember reads.
// The tables are constant and the functions pure; safe to call from any thread.
// Dequantization follows the ggml block definitions and is bit-exact against gguf-py's numpy
// reference (scripts/gguf-dequant-reference.py, src/model/testdata/gguf_dequant_golden.txt).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "util/status.h"

namespace ember {

// The ids are the on-disk values (ggml's `enum ggml_type`); gaps are ids ggml has retired.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // as GGUF tools spell it: "Q4_K", "IQ4_XS", "BF16"
  int64_t block_size;     // elements per block (1 for plain types)
  int64_t type_size;      // bytes per block
  bool dequantizable;     // DequantizeRow supports it (Ember reads it)
};

// The traits of a known type id, or nullptr (ids outside ggml's enum, retired ids).
const GgmlTypeTraits* FindGgmlType(uint32_t id);
const GgmlTypeTraits& GgmlTraits(GgmlType type);
std::string_view GgmlTypeName(GgmlType type);
// "Q4_K", "q4_k", "iq4_xs", "bf16" ... (case-insensitive); error lists the readable names.
Result<GgmlType> ParseGgmlTypeName(std::string_view name);
// Names of the dequantizable types, comma-separated (for error messages).
std::string DequantizableTypeNames();

// Bytes of a row of `num_elements` elements; error when the count is not a whole number of
// blocks (naming the type and its block size) or the byte count overflows.
Result<uint64_t> GgmlRowBytes(GgmlType type, int64_t num_elements);

// Dequantizes `num_elements` elements (a whole number of blocks) of `type` at `src` into `dst`.
// `src` needs no alignment. CHECKs that the type is dequantizable and the count is whole blocks:
// callers validate files first (GgufFile::Open refuses other types and partial blocks).
void DequantizeRow(GgmlType type, const void* src, int64_t num_elements, float* dst);

}  // namespace ember
