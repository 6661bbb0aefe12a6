#include "serve/harmony.h"

#include <algorithm>
#include <array>
#include <optional>

#include <nlohmann/json.hpp>

#include "serve/stop_matcher.h"

namespace ember::serve {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kConstrain = "<|constrain|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kReturn = "<|return|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::array<std::string_view, 7> kControlTokens = {kStart,  kChannel, kConstrain, kMessage,
                                                            kEnd,    kReturn,  kCall};
constexpr std::string_view kFunctionsPrefix = "functions.";
// Between messages of one destination (two analysis messages, a preamble and the answer).
constexpr std::string_view kMessageSeparator = "\n\n";

bool EndsMessage(std::string_view token) {
  return token == kEnd || token == kReturn || token == kCall;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

struct Control {
  size_t pos = 0;
  std::string_view token;
};

// The earliest control token in `text` for which `accept` holds.
template <typename Accept>
std::optional<Control> FindControl(std::string_view text, Accept accept) {
  std::optional<Control> first;
  for (std::string_view token : kControlTokens) {
    if (!accept(token)) continue;
    const size_t pos = text.find(token);
    if (pos != std::string_view::npos && (!first || pos < first->pos)) first = Control{pos, token};
  }
  return first;
}

std::optional<Control> FindControl(std::string_view text) {
  return FindControl(text, [](std::string_view) { return true; });
}

// The longest suffix of `text` that may still grow into a control token.
size_t PartialControlLength(std::string_view text) {
  size_t held = 0;
  for (std::string_view token : kControlTokens) held = std::max(held, PartialTagLength(text, token));
  return held;
}

struct Header {
  std::string channel;
  std::string recipient;  // "" when the message is not addressed to a tool
};

// Words split at whitespace and at control tokens; the word after <|channel|> is the channel,
// "to=X" anywhere (role part or channel part) names the recipient. The role and the content type
// (`json`, `<|constrain|>json`) do not change where the body goes.
Header ParseHeader(std::string_view text) {
  Header header;
  bool channel_next = false;
  size_t pos = 0;
  while (pos < text.size()) {
    if (IsSpace(text[pos])) {
      ++pos;
      continue;
    }
    const std::optional<Control> control = FindControl(text.substr(pos));
    if (control && control->pos == 0) {
      channel_next = control->token == kChannel;
      pos += control->token.size();
      continue;
    }
    size_t end = pos;
    while (end < text.size() && !IsSpace(text[end])) ++end;
    if (control) end = std::min(end, pos + control->pos);
    const std::string_view word = text.substr(pos, end - pos);
    if (word.starts_with("to=")) {
      header.recipient = word.substr(3);
    } else if (channel_next) {
      header.channel = word;
    }
    channel_next = false;
    pos = end;
  }
  return header;
}

}  // namespace

std::span<const std::string_view> HarmonyControlTokens() { return kControlTokens; }

bool TemplateRendersHarmony(std::string_view source) {
  return source.find(kChannel) != std::string_view::npos;
}

std::string_view HarmonyLastMessage(std::string_view prompt) {
  const size_t start = prompt.rfind(kStart);
  return start == std::string_view::npos ? std::string_view() : prompt.substr(start);
}

// The output continues the prompt's last message: find where that message stands.
HarmonyParser::HarmonyParser(HarmonyOptions options, std::string_view prompt) : options_(options) {
  const std::string_view last = HarmonyLastMessage(prompt);
  if (last.empty()) return;  // no harmony message open: between messages
  const std::string_view tail = last.substr(kStart.size());
  if (FindControl(tail, EndsMessage)) return;  // the last message is closed
  const size_t message = tail.find(kMessage);
  if (message == std::string_view::npos) {
    state_ = State::kHeader;
    header_ = tail;
    return;
  }
  BeginMessage(tail.substr(0, message));
  if (route_ == Route::kCall) call_body_ = tail.substr(message + kMessage.size());
  state_ = State::kBody;
}

void HarmonyParser::BeginMessage(std::string_view header_text) {
  const Header header = ParseHeader(header_text);
  fresh_message_ = true;
  call_name_.clear();
  call_body_.clear();
  const Route as_text = options_.reasoning ? Route::kReasoning : Route::kContent;
  if (header.recipient.empty()) {
    route_ = header.channel == "analysis" ? as_text : Route::kContent;
  } else if (!header.recipient.starts_with(kFunctionsPrefix)) {
    route_ = as_text;  // a built-in tool (browser, python): the server runs none; not the answer
  } else if (options_.tool_calls && header.recipient.size() > kFunctionsPrefix.size()) {
    route_ = Route::kCall;
    call_name_ = header.recipient.substr(kFunctionsPrefix.size());
  } else {
    route_ = Route::kContent;  // tools not parsed for this request: the call stays content
  }
}

void HarmonyParser::Emit(Route route, std::string_view text, HarmonyDelta* out) {
  if (text.empty()) return;
  if (route == Route::kCall) {
    call_body_.append(text);
    return;
  }
  const bool reasoning = route == Route::kReasoning;
  bool& wrote = reasoning ? wrote_reasoning_ : wrote_content_;
  std::string& to = reasoning ? out->reasoning : out->content;
  if (fresh_message_ && wrote) to.append(kMessageSeparator);
  fresh_message_ = false;
  wrote = true;
  to.append(text);
}

// A call's body is its arguments: a JSON object (or nothing: no arguments). Anything else is not
// a call we understand, and its body is released as content.
void HarmonyParser::EndMessage(HarmonyDelta* out) {
  if (route_ == Route::kCall) {
    const std::string_view body(call_body_);
    const bool empty = std::all_of(body.begin(), body.end(), IsSpace);
    const nlohmann::ordered_json args =
        empty ? nlohmann::ordered_json::object()
              : nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (args.is_object()) {
      ToolCall call;
      call.index = num_calls_++;
      call.name = call_name_;
      call.arguments = args.dump();
      out->calls.push_back(std::move(call));
    } else {
      Emit(Route::kContent, body, out);
    }
  }
  route_ = Route::kContent;
  call_name_.clear();
  call_body_.clear();
}

void HarmonyParser::Scan(bool final, HarmonyDelta* out) {
  while (true) {
    switch (state_) {
      case State::kBetween: {
        // Text outside any message (a model that does not write harmony) is content, as is.
        const std::optional<Control> control = FindControl(pending_);
        const size_t ready = control ? control->pos
                                     : pending_.size() - (final ? 0 : PartialControlLength(pending_));
        if (ready > 0) {
          out->content.append(pending_, 0, ready);
          wrote_content_ = true;
          pending_.erase(0, ready);
        }
        if (!control) return;
        // <|start|> opens a header; a stray end token is dropped; a header may also begin
        // without <|start|> (<|channel|>...), then the token is part of it.
        if (control->token == kStart || EndsMessage(control->token))
          pending_.erase(0, control->token.size());
        if (!EndsMessage(control->token)) {
          state_ = State::kHeader;
          header_.clear();
        }
        continue;
      }
      case State::kHeader: {
        const std::optional<Control> control = FindControl(pending_, [](std::string_view t) {
          return t != kChannel && t != kConstrain;
        });
        if (!control) {
          if (!final) return;  // the header is still arriving
          // A cut header is markup, dropped; output with no markup at all was never a header.
          if (!saw_markup_) {
            out->content += pending_;
            wrote_content_ = true;
          }
          pending_.clear();
          state_ = State::kBetween;
          return;
        }
        if (control->token == kMessage) {
          BeginMessage(header_ + pending_.substr(0, control->pos));
          state_ = State::kBody;
        } else if (EndsMessage(control->token)) {
          state_ = State::kBetween;  // a message without a body
        }  // (<|start|>: the header starts over)
        header_.clear();
        pending_.erase(0, control->pos + control->token.size());
        continue;
      }
      case State::kBody: {
        const std::optional<Control> control = FindControl(pending_);
        const size_t ready = control ? control->pos
                                     : pending_.size() - (final ? 0 : PartialControlLength(pending_));
        Emit(route_, std::string_view(pending_).substr(0, ready), out);
        pending_.erase(0, ready);
        if (!control && !final) return;
        EndMessage(out);
        state_ = State::kBetween;
        // An end token is consumed; any other (<|start|> without <|end|> before it) opens the
        // next header, read in kBetween.
        if (control && EndsMessage(control->token)) pending_.erase(0, control->token.size());
        if (!control) return;
        continue;
      }
    }
  }
}

HarmonyDelta HarmonyParser::Push(std::string_view text) {
  HarmonyDelta out;
  pending_.append(text);
  // (A control token stays in pending_ from the Push that completes it until it is scanned.)
  if (!saw_markup_) saw_markup_ = FindControl(pending_).has_value();
  Scan(/*final=*/false, &out);
  return out;
}

HarmonyDelta HarmonyParser::Finish() {
  HarmonyDelta out;
  Scan(/*final=*/true, &out);
  pending_.clear();
  state_ = State::kBetween;
  return out;
}

}  // namespace ember::serve
