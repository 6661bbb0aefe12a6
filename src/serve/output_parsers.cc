#include "serve/output_parsers.h"

#include <string>

#include "serve/harmony.h"

namespace ember::serve {

Result<OutputParsers> ChooseOutputParsers(std::string_view reasoning_flag,
                                          std::string_view tool_flag,
                                          std::string_view template_source) {
  // `auto` is harmony when the other flag asks for it or the template renders it.
  const bool harmony_template = TemplateRendersHarmony(template_source);
  OutputParsers out;
  if (reasoning_flag == "auto") {
    if (tool_flag == "harmony" || harmony_template)
      out.reasoning = ReasoningFormat::kHarmony;
    else if (TemplateHasThinkBlocks(template_source))
      out.reasoning = ReasoningFormat::kThink;
  } else if (std::optional<ReasoningFormat> f = ParseReasoningFormat(reasoning_flag)) {
    out.reasoning = *f;
  } else {
    return Status::Error("--reasoning-parser: must be auto, none, think or harmony, got '" +
                         std::string(reasoning_flag) + "'");
  }
  if (tool_flag == "auto") {
    out.tools = reasoning_flag == "harmony" ? ToolCallFormat::kHarmony
                                            : DetectToolCallFormat(template_source);
  } else if (std::optional<ToolCallFormat> f = ParseToolCallFormat(tool_flag)) {
    out.tools = *f;
  } else {
    return Status::Error(
        "--tool-call-parser: must be auto, none, hermes, llama3_json, mistral or harmony, got '" +
        std::string(tool_flag) + "'");
  }
  const bool reasoning_other =
      out.reasoning != ReasoningFormat::kNone && out.reasoning != ReasoningFormat::kHarmony;
  const bool tools_other = out.tools != ToolCallFormat::kNone && out.tools != ToolCallFormat::kHarmony;
  if ((out.reasoning == ReasoningFormat::kHarmony && tools_other) ||
      (out.tools == ToolCallFormat::kHarmony && reasoning_other)) {
    const auto origin = [&](std::string_view flag) {
      return flag == "auto" ? std::string(" (auto: from the chat template)") : std::string();
    };
    return Status::Error(
        std::string("--reasoning-parser ") + ReasoningFormatName(out.reasoning) +
        origin(reasoning_flag) + " and --tool-call-parser " + ToolCallFormatName(out.tools) +
        origin(tool_flag) +
        " conflict: harmony parses reasoning and tool calls together, so the other must be "
        "harmony or none");
  }
  return out;
}

}  // namespace ember::serve
