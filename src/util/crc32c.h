// Crc32c: CRC-32C (Castagnoli), the checksum of the prompt cache's records. Uses the SSE4.2 crc32
// instruction where the CPU has it (about 8 GB/s: a restore is not slowed by its checks), a table
// otherwise; both give the same value. Detects torn and flipped bytes, not forgery (the records
// are our own writes; the keys that must not lie are SHA-256). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace ember {

// CRC-32C of `bytes`, continuing from `crc` (0 for a new checksum): Crc32c(b, Crc32c(a)) is the
// CRC of a followed by b.
uint32_t Crc32c(std::span<const uint8_t> bytes, uint32_t crc = 0);

}  // namespace ember
