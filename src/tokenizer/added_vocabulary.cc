#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace ember::tok {
namespace {

char32_t LastCodePoint(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
  size_t len;
  return DecodeCodePoint(s, start, &len);
}

}  // namespace

int32_t TokenTrie::Child(int32_t node, uint8_t byte) const {
  for (const auto& [b, child] : nodes_[size_t(node)].children)
    if (b == byte) return child;
  return -1;
}

void TokenTrie::Insert(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    int32_t next = Child(node, c);
    if (next < 0) {
      next = int32_t(nodes_.size());
      nodes_.push_back(Node{});
      nodes_[size_t(node)].children.emplace_back(c, next);
      if (node == 0) root_children_[c] = next;
    }
    node = next;
  }
  if (nodes_[size_t(node)].token_index < 0) nodes_[size_t(node)].token_index = token_index;
}

// tokenizers' AddedVocabulary::find_matches with a leftmost-longest automaton; a match may not
// touch a `no_match` span, and lstrip / rstrip stop at one.
void TokenTrie::Split(std::string_view text, const std::vector<AddedToken>& tokens,
                      std::vector<Segment>* out, std::span<const TextSpan> no_match) const {
  if (text.empty()) return;
  size_t start_offset = 0;
  size_t i = 0;
  size_t next_span = 0;      // the first span that ends after i
  size_t floor_of_span = 0;  // the end of the last span before i: lstrip stops there
  while (i < text.size()) {
    while (next_span < no_match.size() && no_match[next_span].end <= i) {
      floor_of_span = no_match[next_span].end;
      ++next_span;
    }
    // The bytes a match starting at i may use: up to the next span's start.
    size_t limit = text.size();
    if (next_span < no_match.size()) {
      if (no_match[next_span].begin <= i) {
        i = no_match[next_span].end;
        continue;
      }
      limit = no_match[next_span].begin;
    }
    int32_t node = root_children_[uint8_t(text[i])];
    if (node < 0) {
      ++i;
      continue;
    }
    int32_t best = nodes_[size_t(node)].token_index;
    size_t best_end = i + 1;
    for (size_t j = i + 1; j < limit; ++j) {
      node = Child(node, uint8_t(text[j]));
      if (node < 0) break;
      if (nodes_[size_t(node)].token_index >= 0) {
        best = nodes_[size_t(node)].token_index;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens[size_t(best)];
    size_t start = i, stop = best_end;
    i = best_end;  // matching resumes after the raw match
    if (tok.single_word) {
      bool start_space = start == 0 || !IsWordChar(LastCodePoint(text.substr(0, start)));
      size_t len = 0;
      bool stop_space = stop == text.size() || !IsWordChar(DecodeCodePoint(text, stop, &len));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > floor_of_span) {
        size_t p = s - 1;
        while (p > 0 && (uint8_t(text[p]) & 0xC0) == 0x80) --p;
        size_t len;
        if (p < floor_of_span || !IsWhitespace(DecodeCodePoint(text, p, &len))) break;
        s = p;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < limit) {
        size_t len;
        if (!IsWhitespace(DecodeCodePoint(text, stop, &len)) || stop + len > limit) break;
        stop += len;
      }
    }
    if (start < start_offset) start = start_offset;
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, tok.id});
    start_offset = stop;
    if (i < stop) i = stop;
  }
  if (start_offset != text.size()) out->push_back({start_offset, text.size(), -1});
}

}  // namespace ember::tok
