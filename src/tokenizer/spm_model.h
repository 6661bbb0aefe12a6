// SpmModel: a SentencePiece-style vocabulary with scores (GGUF's "llama" tokenizer model). A word
// starts as one symbol per UTF-8 character; the adjacent pair whose concatenation is a token with
// the highest score is merged (leftmost first on ties) until no pair is a token. A symbol that is
// not a token falls back to its bytes' "<0xNN>" tokens, or to the unknown token (consecutive ones
// fused into one) when a byte token is missing. Immutable after Create; Tokenize is safe from
// several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/word_model.h"
#include "util/status.h"

namespace ember::tok {

class SpmModel : public WordModel {
 public:
  // `tokens[i]` and `scores[i]` of id i (same length); `unk_id` the token for characters the
  // vocab cannot spell (nullopt: they are dropped). `mergeable[i]` false keeps id i out of merges
  // (control, unknown, unused and byte tokens are not pieces).
  static Result<std::unique_ptr<SpmModel>> Create(std::vector<std::string> tokens,
                                                  std::vector<float> scores,
                                                  std::vector<uint8_t> mergeable,
                                                  std::optional<int32_t> unk_id);
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  const std::string* IdToToken(int32_t id) const override;
  int32_t max_id() const override { return int32_t(tokens_.size()) - 1; }

 private:
  struct Symbol {
    uint32_t begin, len;  // bytes of the word; len 0 once merged into its left neighbour
    int32_t prev, next;
  };
  // The id of a piece that merges may form, or -1.
  int32_t PieceId(std::string_view piece) const;
  void Emit(std::string_view piece, bool* after_unk, std::vector<int32_t>* ids) const;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::unordered_map<std::string_view, int32_t>
      pieces_;  // mergeable tokens -> id (views into tokens_)
  std::unordered_map<std::string_view, int32_t> all_;  // every token -> its first id
  std::optional<int32_t> unk_id_;
  int32_t byte_ids_[256];  // "<0xNN>" ids, -1 when absent
};

}  // namespace ember::tok
