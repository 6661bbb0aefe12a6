#include "template/client_text.h"

#include <algorithm>
#include <iterator>

namespace ember {
namespace {

constexpr uint32_t kIndexBase = 0x100000;  // sentinel index code points: U+100000 + index

void AppendUtf8(uint32_t cp, std::string* out) {  // cp in plane 16: always 4 bytes
  out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
  out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
  out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
  out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
}

// The plane-16 code point whose 4-byte UTF-8 starts at text[pos], else -1.
int64_t Plane16At(std::string_view text, size_t pos) {
  if (pos + 4 > text.size()) return -1;
  const auto b = [&](size_t k) { return static_cast<uint8_t>(text[pos + k]); };
  if (b(0) != 0xF4 || b(1) < 0x80 || b(1) > 0x8F) return -1;
  for (size_t k = 2; k < 4; ++k)
    if ((b(k) & 0xC0) != 0x80) return -1;
  return (int64_t{b(1) & 0x3F} << 12) | (int64_t{b(2) & 0x3F} << 6) | (b(3) & 0x3F) | (4 << 18);
}

}  // namespace

Result<ClientTextGuard> ClientTextGuard::Make(std::span<const std::string> protected_strings) {
  ClientTextGuard guard;
  std::fill(std::begin(guard.root_children_), std::end(guard.root_children_), -1);
  guard.nodes_.emplace_back();
  guard.entries_.emplace_back(kOpen);
  guard.Insert(guard.entries_[0], 0);
  for (const std::string& s : protected_strings) {
    if (s.empty()) continue;
    if (guard.entries_.size() > kMaxProtected)
      return Status::Error("chat template: more than " + std::to_string(kMaxProtected) +
                           " protected token strings");
    guard.entries_.push_back(s);
    guard.Insert(s, static_cast<int32_t>(guard.entries_.size() - 1));
  }
  return guard;
}

int32_t ClientTextGuard::Child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_children_[byte];
  for (const auto& [b, child] : nodes_[static_cast<size_t>(node)].children)
    if (b == byte) return child;
  return -1;
}

void ClientTextGuard::Insert(const std::string& text, int32_t entry) {
  int32_t node = 0;
  for (const char ch : text) {
    const auto byte = static_cast<uint8_t>(ch);
    int32_t next = Child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      nodes_[static_cast<size_t>(node)].children.emplace_back(byte, next);
      if (node == 0) root_children_[byte] = next;
    }
    node = next;
  }
  if (nodes_[static_cast<size_t>(node)].entry < 0) nodes_[static_cast<size_t>(node)].entry = entry;
}

std::string ClientTextGuard::Sentinel(int32_t entry) const {
  std::string out(kOpen);
  AppendUtf8(kIndexBase + static_cast<uint32_t>(entry), &out);
  return out;
}

std::string ClientTextGuard::Escape(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    int32_t node = root_children_[static_cast<uint8_t>(text[i])];
    int32_t best = -1;
    size_t best_end = i;
    for (size_t j = i + 1; node >= 0; ++j) {
      if (nodes_[static_cast<size_t>(node)].entry >= 0) {
        best = nodes_[static_cast<size_t>(node)].entry;
        best_end = j;
      }
      if (j == text.size()) break;
      node = Child(node, static_cast<uint8_t>(text[j]));
    }
    if (best < 0) {
      out.push_back(text[i++]);
      continue;
    }
    out += Sentinel(best);
    i = best_end;
  }
  return out;
}

RenderedPrompt ClientTextGuard::Restore(std::string_view rendered) const {
  RenderedPrompt out;
  out.text.reserve(rendered.size());
  size_t pos = 0;
  while (pos < rendered.size()) {
    const size_t open = rendered.find(kOpen, pos);
    if (open == std::string_view::npos) break;
    const int64_t cp = Plane16At(rendered, open + kOpen.size());
    const int64_t entry = cp - kIndexBase;
    out.text.append(rendered.substr(pos, open - pos));
    if (cp < 0 || entry < 0 || entry >= static_cast<int64_t>(entries_.size())) {
      // Not a sentinel (a kOpen the template wrote itself): kept as it is.
      out.text.append(kOpen);
      pos = open + kOpen.size();
      continue;
    }
    const std::string& text = entries_[static_cast<size_t>(entry)];
    out.client_spans.push_back({out.text.size(), out.text.size() + text.size()});
    out.text += text;
    pos = open + kOpen.size() + 4;
  }
  out.text.append(rendered.substr(pos));
  return out;
}

}  // namespace ember
