#include "model/gguf_quants.h"

#include <array>
#include <bit>
#include <cctype>
#include <cstring>

#include "util/half.h"

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
  CHECK(traits != nullptr) << "GgmlType id " << static_cast<uint32_t>(type)
                           << " is not in the table";
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

// ---- dequantization ----
//
// One function per type decodes one block. Each follows the ggml block struct of its type
// (field order as stored) and computes every value with the same float32 operations, in the
// same order, as gguf-py's numpy reference: the file is built with -ffp-contract=off so that
// `d * q - m` stays a rounded multiply then a rounded subtract, as in numpy.

namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float LoadHalf(const uint8_t* p) { return F16ToF32(LoadU16(p)); }

// Exactly F16ToF32, without branches (so that a row loop vectorizes): the exponent and mantissa
// moved into float32 position and scaled by 2^112 rebias normal and subnormal halves alike
// (the product is exact); infinities and NaNs keep their payload.
float HalfBitsToFloat(uint16_t h) {
  const uint32_t magnitude = static_cast<uint32_t>(h & 0x7FFFu) << 13;
  uint32_t bits = std::bit_cast<uint32_t>(std::bit_cast<float>(magnitude) * 0x1p112f);
  if ((h & 0x7C00u) == 0x7C00u) bits = 0x7F800000u | magnitude;
  return std::bit_cast<float>(bits | static_cast<uint32_t>(h & 0x8000u) << 16);
}

// The 4-bit non-linear codebook of IQ4_NL and IQ4_XS.
constexpr std::array<int8_t, 16> kIq4Values = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};
// E2M1 (FP4) values, doubled so that they are integers; MXFP4's scale is halved to match.
constexpr std::array<int8_t, 16> kFp4DoubledValues = {0, 1,  2,  3,  4,  6,  8,  12,
                                                      0, -1, -2, -3, -4, -6, -8, -12};

// The 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) store element l (< 16) in the
// low nibble of byte l and element l + 16 in its high nibble.

// Q4_0: f16 d, 16 bytes of nibbles; x = d * (q - 8).
void BlockQ4_0(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const uint8_t* qs = block + 2;
  for (int l = 0; l < 16; ++l) {
    out[l] = d * static_cast<float>((qs[l] & 0x0F) - 8);
    out[l + 16] = d * static_cast<float>((qs[l] >> 4) - 8);
  }
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles; x = d * q + m.
void BlockQ4_1(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const float m = LoadHalf(block + 2);
  const uint8_t* qs = block + 4;
  for (int l = 0; l < 16; ++l) {
    out[l] = d * static_cast<float>(qs[l] & 0x0F) + m;
    out[l + 16] = d * static_cast<float>(qs[l] >> 4) + m;
  }
}

// Q5_0: f16 d, 32 high bits (uint32, bit i for element i), 16 bytes of nibbles;
// x = d * (q - 16).
void BlockQ5_0(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const uint32_t high = LoadU32(block + 2);
  const uint8_t* qs = block + 6;
  for (int l = 0; l < 16; ++l) {
    const int q0 = (qs[l] & 0x0F) | static_cast<int>((high >> l) & 1u) << 4;
    const int q1 = (qs[l] >> 4) | static_cast<int>((high >> (l + 16)) & 1u) << 4;
    out[l] = d * static_cast<float>(q0 - 16);
    out[l + 16] = d * static_cast<float>(q1 - 16);
  }
}

// Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of nibbles; x = d * q + m.
void BlockQ5_1(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const float m = LoadHalf(block + 2);
  const uint32_t high = LoadU32(block + 4);
  const uint8_t* qs = block + 8;
  for (int l = 0; l < 16; ++l) {
    const int q0 = (qs[l] & 0x0F) | static_cast<int>((high >> l) & 1u) << 4;
    const int q1 = (qs[l] >> 4) | static_cast<int>((high >> (l + 16)) & 1u) << 4;
    out[l] = d * static_cast<float>(q0) + m;
    out[l + 16] = d * static_cast<float>(q1) + m;
  }
}

// Q8_0: f16 d, 32 int8; x = d * q.
void BlockQ8_0(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(static_cast<int8_t>(block[2 + i])) * d;
}

// Q2_K: 16 bytes of (4-bit min << 4 | 4-bit scale) for 16 sub-blocks of 16, 64 bytes of 2-bit
// quants, f16 d, f16 dmin. Byte l of each 32-byte half h holds elements h*128 + s*32 + l at bits
// 2s. x = (d * scale) * q - (dmin * min).
void BlockQ2_K(const uint8_t* block, float* out) {
  const uint8_t* scales = block;
  const uint8_t* qs = block + 16;
  const float d = LoadHalf(block + 80);
  const float dmin = LoadHalf(block + 82);
  for (int sub = 0; sub < 16; ++sub) {  // elements sub*16 .. sub*16 + 15
    const float dl = d * static_cast<float>(scales[sub] & 0x0F);
    const float ml = dmin * static_cast<float>(scales[sub] >> 4);
    const uint8_t* bytes = qs + (sub / 8) * 32 + (sub % 2) * 16;
    const int shift = 2 * ((sub % 8) / 2);
    float* y = out + sub * 16;
    for (int i = 0; i < 16; ++i) y[i] = dl * static_cast<float>((bytes[i] >> shift) & 3) - ml;
  }
}

// Q3_K: 32 bytes of high bits (element b*32 + l at bit b of byte l, set meaning "no -4"), 64
// bytes of 2-bit quants (as Q2_K), 12 bytes of 16 6-bit scales (low nibbles in bytes 0..7, high
// 2 bits in bytes 8..11), f16 d. x = (d * (scale - 32)) * (q - 4 * !high).
void BlockQ3_K(const uint8_t* block, float* out) {
  const uint8_t* hmask = block;
  const uint8_t* qs = block + 32;
  const uint8_t* packed = block + 96;
  const float d = LoadHalf(block + 108);
  for (int sub = 0; sub < 16; ++sub) {  // elements sub*16 .. sub*16 + 15
    const int scale_low = (sub < 8 ? packed[sub] : packed[sub - 8] >> 4) & 0x0F;
    const int scale_high = (packed[8 + sub % 4] >> (2 * (sub / 4))) & 3;
    const float dl = d * static_cast<float>(static_cast<int8_t>(scale_low | scale_high << 4) - 32);
    const uint8_t* bytes = qs + (sub / 8) * 32 + (sub % 2) * 16;
    const int shift = 2 * ((sub % 8) / 2);
    const uint8_t* high_bits = hmask + (sub % 2) * 16;
    const int high_bit = sub / 2;
    float* y = out + sub * 16;
    for (int i = 0; i < 16; ++i) {
      const int low = (bytes[i] >> shift) & 3;
      const int minus4 = ((high_bits[i] >> high_bit) & 1) ? 0 : 4;
      y[i] = dl * static_cast<float>(low - minus4);
    }
  }
}

// The 8 6-bit scales and mins of Q4_K/Q5_K from their 12 packed bytes: for j < 4 the low 6 bits
// of bytes j (scale) and j+4 (min); for j >= 4 a nibble of byte j+4 plus the top 2 bits of
// bytes j-4 (scale) and j (min).
void UnpackScaleMinK4(const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  for (int j = 0; j < 4; ++j) {
    scale[j] = packed[j] & 0x3F;
    min[j] = packed[j + 4] & 0x3F;
    scale[j + 4] = (packed[j + 8] & 0x0F) | ((packed[j] >> 2) & 0x30);
    min[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 2) & 0x30);
  }
}

// Q4_K: f16 d, f16 dmin, 12 bytes of scales/mins, 128 bytes of nibbles (byte l of 32-byte chunk
// c: element c*64 + l low, c*64 + 32 + l high). 8 sub-blocks of 32: x = (d*sc) * q - (dmin*m).
void BlockQ4_K(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const float dmin = LoadHalf(block + 2);
  uint8_t scale[8], min[8];
  UnpackScaleMinK4(block + 4, scale, min);
  const uint8_t* qs = block + 16;
  for (int sub = 0; sub < 8; ++sub) {  // elements sub*32 .. sub*32 + 31
    const float dl = d * static_cast<float>(scale[sub]);
    const float ml = dmin * static_cast<float>(min[sub]);
    const uint8_t* bytes = qs + (sub / 2) * 32;
    const int shift = 4 * (sub % 2);
    float* y = out + sub * 32;
    for (int l = 0; l < 32; ++l) y[l] = dl * static_cast<float>((bytes[l] >> shift) & 0x0F) - ml;
  }
}

// Q5_K: as Q4_K with 32 bytes of fifth bits before the nibbles (element e's at bit e/32 of
// byte e%32).
void BlockQ5_K(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const float dmin = LoadHalf(block + 2);
  uint8_t scale[8], min[8];
  UnpackScaleMinK4(block + 4, scale, min);
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + 48;
  for (int sub = 0; sub < 8; ++sub) {  // elements sub*32 .. sub*32 + 31
    const float dl = d * static_cast<float>(scale[sub]);
    const float ml = dmin * static_cast<float>(min[sub]);
    const uint8_t* bytes = qs + (sub / 2) * 32;
    const int shift = 4 * (sub % 2);
    float* y = out + sub * 32;
    for (int l = 0; l < 32; ++l) {
      const int q = ((bytes[l] >> shift) & 0x0F) | ((qh[l] >> sub) & 1) << 4;
      y[l] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q6_K: 128 bytes of low nibbles (half h, byte l < 64: elements h*128 + l low and h*128 + 64 + l
// high), 64 bytes of 2-bit highs (half h, byte l < 32: element h*128 + s*32 + l at bits 2s), 16
// int8 scales for sub-blocks of 16, f16 d. x = (d * scale) * (q - 32).
void BlockQ6_K(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = LoadHalf(block + 208);
  for (int sub = 0; sub < 16; ++sub) {  // elements sub*16 .. sub*16 + 15
    const float dl = d * static_cast<float>(scales[sub]);
    const int half = sub / 8, in_half = (sub % 8) * 16;
    const uint8_t* low_bytes = ql + half * 64 + in_half % 64;
    const int low_shift = 4 * (in_half / 64);
    const uint8_t* high_bytes = qh + half * 32 + in_half % 32;
    const int high_shift = 2 * (in_half / 32);
    float* y = out + sub * 16;
    for (int i = 0; i < 16; ++i) {
      const int low = (low_bytes[i] >> low_shift) & 0x0F;
      const int high = (high_bytes[i] >> high_shift) & 3;
      y[i] = dl * static_cast<float>(static_cast<int8_t>(low | high << 4) - 32);
    }
  }
}

// IQ4_NL: f16 d, 16 bytes of codebook indices (as Q4_0's nibbles); x = d * codebook[q].
void BlockIQ4_NL(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const uint8_t* qs = block + 2;
  for (int l = 0; l < 16; ++l) {
    out[l] = d * static_cast<float>(kIq4Values[qs[l] & 0x0F]);
    out[l + 16] = d * static_cast<float>(kIq4Values[qs[l] >> 4]);
  }
}

// IQ4_XS: f16 d, uint16 of 2-bit scale highs (sub-block i at bits 2i), 4 bytes of 4-bit scale
// lows (sub-block i: byte i/2, nibble i%2), 128 bytes of indices (16 per sub-block of 32, laid
// out as IQ4_NL). x = (d * (scale - 32)) * codebook[q].
void BlockIQ4_XS(const uint8_t* block, float* out) {
  const float d = LoadHalf(block);
  const uint16_t scales_high = LoadU16(block + 2);
  const uint8_t* scales_low = block + 4;
  for (int sub = 0; sub < 8; ++sub) {  // elements sub*32 .. sub*32 + 31
    const int low = (scales_low[sub / 2] >> (4 * (sub % 2))) & 0x0F;
    const int high = (scales_high >> (2 * sub)) & 3;
    const float dl = d * static_cast<float>(static_cast<int8_t>(low | high << 4) - 32);
    const uint8_t* qs = block + 8 + sub * 16;
    float* y = out + sub * 32;
    for (int l = 0; l < 16; ++l) {
      y[l] = dl * static_cast<float>(kIq4Values[qs[l] & 0x0F]);
      y[l + 16] = dl * static_cast<float>(kIq4Values[qs[l] >> 4]);
    }
  }
}

// E8M0 scale 2^(e-127), halved because the FP4 table is doubled: 2^(e-128), subnormal for e < 2.
float E8M0HalfToF32(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

// MXFP4: E8M0 exponent byte, 16 bytes of FP4 indices (as Q4_0's nibbles); x = scale * fp4[q].
void BlockMXFP4(const uint8_t* block, float* out) {
  const float d = E8M0HalfToF32(block[0]);
  const uint8_t* qs = block + 1;
  for (int l = 0; l < 16; ++l) {
    out[l] = d * static_cast<float>(kFp4DoubledValues[qs[l] & 0x0F]);
    out[l + 16] = d * static_cast<float>(kFp4DoubledValues[qs[l] >> 4]);
  }
}


using BlockDecoder = void (*)(const uint8_t* block, float* out);

BlockDecoder FindDecoder(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return BlockQ4_0;
    case GgmlType::kQ4_1: return BlockQ4_1;
    case GgmlType::kQ5_0: return BlockQ5_0;
    case GgmlType::kQ5_1: return BlockQ5_1;
    case GgmlType::kQ8_0: return BlockQ8_0;
    case GgmlType::kQ2_K: return BlockQ2_K;
    case GgmlType::kQ3_K: return BlockQ3_K;
    case GgmlType::kQ4_K: return BlockQ4_K;
    case GgmlType::kQ5_K: return BlockQ5_K;
    case GgmlType::kQ6_K: return BlockQ6_K;
    case GgmlType::kIQ4_NL: return BlockIQ4_NL;
    case GgmlType::kIQ4_XS: return BlockIQ4_XS;
    case GgmlType::kMXFP4: return BlockMXFP4;
    default: return nullptr;
  }
}

}  // namespace

void DequantizeRow(GgmlType type, const void* src, int64_t num_elements, float* dst) {
  const GgmlTypeTraits& traits = GgmlTraits(type);
  CHECK(traits.dequantizable) << "DequantizeRow: " << traits.name << " is not dequantizable";
  CHECK(num_elements >= 0 && num_elements % traits.block_size == 0)
      << "DequantizeRow: " << num_elements << " " << traits.name << " elements are not whole "
      << traits.block_size << "-element blocks";
  const auto* bytes = static_cast<const uint8_t*>(src);
  if (type == GgmlType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(num_elements) * sizeof(float));
    return;
  }
  if (type == GgmlType::kF16) {
    for (int64_t i = 0; i < num_elements; ++i) dst[i] = HalfBitsToFloat(LoadU16(bytes + 2 * i));
    return;
  }
  if (type == GgmlType::kBF16) {
    for (int64_t i = 0; i < num_elements; ++i) dst[i] = Bf16ToF32(LoadU16(bytes + 2 * i));
    return;
  }
  const BlockDecoder decode = FindDecoder(type);
  CHECK(decode != nullptr) << "DequantizeRow: no decoder for " << traits.name;
  const int64_t num_blocks = num_elements / traits.block_size;
  for (int64_t b = 0; b < num_blocks; ++b) {
    decode(bytes + b * traits.type_size, dst + b * traits.block_size);
  }
}

}  // namespace ember
