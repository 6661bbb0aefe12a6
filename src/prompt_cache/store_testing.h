// Test helpers shared by the prompt-cache tier tests: the record shape and block identities they
// use, a temporary folder removed at scope end, and the DiskStoreConfig every tier test opens its
// disk store with. Tests only.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "prompt_cache/disk_store.h"

namespace ember::prompt_cache {

// The record shape of the tier tests: 4 tokens a block, 256 payload bytes.
constexpr int32_t kBlockSize = 4;
constexpr int64_t kPayload = 256;

// One block's identity within namespace `ns`.
struct TestBlock {
  std::vector<int32_t> tokens;
  Key parent{}, key{};
  uint64_t ns = 0;
  BlockIdentity Id(const Key& fp) const { return {fp, parent, key, ns, tokens}; }
};

// The payload of block i: bytes that differ from block to block.
inline std::vector<uint8_t> TestPayload(int i) {
  std::vector<uint8_t> p(kPayload);
  for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<uint8_t>(i * 13 + j);
  return p;
}

// A fresh folder under /tmp named `prefix` + a random suffix, removed with everything in it when
// this object goes.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~ScopedTempDir() { std::filesystem::remove_all(path_); }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A disk tier in `dir` for model fingerprint `fp` ("model A"), holding `max_records` records of
// `block_size` tokens and `payload_bytes` each.
inline DiskStoreConfig TestDiskConfig(const std::string& dir, const Key& fp, int32_t block_size,
                                      int64_t payload_bytes, int64_t max_records) {
  DiskStoreConfig c;
  c.dir = dir;
  c.max_bytes = max_records * RecordBytes(block_size, payload_bytes);
  c.fingerprint = fp;
  c.fingerprint_text = "model A";
  c.block_size = block_size;
  c.payload_bytes = payload_bytes;
  return c;
}

}  // namespace ember::prompt_cache
