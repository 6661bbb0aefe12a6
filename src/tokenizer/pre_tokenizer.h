// Pre-tokenizers from tokenizer.json (Split, ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Sequence): they cut a normalized segment into the words the model encodes,
// exactly as Hugging Face `tokenizers` does. Steps are flattened and applied in order to every
// current piece. Immutable after FromJson; Split is safe from several threads at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json.h"
#include "tokenizer/regex.h"

namespace ember::tok {

struct Piece {
  std::string text;
  bool at_text_start = false;  // begins at offset 0 of the original input (Metaspace "first")
};

class PreTokenizer {
 public:
  static Result<std::unique_ptr<PreTokenizer>> FromJson(Json json);
  // Splits `text` into pieces (appended to *out); empty pieces are dropped.
  void Split(std::string text, bool at_text_start, std::vector<Piece>* out) const;
  // Whether some step maps bytes to the byte-level alphabet (then decoding needs ByteLevel).
  bool byte_level() const { return byte_level_; }

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    Kind kind;
    std::unique_ptr<Pattern> pattern;  // Split; ByteLevel with use_regex
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    std::string replacement;        // Metaspace
    Prepend prepend = Prepend::kAlways;
    bool split = true;              // Metaspace
  };
  Status Add(Json json);
  static void SplitBy(const Pattern& pattern, Behavior behavior, bool invert, const Piece& in,
                      std::vector<Piece>* out);
  void ApplyStep(const Step& step, std::vector<Piece>* pieces) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace ember::tok
