// GgufWriter (gguf_writer.h): little-endian encoding of the GGUF v3 header, and the atomic write.
#include "model/gguf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

namespace ember {
namespace {

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void PutString(std::string& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out += s;
}

uint64_t AlignUp(uint64_t n) {
  return (n + GgufWriter::kAlignment - 1) / GgufWriter::kAlignment * GgufWriter::kAlignment;
}

// A file descriptor written in full or not at all.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : path_(path), tmp_(path + ".tmp-XXXXXX") {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_ && fd_ != -2) ::unlink(tmp_.c_str());
  }
  Status Open() {
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) {
      fd_ = -2;  // nothing to remove
      return Error("cannot create a file beside it");
    }
    return Status::Ok();
  }
  Status Append(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Error("write failed");
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::Ok();
  }
  Status Commit() {
    if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0) return Error("flush failed");
    if (::close(fd_) != 0) return Error("close failed");
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) return Error("rename failed");
    renamed_ = true;
    return Status::Ok();
  }

 private:
  Status Error(const std::string& what) const {
    return Status::Error(path_ + ": " + what + " (" + std::strerror(errno) + ")");
  }
  std::string path_, tmp_;
  int fd_ = -1;
  bool renamed_ = false;
};

}  // namespace

void GgufWriter::Key(const std::string& key, GgufValueType type) {
  PutString(header_, key);
  Put<uint32_t>(header_, static_cast<uint32_t>(type));
  ++num_keys_;
}

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  Key(key, GgufValueType::kString);
  PutString(header_, value);
}
void GgufWriter::AddUint32(const std::string& key, uint32_t value) {
  Key(key, GgufValueType::kUint32);
  Put(header_, value);
}
void GgufWriter::AddInt32(const std::string& key, int32_t value) {
  Key(key, GgufValueType::kInt32);
  Put(header_, value);
}
void GgufWriter::AddFloat32(const std::string& key, float value) {
  Key(key, GgufValueType::kFloat32);
  Put(header_, value);
}
void GgufWriter::AddBool(const std::string& key, bool value) {
  Key(key, GgufValueType::kBool);
  Put<uint8_t>(header_, value ? 1 : 0);
}
void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& values) {
  Key(key, GgufValueType::kArray);
  Put<uint32_t>(header_, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(header_, values.size());
  for (const std::string& v : values) PutString(header_, v);
}
void GgufWriter::AddFloat32Array(const std::string& key, const std::vector<float>& values) {
  Key(key, GgufValueType::kArray);
  Put<uint32_t>(header_, static_cast<uint32_t>(GgufValueType::kFloat32));
  Put<uint64_t>(header_, values.size());
  for (float v : values) Put(header_, v);
}
void GgufWriter::AddInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  Key(key, GgufValueType::kArray);
  Put<uint32_t>(header_, static_cast<uint32_t>(GgufValueType::kInt32));
  Put<uint64_t>(header_, values.size());
  for (int32_t v : values) Put(header_, v);
}

Status GgufWriter::AddTensor(const std::string& name, GgmlType type,
                             const std::vector<int64_t>& shape, Producer bytes) {
  for (const Tensor& t : tensors_)
    if (t.name == name) return Status::Error("GGUF tensor '" + name + "' added twice");
  if (shape.empty()) return Status::Error("GGUF tensor '" + name + "' has no dims");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  auto row_bytes = GgmlRowBytes(type, shape.back());
  if (!row_bytes.ok()) return row_bytes.status().WithContext("GGUF tensor '" + name + "'");
  Tensor t{name, type, shape, *row_bytes * static_cast<uint64_t>(rows), data_bytes_,
           std::move(bytes)};
  data_bytes_ = AlignUp(data_bytes_ + t.nbytes);
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::Write(const std::string& path) const {
  std::string head = "GGUF";
  Put<uint32_t>(head, 3);
  Put<uint64_t>(head, tensors_.size());
  Put<uint64_t>(head, num_keys_ + 1);
  PutString(head, "general.alignment");
  Put<uint32_t>(head, static_cast<uint32_t>(GgufValueType::kUint32));
  Put<uint32_t>(head, kAlignment);
  head += header_;
  for (const Tensor& t : tensors_) {
    PutString(head, t.name);
    Put<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) Put<uint64_t>(head, *d);
    Put<uint32_t>(head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(head, t.offset);
  }
  head.resize(AlignUp(head.size()), '\0');
  TempFile file(path);
  EMBER_RETURN_IF_ERROR(file.Open());
  EMBER_RETURN_IF_ERROR(file.Append(head.data(), head.size()));
  const std::vector<uint8_t> zeros(kAlignment, 0);
  for (const Tensor& t : tensors_) {
    EMBER_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, t.bytes());
    if (bytes.size() != t.nbytes)
      return Status::Error(path + ": tensor '" + t.name + "' produced " +
                           std::to_string(bytes.size()) + " bytes, expected " +
                           std::to_string(t.nbytes));
    EMBER_RETURN_IF_ERROR(file.Append(bytes.data(), bytes.size()));
    EMBER_RETURN_IF_ERROR(file.Append(zeros.data(), AlignUp(t.nbytes) - t.nbytes));
  }
  return file.Commit();
}

}  // namespace ember
