// Sha256: FIPS 180-4 SHA-256, incremental. Used where a key must not lie (the prompt cache's
// block-chain keys and the model fingerprint): a 64-bit mix can be made to collide on purpose, a
// SHA-256 chain cannot in practice. On x86-64 CPUs with the SHA extensions (SHA-NI, chosen at run
// time) about 1.7 GB/s, else about 290 MB/s (one core of this box): not for bulk checks (the prompt cache checks record
// bytes with Crc32c). Value type; thread-compatible.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ember {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  Sha256& Update(std::span<const uint8_t> bytes);
  Sha256& Update(std::string_view text) {
    return Update({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  }
  Sha256& UpdateU64(uint64_t value);  // 8 bytes, little-endian
  Sha256Digest Finish();  // the object must not be updated afterwards
  // Tests only (not thread-safe): false makes every Sha256 use the portable compression, which
  // must give the same digests as the SHA-NI one.
  static void AllowHardwareForTesting(bool allowed);

 private:
  void Compress(const uint8_t* data, size_t blocks);  // whole 64-byte blocks
  void CompressPortable(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest Sha256Of(std::string_view text);
std::string HexOf(std::span<const uint8_t> bytes);  // lowercase

}  // namespace ember
