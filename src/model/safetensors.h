// WeightStore: the tensors of a safetensors checkpoint (one file, or shards listed by
// model.safetensors.index.json), memory-mapped and validated, never copied; or tensors another
// format's loader laid out under Ember's names (FromViews: a GGUF file). Open() checks every
// header (length, JSON, dtype, shape vs byte range, ranges inside the file and not overlapping)
// and names the file and tensor in its errors. Immutable after Open; safe to read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace ember {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // points into the mapping
  size_t nbytes = 0;
  std::string file;            // which file holds it (for error messages)
};

class WeightStore {
 public:
  // Opens `dir`/model.safetensors, or the shards named by `dir`/model.safetensors.index.json.
  static Result<std::unique_ptr<WeightStore>> Open(const std::string& dir);
  // Opens exactly one safetensors file (also used for golden logits in tests).
  static Result<std::unique_ptr<WeightStore>> OpenFile(const std::string& path);
  // Tensors laid out by another loader: `views` point into memory that `keep_alive` owns (kept
  // as long as the store). `file_bytes` is what total_file_bytes() reports; `describe_missing`
  // turns a name Get does not find into the file's own words for it.
  static std::unique_ptr<WeightStore> FromViews(
      std::string where, std::vector<TensorView> views, std::shared_ptr<const void> keep_alive,
      int64_t file_bytes, std::function<std::string(const std::string&)> describe_missing);

  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor, or an error naming it and the checkpoint.
  Result<TensorView> Get(const std::string& name) const;
  enum class Want { kFloat, kPacked };
  // The tensor, checked to have `shape` and a float dtype (F32/F16/BF16), or with kPacked an
  // integer one (U8: MXFP4 blocks and scales; I32).
  Result<TensorView> GetWithShape(const std::string& name, std::vector<int64_t> shape,
                                  Want want = Want::kFloat) const;
  Result<TensorView> GetPacked(const std::string& name, std::vector<int64_t> shape) const;
  std::vector<std::string> Names() const;
  int64_t total_file_bytes() const;
  // Lines that identify these weights for the prompt cache's model fingerprint, without reading
  // them all: per safetensors file its name, size, a SHA-256 of its header and of three 64 KiB
  // samples of its data (start, middle, end: two fine-tunes of one base share names, sizes and
  // headers, not bytes); for views (GGUF) the file's name and size, every tensor's name, dtype
  // and shape, and samples of three tensors' data.
  std::string Fingerprint() const;

 private:
  Status AddFile(const std::string& path);
  std::string where_;  // the directory or file, for messages
  std::vector<MappedFile> files_;
  std::shared_ptr<const void> keep_alive_;  // FromViews: what the views point into
  int64_t view_file_bytes_ = 0;             // FromViews: the file's size
  std::function<std::string(const std::string&)> describe_missing_;
  std::map<std::string, TensorView> tensors_;
};

// Parses a safetensors dtype name ("F32", "F16", "BF16", "I32", "U8").
Result<DType> ParseSafetensorsDType(const std::string& name);

}  // namespace ember
