#include "tokenizer/spm_model.h"

#include <cstdio>
#include <queue>

#include "tokenizer/unicode.h"

namespace ember::tok {

Result<std::unique_ptr<SpmModel>> SpmModel::Create(std::vector<std::string> tokens,
                                                   std::vector<float> scores,
                                                   std::vector<uint8_t> mergeable,
                                                   std::optional<int32_t> unk_id) {
  if (scores.size() != tokens.size() || mergeable.size() != tokens.size())
    return Status::Error("SentencePiece vocab: " + std::to_string(tokens.size()) + " tokens but " +
                         std::to_string(scores.size()) + " scores");
  if (unk_id && (*unk_id < 0 || size_t(*unk_id) >= tokens.size()))
    return Status::Error("SentencePiece vocab: unknown token id " + std::to_string(*unk_id) +
                         " is outside the vocab");
  auto m = std::unique_ptr<SpmModel>(new SpmModel());
  m->tokens_ = std::move(tokens);
  m->scores_ = std::move(scores);
  m->unk_id_ = unk_id;
  m->pieces_.reserve(m->tokens_.size());
  m->all_.reserve(m->tokens_.size());
  for (size_t id = 0; id < m->tokens_.size(); ++id) {
    const std::string_view s = m->tokens_[id];
    m->all_.emplace(s, int32_t(id));  // the first id of a repeated string wins
    if (mergeable[id] != 0 && !s.empty()) m->pieces_.emplace(s, int32_t(id));
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m->all_.find(name);
    m->byte_ids_[b] = it == m->all_.end() ? -1 : it->second;
  }
  return m;
}

int32_t SpmModel::PieceId(std::string_view piece) const {
  auto it = pieces_.find(piece);
  return it == pieces_.end() ? -1 : it->second;
}

// One final symbol: its token, else its bytes' tokens, else the unknown token (fused with an
// unknown token just before it).
void SpmModel::Emit(std::string_view piece, bool* after_unk, std::vector<int32_t>* ids) const {
  if (int32_t id = PieceId(piece); id >= 0) {
    ids->push_back(id);
    *after_unk = false;
    return;
  }
  bool bytes = true;
  for (unsigned char c : piece) bytes = bytes && byte_ids_[c] >= 0;
  if (bytes) {
    for (unsigned char c : piece) ids->push_back(byte_ids_[c]);
    *after_unk = false;
    return;
  }
  if (!unk_id_) return;
  if (!*after_unk) ids->push_back(*unk_id_);
  *after_unk = true;
}

void SpmModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size();) {
    size_t len = std::min<size_t>(Utf8SeqLen(uint8_t(word[i])), word.size() - i);
    const int32_t idx = int32_t(sym.size());
    sym.push_back({uint32_t(i), uint32_t(len), idx - 1, idx + 1});
    i += len;
  }
  sym.back().next = -1;
  // Candidate merges, best first: higher score, then the leftmost. A candidate is stale once
  // either side has changed length (then the pair it named is gone).
  struct Cand {
    float score;
    int32_t left, right;
    uint32_t len;  // bytes of the merged piece when queued
    bool operator<(const Cand& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Cand> queue;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = sym[size_t(left)];
    const Symbol& b = sym[size_t(right)];
    const int32_t id = PieceId(word.substr(a.begin, a.len + b.len));
    if (id >= 0) queue.push({scores_[size_t(id)], left, right, a.len + b.len});
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) try_pair(int32_t(i), int32_t(i + 1));
  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Symbol& a = sym[size_t(top.left)];
    Symbol& b = sym[size_t(top.right)];
    if (a.len == 0 || b.len == 0 || a.next != top.right || a.len + b.len != top.len) continue;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) sym[size_t(b.next)].prev = top.left;
    try_pair(a.prev, top.left);
    try_pair(top.left, a.next);
  }
  bool after_unk = false;
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next)
    Emit(word.substr(sym[size_t(i)].begin, sym[size_t(i)].len), &after_unk, ids);
}

std::optional<int32_t> SpmModel::TokenToId(std::string_view token) const {
  auto it = all_.find(token);
  if (it == all_.end()) return std::nullopt;
  return it->second;
}

const std::string* SpmModel::IdToToken(int32_t id) const {
  if (id < 0 || size_t(id) >= tokens_.size()) return nullptr;
  return &tokens_[size_t(id)];
}

}  // namespace ember::tok
