#include "serve/model_library.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <system_error>

#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_quants.h"
#include "serve/embedding_config.h"
#include "serve/gguf_chat_template.h"
#include "serve/output_parsers.h"
#include "template/chat_template.h"
#include "util/log.h"
#include "util/mapped_file.h"

namespace ember::serve {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kMaxConfigBytes = size_t{4} << 20;

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool IsFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool IsModelFolder(const fs::path& dir) {
  return IsFile(dir / "config.json") &&
         (IsFile(dir / "model.safetensors") || IsFile(dir / "model.safetensors.index.json"));
}

int64_t FolderBytes(const fs::path& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::error_code size_ec;
    if (!e.is_regular_file(size_ec)) continue;  // follows links (the HF cache's blobs)
    const uintmax_t size = fs::file_size(e.path(), size_ec);
    if (!size_ec) total += static_cast<int64_t>(size);
  }
  return total;
}

Result<json> ReadJsonFile(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return Status::Error(path.string() + ": " + ec.message());
  if (size > kMaxConfigBytes) return Status::Error(path.string() + ": larger than 4 MiB");
  auto text = ReadFileToString(path.string());
  if (!text.ok()) return text.status();
  json parsed = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object())
    return Status::Error(path.string() + ": not a JSON object");
  return parsed;
}

// config.json's facts; multimodal configs keep the language model's in text_config.
void DescribeConfig(const json& config, json* details) {
  const json& text = config.contains("text_config") && config["text_config"].is_object()
                         ? config["text_config"]
                         : config;
  if (config.contains("architectures") && config["architectures"].is_array() &&
      !config["architectures"].empty() && config["architectures"][0].is_string())
    (*details)["architecture"] = config["architectures"][0];
  (*details)["model_type"] = config.value("model_type", json());
  const json ctx = text.value("max_position_embeddings", json());
  (*details)["context_length"] = ctx.is_number_integer() ? ctx : json();
  json dtype = config.value("torch_dtype", json());
  if (dtype.is_null()) dtype = config.value("dtype", json());
  (*details)["dtype"] = dtype.is_string() ? dtype : json();
  json quant;
  if (config.contains("quantization_config") && config["quantization_config"].is_object())
    quant = config["quantization_config"].value("quant_method", json("unknown"));
  (*details)["quantization"] = quant;
}

void DescribeTemplate(Result<ChatTemplate> chat_template, LibraryModelInfo* info) {
  if (!chat_template.ok()) {
    info->details["chat_template"] = false;
    info->problem = "chat template: " + chat_template.message();
    return;
  }
  const bool chat = chat_template->has_template();
  info->details["chat_template"] = chat;
  auto parsers = ChooseOutputParsers("auto", "auto", chat_template->tools_source());
  const ToolCallFormat tools = parsers.ok() ? parsers->tools : ToolCallFormat::kNone;
  const ReasoningFormat reasoning = parsers.ok() ? parsers->reasoning : ReasoningFormat::kNone;
  info->details["tools"] = chat && tools != ToolCallFormat::kNone;
  info->details["tool_call_format"] = ToolCallFormatName(tools);
  info->details["reasoning_format"] = ReasoningFormatName(reasoning);
}

// The id of a model found at `path` below `root`: the names walked, links unresolved.
std::string IdOf(const fs::path& root, const fs::path& path) {
  const fs::path rel = path.lexically_relative(root);
  return rel.empty() || rel == "." ? path.filename().string() : rel.generic_string();
}

// Embeddings by the server's own rule (sentence-transformers' modules, else the last token).
void DescribeEmbeddings(const std::string& path, LibraryModelInfo* info) {
  const EmbeddingSupport embeddings = ReadEmbeddingSupport(path);
  info->details["embeddings"] = embeddings.available;
  info->details["pooling"] =
      embeddings.available ? json(PoolingKindName(embeddings.pooling.kind)) : json();
}

// The type most of a GGUF file's matrices have (its quantization, e.g. "Q4_K"), counted per
// tensor: a Q4_0 file whose large embedding table is Q8_0 is still a Q4_0 file.
std::string MainTensorType(const GgufFile& file) {
  std::map<std::string, int64_t> count;
  for (const GgufTensorInfo& t : file.tensors())
    if (t.dims.size() >= 2) ++count[std::string(GgmlTypeName(t.type))];
  std::string best;
  for (const auto& [name, n] : count)
    if (best.empty() || n > count[best]) best = name;
  return best;
}

// A .gguf file: what its metadata says (the config Ember would build, the main tensor type, the
// chat template), without reading its tensors.
LibraryModelInfo DescribeGgufFile(const fs::path& root, const fs::path& file) {
  LibraryModelInfo info;
  std::string id = IdOf(root, file);
  if (id.size() > 5 && id.ends_with(".gguf")) id.resize(id.size() - 5);
  info.id = id;
  info.path = file.string();
  std::error_code ec;
  info.disk_bytes = static_cast<int64_t>(fs::file_size(file, ec));
  info.details["format"] = "gguf";
  info.details["disk_bytes"] = info.disk_bytes;
  auto gguf = GgufFile::Open(info.path);
  if (!gguf.ok()) {
    info.problem = gguf.message();
    return info;
  }
  auto arch = gguf->GetString("general.architecture");
  info.details["architecture"] = arch.ok() ? json(std::string(*arch)) : json();
  info.details["model_type"] = info.details["architecture"];
  const std::string main_type = MainTensorType(*gguf);
  info.details["dtype"] = main_type.empty() ? json() : json(main_type);
  const bool quantized = !main_type.empty() && main_type != "F32" && main_type != "F16" &&
                         main_type != "BF16";
  info.details["quantization"] = quantized ? json(main_type) : json();
  auto config = GgufModelConfig(*gguf);
  info.details["context_length"] = config.ok() ? json(config->max_position_embeddings) : json();
  DescribeEmbeddings(info.path, &info);
  auto vocab = GgufVocabOf(*gguf);
  DescribeTemplate(GgufFileChatTemplate(*gguf), &info);  // sets problem when it fails
  if (!config.ok()) info.problem = config.message();
  else if (!vocab.ok()) info.problem = vocab.message();
  return info;
}

LibraryModelInfo Describe(const fs::path& root, const fs::path& dir) {
  LibraryModelInfo info;
  info.id = IdOf(root, dir);
  info.path = dir.string();
  info.disk_bytes = FolderBytes(dir);
  info.details["format"] = "safetensors";
  info.details["disk_bytes"] = info.disk_bytes;
  auto config = ReadJsonFile(dir / "config.json");
  if (!config.ok()) {
    info.problem = config.message();
    return info;
  }
  DescribeConfig(*config, &info.details);
  DescribeEmbeddings(dir.string(), &info);
  DescribeTemplate(ChatTemplate::Load(dir.string()), &info);
  if (!IsFile(dir / "tokenizer.json")) info.problem = "no tokenizer.json (the server needs one)";
  return info;
}

void Walk(const fs::path& root, const fs::path& dir, int depth, int max_depth,
          std::set<std::string>* seen, std::vector<LibraryModelInfo>* out) {
  std::error_code ec;
  const fs::path real = fs::canonical(dir, ec);
  if (ec || !seen->insert(real.string()).second) return;  // unreadable, or a link cycle
  if (IsModelFolder(dir)) {
    out->push_back(Describe(root, dir));
    return;
  }
  if (depth >= max_depth) return;
  std::vector<fs::path> children, gguf_files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::error_code type_ec;
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (e.is_directory(type_ec)) children.push_back(e.path());
    else if (IsGgufFile(e.path().string())) gguf_files.push_back(e.path());
  }
  std::sort(gguf_files.begin(), gguf_files.end());
  for (const fs::path& file : gguf_files) out->push_back(DescribeGgufFile(root, file));
  std::sort(children.begin(), children.end());
  for (const fs::path& child : children) Walk(root, child, depth + 1, max_depth, seen, out);
}

}  // namespace

Result<std::vector<LibraryModelInfo>> ScanModelFolders(const std::string& root, int max_depth) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return Status::Error("--models-dir " + root + ": not a readable folder");
  std::vector<LibraryModelInfo> found;
  std::set<std::string> seen;
  Walk(fs::path(root), fs::path(root), 0, max_depth, &seen, &found);
  std::sort(found.begin(), found.end(),
            [](const LibraryModelInfo& a, const LibraryModelInfo& b) { return a.id < b.id; });
  // Two links to one folder, or names that collide: the first id wins, the rest are dropped.
  found.erase(std::unique(found.begin(), found.end(),
                          [](const LibraryModelInfo& a, const LibraryModelInfo& b) {
                            return a.id == b.id;
                          }),
              found.end());
  return found;
}

// One id's residency. `pins` and `last_used_ns` change without the library's mutex (a lease's
// release); a pin is only taken under it, so pins == 0 seen under the mutex stays 0.
struct ModelLibrary::Slot {
  std::unique_ptr<ResidentModel> model;
  std::atomic<int> pins{0};
  std::atomic<int64_t> last_used_ns{0};
  std::string error;  // the last load's failure
};

ModelLibrary::ModelLibrary(std::string root, int64_t memory_budget_bytes, LibraryHooks hooks)
    : root_(std::move(root)), budget_(memory_budget_bytes), hooks_(std::move(hooks)) {}

ModelLibrary::~ModelLibrary() = default;

Status ModelLibrary::Rescan() {
  auto found = ScanModelFolders(root_);
  if (!found.ok()) return found.status();
  MutexLock lock(&mu_);
  scanned_.clear();
  for (LibraryModelInfo& info : *found) scanned_[info.id] = std::move(info);
  return Status::Ok();
}

bool ModelLibrary::Contains(const std::string& id) const {
  MutexLock lock(&mu_);
  return scanned_.count(id) != 0 || slots_.count(id) != 0;
}

json ModelLibrary::EntryLocked(const LibraryModelInfo& info) const {
  json entry = info.details;
  entry["id"] = info.id;
  entry["state"] = "available";
  if (!info.problem.empty()) {
    entry["state"] = "unavailable";
    entry["error"] = info.problem;
  }
  auto it = slots_.find(info.id);
  if (loading_ == info.id) {
    entry["state"] = "loading";
  } else if (it != slots_.end() && it->second->model != nullptr) {
    entry["state"] = "loaded";
    entry["memory_bytes"] = it->second->model->memory_bytes();
    entry["in_use"] = it->second->pins.load();
  } else if (it != slots_.end() && !it->second->error.empty()) {
    entry["state"] = "failed";
    entry["error"] = it->second->error;
  }
  return entry;
}

std::vector<json> ModelLibrary::List() const {
  MutexLock lock(&mu_);
  std::vector<json> out;
  for (const auto& [id, info] : scanned_) out.push_back(EntryLocked(info));
  return out;
}

int64_t ModelLibrary::ResidentBytesLocked() const {
  int64_t total = 0;
  for (const auto& [id, slot] : slots_)
    if (slot->model != nullptr) total += slot->model->memory_bytes();
  return total;
}

ModelLibrary::Lease ModelLibrary::Pin(const std::shared_ptr<Slot>& slot) {
  slot->pins.fetch_add(1);
  slot->last_used_ns.store(SteadyNowNs());
  // The lease's control block keeps the slot (not the library) alive; releasing unpins.
  std::shared_ptr<Slot> keep = slot;
  auto release = [keep](const ServedModel*) {
    keep->last_used_ns.store(SteadyNowNs());
    keep->pins.fetch_sub(1);
  };
  return Lease(&slot->model->served(), release);
}

bool ModelLibrary::MakeRoomLocked(int64_t needed,
                                  std::vector<std::unique_ptr<ResidentModel>>* victims) {
  int64_t free_bytes = budget_ - ResidentBytesLocked();
  if (free_bytes >= needed) return true;
  std::vector<Slot*> idle;
  for (auto& [id, slot] : slots_)
    if (slot->model != nullptr && slot->pins.load() == 0) idle.push_back(slot.get());
  std::sort(idle.begin(), idle.end(), [](const Slot* a, const Slot* b) {
    return a->last_used_ns.load() < b->last_used_ns.load();
  });
  size_t take = 0;
  for (; take < idle.size() && free_bytes < needed; ++take)
    free_bytes += idle[take]->model->memory_bytes();
  if (free_bytes < needed) return false;
  for (size_t i = 0; i < take; ++i) victims->push_back(std::move(idle[i]->model));
  evictions_ += static_cast<int64_t>(take);
  return true;
}

std::variant<ModelLibrary::Lease, LibraryError, std::monostate> ModelLibrary::BeginLoad(
    const std::string& id, LibraryModelInfo* info,
    std::vector<std::unique_ptr<ResidentModel>>* victims) {
  MutexLock lock(&mu_);
  // One load at a time: memory is checked against what is resident.
  load_done_.Wait(&mu_, [&]() REQUIRES(mu_) {
    auto it = slots_.find(id);
    return loading_.empty() || (it != slots_.end() && it->second->model != nullptr);
  });
  auto slot_it = slots_.find(id);
  if (slot_it != slots_.end() && slot_it->second->model != nullptr) return Pin(slot_it->second);
  auto info_it = scanned_.find(id);
  if (info_it == scanned_.end()) return LibraryError{404, "The model '" + id + "' does not exist"};
  *info = info_it->second;
  if (!info->problem.empty())
    return LibraryError{400, "The model '" + id + "' cannot be loaded: " + info->problem};
  const int64_t estimate = hooks_.estimate_bytes ? hooks_.estimate_bytes(*info) : 0;
  if (!MakeRoomLocked(estimate, victims)) {
    return LibraryError{503, "The model '" + id + "' needs about " + std::to_string(estimate >> 20) +
                                 " MiB and the models in use leave less of the memory budget (" +
                                 std::to_string(budget_ >> 20) + " MiB); retry when they are idle"};
  }
  loading_ = id;
  return std::monostate{};
}

std::variant<ModelLibrary::Lease, LibraryError> ModelLibrary::Acquire(const std::string& id) {
  LibraryModelInfo info;
  std::vector<std::unique_ptr<ResidentModel>> victims;
  auto begun = BeginLoad(id, &info, &victims);
  if (auto* lease = std::get_if<Lease>(&begun)) return std::move(*lease);
  if (auto* error = std::get_if<LibraryError>(&begun)) return std::move(*error);
  for (const auto& victim : victims) LOG_INFO << "model library: evicting " << victim->served().name;
  victims.clear();  // their engines stop here, outside the lock
  LOG_INFO << "model library: loading " << id << " from " << info.path;
  Result<std::unique_ptr<ResidentModel>> loaded = Status::Error("no loader");
  try {
    loaded = hooks_.load(info);
  } catch (const std::exception& e) {  // e.g. out of memory: the library stays consistent
    loaded = Status::Error(e.what());
  }
  MutexLock lock(&mu_);
  loading_.clear();
  load_done_.NotifyAll();
  std::shared_ptr<Slot>& slot = slots_[id];
  if (slot == nullptr) slot = std::make_shared<Slot>();
  ++loads_;
  if (!loaded.ok()) {
    ++load_failures_;
    slot->error = loaded.message();
    LOG_ERROR << "model library: loading " << id << " failed: " << loaded.message();
    return LibraryError{500, "loading the model '" + id + "' failed: " + loaded.message()};
  }
  slot->error.clear();
  slot->model = std::move(*loaded);
  LOG_INFO << "model library: " << id << " loaded (" << (slot->model->memory_bytes() >> 20)
           << " MiB)";
  return Pin(slot);
}

ModelLibrary::Lease ModelLibrary::FindResident(const std::string& id) const {
  MutexLock lock(&mu_);
  auto it = slots_.find(id);
  return it != slots_.end() && it->second->model != nullptr ? Pin(it->second) : nullptr;
}

std::vector<ModelLibrary::Lease> ModelLibrary::Resident() const {
  MutexLock lock(&mu_);
  std::vector<Lease> out;
  for (const auto& [id, slot] : slots_)
    if (slot->model != nullptr) out.push_back(Pin(slot));
  return out;
}

json ModelLibrary::Stats() const {
  MutexLock lock(&mu_);
  return {{"root", root_},
          {"memory_budget_bytes", budget_},
          {"resident_bytes", ResidentBytesLocked()},
          {"loads", loads_},
          {"load_failures", load_failures_},
          {"evictions", evictions_},
          {"loading", loading_.empty() ? json() : json(loading_)}};
}

}  // namespace ember::serve
