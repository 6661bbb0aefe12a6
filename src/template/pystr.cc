#include "template/pystr.h"

#include <utf8proc.h>

#include <algorithm>

#include "util/utf8.h"

namespace ember::tmpl::pystr {

std::vector<uint32_t> Decode(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string Encode(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

size_t Length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool IsSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {
// Decodes the code point starting at byte i (lenient on malformed input: one byte = one unit).
uint32_t DecodeAt(const std::string& s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}
}  // namespace

std::string Strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  // Works on bytes, decoding only the code points at the two ends (templates trim long messages).
  std::vector<uint32_t> set = chars ? Decode(*chars) : std::vector<uint32_t>{};
  auto strip = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsSpace(cp);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t len = 0;
      if (!strip(DecodeAt(s, b, &len))) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && e - start < 4) --start;
      size_t len = 0;
      uint32_t cp = DecodeAt(s, start, &len);
      if (start + len != e) {  // malformed tail: treat the last byte alone
        start = e - 1;
        cp = static_cast<unsigned char>(s[start]);
      }
      if (!strip(cp)) break;
      e = start;
    }
  }
  return s.substr(b, e - b);
}

std::vector<std::string> Split(const std::string& s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        size_t hit = s.find(*sep, pos);
        if (hit == std::string::npos) break;
        out.push_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      out.push_back(s.substr(pos));
      return out;
    }
    size_t end = s.size();
    int64_t splits = 0;
    while (maxsplit < 0 || splits < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string::npos) break;
      out.push_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
      ++splits;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  // Whitespace split: runs of whitespace separate, empty strings dropped.
  std::vector<uint32_t> cps = Decode(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && IsSpace(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      std::vector<uint32_t> rest(cps.begin() + i, cps.end());
      if (from_right) std::reverse(rest.begin(), rest.end());
      out.push_back(Encode(rest));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !IsSpace(cps[j])) ++j;
    std::vector<uint32_t> word(cps.begin() + i, cps.begin() + j);
    if (from_right) std::reverse(word.begin(), word.end());
    out.push_back(Encode(word));
    i = j;
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> SplitLines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      size_t end = i;
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      out.push_back(s.substr(start, (keepends ? i + 1 : end) - start));
      start = i + 1;
    }
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

std::string Replace(const std::string& s, const std::string& old_sub, const std::string& new_sub,
                    int64_t count) {
  std::string out;
  if (old_sub.empty()) {
    // Python inserts new_sub between every code point (and at both ends).
    std::vector<uint32_t> cps = Decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += new_sub;
        ++n;
      }
      if (i < cps.size()) out += Encode({cps[i]});
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(old_sub, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos) + new_sub;
    pos = hit + old_sub.size();
    ++n;
  }
  return out + s.substr(pos);
}

size_t Count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return Length(s) + 1;
  size_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

namespace {
template <typename F>
std::string MapCodePoints(const std::string& s, F f) {
  std::vector<uint32_t> cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = f(cps[i], i);
  return Encode(cps);
}
uint32_t ToUpper(uint32_t cp) { return static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))); }
uint32_t ToLower(uint32_t cp) { return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))); }
bool IsCased(uint32_t cp) { return ToUpper(cp) != cp || ToLower(cp) != cp; }
}  // namespace

std::string Upper(const std::string& s) {
  return MapCodePoints(s, [](uint32_t cp, size_t) { return ToUpper(cp); });
}
std::string Lower(const std::string& s) {
  return MapCodePoints(s, [](uint32_t cp, size_t) { return ToLower(cp); });
}
std::string Title(const std::string& s) {
  std::vector<uint32_t> cps = Decode(s);
  bool prev_cased = false;
  for (uint32_t& cp : cps) {
    bool cased = IsCased(cp);
    cp = prev_cased ? ToLower(cp) : ToUpper(cp);
    prev_cased = cased;
  }
  return Encode(cps);
}
std::string Capitalize(const std::string& s) {
  return MapCodePoints(s, [](uint32_t cp, size_t i) { return i == 0 ? ToUpper(cp) : ToLower(cp); });
}

}  // namespace ember::tmpl::pystr
