#include "sampling/gbnf_constraint.h"

#include <algorithm>
#include <bit>
#include <mutex>
#include <unordered_map>

#include "sampling/gbnf_automaton.h"
#include "util/check.h"

namespace ember {

namespace {

// Frames a local walk keeps: enough for a loop inside a rule (a class in a repetition in a
// string) to be read without its context; more would share less across states.
constexpr int kLocalDepth = 3;
// Local masks kept (each a bit per token: ~19 KB for a 152k vocabulary); all dropped when full.
constexpr size_t kMaxLocalMasks = 256;

// What a byte element allows on top of any stack (see the header).
struct LocalMask {
  std::vector<uint64_t> accepted;  // bits: read to the end by the top rule alone
  std::vector<int32_t> uncertain;  // ids: read only by ending the top rule mid-token
};

// Shared by a request's clones.
struct GbnfShared {
  GbnfShared(std::shared_ptr<const TokenTexts> t, std::shared_ptr<const GbnfGrammar> g,
             std::vector<int32_t> ends)
      : texts(std::move(t)), automaton(std::move(g)), end_ids(std::move(ends)) {}

  // The local mask of stack `node` cut to kLocalDepth frames.
  const LocalMask& Local(int32_t node);

  std::mutex mu;
  std::shared_ptr<const TokenTexts> texts;
  GbnfAutomaton automaton;
  std::vector<int32_t> end_ids;
  std::unordered_map<int32_t, LocalMask> local;  // by cut stack node
  MaskCache cache;
};

const LocalMask& GbnfShared::Local(int32_t node) {
  if (local.size() >= kMaxLocalMasks) local.clear();
  auto [it, inserted] = local.try_emplace(node);
  if (!inserted) return it->second;
  LocalMask& mask = it->second;
  mask.accepted.assign((texts->bytes.size() + 63) / 64, 0);
  struct Walk {
    int32_t state;
    bool popped;  // the top rule could have ended after a byte of this prefix
  };
  GbnfAutomaton& a = automaton;
  const int32_t start = a.StateOf(node);
  if (start == GbnfAutomaton::kDead) return mask;
  WalkTokenTrieVisit(
      texts->all, Walk{start, false},
      [&a](Walk& w, uint8_t byte) {
        if (w.state == GbnfAutomaton::kDead) return w.popped;
        w.state = a.Next(w.state, byte);
        if (w.state == GbnfAutomaton::kDead) return w.popped;
        w.popped |= a.HasPop(w.state);
        return true;
      },
      [&mask](size_t id, const Walk& w) {
        if (w.state != GbnfAutomaton::kDead) {
          mask.accepted[id / 64] |= uint64_t{1} << (id % 64);
        } else {
          mask.uncertain.push_back(static_cast<int32_t>(id));
        }
      });
  return mask;
}

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
  thread_local std::vector<uint64_t> bits;
  thread_local std::vector<int32_t> uncertain, tops;
  bits.assign((vocab + 63) / 64, 0);
  uncertain.clear();
  tops.clear();
  bool can_end = false;
  for (int32_t node : a.Stacks(state_)) {
    if (node == GbnfAutomaton::kAcceptNode) {
      can_end = true;
      continue;
    }
    tops.push_back(a.Truncate(node, kLocalDepth));
  }
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  for (int32_t cut : tops) {
    const LocalMask& local = s.Local(cut);
    for (size_t w = 0; w < local.accepted.size(); ++w) bits[w] |= local.accepted[w];
    uncertain.insert(uncertain.end(), local.uncertain.begin(), local.uncertain.end());
  }
  UnpackMask(bits, vocab, &allowed);
  int64_t count = 0;
  for (uint64_t word : bits) count += std::popcount(word);
  for (int32_t id : uncertain) {
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

std::string GbnfConstraintError(const TokenConstraint& constraint) {
  const auto* c = dynamic_cast<const GbnfConstraint*>(&constraint);
  return c != nullptr ? c->error() : std::string();
}

}  // namespace ember
