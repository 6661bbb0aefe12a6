// Sha256: FIPS 180-4 SHA-256, incremental. Used where a key must not lie (the prompt cache's
// block-chain keys and the model fingerprint): a 64-bit mix can be made to collide on purpose, a
// SHA-256 chain cannot in practice. Not for bulk data (about 300 MB/s; the prompt cache checks
// record bytes with Crc32c). Value type; thread-compatible.
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

 private:
  void Compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest Sha256Of(std::string_view text);
std::string HexOf(std::span<const uint8_t> bytes);  // lowercase

}  // namespace ember
