#include "model/gguf_quants.h"

#include <array>
#include <cctype>

namespace ember {

namespace {

constexpr int64_t kQK = 256;  // super-block of the k- and i-quants (QK_K)

// Every type ggml has (live ids). block_size/type_size as ggml defines the block structs.
constexpr std::array<GgmlTypeTraits, 32> kTypes = {{
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::kQ4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::kQ5_0, "Q5_0", 32, 2 + 4 + 16, true},
    {GgmlType::kQ5_1, "Q5_1", 32, 2 + 2 + 4 + 16, true},
    {GgmlType::kQ8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::kQ8_1, "Q8_1", 32, 4 + 32, false},
    {GgmlType::kQ2_K, "Q2_K", kQK, 2 + 2 + kQK / 16 + kQK / 4, true},
    {GgmlType::kQ3_K, "Q3_K", kQK, 2 + kQK / 4 + kQK / 8 + 12, true},
    {GgmlType::kQ4_K, "Q4_K", kQK, 2 + 2 + 12 + kQK / 2, true},
    {GgmlType::kQ5_K, "Q5_K", kQK, 2 + 2 + 12 + kQK / 8 + kQK / 2, true},
    {GgmlType::kQ6_K, "Q6_K", kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16, true},
    {GgmlType::kQ8_K, "Q8_K", kQK, 4 + kQK + kQK / 8, false},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", kQK, 2 + kQK / 4, false},
    {GgmlType::kIQ2_XS, "IQ2_XS", kQK, 2 + kQK / 4 + kQK / 32, false},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", kQK, 2 + kQK / 4 + kQK / 8, false},
    {GgmlType::kIQ1_S, "IQ1_S", kQK, 2 + kQK / 8 + kQK / 16, false},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 2 + 16, true},
    {GgmlType::kIQ3_S, "IQ3_S", kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4, false},
    {GgmlType::kIQ2_S, "IQ2_S", kQK, 2 + kQK / 4 + kQK / 16, false},
    {GgmlType::kIQ4_XS, "IQ4_XS", kQK, 2 + 2 + kQK / 64 + kQK / 2, true},
    {GgmlType::kI8, "I8", 1, 1, false},
    {GgmlType::kI16, "I16", 1, 2, false},
    {GgmlType::kI32, "I32", 1, 4, false},
    {GgmlType::kI64, "I64", 1, 8, false},
    {GgmlType::kF64, "F64", 1, 8, false},
    {GgmlType::kIQ1_M, "IQ1_M", kQK, kQK / 8 + kQK / 16 + kQK / 32, false},
    {GgmlType::kBF16, "BF16", 1, 2, true},
    {GgmlType::kTQ1_0, "TQ1_0", kQK, 2 + 4 * 13, false},
    {GgmlType::kTQ2_0, "TQ2_0", kQK, 2 + kQK / 4, false},
    {GgmlType::kMXFP4, "MXFP4", 32, 1 + 16, true},
}};

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(a[i])) !=
        std::toupper(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

const GgmlTypeTraits* FindGgmlType(uint32_t id) {
  for (const GgmlTypeTraits& traits : kTypes) {
    if (static_cast<uint32_t>(traits.type) == id) return &traits;
  }
  return nullptr;
}

const GgmlTypeTraits& GgmlTraits(GgmlType type) {
  const GgmlTypeTraits* traits = FindGgmlType(static_cast<uint32_t>(type));
  CHECK(traits != nullptr) << "GgmlType id " << static_cast<uint32_t>(type) << " is not in the table";
  return *traits;
}

std::string_view GgmlTypeName(GgmlType type) { return GgmlTraits(type).name; }

std::string DequantizableTypeNames() {
  std::string names;
  for (const GgmlTypeTraits& traits : kTypes) {
    if (!traits.dequantizable) continue;
    if (!names.empty()) names += ", ";
    names += traits.name;
  }
  return names;
}

Result<GgmlType> ParseGgmlTypeName(std::string_view name) {
  for (const GgmlTypeTraits& traits : kTypes) {
    if (EqualsIgnoreCase(traits.name, name)) return traits.type;
  }
  return Status::Error("unknown ggml type '" + std::string(name) + "' (Ember reads " +
                       DequantizableTypeNames() + ")");
}

Result<uint64_t> GgmlRowBytes(GgmlType type, int64_t num_elements) {
  const GgmlTypeTraits& traits = GgmlTraits(type);
  if (num_elements < 0 || num_elements % traits.block_size != 0) {
    return Status::Error("a row of " + std::to_string(num_elements) + " " +
                         std::string(traits.name) + " elements is not a whole number of " +
                         std::to_string(traits.block_size) + "-element blocks");
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(num_elements / traits.block_size),
                             static_cast<uint64_t>(traits.type_size), &bytes)) {
    return Status::Error("a row of " + std::to_string(num_elements) + " " +
                         std::string(traits.name) + " elements overflows a byte count");
  }
  return bytes;
}

}  // namespace ember
