#include "sampling/gbnf_automaton.h"

#include <algorithm>

#include "util/check.h"

namespace ember {

GbnfAutomaton::GbnfAutomaton(std::shared_ptr<const GbnfGrammar> grammar)
    : grammar_(std::move(grammar)) {
  CHECK(grammar_ != nullptr);
  num_classes_ = static_cast<size_t>(grammar_->num_classes);
  ComputeFollow();
  node_pos_ = {-1, -1};  // kAcceptNode, kPopNode
  node_parent_ = {-1, -1};
  for (int32_t alt : grammar_->alternatives[static_cast<size_t>(grammar_->root)])
    work_list_.push_back({alt, kAcceptNode});
  Settle();
  start_ = Intern(out_);
  CHECK(start_ >= 0) << error_;  // root derives some text (ParseGbnf checks)
}

// FIRST and nullability of every rule, then FOLLOW (over bytes), by fixpoints.
void GbnfAutomaton::ComputeFollow() {
  const GbnfGrammar& g = *grammar_;
  const size_t num_rules = g.alternatives.size();
  rule_of_.assign(g.elements.size(), -1);
  for (size_t r = 0; r < num_rules; ++r) {
    for (int32_t alt : g.alternatives[r]) {
      for (auto pos = static_cast<size_t>(alt);; ++pos) {
        rule_of_[pos] = static_cast<int32_t>(r);
        if (g.elements[pos].kind == GbnfGrammar::kEnd) break;
      }
    }
  }
  std::vector<std::bitset<256>> first(num_rules);
  std::vector<uint8_t> nullable(num_rules, 0);
  // FIRST of the elements from `pos` to the end of its alternative; *rest_nullable if all nullable.
  auto first_of = [&](size_t pos, bool* rest_nullable) {
    std::bitset<256> bytes;
    for (;; ++pos) {
      const GbnfGrammar::Element e = g.elements[pos];
      if (e.kind == GbnfGrammar::kEnd) {
        *rest_nullable = true;
        return bytes;
      }
      if (e.kind == GbnfGrammar::kBytes) {
        *rest_nullable = false;
        return bytes | g.byte_sets[static_cast<size_t>(e.arg)];
      }
      bytes |= first[static_cast<size_t>(e.arg)];
      if (!nullable[static_cast<size_t>(e.arg)]) {
        *rest_nullable = false;
        return bytes;
      }
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < num_rules; ++r) {
      for (int32_t alt : g.alternatives[r]) {
        bool empty = false;
        const std::bitset<256> bytes = first_of(static_cast<size_t>(alt), &empty);
        if ((first[r] | bytes) != first[r] || (empty && !nullable[r])) changed = true;
        first[r] |= bytes;
        nullable[r] |= empty;
      }
    }
  }
  follow_.assign(num_rules, {});
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t pos = 0; pos < g.elements.size(); ++pos) {
      if (g.elements[pos].kind != GbnfGrammar::kRule) continue;
      const auto target = static_cast<size_t>(g.elements[pos].arg);
      bool rest_nullable = false;
      std::bitset<256> bytes = first_of(pos + 1, &rest_nullable);
      if (rest_nullable) bytes |= follow_[static_cast<size_t>(rule_of_[pos])];
      if ((follow_[target] | bytes) != follow_[target]) {
        follow_[target] |= bytes;
        changed = true;
      }
    }
  }
}

const std::bitset<256>& GbnfAutomaton::CutFollow(int32_t cut) const {
  for (int32_t n = cut; n != kAcceptNode && n != kPopNode; n = node_parent_[static_cast<size_t>(n)]) {
    if (node_parent_[static_cast<size_t>(n)] == kPopNode)
      return follow_[static_cast<size_t>(rule_of_[static_cast<size_t>(node_pos_[static_cast<size_t>(n)])])];
  }
  return none_;
}

int32_t GbnfAutomaton::Fail(const std::string& message) {
  if (error_.empty()) error_ = message;
  return kDead;
}

int32_t GbnfAutomaton::Node(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) |
                       static_cast<uint32_t>(parent);
  auto [it, inserted] = node_ids_.emplace(key, static_cast<int32_t>(node_pos_.size()));
  if (inserted) {
    node_pos_.push_back(pos);
    node_parent_.push_back(parent);
  }
  return it->second;
}

void GbnfAutomaton::Settle() {
  const GbnfGrammar& g = *grammar_;
  out_.clear();
  visited_.clear();
  while (!work_list_.empty()) {
    const auto [pos, parent] = work_list_.back();
    work_list_.pop_back();
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) |
                         static_cast<uint32_t>(parent);
    if (!visited_.insert(key).second) continue;
    if (++work_ > kMaxWork) {
      work_list_.clear();
      Fail("the grammar's parse is too ambiguous: more than " + std::to_string(kMaxWork) +
           " parser steps for one token mask");
      return;
    }
    const GbnfGrammar::Element e = g.elements[static_cast<size_t>(pos)];
    if (e.kind == GbnfGrammar::kBytes) {
      out_.push_back(Node(pos, parent));
    } else if (e.kind == GbnfGrammar::kEnd) {
      if (parent == kAcceptNode || parent == kPopNode) {
        out_.push_back(parent);
      } else {
        work_list_.push_back({node_pos_[static_cast<size_t>(parent)],
                              node_parent_[static_cast<size_t>(parent)]});
      }
    } else {
      const bool tail = g.elements[static_cast<size_t>(pos) + 1].kind == GbnfGrammar::kEnd;
      const int32_t cont = tail ? parent : Node(pos + 1, parent);
      for (int32_t alt : g.alternatives[static_cast<size_t>(e.arg)])
        work_list_.push_back({alt, cont});
    }
  }
  if (node_pos_.size() > kMaxNodes)
    Fail("the grammar's parse needs more than " + std::to_string(kMaxNodes) + " stack nodes");
}

int32_t GbnfAutomaton::Intern(std::vector<int32_t>& nodes) {
  if (!error_.empty() || nodes.empty()) return kDead;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  if (nodes.size() > kMaxStacks)
    return Fail("the grammar is too ambiguous: more than " + std::to_string(kMaxStacks) +
                " parses alive at once");
  std::string key(reinterpret_cast<const char*>(nodes.data()), nodes.size() * sizeof(int32_t));
  auto [it, inserted] = set_ids_.emplace(std::move(key), static_cast<int32_t>(num_states()));
  if (inserted) {
    if (num_states() >= kMaxStates)
      return Fail("the grammar's parse needs more than " + std::to_string(kMaxStates) +
                  " automaton states");
    set_nodes_.insert(set_nodes_.end(), nodes.begin(), nodes.end());
    set_offsets_.push_back(static_cast<uint32_t>(set_nodes_.size()));
    next_.resize(next_.size() + num_classes_, kUnknown);
  }
  return it->second;
}

int32_t GbnfAutomaton::Compute(int32_t state, uint8_t byte) {
  if (!error_.empty()) return kDead;
  const GbnfGrammar& g = *grammar_;
  work_list_.clear();
  for (int32_t node : Stacks(state)) {
    if (node == kAcceptNode || node == kPopNode) continue;
    const int32_t pos = node_pos_[static_cast<size_t>(node)];
    const GbnfGrammar::Element e = g.elements[static_cast<size_t>(pos)];
    if (g.byte_sets[static_cast<size_t>(e.arg)].test(byte))
      work_list_.push_back({pos + 1, node_parent_[static_cast<size_t>(node)]});
  }
  Settle();
  return Intern(out_);
}

int32_t GbnfAutomaton::Walk(int32_t state, std::string_view text) {
  for (char c : text) {
    if (state == kDead) return kDead;
    state = Next(state, static_cast<uint8_t>(c));
  }
  return state;
}

int32_t GbnfAutomaton::Truncate(int32_t node, int depth, int32_t* below) {
  CHECK(node != kAcceptNode && node != kPopNode);
  int32_t chain[16];
  CHECK(depth > 0 && depth <= 16);
  int kept = 0;
  int32_t n = node;
  for (; kept < depth; n = node_parent_[static_cast<size_t>(n)]) {
    if (n == kAcceptNode || n == kPopNode) {  // no deeper than `depth`
      *below = kAcceptNode;
      return node;
    }
    chain[kept++] = n;
  }
  *below = n;
  if (n == kAcceptNode) return node;
  int32_t cut = kPopNode;
  for (int i = kept - 1; i >= 0; --i) cut = Node(node_pos_[static_cast<size_t>(chain[i])], cut);
  return cut;
}

std::bitset<256> GbnfAutomaton::FirstBytesBelow(int32_t node) {
  std::bitset<256> bytes;
  if (node == kAcceptNode || node == kPopNode) return bytes;
  work_list_.assign(1, {node_pos_[static_cast<size_t>(node)], node_parent_[static_cast<size_t>(node)]});
  Settle();
  for (int32_t top : out_) {
    if (top == kAcceptNode || top == kPopNode) continue;
    const int32_t pos = node_pos_[static_cast<size_t>(top)];
    bytes |= grammar_->byte_sets[static_cast<size_t>(grammar_->elements[static_cast<size_t>(pos)].arg)];
  }
  return bytes;
}

int32_t GbnfAutomaton::StateOf(int32_t node) {
  out_.assign(1, node);
  return Intern(out_);
}

}  // namespace ember
