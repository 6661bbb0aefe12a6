#include "engine/adapter_registry.h"

#include "model/lora_adapter.h"

namespace ember {

std::string AdapterNameProblem(const std::string& name) {
  if (name.empty() || name.size() > 128) return "an adapter name has 1..128 characters";
  if (name == "none") return "\"none\" names the base model, not an adapter";
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' ||
                    ch == '@' || ch == '/';
    if (!ok) return "adapter name \"" + name + "\": only letters, digits and -_.@/";
  }
  return "";
}

Result<std::shared_ptr<const AdapterInfo>> AdapterRegistry::Register(const std::string& name,
                                                                     const std::string& dir) {
  if (const std::string why = AdapterNameProblem(name); !why.empty()) return Status::Error(why);
  {
    MutexLock lock(&mu_);
    if (adapters_.count(name) != 0)
      return Status::Error("adapter \"" + name + "\" is already loaded (unload it first)");
  }
  EMBER_ASSIGN_OR_RETURN(const LoraAdapter adapter, LoadLoraAdapter(dir, *config_, max_rank_));
  auto info = std::make_shared<AdapterInfo>();
  info->name = name;
  info->dir = dir;
  info->digest = adapter.digest;
  info->rank = adapter.config.rank;
  info->scale = adapter.config.scale();
  info->target_modules = adapter.config.target_modules;
  MutexLock lock(&mu_);
  if (!adapters_.emplace(name, info).second)
    return Status::Error("adapter \"" + name + "\" is already loaded (unload it first)");
  return std::shared_ptr<const AdapterInfo>(info);
}

Status AdapterRegistry::Unregister(const std::string& name) {
  MutexLock lock(&mu_);
  if (adapters_.erase(name) == 0) return Status::Error("adapter \"" + name + "\" is not loaded");
  return Status::Ok();
}

std::shared_ptr<const AdapterInfo> AdapterRegistry::Find(const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = adapters_.find(name);
  return it == adapters_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const AdapterInfo>> AdapterRegistry::List() const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const AdapterInfo>> out;
  for (const auto& [name, info] : adapters_) out.push_back(info);
  return out;
}

}  // namespace ember
