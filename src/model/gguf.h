// GgufFile: a GGUF (v2/v3) file, memory-mapped and validated, never copied: the metadata
// key/values with typed accessors, the tensor infos, and each tensor's bytes inside the mapping.
// Open() checks everything a corrupt or hostile file could get wrong (magic, version, counts and
// lengths past the end, alignment, tensor types, byte ranges inside the data section and not
// overlapping, duplicate keys and names, dims that overflow); every error names the file and
// the key or tensor. Immutable after Open; safe to read from any thread. Move-only; all views
// (strings, spans, tensor data) point into the mapping and live as long as the GgufFile.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf_quants.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace ember {

// The value types of GGUF metadata (on-disk ids).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view GgufValueTypeName(GgufValueType type);  // "uint32", "string", "array", ...

// One metadata value: a scalar, a string, or an array of scalars or strings (GGUF arrays are
// homogeneous; Ember refuses nested arrays). Read it through GgufFile's typed accessors.
class GgufValue {
 public:
  GgufValueType type() const { return type_; }
  // For arrays: the element type and count (0 and kUint8 otherwise).
  GgufValueType element_type() const { return element_type_; }
  uint64_t array_size() const { return array_size_; }
  // A short human-readable form: `uint32 128`, `string "llama"`, `array<string>[32000]`.
  std::string Describe() const;

 private:
  friend class GgufParser;
  friend class GgufFile;
  GgufValueType type_ = GgufValueType::kUint8;
  uint64_t scalar_bits_ = 0;  // the scalar's bytes, little-endian, zero-extended
  std::string_view string_;   // kString
  GgufValueType element_type_ = GgufValueType::kUint8;
  uint64_t array_size_ = 0;
  const uint8_t* array_data_ = nullptr;     // numeric arrays: packed elements (unaligned)
  std::vector<std::string_view> strings_;  // string arrays
};

// A tensor as the file describes it. `dims` is in GGUF/ggml order: dims[0] is the innermost
// (contiguous) dimension, the row length; a matrix with `out` rows of `in` elements has
// dims {in, out} (row_major_shape() gives {out, in}).
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;             // from the start of the data section
  uint64_t nbytes = 0;             // whole tensor, from the type's block layout
  const uint8_t* data = nullptr;  // into the mapping (aligned as general.alignment says)

  int64_t num_elements() const;
  int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  int64_t num_rows() const { return row_length() == 0 ? 0 : num_elements() / row_length(); }
  uint64_t row_bytes() const { return num_rows() == 0 ? 0 : nbytes / num_rows(); }
  std::vector<int64_t> row_major_shape() const { return {dims.rbegin(), dims.rend()}; }
};

class GgufFile {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;

  // Maps and validates `path`.
  static Result<GgufFile> Open(const std::string& path);
  // Validates GGUF bytes the caller owns and keeps alive (tests, fuzzing); `name` is used in
  // error messages in place of a path.
  static Result<GgufFile> Parse(std::span<const uint8_t> bytes, const std::string& name);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section
  uint64_t file_size() const { return bytes_.size(); }

  // ---- metadata ----
  // Keys in file order.
  const std::vector<std::string>& keys() const { return key_order_; }
  bool HasKey(std::string_view key) const { return FindKey(key) != nullptr; }
  const GgufValue* FindKey(std::string_view key) const;  // nullptr when absent
  // Each accessor errors naming the file and key when the key is missing or of another type.
  // Integer accessors accept every integer type whose value fits the result.
  Result<int64_t> GetInt(std::string_view key) const;
  Result<uint32_t> GetUint32(std::string_view key) const;
  Result<double> GetFloat(std::string_view key) const;  // float32 or float64
  Result<bool> GetBool(std::string_view key) const;
  Result<std::string_view> GetString(std::string_view key) const;
  Result<std::span<const std::string_view>> GetStringArray(std::string_view key) const;
  Result<std::vector<int64_t>> GetIntArray(std::string_view key) const;  // any integer elements
  Result<std::vector<float>> GetFloatArray(std::string_view key) const;  // float32/64 elements

  // ---- tensors ----
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // file order
  const GgufTensorInfo* FindTensor(std::string_view name) const;  // nullptr when absent
  Result<const GgufTensorInfo*> GetTensor(std::string_view name) const;  // error names it

 private:
  friend class GgufParser;
  GgufFile() = default;
  Result<const GgufValue*> Lookup(std::string_view key) const;
  Status WrongType(std::string_view key, const GgufValue& value, std::string_view want) const;

  std::string path_;
  MappedFile mapping_;               // empty for Parse()
  std::span<const uint8_t> bytes_;  // the whole file
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::string> key_order_;
  std::map<std::string, GgufValue, std::less<>> values_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace ember
