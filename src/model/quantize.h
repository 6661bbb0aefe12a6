// Weight quantization, at load (`--quantize q8_0|q4_0|q4_k|q5_k|q6_k`) and by `ember quantize`
// (model/gguf_export.h): a float checkpoint's (F32, F16, BF16) linear projections -- the attention
// q/k/v/o (or fused qkv) and dense MLP gate/up/down (or fused gate_up) matrices -- become
// block-quantized (DType kQ8_0 / kQ4_0 / kQ4_K / kQ5_K / kQ6_K) with ggml's reference quantizers
// (backend/cpu/matmul_quant.h, kquant_quantize.h); embeddings, lm_head, norms, biases, routers and
// MoE experts keep their type. Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/safetensors.h"
#include "util/status.h"

namespace ember {

// "q8_0" -> kQ8_0, "q4_0" -> kQ4_0, "q4_k" -> kQ4_K, ... (GGUF's names, any case); "" or "none" -> nullopt; anything
// else an error naming `flag` and the supported names.
Result<std::optional<DType>> ParseQuantizeType(const std::string& name, const std::string& flag);
std::string QuantizeTypeNames();  // "q8_0, q4_0, q4_k, q5_k, q6_k"

// True for the Ember (Hugging Face) tensor names --quantize converts (see the header comment).
bool IsQuantizedProjection(const std::string& name);

// The 2-D F32/F16/BF16 `view` [rows, cols] as rows of `dtype` blocks (cols a multiple of the
// type's block: 32, or 256 for the k-quants), quantized
// on up to `threads` threads. Errors (naming `flag` and the tensor) for another dtype or shape.
Result<std::vector<uint8_t>> QuantizeMatrix(const TensorView& view, DType dtype,
                                            const std::string& flag, size_t threads);

}  // namespace ember
