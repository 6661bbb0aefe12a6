#include "model/quantize.h"

#include <algorithm>
#include <cctype>

#include "backend/cpu/matmul.h"        // ConvertToF32
#include "backend/cpu/matmul_quant.h"  // QuantizeRow
#include "util/parallel.h"

namespace ember {

Result<std::optional<DType>> ParseQuantizeType(const std::string& name, const std::string& flag) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.empty() || lower == "none") return std::optional<DType>();
  if (lower == "q8_0") return std::optional<DType>(DType::kQ8_0);
  if (lower == "q4_0") return std::optional<DType>(DType::kQ4_0);
  if (lower == "q4_k") return std::optional<DType>(DType::kQ4_K);
  if (lower == "q5_k") return std::optional<DType>(DType::kQ5_K);
  if (lower == "q6_k") return std::optional<DType>(DType::kQ6_K);
  return Status::Error(flag + ": unsupported type '" + name + "' (supported: " +
                       QuantizeTypeNames() + ")");
}

std::string QuantizeTypeNames() { return "q8_0, q4_0, q4_k, q5_k, q6_k"; }

bool IsQuantizedProjection(const std::string& name) {
  static const char* kSuffixes[] = {
      ".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
      ".self_attn.o_proj.weight", ".self_attn.qkv_proj.weight", ".mlp.gate_proj.weight",
      ".mlp.up_proj.weight",      ".mlp.down_proj.weight",      ".mlp.gate_up_proj.weight"};
  if (name.rfind("model.layers.", 0) != 0 || name.find(".experts.") != std::string::npos)
    return false;
  for (const std::string suffix : kSuffixes)
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  return false;
}

Result<std::vector<uint8_t>> QuantizeMatrix(const TensorView& view, DType dtype,
                                            const std::string& flag, size_t threads) {
  const std::string what = flag + " " + DTypeName(dtype) + ": tensor \"" + view.name + "\"";
  if (view.dtype != DType::kF32 && view.dtype != DType::kF16 && view.dtype != DType::kBF16)
    return Status::Error(what + " is " + DTypeName(view.dtype) +
                         "; only F32, F16 and BF16 weights can be quantized");
  const int64_t block = DTypeBlockValues(dtype);
  if (view.shape.size() != 2 || view.shape[1] % block != 0)
    return Status::Error(what + ": needs a 2-D matrix whose rows are a multiple of " +
                         std::to_string(block) + " values" +
                         (view.shape.size() == 2 ? " (rows of " + std::to_string(view.shape[1]) + ")"
                                                 : std::string()));
  const int64_t rows = view.shape[0], cols = view.shape[1];
  const size_t row_bytes = DTypeRowBytes(dtype, cols);
  const size_t src_row_bytes = DTypeRowBytes(view.dtype, cols);
  std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
  ForEachOnThreads(static_cast<size_t>(rows), std::max<size_t>(threads, 1), [&](size_t r) {
    std::vector<float> row(static_cast<size_t>(cols));
    cpu::ConvertToF32(static_cast<const uint8_t*>(view.data) + r * src_row_bytes, view.dtype, cols,
                      row.data());
    cpu::QuantizeRow(dtype, row.data(), cols, out.data() + r * row_bytes);
  });
  return out;
}

}  // namespace ember
