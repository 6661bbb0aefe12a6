#include "serve/reasoning.h"

#include "serve/stop_matcher.h"

namespace ember::serve {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";
constexpr const char* kSpace = " \n\t\r";

}  // namespace

const char* ReasoningFormatName(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kNone:
      return "none";
    case ReasoningFormat::kThink:
      return "think";
    case ReasoningFormat::kHarmony:
      return "harmony";
  }
  return "none";
}

std::optional<ReasoningFormat> ParseReasoningFormat(std::string_view name) {
  for (ReasoningFormat f : {ReasoningFormat::kNone, ReasoningFormat::kThink, ReasoningFormat::kHarmony})
    if (name == ReasoningFormatName(f)) return f;
  return std::nullopt;
}

bool TemplateHasThinkBlocks(std::string_view source) {
  return source.find(kClose) != std::string_view::npos;
}

bool PromptEndsInThinkBlock(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(kSpace);
  if (end == std::string_view::npos) return false;
  return prompt.substr(0, end + 1).ends_with(kOpen);
}

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

void ReasoningParser::Scan(ReasoningDelta* out) {
  while (true) {
    switch (state_) {
      case State::kStart: {
        const size_t first = pending_.find_first_not_of(kSpace);
        if (first == std::string::npos) return;  // only whitespace so far
        const std::string_view rest = std::string_view(pending_).substr(first);
        if (rest.starts_with(kOpen)) {
          pending_.erase(0, first + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (kOpen.starts_with(rest)) return;  // may still become the tag
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = pending_.find(kClose);
        if (close != std::string::npos) {
          out->reasoning.append(pending_, 0, close);
          pending_.erase(0, close + kClose.size());
          state_ = State::kAfterEnd;
          continue;
        }
        const size_t ready = pending_.size() - PartialTagLength(pending_, kClose);
        out->reasoning.append(pending_, 0, ready);
        pending_.erase(0, ready);
        return;
      }
      case State::kAfterEnd: {
        const size_t first = pending_.find_first_not_of(kSpace);
        if (first == std::string::npos) {
          pending_.clear();
          return;
        }
        pending_.erase(0, first);
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out->content += pending_;
        pending_.clear();
        return;
    }
  }
}

ReasoningDelta ReasoningParser::Push(std::string_view text) {
  ReasoningDelta out;
  pending_.append(text);
  Scan(&out);
  return out;
}

ReasoningDelta ReasoningParser::Finish() {
  ReasoningDelta out;
  if (state_ == State::kReasoning) {
    out.reasoning = std::move(pending_);
  } else if (state_ != State::kAfterEnd) {
    out.content = std::move(pending_);
  }
  pending_.clear();
  state_ = State::kContent;
  return out;
}

}  // namespace ember::serve
