// UTF-8 helpers shared by the tokenizer, the template interpreter and JSON mode. Pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace ember {

// Appends code point `cp` (<= 0x10FFFF) to `out` as UTF-8.
inline void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// What a UTF-8 lead byte >= 0x80 starts: how many continuation bytes follow, and the range of
// the first one (later ones are 0x80..0xBF), so that no overlong form, surrogate or code point
// past U+10FFFF is valid. False for a byte that cannot start a multi-byte sequence.
struct Utf8Lead {
  int continuations = 0;
  uint8_t first_lo = 0x80, first_hi = 0xBF;
};
inline bool ParseUtf8Lead(uint8_t b, Utf8Lead* lead) {
  *lead = Utf8Lead{};
  if (b >= 0xC2 && b <= 0xDF) {
    lead->continuations = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    lead->continuations = 2;
    if (b == 0xE0) lead->first_lo = 0xA0;
    if (b == 0xED) lead->first_hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    lead->continuations = 3;
    if (b == 0xF0) lead->first_lo = 0x90;
    if (b == 0xF4) lead->first_hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

}  // namespace ember
