// The CPU attention's reader of quantized KV rows: DequantizeKvRow (backend/kv_quant.h) in AVX2
// (+F16C) for head dims that are a multiple of 8, bit-identical to it (the same products of the
// same stored values); other head dims call it. Pure function; thread-safe.
#pragma once

#include <cstdint>

#include "backend/kv_format.h"

namespace ember::cpu {

// out [head_dim] = the values of the stored row `in` of `dtype` (kF32 included).
void DequantizeKvRowFast(KvDType dtype, const uint8_t* in, int32_t head_dim, float* out);

}  // namespace ember::cpu
