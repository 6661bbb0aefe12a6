#include "sampling/gbnf_constraint.h"

#include <algorithm>
#include <array>
#include <bit>
#include <mutex>
#include <unordered_map>

#include "sampling/gbnf_automaton.h"
#include "util/check.h"

namespace ember {

// Frames a local walk keeps: enough for a loop inside a rule (a class in a repetition in a
// string) to be read without its context; more would share less across states.
constexpr int kLocalDepth = 3;
// Local masks kept (each a bit per token: ~19 KB for a 152k vocabulary); all dropped when full.
constexpr size_t kMaxLocalMasks = 256;

// What a byte element allows on top of any stack (see the header).
struct GbnfLocalMask {
  std::vector<uint64_t> accepted;  // bits: read to the end by the kept frames alone
  // Read only by ending the kept frames mid-token: the id, and bit k set when they could end
  // before the token's byte k (bit 63: at byte 63 or later).
  std::vector<std::pair<int32_t, uint64_t>> uncertain;
};

// The vocabulary as one grammar reads it. The automaton sees a byte only through its class
// (GbnfGrammar::byte_class; every byte set and FOLLOW set is a union of classes), so tokens whose
// bytes fall one by one in the same classes fare alike in every walk: a local walk visits each
// such group once, spelled with each class's smallest byte. Built with the grammar, off the
// engine thread; Llama 3's 128k tokens make ~4k groups for an arithmetic grammar, ~60k for JSON.
struct GbnfClassVocabulary {
  TokenTrie trie;                   // over the groups' spellings; its ids are group numbers
  std::vector<uint32_t> first;      // group g's tokens: members[first[g], first[g + 1])
  std::vector<int32_t> members;
};

GbnfClassVocabulary BuildClassVocabulary(const TokenTrie& all, const GbnfGrammar& grammar) {
  std::array<uint8_t, 256> spell{};  // each byte as its class's smallest byte
  std::array<int, 256> smallest;
  smallest.fill(-1);
  for (int b = 0; b < 256; ++b) {
    int& s = smallest[grammar.byte_class[static_cast<size_t>(b)]];
    if (s < 0) s = b;
    spell[static_cast<size_t>(b)] = static_cast<uint8_t>(s);
  }
  // Groups by spelling: an open-addressing table (twice the tokens) of spelling hashes and group
  // numbers (-1: empty).
  struct Slot {
    uint64_t hash = 0;
    int32_t group = -1;
  };
  const size_t mask = std::bit_ceil(std::max<size_t>(2 * all.ids.size(), 16)) - 1;
  std::vector<Slot> slots(mask + 1);
  std::vector<std::optional<std::string>> spellings;
  spellings.reserve(all.ids.size() / 4);
  std::vector<int32_t> group(all.ids.size());
  std::string s;
  for (size_t i = 0; i < all.ids.size(); ++i) {
    const std::string_view text = all.Text(i);
    s.resize(text.size());
    uint64_t hash = 14695981039346656037ull;  // FNV-1a
    for (size_t k = 0; k < text.size(); ++k) {
      s[k] = static_cast<char>(spell[static_cast<uint8_t>(text[k])]);
      hash = (hash ^ static_cast<uint8_t>(s[k])) * 1099511628211ull;
    }
    size_t at = (hash ^ (hash >> 29)) & mask;
    while (slots[at].group >= 0 &&
           (slots[at].hash != hash || *spellings[static_cast<size_t>(slots[at].group)] != s))
      at = (at + 1) & mask;
    if (slots[at].group < 0) {
      slots[at] = {hash, static_cast<int32_t>(spellings.size())};
      spellings.push_back(s);
    }
    group[i] = slots[at].group;
  }
  GbnfClassVocabulary v;
  v.first.assign(spellings.size() + 1, 0);
  for (int32_t g : group) ++v.first[static_cast<size_t>(g) + 1];
  for (size_t g = 0; g < spellings.size(); ++g) v.first[g + 1] += v.first[g];
  v.members.resize(all.ids.size());
  std::vector<uint32_t> at(v.first.begin(), v.first.end() - 1);
  for (size_t i = 0; i < all.ids.size(); ++i)
    v.members[at[static_cast<size_t>(group[i])]++] = all.ids[i];
  std::vector<int32_t> ids(spellings.size());
  for (size_t g = 0; g < ids.size(); ++g) ids[g] = static_cast<int32_t>(g);
  // First-seen order follows the byte order of `all`, close enough to share most prefixes.
  v.trie = TokenTrieInOrder(std::move(ids), spellings);
  return v;
}

// Shared by a request's clones (and by later requests through GbnfCache).
struct GbnfShared {
  GbnfShared(std::shared_ptr<const TokenTexts> t, std::shared_ptr<const GbnfGrammar> g,
             std::vector<int32_t> ends)
      : texts(std::move(t)),
        classes(BuildClassVocabulary(texts->all, *g)),
        automaton(std::move(g)),
        end_ids(std::move(ends)) {}

  // The local mask of stack `node` cut to kLocalDepth frames.
  const GbnfLocalMask& Local(int32_t node);

  std::mutex mu;
  std::shared_ptr<const TokenTexts> texts;
  const GbnfClassVocabulary classes;
  GbnfAutomaton automaton;
  std::vector<int32_t> end_ids;
  std::unordered_map<int32_t, GbnfLocalMask> local;  // by cut stack node
  MaskCache cache;
};

const GbnfLocalMask& GbnfShared::Local(int32_t node) {
  if (local.size() >= kMaxLocalMasks) local.clear();
  auto [it, inserted] = local.try_emplace(node);
  if (!inserted) return it->second;
  GbnfLocalMask& mask = it->second;
  mask.accepted.assign((texts->bytes.size() + 63) / 64, 0);
  struct Walk {
    int32_t state;
    uint32_t bytes;  // read so far
    uint64_t pops;   // bit k: the kept frames could have ended after k bytes
  };
  GbnfAutomaton& a = automaton;
  const int32_t start = a.StateOf(node);
  if (start == GbnfAutomaton::kDead) return mask;
  // A pop is viable only if the next byte may follow the cut frames somewhere in the grammar.
  const std::bitset<256> follow = a.CutFollow(node);
  WalkTokenTrieVisit(
      classes.trie, Walk{start, 0, 0},
      [&a, &follow](Walk& w, uint8_t byte) {
        if (w.bytes < 63 && !follow.test(byte)) w.pops &= ~(uint64_t{1} << w.bytes);
        ++w.bytes;
        if (w.state == GbnfAutomaton::kDead) return w.pops != 0;
        w.state = a.Next(w.state, byte);
        if (w.state == GbnfAutomaton::kDead) return w.pops != 0;
        if (a.HasPop(w.state)) w.pops |= uint64_t{1} << std::min<uint32_t>(w.bytes, 63);
        return true;
      },
      [this, &mask](size_t group, const Walk& w) {
        for (uint32_t m = classes.first[group]; m < classes.first[group + 1]; ++m) {
          const auto id = static_cast<size_t>(classes.members[m]);
          if (w.state != GbnfAutomaton::kDead) {
            mask.accepted[id / 64] |= uint64_t{1} << (id % 64);
          } else {
            mask.uncertain.push_back({static_cast<int32_t>(id), w.pops});
          }
        }
      });
  return mask;
}

namespace {

class GbnfConstraint : public TokenConstraint {
 public:
  explicit GbnfConstraint(std::shared_ptr<GbnfShared> shared)
      : shared_(std::move(shared)), state_(shared_->automaton.start()) {}
  std::unique_ptr<TokenConstraint> Clone() const override {
    return std::make_unique<GbnfConstraint>(*this);
  }
  int32_t vocab_size() const override {
    return static_cast<int32_t>(shared_->texts->bytes.size());
  }
  int64_t Allowed(std::vector<uint8_t>& allowed) const override;
  int64_t AllowedBits(std::vector<uint32_t>& bits) const override;
  bool Accept(int32_t id) override;
  bool Done() const override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    return ended_ || shared_->automaton.Terminal(state_);
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(shared_->mu);
    return shared_->automaton.error();
  }

 private:
  bool IsEndId(int32_t id) const {
    const std::vector<int32_t>& ends = shared_->end_ids;
    return !shared_->texts->bytes[static_cast<size_t>(id)].has_value() &&
           std::find(ends.begin(), ends.end(), id) != ends.end();
  }

  std::shared_ptr<GbnfShared> shared_;
  int32_t state_;
  bool ended_ = false;  // an end id was accepted
};

int64_t GbnfConstraint::Allowed(std::vector<uint8_t>& allowed) const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  GbnfShared& s = *shared_;
  GbnfAutomaton& a = s.automaton;
  const size_t vocab = s.texts->bytes.size();
  a.ResetBudget();
  if (ended_ || a.Terminal(state_) || !a.error().empty()) {
    allowed.assign(vocab, 0);
    return 0;
  }
  const std::string key(reinterpret_cast<const char*>(&state_), sizeof(state_));
  if (const int64_t cached = s.cache.Find(key, &allowed); cached >= 0) return cached;
  // Each stack cut to its top frames, with what may follow them in this state (the bytes that
  // can start the stack below the cut: a cheap filter of the uncertain tokens).
  thread_local std::vector<uint64_t> bits;
  thread_local std::vector<std::pair<int32_t, std::bitset<256>>> cuts;
  thread_local std::vector<int32_t> candidates;
  bits.assign((vocab + 63) / 64, 0);
  cuts.clear();
  candidates.clear();
  bool can_end = false;
  for (int32_t node : a.Stacks(state_)) {
    if (node == GbnfAutomaton::kAcceptNode) {
      can_end = true;
      continue;
    }
    int32_t below = GbnfAutomaton::kAcceptNode;
    const int32_t cut = a.Truncate(node, kLocalDepth, &below);
    cuts.push_back({cut, a.FirstBytesBelow(below)});
  }
  std::sort(cuts.begin(), cuts.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (size_t c = 0; c < cuts.size(); ++c) {
    std::bitset<256> follow = cuts[c].second;
    while (c + 1 < cuts.size() && cuts[c + 1].first == cuts[c].first) follow |= cuts[++c].second;
    const GbnfLocalMask& local = s.Local(cuts[c].first);
    for (size_t w = 0; w < local.accepted.size(); ++w) bits[w] |= local.accepted[w];
    for (const auto& [id, pops] : local.uncertain) {
      const std::string& text = *s.texts->bytes[static_cast<size_t>(id)];
      bool viable = (pops >> 63) != 0;
      for (uint64_t p = pops; p != 0 && !viable; p &= p - 1) {
        const auto k = static_cast<size_t>(std::countr_zero(p));
        viable = k >= text.size() || follow.test(static_cast<uint8_t>(text[k]));
      }
      if (viable) candidates.push_back(id);
    }
  }
  UnpackMask(bits, vocab, &allowed);
  int64_t count = 0;
  for (uint64_t word : bits) count += std::popcount(word);
  for (int32_t id : candidates) {
    const auto i = static_cast<size_t>(id);
    if (allowed[i] || a.Walk(state_, *s.texts->bytes[i]) == GbnfAutomaton::kDead) continue;
    allowed[i] = 1;
    ++count;
  }
  if (can_end) {
    for (int32_t id : s.end_ids) {
      if (id < 0 || static_cast<size_t>(id) >= vocab || !IsEndId(id)) continue;
      count += allowed[static_cast<size_t>(id)] == 0;
      allowed[static_cast<size_t>(id)] = 1;
    }
  }
  if (!a.error().empty()) {  // a bound was hit: the mask is not trustworthy
    allowed.assign(vocab, 0);
    return 0;
  }
  s.cache.Insert(key, allowed, count);
  return count;
}

// A cached state's mask is a copy of its bits; otherwise Allowed (which caches it), packed.
int64_t GbnfConstraint::AllowedBits(std::vector<uint32_t>& bits) const {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    const GbnfAutomaton& a = shared_->automaton;
    if (!ended_ && !a.Terminal(state_) && a.error().empty()) {
      const std::string key(reinterpret_cast<const char*>(&state_), sizeof(state_));
      if (const int64_t cached = shared_->cache.FindBits(key, &bits); cached >= 0) return cached;
    }
  }
  return TokenConstraint::AllowedBits(bits);
}

bool GbnfConstraint::Accept(int32_t id) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  GbnfAutomaton& a = shared_->automaton;
  if (ended_ || id < 0 || static_cast<size_t>(id) >= shared_->texts->bytes.size()) return false;
  if (a.Accepting(state_) && IsEndId(id)) return ended_ = true;
  const std::optional<std::string>& b = shared_->texts->bytes[static_cast<size_t>(id)];
  if (!b || b->empty()) return false;
  a.ResetBudget();
  const int32_t next = a.Walk(state_, *b);
  if (next == GbnfAutomaton::kDead) return false;
  state_ = next;
  return true;
}

}  // namespace

std::shared_ptr<TokenConstraint> MakeGbnfConstraint(std::shared_ptr<const TokenTexts> texts,
                                                    std::shared_ptr<const GbnfGrammar> grammar,
                                                    std::vector<int32_t> end_ids) {
  CHECK(texts != nullptr && grammar != nullptr);
  return std::make_shared<GbnfConstraint>(
      std::make_shared<GbnfShared>(std::move(texts), std::move(grammar), std::move(end_ids)));
}

GbnfCache::GbnfCache(std::shared_ptr<const TokenTexts> texts, std::vector<int32_t> end_ids)
    : texts_(std::move(texts)), end_ids_(std::move(end_ids)) {
  CHECK(texts_ != nullptr);
}

Result<std::shared_ptr<TokenConstraint>> GbnfCache::Constraint(std::string_view text,
                                                               const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(std::string(text));
    if (it != entries_.end()) {
      std::lock_guard<std::mutex> shared_lock(it->second->mu);
      const GbnfAutomaton& a = it->second->automaton;
      if (a.error().empty() && a.num_states() <= GbnfAutomaton::kMaxStates / 4)
        return std::shared_ptr<TokenConstraint>(std::make_shared<GbnfConstraint>(it->second));
      entries_.erase(it);
    }
  }
  // Compiled without the lock (the class vocabulary takes milliseconds): requests with other
  // grammars do not wait. Two first requests with one text may both compile; the first kept wins.
  auto grammar = ParseGbnf(text, path);
  if (!grammar.ok()) return grammar.status();
  auto shared = std::make_shared<GbnfShared>(texts_, std::move(*grammar), end_ids_);
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.size() >= kMaxGrammars) entries_.clear();
  auto it = entries_.try_emplace(std::string(text), std::move(shared)).first;
  return std::shared_ptr<TokenConstraint>(std::make_shared<GbnfConstraint>(it->second));
}

std::string GbnfConstraintError(const TokenConstraint& constraint) {
  const auto* c = dynamic_cast<const GbnfConstraint*>(&constraint);
  return c != nullptr ? c->error() : std::string();
}

}  // namespace ember
