// Added tokens of tokenizer.json (special or not) and how they are cut out of the input before
// the model sees it: leftmost-longest matching over a byte trie, with the `single_word`,
// `lstrip` and `rstrip` flags applied as Hugging Face `tokenizers` does. Tokens with
// `normalized: false` match the raw text; the others match the normalized text in their
// normalized form. Split can be told spans of the text where no added token may match (client
// text, encoded as ordinary text: Hugging Face's split_special_tokens for those bytes only).
// Immutable after Build; Split is safe from several threads at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/text_span.h"

namespace ember::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// A piece of text: either an added token (id >= 0) or text for the model (id == -1).
struct Segment {
  size_t begin, end;
  int32_t id;
};

class TokenTrie {
 public:
  void Insert(std::string_view pattern, int32_t token_index);
  // Appends the segments of `text` (covering it, in order; empty text gives none). No token
  // matches a byte inside `no_match` (sorted, disjoint spans of `text`), nor strips into one.
  void Split(std::string_view text, const std::vector<AddedToken>& tokens,
             std::vector<Segment>* out, std::span<const TextSpan> no_match = {}) const;
  bool empty() const { return nodes_.size() <= 1; }
  TokenTrie() { std::fill(std::begin(root_children_), std::end(root_children_), -1); }

 private:
  struct Node {
    int32_t token_index = -1;
    std::vector<std::pair<uint8_t, int32_t>> children;
  };
  int32_t Child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
  int32_t root_children_[256];  // root's child per first byte, -1 when none
};

}  // namespace ember::tok
