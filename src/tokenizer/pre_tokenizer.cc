#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace ember::tok {
namespace {

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(Json json) {
  auto p = std::make_unique<PreTokenizer>();
  EMBER_RETURN_IF_ERROR(p->Add(json));
  return p;
}

Status PreTokenizer::Add(Json json) {
  std::string type = JsonTypeOf(json);
  if (type == "Sequence") {
    simdjson::dom::array arr;
    auto f = JsonField(json, "pretokenizers");
    if (!f || f->get_array().get(arr) != simdjson::SUCCESS)
      return Status::Error("pre_tokenizer Sequence: expected an array 'pretokenizers'");
    for (Json child : arr) EMBER_RETURN_IF_ERROR(Add(child));
    return Status::Ok();
  }
  Step step;
  if (type == "Split") {
    step.kind = Kind::kSplit;
    auto pat = JsonField(json, "pattern");
    if (!pat) return Status::Error("pre_tokenizer Split: missing 'pattern'");
    bool is_regex = JsonField(*pat, "Regex").has_value();
    EMBER_ASSIGN_OR_RETURN(auto src, JsonString(*pat, is_regex ? "Regex" : "String",
                                                "pre_tokenizer Split pattern"));
    EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(src, is_regex));
    std::string b = JsonStringOr(json, "behavior", "Isolated");
    if (b == "Removed") step.behavior = Behavior::kRemoved;
    else if (b == "Isolated") step.behavior = Behavior::kIsolated;
    else if (b == "MergedWithPrevious") step.behavior = Behavior::kMergedWithPrevious;
    else if (b == "MergedWithNext") step.behavior = Behavior::kMergedWithNext;
    else if (b == "Contiguous") step.behavior = Behavior::kContiguous;
    else return Status::Error("pre_tokenizer Split: unknown behavior '" + b + "'");
    step.invert = JsonBoolOr(json, "invert", false);
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = JsonBoolOr(json, "add_prefix_space", true);
    if (JsonBoolOr(json, "use_regex", true)) {
      EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(kGpt2Regex, true));
    }
    byte_level_ = true;
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = JsonStringOr(json, "replacement", "\xE2\x96\x81");
    std::string scheme = JsonStringOr(json, "prepend_scheme", "");
    if (scheme.empty()) scheme = JsonBoolOr(json, "add_prefix_space", true) ? "always" : "never";
    if (scheme == "always") step.prepend = Prepend::kAlways;
    else if (scheme == "first") step.prepend = Prepend::kFirst;
    else if (scheme == "never") step.prepend = Prepend::kNever;
    else return Status::Error("pre_tokenizer Metaspace: unknown prepend_scheme '" + scheme + "'");
    step.split = JsonBoolOr(json, "split", true);
    if (step.split) {
      EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(step.replacement, false));
    }
  } else if (type == "Digits") {
    step.kind = Kind::kSplit;
    bool individual = JsonBoolOr(json, "individual_digits", false);
    EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(individual ? "[0-9]" : "[0-9]+", true));
    step.behavior = individual ? Behavior::kIsolated : Behavior::kContiguous;
  } else if (type == "Whitespace") {
    step.kind = Kind::kSplit;
    EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(R"(\w+|[^\w\s]+)", true));
    step.behavior = Behavior::kRemoved;
    step.invert = true;
  } else if (type == "WhitespaceSplit") {
    step.kind = Kind::kSplit;
    EMBER_ASSIGN_OR_RETURN(step.pattern, Pattern::Create(R"(\s+)", true));
    step.behavior = Behavior::kRemoved;
  } else {
    return Status::Error("unsupported pre_tokenizer type '" + type + "'");
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

// Mirrors tokenizers' NormalizedString::split: matches and gaps cover the text; the behavior
// decides how matches attach to their neighbours; empty results are dropped.
void PreTokenizer::SplitBy(const Pattern& pattern, Behavior behavior, bool invert,
                           const Piece& in, std::vector<Piece>* out) {
  const std::string& s = in.text;
  if (s.empty()) return;
  std::vector<MatchRange> matches;
  pattern.FindAll(s, &matches);
  struct Seg {
    size_t b, e;
    bool is_match;
  };
  std::vector<Seg> segs;
  segs.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) segs.push_back({prev, b, invert});
    segs.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size()) segs.push_back({prev, s.size(), invert});

  std::vector<Seg> result;  // is_match here means "remove"
  result.reserve(segs.size());
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Seg& g : segs) result.push_back({g.b, g.e, false});
      break;
    case Behavior::kRemoved:
      for (const Seg& g : segs) result.push_back(g);
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Seg& g : segs) {
        if (g.is_match == previous && !result.empty()) result.back().e = g.e;
        else result.push_back({g.b, g.e, false});
        previous = g.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Seg& g : segs) {
        if (g.is_match && !previous && !result.empty()) result.back().e = g.e;
        else result.push_back({g.b, g.e, false});
        previous = g.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (size_t i = segs.size(); i-- > 0;) {
        const Seg& g = segs[i];
        if (g.is_match && !previous && !result.empty()) result.back().b = g.b;
        else result.push_back({g.b, g.e, false});
        previous = g.is_match;
      }
      std::reverse(result.begin(), result.end());
      break;
    }
  }
  for (const Seg& g : result) {
    if (g.is_match || g.e == g.b) continue;
    out->push_back({s.substr(g.b, g.e - g.b), in.at_text_start && g.b == 0});
  }
}

void PreTokenizer::ApplyStep(const Step& step, std::vector<Piece>* pieces) const {
  std::vector<Piece> next;
  next.reserve(pieces->size());
  switch (step.kind) {
    case Kind::kSplit:
      for (const Piece& p : *pieces) SplitBy(*step.pattern, step.behavior, step.invert, p, &next);
      break;
    case Kind::kByteLevel: {
      const ByteLevelAlphabet& alphabet = GetByteLevelAlphabet();
      std::vector<Piece> split;
      for (Piece& p : *pieces) {
        if (step.add_prefix_space && !p.text.empty() && p.text[0] != ' ') p.text = " " + p.text;
        if (step.pattern) SplitBy(*step.pattern, Behavior::kIsolated, false, p, &split);
        else if (!p.text.empty()) split.push_back(std::move(p));
      }
      for (Piece& p : split) {
        Piece mapped{std::string(p.text.size() * 2, '\0'), p.at_text_start};
        char* out = mapped.text.data();
        for (unsigned char c : p.text) {
          const std::string& u = alphabet.byte_to_utf8[c];  // 1 or 2 bytes
          out[0] = u[0];
          if (u.size() == 2) out[1] = u[1];
          out += u.size();
        }
        mapped.text.resize(size_t(out - mapped.text.data()));
        next.push_back(std::move(mapped));
      }
      break;
    }
    case Kind::kMetaspace: {
      for (Piece& p : *pieces) {
        std::string t;
        t.reserve(p.text.size() + 3);
        for (char c : p.text) {
          if (c == ' ') t += step.replacement;
          else t += c;
        }
        bool starts = t.compare(0, step.replacement.size(), step.replacement) == 0;
        if (!starts && (step.prepend == Prepend::kAlways ||
                        (step.prepend == Prepend::kFirst && p.at_text_start))) {
          t = step.replacement + t;
        }
        Piece q{std::move(t), p.at_text_start};
        if (step.split) {
          SplitBy(*step.pattern, Behavior::kMergedWithNext, false, q, &next);
        } else if (!q.text.empty()) {
          next.push_back(std::move(q));
        }
      }
      break;
    }
  }
  *pieces = std::move(next);
}

void PreTokenizer::Split(std::string text, bool at_text_start, std::vector<Piece>* out) const {
  std::vector<Piece> pieces;
  if (text.empty()) return;
  pieces.push_back({std::move(text), at_text_start});
  for (const Step& step : steps_) ApplyStep(step, &pieces);
  for (Piece& p : pieces) out->push_back(std::move(p));
}

}  // namespace ember::tok
