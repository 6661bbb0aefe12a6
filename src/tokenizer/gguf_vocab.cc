// Tokenizer::FromGgufVocab: a GGUF vocabulary -> the normalizer, pre-tokenizer, model, added
// tokens, post-processing and decoder of the tokenizer.json pipeline it stands for. The small
// components are described as tokenizer.json would describe them and built by their FromJson, so
// both sources share one implementation of each step.
#include "tokenizer/gguf_vocab.h"

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/spm_model.h"
#include "tokenizer/tokenizer.h"

namespace ember {
namespace {

using nlohmann::json;

constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

// The split regexes of the byte-level vocabularies, by tokenizer.ggml.pre (the patterns of the
// models' own tokenizer.json files).
struct PreTokenizerSpec {
  const char* names[3];  // the tokenizer.ggml.pre values that mean it
  const char* regex;     // nullptr: GPT-2's, inside the ByteLevel step
  bool ignore_merges;    // a whole word that is a token is taken as it is
  bool nfc;              // the model's tokenizer.json normalizes to NFC first
  bool add_bos;          // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
};

const PreTokenizerSpec kPreTokenizers[] = {
    {{"default", "gpt2", "gpt-2"}, nullptr, false, false, false},
    {{"llama3", "llama-v3", "llama-bpe"},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     true,
     false,
     true},
    {{"qwen2", nullptr, nullptr},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     false,
     true,
     false},
    {{"gpt-4o", nullptr, nullptr},
     R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     true,
     false,
     false},
};

const PreTokenizerSpec* FindPreTokenizer(const std::string& pre) {
  const std::string name = pre.empty() ? "default" : pre;
  for (const PreTokenizerSpec& spec : kPreTokenizers)
    for (const char* n : spec.names)
      if (n != nullptr && name == n) return &spec;
  return nullptr;
}

// Builds a component from its tokenizer.json description.
template <typename T>
Result<std::unique_ptr<T>> FromSpec(const json& spec) {
  simdjson::padded_string text(spec.dump());
  simdjson::dom::parser parser;
  tok::Json root;
  if (parser.parse(text).get(root) != simdjson::SUCCESS)
    return Status::Error("internal: a component description is not valid JSON");
  return T::FromJson(root);
}

Status CheckId(const std::optional<int32_t>& id, const char* key, size_t num_tokens) {
  if (id && (*id < 0 || size_t(*id) >= num_tokens))
    return Status::Error(std::string(key) + ": " + std::to_string(*id) +
                         " is not a token id (the vocabulary has " + std::to_string(num_tokens) +
                         " tokens)");
  return Status::Ok();
}

Status CheckVocab(const GgufVocab& v) {
  if (v.tokens.empty()) return Status::Error("tokenizer.ggml.tokens: missing or empty");
  if (v.tokens.size() > size_t(INT32_MAX))
    return Status::Error("tokenizer.ggml.tokens: too many tokens");
  const size_t n = v.tokens.size();
  if (!v.token_types.empty() && v.token_types.size() != n)
    return Status::Error("tokenizer.ggml.token_type: " + std::to_string(v.token_types.size()) +
                         " entries, expected one per token (" + std::to_string(n) + ")");
  for (size_t i = 0; i < v.token_types.size(); ++i)
    if (v.token_types[i] < 0 || v.token_types[i] > int32_t(GgufTokenType::kByte))
      return Status::Error("tokenizer.ggml.token_type[" + std::to_string(i) +
                           "]: " + std::to_string(v.token_types[i]) + " is not a token type (0-6)");
  EMBER_RETURN_IF_ERROR(CheckId(v.bos_token_id, "tokenizer.ggml.bos_token_id", n));
  EMBER_RETURN_IF_ERROR(CheckId(v.eos_token_id, "tokenizer.ggml.eos_token_id", n));
  EMBER_RETURN_IF_ERROR(CheckId(v.unknown_token_id, "tokenizer.ggml.unknown_token_id", n));
  EMBER_RETURN_IF_ERROR(CheckId(v.padding_token_id, "tokenizer.ggml.padding_token_id", n));
  if (v.model == "llama" && v.scores.size() != n)
    return Status::Error("tokenizer.ggml.scores: " + std::to_string(v.scores.size()) +
                         " entries, expected one per token (" + std::to_string(n) + ")");
  if (v.model == "gpt2" && v.merges.empty())
    return Status::Error("tokenizer.ggml.merges: missing (a \"gpt2\" vocabulary needs them)");
  return Status::Ok();
}

GgufTokenType TypeOf(const GgufVocab& v, size_t id) {
  return v.token_types.empty() ? GgufTokenType::kNormal : GgufTokenType(v.token_types[id]);
}

// The steps of one vocabulary type, and the ids and defaults it settles.
struct Pipeline {
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::WordModel> model;
  std::unique_ptr<tok::Decoder> decoder;
  std::optional<int32_t> bos, eos;
  bool add_bos = false;
};

// "llama": Prepend "▁" (add_space_prefix) and spaces -> "▁"; score-driven merges; "▁" -> space,
// byte fallback, one leading space stripped. Ids default as llama.cpp's: unk 0, bos 1, eos 2.
Result<Pipeline> SentencePiecePipeline(const GgufVocab& v) {
  Pipeline p;
  const int32_t n = int32_t(v.tokens.size());
  p.bos = v.bos_token_id;
  p.eos = v.eos_token_id;
  if (!p.bos && n > 1) p.bos = 1;
  if (!p.eos && n > 2) p.eos = 2;
  p.add_bos = v.add_bos_token.value_or(true);
  const bool space_prefix = v.add_space_prefix.value_or(true);
  json normalizers = json::array();
  if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
  EMBER_ASSIGN_OR_RETURN(p.normalizer, FromSpec<tok::Normalizer>(
                                           {{"type", "Sequence"}, {"normalizers", normalizers}}));
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (space_prefix)
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  EMBER_ASSIGN_OR_RETURN(p.decoder,
                         FromSpec<tok::Decoder>({{"type", "Sequence"}, {"decoders", decoders}}));
  std::vector<uint8_t> mergeable(v.tokens.size());
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const GgufTokenType type = TypeOf(v, id);
    // User-defined pieces merge by score too (llama.cpp looks every token up; SentencePiece
    // gives them score 0, so whitespace runs such as "▁▁" form first).
    mergeable[id] = type == GgufTokenType::kNormal || type == GgufTokenType::kUndefined ||
                    type == GgufTokenType::kUserDefined;
  }
  EMBER_ASSIGN_OR_RETURN(p.model, tok::SpmModel::Create(v.tokens, v.scores, std::move(mergeable),
                                                        v.unknown_token_id.value_or(0)));
  return p;
}

// "gpt2": the Split regex tokenizer.ggml.pre names, then the byte-level alphabet; ranked merges;
// the byte-level decoder.
Result<Pipeline> ByteLevelPipeline(const GgufVocab& v) {
  const PreTokenizerSpec* pre = FindPreTokenizer(v.pre);
  if (pre == nullptr)
    return Status::Error("tokenizer.ggml.pre: \"" + v.pre +
                         "\" is not supported (supported: " + SupportedGgufPreTokenizers() + ")");
  Pipeline p;
  p.bos = v.bos_token_id;
  p.eos = v.eos_token_id;
  p.add_bos = v.add_bos_token.value_or(pre->add_bos);
  json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", pre->regex == nullptr}};
  json steps = json::array();
  if (pre->regex != nullptr)
    steps.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", pre->regex}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
  steps.push_back(byte_level);
  EMBER_ASSIGN_OR_RETURN(p.pre_tokenizer, FromSpec<tok::PreTokenizer>(
                                              {{"type", "Sequence"}, {"pretokenizers", steps}}));
  if (pre->nfc) {
    EMBER_ASSIGN_OR_RETURN(p.normalizer, FromSpec<tok::Normalizer>({{"type", "NFC"}}));
  }
  EMBER_ASSIGN_OR_RETURN(p.decoder, FromSpec<tok::Decoder>(byte_level));
  EMBER_ASSIGN_OR_RETURN(p.model, tok::BpeModel::FromVocab(v.tokens, v.merges, pre->ignore_merges));
  return p;
}

}  // namespace

std::string SupportedGgufPreTokenizers() {
  std::string out;
  for (const PreTokenizerSpec& spec : kPreTokenizers)
    for (const char* n : spec.names)
      if (n != nullptr) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

std::optional<std::string> GgufPreForRegex(std::string_view regex) {
  for (const PreTokenizerSpec& spec : kPreTokenizers) {
    if (spec.regex == nullptr || regex != spec.regex) continue;
    const char* name = spec.names[0];  // the last listed: the name llama.cpp's converter writes
    for (const char* n : spec.names)
      if (n != nullptr) name = n;
    return std::string(name);
  }
  return std::nullopt;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGgufVocab(const GgufVocab& v) {
  if (v.model != "llama" && v.model != "gpt2")
    return Status::Error("tokenizer.ggml.model: \"" + v.model +
                         "\" is not supported (supported: llama, gpt2)");
  EMBER_RETURN_IF_ERROR(CheckVocab(v));
  EMBER_ASSIGN_OR_RETURN(Pipeline pipeline,
                         v.model == "llama" ? SentencePiecePipeline(v) : ByteLevelPipeline(v));
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->normalizer_ = std::move(pipeline.normalizer);
  t->pre_tokenizer_ = std::move(pipeline.pre_tokenizer);
  t->model_ = std::move(pipeline.model);
  t->decoder_ = std::move(pipeline.decoder);
  // Control, unknown and user-defined tokens are cut out of the raw text before the model runs.
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const GgufTokenType type = TypeOf(v, id);
    if (type != GgufTokenType::kControl && type != GgufTokenType::kUnknown &&
        type != GgufTokenType::kUserDefined)
      continue;
    if (v.tokens[id].empty()) continue;
    tok::AddedToken added;
    added.id = int32_t(id);
    added.content = v.tokens[id];
    added.special = type != GgufTokenType::kUserDefined;
    t->added_.push_back(std::move(added));
  }
  t->IndexAddedTokens();
  const std::optional<int32_t> bos = pipeline.bos, eos = pipeline.eos;
  if (pipeline.add_bos && bos) t->prefix_ids_.push_back(*bos);
  if (v.add_eos_token.value_or(false) && eos) t->suffix_ids_.push_back(*eos);
  if (bos) {
    t->bos_token_id_ = bos;
    t->bos_token_ = v.tokens[size_t(*bos)];
  }
  if (eos) {
    t->eos_token_id_ = eos;
    t->eos_token_ = v.tokens[size_t(*eos)];
  }
  return t;
}

}  // namespace ember
