#include "model/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

namespace ember {

static_assert(std::endian::native == std::endian::little, "GGUF values are read little-endian");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kMaxDims = 4;            // GGML_MAX_DIMS
// The fewest bytes one key/value and one tensor info can take: lets Open refuse a count that
// cannot fit in the file before reserving memory for it.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;     // key length, type, a 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

// Bytes of a scalar of `type`; 0 for strings and arrays.
uint64_t ScalarWidth(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsKnownValueType(uint32_t id) { return id <= static_cast<uint32_t>(GgufValueType::kFloat64); }

bool IsIntegerType(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(GgufValueType type) {
  return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
}

// The integer in `bits` (zero-extended little-endian bytes of an integer `type`); false when
// it does not fit int64 (a uint64 above INT64_MAX).
bool IntegerValue(GgufValueType type, uint64_t bits, int64_t* out) {
  switch (type) {
    case GgufValueType::kInt8: *out = static_cast<int8_t>(bits); return true;
    case GgufValueType::kInt16: *out = static_cast<int16_t>(bits); return true;
    case GgufValueType::kInt32: *out = static_cast<int32_t>(bits); return true;
    case GgufValueType::kInt64: *out = static_cast<int64_t>(bits); return true;
    case GgufValueType::kUint64:
      if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      *out = static_cast<int64_t>(bits);
      return true;
    default: *out = static_cast<int64_t>(bits); return true;  // narrower unsigned types
  }
}

double FloatValue(GgufValueType type, uint64_t bits) {
  if (type == GgufValueType::kFloat32) return std::bit_cast<float>(static_cast<uint32_t>(bits));
  return std::bit_cast<double>(bits);
}

uint64_t LoadScalar(const uint8_t* p, uint64_t width) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, width);
  return bits;
}

// A key or tensor name from the file as error messages show it: printable ASCII kept, other
// bytes as \xNN, at most 120 characters (a corrupt file can hold anything there).
std::string Printable(std::string_view name) {
  constexpr size_t kMaxShown = 120;
  std::string out;
  for (size_t i = 0; i < name.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  if (name.size() > kMaxShown) out += "...";
  return out;
}

uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

std::string GgufValue::Describe() const {
  std::ostringstream out;
  if (type_ == GgufValueType::kArray) {
    out << "array<" << GgufValueTypeName(element_type_) << ">[" << array_size_ << "]";
    return out.str();
  }
  out << GgufValueTypeName(type_) << " ";
  int64_t integer = 0;
  if (type_ == GgufValueType::kString) {
    constexpr size_t kShown = 60;
    out << '"' << string_.substr(0, kShown) << (string_.size() > kShown ? "...\"" : "\"");
  } else if (type_ == GgufValueType::kBool) {
    out << (scalar_bits_ != 0 ? "true" : "false");
  } else if (IsFloatType(type_)) {
    out << FloatValue(type_, scalar_bits_);
  } else if (IntegerValue(type_, scalar_bits_, &integer)) {
    out << integer;
  } else {
    out << scalar_bits_;
  }
  return out.str();
}

int64_t GgufTensorInfo::num_elements() const {
  int64_t count = 1;
  for (int64_t d : dims) count *= d;  // Open proved this does not overflow
  return count;
}

// Reads and validates the bytes of one file into a GgufFile. Every read is bounds-checked
// against the file; every error names the file and what was being read.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& file) : file_(file), bytes_(file.bytes_) {}

  Status Run() {
    uint64_t num_tensors = 0;
    uint64_t num_key_values = 0;
    EMBER_RETURN_IF_ERROR(ReadHeader(&num_tensors, &num_key_values));
    for (uint64_t i = 0; i < num_key_values; ++i) EMBER_RETURN_IF_ERROR(ReadKeyValue(i));
    EMBER_RETURN_IF_ERROR(ReadAlignment());
    file_.tensors_.reserve(num_tensors);
    for (uint64_t i = 0; i < num_tensors; ++i) EMBER_RETURN_IF_ERROR(ReadTensorInfo(i));
    return PlaceTensors();
  }

 private:
  Status Error(const std::string& message) const {
    return Status::Error(file_.path_ + ": " + message);
  }

  uint64_t remaining() const { return bytes_.size() - pos_; }

  Status Need(uint64_t num_bytes, const std::string& what) const {
    if (num_bytes > remaining()) {
      return Error(what + " needs " + std::to_string(num_bytes) + " bytes at offset " +
                   std::to_string(pos_) + ", past the end of the file (" +
                   std::to_string(bytes_.size()) + " bytes): truncated or corrupt");
    }
    return Status::Ok();
  }

  template <typename T>
  Status Read(T* out, const std::string& what) {
    EMBER_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string_view* out, const std::string& what) {
    uint64_t length = 0;
    EMBER_RETURN_IF_ERROR(Read(&length, what + " (string length)"));
    if (length > remaining()) {
      return Error(what + ": string length " + std::to_string(length) + " at offset " +
                   std::to_string(pos_ - 8) + " runs past the end of the file (" +
                   std::to_string(bytes_.size()) + " bytes)");
    }
    *out = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return Status::Ok();
  }

  Status ReadHeader(uint64_t* num_tensors, uint64_t* num_key_values) {
    uint32_t magic = 0;
    EMBER_RETURN_IF_ERROR(Read(&magic, "the GGUF magic"));
    if (magic != kGgufMagic) return Error("not a GGUF file (bad magic; expected \"GGUF\")");
    uint32_t version = 0;
    EMBER_RETURN_IF_ERROR(Read(&version, "the GGUF version"));
    if (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3) {
      return Error("a big-endian GGUF file; Ember reads little-endian files only");
    }
    if (version != 2 && version != 3) {
      return Error("GGUF version " + std::to_string(version) +
                   " is not supported (Ember reads versions 2 and 3)");
    }
    file_.version_ = version;
    EMBER_RETURN_IF_ERROR(Read(num_tensors, "the tensor count"));
    EMBER_RETURN_IF_ERROR(Read(num_key_values, "the metadata key/value count"));
    // Each entry takes some bytes: counts the file cannot hold are corrupt, whatever follows.
    if (*num_key_values > remaining() / kMinKeyValueBytes ||
        *num_tensors > remaining() / kMinTensorInfoBytes ||
        *num_key_values * kMinKeyValueBytes + *num_tensors * kMinTensorInfoBytes > remaining()) {
      return Error("the header claims " + std::to_string(*num_tensors) + " tensors and " +
                   std::to_string(*num_key_values) + " metadata keys, more than the file's " +
                   std::to_string(bytes_.size()) + " bytes can hold: truncated or corrupt");
    }
    return Status::Ok();
  }

  Status ReadKeyValue(uint64_t index) {
    const std::string where = "metadata entry #" + std::to_string(index);
    std::string_view key_view;
    EMBER_RETURN_IF_ERROR(ReadString(&key_view, where + " key"));
    std::string key(key_view);
    const std::string what = "metadata key '" + Printable(key) + "'";
    if (file_.values_.count(key) != 0) return Error(what + " appears twice");
    uint32_t type_id = 0;
    EMBER_RETURN_IF_ERROR(Read(&type_id, what + " type"));
    if (!IsKnownValueType(type_id)) {
      return Error(what + " has unknown value type id " + std::to_string(type_id));
    }
    GgufValue value;
    value.type_ = static_cast<GgufValueType>(type_id);
    EMBER_RETURN_IF_ERROR(ReadValue(what, &value));
    file_.key_order_.push_back(key);
    file_.values_.emplace(std::move(key), std::move(value));
    return Status::Ok();
  }

  Status ReadValue(const std::string& what, GgufValue* value) {
    if (value->type_ == GgufValueType::kString) return ReadString(&value->string_, what);
    if (value->type_ == GgufValueType::kArray) return ReadArray(what, value);
    uint64_t width = ScalarWidth(value->type_);
    EMBER_RETURN_IF_ERROR(Need(width, what + " value"));
    value->scalar_bits_ = LoadScalar(bytes_.data() + pos_, width);
    pos_ += width;
    return Status::Ok();
  }

  Status ReadArray(const std::string& what, GgufValue* value) {
    uint32_t element_id = 0;
    EMBER_RETURN_IF_ERROR(Read(&element_id, what + " array element type"));
    if (!IsKnownValueType(element_id)) {
      return Error(what + " is an array of unknown value type id " + std::to_string(element_id));
    }
    value->element_type_ = static_cast<GgufValueType>(element_id);
    if (value->element_type_ == GgufValueType::kArray) {
      return Error(what + " is an array of arrays, which Ember does not read");
    }
    EMBER_RETURN_IF_ERROR(Read(&value->array_size_, what + " array length"));
    const uint64_t count = value->array_size_;
    const bool strings = value->element_type_ == GgufValueType::kString;
    const uint64_t min_element_bytes = strings ? 8 : ScalarWidth(value->element_type_);
    if (count > remaining() / min_element_bytes) {
      return Error(what + ": array of " + std::to_string(count) + " " +
                   std::string(GgufValueTypeName(value->element_type_)) +
                   " elements runs past the end of the file (" + std::to_string(bytes_.size()) +
                   " bytes)");
    }
    if (!strings) {
      value->array_data_ = bytes_.data() + pos_;
      pos_ += count * min_element_bytes;
      return Status::Ok();
    }
    value->strings_.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      EMBER_RETURN_IF_ERROR(
          ReadString(&value->strings_[i], what + " element " + std::to_string(i)));
    }
    return Status::Ok();
  }

  Status ReadAlignment() {
    const GgufValue* value = file_.FindKey("general.alignment");
    if (value == nullptr) return Status::Ok();
    if (value->type_ != GgufValueType::kUint32) {
      return Error("metadata key 'general.alignment' is " +
                   std::string(GgufValueTypeName(value->type_)) + ", expected uint32");
    }
    const uint64_t alignment = value->scalar_bits_;
    if (alignment == 0 || !std::has_single_bit(alignment)) {
      return Error("metadata key 'general.alignment' is " + std::to_string(alignment) +
                   ", expected a power of two");
    }
    file_.alignment_ = static_cast<uint32_t>(alignment);
    return Status::Ok();
  }

  Status ReadTensorInfo(uint64_t index) {
    std::string_view name_view;
    EMBER_RETURN_IF_ERROR(
        ReadString(&name_view, "tensor info #" + std::to_string(index) + " name"));
    GgufTensorInfo info;
    info.name = std::string(name_view);
    const std::string what = "tensor '" + Printable(info.name) + "'";
    if (file_.tensor_index_.count(info.name) != 0) return Error(what + " appears twice");
    uint32_t num_dims = 0;
    EMBER_RETURN_IF_ERROR(Read(&num_dims, what + " dimension count"));
    if (num_dims > kMaxDims) {
      return Error(what + " has " + std::to_string(num_dims) + " dimensions (at most " +
                   std::to_string(kMaxDims) + ")");
    }
    for (uint32_t d = 0; d < num_dims; ++d) {
      uint64_t dim = 0;
      EMBER_RETURN_IF_ERROR(Read(&dim, what + " dimension " + std::to_string(d)));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(what + " dimension " + std::to_string(d) + " is " + std::to_string(dim) +
                     ", too large");
      }
      info.dims.push_back(static_cast<int64_t>(dim));
    }
    uint32_t type_id = 0;
    EMBER_RETURN_IF_ERROR(Read(&type_id, what + " type"));
    EMBER_ASSIGN_OR_RETURN(info.type, CheckType(what, type_id));
    EMBER_RETURN_IF_ERROR(Read(&info.offset, what + " data offset"));
    EMBER_RETURN_IF_ERROR(ComputeSize(what, &info));
    file_.tensor_index_.emplace(info.name, file_.tensors_.size());
    file_.tensors_.push_back(std::move(info));
    return Status::Ok();
  }

  Result<GgmlType> CheckType(const std::string& what, uint32_t type_id) const {
    const GgmlTypeTraits* traits = FindGgmlType(type_id);
    if (traits == nullptr) {
      return Error(what + " has unknown ggml type id " + std::to_string(type_id));
    }
    if (!traits->dequantizable) {
      return Error(what + " has ggml type " + std::string(traits->name) +
                   ", which Ember does not read (it reads " + DequantizableTypeNames() + ")");
    }
    return traits->type;
  }

  // nbytes from the dims and the type's block layout, refusing overflow and partial blocks.
  Status ComputeSize(const std::string& what, GgufTensorInfo* info) const {
    int64_t num_elements = 1;
    for (int64_t dim : info->dims) {
      if (__builtin_mul_overflow(num_elements, dim, &num_elements)) {
        return Error(what + ": the element count of its dimensions overflows");
      }
    }
    const GgmlTypeTraits& traits = GgmlTraits(info->type);
    if (info->row_length() % traits.block_size != 0) {
      return Error(what + " has rows of " + std::to_string(info->row_length()) +
                   " elements, not a multiple of " + std::string(traits.name) + "'s block of " +
                   std::to_string(traits.block_size));
    }
    const uint64_t num_blocks = static_cast<uint64_t>(num_elements / traits.block_size);
    if (__builtin_mul_overflow(num_blocks, static_cast<uint64_t>(traits.type_size),
                               &info->nbytes)) {
      return Error(what + ": its byte size overflows");
    }
    return Status::Ok();
  }

  // The data section starts at the first aligned offset after the tensor infos; every tensor
  // must sit at an aligned offset inside it, and no two tensors may share bytes.
  Status PlaceTensors() {
    const uint64_t alignment = file_.alignment_;
    file_.data_offset_ = AlignUp(pos_, alignment);
    const uint64_t data_bytes =
        file_.data_offset_ <= bytes_.size() ? bytes_.size() - file_.data_offset_ : 0;
    for (GgufTensorInfo& info : file_.tensors_) {
      const std::string what = "tensor '" + Printable(info.name) + "'";
      if (info.offset % alignment != 0) {
        return Error(what + " data offset " + std::to_string(info.offset) +
                     " is not a multiple of the alignment " + std::to_string(alignment));
      }
      if (info.offset > data_bytes || info.nbytes > data_bytes - info.offset) {
        return Error(what + " (" + std::to_string(info.nbytes) + " bytes at data offset " +
                     std::to_string(info.offset) + ") runs past the end of the file (data " +
                     "section of " + std::to_string(data_bytes) + " bytes): truncated or corrupt");
      }
      info.data = bytes_.data() + file_.data_offset_ + info.offset;
    }
    return CheckNoOverlap();
  }

  Status CheckNoOverlap() const {
    const std::vector<GgufTensorInfo>& tensors = file_.tensors_;
    std::vector<size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensorInfo& prev = tensors[order[i - 1]];
      const GgufTensorInfo& cur = tensors[order[i]];
      if (prev.nbytes > 0 && cur.nbytes > 0 && prev.offset + prev.nbytes > cur.offset) {
        return Error("tensor '" + Printable(cur.name) + "' (data offset " +
                     std::to_string(cur.offset) + ") overlaps tensor '" + Printable(prev.name) +
                     "' (data offset " +
                     std::to_string(prev.offset) + ", " + std::to_string(prev.nbytes) +
                     " bytes)");
      }
    }
    return Status::Ok();
  }

  GgufFile& file_;
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

Result<GgufFile> GgufFile::Open(const std::string& path) {
  EMBER_ASSIGN_OR_RETURN(MappedFile mapping, MappedFile::Open(path));
  GgufFile file;
  file.path_ = path;
  file.bytes_ = mapping.bytes();
  file.mapping_ = std::move(mapping);  // the mapping's address does not move with it
  EMBER_RETURN_IF_ERROR(GgufParser(file).Run());
  return file;
}

Result<GgufFile> GgufFile::Parse(std::span<const uint8_t> bytes, const std::string& name) {
  GgufFile file;
  file.path_ = name;
  file.bytes_ = bytes;
  EMBER_RETURN_IF_ERROR(GgufParser(file).Run());
  return file;
}

// ---- metadata accessors ----

const GgufValue* GgufFile::FindKey(std::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

Result<const GgufValue*> GgufFile::Lookup(std::string_view key) const {
  const GgufValue* value = FindKey(key);
  if (value == nullptr) {
    return Status::Error(path_ + ": metadata key '" + std::string(key) + "' is missing");
  }
  return value;
}

Status GgufFile::WrongType(std::string_view key, const GgufValue& value,
                           std::string_view want) const {
  std::string have(GgufValueTypeName(value.type_));
  if (value.type_ == GgufValueType::kArray) {
    have = "array<" + std::string(GgufValueTypeName(value.element_type_)) + ">";
  }
  return Status::Error(path_ + ": metadata key '" + std::string(key) + "' is " + have +
                       ", expected " + std::string(want));
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(const GgufValue* value, Lookup(key));
  int64_t result = 0;
  if (!IsIntegerType(value->type_)) return WrongType(key, *value, "an integer");
  if (!IntegerValue(value->type_, value->scalar_bits_, &result)) {
    return Status::Error(path_ + ": metadata key '" + std::string(key) + "' is " +
                         std::to_string(value->scalar_bits_) + ", too large for int64");
  }
  return result;
}

Result<uint32_t> GgufFile::GetUint32(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(int64_t value, GetInt(key));
  if (value < 0 || value > std::numeric_limits<uint32_t>::max()) {
    return Status::Error(path_ + ": metadata key '" + std::string(key) + "' is " +
                         std::to_string(value) + ", expected a value in [0, 2^32)");
  }
  return static_cast<uint32_t>(value);
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(const GgufValue* value, Lookup(key));
  if (!IsFloatType(value->type_)) return WrongType(key, *value, "float32 or float64");
  return FloatValue(value->type_, value->scalar_bits_);
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(const GgufValue* value, Lookup(key));
  if (value->type_ != GgufValueType::kBool) return WrongType(key, *value, "bool");
  return value->scalar_bits_ != 0;
}

Result<std::string_view> GgufFile::GetString(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(const GgufValue* value, Lookup(key));
  if (value->type_ != GgufValueType::kString) return WrongType(key, *value, "string");
  return value->string_;
}

Result<std::span<const std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(const GgufValue* value, Lookup(key));
  if (value->type_ != GgufValueType::kArray || value->element_type_ != GgufValueType::kString) {
    return WrongType(key, *value, "array<string>");
  }
  return std::span<const std::string_view>(value->strings_);
}

Result<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(const GgufValue* value, Lookup(key));
  if (value->type_ != GgufValueType::kArray || !IsIntegerType(value->element_type_)) {
    return WrongType(key, *value, "an array of integers");
  }
  const uint64_t width = ScalarWidth(value->element_type_);
  std::vector<int64_t> result(value->array_size_);
  for (uint64_t i = 0; i < value->array_size_; ++i) {
    const uint64_t bits = LoadScalar(value->array_data_ + i * width, width);
    if (!IntegerValue(value->element_type_, bits, &result[i])) {
      return Status::Error(path_ + ": metadata key '" + std::string(key) + "' element " +
                           std::to_string(i) + " is " + std::to_string(bits) +
                           ", too large for int64");
    }
  }
  return result;
}

Result<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  EMBER_ASSIGN_OR_RETURN(const GgufValue* value, Lookup(key));
  if (value->type_ != GgufValueType::kArray || !IsFloatType(value->element_type_)) {
    return WrongType(key, *value, "an array of float32 or float64");
  }
  const uint64_t width = ScalarWidth(value->element_type_);
  std::vector<float> result(value->array_size_);
  for (uint64_t i = 0; i < value->array_size_; ++i) {
    const uint64_t bits = LoadScalar(value->array_data_ + i * width, width);
    result[i] = static_cast<float>(FloatValue(value->element_type_, bits));
  }
  return result;
}

// ---- tensors ----

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<const GgufTensorInfo*> GgufFile::GetTensor(std::string_view name) const {
  const GgufTensorInfo* info = FindTensor(name);
  if (info == nullptr) {
    return Status::Error(path_ + ": tensor '" + std::string(name) + "' is missing");
  }
  return info;
}

}  // namespace ember
