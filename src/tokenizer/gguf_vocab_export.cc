// GgufVocabFromTokenizerDir (gguf_vocab_export.h).
#include "tokenizer/gguf_vocab_export.h"

#include <map>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "util/mapped_file.h"

namespace ember {
namespace {

using nlohmann::json;

constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

// Whether a tokenizer.json component (or any step of a Sequence) satisfies `pred`.
template <typename Pred>
bool AnyStep(const json& component, const Pred& pred) {
  if (!component.is_object()) return false;
  if (pred(component)) return true;
  for (const char* list : {"normalizers", "pretokenizers"})
    if (component.contains(list) && component[list].is_array())
      for (const json& step : component[list])
        if (AnyStep(step, pred)) return true;
  return false;
}

bool PrependsSpace(const json& root) {
  const auto prepend = [](const json& c) {
    const std::string type = c.value("type", "");
    if (type == "Prepend") return c.value("prepend", "") == kSpace;
    if (type == "Metaspace") return c.value("prepend_scheme", "always") != "never";
    return false;
  };
  return AnyStep(root["normalizer"], prepend) || AnyStep(root["pre_tokenizer"], prepend);
}

bool IsSentencePiece(const json& root) {
  const json& model = root["model"];
  const auto metaspace = [](const json& c) {
    return c.value("type", "") == "Metaspace" ||
           (c.value("type", "") == "Replace" && c.value("content", "") == kSpace);
  };
  return model.value("byte_fallback", false) || AnyStep(root["normalizer"], metaspace) ||
         AnyStep(root["pre_tokenizer"], metaspace);
}

// tokenizer.ggml.pre of a byte-level BPE, from its Split regex.
Result<std::string> PreTokenizerName(const json& root, const std::string& path) {
  std::string regex;
  AnyStep(root["pre_tokenizer"], [&](const json& c) {
    if (c.value("type", "") != "Split" || !c.contains("pattern")) return false;
    regex = c["pattern"].value("Regex", "");
    return true;
  });
  if (regex.empty()) return std::string("gpt-2");  // ByteLevel's own GPT-2 regex (llama.cpp's name)
  if (auto pre = GgufPreForRegex(regex)) return *pre;
  return Status::Error(path + ": the pre-tokenizer's split regex is not one GGUF names (known: " +
                       SupportedGgufPreTokenizers() + "): " + regex);
}

// "llama" scores: -rank for a merged piece, below every merge for the others, 0 user-defined.
void SentencePieceScores(GgufVocab* v) {
  const size_t n = v->tokens.size();
  std::map<std::string, size_t> rank;
  for (size_t r = 0; r < v->merges.size(); ++r) {
    std::string joined = v->merges[r];
    joined.erase(joined.find(' '), 1);
    rank.emplace(joined, r);
  }
  v->scores.assign(n, 0.0f);
  for (size_t id = 0; id < n; ++id) {
    auto it = rank.find(v->tokens[id]);
    v->scores[id] = it != rank.end() ? -float(it->second) : -1e7f - float(id);
    if (v->token_types[id] == int32_t(GgufTokenType::kUserDefined)) v->scores[id] = 0.0f;
  }
  v->merges.clear();
}

// Tokens, types and merges of the tokenizer.json `root`.
void ReadTokens(const json& root, GgufVocab* v) {
  size_t n = 0;
  for (const auto& [token, id] : root["model"]["vocab"].items())
    n = std::max(n, id.get<size_t>() + 1);
  for (const json& a : root["added_tokens"]) n = std::max(n, a["id"].get<size_t>() + 1);
  v->tokens.assign(n, "");
  v->token_types.assign(n, int32_t(GgufTokenType::kUnused));
  for (size_t id = 0; id < n; ++id) v->tokens[id] = "[PAD" + std::to_string(id) + "]";
  for (const auto& [token, id] : root["model"]["vocab"].items()) {
    v->tokens[id.get<size_t>()] = token;
    const bool byte = token.size() == 6 && token.rfind("<0x", 0) == 0 && token[5] == '>';
    v->token_types[id.get<size_t>()] =
        int32_t(byte ? GgufTokenType::kByte : GgufTokenType::kNormal);
  }
  for (const json& a : root["added_tokens"]) {
    const size_t id = a["id"].get<size_t>();
    v->tokens[id] = a["content"].get<std::string>();
    v->token_types[id] = int32_t(a.value("special", false) ? GgufTokenType::kControl
                                                           : GgufTokenType::kUserDefined);
  }
  for (const json& m : root["model"]["merges"])
    v->merges.push_back(m.is_string() ? m.get<std::string>()
                                      : m[0].get<std::string>() + " " + m[1].get<std::string>());
}

}  // namespace

Result<GgufVocab> GgufVocabFromTokenizerDir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  EMBER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object() || !root.contains("model") ||
      !root["model"].is_object())
    return Status::Error(path + ": not a tokenizer.json (no \"model\" object)");
  const std::string type = root["model"].value("type", "");
  if (type != "BPE")
    return Status::Error(path + ": model type \"" + type +
                         "\" has no GGUF vocabulary Ember writes (BPE only)");
  EMBER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(dir));
  GgufVocab v;
  ReadTokens(root, &v);
  if (IsSentencePiece(root)) {
    v.model = "llama";
    v.add_space_prefix = PrependsSpace(root);
    SentencePieceScores(&v);
  } else {
    v.model = "gpt2";
    EMBER_ASSIGN_OR_RETURN(v.pre, PreTokenizerName(root, path));
  }
  v.bos_token_id = tok->bos_token_id();
  v.eos_token_id = tok->eos_token_id();
  if (auto unk = root["model"].value("unk_token", json()); unk.is_string())
    v.unknown_token_id = tok->TokenToId(unk.get<std::string>());
  const std::vector<int32_t> plain = tok->Encode("a", false), special = tok->Encode("a", true);
  v.add_bos_token = special.size() > plain.size() && special.front() != plain.front();
  v.add_eos_token = special.size() > plain.size() && special.back() != plain.back();
  return v;
}

}  // namespace ember
