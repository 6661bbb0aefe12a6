// The model stage of a tokenizer: it turns one pre-tokenized word (or, without a pre-tokenizer, a
// whole normalized segment) into token ids, and maps ids to token strings and back. Two kinds:
// BpeModel (ranked merges, tokenizer.json's BPE and GGUF's "gpt2" vocabularies) and SpmModel
// (score-driven merges, GGUF's "llama" SentencePiece vocabularies). Implementations are immutable
// after construction and safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ember::tok {

class WordModel {
 public:
  virtual ~WordModel() = default;
  // Appends the ids of one word.
  virtual void Tokenize(std::string_view word, std::vector<int32_t>* ids) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // nullptr when the id is not in the vocab.
  virtual const std::string* IdToToken(int32_t id) const = 0;
  virtual int32_t max_id() const = 0;
};

}  // namespace ember::tok
