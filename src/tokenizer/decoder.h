// Decoders from tokenizer.json (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and
// Sequence): they turn token strings back into text exactly as Hugging Face `tokenizers` does.
// Decode can also run on a window of a longer token stream (for incremental detokenization):
// `at_start` false suppresses the transforms that only apply at the very start of the text, and
// `*hold` reports when the window's end is not final yet (an unfinished byte run or a partial
// UTF-8 character). Immutable after FromJson; Decode is safe from several threads at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json.h"
#include "tokenizer/regex.h"

namespace ember::tok {

class Decoder {
 public:
  static Result<std::unique_ptr<Decoder>> FromJson(Json json);
  std::string Decode(std::vector<std::string> tokens, bool at_start, bool* hold) const;
  // The raw bytes one token contributes in the middle of a stream (at_start false): the same
  // steps, but byte-level and byte-fallback bytes are kept as they are instead of replacing an
  // incomplete UTF-8 sequence with U+FFFD. (For constrained decoding: the bytes a token adds.)
  std::string DecodeBytes(std::string token) const;

 private:
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  struct Step {
    Kind kind;
    std::unique_ptr<Pattern> pattern;  // Replace
    std::string text;                  // Replace: content; Metaspace: replacement
    bool prepend = true;               // Metaspace: strip the leading space of the first token
    std::string strip_content;         // Strip: the character
    size_t start = 0, stop = 0;        // Strip
  };
  Status Add(Json json);
  std::string Run(std::vector<std::string> tokens, bool at_start, bool* hold, bool lossless) const;
  std::vector<Step> steps_;
};

}  // namespace ember::tok
