// Reasoning in generated text. A model that thinks before it answers (Qwen3, DeepSeek-R1 and
// their distills) writes <think> ... </think> and then its reply; ReasoningParser splits a chat
// sample's released text into the reasoning (`reasoning_content` in responses) and the content
// after it, incrementally, so streamed and non-streamed responses carry the same split.
// Which parser splits reasoning off is a ReasoningFormat: this one (kThink) or harmony's
// (harmony.h, which also parses tool calls; output_parsers.h chooses).
// Only a <think> block at the very start of the output (after whitespace) is reasoning; when the
// prompt itself ends inside one (an R1-style template opens it), the output starts in it. The
// whitespace after </think> is dropped. Not thread-safe: one parser per sample.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ember::serve {

enum class ReasoningFormat { kNone, kThink, kHarmony };

const char* ReasoningFormatName(ReasoningFormat format);  // "none", "think", "harmony"
std::optional<ReasoningFormat> ParseReasoningFormat(std::string_view name);

// Whether a chat template writes think blocks (the server then parses them by default).
bool TemplateHasThinkBlocks(std::string_view template_source);
// Whether a rendered prompt ends inside an open <think> block (so the output starts in it).
bool PromptEndsInThinkBlock(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;  // newly released reasoning text
  std::string content;    // newly released content
};

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning);

  // Appends released text (whole UTF-8 characters); holds back only what may still be a tag.
  ReasoningDelta Push(std::string_view text);
  // End of the sample: what is held goes where it stands (an unclosed block is all reasoning).
  ReasoningDelta Finish();

 private:
  enum class State { kStart, kReasoning, kAfterEnd, kContent };
  void Scan(ReasoningDelta* out);

  State state_;
  std::string pending_;
};

}  // namespace ember::serve
