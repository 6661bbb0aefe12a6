// Host-side rearrangements of checkpoint tensors whose layout differs from the backend's
// [out_features, in_features] rows (gpt_oss's fused experts). Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace ember {

// A [k, cols] row-major matrix of `elem`-byte elements, read as the x W layout (x [n, k] times
// it), into W^T rows: out [rows, k] with out[j, :] = src[:, first + j * stride]. Element bytes
// are moved unchanged. (gpt_oss: gate_up_proj[e] [d, 2 inter] -> gate rows with first 0,
// stride 2 and up rows with first 1, stride 2; down_proj[e] [inter, d] -> first 0, stride 1.)
std::vector<uint8_t> TransposeColumns(const void* src, int64_t k, int64_t cols, int64_t first,
                                      int64_t stride, int64_t rows, size_t elem);

// MXFP4 (OCP microscaling; gpt-oss checkpoints' experts) of a [rows, k] matrix: `blocks`
// [rows, k / 32, 16] bytes, two FP4 E2M1 values per byte (low nibble first), `scales`
// [rows, k / 32] bytes, each block of 32 values times 2^(scale - 127). Rows first,
// first + stride, ... (count of them) dequantized to bfloat16 (exact but for values below bf16's
// range): out [count, k] as bytes.
std::vector<uint8_t> DequantizeMxfp4Rows(const uint8_t* blocks, const uint8_t* scales, int64_t k,
                                         int64_t first, int64_t stride, int64_t count);

// Rows first, first + stride, ... (count of them) of a matrix of `row_bytes`-byte rows, copied:
// out [count, row_bytes]. (Packed MXFP4 experts: gate_up_proj's even rows are gate's, odd up's.)
std::vector<uint8_t> GatherRows(const uint8_t* src, int64_t row_bytes, int64_t first,
                                int64_t stride, int64_t count);

// The rows [first, first + count) of each range in order, of a matrix of `row_bytes`-byte rows,
// copied into one matrix (qwen3_next: in_proj_qkvz's per-key-head groups regrouped by part).
std::vector<uint8_t> ConcatRowRanges(const uint8_t* src, int64_t row_bytes,
                                     const std::vector<std::pair<int64_t, int64_t>>& ranges);

}  // namespace ember
