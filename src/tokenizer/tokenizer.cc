#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/json.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/check.h"
#include "util/mapped_file.h"

namespace ember {

using tok::Json;
using tok::JsonField;

namespace {

// Ids a post-processor puts around a single sequence.
struct Wrap {
  std::vector<int32_t> prefix, suffix;
};

Status ParsePostProcessor(Json json, Wrap* wrap) {
  std::string type = tok::JsonTypeOf(json);
  if (type == "Sequence") {
    simdjson::dom::array arr;
    auto f = JsonField(json, "processors");
    if (!f || f->get_array().get(arr) != simdjson::SUCCESS)
      return Status::Error("post_processor Sequence: expected an array 'processors'");
    for (Json child : arr) {
      Wrap inner;
      EMBER_RETURN_IF_ERROR(ParsePostProcessor(child, &inner));
      // A later processor wraps what the earlier ones produced.
      inner.prefix.insert(inner.prefix.end(), wrap->prefix.begin(), wrap->prefix.end());
      wrap->prefix = std::move(inner.prefix);
      wrap->suffix.insert(wrap->suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") return Status::Ok();  // only trims offsets
  if (type == "TemplateProcessing") {
    simdjson::dom::array single;
    auto f = JsonField(json, "single");
    if (!f || f->get_array().get(single) != simdjson::SUCCESS)
      return Status::Error("post_processor TemplateProcessing: expected an array 'single'");
    auto specials = JsonField(json, "special_tokens");
    bool seen_sequence = false;
    for (Json item : single) {
      if (JsonField(item, "Sequence")) {
        seen_sequence = true;
        continue;
      }
      auto special = JsonField(item, "SpecialToken");
      if (!special) return Status::Error("post_processor TemplateProcessing: unknown item");
      EMBER_ASSIGN_OR_RETURN(auto name, tok::JsonString(*special, "id", "TemplateProcessing item"));
      std::optional<Json> entry = specials ? JsonField(*specials, name) : std::nullopt;
      simdjson::dom::array ids;
      if (!entry || !JsonField(*entry, "ids") || JsonField(*entry, "ids")->get_array().get(ids))
        return Status::Error("post_processor TemplateProcessing: special token '" +
                             std::string(name) + "' is not in 'special_tokens'");
      for (Json id : ids) {
        int64_t v;
        if (id.get_int64().get(v) != simdjson::SUCCESS)
          return Status::Error("post_processor TemplateProcessing: bad id for '" +
                               std::string(name) + "'");
        (seen_sequence ? wrap->suffix : wrap->prefix).push_back(int32_t(v));
      }
    }
    return Status::Ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      simdjson::dom::array pair;
      int64_t id;
      auto f = JsonField(json, key);
      if (!f || f->get_array().get(pair) || pair.size() != 2 || pair.at(1).get_int64().get(id))
        return Status::Error("post_processor " + type + ": expected '" + key + "': [token, id]");
      (std::string(key) == "cls" ? wrap->prefix : wrap->suffix).push_back(int32_t(id));
    }
    return Status::Ok();
  }
  return Status::Error("unsupported post_processor type '" + type + "'");
}

Result<simdjson::padded_string> LoadPadded(const std::string& path) {
  EMBER_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return simdjson::padded_string(reinterpret_cast<const char*>(file.data()), file.size());
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  std::string json_path = dir + "/tokenizer.json";
  if (!FileExists(json_path)) return Status::Error(json_path + ": not found");
  EMBER_RETURN_IF_ERROR(t->LoadTokenizerJson(json_path).WithContext(json_path));
  std::string config_path = dir + "/tokenizer_config.json";
  if (FileExists(config_path)) {
    EMBER_RETURN_IF_ERROR(t->LoadConfig(config_path).WithContext(config_path));
  }
  return t;
}

Status Tokenizer::LoadTokenizerJson(const std::string& path) {
  EMBER_ASSIGN_OR_RETURN(simdjson::padded_string text, LoadPadded(path));
  simdjson::dom::parser parser;
  Json root;
  if (auto err = parser.parse(text).get(root); err != simdjson::SUCCESS)
    return Status::Error(std::string("invalid JSON: ") + simdjson::error_message(err));

  auto model = JsonField(root, "model");
  if (!model) return Status::Error("missing 'model'");
  EMBER_ASSIGN_OR_RETURN(model_, tok::BpeModel::FromJson(*model));
  if (auto n = JsonField(root, "normalizer")) {
    EMBER_ASSIGN_OR_RETURN(normalizer_, tok::Normalizer::FromJson(*n));
  }
  if (auto p = JsonField(root, "pre_tokenizer")) {
    EMBER_ASSIGN_OR_RETURN(pre_tokenizer_, tok::PreTokenizer::FromJson(*p));
  }
  if (auto d = JsonField(root, "decoder")) {
    EMBER_ASSIGN_OR_RETURN(decoder_, tok::Decoder::FromJson(*d));
  }
  if (auto p = JsonField(root, "post_processor")) {
    Wrap wrap;
    EMBER_RETURN_IF_ERROR(ParsePostProcessor(*p, &wrap));
    prefix_ids_ = std::move(wrap.prefix);
    suffix_ids_ = std::move(wrap.suffix);
  }
  if (JsonField(root, "truncation") || JsonField(root, "padding"))
    return Status::Error("'truncation' and 'padding' are not supported (must be null)");

  simdjson::dom::array added;
  if (auto a = JsonField(root, "added_tokens"); a && a->get_array().get(added) == simdjson::SUCCESS) {
    for (Json item : added) {
      tok::AddedToken t;
      int64_t id;
      auto idf = JsonField(item, "id");
      if (!idf || idf->get_int64().get(id) || id < 0 || id > INT32_MAX)
        return Status::Error("added_tokens: entry without a valid 'id'");
      t.id = int32_t(id);
      EMBER_ASSIGN_OR_RETURN(auto content, tok::JsonString(item, "content", "added_tokens"));
      t.content = std::string(content);
      t.special = tok::JsonBoolOr(item, "special", false);
      t.lstrip = tok::JsonBoolOr(item, "lstrip", false);
      t.rstrip = tok::JsonBoolOr(item, "rstrip", false);
      t.normalized = tok::JsonBoolOr(item, "normalized", !t.special);
      t.single_word = tok::JsonBoolOr(item, "single_word", false);
      added_.push_back(std::move(t));
    }
  }
  IndexAddedTokens();
  return Status::Ok();
}

void Tokenizer::IndexAddedTokens() {
  vocab_size_ = model_->max_id() + 1;
  for (size_t i = 0; i < added_.size(); ++i) {
    const tok::AddedToken& t = added_[i];
    added_by_id_[t.id] = i;
    added_by_content_.emplace(t.content, t.id);
    if (t.special) special_contents_.insert(t.content);
    vocab_size_ = std::max(vocab_size_, t.id + 1);
    // Normalized tokens are matched, and shown to the decoder, in their normalized form. The
    // reference decodes them that way too: TinyStories' "<unk>" (normalized, behind a Prepend
    // "▁" normalizer) decodes as " <unk>" and is not skipped as special (its golden shows both).
    std::string form = t.content;
    if (t.normalized && normalizer_) form = normalizer_->Normalize(form);
    if (t.normalized) normalized_trie_.Insert(form, int32_t(i));
    else raw_trie_.Insert(form, int32_t(i));
    added_decode_form_.push_back(std::move(form));
  }
}

// tokenizer_config.json is small but holds numbers simdjson rejects (model_max_length 1e30):
// nlohmann reads it.
Status Tokenizer::LoadConfig(const std::string& path) {
  EMBER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::Error("invalid JSON");
  auto token = [&](const char* key) -> std::string {
    auto it = root.find(key);
    if (it == root.end()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      return (*it)["content"].get<std::string>();
    return "";
  };
  bos_token_ = token("bos_token");
  eos_token_ = token("eos_token");
  if (!bos_token_.empty()) bos_token_id_ = TokenToId(bos_token_);
  if (!eos_token_.empty()) eos_token_id_ = TokenToId(eos_token_);
  return Status::Ok();
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  return Encode(text, add_special_tokens, {});
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens,
                                       std::span<const TextSpan> no_special_spans) const {
  for (size_t i = 0; i < no_special_spans.size(); ++i) {
    const TextSpan& span = no_special_spans[i];
    CHECK(span.begin <= span.end && span.end <= text.size()) << "no_special_spans[" << i << "]";
    if (i > 0) CHECK(no_special_spans[i - 1].end <= span.begin) << "no_special_spans unsorted";
  }
  std::vector<int32_t> ids;
  if (tok::IsValidUtf8(text)) {
    EncodeText(text, no_special_spans, &ids);
  } else {
    // Repaired piece by piece, so that the spans move with their text.
    std::string repaired;
    std::vector<TextSpan> moved;
    size_t at = 0;
    for (const TextSpan& span : no_special_spans) {
      repaired += tok::Utf8Lossy(text.substr(at, span.begin - at));
      const size_t begin = repaired.size();
      repaired += tok::Utf8Lossy(text.substr(span.begin, span.end - span.begin));
      moved.push_back({begin, repaired.size()});
      at = span.end;
    }
    repaired += tok::Utf8Lossy(text.substr(at));
    EncodeText(repaired, moved, &ids);
  }
  if (add_special_tokens) PostProcess(&ids);
  return ids;
}

std::vector<std::string> Tokenizer::SpecialTokenContents() const {
  std::vector<std::string> out;
  for (const tok::AddedToken& t : added_)
    if (t.special) out.push_back(t.content);
  return out;
}

std::vector<std::string> Tokenizer::AddedTokenContents() const {
  std::vector<std::string> out;
  for (const tok::AddedToken& t : added_) out.push_back(t.content);
  return out;
}

// The normalizer runs on the whole segment (a Prepend or a Strip must see it whole); a private
// code point marks each span's ends so that they can be found in the normalized text. Should the
// segment hold that code point already, or the normalizer not keep the marks, the whole segment
// is taken as client text (no normalized added token matches in it).
std::string Tokenizer::NormalizeSegment(std::string_view segment, std::span<const TextSpan> spans,
                                        std::vector<TextSpan>* normalized_spans) const {
  normalized_spans->clear();
  if (!normalizer_) {
    normalized_spans->assign(spans.begin(), spans.end());
    return std::string(segment);
  }
  static constexpr std::string_view kMark = "\xF4\x8F\xBF\xBC";  // U+10FFFC
  auto whole = [&]() {
    std::string normalized = normalizer_->Normalize(std::string(segment));
    normalized_spans->push_back({0, normalized.size()});
    return normalized;
  };
  if (segment.find(kMark) != std::string_view::npos) return whole();
  std::string marked;
  size_t at = 0;
  for (const TextSpan& span : spans) {
    marked.append(segment.substr(at, span.begin - at)).append(kMark);
    marked.append(segment.substr(span.begin, span.end - span.begin)).append(kMark);
    at = span.end;
  }
  marked.append(segment.substr(at));
  const std::string normalized_marked = normalizer_->Normalize(std::move(marked));
  std::string normalized;
  std::vector<size_t> marks;  // positions in `normalized`
  for (size_t pos = 0;;) {
    const size_t found = normalized_marked.find(kMark, pos);
    normalized.append(normalized_marked, pos,
                      (found == std::string::npos ? normalized_marked.size() : found) - pos);
    if (found == std::string::npos) break;
    marks.push_back(normalized.size());
    pos = found + kMark.size();
  }
  if (marks.size() != 2 * spans.size()) return whole();
  for (size_t k = 0; k < marks.size(); k += 2) normalized_spans->push_back({marks[k], marks[k + 1]});
  return normalized;
}

// tokenizers' encode_single_sequence: raw added tokens, then normalize, then normalized added
// tokens, then pre-tokenize and run the model on each piece. No added token matches inside
// `no_special_spans`.
void Tokenizer::EncodeText(std::string_view text, std::span<const TextSpan> no_special_spans,
                           std::vector<int32_t>* ids) const {
  std::vector<tok::Segment> raw_segments, norm_segments;
  std::vector<tok::Piece> pieces;
  std::vector<TextSpan> local_spans, normalized_spans;
  raw_trie_.Split(text, added_, &raw_segments, no_special_spans);
  size_t next_span = 0;
  for (const tok::Segment& seg : raw_segments) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
      continue;
    }
    // The spans that reach into this segment, relative to it.
    local_spans.clear();
    while (next_span < no_special_spans.size() && no_special_spans[next_span].end <= seg.begin)
      ++next_span;
    for (size_t k = next_span; k < no_special_spans.size() && no_special_spans[k].begin < seg.end;
         ++k) {
      local_spans.push_back({std::max(no_special_spans[k].begin, seg.begin) - seg.begin,
                             std::min(no_special_spans[k].end, seg.end) - seg.begin});
    }
    const std::string_view raw = text.substr(seg.begin, seg.end - seg.begin);
    std::string normalized;
    normalized_spans.clear();
    if (local_spans.empty() || normalized_trie_.empty()) {
      normalized = std::string(raw);
      if (normalizer_) normalized = normalizer_->Normalize(std::move(normalized));
    } else {
      normalized = NormalizeSegment(raw, local_spans, &normalized_spans);
    }
    norm_segments.clear();
    normalized_trie_.Split(normalized, added_, &norm_segments, normalized_spans);
    for (const tok::Segment& sub : norm_segments) {
      if (sub.id >= 0) {
        ids->push_back(sub.id);
        continue;
      }
      std::string piece_text = normalized.substr(sub.begin, sub.end - sub.begin);
      bool at_start = seg.begin == 0 && sub.begin == 0;
      pieces.clear();
      if (pre_tokenizer_) {
        pre_tokenizer_->Split(std::move(piece_text), at_start, &pieces);
      } else if (!piece_text.empty()) {
        pieces.push_back({std::move(piece_text), at_start});
      }
      for (const tok::Piece& p : pieces) model_->Tokenize(p.text, ids);
    }
  }
}

void Tokenizer::PostProcess(std::vector<int32_t>* ids) const {
  if (prefix_ids_.empty() && suffix_ids_.empty()) return;
  ids->insert(ids->begin(), prefix_ids_.begin(), prefix_ids_.end());
  ids->insert(ids->end(), suffix_ids_.begin(), suffix_ids_.end());
}

std::optional<std::string> Tokenizer::DecodeToken(int32_t id, bool skip_special_tokens) const {
  const std::string* s = nullptr;
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    s = &added_decode_form_[it->second];
  } else {
    s = model_->IdToToken(id);
  }
  if (s == nullptr) return std::nullopt;
  if (skip_special_tokens && special_contents_.count(*s) != 0) return std::nullopt;
  return *s;
}

std::optional<std::string> Tokenizer::TokenBytes(int32_t id) const {
  std::optional<std::string> s = DecodeToken(id, /*skip_special_tokens=*/true);
  if (!s) return std::nullopt;
  if (decoder_) return decoder_->DecodeBytes(std::move(*s));
  return ' ' + *s;  // DecodeTokens without a decoder: tokens after the first join with a space
}

std::vector<std::optional<std::string>> Tokenizer::TokenBytesTable(int32_t vocab_size) const {
  CHECK_GE(vocab_size, 0);
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(vocab_size));
  const int32_t known = std::min(vocab_size, vocab_size_);
  for (int32_t id = 0; id < known; ++id) bytes[static_cast<size_t>(id)] = TokenBytes(id);
  return bytes;
}

std::string Tokenizer::DecodeTokens(std::vector<std::string> tokens, bool at_start,
                                    bool* hold) const {
  if (decoder_) return decoder_->Decode(std::move(tokens), at_start, hold);
  if (hold != nullptr) *hold = false;
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0 || !at_start) text += ' ';
    text += tokens[i];
  }
  return text;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto s = DecodeToken(id, skip_special_tokens)) tokens.push_back(std::move(*s));
  }
  return DecodeTokens(std::move(tokens), true, nullptr);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end())
    return it->second;
  return model_->TokenToId(token);
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  const std::string* s = model_->IdToToken(id);
  return s ? *s : std::string();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

}  // namespace ember
