#include "sampling/gbnf_grammar.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "sampling/regex_dfa.h"
#include "sampling/regex_syntax.h"
#include "util/check.h"
#include "util/utf8.h"

namespace ember {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// The grammar before lowering to bytes: symbols are code-point sets, literals or rule references.
struct Sym {
  enum Kind : uint8_t { kSet, kLiteral, kRef } kind = kLiteral;
  CodePointRanges set;  // kSet
  std::string literal;  // kLiteral: UTF-8
  int32_t rule = -1;    // kRef
};
using Seq = std::vector<Sym>;

struct IrRule {
  std::string name;
  std::vector<Seq> alts;
  int32_t owner = -1;     // the user rule a generated one belongs to (itself for a user rule)
  size_t offset = 0;      // where it was first named (definition or reference)
  int32_t named_in = -1;  // the user rule it was first referenced in (errors)
  bool defined = false;
  bool generated = false;
};

class Parser {
 public:
  Parser(std::string_view text, const std::string& path) : text_(text), path_(path) {}
  Status Parse();
  std::vector<IrRule>& rules() { return rules_; }
  Status FailAt(size_t offset, const std::string& message, int32_t rule) const;

 private:
  Status Fail(const std::string& message) const { return FailAt(at_, message, current_); }
  bool AtEnd() const { return at_ >= text_.size(); }
  char Peek(size_t ahead = 0) const {
    return at_ + ahead < text_.size() ? text_[at_ + ahead] : '\0';
  }
  static bool NameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
  }
  void SkipSpace();
  std::string ReadName();
  bool AtRuleStart() const;  // `name ::=` follows
  int32_t Lookup(const std::string& name, size_t offset);
  int32_t Generated(std::vector<Seq> alts);
  Status Count(size_t elements);
  Status Alternatives(int depth, std::vector<Seq>* alts);
  Status Sequence(int depth, Seq* seq);
  Status Atom(int depth, Sym* sym);
  Status Postfix(Sym sym, Seq* seq);
  Status ReadInt(int32_t* value);
  Status Char(uint32_t* cp);  // one character of a literal or class, escapes decoded
  Status Literal(Sym* sym);
  Status Class(Sym* sym);

  std::string_view text_;
  const std::string& path_;
  size_t at_ = 0;
  std::vector<IrRule> rules_;
  std::unordered_map<std::string, int32_t> by_name_;
  int32_t current_ = -1;  // the user rule being parsed
  size_t num_elements_ = 0;
};

Status Parser::FailAt(size_t offset, const std::string& message, int32_t rule) const {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text_.size(); ++i) {
    if (text_[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  std::string where = path_ + ": line " + std::to_string(line) + ", column " +
                      std::to_string(column);
  if (rule >= 0) where += " (rule '" + rules_[static_cast<size_t>(rule)].name + "')";
  return Status::Error(where + ": " + message);
}

void Parser::SkipSpace() {
  while (!AtEnd()) {
    const char c = Peek();
    if (c == '#') {
      while (!AtEnd() && Peek() != '\n') ++at_;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++at_;
    } else {
      return;
    }
  }
}

std::string Parser::ReadName() {
  const size_t start = at_;
  while (!AtEnd() && NameChar(Peek())) ++at_;
  return std::string(text_.substr(start, at_ - start));
}

bool Parser::AtRuleStart() const {
  size_t i = at_;
  while (i < text_.size() && NameChar(text_[i])) ++i;
  if (i == at_) return false;
  while (i < text_.size() && (text_[i] == ' ' || text_[i] == '\t')) ++i;
  return text_.substr(i, 3) == "::=";
}

int32_t Parser::Lookup(const std::string& name, size_t offset) {
  auto [it, inserted] = by_name_.emplace(name, static_cast<int32_t>(rules_.size()));
  if (inserted) {
    IrRule rule;
    rule.name = name;
    rule.owner = it->second;
    rule.offset = offset;
    rule.named_in = current_;
    rules_.push_back(std::move(rule));
  }
  return it->second;
}

int32_t Parser::Generated(std::vector<Seq> alts) {
  IrRule rule;
  rule.name = rules_[static_cast<size_t>(current_)].name;
  rule.owner = current_;
  rule.offset = at_;
  rule.defined = rule.generated = true;
  rule.alts = std::move(alts);
  rules_.push_back(std::move(rule));
  return static_cast<int32_t>(rules_.size() - 1);
}

Status Parser::Count(size_t elements) {
  num_elements_ += elements;
  if (num_elements_ > GbnfGrammar::kMaxElements)
    return Fail("the grammar is too large once repetitions are expanded (more than " +
                std::to_string(GbnfGrammar::kMaxElements) + " elements)");
  return Status::Ok();
}

Status Parser::Parse() {
  if (text_.size() > GbnfGrammar::kMaxGrammarBytes)
    return Fail("the grammar is longer than " + std::to_string(GbnfGrammar::kMaxGrammarBytes) +
                " bytes");
  for (SkipSpace(); !AtEnd(); SkipSpace()) {
    const size_t start = at_;
    const std::string name = ReadName();
    if (name.empty()) return Fail(std::string("expected a rule name, got '") + Peek() + "'");
    SkipSpace();
    if (text_.substr(at_, 3) != "::=") return Fail("expected '::=' after rule name '" + name + "'");
    at_ += 3;
    current_ = Lookup(name, start);
    IrRule& rule = rules_[static_cast<size_t>(current_)];
    if (rule.defined) return FailAt(start, "rule '" + name + "' is defined twice", -1);
    rule.defined = true;
    rule.offset = start;
    std::vector<Seq> alts;
    EMBER_RETURN_IF_ERROR(Alternatives(0, &alts));
    if (!AtEnd() && !AtRuleStart())
      return Fail(std::string("unexpected '") + Peek() + "' (unbalanced parentheses?)");
    rules_[static_cast<size_t>(current_)].alts = std::move(alts);
  }
  current_ = -1;
  if (rules_.empty()) return Fail("the grammar is empty (no rules)");
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (!rules_[r].defined)
      return FailAt(rules_[r].offset, "undefined rule '" + rules_[r].name + "'", rules_[r].named_in);
  }
  if (by_name_.count("root") == 0) return FailAt(0, "no rule named 'root' (the start rule)", -1);
  return Status::Ok();
}

Status Parser::Alternatives(int depth, std::vector<Seq>* alts) {
  if (depth > GbnfGrammar::kMaxDepth)
    return Fail("groups nested deeper than " + std::to_string(GbnfGrammar::kMaxDepth));
  while (true) {
    Seq seq;
    EMBER_RETURN_IF_ERROR(Sequence(depth, &seq));
    alts->push_back(std::move(seq));
    if (Peek() != '|') return Status::Ok();
    ++at_;
  }
}

Status Parser::Sequence(int depth, Seq* seq) {
  while (true) {
    SkipSpace();
    if (AtEnd() || Peek() == '|' || Peek() == ')') return Status::Ok();
    if (depth == 0 && AtRuleStart()) return Status::Ok();
    Sym sym;
    EMBER_RETURN_IF_ERROR(Atom(depth, &sym));
    EMBER_RETURN_IF_ERROR(Postfix(std::move(sym), seq));
  }
}

Status Parser::Atom(int depth, Sym* sym) {
  const char c = Peek();
  if (c == '"') return Literal(sym);
  if (c == '[') return Class(sym);
  if (c == '.') {
    ++at_;
    sym->kind = Sym::kSet;
    sym->set = NormalizeCodePoints({{0, kMaxCodePoint}});
    return Count(1);
  }
  if (c == '(') {
    ++at_;
    std::vector<Seq> alts;
    EMBER_RETURN_IF_ERROR(Alternatives(depth + 1, &alts));
    if (Peek() != ')') return Fail("unbalanced parentheses: '(' without ')'");
    ++at_;
    sym->kind = Sym::kRef;
    sym->rule = Generated(std::move(alts));
    return Count(1);
  }
  if (NameChar(c)) {
    sym->kind = Sym::kRef;
    const size_t start = at_;
    sym->rule = Lookup(ReadName(), start);
    return Count(1);
  }
  if (c == '*' || c == '+' || c == '?' || c == '{')
    return Fail(std::string("'") + c + "' repeats nothing (put it after an element)");
  return Fail(std::string("unexpected '") + c + "'");
}

Status Parser::ReadInt(int32_t* value) {
  const size_t start = at_;
  int64_t v = 0;
  while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
    v = v * 10 + (Peek() - '0');
    if (v > GbnfGrammar::kMaxRepeat)
      return Fail("a repetition count above " + std::to_string(GbnfGrammar::kMaxRepeat));
    ++at_;
  }
  *value = at_ == start ? -1 : static_cast<int32_t>(v);
  return Status::Ok();
}

Status Parser::Postfix(Sym sym, Seq* seq) {
  int32_t min = 1, max = 1;  // max -1: unbounded
  const char c = Peek();
  if (c == '*' || c == '+' || c == '?') {
    ++at_;
    min = c == '+' ? 1 : 0;
    max = c == '?' ? 1 : -1;
  } else if (c == '{') {
    ++at_;
    EMBER_RETURN_IF_ERROR(ReadInt(&min));
    max = min;
    const bool has_min = min >= 0;
    bool has_max = has_min;
    if (Peek() == ',') {
      ++at_;
      EMBER_RETURN_IF_ERROR(ReadInt(&max));
      has_max = max >= 0;
      if (!has_min) min = 0;
    }
    if (Peek() != '}' || (!has_min && !has_max))
      return Fail("a bad repetition: expected {m}, {m,}, {m,n} or {,n}");
    ++at_;
    if (max >= 0 && max < min) return Fail("a repetition {m,n} with n < m");
  }
  if (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{')
    return Fail("a repetition of a repetition (use parentheses)");
  const size_t size = sym.kind == Sym::kLiteral ? sym.literal.size() : 1;
  for (int32_t i = 0; i < min; ++i) {
    EMBER_RETURN_IF_ERROR(Count(size));
    seq->push_back(sym);
  }
  if (max == min) return Status::Ok();
  Sym ref;
  ref.kind = Sym::kRef;
  if (max < 0) {  // R ::= x R | ""
    ref.rule = Generated({});
    rules_[static_cast<size_t>(ref.rule)].alts = {Seq{sym, ref}, Seq{}};
    EMBER_RETURN_IF_ERROR(Count(size + 1));
  } else {  // R1 ::= x | "", Rk ::= x R(k-1) | ""
    for (int32_t k = 0; k < max - min; ++k) {
      Seq more{sym};
      if (k > 0) more.push_back(ref);
      ref.rule = Generated({std::move(more), Seq{}});
      EMBER_RETURN_IF_ERROR(Count(size + 1));
    }
  }
  seq->push_back(ref);
  return Status::Ok();
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Status Parser::Char(uint32_t* cp) {
  if (AtEnd()) return Fail("an unterminated literal or class");
  const auto b = static_cast<uint8_t>(Peek());
  if (b != '\\') {  // one UTF-8 character
    const int len = b < 0x80 ? 1 : b >= 0xF8 ? 0 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || at_ + static_cast<size_t>(len) > text_.size()) return Fail("invalid UTF-8");
    uint32_t v = len == 1 ? b : b & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto c = static_cast<uint8_t>(Peek(static_cast<size_t>(i)));
      if ((c & 0xC0) != 0x80) return Fail("invalid UTF-8");
      v = (v << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMinOfLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < kMinOfLength[len] || v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      return Fail("invalid UTF-8");
    at_ += static_cast<size_t>(len);
    *cp = v;
    return Status::Ok();
  }
  const char e = Peek(1);
  static constexpr std::pair<char, char> kSimple[] = {
      {'\\', '\\'}, {'"', '"'}, {'\'', '\''}, {'[', '['}, {']', ']'}, {'-', '-'},
      {'/', '/'},   {'n', '\n'}, {'r', '\r'}, {'t', '\t'}, {'^', '^'}};
  for (const auto& [escape, value] : kSimple) {
    if (e == escape) {
      at_ += 2;
      *cp = static_cast<uint8_t>(value);
      return Status::Ok();
    }
  }
  const int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
  if (digits == 0) return Fail(std::string("an unknown escape '\\") + e + "'");
  uint64_t v = 0;
  for (int i = 0; i < digits; ++i) {
    const int d = HexDigit(Peek(2 + static_cast<size_t>(i)));
    if (d < 0) return Fail(std::string("'\\") + e + "' needs " + std::to_string(digits) + " hex digits");
    v = v * 16 + static_cast<uint64_t>(d);
  }
  if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
    return Fail("an escape that is not a Unicode scalar value (a surrogate or past U+10FFFF)");
  at_ += 2 + static_cast<size_t>(digits);
  *cp = static_cast<uint32_t>(v);
  return Status::Ok();
}

Status Parser::Literal(Sym* sym) {
  ++at_;
  sym->kind = Sym::kLiteral;
  while (true) {
    if (AtEnd()) return Fail("an unterminated string literal");
    if (Peek() == '"') break;
    uint32_t cp = 0;
    EMBER_RETURN_IF_ERROR(Char(&cp));
    AppendUtf8(cp, &sym->literal);
  }
  ++at_;
  return Count(sym->literal.size());
}

Status Parser::Class(Sym* sym) {
  const size_t start = at_++;
  const bool negated = Peek() == '^';
  if (negated) ++at_;
  CodePointRanges ranges;
  while (true) {
    if (AtEnd()) return FailAt(start, "an unterminated character class", current_);
    if (Peek() == ']') break;
    uint32_t lo = 0, hi = 0;
    EMBER_RETURN_IF_ERROR(Char(&lo));
    hi = lo;
    if (Peek() == '-' && Peek(1) != ']' && at_ + 1 < text_.size()) {
      ++at_;
      EMBER_RETURN_IF_ERROR(Char(&hi));
      if (hi < lo) return Fail("a class range whose end comes before its start");
    }
    ranges.push_back({lo, hi});
  }
  ++at_;
  sym->kind = Sym::kSet;
  sym->set = NormalizeCodePoints(std::move(ranges));
  if (negated) sym->set = NegateCodePoints(sym->set);
  if (sym->set.empty()) return FailAt(start, "a character class that matches nothing", current_);
  return Count(1);
}

// Rule-level checks: every rule derives some finite text, and none is left-recursive.
class Checker {
 public:
  Checker(const std::vector<IrRule>& rules, const Parser& parser)
      : rules_(rules), parser_(parser), nullable_(rules.size(), 0) {}
  Status Run() {
    EMBER_RETURN_IF_ERROR(CheckProductive());
    return CheckLeftRecursion();
  }

 private:
  Status Fail(int32_t rule, const std::string& message) const {
    const IrRule& r = rules_[static_cast<size_t>(rule)];
    return parser_.FailAt(rules_[static_cast<size_t>(r.owner)].offset, message, -1);
  }
  const std::string& Owner(int32_t rule) const {
    return rules_[static_cast<size_t>(rules_[static_cast<size_t>(rule)].owner)].name;
  }
  Status CheckProductive();
  Status CheckLeftRecursion();

  const std::vector<IrRule>& rules_;
  const Parser& parser_;
  std::vector<uint8_t> nullable_;
};

Status Checker::CheckProductive() {
  std::vector<uint8_t> productive(rules_.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules_.size(); ++r) {
      for (const Seq& seq : rules_[r].alts) {
        bool all = true, empty = true;
        for (const Sym& s : seq) {
          if (s.kind == Sym::kRef) {
            all &= productive[static_cast<size_t>(s.rule)] != 0;
            empty &= nullable_[static_cast<size_t>(s.rule)] != 0;
          } else {
            empty &= s.kind == Sym::kLiteral && s.literal.empty();
          }
        }
        if (all && !productive[r]) productive[r] = changed = true;
        if (all && empty && !nullable_[r]) nullable_[r] = changed = true;
      }
    }
  }
  // Names the rule where the trouble is: from an unproductive rule, follow references to
  // unproductive rules of other user rules while there are new ones.
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (productive[r]) continue;
    std::vector<uint8_t> seen(rules_.size(), 0);
    auto at = static_cast<int32_t>(r);
    for (bool moved = true; moved;) {
      moved = false;
      seen[static_cast<size_t>(rules_[static_cast<size_t>(at)].owner)] = 1;
      for (const Seq& seq : rules_[static_cast<size_t>(at)].alts) {
        for (const Sym& s : seq) {
          if (moved || s.kind != Sym::kRef || productive[static_cast<size_t>(s.rule)]) continue;
          const int32_t owner = rules_[static_cast<size_t>(s.rule)].owner;
          if (owner == rules_[static_cast<size_t>(at)].owner) {
            if (s.rule != at && !seen[static_cast<size_t>(s.rule)]) {  // a group of the same rule
              seen[static_cast<size_t>(s.rule)] = 1;
              at = s.rule;
              moved = true;
            }
          } else if (!seen[static_cast<size_t>(owner)]) {
            at = s.rule;
            moved = true;
          }
        }
      }
    }
    return Fail(at, "rule '" + Owner(at) + "' derives no finite text (it never ends)");
  }
  return Status::Ok();
}

// A reference that can come before any byte of its rule is an edge; one inside a cycle of such
// edges that is not the last element of its alternative grows the stack without reading a byte.
Status Checker::CheckLeftRecursion() {
  const size_t n = rules_.size();
  struct Edge {
    int32_t to;
    bool tail;
  };
  std::vector<std::vector<Edge>> edges(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Seq& seq : rules_[r].alts) {
      for (size_t i = 0; i < seq.size(); ++i) {
        const Sym& s = seq[i];
        if (s.kind == Sym::kLiteral && s.literal.empty()) continue;
        if (s.kind != Sym::kRef) break;
        edges[r].push_back({s.rule, i + 1 == seq.size()});
        if (!nullable_[static_cast<size_t>(s.rule)]) break;
      }
    }
  }
  // Tarjan's strongly connected components, iteratively (grammars may be deep).
  std::vector<int32_t> index(n, -1), low(n, 0), component(n, -1), stack;
  std::vector<uint8_t> on_stack(n, 0);
  int32_t next_index = 0, num_components = 0;
  for (size_t root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    std::vector<std::pair<int32_t, size_t>> frames{{static_cast<int32_t>(root), 0}};
    while (!frames.empty()) {
      auto& [v, next_edge] = frames.back();
      const auto vi = static_cast<size_t>(v);
      if (next_edge == 0 && index[vi] < 0) {
        index[vi] = low[vi] = next_index++;
        stack.push_back(v);
        on_stack[vi] = 1;
      }
      if (next_edge < edges[vi].size()) {
        const auto w = static_cast<size_t>(edges[vi][next_edge++].to);
        if (index[w] < 0) {
          frames.push_back({static_cast<int32_t>(w), 0});
        } else if (on_stack[w]) {
          low[vi] = std::min(low[vi], index[w]);
        }
        continue;
      }
      if (low[vi] == index[vi]) {
        int32_t w = -1;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[static_cast<size_t>(w)] = 0;
          component[static_cast<size_t>(w)] = num_components;
        } while (w != v);
        ++num_components;
      }
      const int32_t done = v;
      frames.pop_back();
      if (!frames.empty()) {
        const auto parent = static_cast<size_t>(frames.back().first);
        low[parent] = std::min(low[parent], low[static_cast<size_t>(done)]);
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const Edge& e : edges[r]) {
      if (!e.tail && component[static_cast<size_t>(e.to)] == component[r])
        return Fail(static_cast<int32_t>(r),
                    "rule '" + Owner(static_cast<int32_t>(r)) +
                        "' is left-recursive (it can reach itself before reading a character); "
                        "rewrite it with repetition, e.g. expr ::= term (\"+\" term)*");
    }
  }
  return Status::Ok();
}

// Lowers the checked rules to bytes.
class Lowering {
 public:
  explicit Lowering(GbnfGrammar* g) : g_(g) {}
  void Run(const std::vector<IrRule>& rules);

 private:
  int32_t ByteSet(const std::bitset<256>& set) {
    auto [it, inserted] =
        set_index_.emplace(set.to_string(), static_cast<int32_t>(g_->byte_sets.size()));
    if (inserted) g_->byte_sets.push_back(set);
    return it->second;
  }
  void Push(GbnfGrammar::Kind kind, int32_t arg) { g_->elements.push_back({kind, arg}); }
  void LowerSeq(const ByteRanges& seq) {
    for (const auto& [lo, hi] : seq) {
      std::bitset<256> bytes;
      for (unsigned b = lo; b <= hi; ++b) bytes.set(b);
      Push(GbnfGrammar::kBytes, ByteSet(bytes));
    }
  }
  void LowerSet(const CodePointRanges& set);
  void ClassBytes();

  GbnfGrammar* g_;
  std::map<std::string, int32_t> set_index_;
  size_t num_ir_rules_ = 0;
  // Classes of several UTF-8 sequences become rules of their own, numbered after the others.
  std::vector<std::pair<std::vector<ByteRanges>, std::string>> pending_;
  std::string owner_;
};

void Lowering::LowerSet(const CodePointRanges& set) {
  std::vector<ByteRanges> seqs;
  for (const auto& [lo, hi] : set) Utf8Sequences(lo, hi, &seqs);
  // One-byte sequences (ASCII) merge into one range list of one position.
  ByteRanges ascii;
  std::vector<ByteRanges> multi;
  for (ByteRanges& seq : seqs) {
    if (seq.size() == 1) {
      ascii.push_back(seq[0]);
    } else {
      multi.push_back(std::move(seq));
    }
  }
  if (!ascii.empty() && multi.empty()) {
    std::bitset<256> bytes;
    for (const auto& [lo, hi] : ascii)
      for (unsigned b = lo; b <= hi; ++b) bytes.set(b);
    Push(GbnfGrammar::kBytes, ByteSet(bytes));
    return;
  }
  if (ascii.empty() && multi.size() == 1) {
    LowerSeq(multi[0]);
    return;
  }
  for (const auto& range : ascii) multi.push_back({range});
  Push(GbnfGrammar::kRule, static_cast<int32_t>(num_ir_rules_ + pending_.size()));
  pending_.push_back({std::move(multi), owner_});
}

void Lowering::Run(const std::vector<IrRule>& rules) {
  num_ir_rules_ = rules.size();
  for (const IrRule& rule : rules) {
    owner_ = rule.name;
    std::vector<int32_t> starts;
    for (const Seq& seq : rule.alts) {
      starts.push_back(static_cast<int32_t>(g_->elements.size()));
      for (const Sym& sym : seq) {
        if (sym.kind == Sym::kRef) {
          Push(GbnfGrammar::kRule, sym.rule);
        } else if (sym.kind == Sym::kSet) {
          LowerSet(sym.set);
        } else {
          for (char c : sym.literal) {
            const auto b = static_cast<uint8_t>(c);
            LowerSeq({{b, b}});
          }
        }
      }
      Push(GbnfGrammar::kEnd, 0);
    }
    g_->alternatives.push_back(std::move(starts));
    g_->names.push_back(rule.name);
  }
  for (const auto& [seqs, owner] : pending_) {
    std::vector<int32_t> starts;
    for (const ByteRanges& seq : seqs) {
      starts.push_back(static_cast<int32_t>(g_->elements.size()));
      LowerSeq(seq);
      Push(GbnfGrammar::kEnd, 0);
    }
    g_->alternatives.push_back(std::move(starts));
    g_->names.push_back(owner);
  }
  ClassBytes();
}

void Lowering::ClassBytes() {
  std::array<uint8_t, 256> cls{};
  int32_t num = 1;
  for (const std::bitset<256>& set : g_->byte_sets) {
    std::map<std::pair<uint8_t, bool>, uint8_t> split;
    for (unsigned b = 0; b < 256; ++b) {
      auto [it, inserted] = split.emplace(std::make_pair(cls[b], set.test(b)),
                                          static_cast<uint8_t>(split.size()));
      cls[b] = it->second;
    }
    num = static_cast<int32_t>(split.size());
  }
  g_->byte_class = cls;
  g_->num_classes = num;
}

}  // namespace

Result<std::shared_ptr<const GbnfGrammar>> ParseGbnf(std::string_view text,
                                                     const std::string& path) {
  Parser parser(text, path);
  EMBER_RETURN_IF_ERROR(parser.Parse());
  std::vector<IrRule>& rules = parser.rules();
  EMBER_RETURN_IF_ERROR(Checker(rules, parser).Run());
  auto grammar = std::make_shared<GbnfGrammar>();
  Lowering(grammar.get()).Run(rules);
  for (size_t r = 0; r < rules.size(); ++r) {
    if (rules[r].name == "root" && !rules[r].generated) grammar->root = static_cast<int32_t>(r);
  }
  return std::shared_ptr<const GbnfGrammar>(std::move(grammar));
}

}  // namespace ember
