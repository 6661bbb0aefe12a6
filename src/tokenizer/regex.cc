#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace ember::tok {
namespace {

// Oniguruma's Unicode \s also matches U+0085 (NEL), which PCRE2's UCP \s does not: add it.
std::string TranslateOniguruma(std::string_view p) {
  std::string out;
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += class_depth > 0 ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && class_depth == 0) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[') ++class_depth;
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Pattern>> Pattern::Create(std::string_view pattern, bool regex) {
  auto p = std::make_unique<Pattern>();
  p->source_ = std::string(pattern);
  if (!regex) {
    if (pattern.empty()) return Status::Error("empty literal split pattern");
    p->literal_ = std::string(pattern);
    return p;
  }
  std::string translated = TranslateOniguruma(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return Status::Error("regex '" + std::string(pattern) + "' does not compile at offset " +
                         std::to_string(err_off) + ": " + reinterpret_cast<char*>(buf));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
  p->code_ = code;
  return p;
}

Pattern::~Pattern() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Pattern::FindAll(std::string_view text, std::vector<MatchRange>* out) const {
  if (code_ == nullptr) {
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      out->emplace_back(pos, pos + literal_.size());
      pos += literal_.size();
    }
    return;
  }
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // JIT stack exhausted (pathological input): the interpreter works from the heap.
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                       nullptr);
    }
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e == b) {  // empty match: step one character forward
      if (b >= text.size()) break;
      pos = b + Utf8SeqLen(uint8_t(text[b]));
      continue;
    }
    out->emplace_back(b, e);
    pos = e;
  }
  pcre2_match_data_free(md);
}

}  // namespace ember::tok
