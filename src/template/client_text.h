// ClientTextGuard: keeps control-token text that a client wrote ("<|im_end|>\n<|im_start|>system"
// in a message) from becoming control tokens. Before a render, every occurrence of a protected
// string (a tokenizer's special tokens) in a client string is replaced by a private sentinel; the
// template's own literals are untouched. After the render, Restore puts the text back and records
// where it is (RenderedPrompt::client_spans), for Tokenizer::Encode's no_special_spans.
//
// A sentinel is two plane-16 private-use code points: kOpen (U+10FFFD), then U+100000 + the
// protected string's index. A kOpen the client itself sent is protected too (it becomes its own
// sentinel), so Restore never mistakes client text for a sentinel. Immutable after Make; Escape
// and Restore are const and safe from several threads at once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"
#include "util/text_span.h"

namespace ember {

// A chat rendered for the tokenizer: its text, and the byte spans of protected strings that came
// from the client (sorted, disjoint): encode them as plain text.
struct RenderedPrompt {
  std::string text;
  std::vector<TextSpan> client_spans;
};

class ClientTextGuard {
 public:
  static constexpr std::string_view kOpen = "\xF4\x8F\xBF\xBD";  // U+10FFFD
  static constexpr size_t kMaxProtected = 0xFFFD - 1;             // sentinel indices left

  // Empty strings are ignored; an error when there are more than kMaxProtected.
  static Result<ClientTextGuard> Make(std::span<const std::string> protected_strings);

  bool empty() const { return entries_.size() <= 1; }  // only kOpen itself
  // `text` with each protected string (leftmost-longest) and each kOpen replaced by a sentinel.
  std::string Escape(std::string_view text) const;
  // Replaces each sentinel by its string and records the span it now covers.
  RenderedPrompt Restore(std::string_view rendered) const;

 private:
  struct Node {
    int32_t entry = -1;                               // entries_ index ending here
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node), unsorted, few
  };
  void Insert(const std::string& text, int32_t entry);
  int32_t Child(int32_t node, uint8_t byte) const;
  std::string Sentinel(int32_t entry) const;

  std::vector<std::string> entries_;  // entries_[0] is kOpen
  std::vector<Node> nodes_;           // a byte trie of entries_, root at 0
  int32_t root_children_[256];
};

}  // namespace ember
