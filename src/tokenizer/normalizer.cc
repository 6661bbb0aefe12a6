#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "tokenizer/unicode.h"

namespace ember::tok {
namespace {

bool IsAscii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

std::string Utf8procMap(const std::string& s, int options) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    utf8proc_ssize_t(s.size()), &out,
                                    utf8proc_option_t(options | UTF8PROC_STABLE));
  if (n < 0) return s;  // invalid input cannot reach here (Encode validates); keep it unchanged
  std::string r(reinterpret_cast<char*>(out), size_t(n));
  std::free(out);
  return r;
}

// Code points that NFC leaves alone in any context: quick check "yes", not a combining mark,
// and nothing composes onto them from the left. Conservative (anything else is "unsafe").
bool IsNfcStable(char32_t cp) {
  return cp < 0x300 || (cp >= 0x3000 && cp <= 0x3098) || (cp >= 0x309B && cp <= 0x9FFF) ||
         (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xFF00 && cp <= 0xFFEF) ||
         (cp >= 0x1F000 && cp <= 0x1FAFF);
}

// NFC that sends only the runs around unstable code points through utf8proc: each run starts
// at the stable character before it (which may compose with it) and ends before the next stable
// character, so NFC of the whole equals the concatenation.
std::string Nfc(const std::string& s) {
  std::string out;
  size_t copied = 0;       // s[0, copied) is already in out
  size_t prev_start = 0;   // start of the previous code point
  bool any = false;
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {
      prev_start = i++;
      continue;
    }
    size_t len;
    char32_t cp = DecodeCodePoint(s, i, &len);
    if (IsNfcStable(cp)) {
      prev_start = i;
      i += len;
      continue;
    }
    size_t run_start = i == 0 ? 0 : std::max(prev_start, copied);
    size_t run_end = i + len;
    while (run_end < s.size()) {
      char32_t next = DecodeCodePoint(s, run_end, &len);
      if (IsNfcStable(next)) break;
      run_end += len;
    }
    if (!any) out.reserve(s.size());
    any = true;
    out.append(s, copied, run_start - copied);
    out += Utf8procMap(s.substr(run_start, run_end - run_start), UTF8PROC_COMPOSE);
    copied = run_end;
    prev_start = run_end;  // not used before being reassigned by the next code point
    i = run_end;
  }
  if (!any) return s;
  out.append(s, copied, std::string::npos);
  return out;
}

std::string Lowercase(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len;
    char32_t cp = DecodeCodePoint(s, i, &len);
    if (cp < 0x80) {
      out.push_back(char(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    } else {
      AppendUtf8(char32_t(utf8proc_tolower(utf8proc_int32_t(cp))), &out);
    }
    i += len;
  }
  return out;
}

std::string StripWhitespace(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e) {
    size_t len;
    if (!IsWhitespace(DecodeCodePoint(s, b, &len))) break;
    b += len;
  }
  while (right && e > b) {
    size_t start = e - 1;
    while (start > b && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    size_t len;
    if (!IsWhitespace(DecodeCodePoint(s, start, &len))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

}  // namespace

Result<std::unique_ptr<Normalizer>> Normalizer::FromJson(Json json) {
  auto n = std::make_unique<Normalizer>();
  EMBER_RETURN_IF_ERROR(n->Add(json));
  return n;
}

Status Normalizer::Add(Json json) {
  std::string type = JsonTypeOf(json);
  if (type == "Sequence") {
    simdjson::dom::array arr;
    auto f = JsonField(json, "normalizers");
    if (!f || f->get_array().get(arr) != simdjson::SUCCESS)
      return Status::Error("normalizer Sequence: expected an array 'normalizers'");
    for (Json child : arr) EMBER_RETURN_IF_ERROR(Add(child));
    return Status::Ok();
  }
  Step step;
  if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    EMBER_ASSIGN_OR_RETURN(auto p, JsonString(json, "prepend", "normalizer Prepend"));
    step.text = std::string(p);
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    EMBER_ASSIGN_OR_RETURN(auto content, JsonString(json, "content", "normalizer Replace"));
    step.text = std::string(content);
    auto pat = JsonField(json, "pattern");
    if (!pat) return Status::Error("normalizer Replace: missing 'pattern'");
    bool is_regex = JsonField(*pat, "Regex").has_value();
    EMBER_ASSIGN_OR_RETURN(auto src, JsonString(*pat, is_regex ? "Regex" : "String",
                                                "normalizer Replace pattern"));
    EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(src, is_regex));
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.left = JsonBoolOr(json, "strip_left", true);
    step.right = JsonBoolOr(json, "strip_right", true);
  } else {
    return Status::Error("unsupported normalizer type '" + type + "'");
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

std::string Normalizer::Normalize(std::string text) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kNfc:
        text = Nfc(text);
        break;
      case Kind::kNfd:
        if (!IsAscii(text)) text = Utf8procMap(text, UTF8PROC_DECOMPOSE);
        break;
      case Kind::kNfkc:
        if (!IsAscii(text)) text = Utf8procMap(text, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case Kind::kNfkd:
        if (!IsAscii(text)) text = Utf8procMap(text, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
        break;
      case Kind::kLowercase:
        text = Lowercase(text);
        break;
      case Kind::kPrepend:
        if (!text.empty()) text = step.text + text;
        break;
      case Kind::kReplace: {
        std::vector<MatchRange> matches;
        step.pattern->FindAll(text, &matches);
        if (matches.empty()) break;
        std::string out;
        size_t prev = 0;
        for (auto [b, e] : matches) {
          out.append(text, prev, b - prev);
          out += step.text;
          prev = e;
        }
        out.append(text, prev, std::string::npos);
        text = std::move(out);
        break;
      }
      case Kind::kStrip:
        text = StripWhitespace(text, step.left, step.right);
        break;
    }
  }
  return text;
}

}  // namespace ember::tok
