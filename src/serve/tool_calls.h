// Tool calls in generated text. A chat model that was given `tools` answers a call in its own
// syntax; ToolCallParser turns a sample's released text into OpenAI `tool_calls` and the content
// around them, incrementally, so streamed and non-streamed responses carry the same calls and
// the same content. Formats:
//   hermes (Qwen2.5, Qwen3, Hermes): any number of
//     <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>
//     with content before and between them;
//   llama3_json (Llama 3.1 / 3.2): the whole output is {"name": N, "parameters": {...}}, or
//     several separated by ";";
//   mistral (Mistral's [TOOL_CALLS] control token, kept in the text for this format:
//     MistralControlTokens): content, then [TOOL_CALLS] followed by either a JSON array of
//     {"name": N, "arguments": {...}} (an "id" beside them is ignored; tokenizers v3 and v7) or
//     N[ARGS]{...} (v11 and later; [CALL_ID]id before [ARGS] is ignored), each further call after
//     another [TOOL_CALLS].
// (harmony, gpt-oss's, is parsed together with its reasoning by HarmonyParser: harmony.h.)
// A block that does not parse as a call stays content, unchanged. The format comes from the chat
// template (DetectToolCallFormat) or `ember serve --tool-call-parser`. Not thread-safe: one parser
// per sample.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ember::serve {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kHarmony, kMistral };

// "none", "hermes", "llama3_json", "harmony", "mistral"
const char* ToolCallFormatName(ToolCallFormat format);
std::optional<ToolCallFormat> ParseToolCallFormat(std::string_view name);
// The format a chat template's tool-call rendering uses; kNone when it is not one we parse.
ToolCallFormat DetectToolCallFormat(std::string_view template_source);

// The special tokens a mistral sample's text keeps for the parser ([TOOL_CALLS], [ARGS],
// [CALL_ID]); the parser releases none of them as content, except inside a block that does not
// parse as a call.
std::span<const std::string_view> MistralControlTokens();

// Forced calls (tool_choice): the text of a call to `name` up to where its arguments object
// starts, and the text after that object. `format` must be kHermes or kLlama3Json (harmony's and
// mistral's calls start with special tokens, which the output constraint cannot spell).
std::string ForcedCallHead(ToolCallFormat format, const std::string& name);
std::string ForcedCallTail(ToolCallFormat format);

struct ToolCall {
  int32_t index = 0;  // position among the sample's calls
  std::string id;     // "call_..." (given by the server, not the parser)
  std::string name;
  std::string arguments;  // JSON text of the arguments object, keys in the model's order
};

struct ToolCallDelta {
  std::string content;          // text now released as content
  std::vector<ToolCall> calls;  // calls completed by this piece
};

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallFormat format);  // kHermes, kLlama3Json or kMistral

  // Appends released text (whole UTF-8 characters); returns what is now certain. Text that may
  // still turn out to be (part of) a call, and whitespace that may turn out to separate calls,
  // is held back.
  ToolCallDelta Push(std::string_view text);
  // End of the sample: an unclosed call that parses is still a call; anything else held is
  // released as content (whitespace after the last call is dropped).
  ToolCallDelta Finish();

  int32_t num_calls() const { return num_calls_; }

 private:
  void ScanHermes(bool final, ToolCallDelta* out);
  void ScanLlama3(bool final, ToolCallDelta* out);
  void ScanMistral(bool final, ToolCallDelta* out);
  void Scan(bool final, ToolCallDelta* out);
  // Outside a call (hermes, mistral): releases the content before `tag` and enters the call
  // (true), or releases what can no longer start the tag (false: wait for more text; at the end
  // everything, trailing whitespace after a call dropped).
  bool ReleaseUntilTag(std::string_view tag, bool final, ToolCallDelta* out);
  void Release(std::string_view content, ToolCallDelta* out);
  void AddCall(ToolCall call, ToolCallDelta* out);

  ToolCallFormat format_;
  std::string pending_;   // received, not yet released
  bool in_call_ = false;  // hermes: inside <tool_call> ...; mistral: after [TOOL_CALLS]
  enum class Lead : uint8_t { kUnknown, kContent, kJson } lead_ = Lead::kUnknown;  // llama3_json
  int32_t num_calls_ = 0;
};

}  // namespace ember::serve
