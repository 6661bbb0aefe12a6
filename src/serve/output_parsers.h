// Which parsers a served model's chat replies go through: reasoning (reasoning.h: <think>
// blocks; harmony.h: gpt-oss's analysis channel) and tool calls (tool_calls.h; harmony.h). Chosen
// once at start-up from `ember serve`'s --reasoning-parser / --tool-call-parser and the chat
// template. Harmony parses reasoning and tool calls together, so it is never combined with
// another parser: `auto` follows harmony (an explicit harmony flag or a harmony template), and
// harmony beside an explicit think / hermes / llama3_json is an error.
#pragma once

#include <string_view>

#include "serve/reasoning.h"
#include "serve/tool_calls.h"
#include "util/status.h"

namespace ember::serve {

struct OutputParsers {
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  ToolCallFormat tools = ToolCallFormat::kNone;

  // One HarmonyParser does both jobs (its reasoning and calls are on or off per the fields).
  bool harmony() const {
    return reasoning == ReasoningFormat::kHarmony || tools == ToolCallFormat::kHarmony;
  }
};

// `reasoning_flag`: auto|none|think|harmony; `tool_flag`: auto|none|hermes|llama3_json|harmony.
// An unknown name or a conflict is an error naming the flag.
Result<OutputParsers> ChooseOutputParsers(std::string_view reasoning_flag,
                                          std::string_view tool_flag,
                                          std::string_view template_source);

}  // namespace ember::serve
