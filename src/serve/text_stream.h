// TextStream: turns one sample's generated token ids into output text deltas — incremental
// detokenization (never a partial UTF-8 character) followed by stop-string matching across token
// boundaries (a stop string never reaches the output; only the longest suffix that could still
// start one is held back). Special tokens are all kept or all skipped, or all skipped but a given
// few (harmony's control tokens, which its parser reads: harmony.h). Used by the HTTP server and
// by `ember run` / `ember batch`.
// Not thread-safe: one TextStream per sample; the Tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "serve/stop_matcher.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace ember::serve {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
             bool skip_special_tokens);
  // Skips special tokens except those whose text is in `kept_special_tokens` (tokens the
  // vocabulary lacks are ignored): their text stays in the output.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
             std::span<const std::string_view> kept_special_tokens);

  // Feeds one generated token. Once `stopped` is true the sample is done: the caller stops
  // generating; later pushes return {"", true}.
  TextDelta Push(int32_t token_id);
  // End of generation (EOS, length, cancel): the text still held back. May be cut short by a
  // stop string completed by the detokenizer's final flush (then stopped() turns true).
  std::string Finish();

  bool stopped() const { return matcher_.stopped(); }
  // The stop string that ended the sample ("" when none did).
  const std::string& stop_string() const { return matcher_.matched(); }

 private:
  const Tokenizer& tokenizer_;
  IncrementalDetokenizer detokenizer_;
  // With kept special tokens: the detokenizer keeps every special token and Push drops those not
  // kept (dropping an id before the detokenizer is what skipping it there does).
  bool skip_unkept_special_ = false;
  std::unordered_set<int32_t> kept_special_ids_;
  StopStringMatcher matcher_;
  bool finished_ = false;
};

}  // namespace ember::serve
