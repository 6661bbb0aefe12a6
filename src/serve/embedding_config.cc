#include "serve/embedding_config.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace ember::serve {

namespace {

using nlohmann::json;

// The parsed JSON file, or an error naming it.
Result<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  json parsed = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Status::Error(path + ": not valid JSON");
  return parsed;
}

EmbeddingSupport Unavailable(std::string reason) {
  EmbeddingSupport s;
  s.unavailable_reason = std::move(reason);
  return s;
}

// sentence-transformers' Pooling config: exactly one supported mode set.
Result<PoolingKind> PoolingModeOf(const json& config, const std::string& path) {
  if (!config.is_object()) return Status::Error(path + ": not a JSON object");
  const auto on = [&](const char* key) {
    const auto it = config.find(key);
    return it != config.end() && it->is_boolean() && it->get<bool>();
  };
  for (const char* unsupported : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                  "pooling_mode_weightedmean_tokens"}) {
    if (on(unsupported)) return Status::Error(path + ": " + unsupported + " is not supported");
  }
  const bool last = on("pooling_mode_lasttoken"), mean = on("pooling_mode_mean_tokens"),
             cls = on("pooling_mode_cls_token");
  if (last + mean + cls != 1)
    return Status::Error(path +
                         ": exactly one of pooling_mode_lasttoken, "
                         "pooling_mode_mean_tokens, pooling_mode_cls_token must be true");
  return last ? PoolingKind::kLastToken : mean ? PoolingKind::kMean : PoolingKind::kCls;
}

// modules.json: a Pooling module (the first after the Transformer), then optionally Normalize.
EmbeddingSupport FromModules(const std::string& model_dir, const json& modules) {
  const std::string where = model_dir + "/modules.json";
  if (!modules.is_array()) return Unavailable(where + ": not a JSON array");
  EmbeddingSupport out;
  out.available = true;
  bool have_pooling = false;
  for (const json& m : modules) {
    const std::string type = m.is_object() && m.contains("type") && m["type"].is_string()
                                 ? m["type"].get<std::string>()
                                 : "";
    const std::string path = m.is_object() && m.contains("path") && m["path"].is_string()
                                 ? m["path"].get<std::string>()
                                 : "";
    const std::string name = type.substr(type.rfind('.') + 1);
    if (name == "Transformer") continue;
    if (name == "Normalize" && have_pooling) {
      out.pooling.normalize = true;
      continue;
    }
    if (name == "Pooling" && !have_pooling) {
      const std::string config_path = model_dir + "/" + path + "/config.json";
      Result<json> config = ReadJsonFile(config_path);
      if (!config.ok()) return Unavailable(config.message());
      Result<PoolingKind> kind = PoolingModeOf(*config, config_path);
      if (!kind.ok()) return Unavailable(kind.message());
      out.pooling.kind = *kind;
      have_pooling = true;
      continue;
    }
    return Unavailable(where + ": module '" + (type.empty() ? "?" : type) +
                       "' is not supported (Ember runs Transformer, Pooling, Normalize)");
  }
  if (!have_pooling) return Unavailable(where + ": no Pooling module");
  out.source = where;
  return out;
}

}  // namespace

EmbeddingSupport ReadEmbeddingSupport(const std::string& model_dir) {
  const std::string modules_path = model_dir + "/modules.json";
  if (!std::ifstream(modules_path)) {
    EmbeddingSupport s;
    s.available = true;
    s.pooling = {PoolingKind::kLastToken, true};
    s.source = "default for decoder models (no modules.json): last token, L2-normalized";
    return s;
  }
  Result<json> modules = ReadJsonFile(modules_path);
  if (!modules.ok()) return Unavailable(modules.message());
  return FromModules(model_dir, *modules);
}

}  // namespace ember::serve
