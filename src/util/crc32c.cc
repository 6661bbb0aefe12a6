#include "util/crc32c.h"

#include <array>
#include <cstring>

namespace ember {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t SoftwareCrc(const uint8_t* p, size_t n, uint32_t c) {
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t HardwareCrc(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    c64 = __builtin_ia32_crc32di(c64, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  for (; i < n; ++i) c32 = __builtin_ia32_crc32qi(c32, p[i]);
  return c32;
}
bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32c(std::span<const uint8_t> bytes, uint32_t crc) {
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (HasSse42()) return ~HardwareCrc(bytes.data(), bytes.size(), c);
#endif
  return ~SoftwareCrc(bytes.data(), bytes.size(), c);
}

}  // namespace ember
