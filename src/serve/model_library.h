// ModelLibrary: the models below a folder (`ember serve --models-dir DIR`). A scan finds every
// Hugging Face model folder (config.json beside model.safetensors or its index) and every .gguf
// file (id: its path without ".gguf"), and describes each from its files without loading it: architecture, context length, dtype or quantization, chat
// template, tool-call and reasoning formats, embedding pooling, size on disk. A request naming a
// model acquires it: a resident one at once, otherwise the injected loader builds it (one load at a
// time; callers asking for a model being loaded wait for that load) after the least recently used
// idle models are evicted until the estimate fits the memory budget. A lease pins a model: it is
// never evicted while a request holds one. Thread-safe; Acquire may block for a whole load, so call
// it from a worker thread, never an I/O thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <variant>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/request_builder.h"
#include "util/mutex.h"
#include "util/status.h"

namespace ember::serve {

// What a scan knows of one model folder.
struct LibraryModelInfo {
  std::string id;    // the path below the library's root ("org/name"; a .gguf file's without .gguf)
  std::string path;  // the folder
  int64_t disk_bytes = 0;  // weights, tokenizer and config files together
  // architecture, model_type, context_length, dtype, quantization, chat_template, tools,
  // tool_call_format, reasoning_format, embeddings (pooling): the same keys /v1/models reports
  // for a loaded model where they overlap.
  nlohmann::json details = nlohmann::json::object();
  std::string problem;  // non-empty: listed, but it cannot load (e.g. no tokenizer.json)
};

// A loaded model: owns everything its ServedModel borrows (weights, engine, tokenizer, template).
class ResidentModel {
 public:
  virtual ~ResidentModel() = default;
  virtual const ServedModel& served() const = 0;
  virtual int64_t memory_bytes() const = 0;  // what it holds (weights + KV cache)
};

struct LibraryHooks {
  // Builds a model (blocking; any thread). Its ServedModel's name is set to the info's id.
  std::function<Result<std::unique_ptr<ResidentModel>>(const LibraryModelInfo&)> load;
  // The memory a model will hold once loaded, for the budget check before loading it.
  std::function<int64_t(const LibraryModelInfo&)> estimate_bytes;
};

// Why Acquire failed, as the HTTP status it should answer with.
struct LibraryError {
  int http_status = 500;  // 404 unknown id, 503 budget held by busy models, 500 load failed
  std::string message;
};

class ModelLibrary {
 public:
  // A pinned model; destroying the last copy unpins it (and marks it used now, for the LRU order).
  using Lease = std::shared_ptr<const ServedModel>;

  ModelLibrary(std::string root, int64_t memory_budget_bytes, LibraryHooks hooks);
  ~ModelLibrary();
  ModelLibrary(const ModelLibrary&) = delete;
  ModelLibrary& operator=(const ModelLibrary&) = delete;

  // Finds the models below the root again (models that are gone stay resident until idle and
  // evicted; their leases stay valid). An unreadable root is an error.
  Status Rescan() EXCLUDES(mu_);

  // Every scanned model, sorted by id, with its state: "available", "loading", "loaded" or
  // "failed" (+ "error", the last load's message) and, when loaded, "memory_bytes".
  std::vector<nlohmann::json> List() const EXCLUDES(mu_);
  bool Contains(const std::string& id) const EXCLUDES(mu_);

  // The model `id`, loaded if it is not (see the header comment). Blocks for a load.
  std::variant<Lease, LibraryError> Acquire(const std::string& id) EXCLUDES(mu_);

  // A lease on `id` when it is resident (never loads it); null otherwise.
  Lease FindResident(const std::string& id) const EXCLUDES(mu_);
  // A lease on every resident model (for stats and shutdown), sorted by id.
  std::vector<Lease> Resident() const EXCLUDES(mu_);

  // {"root", "memory_budget_bytes", "resident_bytes", "loads", "load_failures", "evictions",
  //  "loading": id or null}
  nlohmann::json Stats() const EXCLUDES(mu_);

 private:
  struct Slot;
  static Lease Pin(const std::shared_ptr<Slot>& slot);
  // Takes idle resident models out, least recently used first, until `needed` more bytes fit
  // the budget; the caller destroys *victims after unlocking (their engines join threads).
  // False (nothing taken) when busy models hold too much.
  bool MakeRoomLocked(int64_t needed, std::vector<std::unique_ptr<ResidentModel>>* victims)
      REQUIRES(mu_);
  int64_t ResidentBytesLocked() const REQUIRES(mu_);
  nlohmann::json EntryLocked(const LibraryModelInfo& info) const REQUIRES(mu_);
  // Acquire's first half: a resident model's lease, an error, or (neither) the load to run
  // with loading_ set and *info / *victims filled.
  std::variant<Lease, LibraryError, std::monostate> BeginLoad(
      const std::string& id, LibraryModelInfo* info,
      std::vector<std::unique_ptr<ResidentModel>>* victims) EXCLUDES(mu_);

  const std::string root_;
  const int64_t budget_;
  LibraryHooks hooks_;
  mutable Mutex mu_;
  CondVar load_done_;  // loading_ went back to ""
  std::map<std::string, LibraryModelInfo> scanned_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Slot>> slots_ GUARDED_BY(mu_);  // every id ever acquired
  std::string loading_ GUARDED_BY(mu_);                                 // being loaded ("" none)
  int64_t loads_ GUARDED_BY(mu_) = 0;
  int64_t load_failures_ GUARDED_BY(mu_) = 0;
  int64_t evictions_ GUARDED_BY(mu_) = 0;
};

// The scan itself (exposed for tests): model folders below `root`, at most `max_depth` levels
// down, following symlinked folders once (the Hugging Face cache's snapshots are links).
Result<std::vector<LibraryModelInfo>> ScanModelFolders(const std::string& root, int max_depth = 4);

}  // namespace ember::serve
