// AdapterRegistry: the LoRA adapters a served model knows by name (--lora NAME=DIR, and the admin
// route's loads and unloads at run time). Registering checks the folder completely against the
// model (LoadLoraAdapter) and keeps its identity (digest), not its matrices: the model's LoraSet
// loads them into a slot when a request needs them. A request resolves its name once, at Submit
// (an AdapterInfo it then holds, so an unload does not disturb requests already submitted).
// Thread-safe (any thread registers, unregisters and looks up).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "util/mutex.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace ember {

struct AdapterInfo {
  std::string name, dir;
  uint64_t digest = 0;  // LoraAdapter::digest
  int32_t rank = 0;
  double scale = 0.0;
  std::vector<std::string> target_modules;
};

// Why `name` cannot name an adapter ("" when it can): 1..128 characters of letters, digits and
// "-_.@/", and not "none" (the base model's name in requests).
std::string AdapterNameProblem(const std::string& name);

class AdapterRegistry {
 public:
  AdapterRegistry(const ModelConfig* config, int32_t max_rank)
      : config_(config), max_rank_(max_rank) {}

  // Errors: a bad name, a name already registered, a folder that does not load for this model.
  Result<std::shared_ptr<const AdapterInfo>> Register(const std::string& name,
                                                      const std::string& dir) EXCLUDES(mu_);
  Status Unregister(const std::string& name) EXCLUDES(mu_);  // error: not registered
  std::shared_ptr<const AdapterInfo> Find(const std::string& name) const EXCLUDES(mu_);
  std::vector<std::shared_ptr<const AdapterInfo>> List() const EXCLUDES(mu_);  // by name

 private:
  const ModelConfig* config_;
  const int32_t max_rank_;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const AdapterInfo>> adapters_ GUARDED_BY(mu_);
};

}  // namespace ember
