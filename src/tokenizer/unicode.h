// UTF-8 and Unicode helpers for the tokenizer: decoding code points, Rust-compatible lossy
// conversion (`String::from_utf8_lossy`), the GPT-2 byte <-> unicode map used by byte-level BPE,
// and the character classes Hugging Face `tokenizers` uses (whitespace, word characters).
// Pure functions over immutable tables; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "util/utf8.h"

namespace ember::tok {

// Decodes the code point at s[pos] (valid UTF-8 assumed); sets *len to its byte length.
char32_t DecodeCodePoint(std::string_view s, size_t pos, size_t* len);
// Byte length of the UTF-8 sequence starting with lead byte b (1 for invalid leads).
inline size_t Utf8SeqLen(uint8_t b) {
  return b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
}

bool IsValidUtf8(std::string_view s);
// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);
// Number of trailing bytes of `s` that form an incomplete (but so far valid) UTF-8 sequence.
size_t IncompleteUtf8Tail(std::string_view s);

// Rust char::is_whitespace (Unicode White_Space).
bool IsWhitespace(char32_t cp);
// Regex \w in Rust's regex crate (alphabetic, marks, decimal digits, connector punctuation).
bool IsWordChar(char32_t cp);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
struct ByteLevelAlphabet {
  std::string byte_to_utf8[256];  // byte -> UTF-8 of its code point
  // code point -> byte, or -1 when the code point is not in the alphabet (cp < 324).
  int16_t cp_to_byte[324];
};
const ByteLevelAlphabet& GetByteLevelAlphabet();

}  // namespace ember::tok
