#include "sampling/regex_syntax.h"

#include <algorithm>

namespace ember {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

}  // namespace

CodePointRanges NormalizeCodePoints(CodePointRanges r) {
  CodePointRanges split;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (lo < kSurrogateLo && hi >= kSurrogateLo) {
      split.push_back({lo, kSurrogateLo - 1});
      lo = kSurrogateLo;
    }
    if (lo >= kSurrogateLo && lo <= kSurrogateHi) lo = kSurrogateHi + 1;
    if (lo <= hi) split.push_back({lo, hi});
  }
  std::sort(split.begin(), split.end());
  CodePointRanges out;
  for (const auto& range : split) {
    if (!out.empty() && range.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, range.second);
    } else {
      out.push_back(range);
    }
  }
  return out;
}

CodePointRanges NegateCodePoints(const CodePointRanges& r) {
  CodePointRanges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return NormalizeCodePoints(std::move(out));
}

namespace {

CodePointRanges Normalize(CodePointRanges r) { return NormalizeCodePoints(std::move(r)); }
CodePointRanges Negate(const CodePointRanges& r) { return NegateCodePoints(r); }

CodePointRanges Digits() {
  return {{'0', '9'}};
}
CodePointRanges Word() {
  return Normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
}
CodePointRanges Space() {
  return Normalize({{'\t', '\r'},
                    {' ', ' '},
                    {0xA0, 0xA0},
                    {0x1680, 0x1680},
                    {0x2000, 0x200A},
                    {0x2028, 0x2029},
                    {0x202F, 0x202F},
                    {0x205F, 0x205F},
                    {0x3000, 0x3000},
                    {0xFEFF, 0xFEFF}});
}
CodePointRanges Dot() {
  return Negate({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  Parser(std::string_view p, const std::string& path, RegexSyntax* out)
      : p_(p), path_(path), out_(out) {}

  Status Parse() {
    std::vector<int32_t> alternatives;
    while (true) {
      RegexSyntax::Branch b;
      b.node = Concat(0, &b);
      if (!error_.ok()) return error_;
      out_->branches.push_back(b);
      alternatives.push_back(b.node);
      if (at_ == p_.size()) break;
      if (p_[at_] != '|') return Fail("unexpected ')'");
      ++at_;
    }
    out_->root = out_->Alternate(std::move(alternatives));
    return Status::Ok();
  }

 private:
  // The first error, returned as whatever the failing parse function returns.
  struct Failed {
    Status status;
    operator Status() const { return status; }  // NOLINT: implicit by design
    operator int32_t() const { return -1; }     // NOLINT
    operator bool() const { return false; }     // NOLINT
  };
  Failed Fail(const std::string& what) {
    if (error_.ok())
      error_ = Status::Error(path_ + ": " + what + " at offset " + std::to_string(at_) +
                             " of the pattern (" + kSubset + ")");
    return Failed{error_};
  }
  static constexpr const char* kSubset =
      "the supported ECMA-262 subset: literals, escapes, classes, ., groups, |, ?, *, +, {m,n}, "
      "^ and $ at the ends";

  bool More() const { return at_ < p_.size(); }
  // The code point at at_ (the pattern is UTF-8), advancing past it.
  uint32_t NextCodePoint();
  int32_t Alternation(int depth);
  int32_t Concat(int depth, RegexSyntax::Branch* top);
  int32_t Atom(int depth);
  int32_t Group(int depth);
  bool Quantifier(int32_t* min, int32_t* max);
  bool ReadInt(int32_t* v);
  bool Escape(bool in_class, CodePointRanges* set);
  bool HexEscape(int digits, uint32_t* cp);
  bool UnicodeEscape(uint32_t* cp);
  bool Class(CodePointRanges* set);

  std::string_view p_;
  const std::string& path_;
  RegexSyntax* out_;
  size_t at_ = 0;
  Status error_;
};

uint32_t Parser::NextCodePoint() {
  const auto b = static_cast<uint8_t>(p_[at_++]);
  if (b < 0x80) return b;
  const int extra = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
  uint32_t cp = b & (0x3F >> extra);
  for (int i = 0; i < extra && More(); ++i)
    cp = (cp << 6) | (static_cast<uint8_t>(p_[at_++]) & 0x3F);
  return cp;
}

int32_t Parser::Alternation(int depth) {
  std::vector<int32_t> alternatives;
  while (true) {
    alternatives.push_back(Concat(depth, nullptr));
    if (!error_.ok()) return -1;
    if (!More() || p_[at_] != '|') break;
    ++at_;
  }
  return out_->Alternate(std::move(alternatives));
}

// A sequence of quantified atoms up to '|', ')' or the end. `top`: a top-level alternative,
// where ^ may open it and $ close it.
int32_t Parser::Concat(int depth, RegexSyntax::Branch* top) {
  std::vector<int32_t> items;
  if (top != nullptr && More() && p_[at_] == '^') {
    top->anchored_start = true;
    ++at_;
  }
  while (More() && p_[at_] != '|' && p_[at_] != ')') {
    if (p_[at_] == '$') {
      const bool ends = at_ + 1 == p_.size() || p_[at_ + 1] == '|';
      if (top == nullptr || !ends)
        return Fail(
            "'$' is supported only at the end of the pattern or of a top-level alternative");
      top->anchored_end = true;
      ++at_;
      break;
    }
    if (p_[at_] == '^')
      return Fail(
          "'^' is supported only at the start of the pattern or of a top-level alternative");
    int32_t atom = Atom(depth);
    if (!error_.ok()) return -1;
    int32_t min = 1, max = 1;
    if (Quantifier(&min, &max)) atom = out_->Repeat(atom, min, max);
    if (!error_.ok()) return -1;
    items.push_back(atom);
  }
  return out_->Concat(std::move(items));
}

bool Parser::ReadInt(int32_t* v) {
  const size_t start = at_;
  int64_t x = 0;
  while (More() && p_[at_] >= '0' && p_[at_] <= '9') {
    x = std::min<int64_t>(x * 10 + (p_[at_] - '0'), int64_t{1} << 40);
    ++at_;
  }
  *v = static_cast<int32_t>(std::min<int64_t>(x, INT32_MAX));
  return at_ > start;
}

bool Parser::Quantifier(int32_t* min, int32_t* max) {
  if (!More()) return false;
  const char c = p_[at_];
  if (c == '?' || c == '*' || c == '+') {
    ++at_;
    *min = c == '+' ? 1 : 0;
    *max = c == '?' ? 1 : -1;
  } else if (c == '{') {
    ++at_;
    if (!ReadInt(min)) return Fail("'{' must start a quantifier {n}, {n,} or {n,m}");
    *max = *min;
    if (More() && p_[at_] == ',') {
      ++at_;
      if (!ReadInt(max)) *max = -1;
    }
    if (!More() || p_[at_] != '}') return Fail("an unterminated quantifier {n,m}");
    ++at_;
    if (*max >= 0 && *min > *max) return Fail("a quantifier {n,m} with n > m");
    if (*min > RegexSyntax::kMaxRepeat || *max > RegexSyntax::kMaxRepeat)
      return Fail("a counted repetition above " + std::to_string(RegexSyntax::kMaxRepeat) +
                  " (the limit)");
  } else {
    return false;
  }
  if (More() && p_[at_] == '?') ++at_;  // lazy: the same set of matching strings
  if (More() && (p_[at_] == '?' || p_[at_] == '*' || p_[at_] == '+' || p_[at_] == '{'))
    return Fail("a quantifier after a quantifier");
  return true;
}

int32_t Parser::Group(int depth) {
  ++at_;  // '('
  if (depth + 1 > RegexSyntax::kMaxGroupDepth)
    return Fail("groups nested deeper than " + std::to_string(RegexSyntax::kMaxGroupDepth));
  if (More() && p_[at_] == '?') {
    const std::string_view rest = p_.substr(at_);
    if (rest.starts_with("?:")) {
      at_ += 2;
    } else if (rest.starts_with("?=") || rest.starts_with("?!") || rest.starts_with("?<=") ||
               rest.starts_with("?<!")) {
      return Fail("lookaround assertions ((?=, (?!, (?<=, (?<!) are not supported");
    } else if (rest.starts_with("?<")) {
      const size_t close = rest.find('>');
      if (close == std::string_view::npos || close == 2) return Fail("a malformed group name");
      at_ += close + 1;
    } else {
      return Fail("an unknown group kind '(?'");
    }
  }
  const int32_t inner = Alternation(depth + 1);
  if (!error_.ok()) return -1;
  if (!More() || p_[at_] != ')') return Fail("an unterminated group '('");
  ++at_;
  return inner;
}

int32_t Parser::Atom(int depth) {
  const char c = p_[at_];
  CodePointRanges set;
  switch (c) {
    case '(':
      return Group(depth);
    case '.':
      ++at_;
      return out_->Set(Dot());
    case '[':
      if (!Class(&set)) return -1;
      return out_->Set(std::move(set));
    case '\\':
      if (!Escape(false, &set)) return -1;
      return out_->Set(std::move(set));
    case '*':
    case '+':
    case '?':
      return Fail("nothing to repeat");
    case '{':
    case '}':
    case ']':
      return Fail(std::string("a lone '") + c + "' (escape it)");
    default: {
      const uint32_t cp = NextCodePoint();
      return out_->Set(Normalize({{cp, cp}}));
    }
  }
}

bool Parser::HexEscape(int digits, uint32_t* cp) {
  *cp = 0;
  for (int i = 0; i < digits; ++i) {
    const int h = More() ? HexValue(p_[at_]) : -1;
    if (h < 0) return Fail("a hex escape needs " + std::to_string(digits) + " hex digits");
    *cp = *cp * 16 + static_cast<uint32_t>(h);
    ++at_;
  }
  return true;
}

// After "\u": HHHH (a high surrogate joins a following \uHHHH low one) or {H...}.
bool Parser::UnicodeEscape(uint32_t* cp) {
  if (More() && p_[at_] == '{') {
    ++at_;
    uint32_t v = 0;
    int n = 0;
    while (More() && HexValue(p_[at_]) >= 0) {
      v = std::min<uint32_t>(v * 16 + static_cast<uint32_t>(HexValue(p_[at_++])), 0x110000);
      ++n;
    }
    if (n == 0 || !More() || p_[at_] != '}' || v > kMaxCodePoint)
      return Fail("a malformed \\u{...} escape");
    ++at_;
    *cp = v;
  } else if (!HexEscape(4, cp)) {
    return false;
  }
  if (*cp >= 0xD800 && *cp <= 0xDBFF && p_.substr(at_).starts_with("\\u")) {
    const size_t save = at_;
    at_ += 2;
    uint32_t low = 0;
    if (HexEscape(4, &low) && low >= 0xDC00 && low <= 0xDFFF) {
      *cp = 0x10000 + ((*cp - 0xD800) << 10) + (low - 0xDC00);
      return true;
    }
    at_ = save;
  }
  if (*cp >= kSurrogateLo && *cp <= kSurrogateHi)
    return Fail("a lone surrogate escape (no UTF-8 text contains one)");
  return true;
}

bool Parser::Escape(bool in_class, CodePointRanges* set) {
  ++at_;  // '\\'
  if (!More()) return Fail("a trailing '\\'");
  const char c = p_[at_++];
  uint32_t cp = 0;
  switch (c) {
    case 'd':
      *set = Digits();
      return true;
    case 'D':
      *set = Negate(Digits());
      return true;
    case 'w':
      *set = Word();
      return true;
    case 'W':
      *set = Negate(Word());
      return true;
    case 's':
      *set = Space();
      return true;
    case 'S':
      *set = Negate(Space());
      return true;
    case 't':
      cp = '\t';
      break;
    case 'n':
      cp = '\n';
      break;
    case 'r':
      cp = '\r';
      break;
    case 'v':
      cp = 0x0B;
      break;
    case 'f':
      cp = 0x0C;
      break;
    case '0':
      if (More() && p_[at_] >= '0' && p_[at_] <= '9')
        return Fail("octal escapes are not supported");
      cp = 0;
      break;
    case 'x':
      if (!HexEscape(2, &cp)) return false;
      break;
    case 'u':
      if (!UnicodeEscape(&cp)) return false;
      break;
    case 'b':
      if (!in_class) return Fail("word boundaries (\\b, \\B) are not supported");
      cp = 0x08;
      break;
    case 'B':
      return Fail("word boundaries (\\b, \\B) are not supported");
    case 'k':
      return Fail("backreferences (\\k<name>) are not supported");
    case 'p':
    case 'P':
      return Fail("Unicode property escapes (\\p{...}) are not supported");
    case 'c':
      return Fail("control escapes (\\cX) are not supported");
    default:
      if (c >= '1' && c <= '9') return Fail("backreferences (\\1 ...) are not supported");
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || static_cast<uint8_t>(c) >= 0x80)
        return Fail(std::string("an unknown escape '\\") + c + "'");
      cp = static_cast<uint8_t>(c);  // escaped punctuation stands for itself
  }
  *set = {{cp, cp}};
  return true;
}

bool Parser::Class(CodePointRanges* set) {
  ++at_;  // '['
  const bool negated = More() && p_[at_] == '^';
  if (negated) ++at_;
  CodePointRanges ranges;
  // One class member: a code point (single = true) or a set (\d, \w, ...).
  auto member = [&](CodePointRanges* m, bool* single) {
    *single = true;
    if (p_[at_] != '\\') {
      const uint32_t cp = NextCodePoint();
      *m = {{cp, cp}};
      return true;
    }
    if (!Escape(true, m)) return false;
    *single = m->size() == 1 && (*m)[0].first == (*m)[0].second;
    return true;
  };
  while (true) {
    if (!More()) return Fail("an unterminated class '['");
    if (p_[at_] == ']') break;
    CodePointRanges lo;
    bool lo_single = false;
    if (!member(&lo, &lo_single)) return false;
    if (More() && p_[at_] == '-' && at_ + 1 < p_.size() && p_[at_ + 1] != ']') {
      ++at_;
      CodePointRanges hi;
      bool hi_single = false;
      if (!member(&hi, &hi_single)) return false;
      if (!lo_single || !hi_single) return Fail("a class range with a class escape at an end");
      if (lo[0].first > hi[0].first) return Fail("a class range out of order");
      ranges.push_back({lo[0].first, hi[0].first});
    } else {
      ranges.insert(ranges.end(), lo.begin(), lo.end());
    }
  }
  ++at_;  // ']'
  *set = negated ? Negate(Normalize(ranges)) : Normalize(ranges);
  return true;
}

}  // namespace

int32_t RegexSyntax::Add(RegexNode node) {
  nodes.push_back(std::move(node));
  return static_cast<int32_t>(nodes.size() - 1);
}

int32_t RegexSyntax::Concat(std::vector<int32_t> children) {
  if (children.size() == 1) return children[0];
  RegexNode n;
  n.kind = children.empty() ? RegexNode::kEmpty : RegexNode::kConcat;
  n.children = std::move(children);
  return Add(std::move(n));
}

int32_t RegexSyntax::Alternate(std::vector<int32_t> children) {
  if (children.size() == 1) return children[0];
  RegexNode n;
  n.kind = RegexNode::kAlternate;
  n.children = std::move(children);
  return Add(std::move(n));
}

int32_t RegexSyntax::Repeat(int32_t child, int32_t min, int32_t max) {
  RegexNode n;
  n.kind = RegexNode::kRepeat;
  n.children = {child};
  n.min = min;
  n.max = max;
  return Add(std::move(n));
}

int32_t RegexSyntax::Search() {
  std::vector<int32_t> alternatives;
  const int32_t any = Repeat(Set(AnyCodePoint()), 0, -1);
  for (const Branch& b : branches) {
    std::vector<int32_t> parts;
    if (!b.anchored_start) parts.push_back(any);
    parts.push_back(b.node);
    if (!b.anchored_end) parts.push_back(any);
    alternatives.push_back(Concat(std::move(parts)));
  }
  return Alternate(std::move(alternatives));
}

CodePointRanges AnyCodePoint() {
  return Negate({});
}

Result<RegexSyntax> ParseRegex(std::string_view pattern, const std::string& path) {
  if (pattern.size() > RegexSyntax::kMaxPatternBytes) {
    return Status::Error(path + ": the pattern is longer than " +
                         std::to_string(RegexSyntax::kMaxPatternBytes) + " bytes (the limit)");
  }
  RegexSyntax out;
  Parser parser(pattern, path, &out);
  EMBER_RETURN_IF_ERROR(parser.Parse());
  return out;
}

std::string EscapeRegexLiteral(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}/").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace ember
