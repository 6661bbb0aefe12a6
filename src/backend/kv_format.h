// KV-cache formats: the element type of each layer's K/V rows in the paged pool, as chosen by
// --kv-cache-dtype and --kv-cache-dtype-layers (app/common.cc) and resolved per layer once the
// model's layer count is known (ResolveKvFormat). The row layouts and the quantize/dequantize
// twins of each type are in backend/kv_quant.h. Pure values and functions; thread-safe.
//
// kAuto is the backend's own choice (float32 on the CPU; bf16 on CUDA where it has the kernel):
// a resolved KvFormat may still hold it, and Backend::SetKvFormat maps it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace ember {

enum class KvDType : uint8_t { kAuto, kF32, kBF16, kF16, kFP8, kInt8, kInt4 };

// "auto", "f32", "bf16", "f16", "fp8", "int8", "int4" (the flag's spelling).
const char* KvDTypeName(KvDType dtype);
// The flag value as a dtype; errors name `flag` and the value.
Result<KvDType> ParseKvDType(std::string_view value, std::string_view flag);

// One --kv-cache-dtype-layers item: layers [first, last] (inclusive; a negative index counts
// from the end, -1 being the last layer) take `dtype`.
struct KvLayerOverride {
  int32_t first = 0, last = 0;
  KvDType dtype = KvDType::kAuto;
};
// "I=DTYPE" or "I:J=DTYPE" items, comma-separated, e.g. "0:1=bf16,-1=f32"; "" is none.
// Errors name --kv-cache-dtype-layers and the item.
Result<std::vector<KvLayerOverride>> ParseKvLayerOverrides(std::string_view value);

// What the user asked for (unresolved: the layer count is not known yet).
struct KvCacheSpec {
  KvDType dtype = KvDType::kAuto;       // --kv-cache-dtype: every layer's default
  std::vector<KvLayerOverride> layers;  // --kv-cache-dtype-layers, later items win
  // int4 rows rotate K and V by a Hadamard matrix before quantizing (the default). false only
  // for measurement (bench/kv_quality_bench.cc: int4 without rotation); no flag sets it.
  bool rotate_int4 = true;
};

// One dtype per layer.
struct KvFormat {
  std::vector<KvDType> layers;
  bool rotate_int4 = true;
  bool AllAuto() const;
  // "int8", or per run of layers "bf16 (layers 0-1), int8 (2-20), bf16 (21)"; "int4 (no
  // rotation)" when rotate_int4 is off and a layer is int4.
  std::string Describe() const;
};

// The spec over `num_layers` layers; an override naming a layer outside the model is an error
// (naming the flag and item).
Result<KvFormat> ResolveKvFormat(const KvCacheSpec& spec, int32_t num_layers);

}  // namespace ember
