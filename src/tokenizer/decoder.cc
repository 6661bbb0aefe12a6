#include "tokenizer/decoder.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace ember::tok {
namespace {

// "<0xNN>" -> NN, else -1.
int ByteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

std::vector<std::string> SplitChars(const std::string& s) {
  std::vector<std::string> chars;
  for (size_t i = 0; i < s.size();) {
    size_t len = std::min(Utf8SeqLen(uint8_t(s[i])), s.size() - i);
    chars.push_back(s.substr(i, len));
    i += len;
  }
  return chars;
}

}  // namespace

Result<std::unique_ptr<Decoder>> Decoder::FromJson(Json json) {
  auto d = std::make_unique<Decoder>();
  EMBER_RETURN_IF_ERROR(d->Add(json));
  return d;
}

Status Decoder::Add(Json json) {
  std::string type = JsonTypeOf(json);
  if (type == "Sequence") {
    simdjson::dom::array arr;
    auto f = JsonField(json, "decoders");
    if (!f || f->get_array().get(arr) != simdjson::SUCCESS)
      return Status::Error("decoder Sequence: expected an array 'decoders'");
    for (Json child : arr) EMBER_RETURN_IF_ERROR(Add(child));
    return Status::Ok();
  }
  Step step;
  if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.text = JsonStringOr(json, "replacement", "\xE2\x96\x81");
    std::string scheme = JsonStringOr(json, "prepend_scheme", "");
    if (scheme.empty()) scheme = JsonBoolOr(json, "add_prefix_space", true) ? "always" : "never";
    step.prepend = scheme != "never";
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    EMBER_ASSIGN_OR_RETURN(auto content, JsonString(json, "content", "decoder Replace"));
    step.text = std::string(content);
    auto pat = JsonField(json, "pattern");
    if (!pat) return Status::Error("decoder Replace: missing 'pattern'");
    bool is_regex = JsonField(*pat, "Regex").has_value();
    EMBER_ASSIGN_OR_RETURN(auto src, JsonString(*pat, is_regex ? "Regex" : "String",
                                                "decoder Replace pattern"));
    EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(src, is_regex));
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    EMBER_ASSIGN_OR_RETURN(auto content, JsonString(json, "content", "decoder Strip"));
    step.strip_content = std::string(content);
    step.start = size_t(std::max<int64_t>(0, JsonIntOr(json, "start", 0)));
    step.stop = size_t(std::max<int64_t>(0, JsonIntOr(json, "stop", 0)));
  } else {
    return Status::Error("unsupported decoder type '" + type + "'");
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

std::string Decoder::Decode(std::vector<std::string> tokens, bool at_start, bool* hold) const {
  return Run(std::move(tokens), at_start, hold, /*lossless=*/false);
}

std::string Decoder::DecodeBytes(std::string token) const {
  std::vector<std::string> tokens;
  tokens.push_back(std::move(token));
  return Run(std::move(tokens), /*at_start=*/false, nullptr, /*lossless=*/true);
}

std::string Decoder::Run(std::vector<std::string> tokens, bool at_start, bool* hold,
                         bool lossless) const {
  bool fused = false;  // tokens[0] stands for the whole window (after Fuse / ByteLevel)
  bool held = false;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel: {
        const ByteLevelAlphabet& alphabet = GetByteLevelAlphabet();
        std::string bytes;
        for (const std::string& t : tokens) {
          size_t mark = bytes.size();
          bool all_mapped = true;
          for (size_t i = 0; i < t.size();) {
            size_t len;
            char32_t cp = DecodeCodePoint(t, i, &len);
            if (cp >= 324 || alphabet.cp_to_byte[cp] < 0) {
              all_mapped = false;
              break;
            }
            bytes.push_back(char(alphabet.cp_to_byte[cp]));
            i += len;
          }
          if (!all_mapped) {
            bytes.resize(mark);
            bytes += t;
          }
        }
        held = IncompleteUtf8Tail(bytes) > 0;
        tokens.assign(1, lossless ? std::move(bytes) : Utf8Lossy(bytes));
        fused = true;
        break;
      }
      case Kind::kMetaspace:
        // tokenizers drops every replacement character of the first token (prepend scheme
        // other than "never") and turns the others into spaces.
        for (size_t i = 0; i < tokens.size(); ++i) {
          const std::string& t = tokens[i];
          bool drop = i == 0 && at_start && step.prepend;
          std::string out;
          for (size_t pos = 0; pos < t.size();) {
            if (t.compare(pos, step.text.size(), step.text) == 0) {
              if (!drop) out += ' ';
              pos += step.text.size();
            } else {
              out += t[pos++];
            }
          }
          tokens[i] = std::move(out);
        }
        break;
      case Kind::kReplace:
        for (std::string& t : tokens) {
          std::vector<MatchRange> matches;
          step.pattern->FindAll(t, &matches);
          if (matches.empty()) continue;
          std::string out;
          size_t prev = 0;
          for (auto [b, e] : matches) {
            out.append(t, prev, b - prev);
            out += step.text;
            prev = e;
          }
          out.append(t, prev, std::string::npos);
          t = std::move(out);
        }
        break;
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string run;
        size_t run_len = 0;
        auto flush = [&] {
          if (run_len == 0) return;
          if (lossless || IsValidUtf8(run)) {
            out.push_back(run);
          } else {
            for (size_t k = 0; k < run_len; ++k) out.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_len = 0;
        };
        for (std::string& t : tokens) {
          int b = ByteToken(t);
          if (b >= 0) {
            run.push_back(char(b));
            ++run_len;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        held = held || run_len > 0;
        flush();
        tokens = std::move(out);
        break;
      }
      case Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        fused = true;
        break;
      }
      case Kind::kStrip: {
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::vector<std::string> chars = SplitChars(tokens[i]);
          size_t start_cut = 0;
          bool skip_start = i == 0 && fused && !at_start;
          for (size_t k = 0; k < step.start && k < chars.size() && !skip_start; ++k) {
            if (chars[k] != step.strip_content) break;
            start_cut = k + 1;
          }
          size_t stop_cut = chars.size();
          for (size_t k = 0; k < step.stop && k < chars.size(); ++k) {
            size_t index = chars.size() - k - 1;
            if (index < start_cut || chars[index] != step.strip_content) break;
            stop_cut = index;
          }
          std::string out;
          for (size_t k = start_cut; k < stop_cut; ++k) out += chars[k];
          tokens[i] = std::move(out);
        }
        break;
      }
    }
  }
  if (hold != nullptr) *hold = held;
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

}  // namespace ember::tok
