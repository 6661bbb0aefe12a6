// Python `str` semantics over UTF-8 std::strings: code-point length/indexing, whitespace as
// str.isspace() defines it, and the str methods chat templates call (strip, split, replace,
// startswith, upper/lower via utf8proc, ...). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ember::tmpl::pystr {

std::vector<uint32_t> Decode(const std::string& s);
std::string Encode(const std::vector<uint32_t>& cps);
size_t Length(const std::string& s);  // code points
bool IsSpace(uint32_t cp);

// chars == nullopt strips whitespace; otherwise any code point of *chars.
std::string Strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit) / str.rsplit; sep == nullopt splits on whitespace runs.
std::vector<std::string> Split(const std::string& s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right = false);
std::vector<std::string> SplitLines(const std::string& s, bool keepends = false);
std::string Replace(const std::string& s, const std::string& old_sub, const std::string& new_sub,
                    int64_t count);
size_t Count(const std::string& s, const std::string& sub);
std::string Upper(const std::string& s);
std::string Lower(const std::string& s);
std::string Title(const std::string& s);
std::string Capitalize(const std::string& s);

}  // namespace ember::tmpl::pystr
