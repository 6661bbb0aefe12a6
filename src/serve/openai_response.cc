#include "serve/openai_response.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>

namespace ember::serve {

namespace {

using nlohmann::json;

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(int(c));
  return out;
}

json ChatLogprobs(const std::vector<TokenLogprobEntry>& entries) {
  json content = json::array();
  for (const TokenLogprobEntry& e : entries) {
    json top = json::array();
    for (const auto& [tok, lp] : e.top)
      top.push_back({{"token", tok}, {"logprob", SafeLogprob(lp)}, {"bytes", Bytes(tok)}});
    content.push_back({{"token", e.token},
                       {"logprob", SafeLogprob(e.logprob)},
                       {"bytes", Bytes(e.token)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json CompletionLogprobs(const std::vector<TokenLogprobEntry>& entries) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprobEntry& e : entries) {
    tokens.push_back(e.token);
    offsets.push_back(e.text_offset);
    if (e.null_logprob) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(SafeLogprob(e.logprob));
    json alternatives = json::object();
    for (const auto& [tok, lp] : e.top) alternatives[tok] = SafeLogprob(lp);
    top.push_back(alternatives);
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json LogprobsJson(const ResponseMeta& meta, const ChoiceOutput& c) {
  if (!c.with_logprobs) return nullptr;
  return meta.endpoint == Endpoint::kChat ? ChatLogprobs(c.logprobs)
                                          : CompletionLogprobs(c.logprobs);
}

json Envelope(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", nullptr}};
}

json FinishJson(const ChoiceOutput& c) {
  return c.finish_reason ? json(*c.finish_reason) : json(nullptr);
}

// 24 hex digits: a per-process random salt and a counter.
std::string UniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}() ^ uint64_t(std::chrono::system_clock::now()
                                                                     .time_since_epoch()
                                                                     .count());
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx",
                static_cast<unsigned long long>(salt),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffffffu));
  return buf;
}

json ToolCallsJson(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    json call = {{"id", c.id},
                 {"type", "function"},
                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
    if (with_index) call["index"] = c.index;
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

double SafeLogprob(float logprob) {
  return logprob < -9999.0f ? -9999.0 : double(logprob);
}

std::string NewResponseId(Endpoint endpoint) {
  return std::string(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + UniqueSuffix();
}

std::string NewToolCallId() { return "call_" + UniqueSuffix(); }

json UsageJson(const Usage& u) {
  json usage = {{"prompt_tokens", u.prompt_tokens},
                {"completion_tokens", u.completion_tokens},
                {"total_tokens", u.prompt_tokens + u.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.speculative) {
    usage["completion_tokens_details"]["accepted_prediction_tokens"] =
        u.accepted_prediction_tokens;
    usage["completion_tokens_details"]["rejected_prediction_tokens"] =
        u.rejected_prediction_tokens;
  }
  if (u.jump_forward) usage["completion_tokens_details"]["forced_tokens"] = u.forced_tokens;
  return usage;
}

Usage UsageFromJson(const json& u) {
  Usage usage;
  usage.prompt_tokens = u.value("prompt_tokens", int64_t{0});
  usage.completion_tokens = u.value("completion_tokens", int64_t{0});
  if (u.contains("prompt_tokens_details"))
    usage.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
  return usage;
}

json FinalBody(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
               const Usage& usage) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json body = Envelope(meta, chat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (const ChoiceOutput& c : choices) {
    json choice = {{"index", c.index}, {"logprobs", LogprobsJson(meta, c)},
                   {"finish_reason", FinishJson(c)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"},
                           {"content", c.text.empty() && !c.tool_calls.empty() ? json(nullptr)
                                                                                : json(c.text)},
                           {"refusal", nullptr}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) choice["message"]["tool_calls"] = ToolCallsJson(c.tool_calls, false);
    } else {
      choice["text"] = c.text;
      if (c.prompt_logprobs) choice["prompt_logprobs"] = *c.prompt_logprobs;
    }
    list.push_back(std::move(choice));
  }
  body["choices"] = std::move(list);
  if (chat && !choices.empty() && choices[0].prompt_logprobs)
    body["prompt_logprobs"] = *choices[0].prompt_logprobs;
  body["usage"] = UsageJson(usage);
  return body;
}

json ChunkBody(const ResponseMeta& meta, const ChoiceOutput& c, bool usage_null) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json body = Envelope(meta, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", c.index}, {"logprobs", LogprobsJson(meta, c)},
                 {"finish_reason", FinishJson(c)}};
  if (chat) {
    choice["delta"] = c.text.empty() ? json::object() : json{{"content", c.text}};
    if (!c.reasoning.empty()) choice["delta"]["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) choice["delta"]["tool_calls"] = ToolCallsJson(c.tool_calls, true);
  } else {
    choice["text"] = c.text;
  }
  body["choices"] = json::array({std::move(choice)});
  if (usage_null) body["usage"] = nullptr;
  return body;
}

json RoleChunkBody(const ResponseMeta& meta, int32_t index, bool usage_null) {
  json body = Envelope(meta, "chat.completion.chunk");
  body["choices"] = json::array({{{"index", index},
                                  {"delta", {{"role", "assistant"}, {"content", ""}}},
                                  {"logprobs", nullptr},
                                  {"finish_reason", nullptr}}});
  if (usage_null) body["usage"] = nullptr;
  return body;
}

json UsageChunkBody(const ResponseMeta& meta, const Usage& usage) {
  json body = Envelope(meta, meta.endpoint == Endpoint::kChat ? "chat.completion.chunk"
                                                              : "text_completion");
  body["choices"] = json::array();
  body["usage"] = UsageJson(usage);
  return body;
}

std::string SseEvent(const json& body) {
  return "data: " + body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace ember::serve
