// GgufWriter: builds a GGUF v3 file -- metadata key/values, then tensor infos, then each tensor's
// bytes at an offset aligned to general.alignment (32) -- the layout GgufFile (gguf.h) and
// llama.cpp map. Tensors are declared with their type and shape first and their bytes produced one
// at a time while writing (a callback per tensor), so a large model is never held whole. Write()
// goes to a temporary file beside the destination and renames it over the destination only when
// every byte is written and flushed: a failure leaves no partial file. Single-threaded use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "util/status.h"

namespace ember {

class GgufWriter {
 public:
  static constexpr uint32_t kAlignment = GgufFile::kDefaultAlignment;

  // Metadata, written in the order added. general.alignment is written by Write() itself.
  void AddString(const std::string& key, const std::string& value);
  void AddUint32(const std::string& key, uint32_t value);
  void AddInt32(const std::string& key, int32_t value);
  void AddFloat32(const std::string& key, float value);
  void AddBool(const std::string& key, bool value);
  void AddStringArray(const std::string& key, const std::vector<std::string>& values);
  void AddFloat32Array(const std::string& key, const std::vector<float>& values);
  void AddInt32Array(const std::string& key, const std::vector<int32_t>& values);

  // The bytes of one tensor, produced while writing; must be exactly the declared size.
  using Producer = std::function<Result<std::vector<uint8_t>>()>;
  // Declares a tensor of `type` with the row-major `shape` ({rows, cols}: GGUF stores the dims
  // reversed). Errors: a duplicate name, a row that is not a whole number of the type's blocks.
  Status AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape,
                   Producer bytes);

  // Writes the file to `path` (see the header comment). Errors name the path.
  Status Write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    uint64_t nbytes = 0, offset = 0;
    Producer bytes;
  };
  void Key(const std::string& key, GgufValueType type);
  std::string header_;  // the metadata key/values, encoded
  uint64_t num_keys_ = 0;
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;
};

}  // namespace ember
