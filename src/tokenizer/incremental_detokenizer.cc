#include "tokenizer/incremental_detokenizer.h"

#include <utility>

namespace ember {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_tokens_(skip_special_tokens) {}

// Decoding is a chain of per-token transforms plus three things that look across tokens: the
// start of the text (Strip / Metaspace), byte-fallback runs and byte-level UTF-8 assembly. At a
// token boundary where no run and no character is open, the text decodes as the text before it
// followed by the text after it (decoded "not at start"), so the window restarts there.
std::string IncrementalDetokenizer::Push(int32_t id) {
  std::optional<std::string> token = tok_.DecodeToken(id, skip_special_tokens_);
  if (!token) return "";
  window_.push_back(std::move(*token));
  bool hold = false;
  std::string text = tok_.DecodeTokens(window_, at_start_, &hold);
  if (hold) return "";
  window_.clear();
  at_start_ = false;
  return text;
}

std::string IncrementalDetokenizer::Flush() {
  if (window_.empty()) return "";
  std::string text = tok_.DecodeTokens(std::move(window_), at_start_, nullptr);
  window_.clear();
  at_start_ = false;
  return text;
}

}  // namespace ember
