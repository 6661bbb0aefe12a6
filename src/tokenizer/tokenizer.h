// Tokenizer: an exact reimplementation of Hugging Face `tokenizers` for a model's
// tokenizer.json (BPE models, byte-level or SentencePiece-style; added tokens; normalizers,
// pre-tokenizers, post-processors, decoders), plus the bos/eos tokens of tokenizer_config.json;
// or the same pipeline built from a GGUF file's vocabulary (FromGgufVocab, gguf_vocab.h).
// Immutable after Load: Encode, Decode and the lookups are const and safe to call from several
// threads at once (per-call scratch and a per-thread word cache).
//
// Client text inside a prompt (template/chat_template.h's RenderedPrompt::client_spans) is encoded
// with the no_special_spans overload: there the bytes of an added token ("<|im_start|>") are
// ordinary text, so a user cannot forge the template's control tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "util/status.h"
#include "util/text_span.h"

namespace ember {

namespace tok {
class Decoder;
class Normalizer;
class PreTokenizer;
class WordModel;
}  // namespace tok

struct GgufVocab;

class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // dir holds tokenizer.json and (optionally) tokenizer_config.json. An unsupported component
  // is an error that names it.
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  // From a GGUF file's vocabulary (tokenizer/gguf_vocab.h); errors name the tokenizer.ggml key.
  static Result<std::unique_ptr<Tokenizer>> FromGgufVocab(const GgufVocab& vocab);
  // Invalid UTF-8 in `text` is replaced by U+FFFD first.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;
  // As above, but no added token (special or not) matches a byte inside `no_special_spans`
  // (sorted, disjoint spans of `text`; what is there is encoded like ordinary text, as HF's
  // split_special_tokens=True does). Empty spans: the same ids as Encode(text, ...).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens,
                              std::span<const TextSpan> no_special_spans) const;
  // The contents of the added tokens flagged special ("<|im_start|>", "<|eot_id|>", ...), and of
  // every added token: the strings a chat render must keep out of client text.
  std::vector<std::string> SpecialTokenContents() const;
  std::vector<std::string> AddedTokenContents() const;
  // Ids outside the vocab are skipped.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  int32_t vocab_size() const { return vocab_size_; }  // incl. added tokens (max id + 1)
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::string IdToToken(int32_t id) const;  // "" when the id is unknown
  bool IsSpecial(int32_t id) const;
  // From tokenizer_config.json (string or {"content": ...}), or a GGUF vocabulary's bos/eos ids;
  // empty/nullopt when absent.
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  std::optional<int32_t> bos_token_id() const { return bos_token_id_; }
  std::optional<int32_t> eos_token_id() const { return eos_token_id_; }

  // For IncrementalDetokenizer: the string the decoder sees for `id`, or nullopt when the id
  // is unknown or skipped as special.
  std::optional<std::string> DecodeToken(int32_t id, bool skip_special_tokens) const;
  // The raw bytes `id` adds to a stream's text after its start (a byte-level token may hold part
  // of a UTF-8 character); nullopt for a special or unknown id. For constrained decoding.
  std::optional<std::string> TokenBytes(int32_t id) const;
  // TokenBytes of every id below `vocab_size` (a model's vocabulary, which may be padded past
  // this tokenizer's): nullopt for special ids and for ids past vocab_size(). The one table
  // structured output (sampling/json_constraint.h's TokenTexts) is built from.
  std::vector<std::optional<std::string>> TokenBytesTable(int32_t vocab_size) const;
  // Decodes a window of token strings; `at_start` says whether it begins the stream; `*hold`
  // is set when the window's end may still change with more tokens.
  std::string DecodeTokens(std::vector<std::string> tokens, bool at_start, bool* hold) const;

 private:
  Tokenizer();
  Status LoadTokenizerJson(const std::string& path);
  Status LoadConfig(const std::string& path);
  void EncodeText(std::string_view text, std::span<const TextSpan> no_special_spans,
                  std::vector<int32_t>* ids) const;
  // The normalized text of raw[seg] and, within it, the images of `spans` (relative to seg).
  std::string NormalizeSegment(std::string_view segment, std::span<const TextSpan> spans,
                               std::vector<TextSpan>* normalized_spans) const;
  void PostProcess(std::vector<int32_t>* ids) const;
  // After added_ is filled: the lookup tables and tries over it, and vocab_size_.
  void IndexAddedTokens();

  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tok::WordModel> model_;
  std::unique_ptr<tok::Decoder> decoder_;

  std::vector<tok::AddedToken> added_;                  // in file order
  std::unordered_map<int32_t, size_t> added_by_id_;     // id -> index in added_
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::vector<std::string> added_decode_form_;          // per added_: string seen by the decoder
  std::unordered_set<std::string> special_contents_;
  tok::TokenTrie raw_trie_, normalized_trie_;

  // Post-processing for add_special_tokens: ids before and after the sequence.
  std::vector<int32_t> prefix_ids_, suffix_ids_;

  int32_t vocab_size_ = 0;
  std::string bos_token_, eos_token_;
  std::optional<int32_t> bos_token_id_, eos_token_id_;
};

}  // namespace ember
