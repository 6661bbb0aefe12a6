// OpenAI's "harmony" format (gpt-oss): the model writes a sequence of messages
//   <|start|>{role}[ to={recipient}]<|channel|>{channel}[ to={recipient}][ <|constrain|>]{type}
//   <|message|>{text}<|end|>        (or <|return|> after the answer, <|call|> after a tool call)
// on the channels `analysis` (its reasoning), `commentary` (tool calls and their preambles) and
// `final` (the answer). HarmonyParser turns a chat sample's released text into OpenAI's
// reasoning_content (analysis), content (final, commentary without a recipient) and tool_calls
// (messages to `functions.NAME`, the body being the arguments), incrementally, so streamed and
// non-streamed responses carry the same split. It needs the control tokens in its text: the
// sample's TextStream keeps HarmonyControlTokens() (text_stream.h). No control token is ever
// released as reasoning or content. Not thread-safe: one parser per sample.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serve/tool_calls.h"

namespace ember::serve {

// The special tokens that structure harmony messages (the text of each, as the tokenizer has it).
std::span<const std::string_view> HarmonyControlTokens();
// Whether a chat template renders harmony (gpt-oss's writes <|channel|> into every message).
bool TemplateRendersHarmony(std::string_view template_source);
// The prompt from its last <|start|> (empty when it has none): all HarmonyParser reads of it.
std::string_view HarmonyLastMessage(std::string_view prompt);

struct HarmonyOptions {
  bool reasoning = true;   // analysis text is reasoning (false: it is content)
  bool tool_calls = true;  // messages to functions.NAME are calls (false: their body is content)
};

struct HarmonyDelta {
  std::string reasoning;        // newly released reasoning text
  std::string content;          // newly released content
  std::vector<ToolCall> calls;  // calls completed by this piece (id left to the server)
};

class HarmonyParser {
 public:
  // `prompt` is the rendered prompt (or its HarmonyLastMessage): where it stops (after
  // `<|start|>assistant`, normally) says where the output starts: in a header, in a message
  // body, or between messages.
  HarmonyParser(HarmonyOptions options, std::string_view prompt);

  // Appends released text (whole UTF-8 characters); holds back only headers, a call's body and
  // what may still be a control token.
  HarmonyDelta Push(std::string_view text);
  // End of the sample: an open message goes where it stands (a call whose body is not a JSON
  // object, e.g. cut by max_tokens, is content); a cut header is dropped, unless the output had
  // no harmony markup at all (a model not writing harmony): then it is content.
  HarmonyDelta Finish();

  int32_t num_calls() const { return num_calls_; }

 private:
  enum class State { kBetween, kHeader, kBody };
  enum class Route { kReasoning, kContent, kCall };

  void Scan(bool final, HarmonyDelta* out);
  void BeginMessage(std::string_view header);
  void EndMessage(HarmonyDelta* out);
  void Emit(Route route, std::string_view text, HarmonyDelta* out);

  HarmonyOptions options_;
  State state_ = State::kBetween;
  std::string pending_;  // received, not yet consumed
  std::string header_;   // kHeader: the part of the open header that came with the prompt
  Route route_ = Route::kContent;  // kBody: where the body goes
  std::string call_name_, call_body_;  // kBody, route kCall
  bool fresh_message_ = false;  // nothing of the open message released yet
  bool wrote_reasoning_ = false, wrote_content_ = false;
  bool saw_markup_ = false;  // a control token came in the output
  int32_t num_calls_ = 0;
};

}  // namespace ember::serve
