// A compiled PCRE2 regex (UTF + UCP + JIT) for the models' own Oniguruma patterns, and a literal
// pattern, both answering "all non-overlapping matches" the way Hugging Face `tokenizers` finds
// them. Immutable after construction; FindAll is safe from several threads at once (match data
// is allocated per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace ember::tok {

// [begin, end) byte offsets of one match.
using MatchRange = std::pair<size_t, size_t>;

class Pattern {
 public:
  // `regex` true: an Oniguruma regex (translated to PCRE2); false: a literal string.
  static Result<std::unique_ptr<Pattern>> Create(std::string_view pattern, bool regex);
  Pattern() = default;  // use Create
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // Appends every non-empty, non-overlapping match in `text` (valid UTF-8), left to right.
  void FindAll(std::string_view text, std::vector<MatchRange>* out) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::string literal_;
  void* code_ = nullptr;  // pcre2_code_8*, null for literals
};

}  // namespace ember::tok
