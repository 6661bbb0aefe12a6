#include "prompt_cache/block_record.h"

#include <algorithm>
#include <cstring>

#include "util/check.h"
#include "util/crc32c.h"

namespace ember::prompt_cache {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'E', 'R', 'K', 'V', '1'};

template <typename T>
void Put(std::span<uint8_t> out, size_t at, T value) {
  static_assert(std::is_integral_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i)
    out[at + i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
}

template <typename T>
T Get(std::span<const uint8_t> in, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(in[at + i]) << (8 * i);
  return static_cast<T>(v);
}

bool Equal(std::span<const uint8_t> in, size_t at, const Key& key) {
  return std::equal(key.begin(), key.end(), in.begin() + static_cast<std::ptrdiff_t>(at));
}

}  // namespace

size_t KeyHash::operator()(const Key& k) const {
  size_t h;
  std::memcpy(&h, k.data(), sizeof(h));
  return h;
}

Key RootKey(const Key& fingerprint, uint64_t ns, const std::string& salt) {
  const Key salt_digest = Sha256Of(salt);
  return Sha256()
      .Update("ember prompt-cache root v1")
      .Update(fingerprint)
      .UpdateU64(ns)
      .Update(salt_digest)
      .Finish();
}

Key ChainKey(const Key& parent, std::span<const int32_t> tokens) {
  Sha256 h;
  h.Update(parent).UpdateU64(tokens.size());
  for (int32_t t : tokens) h.UpdateU64(static_cast<uint32_t>(t));
  return h.Finish();
}

int64_t RecordBytes(int32_t block_size, int64_t payload_bytes) {
  return static_cast<int64_t>(kHeaderBytes) + 4 * int64_t{block_size} + payload_bytes + 4;
}

void WriteRecordHeader(const BlockIdentity& id, std::span<uint8_t> out) {
  const auto block_size = static_cast<int32_t>(id.tokens.size());
  const int64_t payload_bytes =
      static_cast<int64_t>(out.size()) - RecordBytes(block_size, 0);
  CHECK_GE(payload_bytes, 0);
  std::memcpy(out.data(), kMagic, 8);
  Put<uint32_t>(out, 8, kFormatVersion);
  Put<uint32_t>(out, 12, static_cast<uint32_t>(block_size));
  Put<uint64_t>(out, 16, static_cast<uint64_t>(payload_bytes));
  Put<uint64_t>(out, 24, id.ns);
  std::copy(id.fingerprint.begin(), id.fingerprint.end(), out.begin() + 32);
  std::copy(id.parent.begin(), id.parent.end(), out.begin() + 64);
  std::copy(id.key.begin(), id.key.end(), out.begin() + 96);
  size_t at = kHeaderBytes;
  for (int32_t t : id.tokens) {
    Put<uint32_t>(out, at, static_cast<uint32_t>(t));
    at += 4;
  }
  Put<uint32_t>(out, out.size() - 4, 0);
}

std::array<uint8_t, 4> ChecksumTail(std::span<const uint8_t> record) {
  CHECK_GE(record.size(), size_t{4});
  std::array<uint8_t, 4> tail{};
  Put<uint32_t>(tail, 0, Crc32c(record.first(record.size() - 4)));
  return tail;
}

void SealChecksum(std::span<uint8_t> record) {
  const std::array<uint8_t, 4> tail = ChecksumTail(record);
  std::copy(tail.begin(), tail.end(), record.end() - 4);
}

void SealRecord(const BlockIdentity& id, std::span<uint8_t> out) {
  WriteRecordHeader(id, out);
  SealChecksum(out);
}

std::vector<uint8_t> EncodeRecord(const BlockIdentity& id, std::span<const uint8_t> payload) {
  const auto block_size = static_cast<int32_t>(id.tokens.size());
  std::vector<uint8_t> out(
      static_cast<size_t>(RecordBytes(block_size, static_cast<int64_t>(payload.size()))));
  if (!payload.empty())
    std::memcpy(out.data() + PayloadOffset(block_size), payload.data(), payload.size());
  SealRecord(id, out);
  return out;
}

std::string VerifyRecord(std::span<const uint8_t> record, const BlockIdentity& expected,
                         int64_t payload_bytes, Checksum checksum) {
  const auto block_size = static_cast<int32_t>(expected.tokens.size());
  const int64_t want = RecordBytes(block_size, payload_bytes);
  if (static_cast<int64_t>(record.size()) != want)
    return "size " + std::to_string(record.size()) + ", expected " + std::to_string(want);
  if (std::memcmp(record.data(), kMagic, 8) != 0) return "bad magic";
  if (Get<uint32_t>(record, 8) != kFormatVersion) return "format version differs";
  if (Get<uint32_t>(record, 12) != static_cast<uint32_t>(block_size)) return "block size differs";
  if (Get<uint64_t>(record, 16) != static_cast<uint64_t>(payload_bytes))
    return "payload size differs";
  const size_t body = record.size() - 4;
  if (checksum == Checksum::kVerify && Get<uint32_t>(record, body) != Crc32c(record.first(body)))
    return "checksum mismatch";
  if (Get<uint64_t>(record, 24) != expected.ns) return "namespace differs";
  if (!Equal(record, 32, expected.fingerprint)) return "model fingerprint differs";
  if (!Equal(record, 64, expected.parent)) return "parent key differs";
  if (!Equal(record, 96, expected.key)) return "key differs";
  for (int32_t i = 0; i < block_size; ++i) {
    if (Get<uint32_t>(record, kHeaderBytes + 4 * static_cast<size_t>(i)) !=
        static_cast<uint32_t>(expected.tokens[static_cast<size_t>(i)]))
      return "token ids differ";
  }
  return "";
}

std::span<const uint8_t> RecordPayload(std::span<const uint8_t> record, int32_t block_size,
                                       int64_t payload_bytes) {
  CHECK_EQ(static_cast<int64_t>(record.size()), RecordBytes(block_size, payload_bytes));
  return record.subspan(kHeaderBytes + 4 * static_cast<size_t>(block_size),
                        static_cast<size_t>(payload_bytes));
}

}  // namespace ember::prompt_cache
