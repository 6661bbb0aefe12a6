#include "serve/text_stream.h"

#include <utility>

namespace ember::serve {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                       bool skip_special_tokens)
    : detokenizer_(tokenizer, skip_special_tokens), matcher_(std::move(stop_strings)) {}

TextDelta TextStream::Push(int32_t token_id) {
  if (matcher_.stopped() || finished_) return TextDelta{"", matcher_.stopped()};
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
