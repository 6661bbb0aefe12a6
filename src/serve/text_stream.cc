#include "serve/text_stream.h"

#include <optional>
#include <utility>

namespace ember::serve {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                       bool skip_special_tokens)
    : tokenizer_(tokenizer),
      detokenizer_(tokenizer, skip_special_tokens),
      matcher_(std::move(stop_strings)) {}

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                       std::span<const std::string_view> kept_special_tokens)
    : tokenizer_(tokenizer),
      detokenizer_(tokenizer, /*skip_special_tokens=*/false),
      skip_unkept_special_(true),
      matcher_(std::move(stop_strings)) {
  for (std::string_view token : kept_special_tokens) {
    if (std::optional<int32_t> id = tokenizer.TokenToId(token)) kept_special_ids_.insert(*id);
  }
}

TextDelta TextStream::Push(int32_t token_id) {
  if (matcher_.stopped() || finished_) return TextDelta{"", matcher_.stopped()};
  // (Skipped exactly as a skipping detokenizer would: the tokenizer says what it skips.)
  if (skip_unkept_special_ && !kept_special_ids_.contains(token_id) &&
      !tokenizer_.DecodeToken(token_id, /*skip_special_tokens=*/true))
    return TextDelta{};
  return matcher_.Push(detokenizer_.Push(token_id));
}

std::string TextStream::Finish() {
  if (finished_ || matcher_.stopped()) return "";
  finished_ = true;
  TextDelta tail = matcher_.Push(detokenizer_.Flush());
  if (tail.stopped) return tail.text;
  return tail.text + matcher_.Finish();
}

}  // namespace ember::serve
