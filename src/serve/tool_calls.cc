#include "serve/tool_calls.h"

#include <nlohmann/json.hpp>

#include "serve/harmony.h"
#include "serve/stop_matcher.h"
#include "util/check.h"

namespace ember::serve {

namespace {

using ordered = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kMistralTokens[] = {kMistralCalls, kMistralArgs, kMistralCallId};

bool IsSpace(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// {"name": "...", <args_key>: {...}} (the arguments may also be a string holding JSON, or absent:
// no arguments). Nothing else may be in the object.
std::optional<ToolCall> CallFromObject(const ordered& j,
                                       std::initializer_list<const char*> args_keys) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call;
  call.name = j["name"].get<std::string>();
  if (call.name.empty()) return std::nullopt;
  const ordered* args = nullptr;
  size_t known = 1;
  for (const char* key : args_keys) {
    if (j.contains(key)) {
      if (args != nullptr) return std::nullopt;  // both spellings: not a call we understand
      args = &j[key];
      ++known;
    }
  }
  if (j.size() != known) return std::nullopt;
  if (args == nullptr) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = args->dump();
  } else if (args->is_string()) {
    const ordered inner = ordered::parse(args->get<std::string>(), nullptr, false);
    if (!inner.is_object()) return std::nullopt;
    call.arguments = inner.dump();
  } else {
    return std::nullopt;
  }
  return call;
}

std::optional<ToolCall> ParseHermesBody(std::string_view body) {
  const ordered j = ordered::parse(body, nullptr, /*allow_exceptions=*/false);
  return CallFromObject(j, {"arguments", "parameters"});
}

// One object, or several separated by ';' (Llama's parallel calls); all must be calls.
std::optional<std::vector<ToolCall>> ParseLlama3Calls(std::string_view text) {
  std::vector<ToolCall> calls;
  size_t start = 0;
  while (text.find_first_not_of(" \n\t\r", start) != std::string_view::npos) {
    // The shortest ';'-delimited piece from `start` that parses (a ';' may sit inside a string).
    size_t end = start;
    std::optional<ToolCall> call;
    while (true) {
      end = text.find(';', end);
      const std::string_view piece =
          text.substr(start, end == std::string_view::npos ? end : end - start);
      call = CallFromObject(ordered::parse(piece, nullptr, false), {"parameters", "arguments"});
      if (call || end == std::string_view::npos) break;
      ++end;
    }
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

std::string_view Trim(std::string_view s) {
  s = TrimRight(s);
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  return s;
}

// The body of one mistral [TOOL_CALLS] block (up to the next one or the end): a JSON array of
// call objects, or NAME[ARGS]{...} (NAME[CALL_ID]ID[ARGS]{...}); nullopt unless all of it parses.
std::optional<std::vector<ToolCall>> ParseMistralBlock(std::string_view body) {
  body = Trim(body);
  std::vector<ToolCall> calls;
  if (!body.empty() && body.front() == '[') {
    ordered j = ordered::parse(body, nullptr, false);
    if (!j.is_array() || j.empty()) return std::nullopt;
    for (ordered& item : j) {
      if (item.is_object() && item.contains("id") && item["id"].is_string()) item.erase("id");
      std::optional<ToolCall> call = CallFromObject(item, {"arguments"});
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
    return calls;
  }
  const size_t args = body.find(kMistralArgs);
  if (args == std::string_view::npos) return std::nullopt;
  std::string_view name = body.substr(0, args);
  if (const size_t id = name.find(kMistralCallId); id != std::string_view::npos)
    name = name.substr(0, id);
  name = Trim(name);
  const ordered a = ordered::parse(body.substr(args + kMistralArgs.size()), nullptr, false);
  if (name.empty() || name.find_first_of(" \n\t\r[]{}\"") != std::string_view::npos ||
      !a.is_object())
    return std::nullopt;
  calls.push_back(ToolCall{0, "", std::string(name), a.dump()});
  return calls;
}

}  // namespace

std::span<const std::string_view> MistralControlTokens() {
  return kMistralTokens;
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kHarmony:
      return "harmony";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "none";
}

std::optional<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  for (ToolCallFormat f :
       {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
        ToolCallFormat::kHarmony, ToolCallFormat::kMistral})
    if (name == ToolCallFormatName(f)) return f;
  return std::nullopt;
}

ToolCallFormat DetectToolCallFormat(std::string_view source) {
  if (TemplateRendersHarmony(source)) return ToolCallFormat::kHarmony;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kMistralCalls) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find("<|python_tag|>") != std::string_view::npos) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

std::string ForcedCallHead(ToolCallFormat format, const std::string& name) {
  const std::string quoted = nlohmann::json(name).dump();
  switch (format) {
    case ToolCallFormat::kHermes:
      return std::string(kHermesOpen) + "\n{\"name\": " + quoted + ", \"arguments\": ";
    case ToolCallFormat::kLlama3Json:
      return "{\"name\": " + quoted + ", \"parameters\": ";
    case ToolCallFormat::kNone:
    case ToolCallFormat::kHarmony:
    case ToolCallFormat::kMistral:
      break;
  }
  CHECK(false) << "ForcedCallHead: no forcible tool-call format";
  return {};
}

std::string ForcedCallTail(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "}\n" + std::string(kHermesClose);
    case ToolCallFormat::kLlama3Json:
      return "}";
    case ToolCallFormat::kNone:
    case ToolCallFormat::kHarmony:
    case ToolCallFormat::kMistral:
      break;
  }
  CHECK(false) << "ForcedCallTail: no forcible tool-call format";
  return {};
}

ToolCallParser::ToolCallParser(ToolCallFormat format) : format_(format) {
  CHECK(format == ToolCallFormat::kHermes || format == ToolCallFormat::kLlama3Json ||
        format == ToolCallFormat::kMistral);
}

void ToolCallParser::Release(std::string_view content, ToolCallDelta* out) {
  out->content.append(content);
}

void ToolCallParser::AddCall(ToolCall call, ToolCallDelta* out) {
  call.index = num_calls_++;
  out->calls.push_back(std::move(call));
}

// Content up to a call is released without its trailing whitespace (the separator before the
// call); content is otherwise released up to any trailing whitespace, which is held until
// something other than a call follows it.
bool ToolCallParser::ReleaseUntilTag(std::string_view tag, bool final, ToolCallDelta* out) {
  const size_t open = pending_.find(tag);
  if (open != std::string::npos) {
    Release(TrimRight(std::string_view(pending_).substr(0, open)), out);
    pending_.erase(0, open + tag.size());
    in_call_ = true;
    return true;
  }
  std::string_view ready(pending_);
  if (final) {
    Release(num_calls_ > 0 ? TrimRight(ready) : ready, out);
    pending_.clear();
    return false;
  }
  ready = TrimRight(ready.substr(0, ready.size() - PartialTagLength(ready, tag)));
  Release(ready, out);
  pending_.erase(0, ready.size());
  return false;
}

void ToolCallParser::ScanHermes(bool final, ToolCallDelta* out) {
  while (true) {
    if (!in_call_) {
      if (ReleaseUntilTag(kHermesOpen, final, out)) continue;
      return;
    }
    const size_t close = pending_.find(kHermesClose);
    if (close == std::string::npos && !final) return;  // the call is still arriving
    const std::string_view body = std::string_view(pending_).substr(0, close);
    if (std::optional<ToolCall> call = ParseHermesBody(body)) {
      AddCall(std::move(*call), out);
    } else {
      // Not a call we understand: the block stays content, as generated.
      Release(kHermesOpen, out);
      Release(body, out);
      if (close != std::string::npos) Release(kHermesClose, out);
    }
    pending_.erase(0, close == std::string::npos ? pending_.size() : close + kHermesClose.size());
    in_call_ = false;
    if (final && pending_.empty()) return;
  }
}

// The output is a call only if it starts (after whitespace) with '{'; such output is held to the
// end, then parsed whole.
void ToolCallParser::ScanLlama3(bool final, ToolCallDelta* out) {
  if (lead_ == Lead::kUnknown) {
    const size_t first = pending_.find_first_not_of(" \n\t\r");
    if (first == std::string::npos) {
      if (final) {
        Release(pending_, out);
        pending_.clear();
      }
      return;
    }
    lead_ = pending_[first] == '{' ? Lead::kJson : Lead::kContent;
  }
  if (lead_ == Lead::kContent) {
    Release(pending_, out);
    pending_.clear();
    return;
  }
  if (!final) return;
  if (std::optional<std::vector<ToolCall>> calls = ParseLlama3Calls(pending_)) {
    for (ToolCall& call : *calls) AddCall(std::move(call), out);
  } else {
    Release(pending_, out);
  }
  pending_.clear();
}

// Content is released as hermes's is (held back where it may be the start of [TOOL_CALLS]); each
// block after a [TOOL_CALLS] is held until the next one or the end, then parsed whole. A block
// that does not parse stays content, its tag included.
void ToolCallParser::ScanMistral(bool final, ToolCallDelta* out) {
  while (true) {
    if (!in_call_) {
      if (ReleaseUntilTag(kMistralCalls, final, out)) continue;
      return;
    }
    const size_t next = pending_.find(kMistralCalls);
    if (next == std::string::npos && !final) return;  // the block may still grow
    const std::string_view body = std::string_view(pending_).substr(0, next);
    if (std::optional<std::vector<ToolCall>> calls = ParseMistralBlock(body)) {
      for (ToolCall& call : *calls) AddCall(std::move(call), out);
    } else {
      Release(kMistralCalls, out);
      Release(body, out);
    }
    pending_.erase(0, next == std::string::npos ? pending_.size() : next);
    in_call_ = false;
    if (final && pending_.empty()) return;
  }
}

void ToolCallParser::Scan(bool final, ToolCallDelta* out) {
  switch (format_) {
    case ToolCallFormat::kHermes:
      ScanHermes(final, out);
      return;
    case ToolCallFormat::kMistral:
      ScanMistral(final, out);
      return;
    default:
      ScanLlama3(final, out);
  }
}

ToolCallDelta ToolCallParser::Push(std::string_view text) {
  ToolCallDelta out;
  pending_.append(text);
  Scan(false, &out);
  return out;
}

ToolCallDelta ToolCallParser::Finish() {
  ToolCallDelta out;
  Scan(true, &out);
  return out;
}

}  // namespace ember::serve
