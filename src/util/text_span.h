// TextSpan: a half-open byte range [begin, end) of some text, e.g. the parts of a rendered prompt
// that came from the client (template/chat_template.h) and that the tokenizer must encode as
// plain text (tokenizer/tokenizer.h). A plain value type.
#pragma once

#include <cstddef>

namespace ember {

struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const TextSpan&) const = default;
};

}  // namespace ember
