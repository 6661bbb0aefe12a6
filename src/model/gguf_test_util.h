// GgufBuilder: writes small GGUF files in memory for the reader's tests (any field can be set
// to a wrong value to provoke each validation error). Tests only; single-threaded.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "model/gguf.h"

namespace ember::testing {

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type_id = 0;
    uint64_t offset = 0;
    uint64_t nbytes = 0;  // bytes of data written for it
  };

  // Scalars: the value's bytes as the type's width, little-endian.
  template <typename T>
  GgufBuilder& Scalar(const std::string& key, GgufValueType type, T value) {
    Key(key, type);
    Append(&value, sizeof(T));
    ++num_key_values_;
    return *this;
  }
  GgufBuilder& String(const std::string& key, const std::string& value) {
    Key(key, GgufValueType::kString);
    Str(value);
    ++num_key_values_;
    return *this;
  }
  GgufBuilder& StringArray(const std::string& key, const std::vector<std::string>& values) {
    Key(key, GgufValueType::kArray);
    U32(static_cast<uint32_t>(GgufValueType::kString));
    U64(values.size());
    for (const std::string& v : values) Str(v);
    ++num_key_values_;
    return *this;
  }
  template <typename T>
  GgufBuilder& Array(const std::string& key, GgufValueType element_type,
                     const std::vector<T>& values) {
    Key(key, GgufValueType::kArray);
    U32(static_cast<uint32_t>(element_type));
    U64(values.size());
    for (const T& v : values) Append(&v, sizeof(T));
    ++num_key_values_;
    return *this;
  }
  // A tensor placed after the previous one (aligned), its data filled with `fill`.
  GgufBuilder& AddTensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type) {
    const GgmlTypeTraits& traits = GgmlTraits(type);
    uint64_t count = 1;
    for (uint64_t d : dims) count *= d;
    Tensor t{name, std::move(dims), static_cast<uint32_t>(type), next_offset_,
             count / traits.block_size * traits.type_size};
    next_offset_ = (t.offset + t.nbytes + alignment - 1) / alignment * alignment;
    tensors.push_back(std::move(t));
    return *this;
  }

  std::vector<uint8_t> Build() const {
    GgufBuilder out;
    out.U32(magic);
    out.U32(version);
    out.U64(num_tensors_override >= 0 ? num_tensors_override : tensors.size());
    out.U64(num_key_values_);
    out.bytes_.insert(out.bytes_.end(), bytes_.begin(), bytes_.end());
    for (const Tensor& t : tensors) {
      out.Str(t.name);
      out.U32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out.U64(d);
      out.U32(t.type_id);
      out.U64(t.offset);
    }
    if (tensors.empty()) return out.bytes_;
    const uint64_t data_start = (out.bytes_.size() + alignment - 1) / alignment * alignment;
    out.bytes_.resize(data_start, 0);
    uint64_t data_end = 0;
    for (const Tensor& t : tensors) data_end = std::max(data_end, t.offset + t.nbytes);
    if (data_size_override >= 0) data_end = static_cast<uint64_t>(data_size_override);
    out.bytes_.resize(data_start + data_end, fill);
    return out.bytes_;
  }

  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  uint64_t alignment = 32;  // for placing data; set general.alignment yourself to change it
  int64_t num_tensors_override = -1;
  int64_t data_size_override = -1;  // bytes of data section to write (default: what fits them)
  uint8_t fill = 0x3c;
  std::vector<Tensor> tensors;

 private:
  void Append(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  void U32(uint32_t v) { Append(&v, 4); }
  void U64(uint64_t v) { Append(&v, 8); }
  void Str(const std::string& s) {
    U64(s.size());
    Append(s.data(), s.size());
  }
  void Key(const std::string& key, GgufValueType type) {
    Str(key);
    U32(static_cast<uint32_t>(type));
  }

  std::vector<uint8_t> bytes_;
  uint64_t num_key_values_ = 0;
  uint64_t next_offset_ = 0;
};

}  // namespace ember::testing
