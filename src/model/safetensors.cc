#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "util/sha256.h"

namespace ember {

using json = nlohmann::json;

Result<DType> ParseSafetensorsDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "U8") return DType::kU8;
  return Status::Error("unsupported dtype \"" + name + "\" (supported: F32, F16, BF16, I32, U8)");
}

Result<std::unique_ptr<WeightStore>> WeightStore::OpenFile(const std::string& path) {
  auto store = std::unique_ptr<WeightStore>(new WeightStore());
  store->where_ = path;
  EMBER_RETURN_IF_ERROR(store->AddFile(path));
  return store;
}

std::unique_ptr<WeightStore> WeightStore::FromViews(
    std::string where, std::vector<TensorView> views, std::shared_ptr<const void> keep_alive,
    int64_t file_bytes, std::function<std::string(const std::string&)> describe_missing) {
  auto store = std::unique_ptr<WeightStore>(new WeightStore());
  store->where_ = std::move(where);
  for (TensorView& view : views) {
    std::string name = view.name;
    store->tensors_.emplace(std::move(name), std::move(view));
  }
  store->keep_alive_ = std::move(keep_alive);
  store->view_file_bytes_ = file_bytes;
  store->describe_missing_ = std::move(describe_missing);
  return store;
}

Result<std::unique_ptr<WeightStore>> WeightStore::Open(const std::string& dir) {
  auto store = std::unique_ptr<WeightStore>(new WeightStore());
  store->where_ = dir;
  std::string single = dir + "/model.safetensors";
  std::string index = dir + "/model.safetensors.index.json";
  if (FileExists(single)) {
    EMBER_RETURN_IF_ERROR(store->AddFile(single));
    return store;
  }
  if (!FileExists(index))
    return Status::Error(dir + ": no model.safetensors or model.safetensors.index.json");
  EMBER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
      !j["weight_map"].is_object())
    return Status::Error(index + ": not valid JSON with a \"weight_map\" object");
  std::set<std::string> shards;
  for (auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) return Status::Error(index + ": weight_map[\"" + name + "\"] is not a string");
    shards.insert(file.get<std::string>());
  }
  for (const std::string& shard : shards) {
    if (shard.find('/') != std::string::npos)
      return Status::Error(index + ": shard name \"" + shard + "\" must be a plain file name");
    EMBER_RETURN_IF_ERROR(store->AddFile(dir + "/" + shard));
  }
  for (auto& [name, file] : j["weight_map"].items()) {
    auto it = store->tensors_.find(name);
    if (it == store->tensors_.end() || it->second.file != dir + "/" + file.get<std::string>())
      return Status::Error(index + ": tensor \"" + name + "\" is not in " + file.get<std::string>());
  }
  return store;
}

Status WeightStore::AddFile(const std::string& path) {
  if (!FileExists(path)) return Status::Error(path + ": file not found");
  EMBER_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const size_t size = file.size();
  if (size < 8) return Status::Error(path + ": truncated safetensors file (" + std::to_string(size) +
                                     " bytes, need at least the 8-byte header length)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  if (header_len > size - 8)
    return Status::Error(path + ": corrupt safetensors header length " + std::to_string(header_len) +
                         " (file has " + std::to_string(size) + " bytes)");
  std::string header(reinterpret_cast<const char*>(file.data()) + 8, header_len);
  json j = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error(path + ": safetensors header is not a JSON object");
  const uint8_t* base = file.data() + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<std::string> range_names;
  for (auto& [name, info] : j.items()) {
    if (name == "__metadata__") continue;
    std::string what = path + ": tensor \"" + name + "\"";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() ||
        !info["shape"].is_array() || !info["data_offsets"].is_array() ||
        info["data_offsets"].size() != 2)
      return Status::Error(what + ": needs dtype, shape and data_offsets [begin, end]");
    auto dtype = ParseSafetensorsDType(info["dtype"].get<std::string>());
    if (!dtype.ok()) return dtype.status().WithContext(what);
    TensorView view;
    view.name = name;
    view.dtype = *dtype;
    view.file = path;
    int64_t numel = 1;
    for (auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) return Status::Error(what + ": shape entries must be non-negative integers");
      view.shape.push_back(d.get<int64_t>());
      numel *= view.shape.back();
    }
    for (auto& o : info["data_offsets"])
      if (!o.is_number_unsigned()) return Status::Error(what + ": data_offsets must be non-negative integers");
    size_t begin = info["data_offsets"][0].get<size_t>();
    size_t end = info["data_offsets"][1].get<size_t>();
    if (begin > end || end > data_size)
      return Status::Error(what + ": data_offsets [" + std::to_string(begin) + ", " +
                           std::to_string(end) + "] past the end of the data (" +
                           std::to_string(data_size) + " bytes; file truncated?)");
    size_t expected = static_cast<size_t>(numel) * DTypeSize(view.dtype);
    if (end - begin != expected)
      return Status::Error(what + ": byte range of " + std::to_string(end - begin) +
                           " bytes does not match its shape and dtype (" + std::to_string(expected) +
                           " bytes)");
    view.data = base + begin;
    view.nbytes = end - begin;
    if (tensors_.count(name)) return Status::Error(what + ": appears in more than one file");
    ranges.emplace_back(begin, end);
    range_names.push_back(name);
    tensors_.emplace(name, std::move(view));
  }
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = ranges[order[i - 1]];
    const auto& cur = ranges[order[i]];
    if (cur.first < prev.second && cur.second > cur.first && prev.second > prev.first)
      return Status::Error(path + ": tensors \"" + range_names[order[i - 1]] + "\" and \"" +
                           range_names[order[i]] + "\" have overlapping byte ranges");
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

Result<TensorView> WeightStore::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    if (describe_missing_) return Status::Error(where_ + ": missing " + describe_missing_(name));
    return Status::Error(where_ + ": missing tensor \"" + name + "\"");
  }
  return it->second;
}

Result<TensorView> WeightStore::GetWithShape(const std::string& name, std::vector<int64_t> shape,
                                             Want want) const {
  EMBER_ASSIGN_OR_RETURN(TensorView view, Get(name));
  auto shape_str = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  if (view.shape != shape)
    return Status::Error(view.file + ": tensor \"" + name + "\" has shape " + shape_str(view.shape) +
                         " but config.json implies " + shape_str(shape));
  const bool packed = view.dtype == DType::kI32 || view.dtype == DType::kU8;
  if (packed != (want == Want::kPacked))
    return Status::Error(
        view.file + ": tensor \"" + name + "\" has dtype " + DTypeName(view.dtype) +
        (packed ? "; weights must be F32, F16, BF16 (or Q8_0 / Q4_0 from a GGUF file)"
                : "; expected U8 (packed)"));
  return view;
}

Result<TensorView> WeightStore::GetPacked(const std::string& name,
                                          std::vector<int64_t> shape) const {
  return GetWithShape(name, std::move(shape), Want::kPacked);
}

std::vector<std::string> WeightStore::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

namespace {
// SHA-256 (hex) of up to 64 KiB at the start, the middle and the end of `bytes`.
std::string SampleDigest(std::span<const uint8_t> bytes) {
  constexpr size_t kSample = size_t{64} << 10;
  Sha256 h;
  if (bytes.size() <= 3 * kSample) {
    h.Update(bytes);
  } else {
    h.Update(bytes.first(kSample));
    h.Update(bytes.subspan(bytes.size() / 2 - kSample / 2, kSample));
    h.Update(bytes.last(kSample));
  }
  return HexOf(h.Finish());
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
}  // namespace

std::string WeightStore::Fingerprint() const {
  std::ostringstream out;
  for (const MappedFile& f : files_) {
    uint64_t header_len = 0;
    std::memcpy(&header_len, f.data(), 8);  // validated by AddFile
    const auto header = f.bytes().first(8 + static_cast<size_t>(header_len));
    out << "weights " << BaseName(f.path()) << " " << f.size() << " header "
        << HexOf(Sha256().Update(header).Finish()) << " data "
        << SampleDigest(f.bytes().subspan(header.size())) << "\n";
  }
  if (files_.empty()) {
    out << "weights " << BaseName(where_) << " " << view_file_bytes_ << "\n";
    Sha256 layout;
    for (const auto& [name, view] : tensors_) {
      layout.Update(name).Update(DTypeName(view.dtype));
      for (int64_t d : view.shape) layout.UpdateU64(static_cast<uint64_t>(d));
    }
    out << "tensors " << HexOf(layout.Finish());
    size_t i = 0;
    for (const auto& [name, view] : tensors_) {  // the first, the middle and the last tensor
      if (i == 0 || i == tensors_.size() / 2 || i + 1 == tensors_.size())
        out << " " << SampleDigest({static_cast<const uint8_t*>(view.data), view.nbytes});
      ++i;
    }
    out << "\n";
  }
  return out.str();
}

int64_t WeightStore::total_file_bytes() const {
  int64_t total = view_file_bytes_;
  for (const MappedFile& f : files_) total += static_cast<int64_t>(f.size());
  return total;
}

}  // namespace ember
