#include "template/lexer.h"

#include <algorithm>
#include <cctype>

#include "template/value.h"
#include "util/utf8.h"

namespace ember::tmpl {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(const std::string& source) {
    // jinja2 normalises newlines and (keep_trailing_newline=False) drops one trailing newline.
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    while (true) {
      size_t p = FindTagStart(pos);
      std::string text = src_.substr(pos, p == std::string::npos ? std::string::npos : p - pos);
      bool line_starting = pos == 0 || src_[pos - 1] == '\n';
      if (p == std::string::npos) {
        Emit(Tok::kText, text, pos);
        break;
      }
      char kind = src_[p + 1];
      char mod = p + 2 < src_.size() ? src_[p + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (kind != '{' && mod != '+') {  // lstrip_blocks
        size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((l_pos > 0 || line_starting) && text.size() > l_pos &&
            std::all_of(text.begin() + l_pos, text.end(), IsSpace))
          text.resize(l_pos);
      }
      Emit(Tok::kText, text, pos);
      size_t start = p + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        pos = LexComment(p, start);
      } else if (kind == '%' && IsRaw(start)) {
        pos = LexRaw(p, start);
      } else {
        pos = LexTag(p, start, kind == '%');
      }
    }
    Token eof{Tok::kEof, "", 0, 0};
    Position(src_.size(), eof);
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t pos) const {
    while (true) {
      size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  void Position(size_t offset, Token& t) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    t.line = static_cast<int>(line);
    t.column = static_cast<int>(offset - line_starts_[line - 1] + 1);
  }

  [[noreturn]] void Fail(const std::string& message, size_t offset) const {
    Token t;
    Position(offset, t);
    throw TemplateError("TemplateSyntaxError: " + message, t.line, t.column);
  }

  void Emit(Tok type, std::string text, size_t offset) {
    if (type == Tok::kText && text.empty()) return;
    Token t{type, std::move(text), 0, 0};
    Position(offset, t);
    tokens_.push_back(std::move(t));
  }

  // After a tag end: `-` strips all following whitespace, trim_blocks drops one newline.
  size_t AfterTagEnd(size_t pos, bool strip, bool trim_newline) const {
    if (strip) {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
    } else if (trim_newline && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t LexComment(size_t open, size_t start) {
    size_t end = src_.find("#}", start);
    if (end == std::string::npos) Fail("missing end of comment tag", open);
    bool strip = end > start && src_[end - 1] == '-';
    return AfterTagEnd(end + 2, strip, true);
  }

  bool IsRaw(size_t start) const {
    size_t i = start;
    while (i < src_.size() && IsSpace(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < src_.size() && IsSpace(src_[i])) ++i;
    return src_.compare(i, 2, "%}") == 0 || src_.compare(i, 3, "-%}") == 0;
  }

  size_t LexRaw(size_t open, size_t start) {
    size_t close = src_.find("%}", start);
    if (close == std::string::npos) Fail("missing end of raw tag", open);
    bool strip = src_[close - 1] == '-';
    size_t body = AfterTagEnd(close + 2, strip, true);
    // Find {% endraw %} with optional modifiers.
    size_t search = body;
    while (true) {
      size_t p = src_.find("{%", search);
      if (p == std::string::npos) Fail("missing end of raw directive", open);
      size_t i = p + 2;
      bool strip_before = i < src_.size() && src_[i] == '-';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") == 0) {
        i += 6;
        while (i < src_.size() && IsSpace(src_[i])) ++i;
        bool strip_after = src_.compare(i, 1, "-") == 0;
        if (strip_after) ++i;
        if (src_.compare(i, 2, "%}") == 0) {
          std::string text = src_.substr(body, p - body);
          if (strip_before) {
            while (!text.empty() && IsSpace(text.back())) text.pop_back();
          }
          Emit(Tok::kText, text, body);
          return AfterTagEnd(i + 2, strip_after, true);
        }
      }
      search = p + 2;
    }
  }

  size_t LexTag(size_t open, size_t start, bool is_block) {
    Emit(is_block ? Tok::kBlockBegin : Tok::kVarBegin, "", open);
    tokens_.back().text = is_block ? "{%" : "{{";
    const char* end = is_block ? "%}" : "}}";
    int depth = 0;
    size_t i = start;
    while (true) {
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      if (i >= src_.size()) Fail(std::string("unexpected end of template, expected '") + end + "'", open);
      if (depth == 0) {
        bool strip = src_[i] == '-' && src_.compare(i + 1, 2, end) == 0;
        if (strip || src_.compare(i, 2, end) == 0) {
          Emit(is_block ? Tok::kBlockEnd : Tok::kVarEnd, end, i);
          return AfterTagEnd(i + (strip ? 3 : 2), strip, is_block);
        }
        if (is_block && src_.compare(i, 3, "+%}") == 0) {
          Emit(Tok::kBlockEnd, end, i);
          return i + 3;
        }
      }
      char c = src_[i];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        Emit(Tok::kName, src_.substr(i, j - i), i);
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        i = LexNumber(i);
      } else if (c == '\'' || c == '"') {
        i = LexString(i);
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2)
          if (src_.compare(i, 2, o) == 0) op = o;
        if (op.empty()) {
          if (std::string("+-*/%~<>=()[]{},.:|").find(c) == std::string::npos) {
            unsigned char lead = static_cast<unsigned char>(c);
            size_t len = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
            Fail("unexpected char '" + src_.substr(i, len) + "'", i);
          }
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') ++depth;
          if (c == ')' || c == ']' || c == '}') {
            if (depth == 0) Fail(std::string("unexpected '") + c + "'", i);
            --depth;
          }
        }
        Emit(Tok::kOp, op, i);
        i += op.size();
      }
    }
  }

  size_t LexNumber(size_t i) {
    size_t j = i;
    auto digits = [&] {
      while (j < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
    };
    digits();
    bool is_float = false;
    bool after_dot = i > 0 && src_[i - 1] == '.';
    if (!after_dot && j + 1 < src_.size() && src_[j] == '.' && std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
      is_float = true;
      ++j;
      digits();
    }
    if (!after_dot && j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        j = k;
        digits();
      }
    }
    std::string spelling;
    for (size_t k = i; k < j; ++k)
      if (src_[k] != '_') spelling += src_[k];
    Emit(is_float ? Tok::kFloat : Tok::kInt, spelling, i);
    return j;
  }

  // Python string-literal escapes, as jinja2 decodes them ("unicode-escape").
  size_t LexString(size_t i) {
    char quote = src_[i];
    std::string out;
    size_t j = i + 1;
    while (true) {
      if (j >= src_.size()) Fail("unexpected end of string", i);
      char c = src_[j];
      if (c == quote) break;
      if (c != '\\' || j + 1 >= src_.size()) {
        out += c;
        ++j;
        continue;
      }
      char e = src_[j + 1];
      j += 2;
      auto hex = [&](int n) {
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k, ++j) {
          if (j >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[j])))
            Fail("truncated escape in string", i);
          cp = cp * 16 + static_cast<uint32_t>(std::stoi(std::string(1, src_[j]), nullptr, 16));
        }
        AppendUtf8(cp, &out);
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && j < src_.size() && src_[j] >= '0' && src_[j] <= '7'; ++k, ++j)
              cp = cp * 8 + static_cast<uint32_t>(src_[j] - '0');
            AppendUtf8(cp, &out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    Emit(Tok::kString, out, i);
    return j + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Lex(const std::string& source) { return Lexer(source).Run(); }

}  // namespace ember::tmpl
