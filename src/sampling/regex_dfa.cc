#include "sampling/regex_dfa.h"

#include <algorithm>
#include <bitset>
#include <map>
#include <unordered_map>

#include "util/check.h"
#include "util/utf8.h"

namespace ember {

namespace {

int Utf8Length(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

uint8_t Utf8Byte(uint32_t cp, int i) {
  std::string s;
  AppendUtf8(cp, &s);
  return static_cast<uint8_t>(s[static_cast<size_t>(i)]);
}

}  // namespace

void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>* out) {
  if (lo > hi) return;
  for (uint32_t limit : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= limit && hi > limit) {
      Utf8Sequences(lo, limit, out);
      Utf8Sequences(limit + 1, hi, out);
      return;
    }
  }
  const int len = Utf8Length(lo);
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  ByteRanges seq;
  for (int i = 0; i < len; ++i) seq.push_back({Utf8Byte(lo, i), Utf8Byte(hi, i)});
  out->push_back(std::move(seq));
}

namespace {

struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    int32_t to;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<int32_t> eps;
  };
  std::vector<State> states;
  bool overflow = false;

  int32_t Add() {
    if (states.size() >= static_cast<size_t>(RegexDfa::kMaxNfaStates)) {
      overflow = true;
      return 0;  // the build goes on harmlessly; the caller reports the overflow
    }
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
  }
  void Eps(int32_t from, int32_t to) {
    if (!overflow) states[static_cast<size_t>(from)].eps.push_back(to);
  }
  void AddEdge(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
    if (!overflow) states[static_cast<size_t>(from)].edges.push_back({lo, hi, to});
  }
};

struct Fragment {
  int32_t start, end;
};

class NfaBuilder {
 public:
  NfaBuilder(const RegexSyntax& syntax, Nfa* nfa) : syntax_(syntax), nfa_(*nfa) {}

  Fragment Build(int32_t id) {
    const RegexNode& n = syntax_.nodes[static_cast<size_t>(id)];
    const Fragment f{nfa_.Add(), nfa_.Add()};
    if (nfa_.overflow) return f;
    switch (n.kind) {
      case RegexNode::kEmpty:
        nfa_.Eps(f.start, f.end);
        break;
      case RegexNode::kSet:
        BuildSet(n.set, f);
        break;
      case RegexNode::kConcat: {
        int32_t at = f.start;
        for (int32_t child : n.children) {
          const Fragment c = Build(child);
          nfa_.Eps(at, c.start);
          at = c.end;
          if (nfa_.overflow) return f;
        }
        nfa_.Eps(at, f.end);
        break;
      }
      case RegexNode::kAlternate:
        for (int32_t child : n.children) {
          const Fragment c = Build(child);
          nfa_.Eps(f.start, c.start);
          nfa_.Eps(c.end, f.end);
          if (nfa_.overflow) return f;
        }
        break;
      case RegexNode::kRepeat:
        BuildRepeat(n, f);
        break;
    }
    return f;
  }

 private:
  void BuildSet(const CodePointRanges& set, Fragment f) {
    std::vector<ByteRanges> seqs;
    for (const auto& [lo, hi] : set) Utf8Sequences(lo, hi, &seqs);
    for (const ByteRanges& seq : seqs) {
      int32_t at = f.start;
      for (size_t i = 0; i < seq.size(); ++i) {
        const int32_t to = i + 1 == seq.size() ? f.end : nfa_.Add();
        nfa_.AddEdge(at, seq[i].first, seq[i].second, to);
        at = to;
      }
    }
  }

  void BuildRepeat(const RegexNode& n, Fragment f) {
    const int32_t child = n.children[0];
    int32_t at = f.start;
    for (int32_t i = 0; i < n.min && !nfa_.overflow; ++i) {
      const Fragment c = Build(child);
      nfa_.Eps(at, c.start);
      at = c.end;
    }
    if (n.max < 0) {  // a loop: child* after the required copies
      const Fragment c = Build(child);
      nfa_.Eps(at, c.start);
      nfa_.Eps(c.end, at);
      nfa_.Eps(at, f.end);
      return;
    }
    for (int32_t i = n.min; i < n.max && !nfa_.overflow; ++i) {
      const Fragment c = Build(child);
      nfa_.Eps(at, f.end);  // stop here
      nfa_.Eps(at, c.start);
      at = c.end;
    }
    nfa_.Eps(at, f.end);
  }

  const RegexSyntax& syntax_;
  Nfa& nfa_;
};

// The epsilon closure of `set`, sorted.
std::vector<int32_t> Closure(const Nfa& nfa, std::vector<int32_t> set, std::vector<uint8_t>* seen) {
  std::vector<int32_t> stack = set;
  for (int32_t s : set) (*seen)[static_cast<size_t>(s)] = 1;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t t : nfa.states[static_cast<size_t>(s)].eps) {
      if ((*seen)[static_cast<size_t>(t)]) continue;
      (*seen)[static_cast<size_t>(t)] = 1;
      set.push_back(t);
      stack.push_back(t);
    }
  }
  for (int32_t s : set) (*seen)[static_cast<size_t>(s)] = 0;
  std::sort(set.begin(), set.end());
  return set;
}

Status TooManyStates(const std::string& path) {
  return Status::Error(path + ": the pattern needs more than " +
                       std::to_string(RegexDfa::kMaxStates) +
                       " automaton states (the limit for one constraint); simplify it");
}

}  // namespace

Result<std::shared_ptr<const RegexDfa>> RegexDfa::Compile(const RegexSyntax& syntax, int32_t root,
                                                          const std::string& path) {
  Nfa nfa;
  const Fragment whole = NfaBuilder(syntax, &nfa).Build(root);
  if (nfa.overflow) {
    return Status::Error(path + ": the pattern expands to more than " +
                         std::to_string(kMaxNfaStates) +
                         " automaton states (the limit; nested or large counted repetitions)");
  }
  auto dfa = std::make_shared<RegexDfa>();
  // Byte classes: bytes no edge tells apart share a column.
  std::bitset<257> cut;
  for (const Nfa::State& s : nfa.states) {
    for (const Nfa::Edge& e : s.edges) {
      cut.set(e.lo);
      cut.set(static_cast<size_t>(e.hi) + 1);
    }
  }
  std::vector<uint8_t> representative;
  for (int b = 0; b < 256; ++b) {
    if (b == 0 || cut.test(static_cast<size_t>(b)))
      representative.push_back(static_cast<uint8_t>(b));
    dfa->byte_class_[static_cast<size_t>(b)] = static_cast<uint8_t>(representative.size() - 1);
  }
  dfa->num_classes_ = representative.size();
  std::vector<uint8_t> seen(nfa.states.size(), 0);
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<const std::vector<int32_t>*> sets;
  auto intern = [&](std::vector<int32_t> set) -> int32_t {
    auto [it, added] = ids.emplace(std::move(set), static_cast<int32_t>(sets.size()));
    if (added) {
      sets.push_back(&it->first);
      dfa->accepting_.push_back(std::binary_search(it->first.begin(), it->first.end(), whole.end));
      dfa->next_.resize(sets.size() * dfa->num_classes_, kDead);
    }
    return it->second;
  };
  dfa->start_ = intern(Closure(nfa, {whole.start}, &seen));
  for (size_t id = 0; id < sets.size(); ++id) {
    if (sets.size() > static_cast<size_t>(kMaxStates)) return TooManyStates(path);
    for (size_t c = 0; c < dfa->num_classes_; ++c) {
      const uint8_t b = representative[c];
      std::vector<int32_t> targets;
      for (int32_t s : *sets[id])
        for (const Nfa::Edge& e : nfa.states[static_cast<size_t>(s)].edges)
          if (b >= e.lo && b <= e.hi) targets.push_back(e.to);
      if (targets.empty()) continue;
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      const int32_t to = intern(Closure(nfa, std::move(targets), &seen));
      dfa->next_[id * dfa->num_classes_ + c] = to;
    }
  }
  if (sets.size() > static_cast<size_t>(kMaxStates)) return TooManyStates(path);
  EMBER_RETURN_IF_ERROR(dfa->Trim(path));
  return std::shared_ptr<const RegexDfa>(std::move(dfa));
}

Result<std::shared_ptr<const RegexDfa>> RegexDfa::Intersect(const RegexDfa& a, const RegexDfa& b,
                                                            const std::string& path) {
  auto dfa = std::make_shared<RegexDfa>();
  // A product class per distinct pair of the two machines' classes.
  std::map<std::pair<uint8_t, uint8_t>, uint8_t> pair_class;
  std::vector<uint8_t> representative;
  for (int byte = 0; byte < 256; ++byte) {
    const auto key = std::make_pair(a.byte_class_[static_cast<size_t>(byte)],
                                    b.byte_class_[static_cast<size_t>(byte)]);
    auto [it, added] = pair_class.emplace(key, static_cast<uint8_t>(representative.size()));
    if (added) representative.push_back(static_cast<uint8_t>(byte));
    dfa->byte_class_[static_cast<size_t>(byte)] = it->second;
  }
  dfa->num_classes_ = representative.size();
  std::unordered_map<uint64_t, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  auto intern = [&](int32_t sa, int32_t sb) -> int32_t {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(sa)) << 32) | static_cast<uint32_t>(sb);
    auto [it, added] = ids.emplace(key, static_cast<int32_t>(pairs.size()));
    if (added) {
      pairs.push_back({sa, sb});
      dfa->accepting_.push_back(a.Accepting(sa) && b.Accepting(sb));
      dfa->next_.resize(pairs.size() * dfa->num_classes_, kDead);
    }
    return it->second;
  };
  dfa->start_ = intern(a.start_, b.start_);
  for (size_t id = 0; id < pairs.size(); ++id) {
    if (pairs.size() > static_cast<size_t>(kMaxStates)) return TooManyStates(path);
    for (size_t c = 0; c < dfa->num_classes_; ++c) {
      const int32_t na = a.Next(pairs[id].first, representative[c]);
      const int32_t nb = b.Next(pairs[id].second, representative[c]);
      if (na == kDead || nb == kDead) continue;
      dfa->next_[id * dfa->num_classes_ + c] = intern(na, nb);
    }
  }
  if (pairs.size() > static_cast<size_t>(kMaxStates)) return TooManyStates(path);
  EMBER_RETURN_IF_ERROR(dfa->Trim(path));
  return std::shared_ptr<const RegexDfa>(std::move(dfa));
}

std::shared_ptr<const RegexDfa> RegexDfa::Multiples(int64_t k) {
  CHECK(k >= 1 && k <= kMaxDivisor);
  auto dfa = std::make_shared<RegexDfa>();
  dfa->BuildMultiples(k, 0);
  CHECK(dfa->Trim("multipleOf").ok());  // every remainder can still reach 0
  return dfa;
}

Result<std::shared_ptr<const RegexDfa>> RegexDfa::DecimalMultiples(int64_t p, int scale,
                                                                   const std::string& path) {
  CHECK(p >= 1 && p <= kMaxDivisor && scale >= 1);
  if (3 + p * (scale + 2) > kMaxStates) {
    return Status::Error(path + ": the multiples of " + std::to_string(p) + " / 10^" +
                         std::to_string(scale) + " need more than " + std::to_string(kMaxStates) +
                         " automaton states");
  }
  auto dfa = std::make_shared<RegexDfa>();
  dfa->BuildMultiples(p, scale);
  EMBER_RETURN_IF_ERROR(dfa->Trim(path));
  return std::shared_ptr<const RegexDfa>(std::move(dfa));
}

void RegexDfa::BuildMultiples(int64_t p, int scale) {
  // Classes: each digit, '-', '.', everything else.
  enum : uint8_t { kMinus = 10, kDot = 11, kOther = 12 };
  byte_class_.fill(kOther);
  for (int d = 0; d < 10; ++d) byte_class_[static_cast<size_t>('0' + d)] = static_cast<uint8_t>(d);
  byte_class_['-'] = kMinus;
  byte_class_['.'] = kDot;
  num_classes_ = 13;
  // States: 0 start, 1 after '-', 2 "0", 3 + r: an integer part with remainder r mod p; then
  // per j in [0, scale] and r: j fraction digits read, remainder r (j = 0: just after the dot).
  const auto num_states = static_cast<size_t>(3 + p * (scale > 0 ? scale + 2 : 1));
  next_.assign(num_states * num_classes_, kDead);
  accepting_.assign(num_states, 0);
  auto at = [&](size_t state, size_t c) -> int32_t& { return next_[state * num_classes_ + c]; };
  auto integer = [&](int64_t r) { return static_cast<int32_t>(3 + r % p); };
  auto fraction = [&](int j, int64_t r) { return static_cast<int32_t>(3 + p + j * p + r % p); };
  // r * 10^e mod p: a value whose remaining e fraction digits are zeros.
  auto shifted = [&](int64_t r, int e) {
    for (int i = 0; i < e; ++i) r = r * 10 % p;
    return r;
  };
  at(0, kMinus) = 1;
  at(0, 0) = 2;
  if (scale > 0) at(1, 0) = 2;  // "-0.5"
  for (int d = 1; d < 10; ++d) at(0, static_cast<size_t>(d)) = at(1, static_cast<size_t>(d)) = integer(d);
  accepting_[2] = 1;
  for (int64_t r = 0; r < p; ++r) {
    const auto from = static_cast<size_t>(integer(r));
    for (int d = 0; d < 10; ++d) at(from, static_cast<size_t>(d)) = integer(10 * r + d);
    accepting_[from] = shifted(r, scale) == 0;
  }
  if (scale == 0) return;
  at(2, kDot) = fraction(0, 0);
  for (int64_t r = 0; r < p; ++r) at(static_cast<size_t>(integer(r)), kDot) = fraction(0, r);
  for (int j = 0; j <= scale; ++j) {
    for (int64_t r = 0; r < p; ++r) {
      const auto from = static_cast<size_t>(fraction(j, r));
      if (j > 0) accepting_[from] = shifted(r, scale - j) == 0;
      if (j < scale) {
        for (int d = 0; d < 10; ++d) at(from, static_cast<size_t>(d)) = fraction(j + 1, 10 * r + d);
      } else if (r == 0) {
        at(from, 0) = static_cast<int32_t>(from);  // trailing zeros
      }
    }
  }
}

Status RegexDfa::Trim(const std::string& path) {
  const size_t n = accepting_.size();
  std::vector<std::vector<int32_t>> into(n);
  for (size_t s = 0; s < n; ++s)
    for (size_t c = 0; c < num_classes_; ++c)
      if (const int32_t t = next_[s * num_classes_ + c]; t != kDead)
        into[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s)
    if (accepting_[s]) live[s] = 1, stack.push_back(static_cast<int32_t>(s));
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t from : into[static_cast<size_t>(s)])
      if (!live[static_cast<size_t>(from)])
        live[static_cast<size_t>(from)] = 1, stack.push_back(from);
  }
  if (!live[static_cast<size_t>(start_)])
    return Status::Error(path + ": no string matches the pattern");
  has_next_.assign(n, 0);
  for (size_t s = 0; s < n; ++s) {
    for (size_t c = 0; c < num_classes_; ++c) {
      int32_t& t = next_[s * num_classes_ + c];
      if (t != kDead && !live[static_cast<size_t>(t)]) t = kDead;
      if (t != kDead) has_next_[s] = 1;
    }
  }
  return Status::Ok();
}

bool RegexDfa::Matches(std::string_view text) const {
  int32_t s = start_;
  for (char c : text) {
    s = Next(s, static_cast<uint8_t>(c));
    if (s == kDead) return false;
  }
  return Accepting(s);
}

Result<std::shared_ptr<const RegexDfa>> CompileRegex(std::string_view pattern, RegexMatch match,
                                                     const std::string& path) {
  EMBER_ASSIGN_OR_RETURN(RegexSyntax syntax, ParseRegex(pattern, path));
  const int32_t root = match == RegexMatch::kSearch ? syntax.Search() : syntax.root;
  return RegexDfa::Compile(syntax, root, path);
}

}  // namespace ember
