// Float rows -> a GGUF type's bytes, for `ember quantize` (gguf_export.h): the float types (F32,
// F16, BF16) by rounding, the backend's block types (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) by the ggml
// reference quantizers of backend/cpu/matmul_quant.h, and Q5_0 / Q5_1 -- the types llama.cpp's
// mixed recipes fall back to when rows are not whole 256-value super-blocks -- by ports of
// ggml's quantize_row_q5_0_ref / _q5_1_ref, which llama-quantize runs without an importance
// matrix (so the blocks are byte-identical to its). Pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/gguf_quants.h"

namespace ember {

// True for the types QuantizeGgmlRows writes.
bool CanQuantizeGgml(GgmlType type);

// `values` [rows, cols] (row-major) as `rows` rows of `type`, on up to `threads` threads. CHECKs
// CanQuantizeGgml(type) and that cols is a whole number of the type's blocks (callers size the
// tensor first: GgmlRowBytes).
std::vector<uint8_t> QuantizeGgmlRows(std::span<const float> values, int64_t cols, GgmlType type,
                                      size_t threads);

}  // namespace ember
