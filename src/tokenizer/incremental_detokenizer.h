// IncrementalDetokenizer: streams text for ids that arrive one at a time (generation). The
// concatenation of everything Push and Flush return equals Tokenizer::Decode(all ids), and Push
// never returns a partial UTF-8 character: byte-fallback runs and byte-level tokens that split a
// character are held until they complete. Only the tokens since the last emitted boundary are
// re-decoded, so each Push costs O(held tokens). Exact for every decoder chain of the supported
// components except a Strip decoder with stop > 0 or start > 1 after Fuse (no real tokenizer we
// know uses one): those strip the end / several leading characters of the whole text, which a
// stream cannot know in advance. One instance per stream; not thread-safe (the Tokenizer it
// borrows must outlive it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ember {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens);
  std::string Push(int32_t id);  // newly complete text (never a partial UTF-8 char)
  std::string Flush();           // whatever is held at the end

 private:
  const Tokenizer& tok_;
  bool skip_special_tokens_;
  std::vector<std::string> window_;  // token strings since the last emitted boundary
  bool at_start_ = true;             // nothing was emitted before the window
};

}  // namespace ember
