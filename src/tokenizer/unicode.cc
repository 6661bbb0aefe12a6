#include "tokenizer/unicode.h"

#include <utf8proc.h>

namespace ember::tok {

char32_t DecodeCodePoint(std::string_view s, size_t pos, size_t* len) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  size_t n = Utf8SeqLen(p[0]);
  if (pos + n > s.size()) n = 1;
  *len = n;
  switch (n) {
    case 1: return p[0];
    case 2: return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
             (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

namespace {

// Length of the valid UTF-8 prefix of the sequence at p[0..n): returns the full sequence length
// when valid and complete, else 0 and sets *consumed to the maximal valid-prefix length (>= 1).
size_t ValidSeq(const uint8_t* p, size_t n, size_t* consumed) {
  if (p[0] < 0x80) return 1;
  Utf8Lead lead;
  if (!ParseUtf8Lead(p[0], &lead)) {
    *consumed = 1;
    return 0;
  }
  const size_t need = static_cast<size_t>(lead.continuations) + 1;
  const uint8_t lo = lead.first_lo, hi = lead.first_hi;
  size_t i = 1;
  for (; i < need && i < n; ++i) {
    uint8_t c = p[i];
    uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
  }
  if (i == need) return need;
  *consumed = i;
  return 0;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t consumed = 0;
    size_t len = ValidSeq(p + i, n - i, &consumed);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      out.push_back(char(p[i++]));
      continue;
    }
    size_t consumed = 0;
    size_t len = ValidSeq(p + i, n - i, &consumed);
    if (len != 0) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += consumed;
    }
  }
  return out;
}

size_t IncompleteUtf8Tail(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size();
  // A sequence is at most 4 bytes: look for a lead byte among the last 3.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    uint8_t b = p[n - back];
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t consumed = 0;
    size_t len = ValidSeq(p + n - back, back, &consumed);
    if (len != 0) return 0;                      // complete sequence at the end
    return consumed == back ? back : 0;          // valid-so-far prefix that needs more bytes
  }
  return 0;
}

bool IsWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return c == 0x200C || c == 0x200D;
  }
}

const ByteLevelAlphabet& GetByteLevelAlphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    for (auto& v : a.cp_to_byte) v = -1;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t cp = printable ? char32_t(b) : char32_t(next++);
      AppendUtf8(cp, &a.byte_to_utf8[b]);
      a.cp_to_byte[cp] = int16_t(b);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace ember::tok
