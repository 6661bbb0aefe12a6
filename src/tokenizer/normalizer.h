// Normalizers from tokenizer.json (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip and
// Sequence), flattened into one list of steps applied in order. Operates on valid UTF-8 strings.
// Immutable after FromJson; Normalize is safe from several threads at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json.h"
#include "tokenizer/regex.h"

namespace ember::tok {

class Normalizer {
 public:
  // `json` is the tokenizer.json "normalizer" object; errors name an unsupported type.
  static Result<std::unique_ptr<Normalizer>> FromJson(Json json);
  // Returns the normalized text (an empty input stays empty).
  std::string Normalize(std::string text) const;

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip };
  struct Step {
    Kind kind;
    std::string text;                  // Prepend: prefix; Replace: content
    std::unique_ptr<Pattern> pattern;  // Replace
    bool left = false, right = false;  // Strip
  };
  Status Add(Json json);
  std::vector<Step> steps_;
};

}  // namespace ember::tok
