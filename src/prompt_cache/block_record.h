// BlockRecord: the on-disk form of one KV block of the prompt cache (one file per block) and the
// chain keys that name it. A block's key is SHA-256 over its parent's key and its token ids; the
// root of a chain is SHA-256 over the model fingerprint and the namespace (adapter namespace +
// per-request cache_salt), so a key names the whole prefix, the model and the namespace at once
// and a 64-bit collision cannot alias two prefixes.
//
// Layout (little-endian), RecordBytes(block_size, payload_bytes) bytes:
//   [0, 8)      magic "EMBERKV1"
//   [8, 12)     u32 kFormatVersion
//   [12, 16)    u32 block_size (token ids that follow)
//   [16, 24)    u64 payload_bytes
//   [24, 32)    u64 namespace tag (the engine's 64-bit cache namespace; for clearing by namespace)
//   [32, 64)    model fingerprint digest
//   [64, 96)    parent key
//   [96, 128)   key
//   [128, ...)  i32 token ids [block_size]
//   then        payload [payload_bytes]: the block's K/V as Backend::CopyKvBlockToHost lays it out
//   last 4      u32 CRC-32C of every byte before it (0 in the RAM tier, which does not seal)
// A record is valid only when its size, every header field, the token ids and the checksum match
// what the reader expects: a torn, truncated, flipped or foreign record is refused, never used.
// Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/sha256.h"

namespace ember::prompt_cache {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kHeaderBytes = 128;

using Key = Sha256Digest;

// Hash of a Key for unordered containers: a SHA-256 digest, so any 8 of its bytes are uniform.
struct KeyHash {
  size_t operator()(const Key& k) const;
};

// What a record must be to be read as a given block: all of it is checked.
struct BlockIdentity {
  Key fingerprint{};
  Key parent{};
  Key key{};
  uint64_t ns = 0;
  std::span<const int32_t> tokens;  // [block_size]
};

// Root of a chain: the model's fingerprint digest, the engine's namespace and the request's
// cache_salt ("" when none).
Key RootKey(const Key& fingerprint, uint64_t ns, const std::string& salt);
// The key of a block with these token ids after `parent`.
Key ChainKey(const Key& parent, std::span<const int32_t> tokens);

int64_t RecordBytes(int32_t block_size, int64_t payload_bytes);

// Where the payload starts in a record of this block size.
inline size_t PayloadOffset(int32_t block_size) {
  return kHeaderBytes + 4 * static_cast<size_t>(block_size);
}
// Writes the header, the token ids and the checksum around a payload already in place at
// PayloadOffset: `record` is RecordBytes(id.tokens.size(), payload_bytes) bytes.
void SealRecord(const BlockIdentity& id, std::span<uint8_t> record);
// SealRecord's two halves: the header and token ids (the checksum field zeroed), and the
// checksum of every byte before it. The RAM tier's records have only the first (they never leave
// the process); a record is checksummed when it goes to disk.
void WriteRecordHeader(const BlockIdentity& id, std::span<uint8_t> record);
void SealChecksum(std::span<uint8_t> record);
// The bytes SealChecksum writes into the record's last 4 (the checksum of every byte before them),
// without writing them: for a record others may be reading (a RAM record spilled to disk).
std::array<uint8_t, 4> ChecksumTail(std::span<const uint8_t> record);
// The whole record for `id` with `payload` (RecordBytes bytes).
std::vector<uint8_t> EncodeRecord(const BlockIdentity& id, std::span<const uint8_t> payload);

// Why a record was refused ("" when valid). `record` is the whole file. kSkip: every field but
// the checksum (the RAM tier's records, written in this process and never sealed).
enum class Checksum { kVerify, kSkip };
std::string VerifyRecord(std::span<const uint8_t> record, const BlockIdentity& expected,
                         int64_t payload_bytes, Checksum checksum = Checksum::kVerify);
// The payload of a record VerifyRecord accepted.
std::span<const uint8_t> RecordPayload(std::span<const uint8_t> record, int32_t block_size,
                                       int64_t payload_bytes);

}  // namespace ember::prompt_cache
