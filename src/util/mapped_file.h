// MappedFile: a read-only memory mapping of a whole file (move-only RAII). Weights are read
// straight from the mapping, never copied. Immutable after Open; safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "util/status.h"

namespace ember {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  static Result<MappedFile> Open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) file into a string; error names the path.
Result<std::string> ReadFileToString(const std::string& path);
// Writes a string to a file, replacing it.
Status WriteStringToFile(const std::string& path, std::string_view contents);
bool FileExists(const std::string& path);

}  // namespace ember
